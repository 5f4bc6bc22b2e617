import type { RejectReason } from "../errors.ts";
import { MAX_CLOCK_SKEW_MS } from "./admission.ts";
import type { LedgerView } from "../ledger/ledger-state.ts";
import { type LedgerIntentEntry, refusalLedgerKey } from "../schemas/ledger-entry.ts";
import type { RejectedReply } from "../schemas/reply.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import { entityKey } from "../schemas/common.ts";
import type { KafkaMessage } from "kafkajs";
import { appliedUndoOf } from "./classify.ts";
import { deadLetterOf, type Effects, effects, rejectedReply, replayedReply, type SourceRef } from "./effects.ts";

/**
 * Refusals of signed intents, remembered for their bytes (README threat model, docs/architecture.md §9.1).
 *
 * Some refusals write no ledger entry, and the state they were decided on passes: the lease is released, the tool
 * deployed or granted, the agent's reply topic registered, the record created, the undone write applied. The agent was told nothing happened and moved on; the same signed bytes
 * produced again (copied from writ.intents, a retry layer, a redrive) would then be decided again and written. So
 * the refusal is kept in the ledger under the digest of the signed bytes (intent id and `createdAt` included), in the
 * transaction that carries its reply, and those bytes are answered it again, `duplicate: true`, until the ledger's
 * sweep drops it: a retention after it was written, past the intent's `stale` cutoff. A new submission of the same
 * intent key (a new intent id, as the clients' retries of `leased` send) is another digest, decided on the state then.
 * Only intents whose signature checked out are remembered (an agent registry): their bytes are the agent's own.
 * So are an operator's signed resolutions (rememberResolutionRefusal): refused, then produced again once a grant, a
 * deploy or the record let them, they were carried out after the operator had been told they were not.
 *
 * The intent key's own entry comes first: a write that stands (or may stand) is never answered "nothing written".
 * Bytes admitted before and refused now (another deploy, the registry changed: a redelivery after a restart, a copy
 * from writ.intents) are answered from the key's entry when it was written for those very bytes (its `signedDigest`),
 * and dead-lettered `outcome_unknown` without a reply while its write is in doubt; while the key's entry is pending,
 * or may hold their submission, no refusal is remembered for them, and as an intent runs the memory is asked unless
 * the key's entry answers it (classify's repeat from the entry, a pending write of theirs taken up and reconciled).
 */

/**
 * Refusals given without a ledger entry for the intent key, on a state that may change: remembered for the signed
 * bytes they refused. The state is the records' and the ledger's, the owners' deploy (the tools, their declarations)
 * and the agent registry:
 * - admission, on the deploy and the registry: `reply_topic_not_registered` (the agent's topic registered later),
 *   `unknown_tool` (deployed later), `tool_not_allowed` (granted), `entity_type_mismatch`, `params_invalid` (the
 *   tool's params schema), `patch_path_not_allowed` and `patch_op_not_allowed` (its paths), `intent_key_mismatch` (its
 *   `intentFields` and `keyScope`), and a create's `external_id_mismatch`, `delta_mismatch` and `not_canonical` (its
 *   `create` functions build the record these are checked against). A lease's or an undo's `params_invalid` and
 *   `intent_key_mismatch` depend on the bytes alone: remembered with the rest, answered the same either way;
 * - `clock_skew`: the owner's clock catches up with the bytes' `createdAt` (their entry is dated at most the skew
 *   ahead, so it outlives their stale cutoff for a `createdAt` up to the skew and maxIntentAgeMs's margin ahead);
 * - as the intent runs, on the ledger and the record: `leased`, `lease_not_held`, a lease acquire's
 *   `entity_not_found` (the record created since), `sor_protocol` (the system fixed), `lease_limit` (the agent's
 *   other leases ended) and `lease_hold_exceeded` (the lease lapsed: the lapse marks only the acquires it granted, so
 *   the refused renewal's bytes would take the record anew, its hold begun again), `lease_cooldown` (the cool-down
 *   passed: its bytes would take the record at a time its agent did not ask for), the undo's `undo_*`, and
 *   `key_reused_with_different_params` (the key's entry changes with a resolution; its fingerprint with the tool's
 *   free-text params).
 *
 * Not remembered: refusals before the signature is checked (anyone may produce those bytes; dead-lettered, to be sent
 * back once fixed, as are `processing_failed`'s), and refusals that write an entry for the key (a repeat is answered
 * from it). `stale` only grows staler, but for a longer ledger retention, which makes swept bytes of any outcome
 * fresh again (applied ones too): remembering it would close nothing, at an entry for each old copy produced again.
 * `lease_replayed` stands until its bytes are stale (docs/architecture.md §10).
 */
