// An escalation as an owner's ledger holds it, for the resolver's unit tests: a ticket on a fake system, an intent of
// `decl` on it (params {tag: "vip"}, read at version 1), its ledger entry escalated under "esc-1" after two conflict
// cycles, and an operator's `apply` of it on version 1.
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { ExecContext, Step } from "../../../src/owner/intent-pipeline.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import type { Resolution } from "../../../src/schemas/resolution.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { admitTools, type WriteToolDeclaration } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";

export const NOW = new Date("2025-06-01T12:00:00.000Z");
export const T1 = { type: "ticket", id: "T-1" };
/** The operator's reply topic. */
export const OPS_REPLIES = "writ.replies.ops";

/**
 * `status`: the entry `done` (open) or `pending` (an apply under way when its owner stopped); `state`: the ticket
 * at version 1; `delta`: the escalated intent's.
 */
export function escalatedCase(decl: WriteToolDeclaration<any>, opts: { status: "pending" | "done"; state: unknown; delta: JsonPatchOp[] }) {
  const sor = new FakeSystem("helpdesk");
  sor.seed(T1, opts.state);
  const tool = admitTools([decl], [sor], { sorTimeoutMs: 1_000 }).get(decl.name)!;
  const params = { tag: "vip" };
  const key = intentKey({ tool, agentId: "agent-1", runId: "r", stepId: "s", entity: T1, params });
  const intent: WriteIntent = {
    intentId: "i-1",
    intentKey: key,
    entity: T1,
    tool: tool.name,
    agent: { id: "agent-1", runId: "r", stepId: "s" },
    baseVersion: version(1),
    delta: opts.delta,
    params,
    replyTo: "writ.replies.agent-1",
    createdAt: NOW.toISOString(),
  };
  const entry: LedgerIntentEntry = {
    kind: "intent",
    intentKey: key,
    intentId: "i-1",
    status: opts.status,
    entity: T1,
    tool: tool.name,
    fingerprint: paramsFingerprint(tool.name, T1, params, tool.freeTextParams),
    attempts: [{ baseVersion: intent.baseVersion, deltaFingerprint: deltaFingerprint(intent.delta, tool.isFreeTextPath) }],
    cycles: 2,
    replyTo: intent.replyTo,
    updatedAt: NOW.toISOString(),
    outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: "three conflicts", escalationId: "esc-1", at: NOW.toISOString() },
  };
  const resolution: Resolution = {
    kind: "resolution",
    resolutionId: "res-1",
    escalationId: "esc-1",
    intent,
    decision: "apply",
    baseVersion: version(1),
    operator: { id: "ops" },
    replyTo: OPS_REPLIES,
    entity: T1,
    createdAt: NOW.toISOString(),
  };
  return { sor, tool, key, intent, entry, resolution, ledger: new PartitionLedger(0, [[key, entry]]) };
}

/**
 * The case of `escalatedCase` with `apply(delta?)`: an operator's apply of it planned and carried out by a resolver
 * at NOW (`delta` none: the tool's rebuilt change, or the agent's), on a partition that is the owner's.
 */
export function escalatedApply(decl: WriteToolDeclaration<any>, opts: Parameters<typeof escalatedCase>[1]) {
  const c = escalatedCase(decl, opts);
  const resolver = new Resolver({ now: () => NOW });
  const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };
  const apply = async (delta?: JsonPatchOp[]): Promise<Step> => {
    const r: Resolution = { ...c.resolution, ...(delta ? { delta } : {}) };
    const plan = resolver.plan(r, c.tool, OPS_REPLIES, c.ledger);
    if (plan.kind !== "apply") throw new Error(`planned ${plan.kind}: ${plan.note}`);
    return resolver.apply(r, c.tool, OPS_REPLIES, plan, ctx);
  };
  return { ...c, apply };
}
