import type { Message, TopicMessages } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import { type LedgerIntentEntry, type LedgerLeaseEntry, leaseLedgerKey } from "../schemas/ledger-entry.ts";
import { CONTROL_HEADER, HEAL_KEY } from "../schemas/control.ts";
import { FORWARDED_HEADER } from "./admission.ts";
import { type Effects, truncateDeadLetter, withoutState } from "./effects.ts";

/** Key of heal records (defined with the other control-record names in src/schemas/control.ts). */
export { HEAL_KEY };

/** One record an owner's transaction produces. */
export interface OutRecord {
  topic: string;
  /** Explicit partition (the ledger's, a heal's); otherwise the Java-compatible partitioner picks by key. */
  partition?: number;
  key: string | Buffer | null;
  value: Buffer | null;
  headers?: Record<string, string | Buffer | (string | Buffer)[]>;
}

/** Bytes a record adds to a produce request, roughly: key, value, headers and the record's own framing. */
function recordBytes(r: OutRecord): number {
  let n = 64 + (r.key === null ? 0 : Buffer.byteLength(r.key)) + (r.value?.length ?? 0);
  for (const [k, v] of Object.entries(r.headers ?? {})) {
    for (const x of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(k) + Buffer.byteLength(x) + 8;
  }
  return n;
}

/** Header naming the headers a forwarded record lost: Kafka allows null header values, a produce request from kafkajs does not. */
export const FORWARDED_NULL_HEADERS = "writ-forwarded-null-headers";

/**
 * Headers of a record an owner forwards to its right partition, kept as they
 * came (repeated keys stay repeated) except null values, which are dropped
 * and named in {@link FORWARDED_NULL_HEADERS}. The record is still
 * unauthenticated here: nothing in its headers may make the forward fail.
 */
function forwardedHeaders(f: Effects["forwards"][number]): Record<string, string | Buffer | (string | Buffer)[]> {
  const headers: Record<string, string | Buffer | (string | Buffer)[]> = Object.create(null);
  const dropped: string[] = [];
  for (const [k, v] of Object.entries(f.message.headers ?? {})) {
    if (k === FORWARDED_HEADER || k === FORWARDED_NULL_HEADERS) continue;
    const values = (Array.isArray(v) ? v : [v]).filter((x): x is string | Buffer => typeof x === "string" || Buffer.isBuffer(x));
    if (values.length < (Array.isArray(v) ? v.length : 1)) dropped.push(k);
    if (values.length > 0) headers[k] = values.length === 1 ? values[0]! : values;
  }
  if (dropped.length > 0) headers[FORWARDED_NULL_HEADERS] = JSON.stringify(dropped);
  headers[FORWARDED_HEADER] = `${f.from.partition}@${f.from.offset}`;
  return headers;
}

/**
 * Turns effects into encoded records that are sure to fit the broker: a
 * reply or escalation too large for `maxMessageBytes` goes out without its
 * record state (marked `truncated`), a dead letter keeps the start of the
 * original bytes plus their length and sha256. Encoding happens when an
 * intent settles, not at commit, so one intent's bad value can fail only that
 * intent, never a transaction carrying others.
 */
export class RecordEncoder {
  private readonly codec: WireCodec;
  private readonly config: Pick<RouterConfig, "maxMessageBytes" | "topics">;

  constructor(codec: WireCodec, config: Pick<RouterConfig, "maxMessageBytes" | "topics">) {
    this.codec = codec;
    this.config = config;
  }

  /** Encoded records of `effects`, the ledger entry first (produced to ledger partition `partition`). */
  async encode(effects: Effects, partition: number): Promise<OutRecord[]> {
    const out: OutRecord[] = [];
    if (effects.ledger) out.push(await this.ledgerEntry(effects.ledger, partition));
    if (effects.lease) out.push(await this.leaseEntry(effects.lease.entityKey, effects.lease.entry, partition));
    const limit = this.config.maxMessageBytes;
    for (const r of effects.replies) {
      let value = await this.codec.encode(r.topic, "Reply", r.value);
      if (value.length > limit) value = await this.codec.encode(r.topic, "Reply", withoutState(r.value));
      out.push({ topic: r.topic, key: r.value.intentId, value });
    }
    const human = this.config.topics.human;
    for (const e of effects.escalations) {
      let value = await this.codec.encode(human, "Escalation", e.value);
      if (value.length > limit) {
        const current = e.value.current === null ? null : { state: null, version: e.value.current.version };
        value = await this.codec.encode(human, "Escalation", { ...e.value, current });
      }
      out.push({ topic: human, key: e.key, value });
    }
    for (const f of effects.forwards) {
      out.push({ topic: f.from.topic, partition: f.partition, key: f.message.key ?? null, value: f.message.value ?? null, headers: forwardedHeaders(f) });
    }
    const dlq = this.config.topics.dlq;
    for (const d of effects.deadLetters) {
      let value = await this.codec.encode(dlq, "DeadLetter", d.value);
      // base64 grows 4/3; the rest of the envelope is measured, not assumed: trim until the record fits.
      let room = Math.floor(((limit - (value.length - d.value.valueBase64.length)) * 3) / 4) - 1024;
      while (value.length > limit && room > 0) {
        value = await this.codec.encode(dlq, "DeadLetter", truncateDeadLetter(d.value, room));
        room = Math.floor(room / 2);
      }
      if (value.length > limit) value = await this.codec.encode(dlq, "DeadLetter", { ...truncateDeadLetter(d.value, 0), headers: {} });
      out.push({ topic: dlq, key: d.key, value });
    }
    return out;
  }

  async ledgerEntry(entry: LedgerIntentEntry, partition: number): Promise<OutRecord> {
    const topic = this.config.topics.ledger;
    return { topic, partition, key: entry.intentKey, value: await this.codec.encode(topic, "LedgerEntry", entry) };
  }

  /** A record's lease (or its release, a tombstone), keyed `__lease__:<entity key>`. */
  async leaseEntry(entityKey: string, entry: LedgerLeaseEntry | null, partition: number): Promise<OutRecord> {
    const topic = this.config.topics.ledger;
    if (entry === null) return this.leaseTombstone(entityKey, partition);
    return { topic, partition, key: leaseLedgerKey(entityKey), value: await this.codec.encode(topic, "LedgerEntry", entry) };
  }

  leaseTombstone(entityKey: string, partition: number): OutRecord {
    return this.tombstone(leaseLedgerKey(entityKey), partition);
  }

  tombstone(intentKey: string, partition: number): OutRecord {
    return { topic: this.config.topics.ledger, partition, key: intentKey, value: null };
  }
}

/** A control record (see `src/schemas/control.ts`) for one partition: clients skip it. */
export function healRecord(topic: string, partition: number): OutRecord {
  return { topic, partition, key: HEAL_KEY, value: null, headers: { [CONTROL_HEADER]: "heal" } };
}

/**
 * Splits records into `sendBatch` calls whose bytes per topic stay under
 * `maxBytes`: kafkajs puts one call's records for a partition in one record
 * batch, and the broker refuses a batch over `message.max.bytes`. Order is
 * kept within each topic.
 */
export function sendRounds(records: readonly OutRecord[], maxBytes: number): TopicMessages[][] {
  const rounds: Map<string, Message[]>[] = [];
  const bytes: Map<string, number>[] = [];
  const roundOf = new Map<string, number>();
  for (const r of records) {
    const size = recordBytes(r);
    let i = roundOf.get(r.topic) ?? 0;
    while (i < rounds.length && (bytes[i]!.get(r.topic) ?? 0) + size > maxBytes && (bytes[i]!.get(r.topic) ?? 0) > 0) i++;
    if (i === rounds.length) {
      rounds.push(new Map());
      bytes.push(new Map());
    }
    roundOf.set(r.topic, i);
    const list = rounds[i]!.get(r.topic) ?? [];
    const message: Message = { key: r.key, value: r.value };
    if (r.partition !== undefined) message.partition = r.partition;
    if (r.headers) message.headers = r.headers;
    list.push(message);
    rounds[i]!.set(r.topic, list);
    bytes[i]!.set(r.topic, (bytes[i]!.get(r.topic) ?? 0) + size);
  }
  return rounds.map((round) => [...round].map(([topic, messages]) => ({ topic, messages })));
}