export const REMEMBERED_REFUSALS: ReadonlySet<string> = new Set<RejectReason>([
  "clock_skew",
  "reply_topic_not_registered",
  "unknown_tool",
  "tool_not_allowed",
  "entity_type_mismatch",
  "params_invalid",
  "patch_path_not_allowed",
  "patch_op_not_allowed",
  "intent_key_mismatch",
  "external_id_mismatch",
  "delta_mismatch",
  "not_canonical",
  "leased",
  "lease_not_held",
  "lease_limit",
  "lease_hold_exceeded",
  "lease_cooldown",
  "entity_not_found",
  "sor_protocol",
  "key_reused_with_different_params",
  "undo_target_unknown",
  "undo_target_mismatch",
  "undo_target_not_applied",
  "undo_not_declared",
]);

/** What a refusal of signed bytes is remembered under and answered with: an intent's fields (a resolution's, admission.ts signedResolution). */
export type SignedAsk = Pick<WriteIntent, "intentId" | "intentKey" | "entity" | "tool" | "baseVersion" | "createdAt" | "replyTo"> & { agent: Pick<WriteIntent["agent"], "id"> };

/** An authenticated intent (or resolution) and the sha256 of the canonical JSON its agent (or operator) signed. */
export interface SignedIntent<T extends SignedAsk = SignedAsk> {
  digest: string;
  intent: T;
}

/** A signed resolution as its refusal is remembered (admission.ts signedResolution), with its decision: only an apply stages a pending entry. */
export type SignedResolution = SignedIntent<SignedAsk & { decision: "apply" | "discard" | "return" }>;

/**
 * Whether the intent key's entry holds this submission: `this` when it was written for these very signed bytes (its
 * `signedDigest`); `maybe` when an owner before that field wrote it for the same intent id, agent, tool and record
 * (its content cannot be told apart: never answered from, never remembered against); else `other`. The intent id
 * alone never decides: the agent may sign other content under it (a changed delta), which the entry does not answer.
 */
export function submissionIn(entry: LedgerIntentEntry | undefined, signed: SignedIntent): "this" | "maybe" | "other" {
  const { intent } = signed;
  if (entry?.intentId !== intent.intentId || entry.agentId !== intent.agent.id || entry.tool !== intent.tool) return "other";
  if (entityKey(entry.entity) !== entityKey(intent.entity)) return "other";
  if (entry.signedDigest === undefined) return "maybe";
  return entry.signedDigest === signed.digest ? "this" : "other";
}

/** Whether a write of the key's entry may stand unsettled: pending, or a conflict after a request whose outcome was unknown. */
function inDoubt(entry: LedgerIntentEntry): boolean {
  return entry.status === "pending" || (entry.outcome?.status === "conflict" && entry.outcome.mayHaveWritten === true);
}

/**
 * `out` with the refusal's entry added when it refuses the signed intent for a remembered reason and writes nothing
 * else to the ledger; else `out` as it is. Not while `keyEntry`, the intent key's entry, is pending (a write of the key
 * may have happened: these bytes again take it up and reconcile) or holds this very submission (it answers them).
 */
export function rememberRefusal(signed: SignedIntent | undefined, out: Effects, now: Date, keyEntry: LedgerIntentEntry | undefined): Effects {
  const refused = refusalIn(signed, out);
  if (!refused || out.ledger || keyEntry?.status === "pending" || !REMEMBERED_REFUSALS.has(refused.value.reason) || submissionIn(keyEntry, signed!) !== "other") return out;
  return { ...out, refusal: refusalEntry(signed!, refused, now) };
}

