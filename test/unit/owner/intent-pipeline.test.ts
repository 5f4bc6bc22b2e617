import fc from "fast-check";
import { pino } from "pino";
import { beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { WritError } from "../../../src/errors.ts";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import type { Effects } from "../../../src/owner/effects.ts";
import { type ExecContext, IntentPipeline, type PipelineDeps, type Plan, type Step } from "../../../src/owner/intent-pipeline.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import { Escalation } from "../../../src/schemas/escalation.ts";
import { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import type { ReconcileResult } from "../../../src/sor/adapter.ts";
import { type AdmittedTool, admitTools, declareWriteTool, type ReconcileContext } from "../../../src/tools.ts";
import { FakeSystem, type PatchFault, outage, protocolError, version } from "./fake-system.ts";
import { commit, runPlan, setStatus, writePlan } from "./pipeline-fixtures.ts";

// ---------------------------------------------------------------------------
// Fixtures: one system of record, three tools, intents built as admission builds them.

const NOW = new Date("2025-06-01T12:00:00.000Z");
const log = pino({ level: "silent" });
const T1 = { type: "ticket", id: "T-1" };
const REPLY_TO = "writ.replies.agent-1";
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: { "x-writ-owner": "owner-test" } };

/** Answers of the `add_note` reconcile function, in call order; when empty it looks at the record. */
let noteReconcile: (ReconcileResult | Error)[] = [];
let noteReconcileCalls = 0;


const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"],
  allowedPaths: ["/tags/-", "/tags"],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

const addNote = declareWriteTool({
  name: "add_note",
  recordType: "ticket",
  params: z.object({ noteId: z.string(), text: z.string() }),
  intentFields: ["noteId"],
  freeTextParams: ["text"],
  allowedPaths: ["/notes/-"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: ({ intent, current }: ReconcileContext) => {
    noteReconcileCalls++;
    const next = noteReconcile.shift();
    if (next instanceof Error) throw next;
    if (next !== undefined) return next;
    const notes = ((current?.state as { notes?: { id: string }[] } | null)?.notes ?? []) as { id: string }[];
    return notes.some((n) => n.id === intent.params.noteId) ? "applied" : "not_applied";
  },
});

let sor: FakeSystem;
let tools: Map<string, AdmittedTool>;

beforeEach(() => {
  sor = new FakeSystem("helpdesk");
  tools = admitTools([setStatus, tagTicket, addNote], [sor], { sorTimeoutMs: 1_000 });
  noteReconcile = [];
  noteReconcileCalls = 0;
  sor.seed(T1, { status: "open", tags: [], notes: [] });
});

interface IntentOpts {
  base?: string;
  intentId?: string;
  stepId?: string;
  /** Use this intent key instead of the one the params give (a client that reuses a key). */
  intentKey?: string;
  entity?: { type: string; id: string };
}

let submissions = 0;
function intentFor(toolName: string, params: Record<string, unknown>, delta: JsonPatchOp[], opts: IntentOpts = {}): AdmittedIntent {
  const tool = tools.get(toolName)!;
  const entity = opts.entity ?? T1;
  const key =
    opts.intentKey ??
    intentKey({ agentId: "agent-1", tool: { name: tool.name, keyScope: tool.keyScope, intentFields: tool.declaration.intentFields }, runId: "run-1", stepId: opts.stepId ?? "step-1", entity, params });
  return {
    intent: {
      intentId: opts.intentId ?? `intent-${++submissions}`,
      intentKey: key,
      entity,
      tool: tool.name,
      agent: { id: "agent-1", runId: "run-1", stepId: opts.stepId ?? "step-1" },
      baseVersion: opts.base ?? version(1),
      delta,
      params,
      replyTo: REPLY_TO,
      createdAt: NOW.toISOString(),
    },
    tool,
    entityKey: `${entity.type}:${entity.id}`,
    fingerprint: paramsFingerprint(tool.name, entity, params, tool.freeTextParams),
    deltaFingerprint: deltaFingerprint(delta, tool.isFreeTextPath),
    params,
  };
}

const close = (opts: IntentOpts = {}) => intentFor("set_status", { status: "closed" }, [{ op: "replace", path: "/status", value: "closed" }], opts);
const tag = (t: string, opts: IntentOpts = {}) => intentFor("tag_ticket", { tag: t }, [{ op: "add", path: "/tags/-", value: t }], opts);
const note = (opts: IntentOpts = {}) =>
  intentFor("add_note", { noteId: "n1", text: "called the customer" }, [{ op: "add", path: "/notes/-", value: { id: "n1", text: "called the customer" } }], opts);

function pipelineWith(extra: Partial<PipelineDeps> = {}): IntentPipeline {
  return new IntentPipeline({ config: { unknownRounds: 3 }, log, now: () => NOW, ...extra });
}

/** Everything a step emits must be a valid wire value: replies, the ledger entry, escalations. */
function checked(step: Step): Step {
  if (step.kind === "settled") {
    const e = step.effects;
    for (const r of e.replies) Reply.parse(r.value);
    if (e.ledger) LedgerIntentEntry.parse(e.ledger);
    for (const x of e.escalations) Escalation.parse(x.value);
  }
  return step;
}

/** What the owner does with one intent: classify, make pending durable, execute, commit the result. */
async function run(p: IntentPipeline, a: AdmittedIntent, ledger: PartitionLedger, c: ExecContext = ctx): Promise<{ plan: Plan; step: Step; written: boolean }> {
  const ran = await runPlan(p, a, ledger, c);
  checked(ran.step);
  if (ran.step.kind === "settled") commit(ledger, ran.step.effects.ledger);
  return ran;
}

function settled(step: Step): Effects {
  if (step.kind !== "settled") throw new Error(`expected a settled step, got ${JSON.stringify(step)}`);
  return step.effects;
}

function reply(step: Step): Reply {
  const e = settled(step);
  expect(e.replies).toHaveLength(1);
  expect(e.replies[0]!.topic).toBe(REPLY_TO);
  return e.replies[0]!.value;
}

function expectRetryLater(step: Step): void {
  expect(step.kind).toBe("retry-later");
  expect(step).toMatchObject({ notSent: true });
}

/** A pending entry as an earlier owner left it (it died between step 3 and its result). */
function inheritedLedger(a: AdmittedIntent, cycles = 0): PartitionLedger {
  const entry: LedgerIntentEntry = {
    kind: "intent",
    intentKey: a.intent.intentKey,
    intentId: "earlier-submission",
    status: "pending",
    entity: a.intent.entity,
    tool: a.tool.name,
    agentId: "agent-1",
    fingerprint: a.fingerprint,
    attempts: [{ baseVersion: a.intent.baseVersion, deltaFingerprint: a.deltaFingerprint }],
    cycles,
    replyTo: REPLY_TO,
    updatedAt: new Date(NOW.getTime() - 60_000).toISOString(),
  };
  return new PartitionLedger(0, [[entry.intentKey, entry]]);
}

// ---------------------------------------------------------------------------

describe("IntentPipeline.classify (step 2: what the ledger says)", () => {
  it("plans a write for a key the ledger does not hold, with a pending entry of the intent's facts", () => {
    const a = close();
    const plan = writePlan(pipelineWith().classify(a, new PartitionLedger(0)));
    expect(plan.pending).toEqual({
      kind: "intent",
      intentKey: a.intent.intentKey,
      intentId: a.intent.intentId,
      status: "pending",
      entity: T1,
      tool: "set_status",
      agentId: "agent-1",
      fingerprint: a.fingerprint,
      attempts: [{ baseVersion: version(1), deltaFingerprint: a.deltaFingerprint }],
      cycles: 0,
      replyTo: REPLY_TO,
      updatedAt: NOW.toISOString(),
    });
    expect(LedgerIntentEntry.safeParse(plan.pending).success).toBe(true);
    expect(plan.state).toEqual({ inherited: false, mayHaveWritten: false, unknownRounds: 0 });
  });

  it("inherits a key an earlier owner left pending: may have written, reconcile first, cycles and attempts carried", () => {
    const a = close({ intentId: "resubmitted" });
    const plan = writePlan(pipelineWith().classify(a, inheritedLedger(a, 1)));
    expect(plan.state).toEqual({ inherited: true, mayHaveWritten: true, unknownRounds: 0 });
    expect(plan.pending.status).toBe("pending");
    expect(plan.pending.intentId).toBe("resubmitted");
    expect(plan.pending.cycles).toBe(1);
    // the same attempt is not listed twice
    expect(plan.pending.attempts).toEqual([{ baseVersion: version(1), deltaFingerprint: a.deltaFingerprint }]);
  });

  it("answers a repeat of an applied intent from the ledger: duplicate, no state, the stored version, no second PATCH", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const first = await run(p, close(), ledger);
    expect(reply(first.step)).toMatchObject({ status: "applied", version: version(2), duplicate: false });

    const again = close({ intentId: "retry-of-the-same-step" });
    const { plan, step } = await run(p, again, ledger);
    expect(plan.kind).toBe("settled");
    expect(settled(step).ledger).toBeUndefined();
    expect(reply(step)).toEqual({
      status: "applied",
      intentId: "retry-of-the-same-step",
      intentKey: again.intent.intentKey,
      duplicate: true,
      at: NOW.toISOString(),
      entity: T1,
      state: null,
      version: version(2),
      via: "patch",
      tool: "set_status",
    });
    expect(settled(step).redelivered).toBeUndefined();
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("marks the very submission the ledger holds, delivered again (a lagging offset commit), as redelivered", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const original = close();
    await run(p, original, ledger);
    const { step } = await run(p, original, ledger);
    expect(reply(step)).toMatchObject({ status: "applied", duplicate: true, intentId: original.intent.intentId });
    expect(settled(step).redelivered).toBe(true);
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("answers a retry built from a fresh read (new base, same change) of an applied intent as a repeat", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    await run(p, close(), ledger);
    const { step } = await run(p, close({ base: version(2) }), ledger);
    expect(reply(step)).toMatchObject({ status: "applied", duplicate: true, version: version(2) });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("answers a repeat of a rejected intent with the same reason, without reading the record again", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const missing = { type: "ticket", id: "T-404" };
    const first = reply((await run(p, close({ entity: missing }), ledger)).step);
    expect(first).toMatchObject({ status: "rejected", reason: "entity_not_found" });
    const reads = sor.reads.length;
    const again = reply((await run(p, close({ entity: missing }), ledger)).step);
    expect(again).toMatchObject({ status: "rejected", reason: "entity_not_found", duplicate: true, message: (first as { message: string }).message });
    expect(sor.reads.length).toBe(reads);
  });

  it("answers a repeat of an escalated intent with the same escalation id and raises no second escalation", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    sor.script.lookup.push({ kind: "answer", result: "unknown" });
    const first = await run(p, close(), ledger);
    const firstReply = reply(first.step);
    expect(firstReply).toMatchObject({ status: "escalated", reason: "outcome_unknown" });

    const { step } = await run(p, close(), ledger);
    expect(reply(step)).toMatchObject({
      status: "escalated",
      duplicate: true,
      reason: "outcome_unknown",
      escalationId: (firstReply as { escalationId: string }).escalationId,
    });
    expect(settled(step).escalations).toEqual([]);
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("rejects a key reused with other params (key_reused_with_different_params) and writes nothing", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const first = close();
    await run(p, first, ledger);
    const other = intentFor("set_status", { status: "pending" }, [{ op: "replace", path: "/status", value: "pending" }], { intentKey: first.intent.intentKey });
    const { step } = await run(p, other, ledger);
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "key_reused_with_different_params", duplicate: false });
    expect(settled(step).ledger).toBeUndefined();
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.current(T1)?.state).toMatchObject({ status: "closed" });
  });

  it("rejects another change from a base already used under the same key", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const first = close();
    await run(p, first, ledger);
    const otherDelta = intentFor("set_status", { status: "closed" }, [{ op: "replace", path: "/status", value: "pending" }]);
    expect(otherDelta.intent.intentKey).toBe(first.intent.intentKey);
    const { step } = await run(p, otherDelta, ledger);
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "key_reused_with_different_params" });
    expect(sor.patchCount(T1)).toBe(1);
  });
});

