// Creates by external id, undo and the leases of changes that span records,
// through admission and the intent pipeline,
// against the scriptable fake system (no broker): what reaches the system
// (create requests, PATCHes and their preconditions) is counted there.
import type { KafkaMessage } from "kafkajs";
import { pino } from "pino";
import { beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey, leaseIntentKey, undoIntentKey } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import { type AdmissionDeps, type AdmittedIntent, admit } from "../../../src/owner/admission.ts";
import type { Effects } from "../../../src/owner/effects.ts";
import { type ExecContext, IntentPipeline, type PipelineDeps, type Plan, type Step } from "../../../src/owner/intent-pipeline.ts";
import { runPlan, setStatus } from "./pipeline-fixtures.ts";
import { RecordEncoder } from "../../../src/owner/records.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import type { Resolution } from "../../../src/schemas/resolution.ts";
import { type EntityRef, type JsonPatchOp, type Versioned, entityKey } from "../../../src/schemas/common.ts";
import { Escalation } from "../../../src/schemas/escalation.ts";
import { LedgerEntry, LedgerIntentEntry, type LedgerLeaseEntry } from "../../../src/schemas/ledger-entry.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import { ABSENT_VERSION, DEFAULT_LEASE_TTL_MS, LEASE_COOLDOWN_MS, LEASE_VERSION, LEDGER_VERSION, WriteIntent } from "../../../src/schemas/write-intent.ts";
import { type LeaseBounds, type LeaseGate, lapsedLease, leaseGate, leaseRefusal, settleLeaseIntent } from "../../../src/owner/record-leases.ts";
import { type AdmittedTool, admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem, outage, version } from "./fake-system.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const REPLY_TO = "writ.replies.agent-1";
const log = pino({ level: "silent" });
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: { "x-writ-owner": "owner-test" } };

const openCase = declareWriteTool({
  name: "open_case",
  recordType: "case",
  params: z.object({ orderRef: z.string().min(1), subject: z.string() }),
  intentFields: ["orderRef"],
  freeTextParams: ["subject"],
  create: { externalId: (p) => `order-${p.orderRef}`, body: (p) => ({ subject: p.subject, status: "open", notes: [] }) },
  keyScope: "run",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

/** A create tool on a system without idempotency-key lookup: its created records carry the intent key. */
const openLead = declareWriteTool({
  name: "open_lead",
  recordType: "lead",
  params: z.object({ email: z.string() }),
  intentFields: ["email"],
  create: { externalId: (p) => p.email, body: (p) => ({ email: p.email, stage: "new" }), intentKeyField: "writIntentKey" },
  keyScope: "global",
  system: "crm",
});

const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"],
  allowedPaths: ["/tags"],
  delta: (p, current) => {
    const tags = (current.state as { tags: string[] }).tags;
    return [{ op: "replace", path: "/tags", value: tags.includes(p.tag) ? tags : [...tags, p.tag] }];
  },
  undo: (p, applied) => [{ op: "replace", path: "/tags", value: (applied.state as { tags: string[] }).tags.filter((t) => t !== p.tag) }],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
});


const T1: EntityRef = { type: "ticket", id: "T-1" };
const CASE: EntityRef = { type: "case", id: "order-ORD-1" };

let helpdesk: FakeSystem;
let crm: FakeSystem;
let tools: Map<string, AdmittedTool>;
let deps: AdmissionDeps;
let submissions = 0;

beforeEach(() => {
  helpdesk = new FakeSystem("helpdesk");
  crm = new FakeSystem("crm", { idempotencyKeys: false, idempotencyLookup: false });
  tools = admitTools([openCase, openLead, tagTicket, setStatus], [helpdesk, crm], { sorTimeoutMs: 1_000 });
  deps = {
    config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
    codec: new WireCodec({}),
    tools,
    replyTopics: { exists: async (t) => t === REPLY_TO },
    now: () => NOW,
    partitions: 1,
  };
  helpdesk.seed(T1, { status: "open", tags: ["billing"] });
});

function keyOf(tool: string, agentId: string, entity: EntityRef, params: Record<string, unknown>, stepId = "s1"): string {
  const t = tools.get(tool)!;
  return intentKey({ tool: { name: t.name, keyScope: t.keyScope, intentFields: t.intentFields }, agentId, runId: "run-1", stepId, entity, params });
}

function wire(i: Partial<WriteIntent> & Pick<WriteIntent, "tool" | "entity" | "baseVersion" | "delta" | "params">, agentId = "agent-1"): WriteIntent {
  return {
    intentId: `intent-${++submissions}`,
    intentKey: i.intentKey ?? keyOf(i.tool, agentId, i.entity, i.params),
    agent: { id: agentId, runId: "run-1", stepId: "s1" },
    replyTo: REPLY_TO,
    createdAt: NOW.toISOString(),
    ...i,
  } as WriteIntent;
}

function createIntent(orderRef: string, agentId = "agent-1", subject = "Damaged on arrival", overrides: Partial<WriteIntent> = {}): WriteIntent {
  const params = { orderRef, subject };
  const entity = { type: "case", id: `order-${orderRef}` };
  return wire({ tool: "open_case", entity, baseVersion: ABSENT_VERSION, delta: [{ op: "add", path: "", value: { subject, status: "open", notes: [] } }], params, ...overrides }, agentId);
}

function tagIntent(tag: string, base: string, tags: string[]): WriteIntent {
  return wire({ tool: "tag_ticket", entity: T1, baseVersion: base, delta: [{ op: "replace", path: "/tags", value: [...tags, tag] }], params: { tag } });
}

function undoIntent(undone: string, overrides: Partial<WriteIntent> = {}): WriteIntent {
  return wire({
    tool: "tag_ticket",
    entity: T1,
    baseVersion: LEDGER_VERSION,
    delta: [],
    params: {},
    intentKey: undoIntentKey(undone),
    undo: { intentKey: undone },
    ...overrides,
  });
}

function message(intent: WriteIntent): KafkaMessage {
  return { key: Buffer.from(`${intent.entity.type}:${intent.entity.id}`), value: Buffer.from(JSON.stringify(intent)), timestamp: "0", attributes: 0, offset: "1", headers: {} } as KafkaMessage;
}

/** Admission, as the owner runs it: the admitted intent, or the reply admission answered with. */
async function admitted(intent: WriteIntent): Promise<AdmittedIntent | Reply> {
  const a = await admit(message(intent), { topic: "writ.intents", partition: 0, offset: "1" }, deps);
  if (a.kind === "admitted") return a.admitted;
  if (a.kind !== "answered") throw new Error(`unexpected admission ${a.kind}`);
  return a.effects.replies[0]!.value;
}

async function admittedOk(intent: WriteIntent): Promise<AdmittedIntent> {
  const a = await admitted(intent);
  if (!("tool" in a && "intent" in a)) throw new Error(`not admitted: ${JSON.stringify(a)}`);
  return a as AdmittedIntent;
}

function pipelineWith(extra: Partial<PipelineDeps> = {}): IntentPipeline {
  return new IntentPipeline({ config: { unknownRounds: 3 }, log, now: () => NOW, ...extra });
}

function commit(ledger: PartitionLedger, entry: LedgerIntentEntry | undefined): void {
  if (!entry) return;
  ledger.stage(entry);
  ledger.takeStaged();
  ledger.committedSending();
}

/** What the owner does with one admitted intent: classify, pending durable, execute, commit the result. */
async function run(p: IntentPipeline, a: AdmittedIntent, ledger: PartitionLedger): Promise<{ plan: Plan; step: Step; reply: Reply }> {
  const { plan, step } = await runPlan(p, a, ledger, ctx);
  const e = settled(step);
  for (const r of e.replies) Reply.parse(r.value);
  if (e.ledger) LedgerIntentEntry.parse(e.ledger);
  for (const x of e.escalations) Escalation.parse(x.value);
  commit(ledger, e.ledger);
  expect(e.replies).toHaveLength(1);
  return { plan, step, reply: e.replies[0]!.value };
}

function settled(step: Step): Effects {
  if (step.kind !== "settled") throw new Error(`expected a settled step, got ${JSON.stringify(step)}`);
  return step.effects;
}

