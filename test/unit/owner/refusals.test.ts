// Refusals of signed intents remembered for their bytes (src/owner/refusals.ts): which are, under what key, how a
// repeat is answered after a restart, that a new submission of the same intent key is decided anew, and the bounds.
import { generateKeyPairSync } from "node:crypto";
import type { KafkaMessage } from "kafkajs";
import { describe, expect, it } from "vitest";
import { canonicalJson, sha256Hex } from "../../../src/canonical-json.ts";
import type { RejectReason } from "../../../src/errors.ts";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import { type Admission, type AdmissionDeps, admit, maxIntentAgeMs } from "../../../src/owner/admission.ts";
import { effects, rejectedReply } from "../../../src/owner/effects.ts";
import {
  answerRefusedResolution,
  type RefusedAnswer,
  REMEMBERED_REFUSALS,
  rememberRefusal,
  rememberResolutionRefusal,
  repeatedRefusal,
  resolutionApplyOf,
  resolutionInDoubt,
  type SignedIntent,
  type SignedResolution,
} from "../../../src/owner/refusals.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import { z } from "zod";
import { entityKey } from "../../../src/schemas/common.ts";
import { LedgerEntry, type LedgerIntentEntry, refusalLedgerKey } from "../../../src/schemas/ledger-entry.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import type { Resolution } from "../../../src/schemas/resolution.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { AgentRegistry } from "../../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../../src/security/signing.ts";
import { LEDGER_ENTRY_FIELDS_BYTES } from "../../../src/topics.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { escalatedCase, OPS_REPLIES, T1 } from "./escalated-case.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const REPLY_TO = "writ.replies.alice";
/** The reply topic the registry named for alice before her client's (REPLY_TO) was registered. */
const OLD_REPLY_TO = "writ.replies.alice-old";
// The agent may call add_tag; close_ticket is the tool a grant changes.
const closeTicket = declareWriteTool({ ...addTag, name: "close_ticket" });
const tools = admitTools([addTag, closeTicket], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 });
const alice = generateKeyPairSync("ed25519");
const registry = (grants: string[], replyTopic = REPLY_TO) =>
  AgentRegistry.from({ agents: { alice: { keys: [{ id: "k1", publicKey: alice.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: grants, replyTopic } } });

const deps = (agents?: AgentRegistry): AdmissionDeps => ({
  config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
  codec: new WireCodec({}),
  tools,
  replyTopics: { exists: async (t) => t === REPLY_TO || t === OLD_REPLY_TO },
  now: () => NOW,
  ...(agents ? { agents } : {}),
  partitions: 1,
});

/** Alice's close_ticket of T-1, submitted as `intentId`. */
function closeIntent(intentId: string): WriteIntent {
  const entity = { type: "ticket", id: "T-1" };
  const params = { tag: "vip" };
  const key = intentKey({ tool: { name: "close_ticket", keyScope: "run", intentFields: ["tag"] }, agentId: "alice", runId: "r", stepId: "s", entity, params });
  const change = { baseVersion: '"1"', delta: [{ op: "add" as const, path: "/tags/-", value: "vip" }], params };
  return { intentId, intentKey: key, entity, tool: "close_ticket", agent: { id: "alice", runId: "r", stepId: "s" }, ...change, replyTo: REPLY_TO, createdAt: NOW.toISOString() };
}

const record = (v: WriteIntent): KafkaMessage =>
  ({ key: Buffer.from(entityKey(v.entity)), value: Buffer.from(JSON.stringify(v)), timestamp: "0", attributes: 0, offset: "7", headers: { [SIGNATURE_HEADER]: signIntent(v, { keyId: "k1", privateKey: alice.privateKey }) } }) as KafkaMessage;
const source = { topic: "writ.intents", partition: 0, offset: "7" };

function signedOf(a: Admission): SignedIntent | undefined {
  if (a.kind === "answered") return a.signed;
  if (a.kind === "admitted") return a.admitted.signed === undefined ? undefined : { digest: a.admitted.signed, intent: a.admitted.intent };
  throw new Error(`unexpected admission ${a.kind}`);
}

function committed(ledger: PartitionLedger, entry: LedgerIntentEntry): void {
  ledger.stageRefusal(entry);
  ledger.takeStaged();
  ledger.committedSending();
}

describe("refused signed intents: remembered for their bytes", () => {
  it("tool_not_allowed: the signed bytes are refused again after the grant, also by a new owner (restored ledger), as a repeat; a new submission of the key is decided anew", async () => {
    const v = closeIntent("i-1");
    const refused = await admit(record(v), source, deps(registry(["add_tag"])));
    expect(refused).toMatchObject({ kind: "answered", reason: "tool_not_allowed" });
    const signed = signedOf(refused)!;
    // The digest of what the agent signed: intent id and createdAt included.
    expect(signed.digest).toBe(sha256Hex(canonicalJson(v)));
    const out = rememberRefusal(signed, (refused as Extract<Admission, { kind: "answered" }>).effects, NOW, undefined);
    expect(out.refusal).toMatchObject({ kind: "intent", intentKey: refusalLedgerKey(signed.digest), status: "done", intentId: "i-1", refusedIntentKey: v.intentKey, outcome: { status: "rejected", reason: "tool_not_allowed" } });
    expect(LedgerEntry.parse(out.refusal)).toEqual(out.refusal);
    // Written under its own key: the intent key's entry is untouched (a new submission of the key classifies as new).
    const ledger = new PartitionLedger(0);
    committed(ledger, out.refusal!);
    expect(ledger.get(v.intentKey)).toBeUndefined();

    // A new owner restores the ledger; the agent is granted the tool since; the same bytes come again.
    const restored = new PartitionLedger(0, [[refusalLedgerKey(signed.digest), out.refusal!]]);
    const again = await admit(record(v), source, deps(registry(["add_tag", "close_ticket"])));
    expect(again.kind).toBe("admitted");
    const repeat = repeatedRefusal(restored, signedOf(again)!, new Date(NOW.getTime() + 3_600_000));
    expect(repeat?.replies).toHaveLength(1);
    const reply = Reply.parse(repeat!.replies[0]!.value);
    expect(reply).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: true, intentId: "i-1", intentKey: v.intentKey });
    expect(repeat!.replies[0]!.topic).toBe(REPLY_TO);
    expect(repeat!.ledger ?? repeat!.refusal).toBeUndefined();

    // A new submission of the same intent key (a new intent id): another digest, decided on the state now.
    const anew = await admit(record(closeIntent("i-2")), source, deps(registry(["add_tag", "close_ticket"])));
    expect(anew.kind).toBe("admitted");
    expect(repeatedRefusal(restored, signedOf(anew)!, NOW)).toBeNull();
  });

  // Bytes dated ahead of the owner's clock are refused clock_skew, "nothing written"; but time passes, and the same
  // bytes produced again once the clock has caught up with their createdAt were admitted and written: the agent was
  // told rejected, and moved on.
  it("clock_skew: the same bytes are refused again once the owner's clock has caught up with them, as a repeat, until they are stale", async () => {
    const ahead = { ...closeIntent("i-ahead"), createdAt: new Date(NOW.getTime() + 3_600_000).toISOString() };
    const granted = registry(["add_tag", "close_ticket"]);
    const refused = await admit(record(ahead), source, deps(granted));
    expect(refused).toMatchObject({ kind: "answered", reason: "clock_skew" });
    const signed = signedOf(refused)!;
    const out = rememberRefusal(signed, (refused as Extract<Admission, { kind: "answered" }>).effects, NOW, undefined);
    expect(out.refusal).toMatchObject({ intentKey: refusalLedgerKey(signed.digest), outcome: { status: "rejected", reason: "clock_skew" } });
    const ledger = new PartitionLedger(0, [[refusalLedgerKey(signed.digest), out.refusal!]]);
    // An hour on, the bytes are within the skew: admitted, and answered as refused before.
    const later = new Date(NOW.getTime() + 3_600_000);
    const again = await admit(record(ahead), source, { ...deps(granted), now: () => later });
    expect(again.kind).toBe("admitted");
    expect(Reply.parse(repeatedRefusal(ledger, signedOf(again)!, later)!.replies[0]!.value)).toMatchObject({ status: "rejected", reason: "clock_skew", duplicate: true, intentId: "i-ahead" });
    // Kept until the bytes are stale: the sweep (a 24 h retention) takes it only past their cutoff.
    const retentionMs = 24 * 3_600_000;
    const staleAt = Date.parse(ahead.createdAt) + maxIntentAgeMs(ahead, 24);
    expect(ledger.expired(new Date(staleAt - retentionMs), 10)).toEqual([]);
    expect(ledger.expired(new Date(Date.parse(out.refusal!.updatedAt) + 1), 10)).toEqual([out.refusal!.intentKey]);
  });

  // What admission decides on besides the bytes: the owners' deploy (their tools, as declared) and the agent registry.
  // Each case refuses the same signed bytes on one and admits them on the next: the first refusal must stand.
  const openCase = declareWriteTool({
    name: "open_case",
    recordType: "case",
    params: z.object({ orderRef: z.string(), subject: z.string() }),
    intentFields: ["orderRef"],
    create: { externalId: (p) => `order-${p.orderRef}`, body: (p) => ({ subject: p.subject }) },
    keyScope: "run",
    system: "helpdesk",
    reconcile: "idempotency-key",
  });
  const openIntent = (): WriteIntent => {
    const entity = { type: "case", id: "order-7" };
    const params = { orderRef: "7", subject: "late" };
    const key = intentKey({ tool: { name: "open_case", keyScope: "run", intentFields: ["orderRef"] }, agentId: "alice", runId: "r", stepId: "s", entity, params });
    return { intentId: "i-open", intentKey: key, entity, tool: "open_case", agent: { id: "alice", runId: "r", stepId: "s" }, baseVersion: "absent", delta: [{ op: "add", path: "", value: { subject: "late" } }], params, replyTo: REPLY_TO, createdAt: NOW.toISOString() };
  };
  const everything = registry(["add_tag", "close_ticket", "open_case"]);
  const deployed = (declarations: Parameters<typeof admitTools>[0], agents = everything): AdmissionDeps => ({
    ...deps(agents),
    tools: admitTools(declarations, [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 }),
  });
  const now = deployed([addTag, closeTicket, openCase]);
  const cases: { reason: RejectReason; before: AdmissionDeps; intent?: WriteIntent; topic?: string }[] = [
    { reason: "reply_topic_not_registered", before: deployed([addTag, closeTicket, openCase], registry(["add_tag", "close_ticket"], OLD_REPLY_TO)), topic: OLD_REPLY_TO },
    { reason: "unknown_tool", before: deployed([addTag]) },
    { reason: "entity_type_mismatch", before: deployed([addTag, declareWriteTool({ ...closeTicket, recordType: "case" })]) },
    { reason: "params_invalid", before: deployed([addTag, declareWriteTool({ ...closeTicket, params: z.object({ tag: z.string().max(2) }) })]) },
    { reason: "patch_path_not_allowed", before: deployed([addTag, declareWriteTool({ ...closeTicket, allowedPaths: ["/status"] })]) },
    { reason: "patch_op_not_allowed", before: deployed([addTag, declareWriteTool({ ...closeTicket, allowedPaths: [{ path: "/tags/-", ops: ["replace"] }] })]) },
    { reason: "intent_key_mismatch", before: deployed([addTag, declareWriteTool({ ...closeTicket, keyScope: "global" })]) },
    { reason: "external_id_mismatch", before: deployed([declareWriteTool({ ...openCase, create: { ...openCase.create!, externalId: (p) => `case-${p.orderRef}` } })]), intent: openIntent() },
    // A body RFC 8785 cannot write (a lone surrogate): nothing to check the delta against.
    { reason: "not_canonical", before: deployed([declareWriteTool({ ...openCase, create: { ...openCase.create!, body: () => ({ subject: "\ud800" }) } })]), intent: openIntent() },
    { reason: "delta_mismatch", before: deployed([declareWriteTool({ ...openCase, create: { ...openCase.create!, body: (p) => ({ subject: p.subject, status: "open" }) } })]), intent: openIntent() },
  ];
  for (const c of cases) {
    it(`${c.reason}: refused on what the owners were deployed with (or registered), the same signed bytes are refused again once that changed, as a repeat`, async () => {
      const v = c.intent ?? closeIntent("i-1");
      const refused = await admit(record(v), source, c.before);
      expect(refused).toMatchObject({ kind: "answered", reason: c.reason });
      if (refused.kind !== "answered") return;
      // Answered on the agent's registered topic, not one the intent names.
      expect(refused.effects.replies.map((r) => r.topic)).toEqual([c.topic ?? REPLY_TO]);
      const signed = signedOf(refused)!;
      expect(signed.digest).toBe(sha256Hex(canonicalJson(v)));
      const entry = rememberRefusal(signed, refused.effects, NOW, undefined).refusal;
      expect(entry).toMatchObject({ intentKey: refusalLedgerKey(signed.digest), outcome: { status: "rejected", reason: c.reason } });
      const ledger = new PartitionLedger(0, [[entry!.intentKey, entry!]]);
      // Refused so again before the change: answered where admission answers, as the repeat it is.
      const before = repeatedRefusal(ledger, signed, NOW, refused.effects.replies[0]!.topic)!;
      expect(before.replies.map((r) => [r.topic, r.value])).toEqual([[c.topic ?? REPLY_TO, expect.objectContaining({ reason: c.reason, duplicate: true })]]);

      const again = await admit(record(v), source, now);
      expect(again.kind).toBe("admitted");
      const repeat = repeatedRefusal(ledger, signedOf(again)!, NOW);
      expect(repeat!.replies.map((r) => [r.topic, Reply.parse(r.value)])).toEqual([[REPLY_TO, expect.objectContaining({ status: "rejected", reason: c.reason, duplicate: true, intentId: v.intentId })]]);
    });
  }

  it("only an authenticated intent's refusal is remembered: without an agent registry admission carries no digest", async () => {
    const a = await admit(record(closeIntent("i-1")), source, deps());
    expect(a.kind).toBe("admitted");
    expect(signedOf(a)).toBeUndefined();
    expect(rememberRefusal(undefined, effects({ replies: [{ topic: REPLY_TO, value: rejectedReply("i-1", "k", "leased", "m", NOW.toISOString()) }] }), NOW, undefined).refusal).toBeUndefined();
  });

  it("remembers the refusals given without a ledger entry on a state that may pass, and nothing else", () => {
    const signed = { digest: "d".repeat(64), intent: closeIntent("i-1") };
    const refusing = (reason: Parameters<typeof rejectedReply>[2], extra = {}) =>
      rememberRefusal(signed, effects({ replies: [{ topic: REPLY_TO, value: { ...rejectedReply("i-1", signed.intent.intentKey, reason, "m", NOW.toISOString()), ...extra } }] }), NOW, undefined).refusal;
    // On the deploy or the registry; on the ledger or the record; on the clock.
    const remembered = [
      ...["reply_topic_not_registered", "unknown_tool", "tool_not_allowed", "entity_type_mismatch", "params_invalid", "patch_path_not_allowed"],
      ...["patch_op_not_allowed", "intent_key_mismatch", "external_id_mismatch", "delta_mismatch", "not_canonical"],
      ...["leased", "lease_not_held", "lease_limit", "lease_hold_exceeded", "lease_cooldown", "entity_not_found", "sor_protocol", "key_reused_with_different_params", "undo_target_unknown"],
      ...["undo_target_mismatch", "undo_target_not_applied", "undo_not_declared", "clock_skew"],
    ] as RejectReason[];
    for (const reason of remembered) {
      expect(REMEMBERED_REFUSALS.has(reason)).toBe(true);
      expect(refusing(reason)?.outcome).toMatchObject({ status: "rejected", reason });
    }
    expect(REMEMBERED_REFUSALS.size).toBe(remembered.length);
    // Refusals a later state does not turn into a write (stale, lease_replayed), one dead-lettered to be sent back
    // once its fault is fixed (processing_failed), ones always written with an entry of the key's, a repeat, a settled one.
    for (const reason of ["stale", "lease_replayed", "processing_failed", "sor_rejected", "patch_not_applicable", "undo_failed"] as const) expect(refusing(reason)).toBeUndefined();
    // key_reused_with_different_params keeps the key's entry dated again (`kept`) beside it: both are written.
    const kept = { kind: "intent", intentKey: signed.intent.intentKey } as LedgerIntentEntry;
    const reused = effects({ kept, replies: [{ topic: REPLY_TO, value: rejectedReply("i-1", signed.intent.intentKey, "key_reused_with_different_params", "m", NOW.toISOString()) }] });
    expect(rememberRefusal(signed, reused, NOW, undefined)).toMatchObject({ kept, refusal: { outcome: { reason: "key_reused_with_different_params" } } });
    expect(refusing("leased", { duplicate: true })).toBeUndefined();
    const settled = effects({ ledger: { kind: "intent" } as LedgerIntentEntry, replies: [{ topic: REPLY_TO, value: rejectedReply("i-1", "k", "leased", "m", NOW.toISOString()) }] });
    expect(rememberRefusal(signed, settled, NOW, undefined).refusal).toBeUndefined();
  });

  it("kept past the intent's stale cutoff (a retention after the later of the refusal and its createdAt), then swept", () => {
    const ahead = { ...closeIntent("i-1"), createdAt: new Date(NOW.getTime() + 240_000).toISOString() };
    const entry = rememberRefusal({ digest: "e".repeat(64), intent: ahead }, effects({ replies: [{ topic: REPLY_TO, value: rejectedReply("i-1", ahead.intentKey, "leased", "m", NOW.toISOString()) }] }), NOW, undefined).refusal!;
    expect(entry.updatedAt).toBe(ahead.createdAt);
    const retentionMs = 3_600_000;
    expect(Date.parse(entry.updatedAt) + retentionMs).toBeGreaterThan(Date.parse(ahead.createdAt) + maxIntentAgeMs(ahead, 1));
    const ledger = new PartitionLedger(0);
    committed(ledger, entry);
    expect(ledger.expired(new Date(Date.parse(ahead.createdAt) - 1), 10)).toEqual([]);
    expect(ledger.expired(new Date(Date.parse(ahead.createdAt) + 1), 10)).toEqual([entry.intentKey]);
  });

  it("bytes dated past the allowed clock skew are refused clock_skew before the tool's grant, remembered dated no later than the skew, so nothing holds the sweep back", async () => {
    const future = { ...closeIntent("i-future"), createdAt: "2099-01-01T00:00:00.000Z" };
    // Alice may not call close_ticket: a tool_not_allowed refusal would be remembered, dated from its createdAt.
    const a = await admit(record(future), source, deps(registry(["add_tag"])));
    expect(a).toMatchObject({ kind: "answered", reason: "clock_skew" });
    if (a.kind !== "answered") return;
    expect(rememberRefusal(a.signed, a.effects, NOW, undefined).refusal).toMatchObject({ outcome: { reason: "clock_skew" }, updatedAt: new Date(NOW.getTime() + 300_000).toISOString() });
    // Nor remembered for a reply topic not registered, which came before the date: its entry dated at the bytes'
    // createdAt capped at the skew, swept long before the bytes are admissible, which a registry change would make.
    const elsewhere = await admit(record(future), source, deps(registry(["add_tag", "close_ticket"], OLD_REPLY_TO)));
    expect(elsewhere).toMatchObject({ kind: "answered", reason: "clock_skew" });
    // However its bytes reached it, a refusal's entry is dated no later than the skew admission allows.
    const far = rememberRefusal({ digest: "f".repeat(64), intent: future }, effects({ replies: [{ topic: REPLY_TO, value: rejectedReply("i-future", future.intentKey, "tool_not_allowed", "m", NOW.toISOString()) }] }), NOW, undefined).refusal!;
    expect(Date.parse(far.updatedAt)).toBe(NOW.getTime() + 300_000);
    // So an entry written after it is swept once due: the sweep stops at the first entry not yet due.
    const ledger = new PartitionLedger(0);
    committed(ledger, far);
    const later = { ...far, intentKey: refusalLedgerKey("a".repeat(64)), updatedAt: NOW.toISOString() };
    committed(ledger, later);
    expect(ledger.expired(new Date(NOW.getTime() + 600_000), 10)).toEqual([far.intentKey, later.intentKey]);
  });

  it("an entry of the largest fields fits the ledger entry bound (LEDGER_ENTRY_FIELDS_BYTES)", () => {
    const worst = {
      ...closeIntent("i".repeat(128)),
      intentKey: "f".repeat(64),
      entity: { type: `t${"a".repeat(63)}`, id: "\u0001".repeat(256) },
      tool: "\u0001".repeat(128),
      agent: { id: "\u0001".repeat(128), runId: "r", stepId: "s" },
      baseVersion: "\u0001".repeat(256),
      replyTo: "w".repeat(249),
    } as WriteIntent;
    const reply = rejectedReply(worst.intentId, worst.intentKey, "undo_target_not_applied", "\u0001".repeat(5_000), NOW.toISOString(), { status: "pending" });
    const entry = rememberRefusal({ digest: "0".repeat(64), intent: worst }, effects({ replies: [{ topic: worst.replyTo, value: reply }] }), NOW, undefined).refusal!;
    expect(entry.outcome).toMatchObject({ message: "\u0001".repeat(2_000) });
    expect(Buffer.byteLength(JSON.stringify(entry)) + Buffer.byteLength(entry.intentKey)).toBeLessThan(LEDGER_ENTRY_FIELDS_BYTES);
  });
});

