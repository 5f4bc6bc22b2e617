// The commit loop of a partition owner (docs/architecture.md §3.3, §3.9,
// §4.3): what the partition's next transaction carries, the `pending` entries
// sent into its open transaction, when it commits (group commit, the offset's
// interval), and the transaction itself.
import { setTimeout as sleep } from "node:timers/promises";
import { WritError } from "../errors.ts";
import { progressKey } from "../ledger/ledger-reader.ts";
import type { Logger } from "../logger.ts";
import type { LedgerIntentEntry, LedgerLeaseEntry } from "../schemas/ledger-entry.ts";
import { startTransactionSpan, type TransactionSpan } from "../tracing/spans.ts";
import type { OwnerContext } from "./owner-context.ts";
import type { PendingSend, Session, Slot } from "./owner-session.ts";
import { type LateRecord, type OutRecord, healRecord } from "./records.ts";
import { isSizeRefusal } from "./produce-limits.ts";
import type { OwnerProducer, OwnerTransaction } from "./transactions.ts";

/** What the next transaction carries (beside the `pending` entries already sent into it). */
interface Staged {
  /** In the order staged; a late one is encoded in its place when the transaction is sent. */
  records: (OutRecord | LateRecord)[];
  /** Slots whose results are in `records`. */
  slots: Slot[];
}

const emptyStaged = (): Staged => ({ records: [], slots: [] });

/** One transaction's contents as its commit took them, and where it moves the offsets. */
interface Taken {
  batch: Staged;
  txn: number;
  /** The offset it commits: the first intent whose result is not in this or an earlier transaction. */
  offset: bigint;
  began: number;
  /** Whether it carries the ledger's progress entry (the offset moved), and the group's offset. */
  progressed: boolean;
  withOffset: boolean;
}

/** What the commit loop needs of its partition owner. */
export interface CommitHost {
  readonly partition: number;
  readonly log: Logger;
  /** Slots running and not waiting for a commit: they will stage something soon. */
  working(): number;
  /**
   * The offset to commit for `session`: the first intent whose result is not in this or an earlier transaction.
   * Null when `session` is not the owner's current one: the owner's intake state is then another session's, or
   * cleared, and no offset may be computed from it.
   */
  watermark(session: Session): bigint | null;
  /** Whether `session` is the owner's current one. */
  current(session: Session): boolean;
  /** Whether an intent holding this ledger key is admitted and its result not yet staged (waiting, classified, or writing). */
  busy(ledgerKey: string): boolean;
  /** A failed Kafka call of `session`: fenced, or rewind. */
  failed(session: Session, err: unknown): void;
  /** Runs `task` as one of `session`'s (ending the session waits for it). */
  track(session: Session, task: Promise<void>): void;
  /** A transaction carrying these slots' results committed. */
  committed(slots: readonly Slot[]): void;
  /** The sweep found a lease past its end: the owner lets it go (staging what takes its place here). */
  releaseExpired(session: Session, lease: LedgerLeaseEntry): void;
}

/** Ledger entries (and leases) expired per transaction at most: a sweep past retention goes on in the next. */
const SWEEP_BATCH = 1000;

/**
 * One per partition owner, across its sessions. The owner stages results
 * ({@link stage}) and `pending` entries ({@link stagePending}); {@link run}
 * commits them for a session until it ends.
 */