describe("create by external id: admission", () => {
  it("admits the create its params give: entity id the external id, base version absent, the body at \"\"", async () => {
    const a = await admittedOk(createIntent("ORD-1"));
    expect(a.intent.entity).toEqual(CASE);
    expect(WriteIntent.safeParse(a.intent).success).toBe(true);
  });

  it("refuses a create whose entity is not the external id (external_id_mismatch), whose delta is not its body, or that read a version", async () => {
    expect(await admitted(createIntent("ORD-1", "agent-1", "x", { entity: { type: "case", id: "order-ORD-2" } }))).toMatchObject({ status: "rejected", reason: "external_id_mismatch" });
    expect(await admitted(createIntent("ORD-1", "agent-1", "x", { delta: [{ op: "add", path: "", value: { subject: "x", status: "closed", notes: [] } }] }))).toMatchObject({
      status: "rejected",
      reason: "delta_mismatch",
    });
    expect(await admitted(createIntent("ORD-1", "agent-1", "x", { baseVersion: '"v1"' }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
  });

  it("a reworded free-text param is the same create (the delta's fingerprint is the params')", async () => {
    const a = await admittedOk(createIntent("ORD-1", "agent-1", "Damaged"));
    const b = await admittedOk(createIntent("ORD-1", "agent-1", "The parcel arrived damaged"));
    expect(b.intent.intentKey).toBe(a.intent.intentKey);
    expect(b.deltaFingerprint).toBe(a.deltaFingerprint);
    expect(b.fingerprint).toBe(a.fingerprint);
  });
});

describe("create by external id: the pipeline", () => {
  it("creates once with If-None-Match: * and the intent key; a repeat gets the stored reply; another agent's create is a conflict carrying the record", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const first = await run(p, await admittedOk(createIntent("ORD-1", "agent-a")), ledger);
    expect(first.reply).toMatchObject({ status: "applied", via: "create", version: version(1), duplicate: false, tool: "open_case", state: { subject: "Damaged on arrival", status: "open" } });
    expect(helpdesk.creates).toEqual([{ entity: "case:order-ORD-1", state: { subject: "Damaged on arrival", status: "open", notes: [] }, ifNoneMatch: "*", idempotencyKey: first.reply.intentKey }]);

    const again = await run(p, await admittedOk(createIntent("ORD-1", "agent-a", "reworded by the model")), ledger);
    expect(again.reply).toMatchObject({ status: "applied", via: "create", duplicate: true, intentKey: first.reply.intentKey, version: version(1) });

    const other = await run(p, await admittedOk(createIntent("ORD-1", "agent-b", "Wrong size")), ledger);
    expect(other.reply).toMatchObject({
      status: "conflict",
      cycle: 1,
      duplicate: false,
      current: { state: { subject: "Damaged on arrival", status: "open", notes: [] }, version: version(1) },
      your_change: [{ op: "add", path: "", value: { subject: "Wrong size", status: "open", notes: [] } }],
    });
    expect((other.reply as { message: string }).message).toMatch(/already exists/);
    expect(other.reply.intentKey).not.toBe(first.reply.intentKey);
    // Two create requests reached the system, one created: the record is agent-a's, unchanged.
    expect(helpdesk.createCount(CASE)).toBe(2);
    expect(helpdesk.commitsOf(first.reply.intentKey)).toBe(1);
    expect(helpdesk.commitsOf(other.reply.intentKey)).toBe(0);
    expect(helpdesk.current(CASE)?.state).toMatchObject({ subject: "Damaged on arrival" });
    // A repeat of the conflicted create is the same conflict, with the record read again.
    const repeat = await run(p, await admittedOk(createIntent("ORD-1", "agent-b", "Wrong size")), ledger);
    expect(repeat.reply).toMatchObject({ status: "conflict", duplicate: true, cycle: 1 });
    expect(helpdesk.createCount(CASE)).toBe(2);
  });

  it("an unknown outcome after the create committed is reconciled by the intent key: applied, no second create", async () => {
    helpdesk.script.create.push({ kind: "commit-then-unknown" });
    const { reply } = await run(pipelineWith(), await admittedOk(createIntent("ORD-1")), new PartitionLedger(0));
    expect(reply).toMatchObject({ status: "applied", via: "reconcile", version: version(1) });
    expect(helpdesk.createCount(CASE)).toBe(1);
    expect(helpdesk.lookups).toEqual([reply.intentKey]);
  });

  it("an unknown outcome that did not commit: reconcile proves it, and the create is sent again (If-None-Match keeps it single)", async () => {
    helpdesk.script.create.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout before the system committed" } });
    const { reply } = await run(pipelineWith(), await admittedOk(createIntent("ORD-1")), new PartitionLedger(0));
    expect(reply).toMatchObject({ status: "applied", via: "create" });
    expect(helpdesk.createCount(CASE)).toBe(2);
    expect(helpdesk.commitsOf(reply.intentKey)).toBe(1);
  });

  it("intentKeyField: the record carries the intent key, and reconcile never takes another intent's record for its own", async () => {
    const lead = { type: "lead", id: "ann@example.com" };
    const make = (agentId: string, stepId: string) => {
      const params = { email: "ann@example.com" };
      const t = tools.get("open_lead")!;
      const key = intentKey({ tool: { name: t.name, keyScope: t.keyScope, intentFields: t.intentFields }, agentId, runId: "run-1", stepId, entity: lead, params });
      return { ...wire({ tool: "open_lead", entity: lead, baseVersion: ABSENT_VERSION, delta: [{ op: "add", path: "", value: { email: "ann@example.com", stage: "new" } }], params, intentKey: key }, agentId), agent: { id: agentId, runId: "run-1", stepId } } as WriteIntent;
    };
    // Ours is lost in flight (never committed) while another intent creates the lead: reconcile says not ours, the
    // create meets the record (412), and the answer is a conflict, not an "applied" for someone else's record.
    crm.script.create.push({ kind: "answer", outcome: { kind: "unknown", message: "connection reset" } });
    crm.script.create.push({ kind: "created-first", state: { email: "ann@example.com", stage: "new", writIntentKey: "someone-else" } });
    const ours = await run(pipelineWith(), await admittedOk(make("agent-1", "s1")), new PartitionLedger(0));
    expect(ours.reply).toMatchObject({ status: "conflict", current: { state: { writIntentKey: "someone-else" } } });

    // A create that committed and whose answer was lost is recognised by the key it wrote into the record.
    crm.delete(lead);
    crm.script.create.push({ kind: "commit-then-unknown" });
    const second = make("agent-2", "s2");
    const settledCreate = await run(pipelineWith(), await admittedOk(second), new PartitionLedger(0));
    expect(settledCreate.reply).toMatchObject({ status: "applied", via: "reconcile" });
    expect(crm.current(lead)?.state).toEqual({ email: "ann@example.com", stage: "new", writIntentKey: second.intentKey });
    expect(crm.creates.at(-1)?.state).toMatchObject({ writIntentKey: second.intentKey });
  });

  it("ablation: with the ledger ablated a repeat is not answered from the ledger; it reaches the system (and only If-None-Match stops it)", async () => {
    const p = pipelineWith({ ablateLedger: true });
    const ledger = new PartitionLedger(0);
    await run(p, await admittedOk(createIntent("ORD-1")), ledger);
    const again = await run(p, await admittedOk(createIntent("ORD-1")), ledger);
    expect(again.reply).toMatchObject({ status: "conflict" });
    expect(helpdesk.createCount(CASE)).toBe(2);
  });
});

describe("undo: admission", () => {
  it("refuses an undo of a tool without one, a key not derived from the undone key, params, a base version other than ledger, and an undo with a delta", async () => {
    const undone = "a".repeat(64);
    expect(await admitted(undoIntent(undone, { tool: "set_status" }))).toMatchObject({ status: "rejected", reason: "undo_not_declared" });
    expect(await admitted(undoIntent(undone, { intentKey: "b".repeat(64) }))).toMatchObject({ status: "rejected", reason: "intent_key_mismatch" });
    expect(await admitted(undoIntent(undone, { params: { tag: "vip" } }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    expect(await admitted(undoIntent(undone, { baseVersion: '"1"' }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    // An empty delta only goes with `undo`, and `undo` only with an empty delta: the schema says so.
    expect(await admitted(undoIntent(undone, { delta: [{ op: "replace", path: "/tags", value: [] }] }))).toMatchObject({ status: "rejected", reason: "schema_invalid" });
    expect(await admitted({ ...tagIntent("vip", version(1), ["billing"]), delta: [] })).toMatchObject({ status: "rejected", reason: "schema_invalid" });
  });
});

describe("undo: the pipeline", () => {
  async function tagged(p: IntentPipeline, ledger: PartitionLedger): Promise<Reply> {
    const { reply } = await run(p, await admittedOk(tagIntent("vip", version(1), ["billing"])), ledger);
    expect(reply).toMatchObject({ status: "applied", version: version(2) });
    return reply;
  }

  it("applies the compensating change once, If-Match the version the write produced, keyed by the undo's key; a repeat is a duplicate", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    // The ledger kept what the undo needs: the params, and the version in the outcome.
    expect(ledger.get(write.intentKey)).toMatchObject({ params: { tag: "vip" }, outcome: { status: "applied", version: version(2) } });

    const first = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(first.reply).toMatchObject({ status: "applied", via: "patch", version: version(3), state: { tags: ["billing"] }, undoOf: write.intentKey, intentKey: undoIntentKey(write.intentKey) });
    expect(helpdesk.patches.at(-1)).toMatchObject({ ifMatch: version(2), idempotencyKey: undoIntentKey(write.intentKey), ops: [{ op: "replace", path: "/tags", value: ["billing"] }] });
    expect(ledger.get(undoIntentKey(write.intentKey))).toMatchObject({ status: "done", undoOf: write.intentKey });

    const again = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(again.reply).toMatchObject({ status: "applied", duplicate: true, version: version(3), undoOf: write.intentKey });
    expect(helpdesk.commitsOf(undoIntentKey(write.intentKey))).toBe(1);
    expect(helpdesk.patches).toHaveLength(2);
  });

  it("a repeat of a write an applied undo compensated is answered applied with undoneBy (the undo's key), nothing written; before the undo, without it", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    // Before any undo: a plain repeat.
    const before = await run(p, await admittedOk(tagIntent("vip", version(2), ["billing"])), ledger);
    expect(before.reply).toMatchObject({ status: "applied", duplicate: true });
    expect(before.reply).not.toHaveProperty("undoneBy");
    await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    // A client that does not remember the change sends the step again, on the version the undo left.
    const again = await run(p, await admittedOk(tagIntent("vip", version(3), ["billing"])), ledger);
    expect(again.reply).toMatchObject({ status: "applied", duplicate: true, intentKey: write.intentKey, undoneBy: undoIntentKey(write.intentKey) });
    expect(helpdesk.commitsOf(write.intentKey)).toBe(1);
    expect(helpdesk.patches).toHaveLength(2);
    // The undo's own repeat says what it undid, not undoneBy.
    const undoAgain = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(undoAgain.reply).toMatchObject({ status: "applied", duplicate: true, undoOf: write.intentKey });
    expect(undoAgain.reply).not.toHaveProperty("undoneBy");
  });

  it("after a newer change: a conflict carrying the current state, nothing written; asked again, the same conflict", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    helpdesk.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
    const { reply } = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(reply).toMatchObject({
      status: "conflict",
      cycle: 1,
      current: { state: { status: "pending", tags: ["billing", "vip"] }, version: version(3) },
      your_change: [{ op: "replace", path: "/tags", value: ["billing"] }],
    });
    expect(helpdesk.patches).toHaveLength(1);
    const again = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(again.reply).toMatchObject({ status: "conflict", duplicate: true, current: { version: version(3) } });
    expect(helpdesk.patches).toHaveLength(1);
  });

  // Regression: the conflict reply of an undo carried the tool's compensating change on the record as it is now,
  // built from a state of any size (this tool's undo copies the tags), and trimming only left the state out. A 3 MB
  // record made a 3 MB reply: the broker refused it, and the partition's transaction failed on every try.
  it("after a newer change that made the record large: the undo's change on it is over maxIntentBytes, so it is answered undo_failed with its size; nothing written, and the reply fits the broker", async () => {
    const maxIntentBytes = 4096;
    const p = pipelineWith({ config: { unknownRounds: 3, maxIntentBytes } });
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    const many = Array.from({ length: 200 }, (_, i) => `tag-${String(i).padStart(60, "0")}`);
    helpdesk.change(T1, [{ op: "replace", path: "/tags", value: ["billing", "vip", ...many] }]);

    const { reply } = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);

    expect(reply).toMatchObject({ status: "rejected", reason: "undo_failed", details: { version: version(3), maxBytes: maxIntentBytes } });
    const details = (reply as { details: { changeBytes: number } }).details;
    expect(details.changeBytes).toBeGreaterThan(maxIntentBytes);
    expect((reply as { message: string }).message).toMatch(/nothing was undone.*over the 4096 a change may take \(WRIT_MAX_INTENT_BYTES\)/);
    expect(ledger.get(undoIntentKey(write.intentKey))).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "undo_failed" } });
    expect(helpdesk.patches).toHaveLength(1);
    // Encoded for a broker that takes 16 kB, as it is: no state to leave out, nothing cut.
    const [record] = await new RecordEncoder(new WireCodec({}), { maxMessageBytes: 16_384, topics: { intents: "i", ledger: "l", human: "h", dlq: "d" } }).encode(
      { replies: [{ topic: REPLY_TO, value: reply }], escalations: [], deadLetters: [], forwards: [] },
      0,
      { message: message(undoIntent(write.intentKey)), source: { topic: "writ.intents", partition: 0, offset: "1" } },
    );
    expect(record!.value!.length).toBeLessThan(16_384);
    expect(JSON.parse(record!.value!.toString("utf8"))).toEqual(reply);
  });

  it("a conflicted undo asked again after the record grew large: undo_failed with its size, no state carried, nothing written", async () => {
    const p = pipelineWith({ config: { unknownRounds: 3, maxIntentBytes: 4096 } });
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    helpdesk.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
    expect((await run(p, await admittedOk(undoIntent(write.intentKey)), ledger)).reply).toMatchObject({ status: "conflict", your_change: [{ op: "replace", path: "/tags", value: ["billing"] }] });
    const many = Array.from({ length: 200 }, (_, i) => `tag-${String(i).padStart(60, "0")}`);
    helpdesk.change(T1, [{ op: "replace", path: "/tags", value: ["billing", "vip", ...many] }]);

    const again = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);

    expect(again.plan.kind).toBe("repeat-conflict");
    expect(again.reply).toMatchObject({ status: "rejected", reason: "undo_failed", details: { version: version(4), maxBytes: 4096 } });
    expect(again.reply).not.toHaveProperty("details.current");
    expect(helpdesk.patches).toHaveLength(1);
  });

  it("an undo whose answer was lost after it committed is reconciled (by the undo's key), never sent twice", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    helpdesk.script.patch.push({ kind: "commit-then-unknown" });
    const { reply } = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(reply).toMatchObject({ status: "applied", via: "reconcile", version: version(3) });
    expect(helpdesk.patches).toHaveLength(2);
  });

  it("an undo of nothing undoable is rejected with a reason, and no ledger entry is written for it", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const unknown = await run(p, await admittedOk(undoIntent("c".repeat(64))), ledger);
    expect(unknown.reply).toMatchObject({ status: "rejected", reason: "undo_target_unknown" });
    expect(settled(unknown.step).ledger).toBeUndefined();

    // A write that met a changed record (conflict) was never applied.
    const stale = await run(p, await admittedOk(tagIntent("urgent", version(0), ["billing"])), ledger);
    expect(stale.reply).toMatchObject({ status: "conflict" });
    const notApplied = await run(p, await admittedOk(undoIntent(stale.reply.intentKey)), ledger);
    expect(notApplied.reply).toMatchObject({ status: "rejected", reason: "undo_target_not_applied", details: { status: "conflict" } });

    // An undo is not undone.
    const write = await tagged(p, ledger);
    const undo = await run(p, await admittedOk(undoIntent(write.intentKey)), ledger);
    expect(undo.reply).toMatchObject({ status: "applied" });
    const undoOfUndo = await run(p, await admittedOk(undoIntent(undo.reply.intentKey)), ledger);
    expect(undoOfUndo.reply).toMatchObject({ status: "rejected", reason: "undo_not_declared" });
    expect(helpdesk.patches.filter((x) => x.idempotencyKey === undoIntentKey(undo.reply.intentKey))).toHaveLength(0);
  });

  it("an undo naming another record than the undone write's is refused (undo_target_mismatch)", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await tagged(p, ledger);
    const other = { type: "ticket", id: "T-2" };
    helpdesk.seed(other, { status: "open", tags: [] });
    // Partition 0 holds both records' ledgers here: the entry is found, and it is not T-2's.
    const { reply } = await run(p, await admittedOk(undoIntent(write.intentKey, { entity: other })), ledger);
    expect(reply).toMatchObject({ status: "rejected", reason: "undo_target_mismatch" });
  });

  it("an undo function that fails is undo_failed, nothing written", async () => {
    const failing = declareWriteTool({ ...tagTicket, name: "tag_failing", undo: () => [] as JsonPatchOp[] });
    tools = admitTools([openCase, openLead, tagTicket, setStatus, failing], [helpdesk, crm], { sorTimeoutMs: 1_000 });
    deps = { ...deps, tools };
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const write = await run(p, await admittedOk({ ...tagIntent("vip", version(1), ["billing"]), tool: "tag_failing", intentKey: keyOf("tag_failing", "agent-1", T1, { tag: "vip" }) }), ledger);
    expect(write.reply).toMatchObject({ status: "applied" });
    const { reply } = await run(p, await admittedOk(undoIntent(write.reply.intentKey, { tool: "tag_failing" })), ledger);
    expect(reply).toMatchObject({ status: "rejected", reason: "undo_failed" });
    expect(helpdesk.patches).toHaveLength(1);
  });

  it("an undo whose compensating change leaves the tool's scope (a path, an operation) is undo_failed with the scope's reason, nothing written", async () => {
    const cases: [string, (p: Record<string, unknown>, applied: Versioned) => JsonPatchOp[], unknown][] = [
      // Built from the record as the write left it, the change can reach any path: here one the tool may not touch.
      ["tag_reaching", (p, applied) => [{ op: "replace", path: "/tags", value: (applied.state as { tags: string[] }).tags.filter((t) => t !== p.tag) }, { op: "replace", path: "/status", value: "open" }], { reason: "patch_path_not_allowed", paths: ["/status"] }],
      ["tag_removing", () => [{ op: "remove", path: "/tags" }], { reason: "patch_op_not_allowed", ops: ["remove /tags"] }],
    ];
    const wide = cases.map(([name, undo]) => declareWriteTool({ ...tagTicket, name, undo }));
    tools = admitTools([openCase, openLead, tagTicket, setStatus, ...wide], [helpdesk, crm], { sorTimeoutMs: 1_000 });
    deps = { ...deps, tools };
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    let tags = ["billing"];
    for (const [name, , details] of cases) {
      const before = helpdesk.patches.length;
      const current = await helpdesk.read(T1, { timeoutMs: 1_000 });
      const write = await run(p, await admittedOk({ ...tagIntent(name, current!.version, tags), tool: name, intentKey: keyOf(name, "agent-1", T1, { tag: name }) }), ledger);
      expect(write.reply).toMatchObject({ status: "applied" });
      tags = [...tags, name];
      const { reply } = await run(p, await admittedOk(undoIntent(write.reply.intentKey, { tool: name })), ledger);
      expect(reply, name).toMatchObject({ status: "rejected", reason: "undo_failed", details });
      expect((reply as { message: string }).message).toMatch(/^the tool's undo gave a change outside its undo paths: tool tag_/);
      // The write's PATCH only: the undo's never left.
      expect(helpdesk.patches).toHaveLength(before + 1);
      expect(helpdesk.commitsOf(undoIntentKey(write.reply.intentKey))).toBe(0);
    }
  });
});

