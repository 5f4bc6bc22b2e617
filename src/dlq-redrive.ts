// Sending a dead letter back to the intents topic: what `writ dlq redrive` and the console's "Send back" share.
//
// A dead letter keeps the original record (key, value whole unless `truncated`, headers as text). Sent back, it
// goes with that key, value and headers plus `writ-redriven-from`, on the key's murmur2 partition (as writ's
// client and the owners compute it), and passes admission again like any record. Its intent key makes sending
// it more than once safe: an intent the owner already took is answered from the ledger, never written twice.
import { Partitioners, type IHeaders, type Kafka, type Producer } from "kafkajs";
import { sha256Hex } from "./canonical-json.ts";
import { decodeRecord } from "./cli/tail.ts";
import { atOffset, offsetsWanted, readRecordsAt } from "./cli/topic-reader.ts";
import type { WireCodec } from "./codec.ts";
import type { Logger } from "./logger.ts";
import { deadLetterKey, type DeadLetter } from "./schemas/dead-letter.ts";

/** The header a redriven record carries: the dead letter it came from (`<dlq topic>:<partition>:<offset>`). */
export const REDRIVEN_FROM_HEADER = "writ-redriven-from";

export interface DeadLetterRef {
  topic: string;
  partition: number;
  offset: string;
}

/** Why a dead letter cannot be sent back, or null when it can (a truncated one, from its source: `originalsOf`). */
export function notRedrivable(letter: { source: DeadLetterRef }, intentsTopic: string): { outcome: "other_topic" | "source_invalid"; detail: string } | null {
  if (letter.source.topic !== intentsTopic) return { outcome: "other_topic", detail: `from ${letter.source.topic}, not the intents topic ${intentsTopic}` };
  // The schema takes any string: an owner writes an offset, and a truncated one is read back from it (BigInt).
  if (!/^\d{1,19}$/.test(letter.source.offset) || letter.source.partition < 0) {
    return { outcome: "source_invalid", detail: `its source ${letter.source.partition}@${letter.source.offset.slice(0, 40)} is no partition and offset (not an owner's dead letter)` };
  }
  return null;
}

/**
 * Why a dead letter whose value is whole cannot be sent back, or null when it can: its value must be the bytes its
 * length and sha256 name. Any producer can write writ.dlq; a copy carrying other bytes under a real record's key
 * and sha256 would be sent in its place (and the real one, the same record by those, not sent at all).
 */
export function valueRefusal(letter: Pick<DeadLetter, "truncated" | "valueBase64" | "originalBytes" | "sha256">): { outcome: "value_changed"; detail: string } | null {
  if (letter.truncated) return null; // sent from its source, checked there (originalsOf)
  const value = Buffer.from(letter.valueBase64, "base64");
  if (value.length === letter.originalBytes && sha256Hex(value) === letter.sha256) return null;
  return { outcome: "value_changed", detail: `its value is not the ${letter.originalBytes} bytes its sha256 names (another record's bytes: a forged or damaged dead letter)` };
}

/**
 * What names one record among dead letters: its key and the sha256 of its value. A record sent back whose cause
 * remained is dead-lettered again under it, and is sent once. Taken only for a dead letter whose value is known to
 * be those bytes (`valueRefusal`; a truncated one's once `originalsOf` read it): a copy naming a real record's key
 * and sha256 must not make the real one a repeat.
 */
export function recordIdentity(letter: { key: string | null; sha256: string }): string {
  return `${letter.key}\u0000${letter.sha256}`;
}

/** The original record of a truncated dead letter, read back from its source. */
export interface Original {
  value: Buffer;
  headers: IHeaders;
}

export type OriginalRefusal = { outcome: "source_gone" | "source_changed" | "read_timeout" | "read_failed"; detail: string };

/**
 * The originals of truncated dead letters (their value was cut to fit the broker's message size), read from
 * their source offsets while the intents topic retains them, in one read per call: each is taken only when its
 * key and the sha256 of its value are the dead letter's, so what is sent back is the very record that was
 * dead-lettered. Answers by index of `letters`.
 */
export async function originalsOf(
  kafka: Kafka,
  letters: readonly { source: DeadLetterRef; key: string | null; sha256: string }[],
  opts: { timeoutMs: number; log: Logger },
): Promise<(Original | OriginalRefusal)[]> {
  const read = new Map<string, Awaited<ReturnType<typeof readRecordsAt>> | { failed: string }>();
  for (const topic of new Set(letters.map((l) => l.source.topic))) {
    const wanted = offsetsWanted(letters.filter((l) => l.source.topic === topic).map((l) => l.source));
    try {
      read.set(topic, await readRecordsAt(kafka, topic, wanted, opts));
    } catch (err) {
      // the brokers unreachable, the read refused (an ACL): each of these letters says so, none is lost
      opts.log.warn({ err, topic }, "could not read the originals of truncated dead letters");
      read.set(topic, { failed: err instanceof Error ? err.message : String(err) });
    }
  }
  return letters.map((l) => {
    const where = `${l.source.topic}[${l.source.partition}]@${l.source.offset}`;
    const got = read.get(l.source.topic)!;
    if ("failed" in got) return { outcome: "read_failed", detail: `${where} could not be read: ${got.failed}` };
    const r = got.found.get(atOffset(l.source.partition, l.source.offset));
    if (r === undefined) {
      if (got.timedOut) return { outcome: "read_timeout", detail: `${where} not read within ${opts.timeoutMs} ms` };
      return { outcome: "source_gone", detail: `the value was cut to fit and ${where} is not in the topic any more (retention)` };
    }
    const value = r.value ?? Buffer.alloc(0);
    if (deadLetterKey(r.key) !== l.key || sha256Hex(value) !== l.sha256) return { outcome: "source_changed", detail: `the record at ${where} is not the one dead-lettered (another key or sha256)` };
    return { value, headers: r.headers ?? {} };
  });
}

