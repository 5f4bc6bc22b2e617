import fc from "fast-check";
import type { IHeaders, KafkaMessage } from "kafkajs";
import { beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { sha256Hex } from "../../../src/canonical-json.ts";
import { WireCodec } from "../../../src/codec.ts";
import { deltaFingerprint, intentKey, leaseIntentKey, paramsFingerprint } from "../../../src/keys.ts";
import { type Admission, type AdmissionDeps, admit, paramsProblem } from "../../../src/owner/admission.ts";
import type { Effects } from "../../../src/owner/effects.ts";
import { CONTROL_HEADER, HEAL_KEY } from "../../../src/schemas/control.ts";
import { DeadLetter } from "../../../src/schemas/dead-letter.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import { LEASE_VERSION } from "../../../src/schemas/write-intent.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const PREFIX = "writ.replies.";
const REPLY_TO = "writ.replies.agent-1";
/** One partition: every key is home here (the partition check has tests of its own below). */
const PARTITIONS = 1;
const SOURCE = { topic: "writ.intents", partition: 0, offset: "41" };

const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string().min(1) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags/-"],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "helpdesk",
  reconcile: "idempotency-key",
});
const tools = admitTools([tagTicket], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 });
const tool = tools.get("tag_ticket")!;

/** Reply topics that exist, and the topics admission asked about. */
class Directory {
  readonly topics = new Set([REPLY_TO]);
  readonly asked: string[] = [];
  async exists(topic: string): Promise<boolean> {
    this.asked.push(topic);
    return this.topics.has(topic);
  }
}

let directory: Directory;
let deps: AdmissionDeps;

beforeEach(() => {
  directory = new Directory();
  deps = {
    config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: PREFIX, ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
    codec: new WireCodec({}),
    tools,
    replyTopics: directory,
    now: () => NOW,
    partitions: PARTITIONS,
  };
});

const ENTITY = { type: "ticket", id: "T-1" };
const KEY = intentKey({ agentId: "agent-1", tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, runId: "run-1", stepId: "s1", entity: ENTITY, params: { tag: "vip" } });

function intentJson(overrides: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    intentId: "intent-1",
    intentKey: KEY,
    entity: ENTITY,
    tool: "tag_ticket",
    agent: { id: "agent-1", runId: "run-1", stepId: "s1" },
    baseVersion: '"1"',
    delta: [{ op: "add", path: "/tags/-", value: "vip" }],
    params: { tag: "vip" },
    replyTo: REPLY_TO,
    createdAt: NOW.toISOString(),
    ...overrides,
  };
}

/** A record keyed by the entity its value names (as a writ client keys it), else ticket:T-1. */
function message(value: Buffer | null, headers: IHeaders = {}): KafkaMessage {
  let key = "ticket:T-1";
  try {
    const e = (JSON.parse(value?.toString("utf8") ?? "null") as { entity?: { type?: unknown; id?: unknown } } | null)?.entity;
    if (typeof e?.type === "string" && typeof e.id === "string") key = `${e.type}:${e.id}`;
  } catch {
    // not JSON: the default key
  }
  return { key: Buffer.from(key), value, timestamp: "0", attributes: 0, offset: SOURCE.offset, headers } as KafkaMessage;
}

const bytesOf = (v: unknown) => Buffer.from(JSON.stringify(v));

function answered(a: Admission): Effects {
  if (a.kind !== "answered") throw new Error(`expected an answer, got ${a.kind}`);
  for (const r of a.effects.replies) Reply.parse(r.value);
  for (const d of a.effects.deadLetters) DeadLetter.parse(d.value);
  return a.effects;
}

/** The answer is a dead letter (of the whole original value) for `reason`, and nothing else unless a reply is expected. */
function expectDeadLetter(a: Admission, reason: string, original: Buffer | null, replies = 0) {
  const e = answered(a);
  expect(a).toMatchObject({ reason });
  expect(e.deadLetters).toHaveLength(1);
  const d = e.deadLetters[0]!;
  const bytes = original ?? Buffer.alloc(0);
  expect(d.key).toBe("ticket:T-1");
  expect(d.value).toMatchObject({
    reason,
    source: SOURCE,
    key: "ticket:T-1",
    originalBytes: bytes.length,
    sha256: sha256Hex(bytes),
    truncated: false,
    at: NOW.toISOString(),
  });
  expect(Buffer.from(d.value.valueBase64, "base64").equals(bytes)).toBe(true);
  expect(e.replies).toHaveLength(replies);
  expect(e.escalations).toEqual([]);
  return e;
}

