/**
 * A record batch kafkajs cannot read becomes one stand-in record instead of a
 * consumer that stops for good.
 *
 * kafkajs decodes every record batch of a Fetch answer before it hands any
 * partition's batch to the consumer. A batch whose records cannot be read
 * (compressed past `maxDecompressedBytes`: a few KB of gzip on the wire can
 * inflate to gigabytes; corrupt compressed data; a record count that lies) makes
 * that decoding throw a non-retriable error, and kafkajs stops the consumer
 * (its CRASH event says `restart: false`). The broker accepts such batches from
 * any producer with Write on the topic: it validates a compressed batch as a
 * stream and holds no limit on what it inflates to (checked on the local Kafka
 * 4.4 broker: one gzip batch of 81 KB carrying 80 MiB of zeros, acks=-1, is
 * accepted). Every reader of the topic then meets the batch again after its
 * restart: an owner of `writ.intents` exits and its successor meets the same
 * batch, an agent's reply consumer stops answering calls, the console stops.
 *
 * So writ decodes a Fetch answer's record batches itself, batch by batch, as
 * kafkajs's `fetch/v4/decodeMessages` does (Fetch v4 to v11 use it), with one
 * difference: a complete batch whose records cannot be read is replaced by one
 * record at the batch's last offset, with no key and no value and the header
 * {@link UNREADABLE_BATCH_HEADER} saying which offsets it stands for and why.
 * Readers move past it like past any record; an owner dead-letters it (reason
 * `undecodable`, the header in the dead letter), so the offsets are accounted
 * for, and the batch's bytes stay on the topic for as long as its retention
 * keeps them. The stand-in keeps the batch's producer id and transaction flag,
 * so kafkajs's read_committed filter drops it with the rest of an aborted
 * transaction.
 *
 * Not replaced: a batch cut short by the Fetch size limit (kafkajs's
 * `KafkaJSPartialMessageError`; fetched again from its offset), control batches
 * (the brokers write those), and a codec this host cannot load (`unavailable`,
 * KafkaJSNotImplemented: a fault of the installation, reported at start by
 * `registerCompressionCodecs`, not of the record).
 *
 * kafkajs loads its Fetch answer decoders lazily, per request, from Node's
 * module cache; {@link installUnreadableBatchGuard} puts this decoder into that
 * cache and drops the Fetch answer modules already loaded (they captured the
 * old one), so the next Fetch of every kafkajs client in the process uses it.
 * kafkajs 2.2.4 is its last release: these internals no longer change.
 */
import { createRequire } from "node:module";

const require = createRequire(import.meta.url);

/** Header of the stand-in record: `<first offset>-<last offset> <reason>`. */
export const UNREADABLE_BATCH_HEADER = "writ-unreadable-batch";

/** RecordBatch v2 layout (KIP-98): field offsets from the batch's start. */
const BATCH = {
  length: 8,
  magic: 16,
  crc: 17,
  attributes: 21,
  lastOffsetDelta: 23,
  firstTimestamp: 27,
  maxTimestamp: 35,
  producerId: 43,
  producerEpoch: 51,
  firstSequence: 53,
  recordCount: 57,
  /** FirstOffset (8) and Length (4): the bytes before what Length counts. */
  logOverhead: 12,
  /** The smallest batch: the header up to the record count (kafkajs's RECORD_BATCH_OVERHEAD). */
  overhead: 49,
} as const;
const MAGIC_V2 = 2;
const TRANSACTIONAL = 0x10;
const CONTROL = 0x20;
const LOG_APPEND_TIME = 0x08;
const MAX_REASON_CHARS = 500;
/**
 * Most records one batch may hold, whatever the budget. kafkajs builds an object of some hundreds of bytes per
 * record of a batch before the consumer sees any: a few KB of gzip can declare millions of empty records. A batch
 * of writ's topics holds a few hundred; a foreign producer's rarely 100,000. Below it, the Fetch budget bounds a
 * batch's records too: see {@link maxRecordsPerBatch}.
 */
export const MAX_RECORDS_PER_BATCH = 1_000_000;
/**
 * What one Fetch answer's records may hold before its next batches are left for the next Fetch (the default;
 * registerCompressionCodecs sets it to its maxDecompressedBytes). kafkajs decodes a whole answer before handing
 * any record on, and the bound of each batch alone does not bound the answer: 1 MiB fetched of one partition
 * holds some 500 zstd batches of 2 KB that inflate to 64 MiB each.
 */