describe("IntentPipeline.repeatConflict (a repeat of a conflicted attempt)", () => {
  async function conflicted(p: IntentPipeline, ledger: PartitionLedger): Promise<void> {
    sor.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
    const { step } = await run(p, close(), ledger);
    expect(reply(step)).toMatchObject({ status: "conflict", cycle: 1 });
  }

  it("answers the same conflict again with the record as it is now, and starts no new cycle", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    await conflicted(p, ledger);
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "later" }]);
    const { plan, step } = await run(p, close(), ledger);
    expect(plan.kind).toBe("repeat-conflict");
    expect(reply(step)).toMatchObject({
      status: "conflict",
      duplicate: true,
      cycle: 1,
      current: { version: version(3), state: { status: "pending", tags: ["later"] } },
      your_change: [{ op: "replace", path: "/status", value: "closed" }],
    });
    expect(settled(step).ledger).toBeUndefined();
    expect(ledger.get(close().intent.intentKey)?.cycles).toBe(1);
    expect(sor.patchCount(T1)).toBe(0);
  });

  /**
   * The key's entry as a restore leaves it when an older submission runs first: close() at v1 conflicted (the record
   * at v2); the agent's attempt at v2 made `pending` and its owner gone before the PATCH; a new owner takes up that
   * pending with a redelivered submission of the v1 attempt, which conflicts on its own base. The entry: conflicted,
   * cycle 2, its attempts holding the v2 one, never answered; the record still at v2.
   */
  async function conflictedHoldingAttemptAtV2(p: IntentPipeline, ledger: PartitionLedger): Promise<AdmittedIntent> {
    await conflicted(p, ledger);
    const atV2 = close({ base: version(2) });
    commit(ledger, writePlan(p.classify(atV2, ledger)).pending);
    const older = await run(p, close(), ledger);
    expect(older.plan).toMatchObject({ kind: "write", state: { inherited: true } });
    expect(reply(older.step)).toMatchObject({ status: "conflict", cycle: 2, current: { version: version(2) } });
    expect(sor.patchCount(T1)).toBe(0);
    return close({ base: version(2) });
  }

  it("writes the attempt after all when the record is at the very version it was built on: no conflict answered for ever", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const atV2 = await conflictedHoldingAttemptAtV2(p, ledger);
    // Answered "conflict, it is now v2", an agent deciding again from current builds this very attempt: a fixed point.
    const { plan, step, written } = await run(p, atV2, ledger);
    expect(plan.kind).toBe("repeat-conflict");
    expect(written).toBe(true);
    expect(reply(step)).toMatchObject({ status: "applied", duplicate: false, version: version(3) });
    expect(sor.patchCount(T1)).toBe(1);
    expect(ledger.get(atV2.intent.intentKey)).toMatchObject({ status: "done", cycles: 2, outcome: { status: "applied" } });
    // Its repeats are answered from the ledger, and nothing is written again.
    const again = await run(p, close({ base: version(2) }), ledger);
    expect(reply(again.step)).toMatchObject({ status: "applied", duplicate: true });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("counts a cycle when that write meets a conflict, so the key still escalates after its last one", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    const atV2 = await conflictedHoldingAttemptAtV2(p, ledger);
    sor.script.patch.push({ kind: "changed-first", ops: [{ op: "add", path: "/tags/-", value: "raced" }] });
    const { step, written } = await run(p, atV2, ledger);
    expect(written).toBe(true);
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "conflict_cycles_exhausted" });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("waits (retry-later) when the record cannot be read now", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    await conflicted(p, ledger);
    sor.script.read.push({ kind: "throw", error: outage() });
    const plan = p.classify(close(), ledger);
    if (plan.kind !== "repeat-conflict") throw new Error(plan.kind);
    const step = await p.repeatConflict(close(), plan, ctx);
    if (step.kind === "write") throw new Error("written without a read");
    expectRetryLater(step);
  });

  it("falls back to the stored version, without state, when the read breaks the protocol", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    await conflicted(p, ledger);
    sor.script.read.push({ kind: "throw", error: protocolError() });
    const { step } = await run(p, close(), ledger);
    expect(reply(step)).toMatchObject({ status: "conflict", duplicate: true, cycle: 1, current: { state: null, version: version(2) } });
  });
});