export class CommitLoop {
  private readonly ctx: OwnerContext;
  private readonly host: CommitHost;
  private readonly partition: number;
  private readonly log: Logger;
  private staged: Staged = emptyStaged();
  /** Ledger keys that records in {@link staged} write (results' entries): a `pending` entry of one waits for them. */
  private stagedLedgerKeys = new Set<string>();
  /** `pending` entries held until the next transaction takes {@link staged}: each is sent after that transaction's records. */
  private held: PendingSend[] = [];
  private txnSeq = 0;
  /** The consumed offset last committed for the group (it lags `lastProgress`: it goes into a transaction at most every offsetCommitIntervalMs). */
  private lastCommittedOffset = -1n;
  /** The offset the ledger's progress entry holds as of the last committed transaction: every intent before it has its result committed. */
  private lastProgressValue = -1n;
  private sweepDue = false;
  /** When the oldest change now staged was staged. */
  private stagedSince = 0;
  /** When the consumed offset last went into a transaction; set when a later one must carry it. */
  private lastOffsetCommitAt = 0;
  /**
   * When the last transaction committed. A transaction for the offset alone waits until the partition has had
   * none for offsetCommitIntervalMs: while intents come, the next result's transaction carries the offset.
   */
  private lastTxnAt = 0;
  private offsetTimer: NodeJS.Timeout | null = null;
  private readonly healRequests = new Map<string, Set<number>>();
  private wake: (() => void) | null = null;

  constructor(ctx: OwnerContext, host: CommitHost) {
    this.ctx = ctx;
    this.host = host;
    this.partition = host.partition;
    this.log = host.log;
  }

  /** Where intake stands as of the last committed transaction (the ledger's progress entry). */
  get lastProgress(): bigint {
    return this.lastProgressValue;
  }

  /** A session opened: the group's committed offset and the progress it restored from. */
  opened(groupOffset: bigint, progress: bigint): void {
    this.lastCommittedOffset = groupOffset;
    this.lastProgressValue = progress;
  }

  /** A session ended: everything staged and not committed is dropped, held `pending` entries refused. */
  reset(): void {
    this.staged = emptyStaged();
    this.stagedLedgerKeys.clear();
    const held = this.held;
    this.held = [];
    for (const p of held) p.reject(sessionEnded());
    this.healRequests.clear();
    this.wake?.();
  }

  /** Ledger entries past retention get tombstones in the next transaction. */
  requestSweep(): void {
    this.sweepDue = true;
    this.nudge();
  }

  /** The next transaction writes a control record to these partitions (see `heal.ts`). */
  requestHeal(topic: string, partitions: readonly number[]): void {
    const set = this.healRequests.get(topic) ?? new Set();
    for (const p of partitions) set.add(p);
    this.healRequests.set(topic, set);
    this.nudge();
  }

  /** Records for the next transaction: an intent's result (with its slot), or others (a lapsed lease's entry). */
  stage(session: Session, records: readonly (OutRecord | LateRecord)[], slot?: Slot): void {
    // An ended session's work never reaches a later session's transaction.
    if (!this.live(session)) return;
    this.markStaged(session);
    this.staged.records.push(...records);
    for (const r of records) if (r.topic === this.ctx.config.topics.ledger && typeof r.key === "string") this.stagedLedgerKeys.add(r.key);
    if (slot) {
      this.staged.slots.push(slot);
      slot.txn = -1;
    }
  }

  /**
   * Step 3: `pending` is sent into the partition's open transaction; resolves
   * once the broker acknowledged it (acks=all), not when it commits: the
   * next commit (within `commitLingerMs`, with the results that followed)
   * makes it visible. Durable before the write all the same: a crash or a
   * failed transaction aborts it, and the next restore finds it with a
   * read_uncommitted scan (partition-restore.ts); a zombie's send after a new owner's
   * InitProducerId is refused for its epoch, so its write never starts.
   */
  async stagePending(session: Session, pending: LedgerIntentEntry, opts: { resolution?: boolean } = {}): Promise<void> {
    const record = await this.ctx.encoder.ledgerEntry(pending, this.partition);
    if (!this.live(session)) throw sessionEnded();
    // Before it joins the queue: an entry that starts the next transaction is the oldest change the linger counts from.
    this.markStaged(session);
    // A change of the same key staged for the next transaction and not sent yet (the result of this key's previous
    // attempt) must reach the topic first, or a restore would find it last (a write under way taken for settled):
    // the entry is held until that transaction takes it, and sent after its records (its intent's write waits so).
    const queue = this.stagedLedgerKeys.has(pending.intentKey) ? this.held : session.toSend;
    const durable = new Promise<void>((resolve, reject) => queue.push({ record, resolve, reject }));
    session.ledger.stage(pending, opts);
    this.sendPendings(session);
    await durable;
  }

