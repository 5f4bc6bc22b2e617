import type { AdmittedIntent } from "../owner/admission.ts";
import type { Effects } from "../owner/effects.ts";

/** The outcomes `writ_intents_total` counts, one per intent (its `outcome` label). */
export const INTENT_OUTCOMES = ["applied", "conflict", "rejected", "escalated", "dead_lettered", "repeat", "redelivered"] as const;
export type IntentOutcomeKind = (typeof INTENT_OUTCOMES)[number];

/** What one settled intent came to: the labels its metrics and its process span carry. Never a record id. */
export interface IntentOutcome {
  /** The admitted tool's name; `none` for a record answered at admission before a tool was known. */
  tool: string;
  outcome: IntentOutcomeKind;
  /** Reasons of the escalations its result carries (on `writ.human`). */
  escalations: string[];
  /** Reasons of the dead letters its result carries (on `writ.dlq`). */
  deadLetters: string[];
}

/** The tool label of intents answered before a tool was admitted for them (a dead letter, an unknown tool). */
export const NO_TOOL = "none";

/**
 * What an intent's staged result says happened (null for a record forwarded
 * to its key's partition, where it is settled), in this order: a repeat
 * answered from the ledger (`duplicate: true`: `redelivered` when it is the
 * very submission the ledger holds, delivered again after a rebalance or
 * restart, else `repeat`), an escalation, a dead letter, else the reply's status.
 */
export function intentOutcome(admitted: AdmittedIntent | undefined, effects: Effects): IntentOutcome | null {
  // Forwarded to its key's partition: settled there, counted there.
  if ((effects as Partial<Effects>).forwards?.length) return null;
  const reply = effects.replies[0]?.value;
  const escalations = effects.escalations.map((e) => e.value.reason);
  const deadLetters = effects.deadLetters.map((d) => d.value.reason);
  let outcome: IntentOutcomeKind;
  if (reply?.duplicate === true) outcome = effects.redelivered ? "redelivered" : "repeat";
  else if (escalations.length > 0) outcome = "escalated";
  else if (deadLetters.length > 0) outcome = "dead_lettered";
  else if (reply && (reply.status === "applied" || reply.status === "conflict" || reply.status === "escalated")) outcome = reply.status;
  else outcome = "rejected";
  return { tool: admitted?.tool.name ?? NO_TOOL, outcome, escalations, deadLetters };
}
