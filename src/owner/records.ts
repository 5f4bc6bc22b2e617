import type { KafkaMessage } from "kafkajs";
import type { z } from "zod";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import { isRegistryOutage } from "../errors.ts";
import type { Logger } from "../logger.ts";
import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { WIRE_SCHEMAS } from "../schemas/index.ts";
import { type LedgerIntentEntry, type LedgerLeaseEntry, leaseLedgerKey } from "../schemas/ledger-entry.ts";
import { CONTROL_HEADER, HEAL_KEY } from "../schemas/control.ts";
import { FORWARDED_HEADER } from "./admission.ts";
import { type Effects, type SourceRef, deadLetterOf, truncateDeadLetter, withoutState } from "./effects.ts";
import { BATCH_OVERHEAD_BYTES, fitsBatch, type OutRecord, ProduceLimits, recordBytes } from "./produce-limits.ts";

export { type OutRecord, sendRounds } from "./produce-limits.ts";

/** A record staged before its value is encoded (see RecordEncoder.leaseEntryLate): `encode` gives it whole. */
export interface LateRecord {
  topic: string;
  key: string;
  encode: () => Promise<OutRecord>;
}

/** Key of heal records (defined with the other control-record names in src/schemas/control.ts). */
export { HEAL_KEY };

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

/** What kind of writ's topics a record too large for its topic was meant for: bounded, never a topic's own name. */
export type SizeTopicKind = "reply" | "escalation" | "dead_letter" | "forward" | "ledger" | "unnamed";
/**
 * What became of it: written without the record's state or trimmed (`truncated`), not written and the intent
 * dead-lettered in its place (`undeliverable`, `too_large`), a dead letter not written at all (`dropped`), or the
 * broker refused it and its topic's limit was learned (`refused`; `unnamed` where the refused request held several).
 */
export type SizeOutcome = "truncated" | "undeliverable" | "too_large" | "dropped" | "refused";
export const SIZE_TOPIC_KINDS: readonly SizeTopicKind[] = ["reply", "escalation", "dead_letter", "forward", "ledger", "unnamed"];
export const SIZE_OUTCOMES: readonly SizeOutcome[] = ["truncated", "undeliverable", "too_large", "dropped", "refused"];

/** The intent record whose result is being encoded: what a record of the result that cannot be written is dead-lettered as. */
export interface ResultOrigin {
  message: KafkaMessage;
  source: SourceRef;
}

/** A record as forwarded to its key's partition: as it came, with the forward's mark. */
function forwardedRecord(f: Effects["forwards"][number]): OutRecord {
  return { topic: f.from.topic, partition: f.partition, key: f.message.key ?? null, value: f.message.value ?? null, headers: forwardedHeaders(f) };
}

/**
 * `f` with its record built and measured: once, where the forward is decided. Its headers are anyone's (megabytes,
 * from a compressed batch): admission's size check and the encoding both use this one copy.
 */
export function forwardOf(f: Effects["forwards"][number]): Effects["forwards"][number] {
  if (f.built) return f;
  const record = forwardedRecord(f);
  return { ...f, built: { record, bytes: recordBytes(record) + BATCH_OVERHEAD_BYTES } };
}

/**
 * Turns effects into encoded records that are sure to fit what their topics
 * take ({@link ProduceLimits}: `maxMessageBytes`, or less where a topic's
 * configs say so or a broker refused a record): a reply or escalation too large goes out without its
 * record state (marked `truncated`); one still too large (a reply topic that
 * takes less than a reply) is not written, and the intent's record is
 * dead-lettered `undeliverable` with it instead; a record forwarded to its
 * key's partition that would be too large there is dead-lettered `too_large`;
 * a dead letter keeps the start of the original bytes plus their length and
 * sha256, then sheds its headers. Ledger entries are bounded where they are
 * made (no record state; params within maxIntentBytes; messages cut to 2,000
 * characters). Encoding happens when an intent settles, not at commit, so one
 * intent's bad value can fail only that intent, never a transaction carrying
 * others.
 */
export class RecordEncoder {
  /** What each topic takes: read from its configs, or learned from the brokers' refusals (see produce-limits.ts). */
  readonly limits: ProduceLimits;
  private readonly codec: WireCodec;
  private readonly config: Pick<RouterConfig, "maxMessageBytes" | "topics">;
  private readonly log: Logger | undefined;
  private readonly onSize: ((kind: SizeTopicKind, outcome: SizeOutcome) => void) | undefined;

  constructor(
    codec: WireCodec,
    config: Pick<RouterConfig, "maxMessageBytes" | "topics">,
    opts: { limits?: ProduceLimits; log?: Logger; onSize?: (kind: SizeTopicKind, outcome: SizeOutcome) => void } = {},
  ) {
    this.codec = codec;
    this.config = config;
    this.limits = opts.limits ?? new ProduceLimits(config.maxMessageBytes);
    this.log = opts.log;
    this.onSize = opts.onSize;
  }