/**
 * The record that sends `letter` (read at `from`) back: its key, value and headers (the original's, read from its
 * source, when the dead letter's value was truncated), and where it came from.
 */
export function redriveMessage(letter: DeadLetter, from: DeadLetterRef, original?: Original): { key: string | null; value: Buffer; headers: IHeaders } {
  return {
    key: letter.key,
    value: original?.value ?? Buffer.from(letter.valueBase64, "base64"),
    headers: { ...(original?.headers ?? (letter.headers as IHeaders)), [REDRIVEN_FROM_HEADER]: `${from.topic}:${from.partition}:${from.offset}` },
  };
}

/** An idempotent producer on the key's murmur2 partition: a retried batch adds no copies. */
export function redriveProducer(kafka: Kafka): Producer {
  return kafka.producer({ idempotent: true, maxInFlightRequests: 1, createPartitioner: Partitioners.DefaultPartitioner });
}

/**
 * The dead letter a record of the intents topic says it was sent back from, with what identifies the record
 * (its key and the sha256 of its value, as a dead letter records them), or null when it names none of `dlqTopic`.
 * The header is any producer's to set: a reader that marks a dead letter as sent back compares the key and
 * sha256 with the dead letter's own, so that only the very record (a real send back, whoever sent it) counts.
 */
export function redrivenFrom(header: string | undefined, dlqTopic: string, key: Buffer | null, value: Buffer | null): { partition: number; offset: string; key: string | null; sha256: string } | null {
  if (header === undefined || header.length > 512) return null;
  const at = header.lastIndexOf(":");
  const before = header.lastIndexOf(":", at - 1);
  if (before < 0 || header.slice(0, before) !== dlqTopic) return null;
  const partition = header.slice(before + 1, at);
  const offset = header.slice(at + 1);
  if (!/^\d{1,9}$/.test(partition) || !/^\d{1,19}$/.test(offset)) return null;
  return {
    partition: Number(partition),
    offset: BigInt(offset).toString(),
    key: deadLetterKey(key),
    sha256: sha256Hex(value ?? Buffer.alloc(0)),
  };
}

/** A dead letter that could not be read back: not decodable, not in time, or not at all (the read failed). */
export type Unread = { unread: "undecodable" | "read_timeout" | "read_failed"; error: string };

/**
 * The dead letters at `refs` of `topic` (writ.dlq), read back in one read (read_committed), by index: null when
 * the offset is not there any more, `{unread, error}` when it does not decode or was not read in time. Neither the
 * console nor a redrive keeps a dead letter's value, which may be a megabyte.
 */
export async function readDeadLetters(
  kafka: Kafka,
  codec: WireCodec,
  topic: string,
  refs: readonly { partition: number; offset: string }[],
  timeoutMs: number,
  log: Logger,
): Promise<({ letter: DeadLetter } | Unread | null)[]> {
  if (refs.length === 0) return [];
  let read: Awaited<ReturnType<typeof readRecordsAt>>;
  try {
    read = await readRecordsAt(kafka, topic, offsetsWanted(refs), { timeoutMs, log });
  } catch (err) {
    // the brokers unreachable, the read refused (an ACL): an answer per dead letter, not a 500
    log.warn({ err, topic }, "could not read dead letters back");
    const error = `could not read it back from ${topic}: ${err instanceof Error ? err.message : String(err)}`;
    return refs.map(() => ({ unread: "read_failed", error }));
  }
  const { found, timedOut } = read;
  const out: ({ letter: DeadLetter } | Unread | null)[] = [];
  for (const ref of refs) {
    const r = found.get(atOffset(ref.partition, ref.offset));
    if (r === undefined) {
      out.push(timedOut ? { error: `not read back from ${topic}[${ref.partition}]@${ref.offset} within ${timeoutMs} ms`, unread: "read_timeout" } : null);
      continue;
    }
    const d = await decodeRecord(codec, "DeadLetter", r);
    out.push(d.tombstone ? null : d.error !== undefined ? { error: d.error, unread: "undecodable" } : { letter: d.value as DeadLetter });
  }
  return out;
}
