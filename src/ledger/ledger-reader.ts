import type { Admin, Consumer, Kafka } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import { WritError } from "../errors.ts";
import { componentLogger, type Logger } from "../logger.ts";
import { unreadableBatchOf } from "../kafka/unreadable-batches.ts";
import { type ConsumerStop, keepStopped } from "../kafka/keep-stopped.ts";
import { printable } from "../printable.ts";
import { isControlRecord } from "../schemas/control.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { type RestoredEntry, reopenable, underItsKey } from "./ledger-state.ts";

/** Key of the progress entry (where intake of intents partition p stands) in ledger partition p. */
export function progressKey(partition: number): string {
  return `__progress__:${partition}`;
}

/** Key of the marker a new owner writes to ledger partition p. */
export function markerKey(partition: number): string {
  return `__marker__:${partition}`;
}

/** A ledger partition as a restore read it: its entries in topic order, and where its committed records end. */
export interface RestoredPartition {
  entries: Map<string, RestoredEntry>;
  /** Offset of its last committed record other than a marker (a tombstone's too); -1 with none. */
  lastCommitted: number;
}

/** Whether nothing can follow this committed entry of its key: no `pending` entry can come after it. */
function settledForGood(entry: RestoredEntry | undefined): boolean {
  if (entry === undefined) return false;
  return entry.kind !== "intent" || (entry.status === "done" && !reopenable(entry));
}

interface Restore {
  nonce: string;
  /** The partition's first offset when the restore began: where it reads from. */
  from: string;
  /** Takes each record before the marker, in topic order (value null: a tombstone). */
  take: (key: string, entry: RestoredEntry | null, offset: number) => void;
  resolve: () => void;
  reject: (err: Error) => void;
}

/**
 * Restores ledger partitions on demand, one per assignment, and holds
 * nothing else: an owner process's memory grows with the partitions it owns,
 * not with the cluster's.
 *
 * One consumer (a group of its own, so every partition of `writ.ledger` is
 * assigned to it; read_committed, or read_uncommitted for the scan for
 * entries of aborted transactions) keeps every partition paused. To restore
 * partition p it seeks p to its start, resumes it, reads until the marker the
 * new owner wrote right after fencing the previous one, and pauses p again:
 * everything before the marker has then been read (the marker avoids
 * reasoning about control records and last stable offsets). An entry that
 * cannot be read fails the restore (fail closed): dedupe is never dropped
 * silently.
 */
export class LedgerReader {
  /** read_committed (the ledger as it is) or read_uncommitted (also the records of aborted transactions). */
  readonly isolation: "read_committed" | "read_uncommitted";
  private consumer: Consumer | null = null;
  private starting: Promise<void> | null = null;
  private readonly restores = new Map<number, Restore>();
  /** Per partition, the latest read asked for (a count of calls): an older read still awaiting gives way to it. */
  private readonly latest = new Map<number, number>();
  private calls = 0;
  private readonly kafka: Kafka;
  private readonly admin: Admin;
  private readonly topic: string;
  private readonly partitions: number;
  private readonly codec: WireCodec;
  private readonly log: Logger;
  private readonly groupId: string;
  private stopped = false;
  /** How this.consumer is stopped for good (keepStopped); null whenever this.consumer is. */
  private consumerStop: ConsumerStop | null = null;
  /** Set while the reader's consumer is down; restores fail fast (retriable) until it is back. */
  private failure: Error | null = null;

  constructor(opts: {
    kafka: Kafka;
    admin: Admin;
    topic: string;
    partitions: number;
    codec: WireCodec;
    log: Logger;
    groupId: string;
    isolation?: "read_committed" | "read_uncommitted";
  }) {
    this.isolation = opts.isolation ?? "read_committed";
    this.kafka = opts.kafka;
    this.admin = opts.admin;
    this.topic = opts.topic;
    this.partitions = opts.partitions;
    this.codec = opts.codec;
    this.log = componentLogger(opts.log, "ledger-reader", { topic: opts.topic, isolation: this.isolation });
    this.groupId = opts.groupId;
  }

  /** Starts the consumer (once); restores wait for it. */
  start(): Promise<void> {
    this.starting ??= this.connect().catch((err: unknown) => {
      this.starting = null;
      throw err;
    });
    return this.starting;
  }