describe("IntentPipeline.execute (steps 4–5: read, check, PATCH, reconcile)", () => {
  it("applies via one If-Match PATCH carrying the intent key and the owner's headers", async () => {
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(step).toMatchObject({ kind: "settled", note: "applied via patch" });
    expect(reply(step)).toEqual({
      status: "applied",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at: NOW.toISOString(),
      entity: T1,
      state: { status: "closed", tags: [], notes: [] },
      version: version(2),
      via: "patch",
      tool: "set_status",
    });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "applied", version: version(2), via: "patch" } });
    expect(sor.patches).toEqual([
      { entity: "ticket:T-1", ops: a.intent.delta, ifMatch: version(1), idempotencyKey: a.intent.intentKey, headers: { "x-writ-owner": "owner-test" } },
    ]);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("answers a strict intent on a changed record with a conflict (current, your_change, cycle) and does not write", async () => {
    sor.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
    const a = close();
    const ledger = new PartitionLedger(0);
    const { step } = await run(pipelineWith(), a, ledger);
    const r = reply(step);
    expect(r).toMatchObject({
      status: "conflict",
      duplicate: false,
      cycle: 1,
      current: { state: { status: "pending", tags: [], notes: [] }, version: version(2) },
      your_change: a.intent.delta,
    });
    expect((r as { message: string }).message).toContain(`you read ${version(1)}, it is now ${version(2)}`);
    expect(settled(step).ledger).toMatchObject({ status: "conflicted", cycles: 1, outcome: { status: "conflict", cycle: 1, version: version(2) } });
    expect(ledger.get(a.intent.intentKey)?.status).toBe("conflicted");
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("applies a rebase-commutative append on a changed record with If-Match of the fresh version", async () => {
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "urgent" }]);
    const { step } = await run(pipelineWith(), tag("vip"), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", version: version(3), state: { tags: ["urgent", "vip"] }, via: "patch" });
    expect(sor.patches.map((x) => x.ifMatch)).toEqual([version(2)]);
  });

  it("treats a non-append change of a rebase-commutative tool as strict: conflict on a changed record", async () => {
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "urgent" }]);
    const a = intentFor("tag_ticket", { tag: "only" }, [{ op: "replace", path: "/tags", value: ["only"] }]);
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "conflict", cycle: 1 });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("turns a 412 (the record changed between read and PATCH) into a conflict with the record the 412 carried", async () => {
    sor.script.patch.push({ kind: "changed-first", ops: [{ op: "replace", path: "/status", value: "pending" }] });
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "conflict", cycle: 1, current: { version: version(2), state: { status: "pending" } } });
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });

  it("answers a rebase-commutative append that meets a 412 with a conflict, without a second PATCH", async () => {
    sor.script.patch.push({ kind: "changed-first", ops: [{ op: "add", path: "/tags/-", value: "urgent" }] });
    const a = tag("vip");
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "conflict", cycle: 1, current: { version: version(2), state: { tags: ["urgent"] } } });
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });

  it("re-reads the record after a 412 that carried none, and conflicts with what it read", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: null }, changeFirst: [{ op: "replace", path: "/status", value: "pending" }] });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "conflict", current: { version: version(2), state: { status: "pending" } } });
    expect(sor.reads).toHaveLength(2);
  });

  it("waits when the re-read after a bare 412 meets an outage, and rejects sor_protocol when it breaks the protocol", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: null } });
    sor.script.read.push({ kind: "ok" }, { kind: "throw", error: outage() });
    expectRetryLater(await p.execute(a, plan.pending, plan.state, ctx));

    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: null } });
    sor.script.read.push({ kind: "ok" }, { kind: "throw", error: protocolError() });
    const step = checked(await p.execute(a, plan.pending, plan.state, ctx));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "sor_protocol" });
    expect(sor.patchCount(T1)).toBe(2);
  });

  it("escalates conflict_cycles_exhausted past the tool's limit (2), with an escalation for a person", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    // each decision of the agent meets a record that changed again
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "a" }]); // "2"
    expect(reply((await run(p, close({ base: version(1) }), ledger)).step)).toMatchObject({ status: "conflict", cycle: 1 });
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "b" }]); // "3"
    expect(reply((await run(p, close({ base: version(2) }), ledger)).step)).toMatchObject({ status: "conflict", cycle: 2 });
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "c" }]); // "4"
    const third = close({ base: version(3) });
    const { step } = await run(p, third, ledger);
    const r = reply(step);
    expect(r).toMatchObject({ status: "escalated", reason: "conflict_cycles_exhausted" });
    const e = settled(step);
    expect(e.escalations).toHaveLength(1);
    expect(e.escalations[0]).toMatchObject({
      key: "ticket:T-1",
      value: { reason: "conflict_cycles_exhausted", cycles: 3, current: { version: version(4) }, intent: { intentId: third.intent.intentId } },
    });
    expect(e.escalations[0]!.value.escalationId).toBe((r as { escalationId: string }).escalationId);
    expect(e.ledger).toMatchObject({ status: "done", cycles: 3, outcome: { status: "escalated", reason: "conflict_cycles_exhausted" } });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("rejects entity_not_found when the record does not exist, without a PATCH", async () => {
    const { step } = await run(pipelineWith(), close({ entity: { type: "ticket", id: "nope" } }), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "entity_not_found" });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "entity_not_found" } });
    expect(sor.patches).toHaveLength(0);
  });

  it("rejects entity_not_found when the PATCH answers 404 (deleted between read and write)", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "not_found" } });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "entity_not_found" });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it.each([
    [409, "patch_not_applicable"],
    [422, "patch_not_applicable"],
    [400, "sor_rejected"],
    [403, "sor_rejected"],
  ] as const)("answers a PATCH refused with %i as rejected %s, with the status in details", async (status, reason) => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "rejected", status, message: "no" } });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "rejected", reason, details: { status } });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason } });
    expect(settled(step).escalations).toEqual([]);
  });

  it("pauses (retry-later, notSent) on a PATCH that never reached the system, escalates nothing, and applies on the next try", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "ECONNREFUSED" } });
    const first = await p.execute(a, plan.pending, plan.state, ctx);
    expect(first).toEqual({ kind: "retry-later", reason: "ECONNREFUSED", notSent: true });
    expect(plan.state).toMatchObject({ mayHaveWritten: false, unknownRounds: 0 });
    const second = checked(await p.execute(a, plan.pending, plan.state, ctx));
    expect(reply(second)).toMatchObject({ status: "applied", via: "patch" });
    expect(settled(second).escalations).toEqual([]);
    expect(sor.lookups).toHaveLength(0);
    expect(sor.patchCount(T1)).toBe(2);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("pauses on a read outage without a PATCH", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.read.push({ kind: "throw", error: outage("503 Service Unavailable") });
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "503 Service Unavailable", notSent: true });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("a Retry-After reaches the pause: on a read outage, an unavailable PATCH and a reconcile's outage", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    const limited = new WritError("sor_unavailable", "429 slow down", { retriable: true, context: { status: 429, retryAfterMs: 2000 } });
    sor.script.read.push({ kind: "throw", error: limited });
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "429 slow down", notSent: true, retryAfterMs: 2000 });
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "429: slow down", retryAfterMs: 3000 } });
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "429: slow down", notSent: true, retryAfterMs: 3000 });
    sor.script.patch.push({ kind: "commit-then-unknown" });
    sor.script.lookup.push({ kind: "throw", error: limited });
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toMatchObject({ kind: "retry-later", retryAfterMs: 2000 });
    expect(sor.patchCount(T1)).toBe(2);
  });

  it("a 5xx with Retry-After on a PATCH: unknown, and its reconcile waits for the pause (at once with sorRetryAfterMaxMs 0)", async () => {
    const answer = { kind: "answer" as const, outcome: { kind: "unknown" as const, message: "503: busy", retryAfterMs: 5000 } };
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push(answer);
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "503: busy", notSent: false, retryAfterMs: 5000 });
    expect(plan.state).toMatchObject({ mayHaveWritten: true, unknownRounds: 1 });
    expect(sor.lookups).toHaveLength(0);
    // The next try reconciles first ("not applied": nothing committed) and writes again.
    expect(reply(checked(await p.execute(a, plan.pending, plan.state, ctx)))).toMatchObject({ status: "applied", via: "patch" });
    expect(sor.lookups).toHaveLength(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);

    // Retry-After ignored: reconciled at once, as for any unknown outcome.
    const ignoring = pipelineWith({ config: { unknownRounds: 3, sorRetryAfterMaxMs: 0 } });
    const b = close({ intentId: "intent-b", stepId: "step-b", base: version(2) });
    const planB = writePlan(ignoring.classify(b, new PartitionLedger(0)));
    sor.script.patch.push(answer);
    const step = checked(await ignoring.execute(b, planB.pending, planB.state, ctx));
    expect(reply(step)).toMatchObject({ status: "applied" });
    expect(sor.lookups).toHaveLength(2);
  });

  it("treats a sor_unavailable error marked not retriable as a protocol break, not an outage", async () => {
    sor.script.read.push({ kind: "throw", error: new WritError("sor_unavailable", "odd", { retriable: false }) });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "sor_protocol" });
  });

  it("rejects sor_protocol on a read that breaks the protocol when nothing may have been written", async () => {
    sor.script.read.push({ kind: "throw", error: protocolError("weak ETag") });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "sor_protocol" });
    expect((reply(step) as { message: string }).message).toContain("weak ETag");
    expect(settled(step).escalations).toEqual([]);
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "sor_protocol" } });
  });

  it("escalates sor_protocol on such a read when the intent was inherited (it may have written)", async () => {
    const a = close();
    const ledger = inheritedLedger(a);
    // reconcile's read is fine and proves "not applied" (the PATCH goes on that read); the PATCH meets a 412
    // without the record, and the read after it breaks the protocol
    sor.script.read.push({ kind: "ok" }, { kind: "throw", error: protocolError("no ETag") });
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: null } });
    const { step } = await run(pipelineWith(), a, ledger);
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "sor_protocol" });
    expect(settled(step).escalations).toHaveLength(1);
    expect(settled(step).escalations[0]!.value).toMatchObject({ reason: "sor_protocol", current: null });
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });
});

