// Shared by the owner's pipeline tests: a rebase-commutative tool (an append, written on whatever version it read:
// the shape a late duplicate hurts), and the owner's steps around the pipeline (a write plan; a transaction).
import { z } from "zod";
import type { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import type { ExecContext, IntentPipeline, Plan, Step } from "../../../src/owner/intent-pipeline.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { declareWriteTool } from "../../../src/tools.ts";

/** Appends a tag to a ticket of the `helpdesk` system; reconciled by the system's idempotency-key lookup. */
export const addTag = declareWriteTool({
  name: "add_tag",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"],
  allowedPaths: [{ path: "/tags/-", ops: ["add"] as const }],
  versionPolicy: "rebase-commutative",
  delta: (p) => [{ op: "add", path: "/tags/-", value: p.tag }],
  keyScope: "run",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

/** Sets a ticket's status: strict (a record changed since the agent read it is a conflict); no undo. */
export const setStatus = declareWriteTool({
  name: "set_status",
  recordType: "ticket",
  params: z.object({ status: z.enum(["open", "pending", "closed"]) }),
  intentFields: ["status"],
  allowedPaths: ["/status"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

export function writePlan(plan: Plan): Extract<Plan, { kind: "write" }> {
  if (plan.kind !== "write") throw new Error(`expected a write plan, got ${plan.kind}`);
  return plan;
}

/** One transaction of the owner: stage the entry and commit it (transitions are checked by the ledger). */
export function commit(ledger: PartitionLedger, entry: LedgerIntentEntry | undefined): void {
  if (!entry) return;
  ledger.stage(entry);
  ledger.takeStaged();
  ledger.committedSending();
}

/**
 * What the owner does with one intent (src/owner/intent-run.ts, without Kafka): classify, then a repeat of a
 * conflict answered (or written after all, when the record is at the attempt's version), or `pending` committed and
 * the write executed. The result's ledger entry is not committed: the caller checks the step first. `plan` is the
 * classification; `written` says a repeat-conflict went on to write.
 */
export async function runPlan(p: IntentPipeline, a: AdmittedIntent, ledger: PartitionLedger, ctx: ExecContext): Promise<{ plan: Plan; step: Step; written: boolean }> {
  const plan = p.classify(a, ledger);
  if (plan.kind === "settled") return { plan, step: plan, written: false };
  let write: Extract<Plan, { kind: "write" }>;
  if (plan.kind === "repeat-conflict") {
    const repeated = await p.repeatConflict(a, plan, ctx);
    if (repeated.kind !== "write") return { plan, step: repeated, written: false };
    write = repeated;
  } else write = plan;
  commit(ledger, write.pending);
  return { plan, step: await p.execute(a, write.pending, write.state, ctx), written: plan.kind === "repeat-conflict" };
}
