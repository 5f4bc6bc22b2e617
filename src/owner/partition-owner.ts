import { randomUUID } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";
import type { KafkaMessage } from "kafkajs";
import type { RouterConfig } from "../config.ts";
import { WritError, isRegistryOutage } from "../errors.ts";
import { markerKey, progressKey } from "../ledger/ledger-reader.ts";
import { PartitionLedger } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import type { LedgerIntentEntry, LedgerLeaseEntry } from "../schemas/ledger-entry.ts";
import { type IntentOutcome, intentOutcome } from "../metrics/outcome.ts";
import type { PartitionFigures } from "../metrics/router-metrics.ts";
import { IntentTrace, startTransactionSpan } from "../tracing/spans.ts";
import { type AdmittedIntent, admit } from "./admission.ts";
import { deadLetterOf, effects, rejectedReply, type Effects } from "./effects.ts";
import { Resolver, type ResolvePlan } from "./resolution.ts";
import type { Resolution } from "../schemas/resolution.ts";
import type { AdmittedTool } from "../tools.ts";
import { type Plan, type WriteState } from "./intent-pipeline.ts";
import { KeyScheduler } from "./key-scheduler.ts";
import { type OutRecord, healRecord, sendRounds } from "./records.ts";
import { type OwnerProducer, type OwnerTransaction, ownerProducer } from "./transactions.ts";
import type { OwnerContext } from "./owner-context.ts";
import { startOffset } from "../kafka/serial-admin.ts";
import { entityKey } from "../schemas/common.ts";
import { isLeaseOp } from "../schemas/write-intent.ts";
import { type LeaseGate, leaseGate, leaseRefusal, settleLeaseIntent } from "./record-leases.ts";

/** Failed transactions in a row after which a partition is reported as a health problem (it is not moving). */
const STUCK_AFTER_FAILURES = 5;

/** Transactional id of the owner of intents partition p: one per partition fences a zombie owner (no KIP-447 in kafkajs; docs/architecture.md §5.2). */
export function transactionalIdFor(config: RouterConfig, partition: number): string {
  return `${config.groupId}.${config.topics.intents}.${partition}`;
}

export type OwnerState = "opening" | "running" | "rewinding" | "failed-closed" | "fenced" | "closed";

/** One fetched intent, from intake until the transaction carrying its result commits. */
interface Slot {
  readonly seq: number;
  readonly offset: bigint;
  readonly message: KafkaMessage;
  admitted?: AdmittedIntent;
  plan?: Plan;
  /** What its record's lease meant for it when it started. */
  gate?: LeaseGate;
  pendingDurable: boolean;
  /** Unexpected failures so far (not outages). */
  failures: number;
  /** Consecutive outage pauses. */
  outages: number;
  /** Number of the transaction that carries its result; unset until the result is staged. */
  txn?: number;
  /**
   * Its result, once decided, until it is staged. Staging encodes it (the registry) and may fail; a retry stages
   * this again and never runs the intent again: the write it carries may already be at the system of record.
   */
  result?: Effects;
  /** A person's decision on an escalation, instead of an intent (see resolution.ts). */
  resolution?: { resolution: Resolution; tool: AdmittedTool; entityKey: string; replyTo: string; plan?: ResolvePlan };
  /** When it was fetched, started, had its pending entry durable, and was settled (ms; for the debug timeline). */
  times: { accepted: number; started?: number; durable?: number; settled?: number };
  /** Its `writ.process` span, and what its staged result came to (for metrics, at commit). */
  trace?: IntentTrace;
  outcome?: IntentOutcome | null;
}

/** Everything of one ownership of the partition: from a fence-and-restore until a failure, a fence or the release. */
class Session {
  private static opened = 0;
  /** Numbers the sessions of this process, for the `x-writ-owner` header and logs. */
  readonly seq = ++Session.opened;
  readonly abort = new AbortController();
  readonly tasks = new Set<Promise<void>>();
  readonly producer: OwnerProducer;
  readonly ledger: PartitionLedger;
  /**
   * The partition's open transaction, begun by the first `pending` entry sent
   * into it and ended by the next commit (which adds the results staged since).
   */
  openTxn: OwnerTransaction | null = null;
  /** `pending` entries sent into `openTxn` and not committed yet: work the commit loop must commit soon. */
  inOpenTxn = 0;
  /** When the first of them was acknowledged (ms). */
  openSince = 0;
  /** `pending` entries waiting to be sent into the open transaction, and whether a send of them is queued. */
  toSend: PendingSend[] = [];
  sendQueued = false;
  /** Every Kafka call of the session (sends into the open transaction, commits) runs after the one before. */
  private chain: Promise<unknown> = Promise.resolve();

  constructor(producer: OwnerProducer, ledger: PartitionLedger) {
    this.producer = producer;
    this.ledger = ledger;
  }

  get active(): boolean {
    return !this.abort.signal.aborted;
  }

  /** Runs `call` after every Kafka call of the session before it. */
  serial<T>(call: () => Promise<T>): Promise<T> {
    const done = this.chain.then(call);
    this.chain = done.catch(() => undefined);
    return done;
  }

  /** Takes the open transaction (and its entries) for a commit. */
  takeOpen(): OwnerTransaction | null {
    const open = this.openTxn;
    this.openTxn = null;
    this.inOpenTxn = 0;
    this.openSince = 0;
    return open;
  }
}