  private async connect(): Promise<void> {
    const consumer = this.kafka.consumer({
      groupId: this.groupId,
      readUncommitted: this.isolation === "read_uncommitted",
      allowAutoTopicCreation: false,
      // Markers must be seen promptly; an idle long poll also delays shutdown. With every partition paused (no
      // restore running, most of the time) kafkajs sends no fetch and sleeps this long instead, and a restore's
      // resume, like a stop, waits for that sleep to end: short, since it costs no request to the brokers.
      maxWaitTimeInMs: 100,
    });
    // Stopped for good once this reader stops (a restart kafkajs has under way is waited for: src/kafka/keep-stopped.ts).
    const stopper = keepStopped(consumer, { onUnsettled: () => this.log.warn("ledger reader: a restart of its consumer was still connecting when it stopped") });
    consumer.on(consumer.events.CRASH, (event) => {
      const err = event.payload.error;
      this.log.error({ err, restart: event.payload.restart }, "ledger reader crashed");
      for (const [p, r] of this.restores) {
        this.restores.delete(p);
        r.reject(new WritError("ledger_restore_timeout", "ledger reader restarted during the restore", { retriable: true, cause: err, context: { partition: p } }));
      }
      if (!event.payload.restart && !this.stopped) {
        // kafkajs gave up on this consumer: build a new one on the next restore.
        this.failure = err;
        this.consumer = null;
        this.consumerStop = null;
        this.starting = null;
      }
    });
    try {
      await consumer.connect();
      // Reads the topic's metadata: while a leader is being elected it fails, retriably (the caller tries again).
      await consumer.subscribe({ topic: this.topic, fromBeginning: true });
    } catch (err) {
      // Not left connected: the next start builds a consumer of its own.
      await consumer.disconnect().catch(() => undefined);
      throw err;
    }
    if (this.stopped) {
      // Stopped while it connected: it does not join the group.
      await consumer.disconnect().catch(() => undefined);
      throw this.stoppedError();
    }
    await consumer.run({
      autoCommit: false,
      eachBatchAutoResolve: false,
      eachBatch: async ({ batch, resolveOffset, heartbeat, isStale }) => {
        if (isStale()) return;
        const restore = this.restores.get(batch.partition);
        if (!restore) {
          // Fetched before this partition was paused; nobody is restoring it.
          consumer.pause([{ topic: this.topic, partitions: [batch.partition] }]);
          return;
        }
        for (const message of batch.messages) {
          if (this.restores.get(batch.partition) !== restore) return;
          await this.apply(batch.partition, restore, message.key, message.value, message.offset, message.headers);
          resolveOffset(message.offset);
        }
        resolveOffset(batch.lastOffset());
        await heartbeat();
      },
    });
    if (this.stopped) {
      // Stopped while this consumer was being made: it is not left running past the stop.
      await stopper.disconnect();
      throw this.stoppedError();
    }
    this.consumer = consumer;
    this.consumerStop = stopper;
    this.failure = null;
    // Nothing is read until a restore asks for its partition. kafkajs keeps pauses in the group's state, which a
    // consumer that crashed and rejoined rebuilds: the pauses (and a restore's seek) are applied again on each join.
    consumer.on(consumer.events.GROUP_JOIN, () => this.applyPauses());
    this.applyPauses();
  }

  /** Pauses every partition but the ones being restored, which are read from their start. */
  private applyPauses(): void {
    const consumer = this.consumer;
    if (!consumer) return;
    try {
      const idle = Array.from({ length: this.partitions }, (_, p) => p).filter((p) => !this.restores.has(p));
      if (idle.length > 0) consumer.pause([{ topic: this.topic, partitions: idle }]);
      for (const [p, r] of this.restores) {
        consumer.seek({ topic: this.topic, partition: p, offset: r.from });
        consumer.resume([{ topic: this.topic, partitions: [p] }]);
      }
    } catch (err) {
      // The group is not joined yet (its first join failed and kafkajs retries it): the next join applies them.
      this.log.debug({ err }, "ledger reader not joined yet; pauses are applied on its next join");
    }
  }

  private async apply(
    partition: number,
    restore: Restore,
    rawKey: Buffer | null,
    value: Buffer | null,
    offset: string,
    headers: Record<string, unknown> | undefined,
  ): Promise<void> {
    if (isControlRecord(headers)) return;
    const unreadable = value === null ? unreadableBatchOf(headers) : null;
    if (unreadable) {
      // Only owners write the ledger: a batch of it that cannot be read is a fault to see, not a tombstone.
      this.log.error({ partition, offset, unreadable }, "a ledger batch could not be read; its entries are skipped");
      return;
    }
    const key = rawKey?.toString("utf8") ?? "";
    if (value === null) {
      restore.take(key, null, Number(offset));
      return;
    }
    try {
      // In topic order: a later entry for a key must win over an earlier one.
      this.applyDecoded(partition, restore, key, offset, await this.codec.decode("LedgerEntry", value));
    } catch (err) {
      // The registry is unreachable (retriable); the owner restores again.
      this.finish(partition, restore, err as Error);
    }
  }