describe("undoPaths: the scope of an undo apart from its tool's", () => {
  it("an undo is held to its tool's undoPaths, not its allowedPaths; an agent's change may not write an undo path", async () => {
    // The undo records what it took back under /untagged, a path no agent's tag may write.
    const recording = declareWriteTool({
      ...tagTicket,
      name: "tag_recording",
      undoPaths: ["/tags", "/untagged"],
      undo: (p, applied) => [
        { op: "replace", path: "/tags", value: (applied.state as { tags: string[] }).tags.filter((t) => t !== p.tag) },
        { op: "add", path: "/untagged", value: p.tag },
      ],
    });
    // Its undo may not write /tags, though the tool may.
    const narrow = declareWriteTool({ ...tagTicket, name: "tag_narrow", undoPaths: ["/untagged"] });
    tools = admitTools([openCase, openLead, tagTicket, setStatus, recording, narrow], [helpdesk, crm], { sorTimeoutMs: 1_000 });
    deps = { ...deps, tools };
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const tagged = async (name: string, tags: string[]) => {
      const current = await helpdesk.read(T1, { timeoutMs: 1_000 });
      const write = await run(p, await admittedOk({ ...tagIntent(name, current!.version, tags), tool: name, intentKey: keyOf(name, "agent-1", T1, { tag: name }) }), ledger);
      expect(write.reply, name).toMatchObject({ status: "applied" });
      return write.reply.intentKey;
    };

    const recorded = await tagged("tag_recording", ["billing"]);
    const undone = await run(p, await admittedOk(undoIntent(recorded, { tool: "tag_recording" })), ledger);
    expect(undone.reply).toMatchObject({ status: "applied", undoOf: recorded });
    expect(helpdesk.commitsOf(undoIntentKey(recorded))).toBe(1);
    expect((await helpdesk.read(T1, { timeoutMs: 1_000 }))!.state).toMatchObject({ tags: ["billing"], untagged: "tag_recording" });

    const narrowed = await tagged("tag_narrow", ["billing"]);
    const refused = await run(p, await admittedOk(undoIntent(narrowed, { tool: "tag_narrow" })), ledger);
    expect(refused.reply).toMatchObject({ status: "rejected", reason: "undo_failed", details: { reason: "patch_path_not_allowed", paths: ["/tags"] } });
    expect(helpdesk.commitsOf(undoIntentKey(narrowed))).toBe(0);

    // An agent's own change to the undo's path is refused at admission, as any path outside allowedPaths.
    const current = await helpdesk.read(T1, { timeoutMs: 1_000 });
    const reaching = await admitted({
      ...tagIntent("x", current!.version, []),
      tool: "tag_recording",
      intentKey: keyOf("tag_recording", "agent-1", T1, { tag: "x" }),
      delta: [{ op: "add", path: "/untagged", value: "billing" }],
    });
    expect(reaching).toMatchObject({ status: "rejected", reason: "patch_path_not_allowed" });
  });

  it("a create tool that declares undoPaths holds its undo to them", async () => {
    const reaching = declareWriteTool({
      ...openCase,
      name: "open_case_scoped",
      undoPaths: ["/status"],
      undo: () => [
        { op: "replace", path: "/status", value: "withdrawn" },
        { op: "replace", path: "/subject", value: "(withdrawn)" },
      ],
    });
    tools = admitTools([openCase, openLead, tagTicket, setStatus, reaching], [helpdesk, crm], { sorTimeoutMs: 1_000 });
    deps = { ...deps, tools };
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const entity = { type: "case", id: "order-78" };
    const created = await run(p, await admittedOk(createIntent("78", "agent-1", "Late", { tool: "open_case_scoped", intentKey: keyOf("open_case_scoped", "agent-1", entity, { orderRef: "78", subject: "Late" }) })), ledger);
    expect(created.reply).toMatchObject({ status: "applied" });
    const { reply } = await run(p, await admittedOk(undoIntent(created.reply.intentKey, { tool: "open_case_scoped", entity })), ledger);
    expect(reply).toMatchObject({ status: "rejected", reason: "undo_failed", details: { reason: "patch_path_not_allowed", paths: ["/subject"] } });
    expect(helpdesk.commitsOf(undoIntentKey(created.reply.intentKey))).toBe(0);
  });
});