/**
 * What a refusal of a signed resolution (admission.ts signedResolution) becomes, `keyEntry` the escalation's entry as
 * `out` leaves it. For any reason but `stale`, `out` with the refusal's entry added: an operator's decision is carried
 * out once or refused once, never carried out later on the same bytes (another deploy, grant or record state), after
 * the operator was told it was not. Beside the escalation's entry put back open (an apply's refusal), which answers
 * nothing of these bytes: a resolution is planned afresh each time. Also while another resolution's apply holds the
 * entry `pending`: it may end in a conflict that opens the escalation again, to these bytes too. `in_doubt` while the
 * pending apply may be theirs (resolutionApplyOf): its write may have happened, so never "nothing written"; the
 * caller dead-letters them `outcome_unknown`, without a reply, and sent back once owners admit them they take that
 * apply up and reconcile it (Resolver.plan `resumed`). `stale` bytes never run again: their refusal, unremembered.
 */
export function rememberResolutionRefusal(signed: SignedResolution | undefined, out: Effects, now: Date, keyEntry: LedgerIntentEntry | undefined): RefusedAnswer {
  const refused = refusalIn(signed, out);
  if (!refused || UNRUNNABLE.has(refused.value.reason)) return { kind: "answer", effects: out };
  if (resolutionApplyOf(keyEntry, signed!) !== "other") return { kind: "in_doubt", status: "pending" };
  return { kind: "answer", effects: { ...out, refusal: refusalEntry(signed!, refused, now) } };
}

/**
 * Whether the escalation's entry is an apply under way (`pending`, its escalated outcome kept) of these signed
 * resolution bytes: `this` when it was staged for their digest (`resolutionDigest`); `maybe` when an owner before
 * that field staged it (whose apply it is cannot be told); else `other`: another resolution's apply, an intent's
 * write, no apply at all, or bytes that are not an apply (a discard or a return stages no entry).
 */
export function resolutionApplyOf(entry: LedgerIntentEntry | undefined, signed: SignedResolution): "this" | "maybe" | "other" {
  if (signed.intent.decision !== "apply" || entry?.status !== "pending" || entry.outcome?.status !== "escalated") return "other";
  if (entry.resolutionDigest === undefined) return "maybe";
  return entry.resolutionDigest === signed.digest ? "this" : "other";
}

/**
 * What signed resolution bytes refused (`refused`, its one reply) while the escalation's pending apply may be theirs
 * become (rememberResolutionRefusal `in_doubt`): their record (`message`, from `source`) dead-lettered
 * `outcome_unknown`, no reply; the operator's client ends `unknown`, as an intent's in doubt does.
 */
export function resolutionInDoubt(message: KafkaMessage, source: SourceRef, refused: Effects, now: Date): Effects {
  const first = refused.replies[0]?.value;
  const reason = first?.status === "rejected" ? first.reason : "";
  const why = `refused ${reason}, but the escalation's pending apply may be this resolution's and may have written; send it back once owners admit it (it takes that apply up and reconciles it)`;
  return effects({ deadLetters: [deadLetterOf(message, source, "outcome_unknown", why, now.toISOString())] });
}

/** `out`'s one reply when it is a first refusal of signed bytes that may be remembered (no lease written), else null. */
function refusalIn(signed: SignedIntent | undefined, out: Effects): { topic: string; value: RejectedReply } | null {
  const first = out.replies[0];
  const reply = first?.value;
  if (!signed || !first || reply?.status !== "rejected" || reply.duplicate || out.replies.length !== 1) return null;
  if (out.lease || out.refusal) return null;
  return { topic: first.topic, value: reply };
}