/** What the next transaction carries (beside the `pending` entries already sent into it). */
interface Staged {
  records: OutRecord[];
  /** Slots whose results are in `records`. */
  slots: Slot[];
}

const emptyStaged = (): Staged => ({ records: [], slots: [] });

/** A `pending` entry waiting to be sent into the open transaction; its intent's write waits for the broker's acknowledgement. */
interface PendingSend {
  record: OutRecord;
  resolve: () => void;
  reject: (err: Error) => void;
}

/**
 * The single writer of one intents partition: a thin driver of Kafka
 * transactions around the intent pipeline. See docs/architecture.md §4.3, §5.1, §5.3 and §6.
 *
 * - **Open.** A new transactional producer (its InitProducerId fences the
 *   previous owner and aborts its open transaction), a marker in ledger
 *   partition p, the ledger restored from the topic up to that marker, then a
 *   heal transaction touching every partition this transactional id may have
 *   left a transaction open on (see {@link healTargets}); then intake resumes
 *   at the committed offset.
 * - **Run.** Intents run concurrently across records and one at a time per
 *   record (and per intent key), at most `maxInFlightPerPartition` at once.
 *   Each transaction carries the results settled since the last one and the
 *   `pending` entries of the intents about to write, plus the offset up to
 *   which every intent's result is committed: one transaction per round,
 *   never one per intent.
 * - **Fail.** A transaction that fails aborts everything uncommitted: the
 *   owner waits for its in-flight calls, then opens again (restoring the
 *   ledger from the topic, since an ambiguous commit may have landed). A
 *   fenced owner stops: the partition has a newer owner.
 */
export class PartitionOwner {
  readonly partition: number;
  private readonly ctx: OwnerContext;
  private readonly resolver = new Resolver();
  private readonly log: Logger;
  private stateValue: OwnerState = "opening";
  private session: Session | null = null;
  private readonly slots = new Map<number, Slot>();
  private inbox: KafkaMessage[] = [];
  private scheduler: KeyScheduler<Slot>;
  private staged: Staged = emptyStaged();
  private seq = 0;
  private txnSeq = 0;
  /** Next offset intake accepts; lower offsets are re-deliveries. */
  private expectedNext = -1n;
  /** The consumed offset last committed for the group (it lags `lastProgress`: it goes into a transaction at most every offsetCommitIntervalMs). */
  private lastCommittedOffset = -1n;
  /** The offset the ledger's progress entry holds as of the last committed transaction: every intent before it has its result committed. */
  private lastProgress = -1n;
  private admitting = false;
  private failuresInARow = 0;
  private sweepDue = false;
  /** Slots running and not waiting for a commit: they will stage something soon. */
  private working = 0;
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
  private opened: Promise<void> | null = null;

  constructor(partition: number, ctx: OwnerContext) {
    this.partition = partition;
    this.ctx = ctx;
    this.log = ctx.log.child({ component: "partition-owner", topic: ctx.config.topics.intents, partition });
    this.scheduler = new KeyScheduler(ctx.config.maxInFlightPerPartition);
  }

  get state(): OwnerState {
    return this.stateValue;
  }

  /** Intents fetched and not yet committed: the intake pauses this partition above `maxBufferedPerPartition`. */
  get load(): number {
    return this.inbox.length + this.slots.size;
  }

  /** Figures for metrics while it runs (null otherwise): ledger entries, pending entries and the oldest one's time, leases held, the committed offset. */
  stats(): Omit<PartitionFigures, "partition"> | null {
    const ledger = this.stateValue === "running" ? this.session?.ledger : undefined;
    if (!ledger) return null;
    return {
      ledgerEntries: ledger.size,
      pending: ledger.pendingCount,
      oldestPendingSince: ledger.oldestPendingSince(),
      leases: ledger.leaseCount,
      committedOffset: this.lastProgress,
    };
  }

  /** Reply topics this owner's ledger knows (the partitions it may write). */
  replyTopics(): string[] {
    return this.session?.ledger.replyTopics() ?? [];
  }

  /** Starts the open loop in the background (once). */
  start(): void {
    this.opened ??= this.openLoop();
  }

  /** Fetched messages, in offset order. Re-deliveries (offsets already taken) are dropped. */
  accept(messages: readonly KafkaMessage[], lastOffset: string): void {
    if (this.stateValue !== "running") return;
    for (const m of messages) {
      const offset = BigInt(m.offset);
      if (offset < this.expectedNext) continue;
      this.inbox.push(m);
      this.expectedNext = offset + 1n;
    }
    const after = BigInt(lastOffset) + 1n;
    if (after > this.expectedNext) this.expectedNext = after;
    this.pump();
  }

  /** Ledger entries past retention get tombstones in the next transaction. */
  requestSweep(): void {
    if (this.stateValue !== "running") return;
    this.sweepDue = true;
    this.nudge();
  }

  /** The next transaction writes a control record to these partitions (see `heal.ts`). */
  requestHeal(topic: string, partitions: readonly number[]): void {
    if (this.stateValue !== "running") return;
    const set = this.healRequests.get(topic) ?? new Set();
    for (const p of partitions) set.add(p);
    this.healRequests.set(topic, set);
    this.nudge();
  }

  async close(): Promise<void> {
    if (this.stateValue === "closed") return;
    this.stateValue = "closed";
    await this.endSession(new WritError("producer_fenced", "partition released", { retriable: true, context: { partition: this.partition } }));
  }

  // ---------------------------------------------------------------------------
  // Open, fail, fence

