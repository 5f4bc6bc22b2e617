// Records of the intents topic and their dead letters, for the unit tests of sending dead letters back
// (dlq-redrive.test.ts, send-back.test.ts).
import { sha256Hex } from "../../src/canonical-json.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";

export const INTENTS = "writ.intents";

/** A record of the intents topic at `partition`:`offset`, with its key and value. */
export interface Original {
  key: string;
  value: Buffer;
  partition: number;
  offset: string;
}

/** A dead letter of `o` as an owner writes one (whole, or truncated: its first 8 bytes); `over` forges it. */
export function letterOf(o: Original, truncated: boolean, over: Partial<DeadLetter> = {}): DeadLetter {
  return {
    reason: "reply_topic_missing",
    message: "m",
    source: { topic: INTENTS, partition: o.partition, offset: o.offset },
    key: o.key,
    valueBase64: (truncated ? o.value.subarray(0, 8) : o.value).toString("base64"),
    originalBytes: o.value.length,
    sha256: sha256Hex(o.value),
    truncated,
    headers: {},
    at: new Date(0).toISOString(),
    ...over,
  };
}

/** A lease's acquire and its step on one record (one key, one partition), and a record of another key. */
export const acquire: Original = { key: "payment:pay_1", value: Buffer.from('{"step":"acquire","pad":"………………"}'), partition: 1, offset: "7" };
export const step: Original = { key: "payment:pay_1", value: Buffer.from('{"step":"refund"}'), partition: 1, offset: "8" };
export const other: Original = { key: "payment:pay_2", value: Buffer.from('{"step":"other"}'), partition: 0, offset: "0" };

/** What forges a dead letter (`letterOf`'s `over`) to name `o` as its source. */
export const naming = (o: Original) => ({ source: { topic: INTENTS, partition: o.partition, offset: o.offset } });
