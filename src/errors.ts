/**
 * Every error writ raises carries a code from this list, whether it is worth
 * retrying (required, never defaulted: kafkajs's default-to-retriable is a
 * known pitfall), the cause, and context fields that pino logs.
 */
export const ERROR_CODES = [
  "config_invalid",
  "tool_not_admitted",
  "schema_drift",
  "codec_failed",
  "registry_unavailable",
  "kafka_failed",
  "producer_fenced",
  "sor_unavailable",
  "sor_protocol",
  "ledger_restore_timeout",
  "ledger_unreadable",
  /**
   * A ledger partition another consumer group (or the owners of another intents topic) still writes, or would write
   * too (another group of owners consumes this intents topic, or may: it is rebalancing): not opened, tried again.
   */
  "ledger_foreign_writer",
  "input_too_deep",
  "not_canonical",
  "retries_exhausted",
  /** The agent client's reply consumer stopped for good (kafkajs will not restart it): no reply can be read, so nothing more is sent. */
  "reply_consumer_stopped",
  /** The agent client was closed: submits waiting then settle `unknown`, later ones are refused before sending. */
  "client_closed",
  /** An intent (or resolution) whose encoded value is larger than owners accept: they dead-letter it `too_large` without a reply. */
  "too_large",
  /** An intent (or resolution) nested deeper than owners accept: they dead-letter it `too_deep` without a reply. */
  "too_deep",
  /** A submit's deadline passed before its intents were produced (still queued or being encoded): nothing was sent, so submitting again is safe. */
  "not_sent",
  /**
   * An intent (or resolution) that validating it against its wire schema would change (a field the schema
   * does not know, an own `__proto__` key): what is sent would not be what is signed and keyed.
   */
  "changed_by_validation",
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Machine-readable reasons carried by a `rejected` reply. */
export const REJECT_REASONS = [
  "undecodable",
  "schema_invalid",
  "schema_subject_mismatch",
  "too_large",
  "too_deep",
  "not_canonical",
  "unauthenticated",
  "key_missing",
  "key_mismatch",
  "intent_key_mismatch",
  "tool_not_allowed",
  "reply_topic_not_registered",
  "delta_mismatch",
  "patch_op_not_allowed",
  "reply_topic_not_allowed",
  "reply_topic_missing",
  "unknown_tool",
  "entity_type_mismatch",
  "params_invalid",
  "patch_path_not_allowed",
  "key_reused_with_different_params",
  "entity_not_found",
  "patch_not_applicable",
  "sor_rejected",
  "sor_protocol",
  "processing_failed",
  "resolution_not_applicable",
  "resolution_conflict",
  /** An `apply` of an escalation whose tool cannot rebuild its change on the current record (no delta function, not an append) and the resolution carries no `delta`. */
  "resolution_delta_required",
  "escalation_discarded",
  "returned_by_operator",
  /** A create whose entity id is not the external id its params give. */
  "external_id_mismatch",
  /** An undo of an intent key this record's ledger does not hold (never submitted here, or past ledger retention). */
  "undo_target_unknown",
  /** An undo of an intent that was not applied (rejected, escalated, conflicted, or still pending): nothing to undo. */
  "undo_target_not_applied",
  /** An undo whose tool or record is not the undone intent's. */
  "undo_target_mismatch",
  /** An undo of a tool that declares no compensating change, or of an undo. */
  "undo_not_declared",
  /**
   * The tool's undo function failed, or gave no valid change, on the record as the write left it; or, on a record
   * changed since, gave a change too large to carry in a reply (over WRIT_MAX_INTENT_BYTES): nothing was undone.
   */
  "undo_failed",
  /**
   * The record's lease is held by a change that spans records (another change, or another agent's): submit again once
   * it ends. `details.expiresAt` says when it lapses at the latest. A lease acquire refused (so, or by a bound below)
   * carries `details.heldBefore: true` when its own change and agent held the record before, within the replay mark's
   * life: an earlier run of the change may have written.
   */
  "leased",
  /** A step of a change whose lease on the record is not held (never acquired, released, or expired): nothing was written. */
  "lease_not_held",
  /**
   * A lease acquire the change already gave back (its release came after it) or let lapse (its lease ran out after
   * it): the signed bytes of an acquire produced again. Nothing taken; a change that wants the record again sends a
   * new acquire. An acquire refused so carries `details.heldBefore: true` (the mark is its own change's and agent's:
   * a client started anew whose clock is behind its earlier run's makes such acquires); a release refused so, none.
   */
  "lease_replayed",
  /**
   * A lease acquire of an agent that already holds `WRIT_MAX_LEASES_PER_AGENT` unexpired leases on the records of the
   * record's partition (`details`: `held`, `max`). Nothing taken; the agent's other changes must end first.
   */
  "lease_limit",
  /**
   * A renewal of a lease its change has held for `WRIT_LEASE_MAX_HOLD_MS` since its grant (or since the grant of its
   * agent's lease of the record that ended less than `LEASE_COOLDOWN_MS` before it: one hold) (`details`: `acquiredAt`,
   * `maxHoldMs`, `expiresAt`). Not renewed: the lease stays the change's until it lapses at `expiresAt`.
   */
  "lease_hold_exceeded",
  /**
   * A lease acquire of an agent whose own lease of the record ended less than `LEASE_COOLDOWN_MS` (10 s) ago, its hold
   * of the record (continued across its leases taken again within that time) past `WRIT_LEASE_MAX_HOLD_MS`, or to be
   * past it within the acquire's time to live
   * (`details`: `acquiredAt`, `maxHoldMs`, `until`, `change`: the change whose lease ended). Nothing taken; the record
   * is the agent's to acquire again from `until`.
   */
  "lease_cooldown",
  /**
   * An intent created longer ago than the ledger keeps intents (a lease intent: than a lease lasts): past that its
   * repeat could not be recognized, so it is not acted on. Signed bytes replayed later meet this.
   */
  "stale",
  /** An intent created more than five minutes after the owner's clock: the agent's clock is wrong. */
  "clock_skew",
] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

/** Why a record went to `writ.dlq`. */
export const DEAD_LETTER_REASONS = [
  "undecodable",
  "schema_invalid",
  "schema_subject_mismatch",
  "too_large",
  "too_deep",
  "not_canonical",
  "unauthenticated",
  "key_missing",
  "key_mismatch",
  "reply_topic_not_allowed",
  "reply_topic_missing",
  "processing_failed",
  /**
   * The intent's reply (or escalation) is larger than its topic takes even without the record's state (a reply topic
   * whose max.message.bytes is small): not written; it is in the dead letter's `undelivered`, the outcome in the ledger.
   */
  "undeliverable",
  /**
   * A signed intent refused at admission (a deploy without its tool, narrower declarations, a registry change) whose
   * intent key's entry holds it with its write in doubt (pending; conflicted after an unknown outcome): no reply, for
   * "nothing written" could be false. Sent back once owners admit it, it is reconciled.
   */
  "outcome_unknown",
] as const;
export type DeadLetterReason = (typeof DEAD_LETTER_REASONS)[number];

/** Why an intent went to a person on `writ.human`. */
export const ESCALATION_REASONS = ["conflict_cycles_exhausted", "outcome_unknown", "sor_protocol", "processing_failed"] as const;
export type EscalationReason = (typeof ESCALATION_REASONS)[number];

export interface WritErrorContext {
  topic?: string;
  partition?: number;
  offset?: string;
  entity?: string;
  intentKey?: string;
  tool?: string;
  field?: string;
  /** `sor_unavailable`: the wait the system's Retry-After asked for (ms); the owner's pause is at least this long. */
  retryAfterMs?: number;
  [extra: string]: unknown;
}

export class WritError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;
  readonly context: WritErrorContext;

  constructor(
    code: ErrorCode,
    message: string,
    opts: { retriable: boolean; cause?: unknown; context?: WritErrorContext },
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "WritError";
    this.code = code;
    this.retriable = opts.retriable;
    this.context = opts.context ?? {};
  }

  toJSON(): Record<string, unknown> {
    return { name: this.name, code: this.code, message: this.message, retriable: this.retriable, ...this.context };
  }
}