  /** Whether `session` may still commit: active and the owner's current one. An ended session commits nothing. */
  private live(session: Session): boolean {
    return session.active && this.host.current(session);
  }

  /** Sends the `pending` entries waiting into the open transaction (beginning one), behind any Kafka call in flight. */
  private sendPendings(session: Session): void {
    if (session.sendQueued) return;
    session.sendQueued = true;
    // Tracked: a session ends only after its sends (and, once they are done, aborts the transaction they opened).
    this.host.track(
      session,
      session.serial(async () => {
        session.sendQueued = false;
        const batch = session.toSend;
        session.toSend = [];
        if (batch.length === 0) return;
        if (!this.live(session)) {
          for (const p of batch) p.reject(sessionEnded());
          return;
        }
        try {
          session.openTxn ??= await session.producer.transaction();
          await sendRecords(this.ctx, this.partition, session.openTxn, batch.map((p) => p.record), true);
          if (session.inOpenTxn === 0) session.openSince = Date.now();
          session.inOpenTxn += batch.length;
        } catch (err) {
          for (const p of batch) p.reject(err as Error);
          this.host.failed(session, err);
          return;
        }
        for (const p of batch) p.resolve();
        // The commit loop commits the open transaction now that it holds entries.
        this.nudge();
      }),
    );
  }

  /** Notes when the oldest change waiting for a commit came: the first one after a commit. */
  private markStaged(session: Session): void {
    if (this.staged.records.length === 0 && session.toSend.length === 0 && session.inOpenTxn === 0) this.stagedSince = Date.now();
  }