describe("undo of a create", () => {
  it("a create tool's undo (it declares no allowedPaths) is applied on the record it created, If-Match the version the create produced", async () => {
    const closing = declareWriteTool({ ...openCase, name: "open_case_undoable", undo: () => [{ op: "replace", path: "/status", value: "withdrawn" }] });
    tools = admitTools([openCase, openLead, tagTicket, setStatus, closing], [helpdesk, crm], { sorTimeoutMs: 1_000 });
    deps = { ...deps, tools };
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const entity = { type: "case", id: "order-77" };
    const created = await run(p, await admittedOk(createIntent("77", "agent-1", "Damaged on arrival", { tool: "open_case_undoable", intentKey: keyOf("open_case_undoable", "agent-1", entity, { orderRef: "77", subject: "Damaged on arrival" }) })), ledger);
    expect(created.reply).toMatchObject({ status: "applied" });
    const { reply } = await run(p, await admittedOk(undoIntent(created.reply.intentKey, { tool: "open_case_undoable", entity })), ledger);
    expect(reply).toMatchObject({ status: "applied", undoOf: created.reply.intentKey });
    expect(helpdesk.commitsOf(undoIntentKey(created.reply.intentKey))).toBe(1);
    expect((await helpdesk.read(entity, { timeoutMs: 1_000 }))!.state).toMatchObject({ status: "withdrawn" });
  });
});

describe("escalated creates and undos", () => {
  /** The ledger entry of `a`, escalated (its outcome unknown), as the owner leaves it. */
  function escalated(a: AdmittedIntent): PartitionLedger {
    const entry: LedgerIntentEntry = {
      kind: "intent",
      intentKey: a.intent.intentKey,
      intentId: a.intent.intentId,
      status: "done",
      entity: a.intent.entity,
      tool: a.tool.name,
      fingerprint: a.fingerprint,
      attempts: [{ baseVersion: a.intent.baseVersion, deltaFingerprint: a.deltaFingerprint }],
      cycles: 0,
      replyTo: REPLY_TO,
      updatedAt: NOW.toISOString(),
      outcome: { status: "escalated", reason: "outcome_unknown", message: "unknown", escalationId: "esc-1", at: NOW.toISOString() },
    };
    return new PartitionLedger(0, [[entry.intentKey, entry]]);
  }
  const resolution = (a: AdmittedIntent, decision: Resolution["decision"]): Resolution => ({
    kind: "resolution",
    resolutionId: `res-${decision}`,
    escalationId: "esc-1",
    intent: a.intent,
    decision,
    ...(decision === "apply" ? { baseVersion: version(1) } : {}),
    operator: { id: "ops" },
    replyTo: "writ.replies.ops",
    entity: a.intent.entity,
    createdAt: NOW.toISOString(),
  });

  it("an operator may discard or return an escalated create or undo, not apply it (it is not a delta to rebase)", async () => {
    const resolver = new Resolver({ now: () => NOW });
    for (const a of [await admittedOk(createIntent("ORD-1")), await admittedOk(undoIntent("d".repeat(64)))]) {
      const ledger = escalated(a);
      const apply = resolver.plan(resolution(a, "apply"), a.tool, "writ.replies.ops", ledger);
      expect(apply.kind).toBe("settled");
      if (apply.kind !== "settled") continue;
      expect(apply.effects.replies[0]!.value).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
      expect(apply.effects.ledger).toBeUndefined();
      const discard = resolver.plan(resolution(a, "discard"), a.tool, "writ.replies.ops", ledger);
      expect(discard.kind).toBe("settled");
      if (discard.kind !== "settled") continue;
      expect(discard.effects.replies.map((r) => r.value)).toMatchObject([
        { status: "rejected", reason: "escalation_discarded" },
        { status: "rejected", reason: "escalation_discarded" },
      ]);
      expect(discard.effects.ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "escalation_discarded" } });
    }
  });
});