  private async openLoop(): Promise<void> {
    while (this.stateValue === "opening" || this.stateValue === "rewinding" || this.stateValue === "failed-closed") {
      this.ctx.intake.pause(this.partition);
      try {
        await this.open();
        return;
      } catch (err) {
        if ((this.stateValue as OwnerState) === "closed") return;
        if (isFencing(err)) return this.fenced(err);
        this.failuresInARow++;
        const closedFail = err instanceof WritError && err.code === "ledger_unreadable";
        if (closedFail) {
          this.stateValue = "failed-closed";
          this.ctx.health.problem(`ledger-${this.partition}`, (err as Error).message);
          this.log.error({ err }, "ledger partition unreadable: not processing this partition (fail closed); see the runbook");
        } else {
          this.log.warn({ err, attempt: this.failuresInARow }, "opening the partition failed; trying again");
        }
        await sleep(closedFail ? 30_000 : this.backoffMs());
      }
    }
  }

  private async open(): Promise<void> {
    const { kafka, config, reader, admin, encoder } = this.ctx;
    const started = Date.now();
    const producer = await ownerProducer(kafka, {
      transactionalId: transactionalIdFor(config, this.partition),
      transactionTimeoutMs: config.transactionTimeoutMs,
      protocol: config.transactionProtocol,
      spacingMs: config.transactionSpacingMs,
    });
    let ledger: PartitionLedger;
    try {
      // Connecting runs InitProducerId, which fences whoever holds this partition now: a released owner must not.
      if ((this.stateValue as OwnerState) === "closed") throw new WritError("producer_fenced", "released while opening", { retriable: true });
      await producer.connect();
      if ((this.stateValue as OwnerState) === "closed") throw new WritError("producer_fenced", "released while opening", { retriable: true });
      const nonce = randomUUID();
      // InitProducerId fences the previous owner and aborts its open transaction; the marker is written
      // with the new epoch, and its commit marker also closes a transaction of this id left hanging on
      // ledger partition p (see healTargets).
      const marker = await this.ctx.codec.encode(config.topics.ledger, "LedgerEntry", {
        kind: "marker",
        partition: this.partition,
        nonce,
        owner: config.instanceId,
        at: new Date().toISOString(),
      });
      await this.transact(producer, [{ topic: config.topics.ledger, partition: this.partition, key: markerKey(this.partition), value: marker }], null);
      const restored = await reader.restore(this.partition, nonce, config.restoreTimeoutMs);
      // `pending` entries acknowledged in a transaction that was then aborted (its owner crashed or the transaction
      // failed): their PATCH may have gone out. Taken up as in doubt, like committed ones, and committed again.
      const inDoubt = this.ctx.ablateInDoubtScan ? new Map<string, LedgerIntentEntry>() : await this.ctx.inDoubtReader.scanInDoubt(this.partition, nonce, config.restoreTimeoutMs, restored);
      ledger = new PartitionLedger(this.partition, concat(restored.entries, inDoubt));
      if (inDoubt.size > 0) {
        this.log.warn({ entries: inDoubt.size, intentKeys: [...inDoubt.keys()].slice(0, 20) }, "pending entries of an aborted transaction found; taken up as in doubt (reconciled before any write)");
      }
      const again = await Promise.all([...inDoubt.values()].map((entry) => encoder.ledgerEntry(entry, this.partition)));
      const heal = [...again, ...(await this.healTargets(ledger))];
      if (heal.length > 0) await this.transact(producer, heal, null);
      const groupOffset = await startOffset(admin, config.groupId, config.topics.intents, this.partition);
      // The ledger's progress entry went in with the last committed results; the group's offset lags it (or,
      // written by an older version without progress entries, stands alone).
      const next = ledger.progress !== null && ledger.progress > groupOffset ? ledger.progress : groupOffset;
      if ((this.stateValue as OwnerState) === "closed") throw new WritError("producer_fenced", "released while opening", { retriable: true });
      this.session = new Session(producer, ledger);
      this.expectedNext = next;
      this.lastCommittedOffset = groupOffset;
      this.lastProgress = next;
      this.stateValue = "running";
      this.ctx.health.clear(`ledger-${this.partition}`);
      this.ctx.intake.seek(this.partition, next.toString());
      this.ctx.intake.resume(this.partition);
      const session = this.session;
      this.log.info(
        {
          entries: ledger.size,
          healed: heal.length - again.length,
          inDoubt: again.length,
          offset: next.toString(),
          groupOffset: groupOffset.toString(),
          session: session.seq,
          transactions: producer.protocol,
          ms: Date.now() - started,
        },
        "partition restored; owning it",
      );
      this.ctx.observe?.opened?.(this.partition, Date.now() - started);
      this.track(session, this.commitLoop(session));
    } catch (err) {
      await producer.disconnect().catch(() => undefined);
      throw err;
    }
  }

