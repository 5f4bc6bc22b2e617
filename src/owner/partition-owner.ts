import { setTimeout as sleep } from "node:timers/promises";
import type { KafkaMessage } from "kafkajs";
import { isRegistryOutage, WritError } from "../errors.ts";
import { withDeadline } from "../deadline.ts";
import { componentLogger, type Logger } from "../logger.ts";
import type { LedgerLeaseEntry } from "../schemas/ledger-entry.ts";
import { intentOutcome } from "../metrics/outcome.ts";
import type { PartitionFigures } from "../metrics/router-metrics.ts";
import { IntentTrace } from "../tracing/spans.ts";
import { type Admission, type AdmittedIntent, admit, intentFingerprints, mayHaveRepliedOn, maxIntentAgeMs } from "./admission.ts";
import { CommitLoop } from "./commit-loop.ts";
import { type RunHost, runIntent } from "./intent-run.ts";
import { deadLetterOf, effects, type Effects } from "./effects.ts";
import { Resolver } from "./resolution.ts";
import { KeyScheduler } from "./key-scheduler.ts";
import type { OwnerContext } from "./owner-context.ts";
import { Session, type Slot } from "./owner-session.ts";
import { restorePartition } from "./partition-restore.ts";
import { forwardOf, type OutRecord } from "./records.ts";
import { entityKey } from "../schemas/common.ts";
import { type LeaseGate, lapsedLease, leaseGate } from "./record-leases.ts";
import { answerRefused, answerRefusedResolution, type RefusedFacts, resolutionInDoubt } from "./refusals.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import { sorResponseBudget } from "../sor/response-budget.ts";

export { transactionalIdFor } from "./partition-restore.ts";

export type OwnerState = "opening" | "running" | "rewinding" | "failed-closed" | "fenced" | "closed";

