// Reads writ's topics for `writ tail` and `writ escalations`: read_committed,
// from chosen start offsets, either up to the ends the topics had when the
// read began or on until stopped. A throwaway consumer group (nothing is
// committed; it is deleted at the end) starts at the earliest offsets and
// seeks to later starts once it has joined; kafkajs's admin.setOffsets is not
// used, since it runs a consumer of its own for some 5 s per topic. Control
// records (src/schemas/control.ts) are skipped here.
import { randomUUID } from "node:crypto";
import type { Admin, IHeaders, Kafka } from "kafkajs";
import type { Logger } from "pino";
import { keepStopped } from "../kafka/keep-stopped.ts";
import { isControlRecord } from "../schemas/control.ts";

export interface TopicRecord {
  topic: string;
  partition: number;
  offset: string;
  /** ms since the epoch, as the producer set it. */
  timestamp: string;
  key: Buffer | null;
  value: Buffer | null;
  headers: IHeaders | undefined;
}

export interface ReadTopicsOptions {
  kafka: Kafka;
  topics: string[];
  /**
   * Where each partition starts: its earliest offset, `last` offsets before its end, or at `offset` (where an
   * earlier read of it stopped; kept within the partition's offsets). A function chooses per partition.
   */
  start: ReadStart | ((topic: string, partition: number) => ReadStart);
  /** Keep reading after the ends; stops when `signal` aborts. */
  follow: boolean;
  signal?: AbortSignal;
  onRecord: (record: TopicRecord) => void | Promise<void>;
  log: Logger;
  /** Without follow: give up waiting for the ends after this long without progress (ms). */
  idleTimeoutMs?: number;
}

export type ReadStart = { from: "beginning" } | { from: "end"; last: number } | { from: "offset"; offset: bigint };

/** The first offset to read of a partition whose offsets run from `low` to `high` (its read_committed end). */
function firstOffset(start: ReadStart, low: bigint, high: bigint): bigint {
  if (start.from === "beginning") return low;
  if (start.from === "offset") return start.offset < low ? low : start.offset > high ? high : start.offset;
  return high - BigInt(start.last) > low ? high - BigInt(start.last) : low;
}

export interface ReadTopicsResult {
  /** Partitions whose end was not reached (only when the idle timeout stopped the read). */
  unfinished: string[];
}

/** `topic` from its beginning to the end it has now (committed records), each record to `onRecord`. */
export function readWholeTopic(kafka: Kafka, topic: string, log: Logger, onRecord: ReadTopicsOptions["onRecord"]): Promise<ReadTopicsResult> {
  return readTopics({ kafka, topics: [topic], start: { from: "beginning" }, follow: false, log, onRecord });
}

