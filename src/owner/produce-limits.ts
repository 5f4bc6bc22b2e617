// What the brokers take of an owner's records (docs/architecture.md §3.9): a record batch of at most the topic's
// max.message.bytes (the brokers' message.max.bytes unless the topic says otherwise) and segment.bytes, a Produce
// request of at most socket.request.max.bytes. The owner writes at most WRIT_MAX_MESSAGE_BYTES per record, and it
// sizes its Produce requests; a topic that takes less than that (an agent creates its own reply topic, with any
// max.message.bytes) refuses a record with MESSAGE_TOO_LARGE (or RECORD_LIST_TOO_LARGE), which fails the whole
// transaction. The same intents would then fail it again after every rewind, and the partition would stop. So what
// a topic takes is read from its configs where the owner may (topic-directory.ts), and a refusal is learned: the
// partition's next transactions send one record per request, the next refusal names its record, and the encoder
// writes that topic's records within what it took (trimmed, or dead-lettered).
import type { Message, TopicMessages } from "kafkajs";
import { LruMap } from "../lru-map.ts";
import type { OwnerTransaction } from "./transactions.ts";

/** One record an owner's transaction produces. */
export interface OutRecord {
  topic: string;
  /** Explicit partition (the ledger's, a heal's); otherwise the Java-compatible partitioner picks by key. */
  partition?: number;
  key: string | Buffer | null;
  value: Buffer | null;
  headers?: Record<string, string | Buffer | (string | Buffer)[]>;
}

/** A record batch's own header (v2: base offset, length, epoch, magic, CRC, attributes, offsets, times, producer, count). */
export const BATCH_OVERHEAD_BYTES = 61;

/**
 * Most bytes of one Produce request's records (all topics): well under the brokers' socket.request.max.bytes (100 MiB
 * by default), which a broker enforces by closing the connection, a failure that would come back on every try.
 */
export const ROUND_MAX_BYTES = 16 * 1024 * 1024;

/** How long a limit learned from a refusal holds: a topic whose max.message.bytes was raised gets whole records again. */
export const LEARNED_LIMIT_TTL_MS = 3_600_000;

/** Topics whose learned limit is kept at most (each reply topic is one). */
const MAX_LEARNED_TOPICS = 4096;

/**
 * Bytes a record adds to a batch, at most: its key, value and headers, and their framing (length, attributes,
 * timestamp and offset deltas, the varint lengths: 36 bytes at most, 10 per header). A batch of one record takes
 * this and {@link BATCH_OVERHEAD_BYTES}.
 */