describe("leases of changes that span records: admission", () => {
  const change = "c".repeat(64);
  const lease = (op: "acquire" | "release", overrides: Partial<WriteIntent> = {}): WriteIntent =>
    wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(change, op, T1), lease: { change, op, ...(op === "acquire" ? { ttlMs: 30_000 } : {}) }, ...overrides });

  it("admits an acquire and a release keyed leaseIntentKey(change, op, entity), with no params, no delta and base version lease", async () => {
    expect((await admittedOk(lease("acquire"))).intent.lease).toEqual({ change, op: "acquire", ttlMs: 30_000 });
    expect((await admittedOk(lease("release"))).intent.lease).toEqual({ change, op: "release" });
  });

  it("refuses a lease intent with another key, params, another base version, a ttl on a release, an undo, or a delta", async () => {
    expect(await admitted(lease("acquire", { intentKey: leaseIntentKey(change, "release", T1) }))).toMatchObject({ status: "rejected", reason: "intent_key_mismatch" });
    expect(await admitted(lease("acquire", { intentKey: leaseIntentKey("d".repeat(64), "acquire", T1) }))).toMatchObject({ status: "rejected", reason: "intent_key_mismatch" });
    expect(await admitted(lease("acquire", { params: { tag: "vip" } }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    expect(await admitted(lease("acquire", { baseVersion: version(1) }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    expect(await admitted(lease("release", { lease: { change, op: "release", ttlMs: 5000 } }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    expect(await admitted(lease("acquire", { undo: { intentKey: "a".repeat(64) } }))).toMatchObject({ status: "rejected", reason: "params_invalid" });
    expect(await admitted(lease("acquire", { delta: [{ op: "replace", path: "/tags", value: [] }] }))).toMatchObject({ status: "rejected", reason: "schema_invalid" });
    // A step is a write like any other: it needs its delta.
    expect(await admitted({ ...tagIntent("vip", version(1), ["billing"]), delta: [], lease: { change, op: "step" } })).toMatchObject({ status: "rejected", reason: "schema_invalid" });
    expect(await admitted(lease("acquire", { lease: { change, op: "acquire", ttlMs: 999 } }))).toMatchObject({ status: "rejected", reason: "schema_invalid" });
  });
});

describe("leases of changes that span records: the owner's gate", () => {
  const mine = "c".repeat(64);
  const other = "e".repeat(64);
  const held = (change: string, agentId = "agent-1", expiresAt = new Date(NOW.getTime() + 60_000)): LedgerLeaseEntry => ({
    kind: "lease",
    entity: T1,
    change,
    agentId,
    replyTo: REPLY_TO,
    acquiredAt: NOW.toISOString(),
    expiresAt: expiresAt.toISOString(),
    updatedAt: NOW.toISOString(),
  });
  const ledgerWith = (entry?: LedgerLeaseEntry) => new PartitionLedger(0, entry ? [[`__lease__:${entityKey(T1)}`, entry]] : []);
  const step = async (change = mine) => admittedOk({ ...tagIntent("vip", version(1), ["billing"]), lease: { change, op: "step" } });
  const acquire = async (change = mine, ttlMs = 30_000) =>
    admittedOk(wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(change, "acquire", T1), lease: { change, op: "acquire", ttlMs } }));
  const release = async (change = mine) =>
    admittedOk(wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(change, "release", T1), lease: { change, op: "release" } }));
  const at = NOW.getTime();

  it("free, mine, held by another change, held by the same change id for another agent, expired", async () => {
    const a = await step();
    expect(leaseGate(ledgerWith(), a, at)).toEqual({ kind: "free" });
    expect(leaseGate(ledgerWith(held(mine)), a, at)).toMatchObject({ kind: "mine" });
    expect(leaseGate(ledgerWith(held(other)), a, at)).toMatchObject({ kind: "held" });
    expect(leaseGate(ledgerWith(held(mine, "agent-2")), a, at)).toMatchObject({ kind: "held" });
    expect(leaseGate(ledgerWith(held(other, "agent-1", new Date(at - 1))), a, at)).toMatchObject({ kind: "free", expired: { change: other } });
  });

  it("another change's lease answers a write `leased` (with its expiry); a step without its lease `lease_not_held`; its own lease lets it through", async () => {
    const plain = await admittedOk(tagIntent("vip", version(1), ["billing"]));
    const refusal = (a: AdmittedIntent, gate: LeaseGate) => leaseRefusal(a, gate, NOW.toISOString())?.replies[0]?.value;
    expect(refusal(plain, leaseGate(ledgerWith(held(other)), plain, at))).toMatchObject({ status: "rejected", reason: "leased", details: { expiresAt: held(other).expiresAt } });
    expect(refusal(plain, leaseGate(ledgerWith(), plain, at))).toBeUndefined();
    const s = await step();
    expect(refusal(s, leaseGate(ledgerWith(), s, at))).toMatchObject({ status: "rejected", reason: "lease_not_held" });
    expect(refusal(s, leaseGate(ledgerWith(held(mine, "agent-1", new Date(at - 1))), s, at))).toMatchObject({ reason: "lease_not_held", message: expect.stringContaining("expired") });
    expect(refusal(s, leaseGate(ledgerWith(held(mine)), s, at))).toBeUndefined();
  });

  it("an acquire whose read answers a version writ cannot keep (a custom adapter's, 10,000 characters) is rejected sor_protocol, no lease staged", async () => {
    const read = helpdesk.read.bind(helpdesk);
    helpdesk.read = async (entity, opts) => {
      const r = await read(entity, opts);
      return r && { ...r, version: "v".repeat(10_000) };
    };
    const a = await acquire(mine, 30_000);
    const refused = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {}));
    expect(refused.replies[0]!.value).toMatchObject({ status: "rejected", reason: "sor_protocol", message: expect.stringContaining("a version of 10000 characters") });
    Reply.parse(refused.replies[0]!.value);
    expect(refused.lease).toBeUndefined();
  });

  it("an acquire reads the record and grants the lease until now + ttl; a repeat renews it; another change's is refused `leased`, nothing staged", async () => {
    const a = await acquire(mine, 30_000);
    const granted = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {}));
    expect(granted.replies[0]!.value).toMatchObject({ status: "applied", via: "lease", state: { status: "open", tags: ["billing"] }, version: version(1), lease: { change: mine, expiresAt: "2025-06-01T12:00:30.000Z" } });
    Reply.parse(granted.replies[0]!.value);
    expect(granted.lease).toMatchObject({ entityKey: "ticket:T-1", entry: { kind: "lease", change: mine, agentId: "agent-1", expiresAt: "2025-06-01T12:00:30.000Z" } });
    LedgerEntry.parse(granted.lease!.entry);
    expect(helpdesk.patchCount(T1)).toBe(0);
    const later = new Date(at + 10_000);
    const renewed = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(granted.lease!.entry!), a, later.getTime()), later, {}));
    expect(renewed.lease!.entry).toMatchObject({ acquiredAt: NOW.toISOString(), expiresAt: "2025-06-01T12:00:40.000Z" });
    const b = await acquire(other);
    const refused = settled(await settleLeaseIntent(b, leaseGate(ledgerWith(granted.lease!.entry!), b, at), NOW, {}));
    expect(refused.replies[0]!.value).toMatchObject({ status: "rejected", reason: "leased" });
    expect(refused.lease).toBeUndefined();
  });

  it("an acquire of a missing record is entity_not_found; an outage of the system pauses it (retry-later)", async () => {
    const a = await acquire();
    helpdesk.script.read.push({ kind: "throw", error: outage() });
    expect(await settleLeaseIntent(a, { kind: "free" }, NOW, {})).toMatchObject({ kind: "retry-later" });
    helpdesk.delete(T1);
    expect(settled(await settleLeaseIntent(a, { kind: "free" }, NOW, {})).replies[0]!.value).toMatchObject({ status: "rejected", reason: "entity_not_found" });
  });

  it("a release of its own lease frees the record, marking the change's earlier acquires; a release of a lease it does not hold is answered as a repeat", async () => {
    const r = await release();
    const released = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(held(mine)), r, at), NOW, {}));
    expect(released.lease).toEqual({
      entityKey: "ticket:T-1",
      entry: expect.objectContaining({ releasedAt: NOW.toISOString(), expiresAt: NOW.toISOString(), released: [{ change: mine, agentId: "agent-1", before: NOW.toISOString(), until: "2025-06-01T12:15:00.000Z" }] }),
    });
    LedgerEntry.parse(released.lease!.entry);
    expect(released.replies[0]!.value).toMatchObject({ status: "applied", via: "lease", duplicate: false, lease: { change: mine, released: true } });
    const freed = ledgerWith(released.lease!.entry!);
    expect(freed.leaseCount).toBe(0);
    expect(leaseGate(freed, r, at)).toMatchObject({ kind: "free", released: { change: mine } });
    const again = settled(await settleLeaseIntent(r, leaseGate(freed, r, at), NOW, {}));
    expect(again.lease).toBeUndefined();
    expect(again.replies[0]!.value).toMatchObject({ status: "applied", duplicate: true });
    // Another agent's write is not held up by a released lease.
    const plain = await admittedOk(tagIntent("vip", version(1), ["billing"]));
    expect(leaseRefusal(plain, leaseGate(freed, plain, at), NOW.toISOString())).toBeNull();
  });

  it("replay: an acquire made before its change's release is refused `lease_replayed`, nothing taken, also after another change held the record; a new acquire is granted", async () => {
    const a = await acquire(mine);
    const granted = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {}));
    const later = new Date(at + 5_000);
    const r = await release();
    r.intent.createdAt = later.toISOString();
    const released = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(granted.lease!.entry!), r, later.getTime()), later, {})).lease!.entry!;
    // The acquire's bytes again, a minute on: refused, and no lease staged.
    const replayAt = new Date(at + 60_000);
    const replay = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(released), a, replayAt.getTime()), replayAt, {}));
    expect(replay.replies[0]!.value).toMatchObject({ status: "rejected", reason: "lease_replayed", intentId: a.intent.intentId });
    expect(replay.lease).toBeUndefined();
    // Another change takes the record and gives it back: the mark is kept across both.
    const b = await acquire(other);
    const bGranted = settled(await settleLeaseIntent(b, leaseGate(ledgerWith(released), b, replayAt.getTime()), replayAt, {})).lease!.entry!;
    expect(bGranted.released).toEqual(released.released);
    const rb = await release(other);
    const bReleased = settled(await settleLeaseIntent(rb, leaseGate(ledgerWith(bGranted), rb, replayAt.getTime()), replayAt, {})).lease!.entry!;
    expect(bReleased.released!.map((m) => m.change)).toEqual([mine, other]);
    expect(settled(await settleLeaseIntent(a, leaseGate(ledgerWith(bReleased), a, replayAt.getTime()), replayAt, {})).replies[0]!.value).toMatchObject({ reason: "lease_replayed" });
    // The same change acquiring anew (created after its release): granted.
    const anew = await acquire(mine);
    anew.intent.createdAt = replayAt.toISOString();
    const regranted = settled(await settleLeaseIntent(anew, leaseGate(ledgerWith(bReleased), anew, replayAt.getTime()), replayAt, {}));
    expect(regranted.replies[0]!.value).toMatchObject({ status: "applied", via: "lease" });
    expect(regranted.lease!.entry).toMatchObject({ change: mine });
    expect(regranted.lease!.entry!.releasedAt).toBeUndefined();
  });

  it("a released entry stays until its marks are past (admission refuses the acquires `stale` from then), then the sweep takes it", () => {
    const released: LedgerLeaseEntry = { ...held(mine), expiresAt: NOW.toISOString(), releasedAt: NOW.toISOString(), released: [{ change: mine, agentId: "agent-1", before: NOW.toISOString(), until: "2025-06-01T12:15:00.000Z" }] };
    const ledger = ledgerWith(released);
    expect(ledger.expiredLeases(at + 60_000, 10)).toEqual([]);
    expect(ledger.expiredLeases(Date.parse("2025-06-01T12:15:00.001Z"), 10)).toEqual([released]);
  });

  it("lapse: a lease that lapsed keeps a mark for its change up to its latest acquire, and the marks it carried; replays are refused `lease_replayed`, a new acquire granted", async () => {
    // The record was another change's before: released, its mark carried by the leases that follow.
    const b = await acquire(other);
    const rb = await release(other);
    const bHeld = settled(await settleLeaseIntent(b, leaseGate(ledgerWith(), b, at), NOW, {})).lease!.entry!;
    const bReleased = settled(await settleLeaseIntent(rb, leaseGate(ledgerWith(bHeld), rb, at), NOW, {})).lease!.entry!;
    const a = await acquire(mine, 30_000);
    const held1 = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(bReleased), a, at), NOW, {})).lease!.entry!;
    expect(held1).toMatchObject({ lastAcquireCreatedAt: NOW.toISOString(), released: bReleased.released });
    // Renewed by a later acquire; the first one's bytes again (while held) renew it but move the latest back not.
    const renewal = await acquire(mine, 30_000);
    renewal.intent.createdAt = new Date(at + 10_000).toISOString();
    const held2 = settled(await settleLeaseIntent(renewal, leaseGate(ledgerWith(held1), renewal, at + 10_000), new Date(at + 10_000), {})).lease!.entry!;
    const held3 = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(held2), a, at + 11_000), new Date(at + 11_000), {})).lease!.entry!;
    expect(held3.lastAcquireCreatedAt).toBe(renewal.intent.createdAt);

    // Its time to live runs out (at + 41 s) with no release: the next intent of the record finds it lapsed.
    const lapseAt = at + 60_000;
    const plain = await admittedOk(tagIntent("vip", version(1), ["billing"]));
    const gate = leaseGate(ledgerWith(held3), plain, lapseAt);
    expect(gate).toMatchObject({ kind: "free", expired: { change: mine } });
    const lapsed = (gate as { released: LedgerLeaseEntry }).released;
    LedgerEntry.parse(lapsed);
    // Ended at its own expiry (what the cool-down after it counts from), found lapsed later.
    expect(lapsed).toMatchObject({ releasedAt: held3.expiresAt, expiresAt: new Date(lapseAt).toISOString() });
    expect(lapsed.released).toEqual([...bReleased.released!, { change: mine, agentId: "agent-1", before: renewal.intent.createdAt, until: "2025-06-01T12:15:10.000Z" }]);
    expect(leaseRefusal(plain, gate, NOW.toISOString())).toBeNull();
    expect(ledgerWith(lapsed).leaseCount).toBe(0);

    // Every acquire of the lapsed lease, replayed: refused, nothing taken; the other change's too (its mark was carried).
    const replayAt = new Date(lapseAt + 1_000);
    for (const replayed of [a, renewal, b]) {
      const answer = settled(await settleLeaseIntent(replayed, leaseGate(ledgerWith(lapsed), replayed, replayAt.getTime()), replayAt, {}));
      expect(answer.replies[0]!.value).toMatchObject({ status: "rejected", reason: "lease_replayed", intentId: replayed.intent.intentId });
      expect(answer.lease).toBeUndefined();
    }
    // The change acquiring anew, after its lease lapsed: granted, the marks kept.
    const anew = await acquire(mine);
    anew.intent.createdAt = replayAt.toISOString();
    const regranted = settled(await settleLeaseIntent(anew, leaseGate(ledgerWith(lapsed), anew, replayAt.getTime()), replayAt, {}));
    expect(regranted.replies[0]!.value).toMatchObject({ status: "applied", via: "lease" });
    expect(regranted.lease!.entry!.released).toEqual(lapsed.released);

    // The sweep: the lapsed entry stays until its last mark is past, then goes (a tombstone, nothing to keep).
    expect(ledgerWith(lapsed).expiredLeases(Date.parse("2025-06-01T12:15:10.000Z"), 10)).toEqual([]);
    expect(ledgerWith(lapsed).expiredLeases(Date.parse("2025-06-01T12:15:10.001Z"), 10)).toEqual([lapsed]);
    expect(lapsedLease(lapsed, Date.parse("2025-06-01T12:15:10.001Z"))).toBeNull();
    // Found lapsed by the sweep instead: the same entry; found after its marks are past, a tombstone.
    expect(lapsedLease(held3, lapseAt)).toEqual(lapsed);
    expect(lapsedLease(held3, Date.parse("2025-06-01T12:15:10.001Z"))).toBeNull();
    // An entry of an owner before lastAcquireCreatedAt: its lapse is marked at its last grant (updatedAt).
    const { lastAcquireCreatedAt: _, ...older } = held3;
    expect(lapsedLease(older, lapseAt)!.released!.at(-1)).toMatchObject({ change: mine, before: held3.updatedAt });
  });

  it("a replay admitted just before its mark's `until` and run at it or after is refused (after: `stale`, its own deadline past), never granted", async () => {
    // Acquired and released within the same millisecond: the mark's `until` is the acquire's own deadline.
    const a = await acquire(mine);
    const r = await release();
    const held1 = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {})).lease!.entry!;
    const released = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(held1), r, at), NOW, {})).lease!.entry!;
    const until = Date.parse(released.released![0]!.until);
    expect(until).toBe(at + 15 * 60_000);
    // The replay, admitted at its deadline and run then: the mark still refuses it.
    expect(settled(await settleLeaseIntent(a, leaseGate(ledgerWith(released), a, until), new Date(until), {})).replies[0]!.value).toMatchObject({ reason: "lease_replayed" });
    // Run a moment later (it waited behind the record's intents, or an outage): refused by its own deadline.
    const late = new Date(until + 1);
    const answer = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(released), a, late.getTime()), late, {}));
    expect(answer.replies[0]!.value).toMatchObject({ status: "rejected", reason: "stale" });
    expect(answer.lease).toBeUndefined();
    // Also once an intent of the record run before it dropped the past mark (another change's new lease).
    const b = await acquire(other);
    b.intent.createdAt = late.toISOString();
    const bHeld = settled(await settleLeaseIntent(b, leaseGate(ledgerWith(released), b, late.getTime()), late, {})).lease!.entry!;
    expect(bHeld.released).toBeUndefined();
    const bFreed = { ...bHeld, releasedAt: late.toISOString(), expiresAt: late.toISOString() };
    const later = new Date(until + 2);
    expect(settled(await settleLeaseIntent(a, leaseGate(ledgerWith(bFreed), a, later.getTime()), later, {})).replies[0]!.value).toMatchObject({ reason: "stale" });
  });

  it("heldBefore: an acquire refused while a mark of its change and agent is in force says the change held the record before; not for another agent's mark of the change id, another change's, a mark past, or a replay", async () => {
    // The change held the record (its client crashed; here: released), then another agent's change took it.
    const a = await acquire(mine);
    const granted = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {})).lease!.entry!;
    const r = await release();
    r.intent.createdAt = new Date(at + 5_000).toISOString();
    const released = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(granted), r, at + 5_000), new Date(at + 5_000), {})).lease!.entry!;
    const acquireBy = async (change: string, agentId: string, when: number) => {
      const x = await admittedOk(
        wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(change, "acquire", T1), lease: { change, op: "acquire", ttlMs: 600_000 } }, agentId),
      );
      x.intent.createdAt = new Date(when).toISOString();
      return x;
    };
    const t1 = at + 10_000;
    const b = await acquireBy(other, "agent-2", t1);
    const taken = settled(await settleLeaseIntent(b, leaseGate(ledgerWith(released), b, t1), new Date(t1), {})).lease!.entry!;
    expect(taken).toMatchObject({ change: other, agentId: "agent-2", released: [{ change: mine, agentId: "agent-1" }] });
    const answer = async (x: AdmittedIntent, entry: LedgerLeaseEntry, when: number) => settled(await settleLeaseIntent(x, leaseGate(ledgerWith(entry), x, when), new Date(when), {})).replies[0]!.value;
    // The change resumed by a client that does not remember it (a new acquire, made after its release): leased, held before.
    const t2 = at + 60_000;
    const resumed = await answer(await acquireBy(mine, "agent-1", t2), taken, t2);
    expect(resumed).toMatchObject({ status: "rejected", reason: "leased", details: { expiresAt: taken.expiresAt, heldBefore: true } });
    Reply.parse(resumed);
    // The same change id from another agent (its own change): not told of agent-1's.
    const sameIdOtherAgent = await answer(await acquireBy(mine, "agent-3", t2), taken, t2);
    expect(sameIdOtherAgent).toMatchObject({ status: "rejected", reason: "leased", details: { expiresAt: taken.expiresAt } });
    expect((sameIdOtherAgent as { details: object }).details).not.toHaveProperty("heldBefore");
    // Another change of the same agent: nothing of this one said.
    const anotherChange = await answer(await acquireBy("a".repeat(64), "agent-1", t2), taken, t2);
    expect((anotherChange as { details: object }).details).not.toHaveProperty("heldBefore");
    // A mark of the same change id by another agent does not speak for agent-1.
    const otherAgentsMark = { ...taken, released: [{ change: mine, agentId: "agent-3", before: new Date(at).toISOString(), until: new Date(at + 15 * 60_000).toISOString() }] };
    expect((await answer(await acquireBy(mine, "agent-1", t2), otherAgentsMark, t2)) as { details: object }).not.toHaveProperty("details.heldBefore");
    // The mark in force up to its `until` (the release + 15 minutes), not after: then the change's past is not known.
    const until = Date.parse(released.released![0]!.until);
    expect(until).toBe(at + 5_000 + 15 * 60_000);
    const stillHeld = { ...taken, expiresAt: new Date(until + 60_000).toISOString() };
    expect(await answer(await acquireBy(mine, "agent-1", until), stillHeld, until)).toMatchObject({ reason: "leased", details: { heldBefore: true } });
    const past = await answer(await acquireBy(mine, "agent-1", until + 1), stillHeld, until + 1);
    expect(past).toMatchObject({ status: "rejected", reason: "leased" });
    expect((past as { details: object }).details).not.toHaveProperty("heldBefore");
    // A replay of the change's old acquire is lease_replayed (old bytes); the mark is the change's own, so it says
    // heldBefore too (an acquire of a client whose clock is behind the earlier run's looks the same).
    const replay = await answer(a, released, t2);
    expect(replay).toMatchObject({ reason: "lease_replayed", details: { heldBefore: true } });
    // Other refusals of the acquire say it too: the record gone since.
    helpdesk.delete(T1);
    expect(await answer(await acquireBy(mine, "agent-1", t2), released, t2)).toMatchObject({ reason: "entity_not_found", details: { heldBefore: true } });
  });

  it("heldBefore, a resume whose clock is behind the crashed run's: its acquire, made before the lapsed lease's mark, is lease_replayed with details.heldBefore; a replayed release is not told", async () => {
    // P0 took the record (its latest acquire at `at`, its clock) and crashed; the lease lapsed.
    const a = await acquire(mine, 30_000);
    const granted = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {})).lease!.entry!;
    expect(granted.lastAcquireCreatedAt).toBe(NOW.toISOString());
    // P1, the same agent started anew two minutes later on a clock two minutes behind: its acquire's createdAt is `at`.
    const t = at + 120_000;
    const resumed = await acquire(mine, 30_000);
    resumed.intent.createdAt = new Date(t - 120_000).toISOString();
    const refused = settled(await settleLeaseIntent(resumed, leaseGate(ledgerWith(granted), resumed, t), new Date(t), {}));
    expect(refused.replies[0]!.value).toMatchObject({ status: "rejected", reason: "lease_replayed", details: { heldBefore: true } });
    Reply.parse(refused.replies[0]!.value);
    expect(refused.lease).toBeUndefined();
    // A release's replay (the change holds the record again) says nothing of it: a release is not asked whether the change ran.
    const r = await release();
    r.intent.createdAt = new Date(at + 5_000).toISOString();
    const freed = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(granted), r, at + 5_000), new Date(at + 5_000), {})).lease!.entry!;
    const again = await acquire(mine, 30_000);
    again.intent.createdAt = new Date(at + 6_000).toISOString();
    const retaken = settled(await settleLeaseIntent(again, leaseGate(ledgerWith(freed), again, at + 6_000), new Date(at + 6_000), {})).lease!.entry!;
    const replayedRelease = settled(await settleLeaseIntent(r, leaseGate(ledgerWith(retaken), r, at + 7_000), new Date(at + 7_000), {})).replies[0]!.value;
    expect(replayedRelease).toMatchObject({ status: "rejected", reason: "lease_replayed" });
    expect(replayedRelease).not.toHaveProperty("details");
  });

  it("heldBefore on a grant: an acquire granted while a mark of its change and agent is in force says lease.heldBefore; a first grant, another agent's or another change's does not", async () => {
    const a = await acquire(mine, 30_000);
    const first = settled(await settleLeaseIntent(a, leaseGate(ledgerWith(), a, at), NOW, {}));
    expect(first.replies[0]!.value).toMatchObject({ status: "applied", lease: { change: mine } });
    expect((first.replies[0]!.value as { lease: object }).lease).not.toHaveProperty("heldBefore");
    const lapsedEntry = first.lease!.entry!;
    // The lease lapsed (its agent crashed); a minute later the change is resumed by a client started anew.
    const t = at + 60_000;
    const acquireAt = async (change: string, agentId: string) => {
      const x = await admittedOk(
        wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(change, "acquire", T1), lease: { change, op: "acquire", ttlMs: 30_000 } }, agentId),
      );
      x.intent.createdAt = new Date(t).toISOString();
      return settled(await settleLeaseIntent(x, leaseGate(ledgerWith(lapsedEntry), x, t), new Date(t), {}));
    };
    const resumed = await acquireAt(mine, "agent-1");
    expect(resumed.replies[0]!.value).toMatchObject({ status: "applied", via: "lease", lease: { change: mine, expiresAt: new Date(t + 30_000).toISOString(), heldBefore: true } });
    expect(Reply.parse(resumed.replies[0]!.value)).toMatchObject({ lease: { heldBefore: true } });
    // The mark stays on the entry (it still refuses the old acquires as replays).
    expect(resumed.lease!.entry).toMatchObject({ change: mine, released: [{ change: mine, agentId: "agent-1" }] });
    for (const [change, agentId] of [
      [mine, "agent-3"],
      ["a".repeat(64), "agent-1"],
    ] as const) {
      const granted = (await acquireAt(change, agentId)).replies[0]!.value;
      expect(granted, `${change.slice(0, 1)} ${agentId}`).toMatchObject({ status: "applied", lease: { change } });
      expect((granted as { lease: object }).lease).not.toHaveProperty("heldBefore");
    }
  });
});