describe("IntentPipeline: a custom adapter's version writ cannot keep (over 256 characters)", () => {
  const long = `"${"v".repeat(10_000)}"`;

  it("rejects sor_protocol on a read answering such a version, without a PATCH, every record within its schema", async () => {
    const read = sor.read.bind(sor);
    sor.read = async (entity, opts) => {
      const r = await read(entity, opts);
      return r && { ...r, version: long };
    };
    // Both a strict tool (the version differs from the base) and a rebase-commutative one (it would If-Match on it).
    for (const a of [close(), tag("x")]) {
      const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
      expect(reply(step)).toMatchObject({ status: "rejected", reason: "sor_protocol" });
      expect((reply(step) as { message: string }).message).toContain("a version of 10002 characters");
      expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "sor_protocol" } });
      expect(Buffer.byteLength(JSON.stringify(settled(step).ledger))).toBeLessThan(10_000);
    }
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("escalates sor_protocol (a write was made) on a PATCH answered applied with such a version", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "applied", state: { status: "closed" }, version: long } });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "sor_protocol" });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "escalated", reason: "sor_protocol", mayHaveWritten: true } });
    expect(settled(step).escalations[0]!.value).toMatchObject({ reason: "sor_protocol", current: null, mayHaveWritten: true });
  });

  it("rejects sor_protocol on a 412 carrying such a version, and a version that is no string", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: { state: {}, version: long } } });
    const first = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(first.step)).toMatchObject({ status: "rejected", reason: "sor_protocol" });
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: { state: {}, version: 7 as unknown as string } } });
    const second = await run(pipelineWith(), close({ stepId: "step-2" }), new PartitionLedger(0));
    expect((reply(second.step) as { message: string }).message).toContain("no string (number)");
  });
});