export function recordBytes(r: OutRecord): number {
  let n = 64 + (r.key === null ? 0 : Buffer.byteLength(r.key)) + (r.value?.length ?? 0);
  for (const [k, v] of Object.entries(r.headers ?? {})) {
    for (const x of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(k) + Buffer.byteLength(x) + 10;
  }
  return n;
}

/** Whether `r`, alone in a batch, is at most `limit` bytes. */
export function fitsBatch(r: OutRecord, limit: number): boolean {
  return recordBytes(r) + BATCH_OVERHEAD_BYTES <= limit;
}

/** How records are split into Produce requests. */
export interface RoundOptions {
  /** One record per request: a refusal then names its record. */
  isolate?: boolean;
  /** Bytes of one request's records, all topics (default {@link ROUND_MAX_BYTES}; a record larger goes alone). */
  maxRoundBytes?: number;
}

/**
 * Splits records into rounds (one Produce request each) whose bytes per topic, with a batch's header, stay within
 * the topic's limit (`maxBytes`: one for all topics, or per topic), and whose bytes in all stay within
 * `maxRoundBytes`: kafkajs puts one call's records for a partition in one record batch, and the broker refuses a
 * batch over the topic's max.message.bytes. A record over the limit goes in a round of its own for its topic. Order
 * is kept within each topic.
 */
export function roundsOf(records: readonly OutRecord[], maxBytes: number | ((topic: string) => number), opts: RoundOptions = {}): OutRecord[][] {
  const limitOf = typeof maxBytes === "number" ? () => maxBytes : maxBytes;
  const maxRound = opts.maxRoundBytes ?? ROUND_MAX_BYTES;
  const rounds: { records: OutRecord[]; bytes: Map<string, number>; total: number }[] = [];
  const roundOf = new Map<string, number>();
  for (const r of records) {
    const size = recordBytes(r);
    const limit = limitOf(r.topic);
    let i = roundOf.get(r.topic) ?? 0;
    for (; i < rounds.length; i++) {
      const round = rounds[i]!;
      if (round.records.length === 0) break;
      if (opts.isolate) continue;
      const topicBytes = round.bytes.get(r.topic);
      // A topic's first record in a round brings its batch's header.
      const topicAfter = (topicBytes ?? BATCH_OVERHEAD_BYTES) + size;
      if ((topicBytes === undefined || topicAfter <= limit) && round.total + size + BATCH_OVERHEAD_BYTES <= maxRound) break;
    }
    if (i === rounds.length) rounds.push({ records: [], bytes: new Map(), total: 0 });
    const round = rounds[i]!;
    roundOf.set(r.topic, i);
    const before = round.bytes.get(r.topic);
    round.bytes.set(r.topic, (before ?? BATCH_OVERHEAD_BYTES) + size);
    round.total += size + (before === undefined ? BATCH_OVERHEAD_BYTES : 0);
    round.records.push(r);
  }
  return rounds.map((x) => x.records);
}

/** One round's records as kafkajs's `sendBatch` takes them: per topic, in order. */
export function topicMessages(round: readonly OutRecord[]): TopicMessages[] {
  const byTopic = new Map<string, Message[]>();
  for (const r of round) {
    const message: Message = { key: r.key, value: r.value };
    if (r.partition !== undefined) message.partition = r.partition;
    if (r.headers) message.headers = r.headers;
    const list = byTopic.get(r.topic);
    if (list) list.push(message);
    else byTopic.set(r.topic, [message]);
  }
  return [...byTopic].map(([topic, messages]) => ({ topic, messages }));
}

/** {@link roundsOf}, each round as kafkajs's `sendBatch` takes it. */
export function sendRounds(records: readonly OutRecord[], maxBytes: number | ((topic: string) => number), opts: RoundOptions = {}): TopicMessages[][] {
  return roundsOf(records, maxBytes, opts).map(topicMessages);
}

/** Kafka's refusals of a batch for its size: MESSAGE_TOO_LARGE (max.message.bytes), RECORD_LIST_TOO_LARGE (segment.bytes). */
export function isSizeRefusal(err: unknown): boolean {
  let current: unknown = err;
  for (let depth = 0; depth < 8 && current !== null && typeof current === "object"; depth++) {
    const type = (current as { type?: unknown }).type;
    if (type === "MESSAGE_TOO_LARGE" || type === "RECORD_LIST_TOO_LARGE") return true;
    current = (current as { cause?: unknown; originalError?: unknown }).cause ?? (current as { originalError?: unknown }).originalError;
  }
  return false;
}

/** What a size refusal taught: the topic and the bytes its record took. */
export interface Refusal {
  topic: string;
  bytes: number;
}

/**
 * What each topic takes of this process's records: `maxMessageBytes`, or less where the topic's configs say so or a
 * broker refused a record (either kept for {@link LEARNED_LIMIT_TTL_MS}), and which partitions send one record per
 * request until their progress passes the refused transaction's intents (a refusal came in a request of several records: the next one names its record).
 * Shared by the owners of a process: a topic's limit is the topic's, whichever partition met it.
 */
export class ProduceLimits {
  private readonly maxMessageBytes: number;
  private readonly now: () => number;
  private readonly learned = new LruMap<string, { bytes: number; at: number }>(MAX_LEARNED_TOPICS);
  /** Topics of a round refused for its size since their configs were last read (topic-directory.ts reads them again). */
  private readonly refusedTopics = new LruMap<string, true>(MAX_LEARNED_TOPICS);
  /**
   * Partitions sending one record per request, each with the offset their progress must reach before they stop:
   * past every intent of the refused transaction (null where a refusal carried no intent's result: the next commit).
   */
  private readonly isolating = new Map<number, bigint | null>();

  constructor(maxMessageBytes: number, opts: { now?: () => number } = {}) {
    this.maxMessageBytes = maxMessageBytes;
    this.now = opts.now ?? Date.now;
  }

  /** Bytes a batch of one record of `topic` may take. */
  of(topic: string): number {
    const learned = this.learned.get(topic);
    if (learned === undefined) return this.maxMessageBytes;
    if (this.now() - learned.at >= LEARNED_LIMIT_TTL_MS) {
      this.learned.delete(topic);
      return this.maxMessageBytes;
    }
    return Math.min(this.maxMessageBytes, learned.bytes);
  }

  /** Whether `r` alone fits what its topic takes. */
  fits(r: OutRecord): boolean {
    return fitsBatch(r, this.of(r.topic));
  }

  /** Whether partition `partition` sends one record per request now. */
  isolates(partition: number): boolean {
    return this.isolating.has(partition);
  }

  /**
   * Sends `records` into `txn` for partition `partition`, in rounds sized for their topics. A round the broker
   * refuses for its size is learned ({@link refused}) before the error goes on: the transaction fails as any would.
   */
  async send(txn: Pick<OwnerTransaction, "send">, records: readonly OutRecord[], partition: number, onRefused?: (learned: Refusal | null) => void, opts: { isolate?: boolean } = {}): Promise<void> {
    const isolate = (opts.isolate ?? true) && this.isolates(partition);
    for (const round of roundsOf(records, (topic) => this.of(topic), { isolate })) {
      try {
        await txn.send(topicMessages(round));
      } catch (err) {
        if (isSizeRefusal(err)) {
          const learned = this.refused(partition, round);
          onRefused?.(learned);
        }
        throw err;
      }
    }
  }

  /**
   * A round of partition `partition` refused for its size: a round of one record teaches its topic's limit (below
   * what that record took); any teaches the partition to send one record per request (until {@link isolateUntil}'s offset is passed).
   */
  refused(partition: number, round: readonly OutRecord[]): Refusal | null {
    if (!this.isolating.has(partition)) this.isolating.set(partition, null);
    for (const r of round) this.refusedTopics.set(r.topic, true);
    if (round.length !== 1) return null;
    const r = round[0]!;
    const bytes = recordBytes(r) + BATCH_OVERHEAD_BYTES;
    this.learned.set(r.topic, { bytes: Math.min(this.of(r.topic), bytes - 1), at: this.now() });
    return { topic: r.topic, bytes };
  }

  /**
   * Whether a round with a record of `topic` was refused for its size since this was last asked: its configs may
   * have changed since they were read (a reply topic's max.message.bytes altered), and are read again.
   */
  takeRefused(topic: string): boolean {
    const refused = this.refusedTopics.get(topic) === true;
    if (refused) this.refusedTopics.delete(topic);
    return refused;
  }

  /**
   * What `topic`'s configs say a batch may take (the least of max.message.bytes and segment.bytes): it replaces what
   * was learned of it, or clears it when the topic takes all the owner writes.
   */
  described(topic: string, bytes: number): void {
    if (bytes >= this.maxMessageBytes) this.learned.delete(topic);
    else this.learned.set(topic, { bytes, at: this.now() });
  }

  /**
   * The refused transaction of partition `partition` carried intents up to `next` (exclusive): the partition keeps
   * sending one record per request until its progress reaches `next`. Else a commit of other intents' results, or of
   * `pending` entries alone, landing before the refused one runs again would end it, and the refused record would go
   * out in a request of several once more and never be named.
   */
  isolateUntil(partition: number, next: bigint): void {
    if (!this.isolating.has(partition)) return;
    const until = this.isolating.get(partition);
    this.isolating.set(partition, until === null || until === undefined || next > until ? next : until);
  }

  /**
   * A transaction of partition `partition` committed, its progress at `progress` (null: it did not move it). Its
   * requests carry many records again once the progress passed every intent of the refused transaction (or at once,
   * where the refusal carried none).
   */
  committed(partition: number, progress: bigint | null): void {
    if (!this.isolating.has(partition)) return;
    const until = this.isolating.get(partition);
    if (until === null || (progress !== null && progress >= until!)) this.isolating.delete(partition);
  }
}