  /** A broker refused a record of `topic` (null: a request of several records) for its size. */
  refusedByBroker(topic: string | null): void {
    this.onSize?.(topic === null ? "unnamed" : this.kindOf(topic), "refused");
  }

  /** Which of writ's topics `topic` is: any other is an agent's reply topic (heal records go there too). */
  private kindOf(topic: string): SizeTopicKind {
    const t = this.config.topics;
    if (topic === t.ledger) return "ledger";
    if (topic === t.intents) return "forward";
    if (topic === t.human) return "escalation";
    if (topic === t.dlq) return "dead_letter";
    return "reply";
  }

  /**
   * Encoded records of `effects`, the ledger entry first (produced to ledger partition `partition`). `origin`: the
   * intent record they answer, dead-lettered in place of a reply or escalation that cannot be written.
   */
  async encode(effects: Effects, partition: number, origin: ResultOrigin): Promise<OutRecord[]> {
    const out: OutRecord[] = [];
    const dead = [...effects.deadLetters];
    if (effects.ledger) out.push(await this.ledgerEntry(effects.ledger, partition));
    if (effects.lease) out.push(await this.leaseEntry(effects.lease.entityKey, effects.lease.entry, partition));
    if (effects.refusal) out.push(await this.ledgerEntry(effects.refusal, partition));
    if (effects.kept) out.push(await this.ledgerEntry(effects.kept, partition));
    for (const r of effects.replies) {
      const fitted = await this.fitted(r.topic, r.value.intentId, "Reply", [r.value, withoutState(r.value)]);
      if ("record" in fitted) out.push(fitted.record);
      else dead.push(undeliverable(origin, r.topic, "reply", fitted));
      this.sized("reply", fitted);
    }
    const human = this.config.topics.human;
    for (const e of effects.escalations) {
      const stateless = { ...e.value, current: e.value.current === null ? null : { state: null, version: e.value.current.version }, truncated: true };
      const fitted = await this.fitted(human, e.key, "Escalation", e.value.current === null ? [e.value] : [e.value, stateless]);
      if ("record" in fitted) out.push(fitted.record);
      else dead.push(undeliverable(origin, human, "escalation", fitted));
      this.sized("escalation", fitted);
    }
    for (const f of effects.forwards) {
      const forward = forwardOf(f);
      const refused = this.unforwardable(forward);
      if (refused) dead.push(refused);
      else out.push(forward.built!.record);
    }
    for (const d of dead) {
      const record = await this.deadLetter(d);
      if (record) out.push(record);
    }
    return out;
  }

  /** Counts a reply or escalation that went out without its state, or not at all. */
  private sized(kind: SizeTopicKind, fitted: { trimmed?: boolean } | { value: unknown }): void {
    if ("value" in fitted) this.onSize?.(kind, "undeliverable");
    else if (fitted.trimmed) this.onSize?.(kind, "truncated");
  }

  /**
   * The dead letter (`too_large`) of a record that, forwarded to its key's partition, would be larger than the
   * intents topic takes; null when it fits. Its value is within maxIntentBytes (admission checked it), but its
   * headers are anyone's, and a batch its producer compressed may hold far more than the topic takes uncompressed.
   */
  unforwardable(f: Effects["forwards"][number]): Effects["deadLetters"][number] | null {
    const { record, bytes } = forwardOf(f).built!;
    const limit = this.limits.of(record.topic);
    if (bytes <= limit) return null;
    this.onSize?.("forward", "too_large");
    const detail = `forwarded to partition ${f.partition} (its key's) it would take ${bytes} bytes with its headers, over the ${limit} ${record.topic} takes (WRIT_MAX_MESSAGE_BYTES, or less where the topic says so or the broker refused more)`;
    return deadLetterOf(f.message, f.from, "too_large", detail, new Date().toISOString());
  }

  /**
   * The first of `values` (each smaller than the one before) whose record fits what `topic` takes, or the last one
   * that could be encoded, with its size. A value that cannot be encoded (a state too deep to write, which only an
   * adapter other than writ's own can give) is passed over; a registry outage is not (the caller pauses).
   */
  private async fitted<N extends "Reply" | "Escalation">(
    topic: string,
    key: string,
    name: N,
    values: z.input<(typeof WIRE_SCHEMAS)[N]>[],
  ): Promise<{ record: OutRecord; trimmed: boolean } | { value: unknown; bytes: number; limit: number }> {
    const limit = this.limits.of(topic);
    let smallest: { value: unknown; bytes: number } | undefined;
    let failure: unknown;
    for (const [i, value] of values.entries()) {
      let encoded: Buffer;
      try {
        encoded = await this.codec.encode(topic, name, value);
      } catch (err) {
        if (isRegistryOutage(err)) throw err;
        failure = err;
        continue;
      }
      const record: OutRecord = { topic, key, value: encoded };
      if (fitsBatch(record, limit)) return { record, trimmed: i > 0 };
      smallest = { value, bytes: recordBytes(record) + BATCH_OVERHEAD_BYTES };
    }
    if (smallest === undefined) throw failure;
    return { ...smallest, limit };
  }

