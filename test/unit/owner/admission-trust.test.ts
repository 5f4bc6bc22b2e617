// The trust boundary at admission: one owner per record whatever the producer (key and partition),
// authenticated agents (Ed25519 signatures against the agent registry), authorized tools and reply
// topics, recomputed intent keys and allowed patch operations.
import { generateKeyPairSync } from "node:crypto";
import type { IHeaders, KafkaMessage } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../../src/codec.ts";
import { partitionFor } from "../../../src/kafka/partition.ts";
import { intentKey } from "../../../src/keys.ts";
import { type Admission, type AdmissionDeps, admit } from "../../../src/owner/admission.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import { AgentRegistry } from "../../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent, verifyIntentSignature } from "../../../src/security/signing.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string().min(1) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags", "/tags/-", { path: "/tags/*", ops: ["remove"] }],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
});
const closeTicket = declareWriteTool({ ...tagTicket, name: "close_ticket", params: z.object({ tag: z.string().min(1) }) });
const tools = admitTools([tagTicket, closeTicket], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 });

const alice = generateKeyPairSync("ed25519");
const mallory = generateKeyPairSync("ed25519");
const registry = AgentRegistry.from({
  agents: {
    alice: { keys: [{ id: "k1", publicKey: alice.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["tag_ticket"], replyTopic: "writ.replies.alice" },
    bob: { keys: [{ id: "k1", publicKey: mallory.publicKey.export({ type: "spki", format: "der" }).subarray(12).toString("base64") }], tools: ["*"], replyTopic: "writ.replies.bob" },
  },
});

function deps(opts: { agents?: AgentRegistry; partitions?: number } = {}): AdmissionDeps {
  return {
    config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
    codec: new WireCodec({}),
    tools,
    replyTopics: { exists: async (t) => ["writ.replies.alice", "writ.replies.bob", "writ.replies.anyone"].includes(t) },
    now: () => NOW,
    agents: opts.agents,
    partitions: opts.partitions ?? 1,
  };
}

function intent(agent = "alice", overrides: Record<string, unknown> = {}) {
  const entity = { type: "ticket", id: "T-1" };
  const base = {
    intentId: "i-1",
    intentKey: intentKey({ tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, agentId: agent, runId: "r", stepId: "s", entity, params: { tag: "vip" } }),
    entity,
    tool: "tag_ticket",
    agent: { id: agent, runId: "r", stepId: "s" },
    baseVersion: '"1"',
    delta: [{ op: "add", path: "/tags/-", value: "vip" }],
    params: { tag: "vip" },
    replyTo: `writ.replies.${agent}`,
    createdAt: NOW.toISOString(),
  };
  return { ...base, ...overrides };
}

function record(value: unknown, opts: { key?: string | null; headers?: IHeaders } = {}): KafkaMessage {
  const key = opts.key === undefined ? "ticket:T-1" : opts.key;
  return { key: key === null ? null : Buffer.from(key), value: Buffer.from(JSON.stringify(value)), timestamp: "0", attributes: 0, offset: "7", headers: opts.headers ?? {} } as KafkaMessage;
}

const signed = (v: unknown, key = alice.privateKey, keyId = "k1") => ({ [SIGNATURE_HEADER]: signIntent(v, { keyId, privateKey: key }) });
const source = (partition = 0) => ({ topic: "writ.intents", partition, offset: "7" });

function answer(a: Admission) {
  if (a.kind !== "answered") throw new Error(`expected an answer, got ${a.kind}`);
  for (const r of a.effects.replies) Reply.parse(r.value);
  return { reason: a.reason, replies: a.effects.replies, dead: a.effects.deadLetters.map((d) => d.value.reason) };
}

describe("admission: one owner per record, whatever the producer", () => {
  it("a record without a key is refused, dead-lettered and answered", async () => {
    const a = answer(await admit(record(intent("anyone"), { key: null }), source(), deps()));
    expect(a).toMatchObject({ reason: "key_missing", dead: ["key_missing"] });
    expect(a.replies[0]!.value).toMatchObject({ status: "rejected", reason: "key_missing" });
  });

  it("a resolution without a key is refused key_missing too, not key_mismatch (wire contract §2.1)", async () => {
    const resolution = {
      kind: "resolution",
      resolutionId: "res-1",
      escalationId: "esc-1",
      intent: intent("anyone"),
      decision: "discard",
      operator: { id: "anyone" },
      replyTo: "writ.replies.anyone",
      entity: { type: "ticket", id: "T-1" },
      createdAt: NOW.toISOString(),
    };
    const a = answer(await admit(record(resolution, { key: null, headers: { "writ-kind": Buffer.from("resolution") } }), source(), deps()));
    expect(a).toMatchObject({ reason: "key_missing", dead: ["key_missing"] });
    expect(a.replies[0]!.value).toMatchObject({ status: "rejected", reason: "key_missing", intentId: "res-1" });
  });

  it("a key that names another record than the intent is refused (key ticket:A, value for ticket:B)", async () => {
    const a = answer(await admit(record(intent("anyone"), { key: "ticket:T-2" }), source(), deps()));
    expect(a).toMatchObject({ reason: "key_mismatch", dead: ["key_mismatch"] });
  });

  it("a correctly keyed intent on another partition than its key's is forwarded there", async () => {
    const home = partitionFor("ticket:T-1", 12);
    const wrong = (home + 5) % 12;
    expect(await admit(record(intent("anyone")), source(wrong), deps({ partitions: 12 }))).toEqual({ kind: "forward", partition: home });
    expect((await admit(record(intent("anyone")), source(home), deps({ partitions: 12 }))).kind).toBe("admitted");
  });
});

describe("admission with an agent registry", () => {
  const withRegistry = () => deps({ agents: registry });

  it("a correctly signed intent is admitted", async () => {
    const v = intent();
    expect((await admit(record(v, { headers: signed(v) }), source(), withRegistry())).kind).toBe("admitted");
  });

  it("an unsigned intent is refused `unauthenticated`, dead-lettered, and answered only on the registered reply topic", async () => {
    const v = intent("alice", { replyTo: "writ.replies.bob" });
    const a = answer(await admit(record(v), source(), withRegistry()));
    expect(a).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"] });
    expect(a.replies.map((r) => r.topic)).toEqual(["writ.replies.alice"]);
  });

  it("a record changed after signing, signed by another agent's key, or naming an unknown key fails", async () => {
    const v = intent();
    const tampered = { ...v, delta: [{ op: "add", path: "/tags/-", value: "vip-plus" }] };
    expect(answer(await admit(record(tampered, { headers: signed(v) }), source(), withRegistry())).reason).toBe("unauthenticated");
    const added = { ...v, extra: 1 };
    expect(answer(await admit(record(added, { headers: signed(v) }), source(), withRegistry())).reason).toBe("unauthenticated");
    expect(answer(await admit(record(v, { headers: signed(v, mallory.privateKey) }), source(), withRegistry())).reason).toBe("unauthenticated");
    expect(answer(await admit(record(v, { headers: signed(v, alice.privateKey, "k9") }), source(), withRegistry())).reason).toBe("unauthenticated");
    expect(answer(await admit(record(v, { headers: { [SIGNATURE_HEADER]: "ed25519 k1 !!!" } }), source(), withRegistry())).reason).toBe("unauthenticated");
  });

  it("an intent with no canonical form cannot be signed, and is refused not_canonical, answered only on the registered reply topic", async () => {
    const v = intent("alice", { params: { tag: "vip", note: "cut \ud83d" }, replyTo: "writ.replies.bob" });
    expect(() => signed(v)).toThrow(expect.objectContaining({ code: "not_canonical", retriable: false }));
    const a = answer(await admit(record(v, { headers: signed(intent()) }), source(), withRegistry()));
    expect(a).toMatchObject({ reason: "not_canonical", dead: ["not_canonical"] });
    expect(a.replies.map((r) => r.topic)).toEqual(["writ.replies.alice"]);
    expect(a.replies[0]!.value).toMatchObject({ status: "rejected", reason: "not_canonical" });
    // The signature check alone refuses it too, saying why.
    expect(verifyIntentSignature(v, signed(intent())[SIGNATURE_HEADER], new Map([["k1", alice.publicKey]]))).toMatchObject({ ok: false, reason: expect.stringContaining("no canonical form") });
  });

  it("an agent not in the registry gets no reply at all, only a dead letter", async () => {
    const v = intent("eve");
    const a = answer(await admit(record(v, { headers: signed(v, mallory.privateKey) }), source(), withRegistry()));
    expect(a).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"], replies: [] });
  });

  it("a signed intent naming another agent's reply topic is refused, and answered on its own", async () => {
    const v = intent("alice", { replyTo: "writ.replies.bob" });
    const a = answer(await admit(record(v, { headers: signed(v) }), source(), withRegistry()));
    expect(a.reason).toBe("reply_topic_not_registered");
    expect(a.replies.map((r) => r.topic)).toEqual(["writ.replies.alice"]);
  });

  it("an answer with no reply topic to go to is dead-lettered: nothing refused goes unsaid", async () => {
    // alice's registered reply topic does not exist (deleted, or never created): the refusal cannot be replied.
    const gone: AdmissionDeps = { ...deps({ agents: registry }), replyTopics: { exists: async (t) => t === "writ.replies.bob" } };
    const v = intent("alice", { replyTo: "writ.replies.bob" });
    const a = answer(await admit(record(v, { headers: signed(v) }), source(), gone));
    // Its registered topic's absence first: the refusal of the topic it names would have nowhere to go either.
    expect(a).toMatchObject({ reason: "reply_topic_missing", replies: [], dead: ["reply_topic_missing"] });
  });

  it("an agent may call only its tools", async () => {
    const v = intent("alice", { tool: "close_ticket" });
    const a = answer(await admit(record(v, { headers: signed(v) }), source(), withRegistry()));
    expect(a.reason).toBe("tool_not_allowed");
  });

  it("an intent key that is not the one its fields give is refused: nobody can present or squat another agent's key", async () => {
    const bobs = intent("bob");
    const v = intent("alice", { intentKey: bobs.intentKey });
    const a = answer(await admit(record(v, { headers: signed(v) }), source(), withRegistry()));
    expect(a.reason).toBe("intent_key_mismatch");
    expect(a.replies.map((r) => r.topic)).toEqual(["writ.replies.alice"]);
  });
});

describe("admission: patch operations per path", () => {
  it("a bare path allows add and replace, not remove or move; a named op is allowed where named", async () => {
    const remove = intent("anyone", { delta: [{ op: "remove", path: "/tags" }] });
    expect(answer(await admit(record(remove), source(), deps())).reason).toBe("patch_op_not_allowed");
    const move = intent("anyone", { delta: [{ op: "move", from: "/tags", path: "/tags/-" }] });
    expect(answer(await admit(record(move), source(), deps())).reason).toBe("patch_op_not_allowed");
    const removeOne = intent("anyone", { delta: [{ op: "remove", path: "/tags/0" }] });
    expect((await admit(record(removeOne), source(), deps())).kind).toBe("admitted");
  });
});
