// runIntent (src/owner/intent-run.ts) on a repeat of a conflicted attempt whose record is at the attempt's own base
// version: the attempt is written after all, through the owner's run (its gate asked as a write's), unless its signed
// bytes were refused before: a refusal remembered for them stands, whatever the state now (docs/architecture.md §9.1).
import { pino } from "pino";
import { beforeEach, describe, expect, it } from "vitest";
import { z } from "zod";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import type { Effects } from "../../../src/owner/effects.ts";
import { type ExecContext, IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import { type RunHost, runIntent } from "../../../src/owner/intent-run.ts";
import type { Session, Slot } from "../../../src/owner/owner-session.ts";
import type { LeaseGate } from "../../../src/owner/record-leases.ts";
import type { LedgerLeaseEntry } from "../../../src/schemas/ledger-entry.ts";
import { type AdmittedTool, admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";
import { commit, runPlan, setStatus, writePlan } from "./pipeline-fixtures.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const log = pino({ level: "silent" });
const T1 = { type: "ticket", id: "T-1" };
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };
const DIGEST = "a".repeat(64);


let sor: FakeSystem;
let tools: Map<string, AdmittedTool>;
let submissions = 0;

beforeEach(() => {
  sor = new FakeSystem("helpdesk");
  tools = admitTools([setStatus], [sor], { sorTimeoutMs: 1_000 });
  sor.seed(T1, { status: "open" });
});

function close(base = version(1), opts: { intentId?: string; signed?: string } = {}): AdmittedIntent {
  const tool = tools.get("set_status")!;
  const params = { status: "closed" };
  const delta = [{ op: "replace" as const, path: "/status", value: "closed" }];
  const key = intentKey({ agentId: "agent-1", tool: { name: tool.name, keyScope: tool.keyScope, intentFields: tool.declaration.intentFields }, runId: "run-1", stepId: "step-1", entity: T1, params });
  return {
    intent: {
      intentId: opts.intentId ?? `intent-${++submissions}`,
      intentKey: key,
      entity: T1,
      tool: tool.name,
      agent: { id: "agent-1", runId: "run-1", stepId: "step-1" },
      baseVersion: base,
      delta,
      params,
      replyTo: "writ.replies.agent-1",
      createdAt: NOW.toISOString(),
    },
    tool,
    entityKey: "ticket:T-1",
    fingerprint: paramsFingerprint(tool.name, T1, params, tool.freeTextParams),
    deltaFingerprint: deltaFingerprint(delta, tool.isFreeTextPath),
    params,
    ...(opts.signed ? { signed: opts.signed } : {}),
  };
}

/**
 * The entry as a restore leaves it when an older submission runs first (intent-pipeline.test.ts tells it step by
 * step): conflicted at v2, cycle 2, holding the never-answered attempt built on v2; the record at v2.
 */
async function conflictedHoldingAttemptAtV2(p: IntentPipeline, ledger: PartitionLedger): Promise<void> {
  sor.change(T1, [{ op: "replace", path: "/status", value: "pending" }]);
  const first = await runPlan(p, close(), ledger, ctx);
  commit(ledger, first.step.kind === "settled" ? first.step.effects.ledger : undefined);
  commit(ledger, writePlan(p.classify(close(version(2)), ledger)).pending);
  const older = await runPlan(p, close(), ledger, ctx);
  commit(ledger, older.step.kind === "settled" ? older.step.effects.ledger : undefined);
  expect(ledger.get(close().intent.intentKey)).toMatchObject({ status: "conflicted", cycles: 2, outcome: { version: version(2) } });
}

/** A partition owner around runIntent: one session, results committed as they settle, the lease gate given. */
function owner(p: IntentPipeline, ledger: PartitionLedger, gate: () => LeaseGate) {
  const settled: Effects[] = [];
  const session = { active: true, seq: 1, ledger } as unknown as Session;
  const host = {
    ctx: { pipeline: p, config: { instanceId: "owner-test", maxProcessingAttempts: 3, topics: { intents: "writ.intents" } }, lease: { confirmed: () => true }, health: { outage() {} } },
    log,
    partition: 0,
    resolver: {},
    stagePending: async (_s: Session, entry: Parameters<PartitionLedger["stage"]>[0]) => commit(ledger, entry),
    settle: async (_s: Session, _slot: Slot, result: Effects) => {
      settled.push(result);
      if (result.refusal) ledger.stageRefusal(result.refusal);
      if (result.ledger) ledger.stage(result.ledger);
      ledger.takeStaged();
      ledger.committedSending();
    },
    pause: async () => undefined,
    outagePause: async () => undefined,
    leaseGate: gate,
  } as unknown as RunHost;
  const run = async (a: AdmittedIntent) => {
    const slot = { seq: 1, offset: 0n, message: { offset: "0" }, admitted: a, pendingDurable: false, failures: 0, outages: 0, times: { accepted: 0 } } as unknown as Slot;
    await runIntent(host, session, slot);
    return settled.at(-1)!.replies[0]!.value;
  };
  return { run, settled };
}

const heldByAnother = (): LeaseGate => ({
  kind: "held",
  lease: { expiresAt: "2025-06-01T13:00:00.000Z", change: "other-change", agentId: "agent-2" } as unknown as LedgerLeaseEntry,
});

describe("runIntent: a repeat of a conflict whose record is at the attempt's own base version", () => {
  it("is written after all through the owner's run: applied, one PATCH", async () => {
    const p = new IntentPipeline({ config: { unknownRounds: 3 }, log, now: () => NOW });
    const ledger = new PartitionLedger(0);
    await conflictedHoldingAttemptAtV2(p, ledger);
    const { run } = owner(p, ledger, () => ({ kind: "free" }));
    expect(await run(close(version(2)))).toMatchObject({ status: "applied", duplicate: false });
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("asks the lease gate as a write does: refused while another change holds the record, nothing written", async () => {
    const p = new IntentPipeline({ config: { unknownRounds: 3 }, log, now: () => NOW });
    const ledger = new PartitionLedger(0);
    await conflictedHoldingAttemptAtV2(p, ledger);
    const { run } = owner(p, ledger, heldByAnother);
    expect(await run(close(version(2)))).toMatchObject({ status: "rejected", reason: "leased" });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("keeps a refusal remembered for its signed bytes: refused leased, the lease gone, the same bytes are refused again, never written", async () => {
    const p = new IntentPipeline({ config: { unknownRounds: 3 }, log, now: () => NOW });
    const ledger = new PartitionLedger(0);
    await conflictedHoldingAttemptAtV2(p, ledger);
    let gate: () => LeaseGate = heldByAnother;
    const { run, settled } = owner(p, ledger, () => gate());
    const bytes = () => close(version(2), { intentId: "intent-signed", signed: DIGEST });
    expect(await run(bytes())).toMatchObject({ status: "rejected", reason: "leased" });
    expect(settled.at(-1)!.refusal).toBeDefined();
    gate = () => ({ kind: "free" });
    expect(await run(bytes())).toMatchObject({ status: "rejected", reason: "leased", duplicate: true });
    expect(sor.patchCount(T1)).toBe(0);
    // Another submission (a new intent id) is decided on the state now: written.
    expect(await run(close(version(2), { intentId: "intent-new", signed: "b".repeat(64) }))).toMatchObject({ status: "applied" });
    expect(sor.patchCount(T1)).toBe(1);
  });
});