  /** Something was staged, or a wait ended: the loop looks again. */
  nudge(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  /** Commits `session`'s staged work until the session ends (a task of the session). */
  async run(session: Session): Promise<void> {
    while (this.live(session)) {
      const mark = this.host.watermark(session);
      if (mark === null) return;
      const behind = mark > this.lastCommittedOffset;
      const offsetDue = behind && Date.now() >= this.offsetAloneAt();
      // Staged slots count even without records: their offsets must pass (a result may produce nothing).
      const nothingButPendings = this.staged.records.length === 0 && this.staged.slots.length === 0 && this.healRequests.size === 0 && !this.sweepDue && !offsetDue;
      if (nothingButPendings && session.inOpenTxn === 0) {
        // An offset behind and not due yet (it went in, or a transaction committed, within the interval): wake
        // when it is. Without this an idle partition's last results would keep their offset uncommitted until new
        // intents came.
        if (behind) this.scheduleOffsetCommit();
        await new Promise<void>((resolve) => (this.wake = resolve));
        continue;
      }
      if (nothingButPendings) {
        // Only `pending` entries in the open transaction: they wait for the results that follow, within a bound.
        const wait = session.openSince + this.ctx.config.openPendingMaxMs - Date.now();
        if (wait > 0) {
          await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(wait)]);
          this.wake = null;
          continue;
        }
      }
      // Group commit: while intents of this partition are still reading or writing, and will have something
      // to stage within moments, wait up to commitLingerMs for them, so that one transaction carries many.
      // With nothing at work (everything staged or waiting for this commit) there is nothing to wait for.
      const linger = this.ctx.config.commitLingerMs - (Date.now() - this.stagedSince);
      if (this.host.working() > 0 && linger > 0) {
        if (this.log.isLevelEnabled("debug")) this.log.debug({ working: this.host.working(), ms: linger }, "commit lingers for intents at work");
        await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(linger)]);
        this.wake = null;
        // Woken by the session's end (reset) as well: its state is cleared by then, and nothing of it may commit.
        if (!this.live(session)) return;
        if (this.host.working() > 0 && this.ctx.config.commitLingerMs - (Date.now() - this.stagedSince) > 0) continue;
      }
      await this.commitOnce(session);
    }
  }

  /**
   * One transaction: what is staged, the `pending` entries in the open transaction, the offset. What it carries
   * is taken when its turn among the session's Kafka calls (`serial`) comes, in one step with nothing awaited: a
   * `pending` entry staged after that is sent after its records (and one held for a result of its key in them is
   * released then). So the topic holds each key's changes in the order the ledger made them: a sweep's tombstone,
   * or an earlier attempt's result, never lands after a new attempt's `pending` entry.
   */
  private async commitOnce(session: Session): Promise<void> {
    const live = () => this.live(session);
    if (!live()) return;
    /** Its span, once it took results to trace (a failure ends it too). */
    const traced: { span: TransactionSpan | null } = { span: null };
    /** The offset after the last intent whose result it carries, once taken (a size refusal isolates until past it). */
    let carried: bigint | null = null;
    let done: { taken: Taken; phases: { sent: number; offsets: number; committed: number }; pendings: number; sent: number };
    try {
      done = await session.serial(async () => {
        // The session may have ended while earlier calls ran: nothing is taken, its open transaction is the end's to abort.
        if (!live()) throw sessionEnded();
        const taken = this.take(session);
        const { batch, offset } = taken;
        for (const x of batch.slots) if (carried === null || x.offset >= carried) carried = x.offset + 1n;
        if (batch.slots.length > 0) traced.span = startTransactionSpan(this.partition, batch.slots.map((x) => x.trace), batch.records.length);
        // Late records (a lapsed lease's entry) encoded now, each in the place it was staged in: its key's later
        // changes were staged after it. A registry outage fails the transaction as the progress entry's would.
        const records = batch.records.some((r) => "encode" in r) ? await Promise.all(batch.records.map((r) => ("encode" in r ? r.encode() : r))) : (batch.records as OutRecord[]);
        if (taken.progressed) records.push(await this.progressRecord(offset));
        if (!live()) throw sessionEnded();
        // `pending` entries sent into the open transaction before this commit took it.
        const pendings = session.inOpenTxn;
        const phases = await transact(this.ctx, this.partition, session.producer, records, taken.withOffset ? offset : null, session.takeOpen(), live);
        return { taken, phases, pendings, sent: records.length };
      });
    } catch (err) {
      traced.span?.failed(err);
      if (carried !== null && isSizeRefusal(err)) this.ctx.encoder.limits.isolateUntil(this.partition, carried);
      this.host.failed(session, err);
      return;
    }
    const { taken, phases, pendings, sent } = done;
    const { batch, txn, offset, began, progressed, withOffset } = taken;
    traced.span?.committed();
    // The partition may be past whatever was refused (a restore's own transactions do not say so).
    this.ctx.encoder.limits.committed(this.partition, progressed ? offset : null);
    for (const slot of batch.slots) slot.trace?.committed(traced.span);
    this.ctx.observe?.committed?.(this.partition, Date.now() - began, batch.slots.flatMap((x) => (x.outcome ? [x.outcome] : [])));
    if (!session.active) return;
    if (this.log.isLevelEnabled("debug")) {
      const now = Date.now();
      const timeline = batch.slots.map((x) => ({
        queued: (x.times.started ?? x.times.settled ?? now) - x.times.accepted,
        pending: x.times.durable !== undefined && x.times.started !== undefined ? x.times.durable - x.times.started : null,
        work: (x.times.settled ?? now) - (x.times.durable ?? x.times.started ?? x.times.accepted),
        commit: now - (x.times.settled ?? now),
      }));
      this.log.debug(
        { txn, ms: now - began, phases, withOffset, records: sent + pendings, results: batch.slots.length, pendings, timeline },
        "transaction committed",
      );
    }
    this.lastTxnAt = Date.now();
    session.ledger.committedSending();
    if (progressed) this.lastProgressValue = offset;
    if (withOffset) {
      this.lastCommittedOffset = offset;
      this.lastOffsetCommitAt = began;
    }
    this.host.committed(batch.slots);
  }

  /** What a transaction of the current `session` carries, taken now (the sweep's tombstones first added). */
  private take(session: Session): Taken {
    const { config, encoder } = this.ctx;
    if (this.sweepDue) {
      this.sweepDue = false;
      const cutoff = new Date(Date.now() - config.ledgerRetentionHours * 3_600_000);
      // Keys an intent holds are not expired: it classified against the entry (or is about to), and its change follows.
      const expired = session.ledger.expired(cutoff, SWEEP_BATCH, (key) => this.host.busy(key));
      for (const key of expired) {
        session.ledger.tombstone(key);
        this.staged.records.push(encoder.tombstone(key, this.partition));
      }
      if (expired.length > 0) this.log.info({ tombstones: expired.length }, "ledger entries past retention tombstoned");
      const leases = session.ledger.expiredLeases(Date.now(), SWEEP_BATCH);
      for (const lease of leases) this.host.releaseExpired(session, lease);
      // A full batch leaves more behind: the next transaction goes on, so expiry keeps up with any intake rate
      // (one batch per sweep interval would cap it at 1,000 entries a minute per partition, and the ledger grow).
      if (expired.length === SWEEP_BATCH || leases.length === SWEEP_BATCH) this.sweepDue = true;
    }
    const batch = this.staged;
    this.staged = emptyStaged();
    this.stagedLedgerKeys.clear();
    // Held for this batch: sent once this transaction is done (its Kafka calls go first).
    if (this.held.length > 0) {
      session.toSend.push(...this.held);
      this.held = [];
      this.sendPendings(session);
    }
    const txn = ++this.txnSeq;
    for (const slot of batch.slots) slot.txn = txn;
    for (const [topic, partitions] of this.healRequests) {
      // A topic that takes less than a heal record (restore's healTargets says why) gets none.
      if (!encoder.limits.fits(healRecord(topic, 0))) continue;
      for (const p of partitions) batch.records.push(healRecord(topic, p));
    }
    this.healRequests.clear();
    session.ledger.takeStaged();
    // Current (the caller checked, nothing awaited since): the offset comes from this session's own state.
    const offset = this.host.watermark(session) ?? this.lastProgressValue;
    const began = Date.now();
    // Where intake stands goes into every transaction that moves it, as the ledger's progress entry: one small
    // record in a partition the transaction mostly writes anyway, no extra round trip. A new owner resumes there.
    const progressed = offset > this.lastProgressValue;
    // The group's offset (for tools that read group lag, and for a ledger without progress) goes in at most every
    // offsetCommitIntervalMs: AddOffsetsToTxn and TxnOffsetCommit are two more round trips. It lags, never leads.
    const advance = offset > this.lastCommittedOffset;
    const withOffset = advance && began - this.lastOffsetCommitAt >= this.ctx.config.offsetCommitIntervalMs;
    if (advance && !withOffset) this.scheduleOffsetCommit();
    return { batch, txn, offset, began, progressed, withOffset };
  }

  private async progressRecord(offset: bigint): Promise<OutRecord> {
    const { config, codec } = this.ctx;
    const value = await codec.encode(config.topics.ledger, "LedgerEntry", {
      kind: "progress",
      partition: this.partition,
      offset: offset.toString(),
      at: new Date().toISOString(),
      group: config.groupId,
      intentsTopic: config.topics.intents,
    });
    return { topic: config.topics.ledger, partition: this.partition, key: progressKey(this.partition), value };
  }

  /**
   * When the consumed offset, behind, may go into a transaction of its own: an interval after the last
   * transaction (any transaction after the interval carries it). The last one that carried the offset began no
   * later than the last one committed, so the offset's own interval has passed by then too.
   */
  private offsetAloneAt(): number {
    return this.lastTxnAt + this.ctx.config.offsetCommitIntervalMs;
  }

  /** Wakes the commit loop once the offset may go into a transaction of its own (see offsetAloneAt). */
  private scheduleOffsetCommit(): void {
    if (this.offsetTimer) return;
    const wait = Math.max(1, this.offsetAloneAt() - Date.now());
    // Nudges whichever session's loop waits: a timer left by an ended session must not hold up the next one's.
    this.offsetTimer = setTimeout(() => {
      this.offsetTimer = null;
      this.nudge();
    }, wait);
    this.offsetTimer.unref();
  }
}

