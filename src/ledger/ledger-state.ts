import { WritError } from "../errors.ts";
import { entityKey } from "../schemas/common.ts";
import { type LedgerIntentEntry, type LedgerLeaseEntry, type LedgerProgress, leaseLedgerKey } from "../schemas/ledger-entry.ts";
import { LEASE_COOLDOWN_MS } from "../schemas/write-intent.ts";

export type LedgerStatus = LedgerIntentEntry["status"];

/**
 * The intent-key lifecycle as a transition table (the shape of kafkajs's
 * transactionStateMachine): absent → pending → conflicted ↺ pending → done.
 * `pending → pending` is a new owner taking up an attempt an earlier one left.
 */
export const LEDGER_TRANSITIONS: Readonly<Record<LedgerStatus | "absent", readonly LedgerStatus[]>> = {
  absent: ["pending"],
  pending: ["pending", "conflicted", "done"],
  conflicted: ["pending", "done"],
  done: [],
};

export function assertTransition(key: string, from: LedgerStatus | "absent", to: LedgerStatus): void {
  if (!LEDGER_TRANSITIONS[from].includes(to)) {
    throw new WritError("codec_failed", `ledger: intent key ${key} cannot go from ${from} to ${to}`, {
      retriable: false,
      context: { intentKey: key },
    });
  }
}

/**
 * Whether a person's decision may take a `done` entry up again: only an
 * escalated one. Every other `done` entry is settled for good.
 */
export function reopenable(entry: LedgerIntentEntry | undefined): boolean {
  return entry?.status === "done" && entry.outcome?.status === "escalated";
}

/** A change waiting for a transaction: an entry to write, or a tombstone (null). */
export type LedgerChange = LedgerIntentEntry | null;

/** Read-only view of one ledger partition: what the pipeline classifies against. */
export interface LedgerView {
  get(intentKey: string): LedgerIntentEntry | undefined;
  readonly size: number;
}

/** An entry as the restore read it: an intent's, a record's lease, or the partition's progress. */
export type RestoredEntry = LedgerIntentEntry | LedgerLeaseEntry | LedgerProgress;

/**
 * Whether `entry` is under the key an owner writes it under: an intent's, its intent key; a lease, its record's
 * lease key. Any producer with write access to the ledger can write another: read as the key's, it would answer an
 * intent or gate a record with what no owner decided, and a lease naming another record is let go as that record's
 * (its live lease freed). Not an owner's, so nothing of the ledger is lost when it is passed over.
 */
export function underItsKey(key: string, entry: RestoredEntry): boolean {
  if (entry.kind === "intent") return entry.intentKey === key;
  if (entry.kind === "lease") return leaseLedgerKey(entityKey(entry.entity)) === key;
  return true;
}

/**
 * The ledger of one intents partition, held only by the owner of that
 * partition, from its restore until it gives the partition up.
 *
 * Three layers, newest first: `staged` (changes for the next transaction),
 * `sending` (the changes of the transaction in flight) and `committed`
 * (what Kafka holds). Reads see the newest layer. A committed transaction
 * moves `sending` into `committed`; a failed one discards both upper layers,
 * and the owner restores the partition from the topic again.
 *
 * `committed` is kept in order of last change (a Map re-inserts a changed
 * key at its end), so the entries due for expiry are always at its front and
 * retention never scans the whole ledger. Committed entries that never expire
 * (pending ones, open escalations) are kept apart, in `unsettled`: a sweep
 * never walks them (open escalations may last for days, and would stand
 * before everything due at every sweep).
 */
export class PartitionLedger implements LedgerView {
  readonly partition: number;
  private readonly committed: Map<string, LedgerIntentEntry>;
  /** Committed entries a sweep must not expire: `pending`, and open escalations. Only a change takes one out. */
  private readonly unsettled = new Map<string, LedgerIntentEntry>();
  private expiryVisits = 0;
  private staged = new Map<string, LedgerChange>();
  private sending = new Map<string, LedgerChange>();
  /** How many committed entries name each reply topic: the topics this partition's owner may have written. */
  private readonly replyTopicCounts = new Map<string, number>();
  /** Committed entries still `pending`, with when each was recorded (ms): kept as entries commit, never scanned from the ledger. */
  private readonly pendingSince = new Map<string, number>();
  /** Committed escalations still open (awaiting a person's decision), with when each was escalated (ms); kept likewise. */
  private readonly escalatedSince = new Map<string, number>();
  /** Records' leases, by ledger key, in the same three layers (a release is a tombstone: null). */
  private readonly leasesCommitted = new Map<string, LedgerLeaseEntry>();
  private leasesStaged = new Map<string, LedgerLeaseEntry | null>();
  private leasesSending = new Map<string, LedgerLeaseEntry | null>();
  /**
   * Each agent's leases held as the owner sees them now (the newest layer: kept as leases are staged and restored,
   * never scanned from the layers), by ledger key, with their expiry (ms); and grants decided, not yet staged
   * ({@link claimLease}). What an acquire counts against `WRIT_MAX_LEASES_PER_AGENT`.
   */
  private readonly agentLeases = new Map<string, Map<string, number>>();