/**
 * True only when every classified error in the cause chain says it may be
 * retried. An error that carries a `retriable` flag (WritError, kafkajs's
 * errors) decides for the foreign errors it wraps: a WritError that wrapped
 * undici's `TypeError: fetch failed` as `sor_unavailable` made that call at
 * the boundary, so the unclassified cause below it does not veto. A chain with
 * no classified error at the top is not retriable.
 */
export function isRetriable(err: unknown): boolean {
  let current: unknown = err;
  let classified = 0;
  for (let seen = 0; current !== undefined && current !== null && seen < 16; seen++) {
    if (typeof current === "object" && "retriable" in current) {
      if ((current as { retriable: unknown }).retriable !== true) return false;
      classified++;
    } else if (classified === 0) {
      return false;
    }
    current = (current as { cause?: unknown }).cause;
  }
  return classified > 0;
}

/**
 * True when the schema registry cannot serve the work: a `registry_unavailable`
 * WritError, itself or as the cause of one a retry gave up on
 * (`retries_exhausted`). Retriable, it could not be reached; not retriable, it
 * refuses writ's own requests (its login, its URL: a deploy's to fix, which an
 * owner's health names). Either says nothing about the work: it pauses, and is
 * never failed (a dead letter would need the registry too).
 */
export function isRegistryOutage(err: unknown): boolean {
  let current: unknown = err;
  for (let seen = 0; current instanceof WritError && seen < 16; seen++) {
    if (current.code === "registry_unavailable") return true;
    if (current.code !== "retries_exhausted") return false;
    current = current.cause;
  }
  return false;
}
