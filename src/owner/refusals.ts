import type { RejectReason } from "../errors.ts";
import { MAX_CLOCK_SKEW_MS } from "./admission.ts";
import type { LedgerView } from "../ledger/ledger-state.ts";
import { type LedgerIntentEntry, refusalLedgerKey } from "../schemas/ledger-entry.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import { type Effects, effects, rejectedReply } from "./effects.ts";

/**
 * Refusals of signed intents, remembered for their bytes (README threat model, docs/architecture.md §9.1).
 *
 * Some refusals write no ledger entry, and the state they were decided on passes: the lease is released, the tool
 * granted, the undone write applied. The agent was told nothing happened and moved on; the same signed bytes
 * produced again (copied from writ.intents, a retry layer, a redrive) would then be decided again and written. So
 * the refusal is kept in the ledger under the digest of the signed bytes (intent id and `createdAt` included), in the
 * transaction that carries its reply, and those bytes are answered it again, `duplicate: true`, until the ledger's
 * sweep drops it: a retention after it was written, past the intent's `stale` cutoff. A new submission of the same
 * intent key (a new intent id, as the clients' retries of `leased` send) is another digest, decided on the state then.
 * Only intents whose signature checked out are remembered (an agent registry): their bytes are the agent's own.
 */

/**
 * Refusals given without a ledger entry, on a state that may change: remembered for the signed bytes they refused.
 * `clock_skew` too: the owner's clock catches up with the bytes' `createdAt` (their entry is dated at most the skew
 * ahead, so it outlives their stale cutoff for a `createdAt` up to the skew and maxIntentAgeMs's margin ahead).
 */
export const REMEMBERED_REFUSALS: ReadonlySet<string> = new Set<RejectReason>([
  "clock_skew",
  "leased",
  "lease_not_held",
  "tool_not_allowed",
  "undo_target_unknown",
  "undo_target_mismatch",
  "undo_target_not_applied",
  "undo_not_declared",
]);

/** An authenticated intent and the sha256 of the canonical JSON its agent signed. */
export interface SignedIntent {
  digest: string;
  intent: WriteIntent;
}

/**
 * `out` with the refusal's entry added when it refuses the signed intent for a remembered reason and writes nothing
 * else to the ledger; else `out` as it is.
 */
export function rememberRefusal(signed: SignedIntent | undefined, out: Effects, now: Date): Effects {
  const first = out.replies[0];
  const reply = first?.value;
  if (!signed || !first || reply?.status !== "rejected" || reply.duplicate || out.replies.length !== 1) return out;
  if (out.ledger || out.lease || out.refusal || !REMEMBERED_REFUSALS.has(reply.reason)) return out;
  const { intent, digest } = signed;
  // The sweep drops it a retention after `updatedAt`: from `createdAt` when that is ahead of this clock, so it is
  // kept past the intent's `stale` cutoff whatever the retention; never more than the clock skew admission allows
  // ahead (it refuses later dates first), for the sweep walks entries in the order written and stops at the first
  // not yet due: one dated years ahead would keep every later entry of the partition for good.
  const t = now.getTime();
  const updatedAt = new Date(Math.min(Math.max(t, Date.parse(intent.createdAt) || 0), t + MAX_CLOCK_SKEW_MS)).toISOString();
  const entry: LedgerIntentEntry = {
    kind: "intent",
    intentKey: refusalLedgerKey(digest),
    intentId: intent.intentId,
    status: "done",
    entity: intent.entity,
    tool: intent.tool,
    agentId: intent.agent.id,
    fingerprint: digest,
    attempts: [{ baseVersion: intent.baseVersion, deltaFingerprint: digest }],
    cycles: 0,
    outcome: { status: "rejected", reason: reply.reason, message: reply.message.slice(0, 2000), at: reply.at },
    replyTo: first.topic,
    updatedAt,
    refusedIntentKey: intent.intentKey,
  };
  return { ...out, refusal: entry };
}

/**
 * The answer to signed bytes refused before (the same refusal, `duplicate: true`, nothing else), or null. On the
 * intent's reply topic, which admission checked is its agent's registered one now.
 */
export function repeatedRefusal(ledger: LedgerView, signed: SignedIntent, now: Date): Effects | null {
  const entry = ledger.get(refusalLedgerKey(signed.digest));
  const { intent } = signed;
  const outcome = entry?.outcome;
  if (entry?.status !== "done" || outcome?.status !== "rejected" || entry.intentId !== intent.intentId || entry.refusedIntentKey !== intent.intentKey) return null;
  // Reasons are open (an owner of a later version may have written one this one does not know): carried as written.
  const reply = { ...rejectedReply(intent.intentId, intent.intentKey, outcome.reason as RejectReason, outcome.message, now.toISOString()), duplicate: true };
  return effects({ replies: [{ topic: intent.replyTo, value: reply }] });
}