  private applyDecoded(
    partition: number,
    restore: Restore,
    key: string,
    offset: string,
    decoded: Awaited<ReturnType<WireCodec["decode"]>>,
  ): void {
    if (this.restores.get(partition) !== restore) return;
    if (!decoded.ok && this.isolation === "read_uncommitted") {
      // The in-doubt scan reads past the last committed record; the committed restore before it read every
      // committed record up to the marker, so one this scan cannot read was aborted (a foreign transactional
      // producer's, say): never part of the ledger, and no `pending` entry of writ's. Failing closed on it
      // would stop the partition for good over a record no read_committed reader ever sees.
      this.log.warn({ partition, offset, key: key.slice(0, 200), reason: decoded.message }, "an aborted record on the ledger cannot be read; skipped by the in-doubt scan");
      return;
    }
    if (!decoded.ok) {
      // Any producer chooses the key (up to max.message.bytes, controls and all): /healthz and the log quote its start.
      const shown = printable(key.slice(0, 200));
      const err = new WritError(
        "ledger_unreadable",
        `ledger entry at ${this.topic}-${partition} offset ${offset} (key ${shown}${key.length > 200 ? "…" : ""}) cannot be read: ${printable(decoded.message.slice(0, 500))}. ` +
          "Dedupe for that key would be lost, so this partition is not processed until the entry is fixed (see the README's runbook).",
        { retriable: false, context: { topic: this.topic, partition, offset, key: shown } },
      );
      this.finish(partition, restore, err);
      return;
    }
    const entry = decoded.value as { kind: string };
    if (entry.kind === "marker") {
      const marker = decoded.value as { nonce: string };
      if (marker.nonce === restore.nonce) this.finish(partition, restore, null);
      return;
    }
    restore.take(key, decoded.value as RestoredEntry, Number(offset));
  }

  private finish(partition: number, restore: Restore, err: Error | null): void {
    if (this.restores.get(partition) !== restore) {
      // No longer the partition's restore (superseded, or the reader stopped): its deadline or abort still settles it.
      if (err) restore.reject(err);
      return;
    }
    this.restores.delete(partition);
    try {
      this.consumer?.pause([{ topic: this.topic, partitions: [partition] }]);
    } catch {
      // Not joined at the moment; the next join pauses it (applyPauses).
    }
    if (err) restore.reject(err);
    else restore.resolve();
  }

  /**
   * Reads ledger partition `partition` from its start to the marker `nonce`
   * and returns its entries in topic order, and where its committed records
   * end.
   *
   * @throws WritError `ledger_unreadable` (not retriable: fail closed) or `ledger_restore_timeout` (retriable).
   */
  async restore(partition: number, nonce: string, timeoutMs: number, signal?: AbortSignal): Promise<RestoredPartition> {
    const entries = new Map<string, RestoredEntry>();
    let lastCommitted = -1;
    await this.read(partition, nonce, timeoutMs, null, signal, (key, entry, offset) => {
      entries.delete(key);
      if (entry !== null) entries.set(key, entry);
      lastCommitted = offset;
    });
    return { entries, lastCommitted };
  }

  /**
   * The `pending` entries of ledger partition `partition` between its last
   * committed record (`restored.lastCommitted`) and the marker `nonce`, read
   * by a read_uncommitted reader: entries of a transaction that was aborted
   * (its owner crashed, its transaction failed, or a new owner fenced it)
   * after the broker had acknowledged them, so a PATCH may have followed each.
   * The last one of each key.
   *
   * Why after the last committed record is enough: an owner's transactions run
   * one after another and a failed one ends its session, so an aborted
   * transaction is its session's last, after everything the session committed.
   * The next session's open commits what this scan finds before it commits
   * anything else in the partition (the heal transaction), so an entry of an
   * aborted transaction before the last committed record was found and
   * committed again already. Markers do not count: a session may end between
   * its marker and that commit.
   *
   * @throws WritError as {@link restore}.
   */
  async scanInDoubt(partition: number, nonce: string, timeoutMs: number, restored: RestoredPartition, signal?: AbortSignal): Promise<Map<string, LedgerIntentEntry>> {
    if (this.isolation !== "read_uncommitted") throw new Error("scanInDoubt needs a read_uncommitted reader");
    const found = new Map<string, LedgerIntentEntry>();
    await this.read(partition, nonce, timeoutMs, restored.lastCommitted + 1, signal, (key, entry) => {
      // A key settled for good gets no `pending` entry after it; one would not be this intent's.
      // One under another key is no owner's (the heal would commit it under its own: ledger-state.ts underItsKey).
      if (entry?.kind === "intent" && entry.status === "pending" && underItsKey(key, entry) && !settledForGood(restored.entries.get(key))) found.set(key, entry);
    });
    return found;
  }

