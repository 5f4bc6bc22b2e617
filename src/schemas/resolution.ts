import { z } from "zod";
import { jsonDepth } from "../canonical-json.ts";
import { Audience, EntityRef, IsoTime, JsonPatch, Version } from "./common.ts";
import { WriteIntent } from "./write-intent.ts";

/** Header that marks a record on the intents topic as a {@link Resolution}, not a WriteIntent. */
export const KIND_HEADER = "writ-kind";

/**
 * Registry subject of resolutions on the intents topic (the topic-record-name
 * strategy): `<intents topic>-Resolution`, beside `<intents topic>-value` of
 * intents, so neither schema has to be compatible with the other.
 */
export function resolutionSubject(intentsTopic: string): string {
  return `${intentsTopic}-Resolution`;
}

/**
 * Resolution: a person's decision on an escalation, sent to the intents
 * topic keyed by the escalated intent's entity key (so the record's owner, its
 * single writer, carries it out) with the header `writ-kind: resolution`.
 *
 * - `apply`: write the escalated intent on the record as it is now. The
 *   operator read it at `baseVersion`; the change is the tool's delta rebuilt
 *   from the intent's params on that version (or `delta`, or the original
 *   append where it commutes). A record that changed since is a conflict back
 *   to the operator; nothing is written.
 * - `discard`: nothing is written; the agent is told, with `message`.
 * - `return`: nothing is written; the intent goes back to the agent with
 *   `message`, to decide again.
 *
 * The agent gets the outcome on its reply topic (with the escalated intent's
 * id), the ledger records it (a repeat of the intent is answered with it), and
 * the operator gets a reply on `replyTo` keyed by `resolutionId`.
 * Compatibility (docs/wire-contract.md §9, with the registry levels that
 * accept each change): optional members only; readers tolerate members they
 * do not know (loose objects; the intent it carries is an intent's, closed).
 */
export const Resolution = z.looseObject({
  kind: z.literal("resolution"),
  resolutionId: z.string().min(1).max(128),
  escalationId: z.string().min(1).max(128),
  /** The escalated intent, as `writ.human` carries it; owners check it is the one their ledger escalated. */
  intent: WriteIntent,
  decision: z.enum(["apply", "discard", "return"]),
  /** `apply`: the version the operator decided on. */
  baseVersion: Version.optional(),
  /** `apply`: the change to write on `baseVersion`, where the tool cannot rebuild it (without it, such an apply is refused `resolution_delta_required`). */
  delta: JsonPatch.optional(),
  message: z.string().max(2000).optional(),
  operator: z.looseObject({ id: z.string().min(1).max(128) }),
  /** The operator's reply topic. */
  replyTo: z.string().min(1).max(249),
  entity: EntityRef,
  createdAt: IsoTime,
  /** The deployment the operator signed the resolution for (its owners' `WRIT_SIGNING_AUDIENCE`), as an intent's `audience`. */
  audience: Audience.optional(),
});
export type Resolution = z.infer<typeof Resolution>;

/** What owners admit of an intent: their `maxIntentBytes` (encoded value, bytes) and `maxJsonDepth` (levels). */
export interface IntentBounds {
  maxIntentBytes: number;
  maxJsonDepth: number;
}

/** Most bytes of its compact JSON and most levels of nesting (jsonDepth: a scalar is 0, `[]` is 1). */
export interface JsonBounds {
  maxBytes: number;
  maxDepth: number;
}

/** What owners admit of a resolution: the whole record, and its `delta`. */
export interface ResolutionBounds extends JsonBounds {
  delta: JsonBounds;
}

/**
 * Bytes a resolution may take beside its intent and its delta: its ids (128 characters each), `baseVersion` (256),
 * `message` (2,000), `replyTo` (249), `entity` (`type` and `id`: 64 and 256), `createdAt`, `audience` (128, none
 * escaped), member names and the registry's 5-byte framing. 17,319 bytes at most as JSON, every other character
 * escaped as `\u00XX`; the rest is margin.
 */
export const RESOLUTION_FIELDS_BYTES = 20 * 1024;

/**
 * The bounds owners admit a resolution within, from the bounds they admit intents within (`WRIT_MAX_INTENT_BYTES`,
 * `WRIT_MAX_JSON_DEPTH`), so that every intent they admit and escalate can be resolved: the resolution carries the
 * escalated intent whole one level down (`intent`), and may carry a change as large and as deep as an intent's
 * (`delta`, one level down, as in an intent). Owners, the clients and the console all take them from here.
 *
 * - whole record: `2 × maxIntentBytes + RESOLUTION_FIELDS_BYTES` bytes, `maxJsonDepth + 1` levels (`too_large`,
 *   `too_deep`, measured before anything walks it);
 * - `delta`: `maxIntentBytes` bytes of compact JSON, `maxJsonDepth - 1` levels (as in an intent).
 *
 * @example resolutionBounds({ maxIntentBytes: 262_144, maxJsonDepth: 32 }) // { maxBytes: 544_768, maxDepth: 33, delta: { maxBytes: 262_144, maxDepth: 31 } }
 */
export function resolutionBounds(intent: IntentBounds): ResolutionBounds {
  return {
    maxBytes: 2 * intent.maxIntentBytes + RESOLUTION_FIELDS_BYTES,
    maxDepth: intent.maxJsonDepth + 1,
    delta: { maxBytes: intent.maxIntentBytes, maxDepth: intent.maxJsonDepth - 1 },
  };
}

/**
 * Why a resolution's `delta` is past what an intent's may be (`too_deep`, then `too_large`; the depth is measured
 * first, without recursion), or null: owners dead-letter such a resolution, and clients refuse to send one.
 */
export function deltaOutOfBounds(delta: unknown, bounds: JsonBounds): { reason: "too_deep" | "too_large"; message: string } | null {
  if (delta === undefined) return null;
  if (jsonDepth(delta, bounds.maxDepth) > bounds.maxDepth) {
    return { reason: "too_deep", message: `its delta is nested deeper than ${bounds.maxDepth} levels, as an intent's may be (WRIT_MAX_JSON_DEPTH less one)` };
  }
  const bytes = Buffer.byteLength(JSON.stringify(delta));
  if (bytes > bounds.maxBytes) return { reason: "too_large", message: `its delta is ${bytes} bytes as JSON, over the ${bounds.maxBytes} an intent may take (WRIT_MAX_INTENT_BYTES)` };
  return null;
}