/** Why an ended session's Kafka call is refused (retriable: the partition's next session takes its work up). */
function sessionEnded(): WritError {
  return new WritError("producer_fenced", "session ended", { retriable: true });
}

/**
 * One transaction of records (and, if given, the consumed offset). Resolves
 * with when each phase ended, in ms from its start (for the debug timeline):
 * sends (Produce; under transactions v1 AddPartitionsToTxn first), offsets
 * (TxnOffsetCommit; v1: AddOffsetsToTxn first), commit (EndTxn). See
 * transactions.ts.
 */
export async function transact(
  ctx: Pick<OwnerContext, "config" | "hooks" | "encoder" | "log">,
  partition: number,
  producer: OwnerProducer,
  records: readonly OutRecord[],
  nextOffset: bigint | null,
  open: OwnerTransaction | null = null,
  live: () => boolean = () => true,
  opts: { isolate?: boolean } = {},
): Promise<{ sent: number; offsets: number; committed: number }> {
  const { config } = ctx;
  const t0 = performance.now();
  const at = () => Math.round((performance.now() - t0) * 10) / 10;
  // The open transaction, with the `pending` entries already sent into it, if there is one.
  const txn = open ?? (await producer.transaction());
  try {
    await sendRecords(ctx, partition, txn, records, opts.isolate ?? true);
    const sent = at();
    if (nextOffset !== null) await txn.sendOffset({ groupId: config.groupId, topic: config.topics.intents, partition, offset: nextOffset });
    const offsets = at();
    const topics = new Set(records.map((r) => r.topic));
    if (open) topics.add(config.topics.ledger);
    await ctx.hooks?.beforeCommit?.({ partition, topics: [...topics], offset: nextOffset !== null });
    // A session that ended meanwhile commits nothing: what it took may be stale, and its successor starts from the
    // last committed state. Aborted below instead.
    if (!live()) throw sessionEnded();
    await txn.commit();
    return { sent, offsets, committed: at() };
  } catch (err) {
    await txn.abort().catch(() => undefined);
    throw err;
  }
}

/**
 * `records` into partition `partition`'s transaction, in rounds sized for what their topics take. A round the broker
 * refuses for its size fails the transaction as any failure does, and is learned first (produce-limits.ts): the
 * partition's next transactions send one record per request until its progress passes the refused transaction's
 * intents (a restore's own transactions, `isolate` false, send theirs as usual), and a refusal of one record teaches
 * the encoder its topic's limit, so the intent's result is written within it when it runs again.
 */
async function sendRecords(ctx: Pick<OwnerContext, "encoder" | "log">, partition: number, txn: Pick<OwnerTransaction, "send">, records: readonly OutRecord[], isolate: boolean): Promise<void> {
  await ctx.encoder.limits.send(txn, records, partition, (learned) => {
    ctx.encoder.refusedByBroker(learned?.topic ?? null);
    if (learned) {
      ctx.log.warn({ partition, topic: learned.topic, bytes: learned.bytes }, "the broker refused a record as too large for its topic; that topic's records are written within what it took from now on");
    } else {
      ctx.log.warn({ partition }, "the broker refused a record as too large for its topic; the partition sends one record per request until the refused transaction's intents are committed, to find it");
    }
  }, { isolate });
}
