// Sending a dead letter back to the intents topic: what `writ dlq redrive` and the console's "Send back" share.
//
// A dead letter keeps the original record (key, value whole unless `truncated`, headers as text). Sent back, it
// goes with that key, value and headers plus `writ-redriven-from`, on the key's murmur2 partition (as writ's
// client and the owners compute it), and passes admission again like any record. Its intent key makes sending
// it more than once safe: an intent the owner already took is answered from the ledger, never written twice.
import { Partitioners, type IHeaders, type Kafka, type Producer } from "kafkajs";
import { sha256Hex } from "./canonical-json.ts";
import type { DeadLetter } from "./schemas/dead-letter.ts";

/** The header a redriven record carries: the dead letter it came from (`<dlq topic>:<partition>:<offset>`). */
export const REDRIVEN_FROM_HEADER = "writ-redriven-from";

export interface DeadLetterRef {
  topic: string;
  partition: number;
  offset: string;
}

/** Why a dead letter cannot be sent back as it is, or null when it can. */
export function notRedrivable(letter: { source: DeadLetterRef; truncated: boolean; originalBytes: number; sha256: string }, intentsTopic: string): { outcome: "other_topic" | "truncated"; detail: string } | null {
  if (letter.source.topic !== intentsTopic) return { outcome: "other_topic", detail: `from ${letter.source.topic}, not the intents topic ${intentsTopic}` };
  if (letter.truncated) {
    const where = `${letter.source.topic}[${letter.source.partition}]@${letter.source.offset}`;
    return { outcome: "truncated", detail: `value cut to fit (${letter.originalBytes} bytes, sha256 ${letter.sha256}): fetch it from ${where}` };
  }
  return null;
}

/** The record that sends `letter` (read at `from`) back: its key, value and headers, and where it came from. */
export function redriveMessage(letter: DeadLetter, from: DeadLetterRef): { key: string | null; value: Buffer; headers: IHeaders } {
  return {
    key: letter.key,
    value: Buffer.from(letter.valueBase64, "base64"),
    headers: { ...(letter.headers as IHeaders), [REDRIVEN_FROM_HEADER]: `${from.topic}:${from.partition}:${from.offset}` },
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
    key: key === null ? null : key.toString("utf8").slice(0, 1024),
    sha256: sha256Hex(value ?? Buffer.alloc(0)),
  };
}