  /**
   * A dead letter's record within what the dead-letter topic takes: whole; else its payload cut (keeping its length
   * and sha256); else without headers, then without the record it could not deliver, then with a short message.
   * Null (logged) only where the topic takes less than that: nothing smaller says what happened.
   */
  private async deadLetter(d: Effects["deadLetters"][number]): Promise<OutRecord | null> {
    const dlq = this.config.topics.dlq;
    const limit = this.limits.of(dlq);
    const recordOf = async (value: DeadLetter): Promise<OutRecord> => ({ topic: dlq, key: d.key, value: await this.codec.encode(dlq, "DeadLetter", value) });
    let record = await recordOf(d.value);
    if (fitsBatch(record, limit)) return record;
    this.onSize?.("dead_letter", "truncated");
    // base64 grows 4/3; the rest of the envelope is measured, not assumed: trim until the record fits.
    const envelope = recordBytes(record) + BATCH_OVERHEAD_BYTES - d.value.valueBase64.length;
    for (let room = Math.floor(((limit - envelope) * 3) / 4) - 1024; room > 0; room = Math.floor(room / 2)) {
      record = await recordOf(truncateDeadLetter(d.value, room));
      if (fitsBatch(record, limit)) return record;
    }
    let value: DeadLetter = { ...truncateDeadLetter(d.value, 0), headers: {} };
    const smaller: ((v: DeadLetter) => DeadLetter)[] = [
      (v) => v,
      (v) => (v.undelivered === undefined ? v : { ...v, undelivered: { topic: v.undelivered.topic, value: null } }),
      (v) => ({ ...v, message: v.message.slice(0, 200) }),
    ];
    for (const shrink of smaller) {
      value = shrink(value);
      record = await recordOf(value);
      if (fitsBatch(record, limit)) return record;
    }
    this.onSize?.("dead_letter", "dropped");
    this.log?.error({ topic: dlq, bytes: recordBytes(record) + BATCH_OVERHEAD_BYTES, limit, reason: d.value.reason, source: d.value.source }, "a dead letter does not fit the dead-letter topic even trimmed; it is not written");
    return null;
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

  /**
   * A record's lease entry the owner writes of its own accord (a lapse), staged before it is encoded: it takes its
   * place among the key's changes at once, and is encoded when its transaction is sent.
   */
  leaseEntryLate(entityKey: string, entry: LedgerLeaseEntry | null, partition: number): LateRecord {
    return { topic: this.config.topics.ledger, key: leaseLedgerKey(entityKey), encode: () => this.leaseEntry(entityKey, entry, partition) };
  }

  leaseTombstone(entityKey: string, partition: number): OutRecord {
    return this.tombstone(leaseLedgerKey(entityKey), partition);
  }

  tombstone(intentKey: string, partition: number): OutRecord {
    return { topic: this.config.topics.ledger, partition, key: intentKey, value: null };
  }
}

/**
 * The dead letter of an intent whose reply or escalation is larger than its topic takes even without the record's
 * state: the intent's record (as any dead letter keeps it), and what could not be written in `undelivered`. The
 * intent's outcome is in the ledger all the same (a repeat of it is answered from there).
 */
function undeliverable(origin: ResultOrigin, topic: string, what: "reply" | "escalation", fitted: { value: unknown; bytes: number; limit: number }): Effects["deadLetters"][number] {
  const detail =
    `its ${what} takes ${fitted.bytes} bytes without the record's state, over the ${fitted.limit} ${topic.slice(0, 249)} takes ` +
    "(WRIT_MAX_MESSAGE_BYTES, or less where the topic says so or the broker refused more); it is in `undelivered`, and the intent's outcome in the ledger";
  const d = deadLetterOf(origin.message, origin.source, "undeliverable", detail, new Date().toISOString());
  return { ...d, value: { ...d.value, undelivered: { topic, value: fitted.value } } };
}

/** A control record (see `src/schemas/control.ts`) for one partition: clients skip it. */
export function healRecord(topic: string, partition: number): OutRecord {
  return { topic, partition, key: HEAL_KEY, value: null, headers: { [CONTROL_HEADER]: "heal" } };
}