describe("leases of changes that span records: what one agent may hold", () => {
  const change = "c".repeat(64);
  const T2: EntityRef = { type: "ticket", id: "T-2" };
  const at = NOW.getTime();
  const acquire = async (entity: EntityRef, agentId = "agent-1", chg = change) =>
    admittedOk(wire({ tool: "tag_ticket", entity, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(chg, "acquire", entity), lease: { change: chg, op: "acquire", ttlMs: 30_000 } }, agentId));
  const held = (id: string, agentId: string, expiresAt: number, acquiredAt = at): [string, LedgerLeaseEntry] => [
    `__lease__:ticket:${id}`,
    { kind: "lease", entity: { type: "ticket", id }, change: "f".repeat(64), agentId, replyTo: REPLY_TO, acquiredAt: new Date(acquiredAt).toISOString(), expiresAt: new Date(expiresAt).toISOString(), updatedAt: NOW.toISOString() },
  ];
  const bounded = (ledger: PartitionLedger, extra: Partial<LeaseBounds> = {}): LeaseBounds & { seen: string[] } => {
    const seen: string[] = [];
    return { ledger, maxHoldMs: 900_000, maxPerAgent: 2, refused: (reason) => void seen.push(reason), seen, ...extra };
  };
  /** Settles `a` as its owner would: gated on `ledger`, its granted lease staged there. */
  const run = async (ledger: PartitionLedger, a: AdmittedIntent, bounds: LeaseBounds, now = NOW) => {
    const out = settled(await settleLeaseIntent(a, leaseGate(ledger, a, now.getTime()), now, {}, bounds));
    if (out.lease) ledger.stageLease(out.lease.entityKey, out.lease.entry);
    return out;
  };

  it("lease_limit: an agent holding its most live leases on the partition is refused a new one, nothing read or taken; another agent's acquire is granted; an expired lease does not count", async () => {
    helpdesk.seed(T2, { status: "open", tags: [] });
    const ledger = new PartitionLedger(0, [held("T-8", "agent-1", at + 60_000), held("T-9", "agent-1", at + 60_000), held("T-7", "agent-1", at)]);
    const bounds = bounded(ledger);
    const refused = await run(ledger, await acquire(T1), bounds);
    expect(refused.replies[0]!.value).toMatchObject({ status: "rejected", reason: "lease_limit", details: { held: 2, max: 2 }, message: expect.stringContaining("WRIT_MAX_LEASES_PER_AGENT") });
    Reply.parse(refused.replies[0]!.value);
    expect(refused.lease).toBeUndefined();
    expect(helpdesk.reads).toEqual([]);
    expect(bounds.seen).toEqual(["lease_limit"]);
    // Another agent: its own count.
    expect((await run(ledger, await acquire(T1, "agent-2", "e".repeat(64)), bounds)).replies[0]!.value).toMatchObject({ status: "applied", via: "lease" });
    // One of agent-1's leases past its expiry: no longer counted, so a new grant fits.
    const later = new Date(at + 60_000);
    expect((await run(ledger, await acquire(T2), bounds, later)).replies[0]!.value).toMatchObject({ status: "applied", via: "lease" });
    expect(ledger.leasesHeldBy("agent-1", later.getTime())).toBe(1);
  });

  it("lease_limit and lease_cooldown say heldBefore when a mark of the acquire's change and agent is in force; not for another agent's", async () => {
    const mark = (agentId: string) => ({ change, agentId, before: new Date(at - 60_000).toISOString(), until: new Date(at - 60_000 + 15 * 60_000).toISOString() });
    const freed = (agentId: string, releasedAt = at - 60_000): [string, LedgerLeaseEntry] => [
      `__lease__:${entityKey(T1)}`,
      { ...held("T-1", "agent-9", at - 60_000, at - 120_000)[1], entity: T1, releasedAt: new Date(releasedAt).toISOString(), released: [mark(agentId)] },
    ];
    for (const [agentId, told] of [["agent-1", true], ["agent-2", false]] as const) {
      const ledger = new PartitionLedger(0, [held("T-8", "agent-1", at + 60_000), held("T-9", "agent-1", at + 60_000), freed(agentId)]);
      const refused = (await run(ledger, await acquire(T1), bounded(ledger))).replies[0]!.value;
      expect(refused).toMatchObject({ status: "rejected", reason: "lease_limit", details: { held: 2, max: 2 } });
      expect("heldBefore" in (refused as { details: object }).details, agentId).toBe(told);
      if (told) expect(refused).toMatchObject({ details: { heldBefore: true } });
    }
    // lease_cooldown: agent-1's other change held the record past the hold and ended 5 s ago; this change's mark is kept too.
    const ledger = new PartitionLedger(0, [[`__lease__:${entityKey(T1)}`, { ...freed("agent-1", at - 5_000)[1], agentId: "agent-1", change: "d".repeat(64), acquiredAt: new Date(at - 900_000).toISOString() }]]);
    expect((await run(ledger, await acquire(T1), bounded(ledger))).replies[0]!.value).toMatchObject({ reason: "lease_cooldown", details: { change: "d".repeat(64), heldBefore: true } });
  });

  it("lease_limit: a grant decided but not yet staged counts (the agent's acquires of other records run meanwhile)", async () => {
    helpdesk.seed(T2, { status: "open", tags: [] });
    const ledger = new PartitionLedger(0);
    const bounds = bounded(ledger, { maxPerAgent: 1 });
    // Both gated free, the first settled without being staged (its reply still being encoded).
    const [a1, a2] = [await acquire(T1), await acquire(T2)];
    const [g1, g2] = [leaseGate(ledger, a1, at), leaseGate(ledger, a2, at)];
    expect(settled(await settleLeaseIntent(a1, g1, NOW, {}, bounds)).replies[0]!.value).toMatchObject({ status: "applied" });
    expect(settled(await settleLeaseIntent(a2, g2, NOW, {}, bounds)).replies[0]!.value).toMatchObject({ status: "rejected", reason: "lease_limit", details: { held: 1, max: 1 } });
  });

  it("lease_hold_exceeded: a renewal up to maxHoldMs after the grant renews; past it is refused with acquiredAt, maxHoldMs and expiresAt, nothing staged (the lease lapses at its expiry)", async () => {
    const ledger = new PartitionLedger(0);
    const bounds = bounded(ledger, { maxHoldMs: 20_000 });
    const a = await acquire(T1);
    const granted = (await run(ledger, a, bounds)).lease!.entry!;
    const edge = new Date(at + 20_000);
    const renewed = await run(ledger, a, bounds, edge);
    expect(renewed.lease!.entry).toMatchObject({ acquiredAt: granted.acquiredAt, expiresAt: new Date(at + 50_000).toISOString() });
    const past = new Date(at + 20_001);
    const refused = await run(ledger, a, bounds, past);
    expect(refused.replies[0]!.value).toMatchObject({
      status: "rejected",
      reason: "lease_hold_exceeded",
      details: { acquiredAt: NOW.toISOString(), maxHoldMs: 20_000, expiresAt: new Date(at + 50_000).toISOString() },
    });
    Reply.parse(refused.replies[0]!.value);
    expect(refused.lease).toBeUndefined();
    expect(bounds.seen).toEqual(["lease_hold_exceeded"]);
    // Still the change's until it lapses: another change's write is answered leased, the change's steps pass.
    expect(leaseGate(ledger, a, past.getTime())).toMatchObject({ kind: "mine" });
    expect(leaseGate(ledger, a, at + 50_000)).toMatchObject({ kind: "free", expired: { change } });
  });
  describe("the cool-down after a hold past maxHoldMs", () => {
    const c2 = "d".repeat(64);
    const c3 = "a".repeat(64);
    /** An acquire or release of `chg` by `agentId` made at `when` (ms). */
    const intentAt = async (op: "acquire" | "release", chg: string, when: number, agentId = "agent-1", ttlMs = 30_000) => {
      const lease = op === "acquire" ? { change: chg, op, ttlMs } : { change: chg, op };
      const a = await admittedOk(wire({ tool: "tag_ticket", entity: T1, baseVersion: LEASE_VERSION, delta: [], params: {}, intentKey: leaseIntentKey(chg, op, T1), lease }, agentId));
      a.intent.createdAt = new Date(when).toISOString();
      return a;
    };
    /** As the owner runs a lease intent at `when`: a lapsed lease its gate finds is freed first, the result staged. */
    const at_ = async (ledger: PartitionLedger, a: AdmittedIntent, bounds: LeaseBounds, when: number) => {
      const gate = leaseGate(ledger, a, when);
      if (gate.kind === "free" && gate.expired) ledger.stageLease(entityKey(T1), gate.released ?? null);
      const out = settled(await settleLeaseIntent(a, gate, new Date(when), {}, bounds));
      if (out.lease) ledger.stageLease(out.lease.entityKey, out.lease.entry);
      return out;
    };
    const reply = (out: Effects) => out.replies[0]!.value;

    it("lease_cooldown: a lease that lapsed past maxHoldMs keeps the record from its agent (any change of it) for LEASE_COOLDOWN_MS after its expiry, nothing read or taken, also on a ledger restored from it; another agent is granted; then the agent's hold starts anew", async () => {
      const ledger = new PartitionLedger(0);
      const bounds = bounded(ledger, { maxHoldMs: 20_000 });
      expect(reply(await at_(ledger, await intentAt("acquire", change, at), bounds, at))).toMatchObject({ status: "applied" });
      expect(reply(await at_(ledger, await intentAt("acquire", change, at + 20_001), bounds, at + 20_001))).toMatchObject({ reason: "lease_hold_exceeded" });
      // Lapsed at at + 30 s. Five seconds on, a new change of the same agent asks for the record: kept from it until
      // the cool-down after the lapse, the record not read.
      const reads = helpdesk.reads.length;
      const refused = await at_(ledger, await intentAt("acquire", c2, at + 35_000), bounds, at + 35_000);
      const until = new Date(at + 30_000 + LEASE_COOLDOWN_MS).toISOString();
      expect(reply(refused)).toMatchObject({ status: "rejected", reason: "lease_cooldown", details: { acquiredAt: NOW.toISOString(), maxHoldMs: 20_000, until, change }, message: expect.stringContaining("WRIT_LEASE_MAX_HOLD_MS") });
      Reply.parse(reply(refused));
      expect(refused.lease).toBeUndefined();
      expect(helpdesk.reads.length).toBe(reads);
      expect(bounds.seen).toEqual(["lease_hold_exceeded", "lease_cooldown"]);
      // What decides it is the ledger's entry: an owner restoring the partition decides the same.
      const freed = ledger.lease(entityKey(T1))!;
      LedgerEntry.parse(freed);
      expect(freed).toMatchObject({ agentId: "agent-1", change, acquiredAt: NOW.toISOString(), releasedAt: new Date(at + 30_000).toISOString() });
      const restored = new PartitionLedger(0, [[`__lease__:${entityKey(T1)}`, freed]]);
      const restoredBounds = bounded(restored, { maxHoldMs: 20_000 });
      expect(reply(await at_(restored, await intentAt("acquire", c3, at + 39_999), restoredBounds, at + 39_999))).toMatchObject({ reason: "lease_cooldown", details: { until } });
      // Another agent is not kept from it.
      expect(reply(await at_(restored, await intentAt("acquire", c3, at + 36_000, "agent-2"), restoredBounds, at + 36_000))).toMatchObject({ status: "applied", via: "lease" });
      // From the cool-down's end, the agent's new grant begins a new hold.
      const after = await at_(ledger, await intentAt("acquire", c2, at + 30_000 + LEASE_COOLDOWN_MS), bounds, at + 30_000 + LEASE_COOLDOWN_MS);
      expect(reply(after)).toMatchObject({ status: "applied", via: "lease" });
      expect(after.lease!.entry).toMatchObject({ change: c2, acquiredAt: until });
    });

    it("released and taken again within LEASE_COOLDOWN_MS, the agent's hold goes on (acquiredAt kept): renewed past maxHoldMs it is refused, taken again it is lease_cooldown; a gap of LEASE_COOLDOWN_MS begins a new hold", async () => {
      const ledger = new PartitionLedger(0);
      const bounds = bounded(ledger, { maxHoldMs: 60_000 });
      await at_(ledger, await intentAt("acquire", change, at), bounds, at);
      await at_(ledger, await intentAt("release", change, at + 19_000), bounds, at + 19_000);
      // Another change of the agent takes it half a second later: the same hold, begun at the first grant (its
      // 30 s time to live ends within the hold).
      const again = await at_(ledger, await intentAt("acquire", c2, at + 19_500), bounds, at + 19_500);
      expect(again.lease!.entry).toMatchObject({ change: c2, acquiredAt: NOW.toISOString() });
      expect(reply(await at_(ledger, await intentAt("acquire", c2, at + 45_000), bounds, at + 45_000))).toMatchObject({ status: "applied" });
      expect(reply(await at_(ledger, await intentAt("acquire", c2, at + 60_000), bounds, at + 60_000))).toMatchObject({ status: "applied" });
      expect(reply(await at_(ledger, await intentAt("acquire", c2, at + 60_001), bounds, at + 60_001))).toMatchObject({ reason: "lease_hold_exceeded", details: { acquiredAt: NOW.toISOString() } });
      await at_(ledger, await intentAt("release", c2, at + 61_000), bounds, at + 61_000);
      expect(reply(await at_(ledger, await intentAt("acquire", c3, at + 61_001), bounds, at + 61_001))).toMatchObject({ reason: "lease_cooldown", details: { until: new Date(at + 61_000 + LEASE_COOLDOWN_MS).toISOString(), change: c2 } });
      // A hold within the bound, released and taken again after a full cool-down: a new hold.
      const fresh = new PartitionLedger(0);
      const freshBounds = bounded(fresh, { maxHoldMs: 60_000 });
      await at_(fresh, await intentAt("acquire", change, at), freshBounds, at);
      await at_(fresh, await intentAt("release", change, at + 19_000), freshBounds, at + 19_000);
      const later = await at_(fresh, await intentAt("acquire", c2, at + 19_000 + LEASE_COOLDOWN_MS), freshBounds, at + 19_000 + LEASE_COOLDOWN_MS);
      expect(later.lease!.entry).toMatchObject({ acquiredAt: new Date(at + 19_000 + LEASE_COOLDOWN_MS).toISOString() });
    });

    it("a grant that would continue the agent's hold past maxHoldMs within its time to live is lease_cooldown, nothing read or taken: a continuation granted always lives its first time to live; after the cool-down a new hold begins", async () => {
      const ledger = new PartitionLedger(0);
      const bounds = bounded(ledger, { maxHoldMs: 60_000 });
      await at_(ledger, await intentAt("acquire", change, at), bounds, at);
      await at_(ledger, await intentAt("release", change, at + 29_000), bounds, at + 29_000);
      // At 30.001 s its 30 s would end at 60.001 s, past the hold: its first renewal would be refused.
      const reads = helpdesk.reads.length;
      const refused = await at_(ledger, await intentAt("acquire", c2, at + 30_001), bounds, at + 30_001);
      expect(reply(refused)).toMatchObject({ status: "rejected", reason: "lease_cooldown", details: { acquiredAt: NOW.toISOString(), maxHoldMs: 60_000, until: new Date(at + 29_000 + LEASE_COOLDOWN_MS).toISOString(), change } });
      expect(refused.lease).toBeUndefined();
      expect(helpdesk.reads.length).toBe(reads);
      // At its edge (its time to live ends at the hold's end) it is granted, and renewed up to it.
      const edge = new PartitionLedger(0);
      const edgeBounds = bounded(edge, { maxHoldMs: 60_000 });
      await at_(edge, await intentAt("acquire", change, at), edgeBounds, at);
      await at_(edge, await intentAt("release", change, at + 29_000), edgeBounds, at + 29_000);
      expect((await at_(edge, await intentAt("acquire", c2, at + 30_000), edgeBounds, at + 30_000)).lease!.entry).toMatchObject({ acquiredAt: NOW.toISOString() });
      expect(reply(await at_(edge, await intentAt("acquire", c2, at + 59_999), edgeBounds, at + 59_999))).toMatchObject({ status: "applied", lease: { expiresAt: new Date(at + 89_999).toISOString() } });
      // The refused agent asks again at the cool-down's end: a new hold.
      const after = await at_(ledger, await intentAt("acquire", c2, at + 29_000 + LEASE_COOLDOWN_MS), bounds, at + 29_000 + LEASE_COOLDOWN_MS);
      expect(after.lease!.entry).toMatchObject({ change: c2, acquiredAt: new Date(at + 29_000 + LEASE_COOLDOWN_MS).toISOString() });
    });

    it("an agent running 40 s changes back to back on one record, 5 s apart, with the default hold and time to live: no change is refused at a renewal; past the hold one waits out a cool-down and a new hold begins", async () => {
      const ledger = new PartitionLedger(0);
      const bounds = bounded(ledger);
      const ttlMs = DEFAULT_LEASE_TTL_MS;
      const seen: string[] = [];
      let t = at;
      let holds = 1;
      for (let n = 1; t < at + 2 * bounds.maxHoldMs; n++) {
        const chg = n.toString(16).padStart(64, "0");
        // Asked as the client asks: again with its backoff while kept from the record.
        let got = reply(await at_(ledger, await intentAt("acquire", chg, t, "agent-1", ttlMs), bounds, t));
        while (got.status === "rejected" && got.reason === "lease_cooldown") {
          seen.push(`cool-down at ${t - at}`);
          t += 2_000;
          got = reply(await at_(ledger, await intentAt("acquire", chg, t, "agent-1", ttlMs), bounds, t));
          if (got.status === "applied") holds++;
        }
        expect(got, `change ${n} at ${t - at} ms`).toMatchObject({ status: "applied" });
        // Its renewal before its second step, half its time to live on.
        t += ttlMs / 2;
        expect(reply(await at_(ledger, await intentAt("acquire", chg, t, "agent-1", ttlMs), bounds, t)), `renewal of change ${n} at ${t - at} ms`).toMatchObject({ status: "applied" });
        t += 10_000;
        await at_(ledger, await intentAt("release", chg, t), bounds, t);
        t += 5_000;
      }
      expect(holds).toBeGreaterThan(1);
      expect(seen.length).toBeGreaterThan(0);
      expect(bounds.seen.every((r) => r === "lease_cooldown")).toBe(true);
    });

    it("a freed lease whose replay marks are past stays for its cool-down (the sweep takes it after), then is a tombstone", () => {
      // Its latest acquire made long before (its mark's `until` already past when it lapsed).
      const old = new Date(at - 20 * 60_000).toISOString();
      const lease: LedgerLeaseEntry = { kind: "lease", entity: T1, change, agentId: "agent-1", replyTo: REPLY_TO, acquiredAt: old, expiresAt: NOW.toISOString(), updatedAt: old, lastAcquireCreatedAt: old };
      const freed = lapsedLease(lease, at + 1_000)!;
      expect(freed).toMatchObject({ releasedAt: NOW.toISOString() });
      expect(freed.released).toBeUndefined();
      const ledger = new PartitionLedger(0, [[`__lease__:${entityKey(T1)}`, freed]]);
      expect(ledger.expiredLeases(at + LEASE_COOLDOWN_MS - 1, 10)).toEqual([]);
      expect(ledger.expiredLeases(at + LEASE_COOLDOWN_MS + 1, 10)).toEqual([freed]);
      expect(lapsedLease(freed, at + LEASE_COOLDOWN_MS + 1)).toBeNull();
      expect(lapsedLease(lease, at + LEASE_COOLDOWN_MS + 1)).toBeNull();
    });
  });
});