// An operator's resolution is signed bytes too: refused (a grant, a deploy, the record), then produced again once that
// passed, it was carried out after the operator had been told it was not (test/integration/refusal-replay.test.ts).
describe("refused signed resolutions: remembered for their bytes", () => {
  /** Alice, as an operator, applying the escalation of her close_ticket of T-1. */
  const resolutionOf = (resolutionId: string, createdAt = NOW.toISOString()): Resolution => {
    const intent = closeIntent("i-esc");
    return { kind: "resolution", resolutionId, escalationId: "esc-1", intent, decision: "apply", baseVersion: '"2"', operator: { id: "alice" }, replyTo: REPLY_TO, entity: { type: "ticket", id: "T-1" }, createdAt };
  };
  const resolutionRecord = (r: Resolution): KafkaMessage => ({ ...record(r as unknown as WriteIntent), headers: { "writ-kind": Buffer.from("resolution"), [SIGNATURE_HEADER]: signIntent(r, { keyId: "k1", privateKey: alice.privateKey }) } }) as KafkaMessage;
  const answered = (a: Admission) => {
    if (a.kind !== "answered") throw new Error(`expected answered, got ${a.kind}`);
    return a;
  };
  /** The effects of an answer; throws on `in_doubt`. */
  const answerOf = (a: RefusedAnswer) => {
    if (a.kind !== "answer") throw new Error(`expected an answer, got ${a.kind}`);
    return a.effects;
  };
  /** The escalation's entry: open, or an apply of it under way. */
  const escalated = (status: "done" | "pending"): LedgerIntentEntry => ({
    kind: "intent",
    intentKey: closeIntent("i-esc").intentKey,
    intentId: "i-esc",
    status,
    entity: { type: "ticket", id: "T-1" },
    tool: "close_ticket",
    agentId: "alice",
    fingerprint: "a".repeat(64),
    attempts: [{ baseVersion: '"1"', deltaFingerprint: "b".repeat(64) }],
    cycles: 2,
    outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: "m", escalationId: "esc-1", at: NOW.toISOString() },
    replyTo: REPLY_TO,
    updatedAt: NOW.toISOString(),
  });

  it("tool_not_allowed (no writ.resolve): remembered under the digest of the operator's signed bytes, and answered so again once granted, as a repeat under its resolution id", async () => {
    const r = resolutionOf("res-1");
    const refused = answered(await admit(resolutionRecord(r), source, deps(registry(["add_tag", "close_ticket"]))));
    expect(refused.reason).toBe("tool_not_allowed");
    expect(refused.signed).toBeUndefined();
    expect(refused.resolution).toMatchObject({ digest: sha256Hex(canonicalJson(r)), intent: { intentId: "res-1", intentKey: r.intent.intentKey, agent: { id: "alice" }, baseVersion: '"2"' } });
    const ledger = new PartitionLedger(0, [[r.intent.intentKey, escalated("done")]]);
    const out = answerOf(answerRefusedResolution(ledger, refused.resolution!, refused.effects, NOW, REPLY_TO));
    expect(out.refusal).toMatchObject({ intentKey: refusalLedgerKey(refused.resolution!.digest), intentId: "res-1", refusedIntentKey: r.intent.intentKey, outcome: { reason: "tool_not_allowed" } });
    expect(LedgerEntry.parse(out.refusal)).toEqual(out.refusal);
    committed(ledger, out.refusal!);
    // The escalation's entry is untouched: still open to a new decision.
    expect(ledger.get(r.intent.intentKey)).toEqual(escalated("done"));

    // Granted since: admitted, with its bytes; the memory answers them before anything is planned.
    const again = await admit(resolutionRecord(r), source, deps(registry(["add_tag", "close_ticket", "writ.resolve"])));
    expect(again).toMatchObject({ kind: "resolution", signed: { digest: refused.resolution!.digest } });
    const repeat = repeatedRefusal(ledger, (again as Extract<Admission, { kind: "resolution" }>).signed!, NOW, REPLY_TO)!;
    expect(Reply.parse(repeat.replies[0]!.value)).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: true, intentId: "res-1", intentKey: r.intent.intentKey });
    // Refused at admission again (another owner not granting it yet): the same, nothing more remembered.
    expect(answerOf(answerRefusedResolution(ledger, refused.resolution!, refused.effects, NOW, REPLY_TO))).toMatchObject({ replies: [{ value: { reason: "tool_not_allowed", duplicate: true } }] });
    expect(answerOf(answerRefusedResolution(ledger, refused.resolution!, refused.effects, NOW, REPLY_TO)).refusal).toBeUndefined();
    // A new decision (a new resolution id, signed anew): another digest, decided on the state now.
    const anew = await admit(resolutionRecord(resolutionOf("res-2")), source, deps(registry(["add_tag", "close_ticket", "writ.resolve"])));
    expect(repeatedRefusal(ledger, (anew as Extract<Admission, { kind: "resolution" }>).signed!, NOW, REPLY_TO)).toBeNull();
    // Without a registry nothing is signed, and nothing remembered.
    expect(await admit(resolutionRecord(r), source, deps())).not.toHaveProperty("signed");
  });

  it("dated as an intent is: stale past maxIntentAgeMs (not remembered), clock_skew ahead (remembered, dated at most the skew ahead), before the grant; the memory outlives the bytes", async () => {
    const old = resolutionOf("res-old", new Date(NOW.getTime() - maxIntentAgeMs({}, 24) - 1).toISOString());
    const stale = answered(await admit(resolutionRecord(old), source, deps(registry(["add_tag"]))));
    expect(stale).toMatchObject({ reason: "stale", resolution: { intent: { intentId: "res-old" } } });
    expect(stale.effects.replies[0]!.value).toMatchObject({ intentId: "res-old", message: expect.stringContaining("Decide again (a new resolution)") });
    expect(answerOf(answerRefusedResolution(new PartitionLedger(0), stale.resolution!, stale.effects, NOW, REPLY_TO)).refusal).toBeUndefined();

    const ahead = resolutionOf("res-ahead", "2099-01-01T00:00:00.000Z");
    const skewed = answered(await admit(resolutionRecord(ahead), source, deps(registry(["add_tag"]))));
    expect(skewed.reason).toBe("clock_skew");
    expect(answerOf(answerRefusedResolution(new PartitionLedger(0), skewed.resolution!, skewed.effects, NOW, REPLY_TO)).refusal).toMatchObject({ updatedAt: new Date(NOW.getTime() + 300_000).toISOString() });
    // Any resolution admitted now is stale before a refusal remembered for it now is swept (a 24 h retention).
    const fresh = resolutionOf("res-fresh", new Date(NOW.getTime() + 300_000).toISOString());
    expect((await admit(resolutionRecord(fresh), source, deps(registry(["add_tag", "close_ticket", "writ.resolve"])))).kind).toBe("resolution");
    expect(Date.parse(fresh.createdAt) + maxIntentAgeMs({}, 24)).toBeLessThan(NOW.getTime() + 24 * 3_600_000);
  });

  it("an apply's refusal is remembered beside the escalation put back open; not a decision carried out, not stale", () => {
    const signed: SignedResolution = { digest: "d".repeat(64), intent: { ...closeIntent("res-1"), agent: { id: "ops" }, decision: "apply" } };
    const refusal = (reason: RejectReason) => ({ topic: REPLY_TO, value: rejectedReply("res-1", signed.intent.intentKey, reason, "m", NOW.toISOString()) });
    const reopened = effects({ ledger: escalated("done"), replies: [refusal("patch_path_not_allowed")] });
    expect(answerOf(rememberResolutionRefusal(signed, reopened, NOW, reopened.ledger))).toMatchObject({ ledger: escalated("done"), refusal: { intentId: "res-1", agentId: "ops", outcome: { reason: "patch_path_not_allowed" } } });
    // Reasons are open: any but stale (a later version's, an owner's own such as resolution_not_applicable).
    for (const reason of ["resolution_not_applicable", "resolution_conflict", "entity_not_found", "processing_failed", "clock_skew"] as RejectReason[]) {
      expect(answerOf(rememberResolutionRefusal(signed, effects({ replies: [refusal(reason)] }), NOW, escalated("done"))).refusal, reason).toBeDefined();
    }
    expect(answerOf(rememberResolutionRefusal(signed, effects({ replies: [refusal("stale")] }), NOW, undefined)).refusal).toBeUndefined();
    expect(answerOf(rememberResolutionRefusal(undefined, reopened, NOW, reopened.ledger)).refusal).toBeUndefined();
    // A discard carried out answers the agent and the operator: nothing to remember (the escalation is closed).
    const discarded = effects({ ledger: { ...escalated("done"), outcome: { status: "rejected", reason: "escalation_discarded", message: "m", at: NOW.toISOString() } }, replies: [refusal("escalation_discarded"), { ...refusal("escalation_discarded"), topic: "writ.replies.agent" }] });
    expect(answerOf(rememberResolutionRefusal(signed, discarded, NOW, discarded.ledger)).refusal).toBeUndefined();
    // An intent's memory keeps its rule: a refusal written with an entry of its key is not remembered.
    expect(rememberRefusal(signed, reopened, NOW, reopened.ledger).refusal).toBeUndefined();
  });

  // The review's case: operator A's apply R1 pending through an outage; operator B's R2 refused tool_not_allowed
  // meanwhile; R1 ends in resolution_conflict (the escalation open again); B granted; R2's bytes again. Before, the
  // pending entry held no resolution id, R2's refusal was not remembered, and R2 was carried out.
  it("refused while another resolution's apply holds the escalation pending: remembered, and answered so once that apply reopened the escalation and the operator is granted", async () => {
    const ledger = new PartitionLedger(0, [[closeIntent("i-esc").intentKey, escalated("done")]]);
    // R1's apply under way: its pending entry staged under R1's digest.
    const r1 = { digest: "1".repeat(64) };
    ledger.stage({ ...escalated("pending"), resolutionDigest: r1.digest }, { resolution: true });
    const r2 = resolutionOf("res-2");
    const refused = answered(await admit(resolutionRecord(r2), source, deps(registry(["add_tag", "close_ticket"]))));
    expect(refused.reason).toBe("tool_not_allowed");
    expect(refused.resolution!.intent.decision).toBe("apply");
    const out = answerOf(answerRefusedResolution(ledger, refused.resolution!, refused.effects, NOW, REPLY_TO));
    expect(out).toMatchObject({ replies: [{ value: { reason: "tool_not_allowed", duplicate: false } }], refusal: { intentKey: refusalLedgerKey(refused.resolution!.digest), intentId: "res-2" } });
    committed(ledger, out.refusal!);
    // R1 refused by its apply: the escalation open again (its entry as it was, no applier's digest).
    committed(ledger, escalated("done"));
    const granted = await admit(resolutionRecord(r2), source, deps(registry(["add_tag", "close_ticket", "writ.resolve"])));
    expect(granted).toMatchObject({ kind: "resolution", signed: { digest: refused.resolution!.digest } });
    const repeat = repeatedRefusal(ledger, (granted as Extract<Admission, { kind: "resolution" }>).signed!, NOW, REPLY_TO);
    expect(repeat?.replies[0]?.value).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: true, intentId: "res-2" });
  });

  it("refused while the escalation's pending apply may be their own (its digest, or none: an older owner's): in doubt, neither answered nor remembered; a discard, a return, an intent's pending write or stale bytes are not", async () => {
    const r = resolutionOf("res-1");
    const refused = answered(await admit(resolutionRecord(r), source, deps(registry(["add_tag", "close_ticket"]))));
    const mine = refused.resolution!;
    const withEntry = (entry: LedgerIntentEntry) => new PartitionLedger(0, [[r.intent.intentKey, entry]]);
    const ownApply = { ...escalated("pending"), resolutionDigest: mine.digest };
    const olderOwners = escalated("pending");
    expect(resolutionApplyOf(ownApply, mine)).toBe("this");
    expect(resolutionApplyOf(olderOwners, mine)).toBe("maybe");
    expect(resolutionApplyOf({ ...ownApply, resolutionDigest: "e".repeat(64) }, mine)).toBe("other");
    for (const entry of [ownApply, olderOwners]) {
      expect(answerRefusedResolution(withEntry(entry), mine, refused.effects, NOW, REPLY_TO)).toEqual({ kind: "in_doubt", status: "pending" });
    }
    // What the owner then does with the record: dead-lettered outcome_unknown, whole, no reply.
    const inDoubt = resolutionInDoubt(resolutionRecord(r), source, refused.effects, NOW);
    expect(inDoubt.replies).toEqual([]);
    expect(inDoubt.refusal).toBeUndefined();
    expect(inDoubt.deadLetters).toMatchObject([{ value: { reason: "outcome_unknown", message: expect.stringContaining("refused tool_not_allowed"), source } }]);
    // Refused as its apply runs (a settled plan over its own pending entry): the same.
    const reply = { topic: REPLY_TO, value: rejectedReply("res-1", r.intent.intentKey, "resolution_not_applicable", "m", NOW.toISOString()) };
    expect(rememberResolutionRefusal(mine, effects({ replies: [reply] }), NOW, ownApply).kind).toBe("in_doubt");

    // Bytes that never run again keep their refusal, unremembered.
    const stale = answered(await admit(resolutionRecord(resolutionOf("res-1", new Date(NOW.getTime() - maxIntentAgeMs({}, 24) - 1).toISOString())), source, deps(registry(["add_tag"]))));
    const staleOwn = { ...escalated("pending"), resolutionDigest: stale.resolution!.digest };
    expect(answerOf(answerRefusedResolution(withEntry(staleOwn), stale.resolution!, stale.effects, NOW, REPLY_TO))).toMatchObject({ replies: [{ value: { reason: "stale" } }] });
    expect(answerOf(answerRefusedResolution(withEntry(staleOwn), stale.resolution!, stale.effects, NOW, REPLY_TO)).refusal).toBeUndefined();

    // A discard or a return stages no entry: never the apply under way, so its refusal is remembered (the plan's
    // "an apply was under way", and at admission), whatever staged the entry.
    for (const decision of ["discard", "return"] as const) {
      const d = { ...resolutionOf(`res-${decision}`), decision };
      delete (d as Partial<Resolution>).baseVersion;
      const discard = answered(await admit(resolutionRecord(d), source, deps(registry(["add_tag", "close_ticket"]))));
      expect(discard.resolution!.intent.decision).toBe(decision);
      expect(answerOf(answerRefusedResolution(withEntry(olderOwners), discard.resolution!, discard.effects, NOW, REPLY_TO)).refusal, decision).toMatchObject({ intentId: `res-${decision}` });
      const notApplicable = effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(`res-${decision}`, r.intent.intentKey, "resolution_not_applicable", "an apply was under way", NOW.toISOString()) }] });
      expect(answerOf(rememberResolutionRefusal(discard.resolution!, notApplicable, NOW, ownApply)).refusal, decision).toMatchObject({ outcome: { reason: "resolution_not_applicable" } });
    }
    // An intent's write pending on the key (no escalation recorded): no apply at all.
    const { outcome: _, ...intentPending } = escalated("pending");
    expect(answerOf(answerRefusedResolution(withEntry(intentPending), mine, refused.effects, NOW, REPLY_TO)).refusal).toMatchObject({ intentId: "res-1" });
  });

  it("an apply stages the escalation's pending entry under the digest of its signed bytes; put back open or closed, the entry drops it; a resumed apply stages its own", async () => {
    const { tool, key, resolution, ledger, sor } = escalatedCase(addTag, { status: "done", state: { tags: [] }, delta: [{ op: "add", path: "/tags/-", value: "vip" }] });
    const resolver = new Resolver({ now: () => NOW });
    const plan = resolver.plan(resolution, tool, OPS_REPLIES, ledger, "1".repeat(64));
    if (plan.kind !== "apply") throw new Error(plan.kind);
    expect(plan.pending).toMatchObject({ status: "pending", resolutionDigest: "1".repeat(64) });
    expect(plan.entry).not.toHaveProperty("resolutionDigest");
    expect(LedgerEntry.parse(plan.pending)).toEqual(plan.pending);
    // Unsigned (no registry): none.
    const unsigned = resolver.plan(resolution, tool, OPS_REPLIES, ledger);
    expect(unsigned.kind === "apply" && unsigned.pending).not.toHaveProperty("resolutionDigest");
    ledger.stage(plan.pending, { resolution: true });

    // Another resolution takes the pending apply up (resumed): staged under its own digest, never the first's kept.
    const other = { ...resolution, resolutionId: "res-2", operator: { id: "lead" } };
    const resumed = resolver.plan(other, tool, OPS_REPLIES, ledger, "2".repeat(64));
    if (resumed.kind !== "apply") throw new Error(resumed.kind);
    expect(resumed).toMatchObject({ resumed: true, pending: { resolutionDigest: "2".repeat(64) } });
    expect(resumed.entry).not.toHaveProperty("resolutionDigest");
    // The record changed since the operator decided: the escalation put back open, without an applier's digest.
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "other" }]);
    const ctx = { mayWrite: () => true, durable: async () => undefined, headers: {} };
    const step = await resolver.apply(other, tool, OPS_REPLIES, resumed, ctx);
    expect(step).toMatchObject({ kind: "settled", effects: { ledger: { status: "done", outcome: { status: "escalated" } }, replies: [{ value: { reason: "resolution_conflict" } }] } });
    expect(step.kind === "settled" && step.effects.ledger).not.toHaveProperty("resolutionDigest");
    // An open entry that kept a digest (an older owner re-writes members it does not know): a discard closes it without.
    const kept = new PartitionLedger(0, [[key, { ...ledger.get(key)!, status: "done", resolutionDigest: "1".repeat(64) }]]);
    const discard = resolver.plan({ ...resolution, resolutionId: "res-3", decision: "discard" }, tool, OPS_REPLIES, kept, "3".repeat(64));
    expect(discard).toMatchObject({ kind: "settled", effects: { ledger: { status: "done", outcome: { status: "rejected", reason: "escalation_discarded" } } } });
    expect(discard.kind === "settled" && discard.effects.ledger).not.toHaveProperty("resolutionDigest");
  });
});