export const DEFAULT_MAX_BYTES_PER_FETCH = 64 * 1024 * 1024;
/** A record counts at its keys, values and headers plus this: kafkajs's objects for it (about 210 bytes measured for one with neither key nor value). */
const RECORD_OVERHEAD = 256;

/**
 * Where the batch at `start` ends, or null when it is not whole in `buf` (cut short by the Fetch size limit:
 * kafkajs's to fetch again, whatever it declares) or shorter than a batch header.
 */
function wholeBatchEnd(buf: Buffer, start: number): number | null {
  if (start + BATCH.overhead + BATCH.logOverhead > buf.length) return null;
  const length = buf.readInt32BE(start + BATCH.length);
  const end = start + BATCH.logOverhead + length;
  return length < BATCH.overhead || end > buf.length ? null : end;
}

/**
 * Most records one batch is read with: {@link MAX_RECORDS_PER_BATCH}, and no more than the Fetch budget holds at
 * RECORD_OVERHEAD bytes a record (262,144 at the default 64 MiB). Every partition of an answer gets its first batch
 * whatever the answer holds, so what one batch may cost is what bounds the answer: at a million records a batch
 * (some 800 KB of zstd), one answer of 12 partitions held 2.7 GB of kafkajs records; with this, about 12 budgets.
 * A batch of valid intents holds fewer anyway: each is more than 256 bytes, so more would inflate past the budget.
 */
export function maxRecordsPerBatch(): number {
  return Math.max(1, Math.min(MAX_RECORDS_PER_BATCH, Math.floor(maxBytesPerFetch / RECORD_OVERHEAD)));
}

/** Why a complete batch at `start` is not read at all: too many records for one batch. */
function refusedUnread(buf: Buffer, start: number): Error | null {
  if (wholeBatchEnd(buf, start) === null) return null;
  const count = buf.readInt32BE(start + BATCH.recordCount);
  const most = maxRecordsPerBatch();
  if (count <= most) return null;
  const error = new Error(`the batch declares ${count} records; at most ${most} are read from one batch`);
  error.name = "TooManyRecords";
  return error;
}

interface KafkajsDecoder {
  buffer: Buffer;
  offset: number;
  readInt32(): number;
  readBytes(size: number): Buffer;
  canReadBytes(size: number): boolean;
}
type DecoderClass = new (buffer: Buffer) => KafkajsDecoder;
type RecordBatchDecoder = (decoder: KafkajsDecoder) => Promise<{ records: unknown[] }>;
type MessageSetDecoder = (decoder: KafkajsDecoder, size: number) => Promise<unknown[]> | unknown[];

/** The record kafkajs's record decoder would give, standing in for the batch at `start` of `buf`. */
export function unreadableBatchRecord(buf: Buffer, start: number, err: unknown): { record: Record<string, unknown>; end: number } | null {
  const end = wholeBatchEnd(buf, start);
  if (end === null) return null;
  if (buf.readInt8(start + BATCH.magic) !== MAGIC_V2) return null;
  const attributes = buf.readInt16BE(start + BATCH.attributes);
  if (attributes & CONTROL) return null;
  const name = (err as { name?: unknown } | null)?.name;
  if (name === "KafkaJSPartialMessageError" || name === "KafkaJSNotImplemented") return null;
  if (name === "KafkaCompressionError" && (err as { reason?: unknown }).reason === "unavailable") return null;

  const firstOffset = buf.readBigInt64BE(start);
  const lastOffsetDelta = buf.readInt32BE(start + BATCH.lastOffsetDelta);
  const lastOffset = firstOffset + BigInt(Math.max(0, lastOffsetDelta));
  const firstTimestamp = buf.readBigInt64BE(start + BATCH.firstTimestamp).toString();
  const maxTimestamp = buf.readBigInt64BE(start + BATCH.maxTimestamp).toString();
  const logAppendTime = (attributes & LOG_APPEND_TIME) !== 0;
  const message = err instanceof Error ? `${err.name}: ${err.message}` : String(err);
  const batchContext = {
    firstOffset: firstOffset.toString(),
    firstTimestamp,
    partitionLeaderEpoch: buf.readInt32BE(start + BATCH.length + 4),
    inTransaction: (attributes & TRANSACTIONAL) !== 0,
    isControlBatch: false,
    lastOffsetDelta,
    producerId: buf.readBigInt64BE(start + BATCH.producerId).toString(),
    producerEpoch: buf.readInt16BE(start + BATCH.producerEpoch),
    firstSequence: buf.readInt32BE(start + BATCH.firstSequence),
    maxTimestamp,
    timestampType: logAppendTime ? 1 : 0,
    magicByte: MAGIC_V2,
  };
  return {
    end,
    record: {
      magicByte: MAGIC_V2,
      attributes: 0,
      timestamp: logAppendTime ? maxTimestamp : firstTimestamp,
      offset: lastOffset.toString(),
      key: null,
      value: null,
      headers: { [UNREADABLE_BATCH_HEADER]: Buffer.from(`${firstOffset}-${lastOffset} ${message.slice(0, MAX_REASON_CHARS)}`, "utf8") },
      isControlRecord: false,
      batchContext,
    },
  };
}