  /**
   * Every partition this partition's transactional id may have left a
   * transaction open on, beside the ledger partition the marker already
   * touched: each reply topic its ledger names, `writ.human` and `writ.dlq`.
   *
   * Why this heals: a partition's last stable offset stays at the first offset
   * of the earliest transaction still open on it, and on the partition leader
   * a transaction is completed only by a control marker for the same producer
   * id (Kafka's ProducerStateManager, KIP-98). The coordinator writes markers
   * only to partitions added to the transaction being ended, and it skips a
   * partition whose leader it cannot find ("likely deleted already"), which
   * after a broker crash can leave a committed transaction without its marker
   * forever. A transaction of the same transactional id (same producer id,
   * epoch bumped by InitProducerId) that writes to that partition and commits
   * gets a marker there, and that marker completes the producer's open
   * transaction on it, from the old first offset: the last stable offset moves.
   */
  private async healTargets(ledger: PartitionLedger): Promise<OutRecord[]> {
    const { topics } = this.ctx.config;
    const counts = await this.ctx.topicDirectory.partitionCounts([...ledger.replyTopics(), topics.human, topics.dlq]);
    const out: OutRecord[] = [];
    for (const [topic, count] of counts) for (let p = 0; p < count; p++) out.push(healRecord(topic, p));
    return out;
  }

  /**
   * One transaction of records (and, if given, the consumed offset). Resolves
   * with when each phase ended, in ms from its start (for the debug timeline):
   * sends (Produce; under transactions v1 AddPartitionsToTxn first), offsets
   * (TxnOffsetCommit; v1: AddOffsetsToTxn first), commit (EndTxn). See
   * transactions.ts.
   */
  private async transact(
    producer: OwnerProducer,
    records: readonly OutRecord[],
    nextOffset: bigint | null,
    open: OwnerTransaction | null = null,
  ): Promise<{ sent: number; offsets: number; committed: number }> {
    const { config } = this.ctx;
    const t0 = performance.now();
    const at = () => Math.round((performance.now() - t0) * 10) / 10;
    // The open transaction, with the `pending` entries already sent into it, if there is one.
    const txn = open ?? (await producer.transaction());
    try {
      for (const round of sendRounds(records, config.maxMessageBytes)) await txn.send(round);
      const sent = at();
      if (nextOffset !== null) await txn.sendOffset({ groupId: config.groupId, topic: config.topics.intents, partition: this.partition, offset: nextOffset });
      const offsets = at();
      const topics = new Set(records.map((r) => r.topic));
      if (open) topics.add(config.topics.ledger);
      await this.ctx.hooks?.beforeCommit?.({ partition: this.partition, topics: [...topics] });
      await txn.commit();
      return { sent, offsets, committed: at() };
    } catch (err) {
      await txn.abort().catch(() => undefined);
      throw err;
    }
  }

  /** A failed transaction: drop everything uncommitted and open the partition again (restoring from the topic). */
  private async rewind(session: Session, err: unknown): Promise<void> {
    if (this.session !== session || this.stateValue !== "running") return;
    this.stateValue = "rewinding";
    this.failuresInARow++;
    if (this.failuresInARow >= STUCK_AFTER_FAILURES) {
      // The same committed state failing again and again: the partition is not moving. Say so where a person looks.
      this.ctx.health.problem(`partition-${this.partition}`, `transactions failed ${this.failuresInARow} times in a row: ${(err as Error)?.message ?? String(err)}`);
      this.log.error({ err, attempt: this.failuresInARow }, "transaction failed again; the partition is not moving");
    } else {
      this.log.warn({ err, attempt: this.failuresInARow }, "transaction failed; reopening the partition from its committed state");
    }
    await this.endSession(err);
    if ((this.stateValue as OwnerState) === "closed") return;
    await sleep(this.backoffMs());
    if ((this.stateValue as OwnerState) !== "rewinding") return;
    this.opened = this.openLoop();
  }

  /**
   * A failed Kafka call of `session`: fenced, or rewind. Not awaited by the
   * caller, a task of the session: ending the session waits for its tasks
   * (the session is aborted before the first await of either path, so the
   * caller stops at once).
   */
  private failed(session: Session, err: unknown): void {
    (isFencing(err) ? this.fenced(err) : this.rewind(session, err)).catch((e: unknown) => this.log.error({ err: e }, "ending the session failed"));
  }

  private async fenced(err: unknown): Promise<void> {
    if (this.stateValue === "closed" || this.stateValue === "fenced") return;
    this.stateValue = "fenced";
    this.log.warn({ err }, "fenced by a newer owner of this partition; it is no longer processed here");
    await this.endSession(err);
    this.ctx.onFenced(this.partition);
  }

  /** Stops the session: no new work, in-flight calls finish (bounded by their deadlines), staged work is dropped. */
  private async endSession(reason: unknown): Promise<void> {
    const session = this.session;
    this.session = null;
    this.ctx.intake.pause(this.partition);
    this.staged = emptyStaged();
    const err = reason instanceof Error ? reason : new Error(String(reason));
    const unsent = session?.toSend ?? [];
    if (session) session.toSend = [];
    for (const p of unsent) p.reject(err);
    this.inbox = [];
    for (const slot of this.slots.values()) slot.trace?.abandoned(err.message);
    this.slots.clear();
    this.scheduler = new KeyScheduler(this.ctx.config.maxInFlightPerPartition);
    this.healRequests.clear();
    this.wake?.();
    if (!session) return;
    session.abort.abort(err);
    const bound = sleep(this.ctx.config.sorTimeoutMs * 3).then(() => "timeout" as const);
    const settled = await Promise.race([Promise.allSettled([...session.tasks]).then(() => "done" as const), bound]);
    if (settled === "timeout") this.log.warn("in-flight work did not finish in time; closing the producer anyway");
    // The open transaction is aborted, not left to the next owner's InitProducerId or the transaction timeout (it
    // would hold the last stable offset of the partitions it wrote until then). Its `pending` entries are then
    // found by the next restore's scan (see open()).
    const open = session.takeOpen();
    if (open) await Promise.race([open.abort().catch(() => undefined), sleep(this.ctx.config.sorTimeoutMs)]);
    await session.producer.disconnect().catch(() => undefined);
  }