  /**
   * The intents offset the last committed transaction recorded (its first
   * intent without a committed result), if any transaction did: intake
   * resumes there, or at the group's committed offset when that is further.
   */
  readonly progress: bigint | null = null;

  /** Who wrote that progress entry (its owners' group and intents topic), when it says (docs/architecture.md §5.2). */
  readonly progressWriter: { group: string; intentsTopic: string | undefined } | null = null;

  /** Restored entries passed over: under another key than an owner writes them under ({@link underItsKey}). */
  readonly foreign: number = 0;

  /** `restored` in topic order, as the restore read it. */
  constructor(partition: number, restored: Iterable<[string, RestoredEntry]> = []) {
    this.partition = partition;
    this.committed = new Map();
    for (const [key, entry] of restored) {
      if (!underItsKey(key, entry)) this.foreign++;
      else if (entry.kind === "lease") {
        this.indexLease(key, this.leasesCommitted.get(key), heldBy(entry));
        this.leasesCommitted.set(key, entry);
      }
      // Another partition's progress (never written by an owner) says nothing about this one.
      else if (entry.kind === "progress") {
        if (entry.partition !== partition) continue;
        this.progress = BigInt(entry.offset);
        this.progressWriter = entry.group === undefined ? null : { group: entry.group, intentsTopic: entry.intentsTopic };
      }
      else this.applyCommitted(key, entry);
    }
  }

  /** The lease on record `entityKey` as the owner sees it now (expired or not), if one is held. */
  lease(entityKey: string): LedgerLeaseEntry | undefined {
    const key = leaseLedgerKey(entityKey);
    if (this.leasesStaged.has(key)) return this.leasesStaged.get(key) ?? undefined;
    if (this.leasesSending.has(key)) return this.leasesSending.get(key) ?? undefined;
    return this.leasesCommitted.get(key);
  }

  /** Stages a lease for the next transaction: granted or renewed (an entry), or released (null, a tombstone). */
  stageLease(entityKey: string, entry: LedgerLeaseEntry | null): void {
    const key = leaseLedgerKey(entityKey);
    this.indexLease(key, this.lease(entityKey), heldBy(entry));
    this.leasesStaged.delete(key);
    this.leasesStaged.set(key, entry);
  }

  /**
   * Leases `agentId` holds at `now` (ms) on this partition's records, unexpired and unreleased, grants decided for it
   * and not yet staged included. Expired ones are dropped as the count finds them (an expiry passes for good), so an
   * acquire walks only the agent's leases live at its last count and those granted since, not every lapsed one again.
   */
  leasesHeldBy(agentId: string, now: number): number {
    const held = this.agentLeases.get(agentId);
    if (!held) return 0;
    for (const [key, expiresAt] of held) if (!(expiresAt > now)) held.delete(key);
    if (held.size === 0) this.agentLeases.delete(agentId);
    return held.size;
  }

  /**
   * Counts a lease of record `entityKey` granted to `agentId` until `expiresAt` (ms) from its decision on: it is staged
   * only once its reply is encoded, and the agent's other acquires of the partition run meanwhile. A grant never
   * staged (its result could not be encoded) counts until its expiry.
   */
  claimLease(entityKey: string, agentId: string, expiresAt: number): void {
    this.indexLease(leaseLedgerKey(entityKey), undefined, { agentId, expiresAt });
  }

  /** Leases as the owner sees them now whose expiry (a released one's: its last replay marker's) is before `now` (ms), at most `limit`. */
  expiredLeases(now: number, limit: number): LedgerLeaseEntry[] {
    const seen = new Set<string>();
    const out: LedgerLeaseEntry[] = [];
    for (const layer of [this.leasesStaged, this.leasesSending, this.leasesCommitted]) {
      for (const [key, entry] of layer) {
        if (seen.has(key)) continue;
        seen.add(key);
        if (entry !== null && leaseEndsAt(entry) < now && out.length < limit) out.push(entry);
      }
    }
    return out;
  }