/** What the stand-in's header says, or null for a record that is not one. */
export function unreadableBatchOf(headers: Record<string, unknown> | undefined): { firstOffset: string; lastOffset: string; reason: string } | null {
  const raw = headers?.[UNREADABLE_BATCH_HEADER];
  const text = Buffer.isBuffer(raw) ? raw.toString("utf8") : typeof raw === "string" ? raw : null;
  if (text === null) return null;
  const match = /^(-?\d{1,20})-(-?\d{1,20}) ([\s\S]*)$/.exec(text.slice(0, MAX_REASON_CHARS + 64));
  return match ? { firstOffset: match[1]!, lastOffset: match[2]!, reason: match[3]! } : { firstOffset: "?", lastOffset: "?", reason: text.slice(0, MAX_REASON_CHARS) };
}

type KafkajsRecord = { headers: Record<string, Buffer | Buffer[]> } & Record<string, unknown>;
type RecordDecoder = (decoder: KafkajsDecoder & { readVarIntArray: (reader: (d: KafkajsDecoder) => unknown) => unknown[] }, context?: unknown) => KafkajsRecord;

/**
 * kafkajs's record decoder folds a record's headers into an object by spreading the object so far for each
 * header: quadratic in their number. One record of 169 KB carrying 20,000 headers held the event loop for 100 s
 * (measured here; 100,000 headers fit under the broker's default message.max.bytes), so one record stops every
 * partition of its process and then of the next owner. Here kafkajs decodes the record with its header list
 * handed back empty, and the headers are gathered once into the same shape (a repeated name gives an array of its
 * values, in order). One difference: kafkajs's fold read inherited members, so a header named `toString` or
 * `__proto__` came out as an array holding Object.prototype's member and the value; here it is the value, an own
 * property.
 */
function linearHeaders(kafkajsRecord: RecordDecoder): RecordDecoder {
  return (decoder, context) => {
    let list: { key: string; value: Buffer }[] = [];
    const readVarIntArray = decoder.readVarIntArray;
    decoder.readVarIntArray = (reader) => {
      list = readVarIntArray.call(decoder, reader) as { key: string; value: Buffer }[];
      return [];
    };
    const record = kafkajsRecord(decoder, context);
    if (list.length === 0) return record;
    const headers: Record<string, Buffer | Buffer[]> = {};
    for (const { key, value } of list) {
      const seen = Object.prototype.hasOwnProperty.call(headers, key) ? headers[key] : undefined;
      const next = seen === undefined ? value : Array.isArray(seen) ? (seen.push(value), seen) : [seen, value];
      // Assigned, the name "__proto__" would set the object's prototype instead of a header.
      if (key === "__proto__") Object.defineProperty(headers, key, { value: next, enumerable: true, writable: true, configurable: true });
      else headers[key] = next;
    }
    record.headers = headers;
    return record;
  };
}

/** What a record holds, counted against the Fetch answer's budget. */
function heldBy(record: { key?: unknown; value?: unknown; headers?: unknown }): number {
  let bytes = RECORD_OVERHEAD + (Buffer.isBuffer(record.key) ? record.key.length : 0) + (Buffer.isBuffer(record.value) ? record.value.length : 0);
  const headers = record.headers as Record<string, Buffer | Buffer[]> | undefined;
  if (headers) {
    for (const name of Object.keys(headers)) {
      const value = headers[name]!;
      bytes += name.length;
      for (const v of Array.isArray(value) ? value : [value]) bytes += Buffer.isBuffer(v) ? v.length : 0;
    }
  }
  return bytes;
}