  /** The outage backoff after `failures` in a row (the partition's own by default): doubling, capped, ±20 % jitter. */
  private backoffMs(failures = this.failuresInARow): number {
    const { outageBackoffInitialMs, outageBackoffMaxMs } = this.ctx.config;
    const base = Math.min(outageBackoffMaxMs, outageBackoffInitialMs * 2 ** Math.min(failures, 16));
    return base * (0.8 + Math.random() * 0.4);
  }

  private track(session: Session, task: Promise<void>): void {
    const t = task.catch((err: unknown) => {
      if (session.active) this.log.error({ err }, "owner task failed unexpectedly");
    });
    session.tasks.add(t);
    void t.finally(() => session.tasks.delete(t));
  }

  // ---------------------------------------------------------------------------
  // Intake: admission in offset order, then the key scheduler

  private pump(): void {
    const session = this.session;
    if (!session || this.admitting) return;
    this.admitting = true;
    this.track(
      session,
      this.admitLoop(session).finally(() => {
        this.admitting = false;
      }),
    );
  }

  private async admitLoop(session: Session): Promise<void> {
    const { config } = this.ctx;
    let outages = 0;
    while (session.active && this.inbox.length > 0) {
      const message = this.inbox[0]!;
      const slot: Slot = { seq: ++this.seq, offset: BigInt(message.offset), message, pendingDurable: false, failures: 0, outages: 0, times: { accepted: Date.now() } };
      const source = { topic: config.topics.intents, partition: this.partition, offset: message.offset };
      let admission;
      try {
        admission = await admit(message, source, this.ctx.admission);
      } catch (err) {
        // The registry (or the cluster's metadata) is unreachable: that says nothing about the record.
        if (!session.active) return;
        outages++;
        this.log.warn({ err, offset: message.offset }, "cannot decode intents now (registry unreachable?); pausing intake");
        await this.pause(session, outages);
        continue;
      }
      if (!session.active) return;
      outages = 0;
      this.inbox.shift();
      this.slots.set(slot.seq, slot);
      slot.trace = IntentTrace.start(message, source, admission.kind === "admitted" ? admission.admitted : undefined, slot.times.accepted);
      if (admission.kind === "answered") {
        this.log.warn({ offset: message.offset, reason: admission.reason }, "intent answered at admission");
        this.track(session, this.settle(session, slot, admission.effects));
        continue;
      }
      if (admission.kind === "forward") {
        // Another client's partitioner put it here: its key's partition is its owner's. Forwarded in this
        // owner's transaction with the consumed offset: exactly once, and handled there like any intent.
        // Debug, not warn: a fleet of agents on librdkafka's default partitioner sends most intents this way. Counted in writ_forwarded_total.
        this.log.debug({ offset: message.offset, to: admission.partition }, "intent on the wrong partition for its key; forwarded to its owner partition");
        this.ctx.observe?.forwarded?.(admission.partition);
        this.track(session, this.settle(session, slot, effects({ forwards: [{ partition: admission.partition, message, from: source }] })));
        continue;
      }
      if (admission.kind === "resolution") {
        slot.resolution = { resolution: admission.resolution, tool: admission.tool, entityKey: admission.entityKey, replyTo: admission.replyTo };
        // Serialized with the escalated intent's record and key, like any intent of theirs.
        this.scheduler.add(slot, [admission.entityKey, `key:${admission.resolution.intent.intentKey}`]);
        this.startReady(session);
        continue;
      }
      slot.admitted = admission.admitted;
      this.scheduler.add(slot, [admission.admitted.entityKey, `key:${this.ctx.pipeline.ledgerKey(admission.admitted)}`]);
      this.startReady(session);
    }
  }

  private startReady(session: Session): void {
    if (!session.active) return;
    for (const slot of this.scheduler.take()) {
      slot.times.started = Date.now();
      this.working++;
      this.track(
        session,
        this.run(session, slot).finally(() => {
          this.working--;
          this.nudge();
        }),
      );
    }
  }

  // ---------------------------------------------------------------------------
  // One intent