/** The ledger entry remembering `refused`, the refusal of `signed` (refusalLedgerKey of its digest). */
function refusalEntry(signed: SignedIntent, refused: { topic: string; value: RejectedReply }, now: Date): LedgerIntentEntry {
  const { intent, digest } = signed;
  const reply = refused.value;
  // The sweep drops it a retention after `updatedAt`: from `createdAt` when that is ahead of this clock, so it is
  // kept past the intent's `stale` cutoff whatever the retention; never more than the clock skew admission allows
  // ahead (it refuses later dates first), for the sweep walks entries in the order written and stops at the first
  // not yet due: one dated years ahead would keep every later entry of the partition for good.
  const t = now.getTime();
  const updatedAt = new Date(Math.min(Math.max(t, Date.parse(intent.createdAt) || 0), t + MAX_CLOCK_SKEW_MS)).toISOString();
  return {
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
    replyTo: refused.topic,
    updatedAt,
    refusedIntentKey: intent.intentKey,
  };
}

/**
 * The answer to signed bytes refused before (the same refusal, `duplicate: true`, nothing else), or null. On `topic`:
 * the agent's registered reply topic, which is the intent's own once admission passed it (not before: it may be
 * refused `reply_topic_not_registered` again).
 */
export function repeatedRefusal(ledger: LedgerView, signed: SignedIntent, now: Date, topic: string = signed.intent.replyTo): Effects | null {
  const entry = ledger.get(refusalLedgerKey(signed.digest));
  const { intent } = signed;
  const outcome = entry?.outcome;
  if (entry?.status !== "done" || outcome?.status !== "rejected" || entry.intentId !== intent.intentId || entry.refusedIntentKey !== intent.intentKey) return null;
  // Reasons are open (an owner of a later version may have written one this one does not know): carried as written.
  const reply = { ...rejectedReply(intent.intentId, intent.intentKey, outcome.reason as RejectReason, outcome.message, now.toISOString()), duplicate: true };
  return effects({ replies: [{ topic, value: reply }] });
}

/** What the owner knows of refused bytes besides the ledger (partition-owner.ts refusedFacts), asked only when weighed. */
export interface RefusedFacts {
  /** Their fingerprint, where their tool is deployed here (intentFingerprints). */
  fingerprint?: string;
  /** Dated further ahead of the owner's clock than an intent may be old: no redrive would run them. */
  farAhead?: boolean;
}

/** What admission's refusal of signed bytes becomes (refusals.ts answerRefused). */
export type RefusedAnswer = { kind: "answer"; effects: Effects } | { kind: "in_doubt"; status: LedgerIntentEntry["status"] };

/**
 * Refusals of bytes too old to run: no redrive could reconcile anything with them. (`clock_skew` bytes run once the
 * owner's clock catches up with them: in doubt like any other.)
 */
const UNRUNNABLE: ReadonlySet<string> = new Set(["stale"]);

/**
 * The answer to signed bytes admission refused (`refused`, a reply on `topic`, the agent's registered reply topic),
 * `key` their intent key's ledger key.
 * - The entry holds these very bytes (its signed digest) and is settled: its outcome again, `duplicate: true`, as
 *   classify answers a repeat (the write stands whatever this deploy admits).
 * - The key's write, of these bytes' tool on their record (sameSubmitter), may stand unsettled (pending, or a conflict
 *   after an unknown outcome): `in_doubt`, whatever submission of the key these bytes are (the clients ask again
 *   under a fresh intent id after `unknown`), never "nothing written"; the caller dead-letters the record, to be sent
 *   back once owners admit it: they reconcile the entry. So too when the key's write stands (applied, escalated) and
 *   these bytes may be its submission: an entry written before digests were kept under their intent id, or a retry
 *   under a fresh intent id (decided once owners admit it: a repeat, or key reuse). Bytes too old to run (`stale`)
 *   keep their refusal: sent back, they would be refused so again. Else, for an entry under their intent id: this
 *   refusal, not remembered.
 * - Else the refusal remembered for them, else this one, remembered when it may be.
 * `facts` is asked only where the key's entry is a write of theirs that does not answer them.
 */