/**
 * The single writer of one intents partition: a thin driver of Kafka
 * transactions around the intent pipeline. See docs/architecture.md §4.3, §5.1, §5.3 and §6.
 *
 * - **Open.** A new transactional producer (its InitProducerId fences the
 *   previous owner and aborts its open transaction), a marker in ledger
 *   partition p, the ledger restored from the topic up to that marker, then a
 *   heal transaction touching every partition this transactional id may have
 *   left a transaction open on (partition-restore.ts); then intake resumes
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
  private readonly resolver: Resolver;
  private readonly log: Logger;
  private stateValue: OwnerState = "opening";
  private session: Session | null = null;
  private readonly slots = new Map<number, Slot>();
  private inbox: KafkaMessage[] = [];
  private scheduler: KeyScheduler<Slot>;
  private seq = 0;
  /** Next offset intake accepts; lower offsets are re-deliveries. */
  private expectedNext = -1n;
  private admitting = false;
  private failuresInARow = 0;
  /** Slots running and not waiting for a commit: they will stage something soon (not those paused without their place). */
  private working = 0;
  /** Slots paused by an outage and waiting for their in-flight place back: each wakes when {@link startReady} hands it one. */
  private readonly waking = new Map<Slot, () => void>();
  /** What the next transaction carries, and when it commits (commit-loop.ts). */
  private readonly commits: CommitLoop;
  /** What an intent's run uses of this owner (intent-run.ts). */
  private readonly runHost: RunHost;
  private opened: Promise<void> | null = null;

  constructor(partition: number, ctx: OwnerContext) {
    this.partition = partition;
    this.ctx = ctx;
    this.log = componentLogger(ctx.log, "partition-owner", { topic: ctx.config.topics.intents, partition });
    this.scheduler = new KeyScheduler(ctx.config.maxInFlightPerPartition, ctx.config.maxPausedPerPartition);
    this.resolver = new Resolver({ retryAfterMaxMs: ctx.config.sorRetryAfterMaxMs });
    this.commits = new CommitLoop(ctx, {
      partition,
      log: this.log,
      working: () => this.working,
      watermark: (session) => (this.session === session ? this.watermark() : null),
      current: (session) => this.session === session,
      busy: (ledgerKey) => this.scheduler.holds(keyQueue(ledgerKey)),
      failed: (session, err) => this.failed(session, err),
      track: (session, task) => this.track(session, task),
      committed: (slots) => this.committed(slots),
      releaseExpired: (session, lease) => this.releaseExpired(session, lease),
    });
    this.runHost = {
      ctx,
      log: this.log,
      partition,
      resolver: this.resolver,
      stagePending: (session, pending, opts) => this.commits.stagePending(session, pending, opts),
      settle: (session, slot, result) => this.settle(session, slot, result),
      pause: (session, tries, retryAfterMs) => this.pause(session, tries, retryAfterMs),
      outagePause: (session, slot, retryAfterMs) => this.outagePause(session, slot, retryAfterMs),
      leaseGate: (session, a) => this.leaseGate(session, a),
    };
  }

  get state(): OwnerState {
    return this.stateValue;
  }

  /** Intents fetched and not yet committed: the intake pauses this partition above `maxBufferedPerPartition`. */
  get load(): number {
    return this.inbox.length + this.slots.size;
  }

  /**
   * Figures for metrics while it runs (null otherwise): ledger entries, pending entries and the oldest one's time,
   * open escalations and the oldest one's time, leases held, the committed offset.
   */
  stats(): Omit<PartitionFigures, "partition"> | null {
    const ledger = this.stateValue === "running" ? this.session?.ledger : undefined;
    if (!ledger) return null;
    return {
      ledgerEntries: ledger.size,
      pending: ledger.pendingCount,
      oldestPendingSince: ledger.oldestPendingSince(),
      leases: ledger.leaseCount,
      escalations: ledger.openEscalationCount,
      oldestEscalationSince: ledger.oldestOpenEscalationSince(),
      committedOffset: this.commits.lastProgress,
    };
  }

  /** Reply topics this owner's ledger knows (the partitions it may write). */
  replyTopics(): string[] {
    // Not a topic a foreign ledger entry names (admission.ts mayHaveRepliedOn): a heal there would fail every transaction.
    return this.session?.ledger.replyTopics().filter((t) => mayHaveRepliedOn(t, this.ctx.admission)) ?? [];
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
    // Held (another group of owners may write this ledger meanwhile): no tombstones from a view that may be stale.
    if (this.stateValue !== "running" || this.holding()) return;
    this.commits.requestSweep();
  }

  /** The next transaction writes a control record to these partitions (see `heal.ts`). */
  requestHeal(topic: string, partitions: readonly number[]): void {
    if (this.stateValue !== "running") return;
    this.commits.requestHeal(topic, partitions);
  }

  /**
   * Takes the partition up again after a hold (router.ts): the session ends (intents admitted and not started are
   * dropped, their offsets not committed) and the partition is opened again from the topics, with its checks: the
   * other group may have written the ledger meanwhile. Not counted as a failure.
   */
  reopen(): void {
    const session = this.session;
    if (!session || this.stateValue !== "running") return;
    this.stateValue = "rewinding";
    this.log.info("taking the partition up again after holding it");
    this.endSession(new Error("reopened after a hold"))
      .catch((err: unknown) => this.log.error({ err }, "ending the session failed"))
      // Opened again even when ending the session failed: left rewinding, nothing else would open it.
      .finally(() => {
        if (this.stateValue === "rewinding") this.opened = this.openLoop();
      });
  }

  /** Whether the process holds its partitions (another group of owners): no new intent is admitted or started. */
  private holding(): boolean {
    return this.ctx.holding?.() === true;
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
        if (err instanceof WritError && err.code === "config_invalid") {
          // Another group of owners runs on this intents topic (the take-up check): this process stops, as at its start.
          this.stateValue = "failed-closed";
          this.ctx.health.problem(`ledger-${this.partition}`, err.message);
          this.log.error({ err }, "another group of owners runs on this intents topic: not taking the partition up; this owner stops (one group of owners per intents topic)");
          this.ctx.onConfigInvalid?.(err);
          return;
        }
        this.failuresInARow++;
        // A topic deleted while remembered (a reply topic the restore heals) fails every open until forgotten.
        this.ctx.topicDirectory.forget();
        const closedFail = err instanceof WritError && (err.code === "ledger_unreadable" || err.code === "ledger_foreign_writer");
        if (closedFail) {
          this.stateValue = "failed-closed";
          this.ctx.health.problem(`ledger-${this.partition}`, (err as Error).message);
          if (err.code === "ledger_foreign_writer") this.log.error({ err }, "another group of owners writes, or would write, this ledger partition: not processing this partition (fail closed; tried again in 30 s)");
          else this.log.error({ err }, "ledger partition unreadable: not processing this partition (fail closed); see the runbook");
        } else {
          this.log.warn({ err, attempt: this.failuresInARow }, "opening the partition failed; trying again");
        }
        await sleep(closedFail ? 30_000 : this.backoffMs());
      }
    }
  }

  private async open(): Promise<void> {
    const started = Date.now();
    const released = () => (this.stateValue as OwnerState) === "closed";
    const { producer, ledger, next, groupOffset, healed, inDoubt } = await restorePartition(this.ctx, this.partition, this.log, released);
    try {
      if (released()) throw new WritError("producer_fenced", "released while opening", { retriable: true });
      this.session = new Session(producer, ledger);
      this.expectedNext = next;
      this.commits.opened(groupOffset, next);
      this.stateValue = "running";
      this.ctx.health.clear(`ledger-${this.partition}`);
      this.ctx.intake.seek(this.partition, next.toString());
      this.ctx.intake.resume(this.partition);
      const session = this.session;
      this.log.info(
        {
          entries: ledger.size,
          healed,
          inDoubt,
          offset: next.toString(),
          groupOffset: groupOffset.toString(),
          session: session.seq,
          transactions: producer.protocol,
          ms: Date.now() - started,
        },
        "partition restored; owning it",
      );
      this.ctx.observe?.opened?.(this.partition, Date.now() - started);
      this.track(session, this.commits.run(session));
    } catch (err) {
      await producer.disconnect().catch(() => undefined);
      throw err;
    }
  }



  /** A failed transaction: drop everything uncommitted and open the partition again (restoring from the topic). */
  private async rewind(session: Session, err: unknown): Promise<void> {
    if (this.session !== session || this.stateValue !== "running") return;
    this.stateValue = "rewinding";
    this.failuresInARow++;
    // A topic deleted while remembered (an agent's reply topic) fails every transaction that answers there; asked
    // again, its intents are dead-lettered reply_topic_missing at admission.
    this.ctx.topicDirectory.forget();
    if (this.failuresInARow >= this.ctx.config.stuckAfterFailures) {
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
    const err = reason instanceof Error ? reason : new Error(String(reason));
    const unsent = session?.toSend ?? [];
    if (session) session.toSend = [];
    for (const p of unsent) p.reject(err);
    this.inbox = [];
    for (const slot of this.slots.values()) slot.trace?.abandoned(err.message);
    this.slots.clear();
    this.scheduler = new KeyScheduler(this.ctx.config.maxInFlightPerPartition, this.ctx.config.maxPausedPerPartition);
    this.commits.reset();
    if (!session) return;
    session.abort.abort(err);
    const settled = await withDeadline(Promise.allSettled([...session.tasks]).then(() => "done" as const), this.ctx.config.sorTimeoutMs * 3, () => "timeout" as const);
    if (settled === "timeout") this.log.warn("in-flight work did not finish in time; closing the producer anyway");
    // The open transaction is aborted, not left to the next owner's InitProducerId or the transaction timeout (it
    // would hold the last stable offset of the partitions it wrote until then). Its `pending` entries are then
    // found by the next restore's scan (partition-restore.ts).
    const open = session.takeOpen();
    if (open) await withDeadline(open.abort().catch(() => undefined), this.ctx.config.sorTimeoutMs, () => undefined);
    await session.producer.disconnect().catch(() => undefined);
  }

  /**
   * What answerRefused weighs besides the ledger: the bytes' fingerprint where their tool is deployed here (bytes of
   * other content than the key's write can never be its submission: admitted, they would be key reuse), and whether
   * they are dated further ahead than any ledger retention (a redrive would never run them).
   */
  private refusedFacts(intent: WriteIntent): RefusedFacts {
    const tool = this.ctx.admission.tools.get(intent.tool);
    let fingerprint: string | undefined;
    try {
      fingerprint = tool ? intentFingerprints(tool, intent).fingerprint : undefined;
    } catch {
      // no canonical form of its params: nothing to compare
    }
    const farAhead = Date.parse(intent.createdAt) - Date.now() > maxIntentAgeMs(intent, this.ctx.config.ledgerRetentionHours);
    return { ...(fingerprint !== undefined ? { fingerprint } : {}), farAhead };
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
        // A session that opened while this (ended) session's loop was still inside admit() found intake busy, and so
        // did a record accepted after the loop found the inbox empty and before it got here: either would wait for
        // the next fetch or commit to pump again (on a quiet partition, for good).
        const more = this.session !== session || (this.inbox.length > 0 && !this.holding());
        if (more && this.session?.active) this.pump();
      }),
    );
  }

  private async admitLoop(session: Session): Promise<void> {
    const { config } = this.ctx;
    let outages = 0;
    let failures = 0;
    // Held (another group of owners found): no new intent is admitted; what is fetched waits in the inbox, below the offset committed.
    while (session.active && this.inbox.length > 0 && !this.holding()) {
      const message = this.inbox[0]!;
      const slot: Slot = { seq: ++this.seq, offset: BigInt(message.offset), message, pendingDurable: false, failures: 0, outages: 0, times: { accepted: Date.now() } };
      const source = { topic: config.topics.intents, partition: this.partition, offset: message.offset };
      let admission: Admission;
      try {
        admission = await admit(message, source, this.ctx.admission);
      } catch (err) {
        if (!session.active) return;
        if (admissionOutage(err)) {
          // The registry (or the cluster's metadata) is unreachable: that says nothing about the record.
          outages++;
          this.log.warn({ err, offset: message.offset }, "cannot decode intents now (registry unreachable?); pausing intake");
          await this.pause(session, outages);
          continue;
        }
        // Anything else thrown is a fault of admission on this record (a bug, a tool's code): tried again like an
        // intent's processing, then dead-lettered with the reason, so that one record cannot stop the partition.
        failures++;
        this.log.error({ err, offset: message.offset, attempt: failures }, "admitting an intent failed");
        if (failures < config.maxProcessingAttempts) {
          await this.pause(session, failures);
          continue;
        }
        const why = `admission failed ${failures} times: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000);
        admission = { kind: "answered", reason: "processing_failed", effects: effects({ deadLetters: [deadLetterOf(message, source, "processing_failed", why, new Date().toISOString())] }) };
      }
      if (!session.active) return;
      outages = 0;
      failures = 0;
      this.inbox.shift();
      this.slots.set(slot.seq, slot);
      if (admission.kind === "control") {
        // A heal record: nothing to answer and no intent to count; only its offset, with the next commit.
        slot.times.settled = Date.now();
        this.commits.stage(session, [], slot);
        this.commits.nudge();
        continue;
      }
      slot.trace = IntentTrace.start(message, source, admission.kind === "admitted" ? admission.admitted : undefined, slot.times.accepted);
      if (admission.kind === "answered") {
        this.log.warn({ offset: message.offset, reason: admission.reason }, "intent answered at admission");
        // A refusal of signed bytes: answered from their key's entry when it holds them, else as they were refused
        // before, or remembered for them (refusals.ts), on the topic admission answers on: the registered one, which
        // the intent's own may not be. A signed resolution's: as refused before, or remembered, but while the
        // escalation's pending apply may be theirs, dead-lettered outcome_unknown without a reply (refusals.ts).
        const { signed, resolution } = admission;
        const topic = admission.effects.replies[0]?.topic;
        if (resolution && topic) {
          const answer = answerRefusedResolution(session.ledger, resolution, admission.effects, new Date(), topic);
          if (answer.kind === "in_doubt") this.log.warn({ offset: message.offset, intentKey: resolution.intent.intentKey, reason: admission.reason }, "resolution refused at admission while its apply may be under way; dead-lettered outcome_unknown, no reply");
          this.track(session, this.settle(session, slot, answer.kind === "answer" ? answer.effects : resolutionInDoubt(message, source, admission.effects, new Date())));
          continue;
        }
        const answer =
          signed && topic
            ? answerRefused(session.ledger, this.ctx.pipeline.ledgerKey(signed), signed, admission.effects, new Date(), topic, () => this.refusedFacts(signed.intent))
            : { kind: "answer" as const, effects: admission.effects };
        if (answer.kind === "in_doubt") {
          // Their key's write may stand unsettled: no "nothing written" for it. Dead-lettered with the reason, the
          // agent's submit sees no answer (unknown); sent back once owners admit it, it is reconciled (intent-run.ts).
          const why = `refused ${admission.reason} at admission, but its intent key's ${answer.status} entry holds a write of its tool on its record that may have happened (or may be this submission's); send it back once owners admit it (it is reconciled)`;
          this.log.warn({ offset: message.offset, intentKey: signed!.intent.intentKey, reason: admission.reason, entry: answer.status }, "intent refused at admission while its write is in doubt; dead-lettered outcome_unknown, no reply");
          this.track(session, this.settle(session, slot, effects({ deadLetters: [deadLetterOf(message, source, "outcome_unknown", why, new Date().toISOString())] })));
          continue;
        }
        this.track(session, this.settle(session, slot, answer.effects));
        continue;
      }
      if (admission.kind === "forward") {
        // Built and measured once: the check below and the encoding of the forward share it.
        const forward = forwardOf({ partition: admission.partition, message, from: source });
        // Too large to forward (its headers, inflated): settled here, dead-lettered, and counted so.
        const refused = this.ctx.encoder.unforwardable(forward);
        if (refused) {
          this.log.warn({ offset: message.offset, to: admission.partition }, "intent on the wrong partition for its key, too large to forward with its headers; dead-lettered too_large");
          this.track(session, this.settle(session, slot, effects({ deadLetters: [refused] })));
          continue;
        }
        // Another client's partitioner put it here: its key's partition is its owner's. Forwarded in this
        // owner's transaction with the consumed offset: exactly once, and handled there like any intent.
        // Debug, not warn: a fleet of agents on librdkafka's default partitioner sends most intents this way. Counted in writ_forwarded_total.
        this.log.debug({ offset: message.offset, to: admission.partition }, "intent on the wrong partition for its key; forwarded to its owner partition");
        this.ctx.observe?.forwarded?.(admission.partition);
        this.track(session, this.settle(session, slot, effects({ forwards: [forward] })));
        continue;
      }
      if (admission.kind === "resolution") {
        const { resolution, tool, replyTo, signed } = admission;
        slot.resolution = { resolution, tool, entityKey: admission.entityKey, replyTo, ...(signed ? { signed } : {}) };
        // Serialized with the escalated intent's record and key, like any intent of theirs.
        this.scheduler.add(slot, [admission.entityKey, keyQueue(admission.resolution.intent.intentKey)], admission.tool.system.name);
        this.startReady(session);
        continue;
      }
      slot.admitted = admission.admitted;
      this.scheduler.add(slot, [admission.admitted.entityKey, keyQueue(this.ctx.pipeline.ledgerKey(admission.admitted))], admission.admitted.tool.system.name);
      this.startReady(session);
    }
  }

  private startReady(session: Session): void {
    if (!session.active) return;
    // Held: no new intent starts; a paused one still gets its place back (it is in flight, and finishes).
    for (const slot of this.scheduler.take(!this.holding())) {
      const wake = this.waking.get(slot);
      if (wake) {
        wake();
        continue;
      }
      slot.times.started = Date.now();
      this.working++;
      this.track(
        session,
        // One chain of the answer budget per run: what its reads parsed stays charged until the run ends, however it ends.
        sorResponseBudget.run(() => runIntent(this.runHost, session, slot)).finally(() => {
          this.working--;
          this.commits.nudge();
        }),
      );
    }
  }

  /** The lease gate of an intent; an expired lease it finds is released here (counted, and logged: its agent stalled). */
  private leaseGate(session: Session, a: AdmittedIntent): LeaseGate {
    const gate = leaseGate(session.ledger, a, Date.now());
    if (gate.kind === "free" && gate.expired) this.releaseExpired(session, gate.expired, gate.released ?? null);
    // The ablation control: another change's lease stops nothing, and a step never needs its own.
    if (this.ctx.ablateLeases && gate.kind !== "mine") return a.intent.lease && gate.kind === "held" ? { kind: "mine", lease: gate.lease } : { kind: "free" };
    return gate;
  }

  /**
   * A lease found past its end (by an intent of its record, whose gate says what takes its place, or by the sweep)
   * is let go: its entry becomes `freed` (lapsedLease: free, keeping the replay marks still in force, its own among
   * them), or a tombstone once none is. Staged at once, before anything its record's later intents write: its
   * encoding waits for the transaction, its place does not.
   */
  private releaseExpired(session: Session, lease: LedgerLeaseEntry, freed = lapsedLease(lease, Date.now())): void {
    const key = entityKey(lease.entity);
    session.ledger.stageLease(key, freed);
    this.commits.stage(session, [this.ctx.encoder.leaseEntryLate(key, freed, this.partition)]);
    // A released lease whose replay marks are all past: nothing lapsed, nobody stalled.
    if (lease.releasedAt !== undefined) {
      this.commits.nudge();
      return;
    }
    this.log.warn(
      { entity: key.slice(0, 300), agent: lease.agentId.slice(0, 128), change: lease.change.slice(0, 64), acquiredAt: lease.acquiredAt, expiresAt: lease.expiresAt },
      "lease expired and released: its change did not finish in time (a stalled or crashed agent?)",
    );
    // Any producer to the ledger can write leases naming any record type: the label is one a tool writes, or `other`.
    const type = lease.entity.type;
    const known = [...this.ctx.admission.tools.values()].some((t) => t.recordType === type);
    this.ctx.observe?.leaseExpired?.(this.partition, known ? type : "other");
    this.commits.nudge();
  }

  /**
   * An outage pause of a running intent, its `slot.outages`-th in a row ({@link pause}). It gives its in-flight
   * place back meanwhile (up to `maxPausedPerPartition` of its system paused at once; beyond, it keeps it), so other records of
   * the partition start in its place; its keys stay held, so nothing of its record or intent key passes it. Its
   * next try waits for a place again, in offset order with the intents ready to start (or for the session's end).
   */
  private async outagePause(session: Session, slot: Slot, retryAfterMs?: number): Promise<void> {
    if (!session.active || !this.scheduler.pause(slot)) return this.pause(session, slot.outages, retryAfterMs);
    this.working--;
    try {
      this.startReady(session);
      // Not at work any more: a commit lingering for it goes now.
      this.commits.nudge();
      await this.pause(session, slot.outages, retryAfterMs);
      if (session.active) await this.placeAgain(session, slot);
    } finally {
      this.working++;
    }
  }

  /** Resolves once the paused slot has an in-flight place again, or the session ended. */
  private placeAgain(session: Session, slot: Slot): Promise<void> {
    return new Promise<void>((resolve) => {
      const { signal } = session.abort;
      const go = () => {
        signal.removeEventListener("abort", go);
        this.waking.delete(slot);
        resolve();
      };
      signal.addEventListener("abort", go);
      this.waking.set(slot, go);
      this.scheduler.resume(slot);
      this.startReady(session);
    });
  }

  /**
   * A pause of one intent (an outage's, a failure's) or of the intake: the backoff after `tries`. A system that
   * said how long to stay away (Retry-After) is not asked again sooner, up to `sorRetryAfterMaxMs`: some extend a
   * rate limit's penalty for a client that comes back early.
   */
  private async pause(session: Session, tries: number, retryAfterMs = 0): Promise<void> {
    const ms = Math.max(this.backoffMs(tries - 1), Math.min(retryAfterMs, this.ctx.config.sorRetryAfterMaxMs));
    await sleep(ms, undefined, { signal: session.abort.signal }).catch(() => undefined);
  }

  /**
   * The slot's result into the next transaction (its record's next intent may start). Its encoding may meet a registry outage (each new reply topic
   * is a subject of its own): paused and tried again like an intent, never given up, for a slot never staged
   * would hold the partition's committed offset for the rest of the session (every later intent replayed by
   * the next owner). A result that cannot be encoded for another reason (a bug) becomes the intent's dead
   * letter; if even that fails, the offset passes with nothing but the error logged (the record stays on the
   * topic until its retention).
   */
  private async settle(session: Session, slot: Slot, outcome: Effects): Promise<void> {
    let result = outcome;
    let records: OutRecord[] | undefined;
    const source = { topic: this.ctx.config.topics.intents, partition: this.partition, offset: slot.message.offset };
    while (records === undefined) {
      try {
        records = await this.ctx.encoder.encode(result, this.partition, { message: slot.message, source });
      } catch (err) {
        if (!session.active) return;
        if (isRegistryOutage(err)) {
          slot.outages++;
          this.log.warn({ err, offset: slot.message.offset }, "cannot encode an intent's result now (registry unreachable?); trying again");
          // The run's answer bytes stay charged while it waits (no letGo): the result it holds may carry the record
          // (a conflict's current state). Others' reads wait within their deadlines meanwhile; none waits on this.
          await this.outagePause(session, slot);
          if (!session.active) return;
          continue;
        }
        if (result === outcome) {
          this.log.error({ err, offset: slot.message.offset }, "an intent's result cannot be encoded; the intent is dead-lettered instead");
          const why = `its result could not be encoded: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000);
          result = effects({ deadLetters: [deadLetterOf(slot.message, source, "processing_failed", why, new Date().toISOString())] });
        } else {
          this.log.error({ err, ...source }, "neither an intent's result nor its dead letter can be encoded; its offset passes without them");
          result = effects({});
          records = [];
        }
      }
    }
    if (!session.active) return;
    slot.outcome = intentOutcome(slot.admitted, result);
    slot.trace?.settled(slot.outcome);
    slot.trace?.stamp(records, this.ctx.config.topics.ledger);
    if (result.ledger) session.ledger.stage(result.ledger, { resolution: slot.resolution !== undefined });
    if (result.lease) session.ledger.stageLease(result.lease.entityKey, result.lease.entry);
    if (result.kept) session.ledger.stageKept(result.kept);
    if (result.refusal) {
      session.ledger.stageRefusal(result.refusal);
      this.ctx.observe?.refusalRemembered?.(this.partition, String(result.refusal.outcome?.reason ?? "unknown"));
    }
    this.commits.stage(session, records, slot);
    slot.times.settled = Date.now();
    this.scheduler.done(slot);
    this.startReady(session);
    this.commits.nudge();
  }

  /** A transaction carrying these slots' results committed: the partition is moving; intake may go on. */
  private committed(slots: readonly Slot[]): void {
    if (this.failuresInARow > 0) this.ctx.health.clear(`partition-${this.partition}`);
    this.failuresInARow = 0;
    for (const slot of slots) this.slots.delete(slot.seq);
    if (this.load < this.ctx.config.maxBufferedPerPartition / 2) this.ctx.intake.resume(this.partition);
    this.pump();
  }

  /** The offset to commit: the first intent whose result is not in this or an earlier transaction (the current session's state). */
  private watermark(): bigint {
    for (const slot of this.slots.values()) if (slot.txn === undefined || slot.txn === -1) return slot.offset;
    const waiting = this.inbox[0];
    return waiting ? BigInt(waiting.offset) : this.expectedNext;
  }
}

/** The scheduler's queue of one ledger key: an intent key's intents (and decisions on its escalation) run one at a time. */
function keyQueue(ledgerKey: string): string {
  return `key:${ledgerKey}`;
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

/**
 * A throw out of admission that says nothing about the record: the schema registry or the cluster (the reply
 * topics' metadata) unreachable, or another outage the code marks retriable. Intake pauses for it, however long.
 */
function admissionOutage(err: unknown): boolean {
  if (isRegistryOutage(err)) return true;
  if (err instanceof WritError) return err.retriable;
  return err instanceof Error && err.name.startsWith("KafkaJS");
}