const GUARDED = Symbol.for("writ.unreadableBatchGuard");
let maxBytesPerFetch = DEFAULT_MAX_BYTES_PER_FETCH;
/** What the records decoded so far of each Fetch answer hold, by the answer's decoder (one for all its partitions). */
const heldByAnswer = new WeakMap<object, number>();
/**
 * Past twice the budget, partitions' first batches wait for a later Fetch, and each answer reads at most one of them:
 * the one that has waited longest of all the process's waiting batches (first come, first served, by a ticket taken
 * when a batch is first left). The order is the process's, not an answer's: kafkajs runs one fetcher per broker, and
 * an owner's restore and reply consumers fetch too, so answers of several fetchers interleave; a turn counted per
 * answer let two partitions take every turn while others starved. A batch not seen for {@link WAITING_STALE_MS}
 * (its partition revoked or paused, its consumer slow) is passed over, not forgotten: seen again within
 * {@link WAITING_FORGOTTEN_MS}, it keeps its place.
 * Keyed by batch (first offset and CRC); insertion order is ticket order.
 */
const waiting = new Map<string, { ticket: number; seenAt: number }>();
const MAX_WAITING = 4096;
const WAITING_STALE_MS = 5_000;
/** Unseen this long, a waiting batch is forgotten (its partition gone for good, most likely): the line can empty. */
const WAITING_FORGOTTEN_MS = 60_000;
let nextTicket = 0;
const turnGiven = new WeakMap<object, true>();

/**
 * Whether a partition's first batch, at `start`, is read in this answer, which holds `held` already. Up to
 * twice the budget it is: in ordinary traffic every partition gets its batch each Fetch. Past it, only the batch
 * waiting longest, one per answer: bombs on many partitions (each first batch up to the budget) no longer add up in
 * one answer (12 partitions of 64 KB of gzip held 1 GB), and every partition still gets its turn.
 */
function firstBatchRead(answer: object, buf: Buffer, start: number, held: number): boolean {
  if (held < 2 * maxBytesPerFetch) {
    // Read: if it was waiting, it waits no more (left at the head, it would hold every other batch's turn).
    if (waiting.size > 0) waiting.delete(batchId(buf, start));
    return true;
  }
  // A batch of no records (the log cleaner empties some and keeps them for their producer's state; a producer cannot
  // send one) holds nothing: read, no turn taken. Taking the turn, it would leave its partition with nothing again.
  if (start + BATCH.recordCount + 4 <= buf.length && buf.readInt32BE(start + BATCH.recordCount) === 0) return true;
  const now = Date.now();
  const key = batchId(buf, start);
  let mine = waiting.get(key);
  if (mine === undefined) {
    if (waiting.size >= MAX_WAITING) dropStalest();
    mine = { ticket: nextTicket++, seenAt: now };
    waiting.set(key, mine);
  } else {
    mine.seenAt = now;
  }
  if (turnGiven.has(answer)) return false;
  // The oldest ticket among the batches still fetched.
  for (const [other, entry] of waiting) {
    if (entry === mine) break;
    const unseen = now - entry.seenAt;
    if (unseen > WAITING_FORGOTTEN_MS) waiting.delete(other);
    else if (unseen <= WAITING_STALE_MS) return false;
  }
  turnGiven.set(answer, true);
  waiting.delete(key);
  return true;
}

/** A batch's key in the waiting line: its first offset and CRC. */
function batchId(buf: Buffer, start: number): string {
  return `${buf.readBigInt64BE(start)}:${buf.readInt32BE(start + BATCH.crc)}`;
}

/** Makes room: the waiting batch seen least recently goes (a revoked partition's, likely), not the longest waiting. */
function dropStalest(): void {
  let stalest: string | undefined;
  let seenAt = Number.POSITIVE_INFINITY;
  for (const [key, entry] of waiting) {
    if (entry.seenAt < seenAt) {
      seenAt = entry.seenAt;
      stalest = key;
    }
  }
  if (stalest !== undefined) waiting.delete(stalest);
}

