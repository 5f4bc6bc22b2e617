import { z } from "zod";
import { EntityRef, IsoTime, Version } from "./common.ts";

// Ledger values are read back by owners of other versions during a rolling deploy, so every object here
// is loose: an older owner keeps (and re-writes) the fields a newer one added, and a field it does not
// know never makes an entry unreadable. Reasons are plain strings for the same reason.

/** One attempt at an intent key: the base version it was made from and a fingerprint of its delta. */
export const Attempt = z.looseObject({ baseVersion: Version, deltaFingerprint: z.string() });

/**
 * What a repeat of a settled (or conflicted) intent is answered with: the
 * outcome and the version, never the record's state. A repeat of an applied
 * intent carries the version the write produced (also the version an undo of
 * it must find); a repeat of a conflicted attempt reads the record again for
 * `current`. Record data therefore stays out of the ledger.
 */
export const StoredOutcome = z.discriminatedUnion("status", [
  z.looseObject({ status: z.literal("applied"), version: Version, via: z.string(), at: IsoTime }),
  z.looseObject({
    status: z.literal("conflict"),
    cycle: z.number().int().min(1),
    version: Version,
    at: IsoTime,
    /**
     * A request of this intent whose outcome was unknown (or an earlier owner's) came before the conflict: it may
     * still arrive at the system of record, so the key's next attempt reconciles before it writes
     * (docs/architecture.md §3.8). Absent otherwise, and in entries written before it existed.
     */
    mayHaveWritten: z.boolean().optional(),
  }),
  z.looseObject({ status: z.literal("rejected"), reason: z.string(), message: z.string(), at: IsoTime }),
  z.looseObject({
    status: z.literal("escalated"),
    reason: z.string(),
    message: z.string(),
    escalationId: z.string(),
    at: IsoTime,
    /**
     * A write of this intent may have reached the system of record (an earlier request's outcome unknown, an
     * inherited pending, an operator's apply whose outcome was lost), whatever the reason. An operator's apply
     * reconciles first, as for `outcome_unknown`. Absent in entries written before it existed: not known.
     */
    mayHaveWritten: z.boolean().optional(),
    /**
     * `escalatedIntentDigest()` of the intent as the escalation carries it on writ.human: a resolution's intent must
     * hash to it (free text and intent id included), so a forged copy of the record under this escalation id is
     * refused. Absent in entries written before it existed: those are checked by fingerprints only.
     */
    intentDigest: z.string().optional(),
  }),
]);
export type StoredOutcome = z.infer<typeof StoredOutcome>;

/** Whether an escalated outcome says the intent's write may have happened: only reconciling can tell, never a second write. */
export function escalationMayHaveWritten(outcome: StoredOutcome | undefined): boolean {
  return outcome?.status === "escalated" && (outcome.mayHaveWritten === true || outcome.reason === "outcome_unknown");
}

/**
 * The ledger's record of one intent key: absent → pending → conflicted ↺ → done.
 */
export const LedgerIntentEntry = z.looseObject({
  kind: z.literal("intent"),
  intentKey: z.string(),
  /** Intent id of the submission that last changed the entry. */
  intentId: z.string(),
  status: z.enum(["pending", "conflicted", "done"]),
  entity: EntityRef,
  tool: z.string(),
  /** The agent whose submission created the entry. */
  agentId: z.string().optional(),
  /** sha256 over tool, entity and the non-free-text params. */
  fingerprint: z.string(),
  /**
   * sha256 of the canonical JSON the agent signed, of the submission `intentId` names (with an agent registry): the
   * entry answers those very bytes when an owner refuses them at admission (src/owner/refusals.ts), never other
   * content signed under the same intent id. Absent in entries of unsigned intents and of owners before it.
   */
  signedDigest: z.string().optional(),
  /**
   * On an operator's apply under way (`pending`, the escalated outcome kept): the digest of the canonical JSON the
   * operator signed, of the resolution whose apply staged it. A refusal of other signed resolution bytes is
   * remembered while it is pending, never one of these bytes' (src/owner/refusals.ts). Absent on other entries, on
   * applies of unsigned resolutions and of owners before it (whose apply it is cannot be told).
   */
  resolutionDigest: z.string().optional(),
  /** The latest attempts (base version, delta fingerprint), at most 16. */
  attempts: z.array(Attempt).min(1).max(64),
  /** Conflict cycles seen so far. */
  cycles: z.number().int().min(0),
  /** The answer a repeat gets (absent while pending). */
  outcome: StoredOutcome.optional(),
  /** Reply topic of the submission; also tells a new owner which reply partitions it may have to heal. */
  replyTo: z.string(),
  updatedAt: IsoTime,
  /**
   * The params as the tool's schema gave them, kept only for a tool that declares an undo: what its
   * compensating change is built from (with the version the write produced, in `outcome`).
   */
  params: z.record(z.string(), z.unknown()).optional(),
  /** Set on an undo's entry: the intent key of the write it compensates (an undo is not undone). */
  undoOf: z.string().optional(),
  /**
   * Set on a refusal's entry (key `refusalLedgerKey(digest)`, `done`, outcome `rejected`): the intent key of the
   * signed intent refused without an entry of its own (`leased`, `tool_not_allowed`, ...), whose very bytes are
   * answered that refusal again (src/owner/refusals.ts). An intent entry, so that owners of earlier versions read,
   * keep and expire it like any settled entry.
   */
  refusedIntentKey: z.string().optional(),
});
export type LedgerIntentEntry = z.infer<typeof LedgerIntentEntry>;