describe("IntentPipeline: inherited pending and unknown outcomes (reconcile, never replay)", () => {
  it("settles an inherited intent whose earlier PATCH committed as applied via reconcile, without writing again", async () => {
    const a = close();
    sor.change(T1, a.intent.delta, a.intent.intentKey); // the earlier owner's PATCH
    const { step } = await run(pipelineWith(), close({ intentId: "resubmitted" }), inheritedLedger(a));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile", version: version(2), state: { status: "closed" } });
    expect(sor.patchCount(T1)).toBe(0);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("writes an inherited intent that reconcile proves not applied", async () => {
    const a = close();
    const { step } = await run(pipelineWith(), a, inheritedLedger(a));
    expect(reply(step)).toMatchObject({ status: "applied", via: "patch" });
    expect(sor.lookups).toEqual([a.intent.intentKey]);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("settles a PATCH that committed but whose answer was lost as applied via reconcile (one PATCH)", async () => {
    sor.script.patch.push({ kind: "commit-then-unknown" });
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile", version: version(2), state: { status: "closed" } });
    expect(settled(step).ledger).toMatchObject({ outcome: { status: "applied", via: "reconcile" } });
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("writes again after an unknown outcome that reconcile proves not applied", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", via: "patch" });
    expect(sor.lookups).toHaveLength(1);
    expect(sor.patchCount(T1)).toBe(2);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("escalates outcome_unknown when reconcile cannot tell, with the record it read", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    sor.script.lookup.push({ kind: "answer", result: "unknown" });
    const { step } = await run(pipelineWith(), close(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "outcome_unknown" });
    expect(settled(step).escalations[0]).toMatchObject({ key: "ticket:T-1", value: { reason: "outcome_unknown", current: { version: version(1) } } });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "escalated", reason: "outcome_unknown" } });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("pauses (never escalates) when reconcile meets an outage, and settles from reconcile once it answers", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "commit-then-unknown" });
    sor.script.lookup.push({ kind: "throw", error: outage("lookup timed out") }, { kind: "throw", error: outage("lookup timed out") });
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "lookup timed out", notSent: true });
    expect(plan.state).toMatchObject({ mayHaveWritten: true, unknownRounds: 1 });
    // the reconcile's read fails too on the next try
    sor.script.read.push({ kind: "throw", error: outage() });
    expectRetryLater(await p.execute(a, plan.pending, plan.state, ctx));
    expectRetryLater(await p.execute(a, plan.pending, plan.state, ctx));
    const step = checked(await p.execute(a, plan.pending, plan.state, ctx));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile" });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("escalates outcome_unknown once the unknown rounds are used up, after exactly that many PATCHes", async () => {
    const p = pipelineWith({ config: { unknownRounds: 2 } });
    for (let i = 0; i < 5; i++) sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    const a = close();
    const { step } = await run(p, a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "outcome_unknown" });
    expect(sor.patchCount(T1)).toBe(2);
    expect(sor.lookups).toHaveLength(2);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });

  it("reconciles a conflict met after an unknown round first: the change was its own, applied via reconcile", async () => {
    // the first PATCH commits but its answer is lost; the lookup, asked too early, says not applied
    sor.script.patch.push({ kind: "commit-then-unknown" });
    sor.script.lookup.push({ kind: "answer", result: "not_applied" });
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile", version: version(2) });
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("answers a conflict after an unknown round that reconcile proves not its own", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" }, changeFirst: [{ op: "replace", path: "/status", value: "pending" }] });
    const a = close();
    const { step } = await run(pipelineWith(), a, new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "conflict", cycle: 1, current: { version: version(2), state: { status: "pending" } } });
    expect(sor.lookups).toHaveLength(2);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });

  it("reconciles an inherited intent meeting a 412 first: the earlier owner's late write landed, applied via reconcile", async () => {
    const a = close();
    // reconcile (asked while the earlier owner's request was still in flight) says not applied; that request
    // lands just before ours, which meets a 412
    sor.script.lookup.push({ kind: "answer", result: "not_applied" });
    sor.script.patch.push({ kind: "changed-first", ops: a.intent.delta, idempotencyKey: a.intent.intentKey });
    const { step } = await run(pipelineWith(), a, inheritedLedger(a));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile", version: version(2), state: { status: "closed" } });
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
  });

  it("reconciles an inherited intent meeting a strict version mismatch first", async () => {
    const a = close();
    sor.change(T1, a.intent.delta, a.intent.intentKey); // the earlier owner's write, already in
    sor.script.lookup.push({ kind: "answer", result: "not_applied" }); // a lookup that lags behind
    const { step } = await run(pipelineWith(), a, inheritedLedger(a));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile" });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("escalates (never writes) an inherited intent whose reconcile read breaks the protocol: the outcome stays unknown", async () => {
    const a = close();
    sor.script.read.push({ kind: "throw", error: protocolError() });
    const { step } = await run(pipelineWith(), a, inheritedLedger(a));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "outcome_unknown" });
    expect(sor.lookups).toHaveLength(0);
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("does not PATCH while ownership is unconfirmed (mayWrite false): retry-later, then writes once confirmed", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    const step = await p.execute(a, plan.pending, plan.state, { ...ctx, mayWrite: () => false });
    expectRetryLater(step);
    expect(step).toMatchObject({ reason: expect.stringContaining("ownership") });
    expect(sor.patches).toHaveLength(0);
    expect(reply(checked(await p.execute(a, plan.pending, plan.state, ctx)))).toMatchObject({ status: "applied" });
    expect(sor.patchCount(T1)).toBe(1);
  });
});