describe("leases of changes that span records: the ledger's layers", () => {
  const entry = (change: string, expiresAt: string): LedgerLeaseEntry => ({ kind: "lease", entity: T1, change, agentId: "a", replyTo: REPLY_TO, acquiredAt: NOW.toISOString(), expiresAt, updatedAt: NOW.toISOString() });

  it("a staged lease is seen at once, commits with its transaction, and a release (tombstone) removes it; a failed transaction's are gone", () => {
    const ledger = new PartitionLedger(0, [[`__lease__:ticket:T-1`, entry("x", "2025-06-01T12:01:00.000Z")]]);
    expect(ledger.lease("ticket:T-1")).toMatchObject({ change: "x" });
    ledger.stageLease("ticket:T-1", entry("y", "2025-06-01T12:02:00.000Z"));
    expect(ledger.lease("ticket:T-1")).toMatchObject({ change: "y" });
    ledger.takeStaged();
    expect(ledger.lease("ticket:T-1")).toMatchObject({ change: "y" });
    ledger.committedSending();
    expect(ledger.lease("ticket:T-1")).toMatchObject({ change: "y" });
    ledger.stageLease("ticket:T-1", null);
    expect(ledger.lease("ticket:T-1")).toBeUndefined();
    expect(ledger.leaseCount).toBe(0);
    ledger.takeStaged();
    ledger.committedSending();
    expect(ledger.lease("ticket:T-1")).toBeUndefined();
    // Restored entries of both kinds keep apart: a lease is not an intent entry.
    expect(ledger.size).toBe(0);
  });

  it("lists the leases past their expiry, newest layer first, each once", () => {
    const ledger = new PartitionLedger(0, [[`__lease__:ticket:T-1`, entry("x", "2025-06-01T11:59:00.000Z")], [`__lease__:ticket:T-2`, { ...entry("z", "2025-06-01T12:05:00.000Z"), entity: { type: "ticket", id: "T-2" } }]]);
    expect(ledger.expiredLeases(NOW.getTime(), 10).map((l) => l.change)).toEqual(["x"]);
    ledger.stageLease("ticket:T-1", entry("y", "2025-06-01T12:10:00.000Z"));
    expect(ledger.expiredLeases(NOW.getTime(), 10)).toEqual([]);
    expect(ledger.leaseCount).toBe(2);
  });
});