  /** Leases held now (expired or not). */
  get leaseCount(): number {
    let n = 0;
    const seen = new Set<string>();
    for (const layer of [this.leasesStaged, this.leasesSending, this.leasesCommitted]) {
      for (const [key, entry] of layer) {
        if (seen.has(key)) continue;
        seen.add(key);
        if (entry !== null && entry.releasedAt === undefined) n++;
      }
    }
    return n;
  }

  get(intentKey: string): LedgerIntentEntry | undefined {
    if (this.staged.has(intentKey)) return this.staged.get(intentKey) ?? undefined;
    if (this.sending.has(intentKey)) return this.sending.get(intentKey) ?? undefined;
    return this.committed.get(intentKey) ?? this.unsettled.get(intentKey);
  }

  /** Committed entries. */
  get size(): number {
    return this.committed.size + this.unsettled.size;
  }

  /**
   * Stages an entry for the next transaction, checking the transition from
   * what the owner sees now. `resolution`: a person's decision on an
   * escalated entry may take it from `done` again (to `pending` to write it,
   * or to `done` with the decision), and only an escalated one.
   */
  stage(entry: LedgerIntentEntry, opts: { resolution?: boolean } = {}): void {
    const before = this.get(entry.intentKey);
    const reopening = opts.resolution === true && reopenable(before);
    if (!reopening) assertTransition(entry.intentKey, before?.status ?? "absent", entry.status);
    this.staged.delete(entry.intentKey);
    this.staged.set(entry.intentKey, entry);
  }

  /**
   * Stages a refusal's entry (refusals.ts) for the next transaction. No transition to check: it is written settled,
   * once per refused submission, or again, the same, when its bytes are refused afresh.
   */
  stageRefusal(entry: LedgerIntentEntry): void {
    this.staged.delete(entry.intentKey);
    this.staged.set(entry.intentKey, entry);
  }

  /**
   * Stages an entry again as the owner sees it now, only dated later (an answer from it keeps it from the sweep;
   * intent-pipeline.ts `keeping`): no transition, so its status must be the one seen now.
   */
  stageKept(entry: LedgerIntentEntry): void {
    const before = this.get(entry.intentKey);
    if (before?.status !== entry.status) {
      throw new WritError("codec_failed", `ledger: intent key ${entry.intentKey} is ${before?.status ?? "absent"}, not ${entry.status}: not kept`, {
        retriable: false,
        context: { intentKey: entry.intentKey },
      });
    }
    this.stageRefusal(entry);
  }

  tombstone(intentKey: string): void {
    this.staged.set(intentKey, null);
  }

  /** Hands the staged changes to a transaction; they stay visible until it ends. */
  takeStaged(): [string, LedgerChange][] {
    if (this.sending.size > 0 || this.leasesSending.size > 0) {
      throw new WritError("kafka_failed", "ledger: a transaction is already in flight", { retriable: false, context: { partition: this.partition } });
    }
    this.sending = this.staged;
    this.staged = new Map();
    this.leasesSending = this.leasesStaged;
    this.leasesStaged = new Map();
    return [...this.sending];
  }

  /** The transaction carrying the taken changes committed. */
  committedSending(): void {
    for (const [key, change] of this.sending) this.applyCommitted(key, change);
    this.sending.clear();
    for (const [key, lease] of this.leasesSending) {
      if (lease === null) this.leasesCommitted.delete(key);
      else this.leasesCommitted.set(key, lease);
    }
    this.leasesSending.clear();
  }

  /** Reply topics of the committed entries (the ones whose partitions a heal must touch). */
  replyTopics(): string[] {
    return [...this.replyTopicCounts.keys()];
  }

  /** Committed entries still `pending` (a write in flight, or one an earlier owner left). */
  get pendingCount(): number {
    return this.pendingSince.size;
  }

  /** When the oldest committed `pending` entry was recorded (ms since the epoch); null with none. Looks at pending entries only. */
  oldestPendingSince(): number | null {
    return earliest(this.pendingSince);
  }

  /** Committed escalations still open: each waits for a person's decision, and is kept until it comes. */
  get openEscalationCount(): number {
    return this.escalatedSince.size;
  }