export async function readTopics(opts: ReadTopicsOptions): Promise<ReadTopicsResult> {
  const { kafka, topics, log } = opts;
  const groupId = `writ.cli.${randomUUID()}`;
  const admin = kafka.admin();
  await admin.connect();
  const pending = new Map<string, bigint>(); // topic-partition → the read_committed end to reach
  try {
    const readable: string[] = [];
    const starts = new Map<string, bigint>(); // topic-partition → first offset to show
    for (const topic of topics) {
      // kafkajs's admin reports the read_committed end (the last stable offset) as `high`.
      let offsets: Awaited<ReturnType<Admin["fetchTopicOffsets"]>>;
      try {
        offsets = await admin.fetchTopicOffsets(topic);
      } catch (err) {
        // A topic deleted since it was listed (reply topics come and go) is left out; any other failure stops the read.
        if (!isUnknownTopic(err)) throw err;
        log.debug({ topic }, "topic gone before it could be read; skipped");
        continue;
      }
      readable.push(topic);
      for (const o of offsets) {
        const low = BigInt(o.low);
        const high = BigInt(o.high);
        const from = firstOffset(typeof opts.start === "function" ? opts.start(topic, o.partition) : opts.start, low, high);
        starts.set(`${topic}-${o.partition}`, from);
        if (from < high) pending.set(`${topic}-${o.partition}`, high);
      }
    }
    if (readable.length === 0 || (!opts.follow && pending.size === 0)) return { unfinished: [] };
    // stopped while the offsets were asked (the brokers slow to reach): no consumer joins a group for nothing
    if (opts.signal?.aborted) return { unfinished: [...pending.keys()] };

    // A read to the end disconnects once there, and the disconnect waits for the fetch in flight: an idle long poll
    // of 100 ms, not 500, ends it sooner (while records remain, fetches return at once). Following, 500: fewer idle
    // requests to the brokers for as long as it runs.
    const consumer = kafka.consumer({ groupId, readUncommitted: false, maxWaitTimeInMs: opts.follow ? 500 : 100, allowAutoTopicCreation: false });
    let finish: () => void = () => undefined;
    const finished = new Promise<void>((r) => (finish = r));
    // Stopped for good at the end of the read (src/kafka/keep-stopped.ts).
    const stopper = keepStopped(consumer);
    let lastProgress = Date.now();
    const settle = (topic: string, partition: number, next: bigint) => {
      lastProgress = Date.now();
      const key = `${topic}-${partition}`;
      const end = pending.get(key);
      if (end !== undefined && next >= end) pending.delete(key);
      if (!opts.follow && pending.size === 0) finish();
    };
    // Emitted for every batch the consumer moved past, including batches of transaction markers only.
    consumer.on(consumer.events.END_BATCH_PROCESS, ({ payload }) => {
      const p = payload as { topic: string; partition: number; lastOffset: string };
      settle(p.topic, p.partition, BigInt(p.lastOffset) + 1n);
    });
    const crashed = new Promise<never>((_, reject) => {
      consumer.on(consumer.events.CRASH, ({ payload }) => {
        const err = (payload as { error: Error; restart: boolean }).error;
        if (!(payload as { restart: boolean }).restart) reject(err);
        else log.debug({ err }, "consumer restarting");
      });
    });
    crashed.catch(() => undefined);
    try {
      await consumer.connect();
      await consumer.subscribe({ topics: readable, fromBeginning: true });
      await consumer.run({
        autoCommit: false,
        eachMessage: async ({ topic, partition, message }) => {
          lastProgress = Date.now();
          // before its start: fetched from the earliest offset before the seek below took effect
          if (BigInt(message.offset) < (starts.get(`${topic}-${partition}`) ?? 0n)) return;
          if (isControlRecord(message.headers)) return;
          try {
            await opts.onRecord({ topic, partition, offset: message.offset, timestamp: message.timestamp, key: message.key, value: message.value, headers: message.headers });
          } catch (err) {
            // One record must not stop the partition: a throw here would make kafkajs restart the consumer,
            // which reads from the start again (no committed offsets) and meets the same record for good.
            log.error({ err, topic, partition, offset: message.offset }, "record skipped: reading it failed");
          }
        },
      });
      // run() resolves once the group is joined; seeks apply to the next fetch of each partition.
      for (const [tp, from] of starts) {
        const at = tp.lastIndexOf("-");
        if (from > 0n) consumer.seek({ topic: tp.slice(0, at), partition: Number(tp.slice(at + 1)), offset: from.toString() });
      }
      const stops: Promise<unknown>[] = [crashed];
      if (opts.signal) {
        const signal = opts.signal;
        stops.push(signal.aborted ? Promise.resolve() : new Promise<void>((r) => signal.addEventListener("abort", () => r(), { once: true })));
      }
      if (!opts.follow) {
        stops.push(finished);
        const idle = opts.idleTimeoutMs ?? 15_000;
        stops.push(
          new Promise<void>((r) => {
            const timer = setInterval(() => {
              if (Date.now() - lastProgress > idle) {
                clearInterval(timer);
                r();
              }
            }, 250);
            void finished.then(() => clearInterval(timer));
            opts.signal?.addEventListener("abort", () => clearInterval(timer), { once: true });
          }),
        );
      }
      await Promise.race(stops);
    } finally {
      await stopper.disconnect();
    }
    return { unfinished: [...pending.keys()] };
  } finally {
    await admin.deleteGroups([groupId]).catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
  }
}