  private async run(session: Session, slot: Slot): Promise<void> {
    if (slot.resolution) return this.runResolution(session, slot, slot.resolution);
    const a = slot.admitted!;
    const { pipeline, config } = this.ctx;
    let durable: Promise<void> | null = null;
    // `pending` was not staged (its encoding met a registry outage): once the failure has surfaced (the write
    // waits for `durable`, so nothing was sent), the next try stages it again. A failed transaction ends the session.
    let pendingFailed = false;
    // Counted as working (about to produce something to commit) throughout: `durable` waits for the broker's
    // acknowledgement of the pending entry, not for a commit, so the commit loop may linger for this intent's result.
    const waitDurable = async () => {
      if (durable) await durable;
    };
    const exec = {
      mayWrite: () => session.active && this.ctx.lease.confirmed(),
      durable: waitDurable,
      // Who writes: the instance, and which of its sessions (a fenced session must never write again).
      headers: { "x-writ-owner": `${config.instanceId} p${this.partition} s${session.seq}`, ...slot.trace?.headers },
    };
    while (session.active) {
      try {
        if (slot.result) return await this.settle(session, slot, slot.result);
        // A record's lease, looked at once as the intent starts: the record's intents run one at a time.
        slot.gate ??= this.leaseGate(session, a);
        slot.plan ??= isLeaseOp(a.intent.lease) ? undefined : pipeline.classify(a, session.ledger);
        const plan = slot.plan;
        const refusal = plan && plan.kind !== "settled" && !slot.pendingDurable && !this.ctx.ablateLeases ? leaseRefusal(a, slot.gate, new Date().toISOString()) : null;
        let step;
        if (!plan) step = await settleLeaseIntent(a, slot.gate, new Date(), exec.headers);
        else if (plan.kind === "settled") step = plan;
        else if (refusal) step = { kind: "settled" as const, effects: refusal, note: "lease refused" };
        else if (plan.kind === "repeat-conflict") step = await pipeline.repeatConflict(a, plan, exec);
        else {
          if (!slot.pendingDurable) {
            // Step 3 runs beside the read: only the PATCH waits for `pending` to be durable.
            const staging = this.stagePending(session, plan.pending).then(() => void (slot.times.durable = Date.now()));
            staging.catch(() => void (pendingFailed = true));
            durable = staging;
            slot.pendingDurable = true;
          }
          step = await pipeline.execute(a, plan.pending, plan.state, exec);
          // Settling waits for the pending entry too: its transaction must not fail after the result is staged.
          await waitDurable();
        }
        if (!session.active) return;
        if (step.kind === "settled") {
          slot.result = step.effects;
          await this.settle(session, slot, step.effects);
          return;
        }
        slot.outages++;
        if (slot.outages === 1) this.log.warn({ intentKey: a.intent.intentKey, entity: a.entityKey, reason: step.reason }, "system of record unavailable; pausing this intent");
        this.ctx.health.outage(a.tool.system.name, step.reason);
        await this.pause(session, slot.outages);
      } catch (err) {
        if (!session.active) return;
        if (pendingFailed) {
          pendingFailed = false;
          durable = null;
          slot.pendingDurable = false;
        }
        // A registry outage (also one a retry gave up on) is an outage: pause, never count it as a failure.
        if (isRegistryOutage(err)) {
          slot.outages++;
          await this.pause(session, slot.outages);
          continue;
        }
        slot.failures++;
        this.log.error({ err, intentKey: a.intent.intentKey, entity: a.entityKey, tool: a.tool.name, attempt: slot.failures }, "intent processing failed");
        if (slot.failures < config.maxProcessingAttempts) {
          await this.pause(session, slot.failures);
          continue;
        }
        const plan = slot.plan?.kind === "write" ? slot.plan : null;
        const step = this.ctx.pipeline.failed(a, plan && slot.pendingDurable ? plan.pending : null, plan?.state ?? null, err);
        const source = { topic: config.topics.intents, partition: this.partition, offset: slot.message.offset };
        if (step.kind === "settled") {
          step.effects.deadLetters.push(deadLetterOf(slot.message, source, "processing_failed", (err as Error)?.message ?? String(err), new Date().toISOString()));
          await this.settle(session, slot, step.effects).catch((e: unknown) => this.log.error({ err: e }, "could not settle a failed intent"));
        }
        return;
      }
    }
  }

  /** A person's decision on an escalation: planned against the ledger, and written like an intent (pending first). */
  private async runResolution(session: Session, slot: Slot, res: NonNullable<Slot["resolution"]>): Promise<void> {
    const { config } = this.ctx;
    let durable: Promise<void> | null = null;
    // As for an intent: a pending entry that was not staged is staged again once its failure has surfaced.
    let pendingFailed = false;
    const exec = {
      mayWrite: () => session.active && this.ctx.lease.confirmed(),
      durable: async () => {
        if (durable) await durable;
      },
      headers: { "x-writ-owner": `${config.instanceId} p${this.partition} s${session.seq}` },
    };
    while (session.active) {
      try {
        if (slot.result) return await this.settle(session, slot, slot.result);
        res.plan ??= this.resolver.plan(res.resolution, res.tool, res.replyTo, session.ledger);
        const plan = res.plan;
        if (plan.kind === "settled") return await this.settle(session, slot, plan.effects);
        if (!durable) {
          const staging = this.stagePending(session, plan.pending, { resolution: true });
          staging.catch(() => void (pendingFailed = true));
          durable = staging;
        }
        const step = await this.resolver.apply(res.resolution, res.tool, res.replyTo, plan, exec);
        await durable;
        if (!session.active) return;
        if (step.kind === "settled") {
          this.log.info({ escalationId: res.resolution.escalationId, decision: res.resolution.decision, note: step.note }, "escalation resolution carried out");
          slot.result = step.effects;
          return await this.settle(session, slot, step.effects);
        }
        slot.outages++;
        await this.pause(session, slot.outages);
      } catch (err) {
        if (!session.active) return;
        if (pendingFailed) {
          pendingFailed = false;
          durable = null;
        }
        if (isRegistryOutage(err)) {
          slot.outages++;
          await this.pause(session, slot.outages);
          continue;
        }
        slot.failures++;
        this.log.error({ err, escalationId: res.resolution.escalationId }, "resolution failed");
        if (slot.failures >= config.maxProcessingAttempts) {
          const at = new Date().toISOString();
          const reply = rejectedReply(res.resolution.resolutionId, res.resolution.intent.intentKey, "processing_failed", `the resolution failed: ${(err as Error).message}`.slice(0, 2000), at);
          // The escalation stays open: put the entry back if this resolution had reopened it.
          const back = res.plan?.kind === "apply" ? { ledger: { ...res.plan.entry, updatedAt: at } } : {};
          return await this.settle(session, slot, effects({ ...back, replies: [{ topic: res.replyTo, value: reply }] }));
        }
        await this.pause(session, slot.failures);
      }
    }
  }