describe("admit (step 1: the gate)", () => {
  it("admits a good intent with its entity key and fingerprints", async () => {
    const a = await admit(message(bytesOf(intentJson())), SOURCE, deps);
    if (a.kind !== "admitted") throw new Error(JSON.stringify(a));
    expect(a.admitted.entityKey).toBe("ticket:T-1");
    expect(a.admitted.tool).toBe(tool);
    expect(a.admitted.intent).toMatchObject({ intentId: "intent-1", intentKey: KEY, replyTo: REPLY_TO });
    expect(a.admitted.fingerprint).toBe(paramsFingerprint("tag_ticket", ENTITY, { tag: "vip" }, []));
    expect(a.admitted.deltaFingerprint).toBe(deltaFingerprint([{ op: "add", path: "/tags/-", value: "vip" }], () => false));
  });

  it("dead-letters an intent over maxIntentBytes as too_large, keeping the bytes' length and sha256, without a reply", async () => {
    const big = bytesOf(intentJson({ params: { tag: "x".repeat(262_144) } }));
    expect(big.length).toBeGreaterThan(262_144);
    expectDeadLetter(await admit(message(big, { trace: "t-1" }), SOURCE, deps), "too_large", big);
    expect(directory.asked).toEqual([]);
  });

  it("dead-letters 10,000-deep params as too_deep without a RangeError", async () => {
    const deep = Buffer.from(JSON.stringify(intentJson({ params: { tag: "vip", nest: 0 } })).replace('"nest":0', `"nest":${"[".repeat(10_000)}${"]".repeat(10_000)}`));
    expect(deep.length).toBeGreaterThan(20_000);
    const a = await admit(message(deep), SOURCE, deps);
    expectDeadLetter(a, "too_deep", deep);
  });

  it("dead-letters bytes that are not JSON, empty or null as undecodable, without a reply", async () => {
    const junk = Buffer.from("{not json");
    expectDeadLetter(await admit(message(junk), SOURCE, deps), "undecodable", junk);
    expectDeadLetter(await admit(message(Buffer.alloc(0)), SOURCE, deps), "undecodable", Buffer.alloc(0));
    expectDeadLetter(await admit(message(null), SOURCE, deps), "undecodable", null);
  });

  it("skips a heal record (key __writ_heal__, null value, writ-control: heal) and nothing else shaped near it", async () => {
    const heal = (key: string, value: Buffer | null, headers: IHeaders): KafkaMessage =>
      ({ key: Buffer.from(key), value, timestamp: "0", attributes: 0, offset: SOURCE.offset, headers }) as KafkaMessage;
    // What an owner's healRecord() writes, as a consumer hands it out (Buffer header values).
    expect(await admit(heal(HEAL_KEY, null, { [CONTROL_HEADER]: Buffer.from("heal") }), SOURCE, deps)).toEqual({ kind: "control" });
    expect(await admit(heal(HEAL_KEY, null, { [CONTROL_HEADER]: "heal" }), SOURCE, deps)).toEqual({ kind: "control" });
    // A value is an intent to admit (or refuse), whatever its headers claim: nothing an agent sent is skipped unanswered.
    const withValue = await admit(message(bytesOf(intentJson()), { [CONTROL_HEADER]: Buffer.from("heal") }), SOURCE, deps);
    expect(withValue.kind).toBe("admitted");
    const junk = Buffer.from("x");
    expect((await admit(heal(HEAL_KEY, junk, { [CONTROL_HEADER]: Buffer.from("heal") }), SOURCE, deps)).kind).toBe("answered");
    // Null values that are not exactly a heal record stay dead letters.
    for (const m of [
      heal(HEAL_KEY, null, {}),
      heal(HEAL_KEY, null, { [CONTROL_HEADER]: Buffer.from("other") }),
      heal(HEAL_KEY, null, { [CONTROL_HEADER]: [Buffer.from("heal"), Buffer.from("heal")] }),
      heal("ticket:T-1", null, { [CONTROL_HEADER]: Buffer.from("heal") }),
      heal(`${HEAL_KEY}x`, null, { [CONTROL_HEADER]: Buffer.from("heal") }),
    ]) {
      const a = await admit(m, SOURCE, deps);
      expect(a.kind).toBe("answered");
      expect(a).toMatchObject({ reason: "undecodable" });
    }
  });

  it("dead-letters a wire-framed value (magic byte 0) as undecodable when there is no registry", async () => {
    const framed = Buffer.concat([Buffer.from([0, 0, 0, 0, 7]), bytesOf(intentJson())]);
    const a = await admit(message(framed), SOURCE, deps);
    const e = expectDeadLetter(a, "undecodable", framed);
    expect(e.deadLetters[0]!.value.message).toMatch(/schema id 7/);
  });

  it("dead-letters a schema-invalid intent and answers it rejected when its reply topic is allowed and exists", async () => {
    const bad = bytesOf(intentJson({ delta: "not a patch" }));
    const e = expectDeadLetter(await admit(message(bad), SOURCE, deps), "schema_invalid", bad, 1);
    expect(e.replies[0]).toMatchObject({
      topic: REPLY_TO,
      value: { status: "rejected", reason: "schema_invalid", intentId: "intent-1", intentKey: KEY, duplicate: false },
    });
  });

  it("dead-letters a schema-invalid resolution and answers the operator rejected, as it answers an intent (the same gate)", async () => {
    const resolution = {
      kind: "resolution",
      resolutionId: "res-1",
      escalationId: "esc-1",
      intent: intentJson(),
      decision: "maybe",
      operator: { id: "operator-1" },
      replyTo: REPLY_TO,
      entity: ENTITY,
      createdAt: NOW.toISOString(),
    };
    const bad = bytesOf(resolution);
    const e = expectDeadLetter(await admit(message(bad, { "writ-kind": Buffer.from("resolution") }), SOURCE, deps), "schema_invalid", bad, 1);
    expect(e.replies[0]).toMatchObject({
      topic: REPLY_TO,
      value: { status: "rejected", reason: "schema_invalid", intentId: "res-1", intentKey: KEY, duplicate: false },
    });
    // Outside the prefix: no reply, as for an intent.
    const outside = bytesOf({ ...resolution, replyTo: "elsewhere.replies" });
    expectDeadLetter(await admit(message(outside, { "writ-kind": Buffer.from("resolution") }), SOURCE, deps), "schema_invalid", outside, 0);
  });

  it("dead-letters a schema-invalid intent without a reply when its reply topic is outside the prefix or missing", async () => {
    const outside = bytesOf(intentJson({ delta: [], replyTo: "elsewhere.replies" }));
    expectDeadLetter(await admit(message(outside), SOURCE, deps), "schema_invalid", outside, 0);
    expect(directory.asked).toEqual([]);
    const missing = bytesOf(intentJson({ delta: [], replyTo: "writ.replies.nobody" }));
    expectDeadLetter(await admit(message(missing), SOURCE, deps), "schema_invalid", missing, 0);
    expect(directory.asked).toEqual(["writ.replies.nobody"]);
  });

  it("dead-letters an intent whose reply topic is outside the prefix as reply_topic_not_allowed", async () => {
    for (const replyTo of ["other.replies.a", PREFIX, "writ.replies.a b"]) {
      const bytes = bytesOf(intentJson({ replyTo }));
      expectDeadLetter(await admit(message(bytes), SOURCE, deps), "reply_topic_not_allowed", bytes, 0);
    }
    expect(directory.asked).toEqual([]);
  });

  it("dead-letters an intent whose reply topic does not exist as reply_topic_missing, without a reply", async () => {
    const bytes = bytesOf(intentJson({ replyTo: "writ.replies.gone" }));
    expectDeadLetter(await admit(message(bytes), SOURCE, deps), "reply_topic_missing", bytes, 0);
  });

  it("refuses an intent older than the ledger keeps intents (stale), a lease intent older than a lease lasts, and one dated ahead of the clock (clock_skew)", async () => {
    const at = (ms: number) => new Date(NOW.getTime() + ms).toISOString();
    const refused = async (overrides: Record<string, unknown>) => {
      const e = answered(await admit(message(bytesOf(intentJson(overrides))), SOURCE, deps));
      expect(e.deadLetters).toEqual([]);
      return e.replies.map((r) => (r.value as Extract<Reply, { status: "rejected" }>).reason);
    };
    const admitted = async (overrides: Record<string, unknown>) => (await admit(message(bytesOf(intentJson(overrides))), SOURCE, deps)).kind;
    const HOUR = 3_600_000;
    // 24 h of retention: an intent is acted on up to 23 h after it was created, never later (a replay of its bytes).
    expect(await admitted({ createdAt: at(-23 * HOUR + 1000) })).toBe("admitted");
    expect(await refused({ createdAt: at(-23 * HOUR - 1000) })).toEqual(["stale"]);
    expect(await refused({ createdAt: "2020-01-01T00:00:00Z" })).toEqual(["stale"]);
    deps = { ...deps, config: { ...deps.config, ledgerRetentionHours: 240 } };
    expect(await admitted({ createdAt: at(-23 * HOUR - 1000) })).toBe("admitted");
    expect(await admitted({ createdAt: at(4 * 60_000) })).toBe("admitted");
    expect(await refused({ createdAt: at(6 * 60_000) })).toEqual(["clock_skew"]);
  });

  it("refuses a lease intent created longer ago than a lease lasts: a released lease cannot be taken again by replaying its acquire", async () => {
    const acquire = (createdAt: string) =>
      intentJson({
        intentKey: leaseIntentKey("c".repeat(64), "acquire", ENTITY),
        baseVersion: LEASE_VERSION,
        delta: [],
        params: {},
        lease: { change: "c".repeat(64), op: "acquire" },
        createdAt,
      });
    const at = (ms: number) => new Date(NOW.getTime() + ms).toISOString();
    const fresh = await admit(message(bytesOf(acquire(at(-14 * 60_000)))), SOURCE, deps);
    expect(fresh.kind, JSON.stringify(fresh)).toBe("admitted");
    const e = answered(await admit(message(bytesOf(acquire(at(-16 * 60_000)))), SOURCE, deps));
    expect(e.replies.map((r) => (r.value as Extract<Reply, { status: "rejected" }>).reason)).toEqual(["stale"]);
  });

  describe("dead-letters an intent with no canonical form (RFC 8785) as not_canonical, and answers it", () => {
    /** The bytes of a good intent with `from` in its JSON text replaced by `to` (JSON.stringify cannot write 1e400). */
    const edited = (overrides: Record<string, unknown>, from?: string, to?: string) => {
      const text = JSON.stringify(intentJson(overrides));
      return Buffer.from(from === undefined ? text : text.replace(from, to!));
    };
    async function notCanonical(bytes: Buffer, at: string) {
      const e = expectDeadLetter(await admit(message(bytes), SOURCE, deps), "not_canonical", bytes, 1);
      const reply = e.replies[0]!.value as Extract<Reply, { status: "rejected" }>;
      expect(e.replies[0]!.topic).toBe(REPLY_TO);
      expect(reply).toMatchObject({ status: "rejected", reason: "not_canonical", intentId: "intent-1", intentKey: KEY });
      expect(e.deadLetters[0]!.value.message).toContain(` at ${at}`);
      expect(reply.message).toContain(` at ${at}`);
      // The message never carries the lone surrogate itself.
      expect(/\p{Cs}/u.test(reply.message)).toBe(false);
    }

    it("a lone surrogate in a param outside the intent fields (the key alone would not see it)", async () => {
      await notCanonical(edited({ params: { tag: "vip", note: "cut emoji \ud83d" } }), "/params/note");
    });

    it("a lone surrogate in an intent field, in a delta value and in an object key", async () => {
      await notCanonical(edited({ params: { tag: "\udc00" } }), "/params/tag");
      await notCanonical(edited({ delta: [{ op: "add", path: "/tags/-", value: { ["k\ud800"]: 1 } }] }), "/delta/0/value/k\ufffd");
    });

    it("a number that parses to Infinity (1e400), which used to be written null", async () => {
      await notCanonical(edited({ params: { tag: "vip", n: 77777 } }, "77777", "1e400"), "/params/n");
      await notCanonical(edited({ delta: [{ op: "add", path: "/tags/-", value: 77777 }] }, "77777", "-1e400"), "/delta/0/value");
    });

    it("a surrogate pair, escaped or not, is a character: admitted", async () => {
      const a = await admit(message(edited({ params: { tag: "vip", note: "\ud83d\ude00" } })), SOURCE, deps);
      expect(a.kind).toBe("admitted");
      const b = await admit(message(edited({ params: { tag: "vip", note: "x" } }, '"x"', String.raw`"\ud83d\ude00"`)), SOURCE, deps);
      expect(b.kind).toBe("admitted");
    });
  });

  describe("answers a well-formed intent it cannot take with a rejected reply, no dead letter", () => {
    async function rejected(overrides: Record<string, unknown>) {
      const a = await admit(message(bytesOf(intentJson(overrides))), SOURCE, deps);
      const e = answered(a);
      expect(e.deadLetters).toEqual([]);
      expect(e.replies).toHaveLength(1);
      expect(e.replies[0]!.topic).toBe(REPLY_TO);
      return { reason: (a as { reason: string }).reason, reply: e.replies[0]!.value as Extract<Reply, { status: "rejected" }> };
    }

    it("unknown tool", async () => {
      const { reason, reply } = await rejected({ tool: "delete_everything" });
      expect(reason).toBe("unknown_tool");
      expect(reply).toMatchObject({ status: "rejected", reason: "unknown_tool", intentId: "intent-1", intentKey: KEY, at: NOW.toISOString() });
    });

    it("entity type mismatch", async () => {
      const { reply } = await rejected({ entity: { type: "order", id: "O-1" } });
      expect(reply).toMatchObject({ reason: "entity_type_mismatch" });
      expect(reply.message).toContain("ticket");
    });

    it("params invalid, with the issues in details", async () => {
      const { reply } = await rejected({ params: { tag: 5 } });
      expect(reply).toMatchObject({ reason: "params_invalid" });
      expect(Array.isArray(reply.details)).toBe(true);
      expect((reply.details as { path: unknown[] }[])[0]!.path).toEqual(["tag"]);
      // the model reads the message: one line, each issue by its path, not zod's pretty-printed JSON
      expect(reply.message).toBe("params do not fit tool tag_ticket: tag: Invalid input: expected string, received number");
    });

    it("params invalid: the message stays one bounded line however many issues there are", async () => {
      const { reply } = await rejected({ params: { tag: 5, ...Object.fromEntries(Array.from({ length: 30 }, (_, i) => [`extra${i}`, "x".repeat(100)])) } });
      expect(reply.message).toMatch(/^params do not fit tool tag_ticket: tag: /);
      expect(reply.message).not.toMatch(/[\n[{]/);
      expect(reply.message.length).toBeLessThanOrEqual(500);
      const many = paramsProblem("t", Array.from({ length: 12 }, (_, i) => ({ path: ["items", i, "sku"], message: `Invalid input: expected string, received number ${"y".repeat(80)}` })));
      expect(many).toMatch(/^params do not fit tool t: items\.0\.sku: Invalid input/);
      expect(many.length).toBe(500);
      expect(many.endsWith("…")).toBe(true);
      expect(paramsProblem("t", [{ path: [], message: "Invalid input: expected object, received array" }, { path: ["a"], message: "x" }, ...Array.from({ length: 5 }, () => ({ path: ["b"], message: "y" }))])).toBe(
        "params do not fit tool t: params: Invalid input: expected object, received array; a: x; b: y; b: y; b: y; and 2 more",
      );
    });

    it("patch path not allowed, naming the paths (a move's `from` included)", async () => {
      const { reply } = await rejected({
        delta: [
          { op: "add", path: "/tags/-", value: "ok" },
          { op: "replace", path: "/status", value: "closed" },
          { op: "move", from: "/secret", path: "/tags/-" },
        ],
      });
      expect(reply).toMatchObject({ reason: "patch_path_not_allowed", details: { paths: ["/status", "/secret"] } });
    });
  });

  // Regression (found by fast-check): for a schema-invalid record with an allowed reply topic, admission builds the
  // reply's ids with String(loose.intentId). A JSON object whose "toString" is not a function (e.g.
  // {"intentId":{"toString":1}}) makes String() throw "TypeError: Cannot convert object to primitive value", so
  // admit() throws instead of dead-lettering. The owner's admitLoop takes every throw of admit() for a registry
  // outage and retries the same record forever: one 60-byte record stops its partition.
  it("dead-letters a schema-invalid intent whose intentId is an object with a non-callable toString (admit throws)", async () => {
    const bytes = Buffer.from(JSON.stringify(intentJson({ intentId: { toString: 1 } })));
    const a = await admit(message(bytes), SOURCE, deps);
    expectDeadLetter(a, "schema_invalid", bytes, 1);
  });

  it("dead-letters a schema-invalid intent whose intentKey is an array holding such an object (admit throws)", async () => {
    const bytes = Buffer.from(JSON.stringify(intentJson({ intentKey: [{ valueOf: 0, toString: 0 }] })));
    expectDeadLetter(await admit(message(bytes), SOURCE, deps), "schema_invalid", bytes, 1);
  });

  // A tool's params schema is the tool's code, run on the agent's params: a transform or refinement that throws
  // (zod's safeParse passes a thrown error on) made admit() throw, which the owner's admitLoop takes for a registry
  // outage and retries forever: one intent whose params the tool's schema chokes on stopped its partition.
  it("refuses params_invalid, never throws, when the tool's params schema throws on the params", async () => {
    const parsing = declareWriteTool({
      name: "set_meta",
      recordType: "ticket",
      params: z.object({ meta: z.string().transform((s) => JSON.parse(s) as unknown) }),
      intentFields: ["meta"],
      allowedPaths: ["/meta"],
      keyScope: "run",
      versionPolicy: "strict",
      system: "helpdesk",
      reconcile: "idempotency-key",
    });
    const withParsing = { ...deps, tools: admitTools([parsing], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 }) };
    const params = { meta: "{not json" };
    const key = intentKey({ agentId: "agent-1", tool: { name: "set_meta", keyScope: "run", intentFields: ["meta"] }, runId: "run-1", stepId: "s1", entity: ENTITY, params });
    const bytes = bytesOf(intentJson({ tool: "set_meta", intentKey: key, params, delta: [{ op: "replace", path: "/meta", value: params.meta }] }));
    const e = answered(await admit(message(bytes), SOURCE, withParsing));
    expect(e.replies).toHaveLength(1);
    expect(e.replies[0]!.value).toMatchObject({ status: "rejected", reason: "params_invalid", intentKey: key });
    expect((e.replies[0]!.value as { message: string }).message).toContain("params schema");
  });

  describe("never throws, and answers or admits whatever arrives", () => {
    /** Every answer carries a dead letter or a reply, and replies only go to allowed, existing topics. */
    async function check(bytes: Buffer) {
      const a = await admit(message(bytes), SOURCE, deps);
      if (a.kind === "admitted") {
        expect(a.admitted.intent.replyTo).toBe(REPLY_TO);
        return;
      }
      const e = answered(a);
      expect(e.deadLetters.length + e.replies.length).toBeGreaterThan(0);
      for (const r of e.replies) expect(r.topic).toBe(REPLY_TO);
      for (const d of e.deadLetters) {
        expect(d.value.sha256).toBe(sha256Hex(bytes));
        expect(d.value.originalBytes).toBe(bytes.length);
      }
    }

    it("arbitrary bytes", async () => {
      await fc.assert(fc.asyncProperty(fc.uint8Array({ maxLength: 512 }), (b) => check(Buffer.from(b))), { numRuns: 500 });
    });

    it("arbitrary JSON values", async () => {
      await fc.assert(fc.asyncProperty(fc.jsonValue(), (v) => check(Buffer.from(JSON.stringify(v) ?? "null"))), { numRuns: 500 });
    });

    it("a good intent with one field replaced by an arbitrary JSON value", async () => {
      const fields = Object.keys(intentJson());
      const value = fc.jsonValue();
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...fields), value, (field, v) => check(bytesOf(intentJson({ [field]: v })))),
        { numRuns: 500 },
      );
    });

    it("a good intent with one field replaced by arbitrary JSON holding lone surrogates", async () => {
      const fields = Object.keys(intentJson());
      const value = fc.jsonValue({ stringUnit: fc.constantFrom("a", "1", "/", "\ud800", "\udc00", "😀") });
      await fc.assert(
        fc.asyncProperty(fc.constantFrom(...fields), value, (field, v) => check(bytesOf(intentJson({ [field]: v })))),
        { numRuns: 500 },
      );
    });
  });
});