/** The key of a record in {@link readRecordsAt}'s answer: `<partition>:<offset>`. */
export function atOffset(partition: number, offset: bigint | string): string {
  return `${partition}:${BigInt(offset)}`;
}

/** What {@link readRecordsAt} wants, from places in one topic: partition → offsets. */
export function offsetsWanted(places: Iterable<{ partition: number; offset: bigint | string }>): Map<number, Set<bigint>> {
  const wanted = new Map<number, Set<bigint>>();
  for (const p of places) wanted.set(p.partition, (wanted.get(p.partition) ?? new Set()).add(BigInt(p.offset)));
  return wanted;
}

/**
 * The records at these offsets of `topic` (partition → offsets, `offsetsWanted`, answered by {@link atOffset}), read_committed: one read from each partition's
 * first wanted offset that stops once all are found. An offset missing from the answer is not in the topic (below
 * its log start: retention; or an aborted or control record), unless `timedOut` says the read was cut short.
 */
export async function readRecordsAt(kafka: Kafka, topic: string, wanted: ReadonlyMap<number, ReadonlySet<bigint>>, opts: { timeoutMs: number; log: Logger }): Promise<{ found: Map<string, TopicRecord>; timedOut: boolean }> {
  const found = new Map<string, TopicRecord>();
  let left = 0;
  for (const offsets of wanted.values()) left += offsets.size;
  if (left === 0) return { found, timedOut: false };
  const done = new AbortController();
  let timedOut = false;
  // The deadline holds while the brokers are still being reached too (kafkajs retries a connection for tens of
  // seconds): the answer comes by then, and a read still connecting stops at the signal when it gets there.
  let expired: () => void = () => undefined;
  const deadline = new Promise<void>((resolve) => (expired = resolve));
  const timer = setTimeout(() => {
    timedOut = true;
    done.abort();
    expired();
  }, opts.timeoutMs);
  try {
    const reading = readTopics({
      kafka,
      topics: [topic],
      // each wanted partition from its first wanted offset; the others from their ends (nothing to read)
      start: (_t, partition) => {
        const offsets = wanted.get(partition);
        if (offsets === undefined || offsets.size === 0) return { from: "end", last: 0 };
        let first = -1n;
        for (const o of offsets) if (first < 0n || o < first) first = o;
        return { from: "offset", offset: first };
      },
      follow: false,
      signal: done.signal,
      idleTimeoutMs: opts.timeoutMs + 1000,
      log: opts.log,
      onRecord: (r) => {
        const k = atOffset(r.partition, r.offset);
        if (found.has(k) || !wanted.get(r.partition)?.has(BigInt(r.offset))) return;
        found.set(k, r);
        if (--left === 0) done.abort();
      },
    });
    // past the deadline a failure of the read is nobody's answer any more
    reading.catch((err: unknown) => {
      if (timedOut) opts.log.debug({ err, topic }, "a read past its deadline failed");
    });
    await Promise.race([reading, deadline]);
  } finally {
    clearTimeout(timer);
  }
  // a copy: a read cut short by the deadline may still be handing records over
  return { found: new Map(found), timedOut: timedOut && left > 0 };
}

/** kafkajs's UNKNOWN_TOPIC_OR_PARTITION, also when wrapped by its retrier. */
export function isUnknownTopic(err: unknown): boolean {
  for (let e: unknown = err; e instanceof Error; e = (e as { cause?: unknown }).cause ?? (e as { originalError?: unknown }).originalError) {
    if ((e as { type?: unknown }).type === "UNKNOWN_TOPIC_OR_PARTITION") return true;
  }
  return false;
}

/** Topics of the cluster that start with `prefix`, sorted. */
export async function topicsWithPrefix(kafka: Kafka, prefix: string): Promise<string[]> {
  const admin = kafka.admin();
  await admin.connect();
  try {
    return (await admin.listTopics()).filter((t) => t.startsWith(prefix)).sort();
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}