/**
 * Written by a new owner of partition p right after it fenced the previous one;
 * once the restore reader sees it, every earlier entry of p has been read.
 */
export const LedgerMarker = z.looseObject({
  kind: z.literal("marker"),
  partition: z.number().int().min(0),
  nonce: z.string(),
  owner: z.string(),
  at: IsoTime,
});
export type LedgerMarker = z.infer<typeof LedgerMarker>;

/**
 * Where the owner's intake of intents partition p stands: the offset of the
 * first intent whose result is not in this or an earlier transaction. One per
 * partition (key `__progress__:<p>`), written in the same transaction as the
 * results it covers, so a new owner resumes exactly after the last committed
 * result, whatever the group's committed offset (which is written less often,
 * for tools that read group lag). Decimal digits: a Kafka offset is an int64.
 */
export const LedgerProgress = z.looseObject({
  kind: z.literal("progress"),
  partition: z.number().int().min(0),
  offset: z.string().regex(/^(0|[1-9][0-9]{0,18})$/),
  at: IsoTime,
  /**
   * The owners' consumer group and intents topic that wrote it: an owner of another group (or intents topic) that
   * finds it while that group still consumes the topic refuses the partition, which would otherwise have two
   * writers (docs/architecture.md §5.2). Absent from entries of versions before it.
   */
  group: z.string().min(1).max(255).optional(),
  intentsTopic: z.string().min(1).max(249).optional(),
});
export type LedgerProgress = z.infer<typeof LedgerProgress>;

/**
 * A record's lease, held by a change that spans records: written when the
 * change acquires it (or renews it); when it is released or found lapsed,
 * kept free with the marks of the acquires it refuses as replays and what the
 * cool-down after it is decided on (its agent, change, `acquiredAt`,
 * `releasedAt`), and tombstoned once the marks and the cool-down are past. Key
 * `leaseLedgerKey(entity key)`, in the ledger partition of the record's
 * intents partition: the record's owner is the lease's only writer.
 */
export const LedgerLeaseEntry = z.looseObject({
  kind: z.literal("lease"),
  entity: EntityRef,
  /** The change holding it (`lease.change` of its intents). */
  change: z.string(),
  /** The agent whose change it is: only its intents use the lease. */
  agentId: z.string(),
  replyTo: z.string(),
  /** The start of its agent's stretch on the record: its grant, or an earlier lease's it continues (docs/architecture.md §10.3). */
  acquiredAt: IsoTime,
  /** Held: when it lapses unless renewed. Freed: when it was freed (past, so an owner from before `releasedAt` sees it lapsed). */
  expiresAt: IsoTime,
  updatedAt: IsoTime,
  /**
   * The `createdAt` of the latest acquire that took or renewed it (the agent's clock): a lapse marks the change's
   * acquires up to it as replays. Absent in entries of owners before it (their lapse is marked at `updatedAt`).
   */
  lastAcquireCreatedAt: IsoTime.optional(),
  /**
   * Set when its change released it, or the owner found it lapsed: the lease is free, and this is its end (the
   * release; a lapse's own `expiresAt`, however late it was found), from which the cool-down for its agent counts.
   * The entry stays until `released` is past and that cool-down (LEASE_COOLDOWN_MS) too. Absent: held, until
   * `expiresAt`. An owner from before it sees a freed entry lapsed at its `expiresAt`, ignores the cool-down and
   * tombstones an entry without `released` at once.
   */
  releasedAt: IsoTime.optional(),
  /**
   * Changes whose leases of this record ended lately: an acquire of `change` by `agentId` created at or before
   * `before` (the release's `createdAt`, or a lapsed lease's `lastAcquireCreatedAt`: the same agent's clock) came
   * before that end, so it is a replay of signed bytes and refused `lease_replayed`, until `until` (`before` + the
   * lease intents' age window), past which admission refuses it `stale`. Kept across the record's later leases and
   * their lapses; absent when none is in force (a freed entry kept for its cool-down alone), and in entries of owners
   * before it.
   */
  released: z.array(z.looseObject({ change: z.string(), agentId: z.string(), before: IsoTime, until: IsoTime })).max(64).optional(),
});
export type LedgerLeaseEntry = z.infer<typeof LedgerLeaseEntry>;

/**
 * Ledger key of a refused signed intent: `digest` is the sha256 of the canonical JSON its agent signed (intent id,
 * `createdAt` and all), so a new submission of the same intent key is never answered by it. Never a valid intent key.
 */
export function refusalLedgerKey(digest: string): string {
  return `__refused__:${digest}`;
}

/** Ledger key of a record's lease. Never a valid intent key (those are 64 hex chars), nor a marker's. */
export function leaseLedgerKey(entityKey: string): string {
  return `__lease__:${entityKey}`;
}

/**
 * LedgerEntry: topic `writ.ledger`, compacted; key the intent key (markers:
 * `__marker__:<p>`, progress `__progress__:<p>`, leases `__lease__:<type>:<id>`, refusals `__refused__:<sha256>`); partition p holds the ledger of intents partition p and is
 * produced with an explicit partition, in the owner's transactions only.
 * Entries past the retention window are tombstoned. Compatibility
 * (docs/wire-contract.md §9, with the registry levels that accept each
 * change): optional members and kinds of entry only; objects are loose, so
 * an older owner keeps and re-writes the fields a newer one added.
 */
export const LedgerEntry = z.discriminatedUnion("kind", [LedgerIntentEntry, LedgerMarker, LedgerProgress, LedgerLeaseEntry]);
export type LedgerEntry = z.infer<typeof LedgerEntry>;
