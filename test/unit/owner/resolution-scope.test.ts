// Regression: an operator's resolution carried a delta that the owner wrote with no check against the escalated
// tool's allowedPaths (a tool without a delta function; with one, the delta had to be the rebuilt one). Anyone who
// may send resolutions could use an escalation of a tag tool to rewrite any field of the record, with writ's
// authority at the system of record. Now the change an apply writes passes the check an agent's intent passes at
// admission (scopeRefusal, one function): refused with the same reasons, the escalation put back open, nothing
// written. Counted at the fake system.
import type { KafkaMessage } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../../src/codec.ts";
import { admit } from "../../../src/owner/admission.ts";
import type { Step } from "../../../src/owner/intent-pipeline.ts";
import { entityKey, type JsonPatchOp } from "../../../src/schemas/common.ts";
import { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import { declareWriteTool, type WriteToolDeclaration } from "../../../src/tools.ts";
import { escalatedApply, NOW, OPS_REPLIES, T1 } from "./escalated-case.ts";
import { version } from "./fake-system.ts";

const base = {
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"] as ["tag"],
  keyScope: "run" as const,
  versionPolicy: "strict" as const,
  system: "helpdesk",
  reconcile: "idempotency-key" as const,
};
/** Scoped to one path, no delta function: an apply writes the operator's delta. */
const tagOnly = declareWriteTool({ ...base, name: "tag_only", allowedPaths: ["/tags"] });
/** A delta function that writes beyond the tool's paths (a misdeclared tool): its rebuilt change is checked too. */
const leaky = declareWriteTool({
  ...base,
  name: "leaky",
  allowedPaths: ["/tags"],
  delta: (p) => [
    { op: "replace", path: "/tags", value: [p.tag] },
    { op: "replace", path: "/owner", value: "leaked" },
  ],
});
/** With a delta function: a given delta must be the rebuilt one, and within scope first. */
const tagDerived = declareWriteTool({ ...base, name: "tag_derived", allowedPaths: ["/tags"], delta: (p) => [{ op: "replace", path: "/tags", value: [p.tag] }] });

const setup = (decl: WriteToolDeclaration<any>) =>
  escalatedApply(decl, { status: "done", state: { tags: [], owner: "alice", refund_amount: 0 }, delta: [{ op: "replace", path: "/tags", value: ["vip"] }] });

/** The one reply of a refusal (to the operator), and the ledger entry it leaves. */
function refusal(step: Step): { reply: Reply & { details?: Record<string, unknown> }; ledger: unknown } {
  if (step.kind !== "settled") throw new Error(`not settled: ${step.kind}`);
  expect(step.effects.replies.map((r) => r.topic)).toEqual([OPS_REPLIES]);
  return { reply: step.effects.replies[0]!.value as Reply & { details?: Record<string, unknown> }, ledger: step.effects.ledger };
}

describe("an operator's apply passes the tool's scope, as an agent's intent does at admission", () => {
  it("a delta touching a field the tool may not: refused patch_path_not_allowed, the escalation left open, nothing written", async () => {
    const { sor, entry, apply } = setup(tagOnly);
    const { reply, ledger } = refusal(
      await apply([
        { op: "replace", path: "/tags", value: ["vip"] },
        { op: "replace", path: "/owner", value: "mallory" },
        { op: "replace", path: "/refund_amount", value: 99_999_999 },
      ]),
    );
    expect(reply).toMatchObject({ status: "rejected", intentId: "res-1", reason: "patch_path_not_allowed", details: { paths: ["/owner", "/refund_amount"], current: { version: version(1) } } });
    expect(reply.message).toBe("tool tag_only may not touch /owner, /refund_amount (its allowedPaths): nothing was written, the escalation stays open; send a change within them");
    expect(ledger).toMatchObject({ status: "done", outcome: entry.outcome });
    expect(sor.patches).toHaveLength(0);
    expect(sor.current(T1)!.state).toEqual({ tags: [], owner: "alice", refund_amount: 0 });
  });

  it("an operation the tool may not do on an allowed path, or a move from outside it: refused likewise", async () => {
    const { sor, apply } = setup(tagOnly);
    expect(refusal(await apply([{ op: "remove", path: "/tags" }])).reply).toMatchObject({ reason: "patch_op_not_allowed", details: { ops: ["remove /tags"] } });
    expect(refusal(await apply([{ op: "move", from: "/owner", path: "/tags" }])).reply).toMatchObject({ reason: "patch_path_not_allowed", details: { paths: ["/owner"] } });
    expect(sor.patches).toHaveLength(0);
  });

  it("a delta within the tool's paths is written once, exactly", async () => {
    const { sor, apply } = setup(tagOnly);
    const step = await apply([{ op: "replace", path: "/tags", value: ["vip", "ops"] }]);
    expect(step).toMatchObject({ kind: "settled", effects: { ledger: { outcome: { status: "applied" } } } });
    expect(sor.patches.map((p) => p.ops)).toEqual([[{ op: "replace", path: "/tags", value: ["vip", "ops"] }]]);
  });

  it("for a tool with a delta function, an out-of-scope delta is refused for its scope, before the comparison", async () => {
    const { sor, apply } = setup(tagDerived);
    expect(refusal(await apply([{ op: "replace", path: "/owner", value: "mallory" }])).reply).toMatchObject({ reason: "patch_path_not_allowed", details: { paths: ["/owner"] } });
    expect(refusal(await apply([{ op: "replace", path: "/tags", value: ["other"] }])).reply).toMatchObject({ reason: "delta_mismatch" });
    expect(sor.patches).toHaveLength(0);
  });

  it("the change a delta function rebuilds is checked too: a tool writing beyond its paths writes nothing", async () => {
    const { sor, apply } = setup(leaky);
    const { reply } = refusal(await apply());
    expect(reply).toMatchObject({ reason: "patch_path_not_allowed", details: { paths: ["/owner"] } });
    expect(reply.message).toMatch(/goes beyond the tool's declaration: discard or return it$/);
    expect(sor.patches).toHaveLength(0);
  });

  it("the same delta gets the same reason and details from admission (an agent's intent) and from a resolution", async () => {
    const { tool, intent, apply } = setup(tagOnly);
    for (const delta of [[{ op: "replace", path: "/owner", value: "mallory" }], [{ op: "remove", path: "/tags" }]] as JsonPatchOp[][]) {
      const message = { key: Buffer.from(entityKey(T1)), value: Buffer.from(JSON.stringify({ ...intent, delta })), headers: {}, offset: "7" } as unknown as KafkaMessage;
      const admitted = await admit(message, { topic: "writ.intents", partition: 0, offset: "7" }, {
        config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
        codec: new WireCodec({}),
        tools: new Map([[tool.name, tool]]),
        replyTopics: { exists: async () => true },
        now: () => NOW,
        partitions: 1,
      });
      if (admitted.kind !== "answered") throw new Error(`admitted: ${admitted.kind}`);
      const atAdmission = admitted.effects.replies[0]!.value as Reply & { details?: Record<string, unknown> };
      const { reply } = refusal(await apply(delta));
      expect(reply.reason).toBe(atAdmission.reason);
      const { current: _current, ...details } = reply.details!;
      expect(details).toEqual(atAdmission.details);
      expect(String(reply.message).startsWith(`${String(atAdmission.message)} (its allowedPaths): `)).toBe(true);
    }
  });
});

// A custom adapter may answer a version over 256 characters: the reply and the ledger entry must still be records the
// wire schemas take (parsed here as the encoder does).
describe("an operator's apply on a system answering a version writ cannot keep (10,000 characters)", () => {
  const long = "v".repeat(10_000);
  /** The operator's reply and the ledger entry, each parsed as the encoder does (every reply is). */
  const wire = (step: Step) => {
    if (step.kind !== "settled") throw new Error(`not settled: ${step.kind}`);
    const replies = step.effects.replies.map((r) => ({ topic: r.topic, value: Reply.parse(r.value) }));
    return { reply: replies.find((r) => r.topic === OPS_REPLIES)!.value, ledger: LedgerIntentEntry.parse(step.effects.ledger) };
  };

  it("a read answering one puts the escalation back open, sor_protocol, nothing written", async () => {
    const { sor, entry, apply } = setup(tagOnly);
    const read = sor.read.bind(sor);
    sor.read = async (entity, opts) => {
      const r = await read(entity, opts);
      return r && { ...r, version: long };
    };
    const { reply, ledger } = wire(await apply([{ op: "replace", path: "/tags", value: ["vip"] }]));
    expect(reply).toMatchObject({ status: "rejected", reason: "sor_protocol", message: expect.stringContaining("a version of 10000 characters") });
    expect(ledger.outcome).toEqual(entry.outcome);
    expect(sor.patches).toHaveLength(0);
  });

  it("a write answered applied with one closes the escalation applied, its version unknown", async () => {
    const { sor, apply } = setup(tagOnly);
    sor.script.patch.push({ kind: "answer", outcome: { kind: "applied", state: { tags: ["vip"] }, version: long } });
    const { reply, ledger } = wire(await apply([{ op: "replace", path: "/tags", value: ["vip"] }]));
    expect(reply).toMatchObject({ status: "applied", version: "unknown", state: null });
    expect(ledger.outcome).toMatchObject({ status: "applied", version: "unknown" });
    expect(sor.patches).toHaveLength(1);
  });
});