/**
 * Puts writ's decoder of Fetch answers' record batches in place of kafkajs's
 * for every kafkajs client of this process (the `kafkajs` this module
 * resolves). Idempotent; `maxBytesPerFetch` (default
 * {@link DEFAULT_MAX_BYTES_PER_FETCH}) is the last call's.
 */
export function installUnreadableBatchGuard(opts: { maxBytesPerFetch?: number } = {}): void {
  maxBytesPerFetch = opts.maxBytesPerFetch ?? DEFAULT_MAX_BYTES_PER_FETCH;
  const kafkajsRequire = createRequire(require.resolve("kafkajs"));
  const path = kafkajsRequire.resolve("./src/protocol/requests/fetch/v4/decodeMessages.js");
  const current = kafkajsRequire(path) as { [GUARDED]?: true };
  if (current[GUARDED]) return;
  const Decoder = kafkajsRequire("./src/protocol/decoder.js") as DecoderClass;
  // kafkajs's record decoder with its headers gathered in linear time; the batch decoder, loaded afresh, uses it.
  const recordPath = kafkajsRequire.resolve("./src/protocol/recordBatch/record/v0/decoder.js");
  const batchPath = kafkajsRequire.resolve("./src/protocol/recordBatch/v0/decoder.js");
  const kafkajsRecord = kafkajsRequire(recordPath) as RecordDecoder;
  const cachedRecord = require.cache[recordPath];
  if (!cachedRecord) throw new Error(`kafkajs's ${recordPath} is not in the module cache; cannot guard its records`);
  cachedRecord.exports = linearHeaders(kafkajsRecord);
  delete require.cache[batchPath];
  const decodeBatch = kafkajsRequire(batchPath) as RecordBatchDecoder;
  const decodeMessageSet = kafkajsRequire("./src/protocol/messageSet/decoder.js") as MessageSetDecoder;

  const decodeMessages = async (decoder: KafkajsDecoder): Promise<unknown[]> => {
    const size = decoder.readInt32();
    if (size <= 0 || !decoder.canReadBytes(size)) return [];
    const buf = decoder.readBytes(size);
    const batches = new Decoder(buf);
    // Magic sits at the same place in every message format; the legacy formats (magic 0 and 1) go to kafkajs.
    if (buf.length <= BATCH.magic || buf.readInt8(BATCH.magic) !== MAGIC_V2) return decodeMessageSet(batches, size);
    const records: unknown[] = [];
    let held = heldByAnswer.get(decoder) ?? 0;
    while (batches.canReadBytes(BATCH.overhead)) {
      // Past the answer's budget, the partition's next batches are left for the next Fetch, which starts after
      // the last record given (as for a batch cut short). Its first batch takes its turn (firstBatchRead): none starves.
      const start = batches.offset;
      if (records.length > 0 ? held >= maxBytesPerFetch : !firstBatchRead(decoder, buf, start, held)) break;
      try {
        const tooMany = refusedUnread(buf, start);
        if (tooMany) throw tooMany;
        const batch = await decodeBatch(batches);
        // A loop, not push(...records): spreading a batch of ~120,000 records overflows the stack.
        for (const record of batch.records) {
          records.push(record);
          held += heldBy(record as Parameters<typeof heldBy>[0]);
        }
      } catch (err) {
        const standIn = unreadableBatchRecord(buf, start, err);
        // A batch cut short by the Fetch size limit is fetched again from its offset; anything else stays kafkajs's error.
        if (standIn === null) {
          if ((err as { name?: unknown } | null)?.name === "KafkaJSPartialMessageError") break;
          throw err;
        }
        records.push(standIn.record);
        held += heldBy(standIn.record);
        batches.offset = standIn.end;
      }
    }
    heldByAnswer.set(decoder, held);
    return records;
  };
  Object.defineProperty(decodeMessages, GUARDED, { value: true });

  const cached = require.cache[path];
  if (!cached) throw new Error(`kafkajs's ${path} is not in the module cache; cannot guard its record batches`);
  cached.exports = decodeMessages;
  // The Fetch answer modules loaded so far hold kafkajs's decoder: dropped, they load again on the next Fetch.
  const answers = /[\\/]kafkajs[\\/]src[\\/]protocol[\\/]requests[\\/]fetch[\\/]v\d+[\\/]response\.js$/;
  for (const key of Object.keys(require.cache)) if (answers.test(key) && key.startsWith(path.slice(0, path.indexOf("src")))) delete require.cache[key];
}
