// The golden vectors of the intent key (test/fixtures/intent-key-vectors.json),
// recomputed with the TypeScript implementation. The Python client runs the
// same file (python/tests/test_vectors.py). A failure here means src/keys.ts,
// src/canonical-json.ts or the partitioner no longer give the bytes other
// clients were promised: a wire-contract change (see
// scripts/generate-intent-key-vectors.ts before regenerating anything).
import { createHash } from "node:crypto";
import { readFileSync } from "node:fs";
import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { changeId, intentKey, leaseIntentKey, paramsFingerprint, undoIntentKey, type KeyScope } from "../../src/keys.ts";
import { partitionFor } from "../../src/kafka/partition.ts";
import { entityKey, type EntityRef } from "../../src/schemas/common.ts";
import { VECTORS_FILE, render } from "../../scripts/generate-intent-key-vectors.ts";

interface Vector {
  name: string;
  tool: { name: string; keyScope: KeyScope; intentFields: string[]; freeTextParams: string[] };
  agentId: string;
  runId: string;
  stepId: string;
  entity: EntityRef;
  paramsJson: string;
  expected:
    | { canonical: string; intentKey: string; paramsFingerprint: string; entityKey: string; partition: number; error?: undefined }
    /** Params with no canonical form (RFC 8785): the key and the fingerprint must be refused with this code. */
    | { error: "not_canonical" };
}

interface VectorsFile {
  keyVersion: number;
  partitioner: { partitions: number; keys: { key: string; murmur2: number; partition: number }[] };
  vectors: Vector[];
  undo: { vectors: { undoneKey: string; expected: { canonical: string; intentKey: string } }[] };
  change: {
    vectors: {
      agentId: string;
      runId: string;
      stepId: string;
      expected: { canonical: string; changeId: string };
      leases: { op: "acquire" | "release"; entity: EntityRef; expected: { canonical: string; intentKey: string } }[];
    }[];
  };
}

const text = readFileSync(VECTORS_FILE, "utf8");
const file = JSON.parse(text) as VectorsFile;
const murmur2 = createRequire(import.meta.url)("kafkajs/src/producer/partitioners/default/murmur2.js") as (key: Buffer) => number;
const sha256 = (s: string) => createHash("sha256").update(s, "utf8").digest("hex");

