import type { KafkaMessage } from "kafkajs";
import { sha256Hex } from "../canonical-json.ts";
import { type DeadLetterReason, ESCALATION_REASONS, REJECT_REASONS, type RejectReason } from "../errors.ts";
import { deadLetterKey, type DeadLetter } from "../schemas/dead-letter.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { LedgerIntentEntry, LedgerLeaseEntry, StoredOutcome } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import type { OutRecord } from "./produce-limits.ts";

/**
 * What settling one intent produces. All of it is staged together and goes
 * out in one Kafka transaction, with the consumed offset: the ledger change,
 * the replies, an escalation, a dead letter. Nothing of it reaches Kafka
 * unless all of it does.
 */
export interface Effects {
  ledger?: LedgerIntentEntry;
  /** A refusal of a signed intent, remembered for its bytes (refusals.ts): written beside the reply. */
  refusal?: LedgerIntentEntry;
  /**
   * The intent key's entry as it is, dated again: the entry answered this intent, whose bytes would outlive it
   * (intent-pipeline.ts `keeping`). Written beside the reply.
   */
  kept?: LedgerIntentEntry;
  /** A record's lease granted or renewed (an entry), or released (null: a tombstone). */
  lease?: { entityKey: string; entry: LedgerLeaseEntry | null };
  replies: { topic: string; value: Reply }[];
  escalations: { key: string; value: Escalation }[];
  deadLetters: { key: string | null; value: DeadLetter }[];
  /**
   * The record itself, to its key's partition of the intents topic (it arrived on another one). `built`: the record
   * as forwarded and the bytes it takes alone in a batch, made once where the forward is decided (records.ts forwardOf).
   */
  forwards: { partition: number; message: KafkaMessage; from: SourceRef; built?: { record: OutRecord; bytes: number } }[];
  /**
   * The very submission whose result the ledger holds, delivered again (an offset commit lags the result by
   * design, so a rebalance or restart re-delivers a few records): answered again, counted apart from repeats.
   */
  redelivered?: boolean;
}

export function effects(parts: Partial<Effects> = {}): Effects {
  return { replies: [], escalations: [], deadLetters: [], forwards: [], ...parts };
}

/** Where a record came from, for dead letters and logs. */
export interface SourceRef {
  topic: string;
  partition: number;
  offset: string;
}

export function rejectedReply(
  intentId: string,
  intentKey: string,
  reason: RejectReason,
  message: string,
  at: string,
  details?: unknown,
): Reply {
  return { status: "rejected", intentId, intentKey, duplicate: false, at, reason, message, ...(details === undefined ? {} : { details }) };
}

/**
 * The reply a repeat of `intent` (by `tool`) gets from the key's stored outcome: the same answer, marked duplicate,
 * without record state. `undoneBy`: the key of an applied undo of this write (classify.ts appliedUndoOf).
 */
export function replayedReply(intent: WriteIntent, tool: string, stored: Exclude<StoredOutcome, { status: "conflict" }>, at: string, undoneBy?: string): Reply {
  const base = { intentId: intent.intentId, intentKey: intent.intentKey, duplicate: true, at };
  switch (stored.status) {
    case "applied":
      return {
        ...base,
        status: "applied",
        entity: intent.entity,
        state: null,
        version: stored.version,
        via: stored.via === "patch" || stored.via === "create" ? stored.via : "reconcile",
        tool,
        ...(intent.undo ? { undoOf: intent.undo.intentKey } : {}),
        ...(undoneBy !== undefined ? { undoneBy } : {}),
      };
    case "rejected": {
      const reason = (REJECT_REASONS as readonly string[]).includes(stored.reason) ? (stored.reason as RejectReason) : "sor_rejected";
      return { ...base, status: "rejected", reason, message: stored.message };
    }
    case "escalated": {
      const reason = ESCALATION_REASONS.find((r) => r === stored.reason) ?? "outcome_unknown";
      return { ...base, status: "escalated", entity: intent.entity, reason, message: stored.message, escalationId: stored.escalationId };
    }
  }
}

/**
 * A dead letter for a record. Its value is kept whole; the owner trims it
 * (keeping length and sha256) when the envelope would not fit the broker's
 * message size.
 */
export function deadLetterOf(message: KafkaMessage, source: SourceRef, reason: DeadLetterReason, detail: string, at: string): Effects["deadLetters"][number] {
  const headers: Record<string, string> = {};
  let headerBytes = 0;
  for (const [k, v] of Object.entries(message.headers ?? {})) {
    if (v === undefined) continue;
    const text = (Array.isArray(v) ? v.map(String).join(",") : String(v)).slice(0, 1024);
    headerBytes += Buffer.byteLength(k) + Buffer.byteLength(text);
    if (headerBytes > 16_384) break;
    headers[k.slice(0, 256)] = text;
  }
  const value = message.value ?? Buffer.alloc(0);
  const key = deadLetterKey(message.key);
  return {
    key,
    value: {
      reason,
      message: detail.slice(0, 2000),
      source: { ...source },
      key,
      valueBase64: value.toString("base64"),
      originalBytes: value.length,
      sha256: sha256Hex(value),
      truncated: false,
      headers,
      at,
    },
  };
}

/** The same dead letter with its payload cut to `maxPayloadBytes` of the original. */
export function truncateDeadLetter(d: DeadLetter, maxPayloadBytes: number): DeadLetter {
  const bytes = Buffer.from(d.valueBase64, "base64");
  if (bytes.length <= maxPayloadBytes) return d;
  return { ...d, valueBase64: bytes.subarray(0, Math.max(0, maxPayloadBytes)).toString("base64"), truncated: true };
}

/** The same reply without record state (a rejection without its details), marked `truncated`, for a reply that would not fit the broker's message size. */
export function withoutState(reply: Reply): Reply {
  switch (reply.status) {
    case "applied":
      return { ...reply, state: null, truncated: true };
    case "conflict":
      return { ...reply, current: { state: null, version: reply.current.version }, truncated: true };
    case "rejected":
      return { ...reply, details: undefined, message: reply.message.slice(0, 2000), truncated: true };
    default:
      return reply;
  }
}