describe("IntentPipeline with a reconcile function", () => {
  it("settles an unknown outcome from the record (the note is there): applied via reconcile", async () => {
    sor.script.patch.push({ kind: "commit-then-unknown" });
    const { step } = await run(pipelineWith(), note(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile", state: { notes: [{ id: "n1" }] } });
    expect(noteReconcileCalls).toBe(1);
    expect(sor.lookups).toHaveLength(0);
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("escalates outcome_unknown when the reconcile function throws (a bug), without writing again", async () => {
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    noteReconcile.push(new TypeError("cannot read properties of undefined"));
    const { step } = await run(pipelineWith(), note(), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "outcome_unknown" });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("pauses when the reconcile function throws sor_unavailable", async () => {
    const p = pipelineWith();
    const a = note();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    noteReconcile.push(outage("search index down"));
    expect(await p.execute(a, plan.pending, plan.state, ctx)).toEqual({ kind: "retry-later", reason: "search index down", notSent: true });
    const step = checked(await p.execute(a, plan.pending, plan.state, ctx));
    expect(reply(step)).toMatchObject({ status: "applied", via: "patch" });
    expect(sor.patchCount(T1)).toBe(2);
    expect(sor.current(T1)?.state).toMatchObject({ notes: [{ id: "n1" }] });
  });
});

describe("IntentPipeline.failed (processing kept failing)", () => {
  it("escalates processing_failed when the intent may have written", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, inheritedLedger(a)));
    const step = checked(p.failed(a, plan.pending, plan.state, new Error("boom")));
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "processing_failed", message: "processing failed: boom" });
    expect(settled(step).escalations).toHaveLength(1);
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "escalated", reason: "processing_failed" } });
  });

  it("escalates processing_failed after an unknown round of its own", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    sor.script.lookup.push({ kind: "throw", error: outage() });
    expectRetryLater(await p.execute(a, plan.pending, plan.state, ctx));
    expect(reply(p.failed(a, plan.pending, plan.state, "weird"))).toMatchObject({ status: "escalated", reason: "processing_failed" });
  });

  it("rejects processing_failed, with a done ledger entry, when its pending entry is durable but nothing was sent", () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    const step = checked(p.failed(a, plan.pending, plan.state, new Error("boom")));
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "processing_failed" });
    expect(settled(step).ledger).toMatchObject({ status: "done", outcome: { status: "rejected", reason: "processing_failed" } });
    expect(settled(step).escalations).toEqual([]);
  });

  it("rejects processing_failed without a ledger entry when there was no pending entry", () => {
    const step = checked(pipelineWith().failed(close(), null, null, new Error("x".repeat(5_000))));
    const r = reply(step);
    expect(r).toMatchObject({ status: "rejected", reason: "processing_failed" });
    expect((r as { message: string }).message.length).toBeLessThanOrEqual(2_000);
    expect(settled(step).ledger).toBeUndefined();
  });
});

