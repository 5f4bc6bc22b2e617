import { z } from "zod";
import { DEAD_LETTER_REASONS } from "../errors.ts";
import { IsoTime, openReason } from "./common.ts";

/**
 * DeadLetter: topic `writ.dlq`; key the original record's key. The original
 * bytes are kept (base64) with the reason, so nothing is lost; a record too
 * large to fit the broker's message size beside its envelope keeps its first
 * bytes, its length and its sha256, enough to find and fetch it from the
 * source offset. An intent whose reply (or escalation) its topic cannot take
 * is dead-lettered `undeliverable`, with that reply in `undelivered`.
 * Compatibility (docs/wire-contract.md §9, with the registry levels that
 * accept each change): optional members and reasons only; readers tolerate
 * members and reasons they do not know.
 */
export const DeadLetter = z.looseObject({
  reason: openReason(DEAD_LETTER_REASONS),
  message: z.string(),
  source: z.looseObject({ topic: z.string(), partition: z.number().int(), offset: z.string() }),
  key: z.string().nullable(),
  /** The original value, whole unless `truncated`. */
  valueBase64: z.string(),
  /** Length of the original value in bytes. */
  originalBytes: z.number().int().min(0),
  /** sha256 (hex) of the original value. */
  sha256: z.string(),
  truncated: z.boolean(),
  headers: z.record(z.string(), z.string()),
  at: IsoTime,
  /**
   * Set on an `undeliverable` dead letter (the record is the intent): what the owner had to write for it and could
   * not, a reply or an escalation larger than its topic takes even without the record's state. `value` is that
   * record as far as it went (null when even that did not fit here). Optional: older records parse.
   */
  undelivered: z.looseObject({ topic: z.string(), value: z.unknown() }).optional(),
});
export type DeadLetter = z.infer<typeof DeadLetter>;

/** The dead letter's `key`: the record's key as UTF-8, its first 1,024 characters (how owners write it; readers compare by it). */
export function deadLetterKey(key: Buffer | null | undefined): string | null {
  return key === null || key === undefined ? null : key.toString("utf8").slice(0, 1024);
}