export function answerRefused(ledger: LedgerView, key: string, signed: SignedIntent<WriteIntent>, refused: Effects, now: Date, topic: string, facts: () => RefusedFacts = noFacts): RefusedAnswer {
  const entry = ledger.get(key);
  if (!entry || !sameSubmitter(entry, signed)) return { kind: "answer", effects: asRefusedBefore(ledger, signed, refused, now, topic, entry) };
  const reason = refused.replies[0]?.value.status === "rejected" ? refused.replies[0].value.reason : "";
  const held = submissionIn(entry, signed);
  const stored = entry.outcome;
  // Its own bytes: the entry's settled outcome, whatever this deploy says of them.
  if (held === "this" && entry.status === "done" && stored !== undefined && stored.status !== "conflict") {
    const reply = replayedReply(signed.intent, entry.tool, stored, now.toISOString(), appliedUndoOf(ledger, signed.intent, entry));
    return { kind: "answer", effects: effects({ replies: [{ topic, value: reply }], redelivered: true }) };
  }
  // Bytes that can never run (stale; dated further ahead than a ledger retention), or of other content than the
  // key's write (where the tool is deployed here to tell: admitted, they would be refused as key reuse), are not that
  // write's submission: their refusal is as final as an owner admitting them would make it.
  const known = UNRUNNABLE.has(reason) ? null : facts();
  const neverRuns = known === null || (reason === "clock_skew" && known.farAhead === true);
  const otherContent = known?.fingerprint !== undefined && known.fingerprint !== entry.fingerprint;
  if (!neverRuns && !otherContent) {
    if (inDoubt(entry)) return { kind: "in_doubt", status: entry.status };
    // A write of the key that stands, and bytes that may be its submission: an entry from before signedDigest under
    // their intent id, or a retry under a fresh intent id (as the clients send after `unknown`, rebuilding the step:
    // the same key, its content refused by this deploy or not weighed at all): decided once owners admit them (a
    // repeat, or key reuse; past the retention, stale), never "nothing written" now. Other content signed under the
    // entry's own intent id is not its submission.
    const stands = entry.status === "done" && (stored?.status === "applied" || stored?.status === "escalated");
    if (stands && (held === "maybe" || entry.intentId !== signed.intent.intentId)) return { kind: "in_doubt", status: entry.status };
  }
  if (held !== "other") return { kind: "answer", effects: refused };
  return { kind: "answer", effects: asRefusedBefore(ledger, signed, refused, now, topic, entry) };
}

/**
 * The answer to a signed resolution admission refused (`refused`, a reply on `topic`, the operator's registered reply
 * topic): the refusal remembered for its bytes, else this one, remembered, or `in_doubt` while the escalation's
 * pending apply may be theirs (rememberResolutionRefusal). Never from the escalated intent's entry, which holds the
 * agent's submission, not the operator's.
 */
export function answerRefusedResolution(ledger: LedgerView, signed: SignedResolution, refused: Effects, now: Date, topic: string): RefusedAnswer {
  const again = repeatedRefusal(ledger, signed, now, topic);
  return again ? { kind: "answer", effects: again } : rememberResolutionRefusal(signed, refused, now, ledger.get(signed.intent.intentKey));
}

/** The refusal remembered for signed bytes (on `topic`), else `refused`, remembered when it may be (`keyEntry`: their key's). */
function asRefusedBefore(ledger: LedgerView, signed: SignedIntent, refused: Effects, now: Date, topic: string, keyEntry: LedgerIntentEntry | undefined): Effects {
  return repeatedRefusal(ledger, signed, now, topic) ?? rememberRefusal(signed, refused, now, keyEntry);
}

function noFacts(): RefusedFacts {
  return {};
}

/**
 * Whether the key's entry is a write of the signed intent's tool on its record: the key is theirs (it names its agent,
 * but for a tool of `keyScope: "global"`, whose key is every agent's: one write of the key, whoever asked). Bytes naming
 * a key that is not theirs only keep their own record from an answer (dead-lettered); an entry answers bytes only
 * when it holds them (submissionIn: their agent, intent id and digest).
 */
function sameSubmitter(entry: LedgerIntentEntry, signed: SignedIntent): boolean {
  const { intent } = signed;
  return entry.tool === intent.tool && entityKey(entry.entity) === entityKey(intent.entity);
}