  /** When the oldest open escalation was escalated (ms since the epoch); null with none. Looks at open escalations only. */
  oldestOpenEscalationSince(): number | null {
    return earliest(this.escalatedSince);
  }

  /**
   * Keys of committed entries last changed before `cutoff`, oldest first, at
   * most `limit`. Entries not settled never expire: `pending` ones (reconcile
   * settles them first) and open escalations (a person's decision closes them;
   * expired, the decision would be refused and the agent never answered).
   * Nor do keys with a change waiting for a transaction, or that `busy` names
   * (an intent of the key is under way). None for an invalid cutoff: every
   * `updatedAt >= NaN` is false, which would expire the whole ledger.
   */
  expired(cutoff: Date, limit: number, busy: (key: string) => boolean = () => false): string[] {
    const out: string[] = [];
    this.expiryVisits = 0;
    const cut = cutoff.getTime();
    if (!Number.isFinite(cut)) return out;
    // Pending entries and open escalations are not in `committed`. What is skipped here (a change waiting, a key
    // at work) is as many as the intents under way.
    for (const [key, entry] of this.committed) {
      if (Date.parse(entry.updatedAt) >= cut || out.length >= limit) break;
      this.expiryVisits++;
      if (this.staged.has(key) || this.sending.has(key) || busy(key)) continue;
      out.push(key);
    }
    return out;
  }

  /** Committed entries the last {@link expired} looked at: what a sweep cost (tests). */
  get lastExpiryVisits(): number {
    return this.expiryVisits;
  }

  /** Moves ledger key `key` in the per-agent count from the lease the owner saw (`before`) to the one held now, if any. */
  private indexLease(key: string, before: LedgerLeaseEntry | undefined, after: { agentId: string; expiresAt: number } | null): void {
    if (before && before.releasedAt === undefined) {
      const held = this.agentLeases.get(before.agentId);
      held?.delete(key);
      if (held?.size === 0) this.agentLeases.delete(before.agentId);
    }
    if (!after) return;
    let held = this.agentLeases.get(after.agentId);
    if (!held) this.agentLeases.set(after.agentId, (held = new Map()));
    held.set(key, after.expiresAt);
  }

  private applyCommitted(key: string, change: LedgerChange): void {
    this.pendingSince.delete(key);
    if (change?.status === "pending") this.pendingSince.set(key, Date.parse(change.updatedAt) || Date.now());
    this.escalatedSince.delete(key);
    if (change && reopenable(change)) this.escalatedSince.set(key, Date.parse(change.outcome?.at ?? "") || Date.parse(change.updatedAt) || Date.now());
    const before = this.committed.get(key) ?? this.unsettled.get(key);
    if (before) {
      this.committed.delete(key);
      this.unsettled.delete(key);
      this.countReplyTopic(before.replyTo, -1);
    }
    if (change !== null) {
      (this.pendingSince.has(key) || this.escalatedSince.has(key) ? this.unsettled : this.committed).set(key, change);
      this.countReplyTopic(change.replyTo, 1);
    }
  }

  private countReplyTopic(topic: string, delta: number): void {
    const n = (this.replyTopicCounts.get(topic) ?? 0) + delta;
    if (n > 0) this.replyTopicCounts.set(topic, n);
    else this.replyTopicCounts.delete(topic);
  }
}

/** The earliest of the times (ms) kept by key; null with none. */
function earliest(times: ReadonlyMap<string, number>): number | null {
  let out: number | null = null;
  for (const t of times.values()) if (out === null || t < out) out = t;
  return out;
}

/** Who holds a lease entry, and until when (ms); null for a released one (or a tombstone). */
function heldBy(entry: LedgerLeaseEntry | null): { agentId: string; expiresAt: number } | null {
  return entry && entry.releasedAt === undefined ? { agentId: entry.agentId, expiresAt: Date.parse(entry.expiresAt) } : null;
}

/**
 * When a lease entry may go: a held lease at its expiry, a released one once its replay markers and its cool-down
 * (what a grant to its agent is decided on, record-leases.ts) are past.
 */
function leaseEndsAt(entry: LedgerLeaseEntry): number {
  if (entry.releasedAt === undefined) return Date.parse(entry.expiresAt);
  const coolsAt = Date.parse(entry.releasedAt) + LEASE_COOLDOWN_MS;
  return (entry.released ?? []).reduce((end, m) => Math.max(end, Date.parse(m.until)), Math.max(Date.parse(entry.expiresAt), coolsAt));
}