  /** The lease gate of an intent; an expired lease it finds is released here (counted, and logged: its agent stalled). */
  private leaseGate(session: Session, a: AdmittedIntent): LeaseGate {
    const gate = leaseGate(session.ledger, a, Date.now());
    if (gate.kind === "free" && gate.expired) this.releaseExpired(session, gate.expired);
    // The ablation control: another change's lease stops nothing, and a step never needs its own.
    if (this.ctx.ablateLeases && gate.kind !== "mine") return a.intent.lease && gate.kind === "held" ? { kind: "mine", lease: gate.lease } : { kind: "free" };
    return gate;
  }

  private releaseExpired(session: Session, lease: LedgerLeaseEntry): void {
    const key = entityKey(lease.entity);
    session.ledger.stageLease(key, null);
    this.markStaged();
    this.staged.records.push(this.ctx.encoder.leaseTombstone(key, this.partition));
    this.log.warn(
      { entity: key.slice(0, 300), agent: lease.agentId, change: lease.change, acquiredAt: lease.acquiredAt, expiresAt: lease.expiresAt },
      "lease expired and released: its change did not finish in time (a stalled or crashed agent?)",
    );
    this.ctx.observe?.leaseExpired?.(this.partition, lease.entity.type);
    this.nudge();
  }

  private async pause(session: Session, tries: number): Promise<void> {
    await sleep(this.backoffMs(tries - 1), undefined, { signal: session.abort.signal }).catch(() => undefined);
  }

  /**
   * Step 3: `pending` is sent into the partition's open transaction; resolves
   * once the broker acknowledged it (acks=all), not when it commits: the
   * next commit (within `commitLingerMs`, with the results that followed)
   * makes it visible. Durable before the write all the same: a crash or a
   * failed transaction aborts it, and the next restore finds it with a
   * read_uncommitted scan (see open()); a zombie's send after a new owner's
   * InitProducerId is refused for its epoch, so its write never starts.
   */
  private async stagePending(session: Session, pending: LedgerIntentEntry, opts: { resolution?: boolean } = {}): Promise<void> {
    const record = await this.ctx.encoder.ledgerEntry(pending, this.partition);
    if (!session.active) throw new WritError("producer_fenced", "session ended", { retriable: true });
    const durable = new Promise<void>((resolve, reject) => session.toSend.push({ record, resolve, reject }));
    session.ledger.stage(pending, opts);
    this.markStaged();
    this.sendPendings(session);
    await durable;
  }

  /** Sends the `pending` entries waiting into the open transaction (beginning one), behind any Kafka call in flight. */
  private sendPendings(session: Session): void {
    if (session.sendQueued) return;
    session.sendQueued = true;
    // Tracked: a session ends only after its sends (and, once they are done, aborts the transaction they opened).
    this.track(
      session,
      session.serial(async () => {
        session.sendQueued = false;
        const batch = session.toSend;
        session.toSend = [];
        if (batch.length === 0) return;
        if (!session.active || this.session !== session) {
          for (const p of batch) p.reject(new WritError("producer_fenced", "session ended", { retriable: true }));
          return;
        }
        try {
          session.openTxn ??= await session.producer.transaction();
          for (const round of sendRounds(batch.map((p) => p.record), this.ctx.config.maxMessageBytes)) await session.openTxn.send(round);
          if (session.inOpenTxn === 0) session.openSince = Date.now();
          session.inOpenTxn += batch.length;
        } catch (err) {
          for (const p of batch) p.reject(err as Error);
          this.failed(session, err);
          return;
        }
        for (const p of batch) p.resolve();
        // The commit loop commits the open transaction now that it holds entries.
        this.nudge();
      }),
    );
  }

  /** Notes when the oldest change waiting for a commit came: the first one after a commit. */
  private markStaged(): void {
    const session = this.session;
    if (this.staged.records.length === 0 && (session?.toSend.length ?? 0) === 0 && (session?.inOpenTxn ?? 0) === 0) this.stagedSince = Date.now();
  }

  /** An intent's result goes into the next transaction; its record's next intent may start. */
  private async settle(session: Session, slot: Slot, result: Effects): Promise<void> {
    const records = await this.ctx.encoder.encode(result, this.partition);
    if (!session.active) return;
    slot.outcome = intentOutcome(slot.admitted, result);
    slot.trace?.settled(slot.outcome);
    slot.trace?.stamp(records, this.ctx.config.topics.ledger);
    if (result.ledger) session.ledger.stage(result.ledger, { resolution: slot.resolution !== undefined });
    if (result.lease) session.ledger.stageLease(result.lease.entityKey, result.lease.entry);
    this.markStaged();
    this.staged.records.push(...records);
    this.staged.slots.push(slot);
    slot.txn = -1;
    slot.times.settled = Date.now();
    this.scheduler.done(slot);
    this.startReady(session);
    this.nudge();
  }

  // ---------------------------------------------------------------------------
  // Transactions

  private nudge(): void {
    const wake = this.wake;
    this.wake = null;
    wake?.();
  }

