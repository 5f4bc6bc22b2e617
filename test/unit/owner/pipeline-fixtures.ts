// Shared by the owner's pipeline tests: a rebase-commutative tool (an append, written on whatever version it read:
// the shape a late duplicate hurts), and the owner's steps around the pipeline (a write plan; a transaction).
import { z } from "zod";
import type { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { Plan } from "../../../src/owner/intent-pipeline.ts";
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