describe("IntentPipeline with an adapter whose PATCH throws (breaks the PatchOutcome contract)", () => {
  it("a PATCH that throws without committing is reconciled, proven not applied, and written again once", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "throw", error: new TypeError("adapter bug") });
    const step = await p.execute(a, plan.pending, plan.state, ctx);
    expect(sor.patchCount(T1)).toBe(2);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
    expect(reply(step)).toMatchObject({ status: "applied", via: "patch" });
  });

  // An adapter that throws from patch() breaks the PatchOutcome contract, but the request may have gone out:
  // the pipeline treats the throw as an unknown outcome and reconciles before anything else.
  it("a PATCH that throws after committing is an unknown outcome: reconciled to applied, written once", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "commit-then-throw", error: new TypeError("cannot read properties of undefined (reading 'etag')") });
    const step = await p.execute(a, plan.pending, plan.state, ctx);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
    expect(plan.state.mayHaveWritten).toBe(true);
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile" });
    expect(reply(p.failed(a, plan.pending, plan.state, new Error("later failure")))).toMatchObject({ status: "escalated", reason: "processing_failed" });
  });

  it("an append whose PATCH threw is not appended twice (a rebase-commutative If-Match would not stop a blind replay)", async () => {
    const p = pipelineWith();
    const a = tag("vip");
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "commit-then-throw", error: new TypeError("adapter bug after the response") });
    await p.execute(a, plan.pending, plan.state, ctx);
    await p.execute(a, plan.pending, plan.state, ctx);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
    expect(sor.current(T1)?.state).toMatchObject({ tags: ["vip"] });
  });

  it("an append whose earlier request lands just after reconcile's 'not applied' is written once: the PATCH goes on reconcile's read", async () => {
    const a = tag("vip");
    const ledger = inheritedLedger(a);
    // The earlier owner's PATCH is still on its way: the lookup does not find it, then it commits.
    const lookup = sor.lookupIdempotencyKey.bind(sor);
    let landed = false;
    sor.lookupIdempotencyKey = async (entity, key, opts) => {
      const answer = await lookup(entity, key, opts);
      if (!landed) {
        landed = true;
        sor.change(T1, a.intent.delta, a.intent.intentKey);
      }
      return answer;
    };
    const { step } = await run(pipelineWith(), a, ledger);
    // A second read would see the record with the change in it, and a commutative tool rebases onto any version.
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
    expect(sor.current(T1)?.state).toMatchObject({ tags: ["vip"] });
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile" });
  });

  it("a refusal after an unknown outcome is reconciled, not taken for the answer (409: this key is in progress)", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, new PartitionLedger(0)));
    // The first request times out still in flight; the lookup finds nothing; the second meets the system's 409
    // for a key in use; then the first commits.
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } });
    sor.script.patch.push({ kind: "answer", outcome: { kind: "rejected", status: 409, message: "a request with this key is in progress" } });
    const patch = sor.patch.bind(sor);
    sor.patch = async (entity, ops, opts) => {
      const outcome = await patch(entity, ops, opts);
      if (outcome.kind === "rejected") sor.change(T1, a.intent.delta, a.intent.intentKey);
      return outcome;
    };
    const step = await p.execute(a, plan.pending, plan.state, ctx);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(1);
    expect(reply(step)).toMatchObject({ status: "applied", via: "reconcile" });
  });
});

describe("a refusal after an unknown outcome, confirmed by the reconcile after it", () => {
  it("an inherited pending whose retry is refused (422) and then found not applied: rejected, the refusal is the answer", async () => {
    const p = pipelineWith();
    const a = close();
    // An earlier owner left the key pending (it was killed after sending); its request was refused by the system.
    const plan = writePlan(p.classify(a, inheritedLedger(a)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "rejected", status: 422, message: "notes are closed on this ticket" } });
    const step = await p.execute(a, plan.pending, plan.state, ctx);
    expect(reply(step)).toMatchObject({ status: "rejected", reason: "patch_not_applicable" });
    expect(sor.patches).toHaveLength(1);
    expect(sor.commitsOf(a.intent.intentKey)).toBe(0);
  });

  it("a 409 (the key in use) is not taken for the answer: more rounds, then escalated outcome_unknown", async () => {
    const p = pipelineWith();
    const a = close();
    const plan = writePlan(p.classify(a, inheritedLedger(a)));
    for (let i = 0; i < 5; i++) sor.script.patch.push({ kind: "answer", outcome: { kind: "rejected", status: 409, message: "a request with this key is in progress" } });
    const step = await p.execute(a, plan.pending, plan.state, ctx);
    expect(reply(step)).toMatchObject({ status: "escalated", reason: "outcome_unknown" });
  });
});

describe("IntentPipeline ablations (fault-suite controls)", () => {
  it("without ablation, a resubmitted append is answered from the ledger: one effect", async () => {
    const p = pipelineWith();
    const ledger = new PartitionLedger(0);
    await run(p, tag("vip"), ledger);
    await run(p, tag("vip", { intentId: "again" }), ledger);
    expect(sor.commitsOf(tag("vip").intent.intentKey)).toBe(1);
    expect(sor.current(T1)?.state).toMatchObject({ tags: ["vip"] });
  });

  it("ablateLedger: every submission has a ledger key of its own, so a repeat is written again", async () => {
    const p = pipelineWith({ ablateLedger: true });
    const ledger = new PartitionLedger(0);
    const first = tag("vip", { intentId: "one" });
    const second = tag("vip", { intentId: "two" });
    expect(p.ledgerKey(first)).not.toBe(p.ledgerKey(second));
    expect(reply((await run(p, first, ledger)).step)).toMatchObject({ status: "applied", duplicate: false });
    expect(reply((await run(p, second, ledger)).step)).toMatchObject({ status: "applied", duplicate: false });
    expect(sor.commitsOf(first.intent.intentKey)).toBe(2);
    expect(sor.current(T1)?.state).toMatchObject({ tags: ["vip", "vip"] });
  });

  it("ablateVersionCheck: a stale strict intent is applied on the current version (a lost update)", async () => {
    sor.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
    const { step } = await run(pipelineWith({ ablateVersionCheck: true }), close({ base: version(1) }), new PartitionLedger(0));
    expect(reply(step)).toMatchObject({ status: "applied", version: version(3) });
    expect(sor.patches.map((x) => x.ifMatch)).toEqual([version(2)]);
  });
});