  private async commitLoop(session: Session): Promise<void> {
    while (session.active) {
      const behind = this.watermark() > this.lastCommittedOffset;
      const offsetDue = behind && Date.now() >= this.offsetAloneAt();
      const nothingButPendings = this.staged.records.length === 0 && this.healRequests.size === 0 && !this.sweepDue && !offsetDue;
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
      if (this.working > 0 && linger > 0) {
        await Promise.race([new Promise<void>((resolve) => (this.wake = resolve)), sleep(linger)]);
        this.wake = null;
        if (this.working > 0 && this.ctx.config.commitLingerMs - (Date.now() - this.stagedSince) > 0) continue;
      }
      await this.commitOnce(session);
    }
  }

  private async commitOnce(session: Session): Promise<void> {
    const { config, encoder } = this.ctx;
    if (this.sweepDue) {
      this.sweepDue = false;
      const cutoff = new Date(Date.now() - config.ledgerRetentionHours * 3_600_000);
      const expired = session.ledger.expired(cutoff, 1000);
      for (const key of expired) {
        session.ledger.tombstone(key);
        this.staged.records.push(encoder.tombstone(key, this.partition));
      }
      if (expired.length > 0) this.log.info({ tombstones: expired.length }, "ledger entries past retention tombstoned");
      for (const lease of session.ledger.expiredLeases(Date.now(), 1000)) this.releaseExpired(session, lease);
    }
    const batch = this.staged;
    this.staged = emptyStaged();
    const txn = ++this.txnSeq;
    for (const slot of batch.slots) slot.txn = txn;
    for (const [topic, partitions] of this.healRequests) for (const p of partitions) batch.records.push(healRecord(topic, p));
    this.healRequests.clear();
    session.ledger.takeStaged();
    const offset = this.watermark();
    const began = Date.now();
    // Where intake stands goes into every transaction that moves it, as the ledger's progress entry: one small
    // record in a partition the transaction mostly writes anyway, no extra round trip. A new owner resumes there.
    const progressed = offset > this.lastProgress;
    // The group's offset (for tools that read group lag, and for a ledger without progress) goes in at most every
    // offsetCommitIntervalMs: AddOffsetsToTxn and TxnOffsetCommit are two more round trips. It lags, never leads.
    const advance = offset > this.lastCommittedOffset;
    const withOffset = advance && began - this.lastOffsetCommitAt >= this.ctx.config.offsetCommitIntervalMs;
    if (advance && !withOffset) this.scheduleOffsetCommit();
    const span = batch.slots.length > 0 ? startTransactionSpan(this.partition, batch.slots.map((x) => x.trace), batch.records.length) : null;
    let phases: { sent: number; offsets: number; committed: number };
    /** `pending` entries sent into the open transaction before this commit took it. */
    let pendings = 0;
    try {
      if (progressed) batch.records.push(await this.progressRecord(offset));
      phases = await session.serial(() => {
        pendings = session.inOpenTxn;
        return this.transact(session.producer, batch.records, withOffset ? offset : null, session.takeOpen());
      });
    } catch (err) {
      span?.failed(err);
      this.failed(session, err);
      return;
    }
    span?.committed();
    for (const slot of batch.slots) slot.trace?.committed(span);
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
        { txn, ms: now - began, phases, withOffset, records: batch.records.length + pendings, results: batch.slots.length, pendings, timeline },
        "transaction committed",
      );
    }
    if (this.failuresInARow > 0) this.ctx.health.clear(`partition-${this.partition}`);
    this.failuresInARow = 0;
    this.lastTxnAt = Date.now();
    session.ledger.committedSending();
    if (progressed) this.lastProgress = offset;
    if (withOffset) {
      this.lastCommittedOffset = offset;
      this.lastOffsetCommitAt = began;
    }
    for (const slot of batch.slots) this.slots.delete(slot.seq);
    if (this.load < config.maxBufferedPerPartition / 2) this.ctx.intake.resume(this.partition);
    this.pump();
  }

  private async progressRecord(offset: bigint): Promise<OutRecord> {
    const { config, codec } = this.ctx;
    const value = await codec.encode(config.topics.ledger, "LedgerEntry", {
      kind: "progress",
      partition: this.partition,
      offset: offset.toString(),
      at: new Date().toISOString(),
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

  /** The offset to commit: the first intent whose result is not in this or an earlier transaction. */
  private watermark(): bigint {
    for (const slot of this.slots.values()) if (slot.txn === undefined || slot.txn === -1) return slot.offset;
    const waiting = this.inbox[0];
    return waiting ? BigInt(waiting.offset) : this.expectedNext;
  }
}

/** Fencing, by kafkajs error type anywhere in the cause chain: a newer owner holds the transactional id. */
export function isFencing(err: unknown): boolean {
  const FENCED = new Set(["INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED", "INVALID_PRODUCER_ID_MAPPING", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED"]);
  let current: unknown = err;
  for (let depth = 0; depth < 8 && current !== null && typeof current === "object"; depth++) {
    const type = (current as { type?: unknown }).type;
    if (typeof type === "string" && FENCED.has(type)) return true;
    if (current instanceof WritError && current.code === "producer_fenced") return false;
    current = (current as { cause?: unknown; originalError?: unknown }).cause ?? (current as { originalError?: unknown }).originalError;
  }
  return false;
}

/** The restored entries, then the in-doubt ones (later in the topic than any committed record of their keys). */
function* concat<K, V>(...maps: ReadonlyMap<K, V>[]): Generator<[K, V]> {
  for (const m of maps) yield* m;
}