describe("intent key golden vectors", () => {
  it("has vectors of every kind the contract promises, refusals included", () => {
    expect(file.vectors.length).toBeGreaterThanOrEqual(40);
    const names = new Set(file.vectors.map((v) => v.name));
    expect(names.size).toBe(file.vectors.length);
    const texts = file.vectors.map((v) => v.paramsJson).join("\n");
    for (const needle of ["é", "漢字", "😀", "\u0301", "1e21", "-0.0", "1.5e-7", "100.0", "12345678901234567890", "null", "true", "false"]) {
      expect(texts, needle).toContain(needle);
    }
    const refused = file.vectors.filter((v) => v.expected.error !== undefined).map((v) => v.paramsJson);
    for (const needle of ["\\ud800", "\\udc00", "1e400", "0".repeat(310)]) expect(refused.join("\n"), needle).toContain(needle);
  });

  it("reproduces RFC 8785's own published examples (sections 3.2.2 and 3.2.3)", () => {
    const canonical = (name: string) => {
      const v = file.vectors.find((x) => x.name === name);
      if (!v || v.expected.error !== undefined) throw new Error(`no vector ${name}`);
      return v.expected.canonical;
    };
    // The outputs as printed in the RFC, not computed here.
    expect(canonical("RFC 8785 section 3.2.2 example")).toContain(
      String.raw`"fields":{"v":{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}}`,
    );
    const order = ["\r", "1", "\u0080", "\u00f6", "\u20ac", "\ud83d\ude00", "\ufb33"];
    const members = order.map((k) => `${JSON.stringify(k)}:`);
    const text = canonical("keys: RFC 8785 section 3.2.3 sorting example");
    const at = members.map((m) => text.indexOf(m));
    expect(at.every((i) => i >= 0)).toBe(true);
    expect(at).toEqual([...at].sort((a, b) => a - b));
  });

  it.each(file.vectors.map((v) => [v.name, v] as const))("%s", (_name, v) => {
    const params = JSON.parse(v.paramsJson) as Record<string, unknown>;
    const computeKey = () => intentKey({ tool: v.tool, agentId: v.agentId, runId: v.runId, stepId: v.stepId, entity: v.entity, params });
    if (v.expected.error !== undefined) {
      const refusal = { name: "WritError", code: v.expected.error, retriable: false };
      expect(computeKey).toThrow(expect.objectContaining(refusal));
      expect(() => paramsFingerprint(v.tool.name, v.entity, params, v.tool.freeTextParams)).toThrow(expect.objectContaining(refusal));
      return;
    }
    const key = computeKey();
    expect(key).toBe(v.expected.intentKey);
    // The canonical text is exactly what is hashed (UTF-8).
    expect(sha256(v.expected.canonical)).toBe(v.expected.intentKey);
    expect(paramsFingerprint(v.tool.name, v.entity, params, v.tool.freeTextParams)).toBe(v.expected.paramsFingerprint);
    expect(entityKey(v.entity)).toBe(v.expected.entityKey);
    expect(partitionFor(v.expected.entityKey, file.partitioner.partitions)).toBe(v.expected.partition);
  });

  it("pins the keys that must be equal and the ones that must differ", () => {
    const byName = new Map(file.vectors.map((v) => [v.name, v.expected.error === undefined ? v.expected.intentKey : undefined]));
    const basic = byName.get("refund: basic");
    for (const same of [
      "refund: other free text and params outside the intent fields (same key as basic)",
      "refund: params in another key order (same key as basic)",
      "refund: intent fields declared in another order (same key as basic)",
      "refund: 5000.0 is the number 5000 (same key as basic)",
    ]) {
      expect(byName.get(same), same).toBe(basic);
    }
    for (const other of ["refund: another agent", "refund: another run", "refund: another step", "refund: scope global (agent and run left out: null)"]) {
      expect(byName.get(other), other).not.toBe(basic);
    }
    expect(byName.get("refund: scope global, another agent and run (same key as the previous)")).toBe(byName.get("refund: scope global (agent and run left out: null)"));
    expect(byName.get("number: 100.0")).toBe(byName.get("number: 100"));
    expect(byName.get("number: -0.0 is 0")).toBe(byName.get("number: 0"));
    expect(byName.get("number: 1e-400 underflows to 0")).toBe(byName.get("number: 0"));
    expect(byName.get("string: e + combining acute (U+0065 U+0301), no normalization: another key")).not.toBe(byName.get("string: precomposed é (U+00E9)"));
  });

  it("gives an undo's key from the undone key only, its canonical text exactly what is hashed", () => {
    expect(file.undo.vectors.length).toBeGreaterThanOrEqual(4);
    for (const u of file.undo.vectors) {
      expect(undoIntentKey(u.undoneKey)).toBe(u.expected.intentKey);
      expect(sha256(u.expected.canonical)).toBe(u.expected.intentKey);
      expect(u.expected.canonical).toBe(`{"undo":"${u.undoneKey}","v":2}`);
    }
  });

  it("gives a change's id and its lease intents' keys, the canonical texts exactly what is hashed", () => {
    expect(file.change.vectors.length).toBeGreaterThanOrEqual(3);
    for (const c of file.change.vectors) {
      expect(changeId(c)).toBe(c.expected.changeId);
      expect(sha256(c.expected.canonical)).toBe(c.expected.changeId);
      for (const l of c.leases) {
        expect(leaseIntentKey(c.expected.changeId, l.op, l.entity)).toBe(l.expected.intentKey);
        expect(sha256(l.expected.canonical)).toBe(l.expected.intentKey);
      }
    }
    // the wire contract's own example (docs/wire-contract.md §5.8)
    expect(file.change.vectors[0]!.expected.changeId).toBe("ccb58e317fe9561fa0f1fdfbf454deb0f70fceeb6815dfcea23a4eae8ee495a8");
    expect(file.change.vectors[0]!.leases[0]!.expected.intentKey).toBe("6d8d5c457ca54107f363889b5150acfcbdbf3468595bbe590702006d8f25db27");
  });

  it("partitions keys as kafkajs's DefaultPartitioner (Java's murmur2) does", () => {
    expect(file.partitioner.partitions).toBe(12);
    for (const { key, murmur2: hash, partition } of file.partitioner.keys) {
      expect(murmur2(Buffer.from(key, "utf8")), key).toBe(hash);
      expect(partitionFor(key, file.partitioner.partitions), key).toBe(partition);
      expect((hash & 0x7fffffff) % file.partitioner.partitions, key).toBe(partition);
    }
  });

  it("is the file scripts/generate-intent-key-vectors.ts writes", () => {
    // A vector added to the script but not written (or a file edited by hand) fails here.
    expect(text).toBe(render());
  });
});