describe("IntentPipeline under random faults", () => {
  // `lands-later`: a request still on its way when the owner stops waiting, arriving (checked against If-Match as
  // it arrives) after the system's next few calls, during a pause, or only after the answer (no `after`).
  const landsLater = fc.oneof(
    fc.integer({ min: 1, max: 6 }).map<PatchFault>((after) => ({ kind: "lands-later", after })),
    fc.constant<PatchFault>({ kind: "lands-later" }),
  );
  const patchFault = fc.oneof(
    fc.constant<PatchFault>({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } }),
    fc.constant<PatchFault>({ kind: "commit-then-unknown" }),
    { arbitrary: fc.constant<PatchFault>({ kind: "answer", outcome: { kind: "unavailable", message: "refused" } }), weight: 2 },
    fc.constant<PatchFault>({ kind: "changed-first", ops: [{ op: "add", path: "/tags/-", value: "other" }] }),
    { arbitrary: landsLater, weight: 3 },
  );

  /** Tries the intent until it settles, as the owner does (an outage pauses it; `refusals`: mayWrite() answers false). */
  async function settle(p: IntentPipeline, a: AdmittedIntent, plan: Extract<Plan, { kind: "write" }>, refusals: boolean[]): Promise<Step> {
    const c: ExecContext = { ...ctx, mayWrite: () => !(refusals.shift() ?? false) };
    for (let i = 0; i < 100; i++) {
      const step = checked(await p.execute(a, plan.pending, plan.state, c));
      if (step.kind === "settled") return step;
    }
    throw new Error("not settled after 100 tries");
  }

  it("an append never takes effect twice, and it took effect exactly when the reply says applied", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.array(patchFault, { maxLength: 8 }),
        fc.array(fc.boolean(), { maxLength: 6 }),
        fc.array(fc.boolean(), { maxLength: 6 }),
        fc.array(fc.boolean(), { maxLength: 4 }),
        fc.boolean(),
        async (patches, lookupOutages, readOutages, refusals, inherited) => {
          sor = new FakeSystem("helpdesk");
          tools = admitTools([setStatus, tagTicket, addNote], [sor], { sorTimeoutMs: 1_000 });
          sor.seed(T1, { status: "open", tags: [], notes: [] });
          sor.script.patch.push(...patches);
          for (const o of lookupOutages) if (o) sor.script.lookup.push({ kind: "throw", error: outage() });
          for (const o of readOutages) if (o) sor.script.read.push({ kind: "throw", error: outage() });
          const p = pipelineWith();
          const a = tag("vip");
          const plan = writePlan(p.classify(a, inherited ? inheritedLedger(a) : new PartitionLedger(0)));
          const step = await settle(p, a, plan, refusals);
          const effectsOfIntent = sor.commitsOf(a.intent.intentKey);
          expect(effectsOfIntent).toBeLessThanOrEqual(1);
          // the lookup tells the truth (when it answers), so the reply says what happened
          const r = reply(step);
          expect(effectsOfIntent).toBe(r.status === "applied" ? 1 : 0);
          if (r.status !== "applied") expect(["conflict", "escalated"]).toContain(r.status);
          if (r.status === "escalated") expect(r.reason).toBe("outcome_unknown");
          // The requests still on their way arrive. After an applied or a conflict they meet a version they do not
          // name (these versions never come back); only an escalated outcome_unknown may still see one land.
          sor.landHeld();
          const atLast = sor.commitsOf(a.intent.intentKey);
          expect(atLast).toBeLessThanOrEqual(1);
          if (r.status !== "escalated") expect(atLast).toBe(effectsOfIntent);
          const tags = (sor.current(T1)!.state as { tags: string[] }).tags;
          expect(tags.filter((t) => t === "vip")).toHaveLength(atLast);
        },
      ),
      { numRuns: 300 },
    );
  });

  it("versions that come back (an ETag hashed from the record): the agent's next attempt after a conflict never writes the key twice", async () => {
    // Another writer flips the status (and may flip it back between the attempts): the record, and so its version,
    // can be again what a request still on its way names in its If-Match.
    const abaFault = fc.oneof(
      fc.constant<PatchFault>({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } }),
      fc.constant<PatchFault>({ kind: "answer", outcome: { kind: "unavailable", message: "refused" } }),
      { arbitrary: fc.constant<PatchFault>({ kind: "changed-first", ops: [{ op: "replace", path: "/status", value: "pending" }] }), weight: 2 },
      { arbitrary: landsLater, weight: 2 },
    );
    await fc.assert(
      fc.asyncProperty(fc.array(abaFault, { maxLength: 8 }), fc.array(fc.boolean(), { maxLength: 4 }), fc.boolean(), async (patches, refusals, flipBack) => {
        sor = new FakeSystem("helpdesk", { idempotencyKeys: false, idempotencyLookup: true }, { etags: "content" });
        tools = admitTools([setStatus, tagTicket, addNote], [sor], { sorTimeoutMs: 1_000 });
        const base = sor.seed(T1, { status: "open", tags: [], notes: [] });
        sor.script.patch.push(...patches);
        const p = pipelineWith();
        const ledger = new PartitionLedger(0);
        const first = tag("vip", { base });
        const key = first.intent.intentKey;
        const plan1 = writePlan(p.classify(first, ledger));
        commit(ledger, plan1.pending);
        const step1 = await settle(p, first, plan1, refusals);
        commit(ledger, settled(step1).ledger);
        const r1 = reply(step1);
        expect(sor.commitsOf(key)).toBe(r1.status === "applied" ? 1 : 0);
        if (r1.status !== "conflict") return;
        if (flipBack) sor.change(T1, [{ op: "replace", path: "/status", value: "open" }]);
        sor.landHeld();
        // The agent decides again from the conflict's record, with the same intent key.
        const again = tag("vip", { base: r1.current.version, intentId: "again" });
        const plan2 = writePlan(p.classify(again, ledger));
        commit(ledger, plan2.pending);
        const r2 = reply(await settle(p, again, plan2, refusals));
        if (r2.status === "applied") expect(sor.commitsOf(key)).toBe(1);
        sor.landHeld();
        expect(sor.commitsOf(key)).toBeLessThanOrEqual(1);
        expect((sor.current(T1)!.state as { tags: string[] }).tags.filter((t) => t === "vip")).toHaveLength(sor.commitsOf(key));
      }),
      { numRuns: 300 },
    );
  });
});