  /** Reads `partition` from `from` (its first offset if null or below it) to the marker `nonce`. */
  private async read(partition: number, nonce: string, timeoutMs: number, from: number | null, signal: AbortSignal | undefined, take: Restore["take"]): Promise<void> {
    // A stop begun before or during any await here (its disconnect may still be under way) would leave this restore
    // waiting out its deadline on a consumer going away, holding the owner's producer open after the router stopped;
    // and a consumer started after the stop would outlive it.
    if (this.stopped) throw this.stoppedError(partition);
    // The newest read of a partition wins: an owner closed mid-restore and its successor on this process may overlap,
    // and the older read, still awaiting below, must neither displace the newer one nor be left unsettled.
    const call = ++this.calls;
    this.latest.set(partition, call);
    const superseded = () => new WritError("ledger_restore_timeout", "superseded by a newer restore", { retriable: true, context: { partition } });
    this.supersede(partition, superseded());
    if (this.failure) this.log.warn({ err: this.failure }, "ledger reader was down; starting it again");
    await this.start();
    if (this.stopped) throw this.stoppedError(partition);
    const consumer = this.consumer;
    if (!consumer) throw new WritError("ledger_restore_timeout", "ledger reader is not running", { retriable: true, context: { partition } });
    const offsets = await this.admin.fetchTopicOffsets(this.topic);
    if (this.stopped) throw this.stoppedError(partition);
    if (this.latest.get(partition) !== call) throw superseded();
    // Replaced meanwhile (kafkajs gave up on it): the next restore starts the new one.
    if (this.consumer !== consumer) throw new WritError("ledger_restore_timeout", "ledger reader restarted during the restore", { retriable: true, context: { partition } });
    const first = offsets.find((o) => o.partition === partition)?.low ?? "0";
    const low = from !== null && BigInt(from) > BigInt(first) ? String(from) : first;
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        this.finish(
          partition,
          restore,
          new WritError("ledger_restore_timeout", `ledger partition ${partition} not restored within ${timeoutMs} ms`, {
            retriable: true,
            context: { topic: this.topic, partition },
          }),
        );
      }, timeoutMs);
      const onAbort = () => this.finish(partition, restore, signal!.reason instanceof Error ? signal!.reason : new Error("restore aborted"));
      const restore: Restore = {
        nonce,
        from: low,
        take,
        resolve: () => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          resolve();
        },
        reject: (err) => {
          clearTimeout(timer);
          signal?.removeEventListener("abort", onAbort);
          reject(err);
        },
      };
      signal?.addEventListener("abort", onAbort, { once: true });
      this.supersede(partition, superseded());
      this.restores.set(partition, restore);
      try {
        consumer.seek({ topic: this.topic, partition, offset: low });
        consumer.resume([{ topic: this.topic, partitions: [partition] }]);
      } catch (err) {
        // Not joined at the moment (a restart): the next join seeks and resumes it (applyPauses).
        this.log.debug({ err, partition }, "ledger reader not joined; the restore starts on its next join");
      }
    });
  }

  /** Ends partition `partition`'s restore, if one is registered, with `err`. */
  private supersede(partition: number, err: WritError): void {
    const earlier = this.restores.get(partition);
    if (earlier) this.finish(partition, earlier, err);
  }

  private stoppedError(partition?: number): WritError {
    return new WritError("ledger_restore_timeout", "ledger reader stopped", { retriable: true, ...(partition === undefined ? {} : { context: { partition } }) });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const [p, r] of this.restores) {
      this.restores.delete(p);
      r.reject(this.stoppedError(p));
    }
    const stopper = this.consumerStop;
    this.consumer = null;
    this.consumerStop = null;
    await stopper?.disconnect();
  }
}
