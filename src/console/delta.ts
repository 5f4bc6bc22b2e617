// The change an operator gives with Apply on the console's page (a JSON Patch, RFC 6902), checked on the server
// before anything is sent: the page checks it too, but the endpoint takes requests from anything holding the
// operator token. Bounded like what owners admit: its size within the console's bound and the owners'
// maxIntentBytes, its depth within their maxJsonDepth less the level of the Resolution it is sent in; then
// parsed with the schema the clients use (JsonPatch, src/schemas/common.ts).
import { DEFAULT_MAX_INTENT_BYTES, DEFAULT_MAX_JSON_DEPTH } from "../../producers/writ-client.ts";
import { jsonDepth } from "../canonical-json.ts";
import { JSON_PATCH_EXAMPLE, parseJsonPatch, type JsonPatchOp } from "../schemas/common.ts";

/** Most bytes of a delta the page may send (its compact JSON), whatever the owners' maxIntentBytes. */
export const MAX_DELTA_BYTES = 64 * 1024;

/** Why a delta is refused (the endpoint's 400 `reason`). */
export type DeltaRefusal = "delta_not_for_apply" | "delta_too_large" | "delta_too_deep" | "delta_invalid";

export interface DeltaBounds {
  /** Most bytes of its compact JSON. */
  maxBytes: number;
  /** Most levels of nesting of the patch itself (jsonDepth: the array is one). */
  maxDepth: number;
}

/** The bounds for owners admitting `maxIntentBytes` and `maxJsonDepth` (their defaults when not given). */
export function deltaBounds(settings: { maxIntentBytes?: number; maxJsonDepth?: number } = {}): DeltaBounds {
  return {
    maxBytes: Math.min(MAX_DELTA_BYTES, settings.maxIntentBytes ?? DEFAULT_MAX_INTENT_BYTES),
    // A Resolution's delta is one level down in the record owners measure.
    maxDepth: (settings.maxJsonDepth ?? DEFAULT_MAX_JSON_DEPTH) - 1,
  };
}

/** A resolution's bytes beside its intent, delta and message (ids, decision, operator, reply topic, times, framing), generously. */
const RESOLUTION_OVERHEAD_BYTES = 4 * 1024;

/**
 * Bytes a delta may take beside what the resolution carries with it (the escalated intent whole, the operator's
 * message) within the owners' maxIntentBytes (their default when not given); may be negative.
 */
export function deltaRoom(settings: { maxIntentBytes?: number } = {}, intent: unknown, message: string | undefined): number {
  const max = settings.maxIntentBytes ?? DEFAULT_MAX_INTENT_BYTES;
  return max - Buffer.byteLength(JSON.stringify(intent)) - Buffer.byteLength(JSON.stringify(message ?? "")) - RESOLUTION_OVERHEAD_BYTES;
}

/** `value` (a request's `delta`, for `decision`) as a JSON Patch, or why not: a reason and a message that says what to change. */
export function checkDelta(value: unknown, decision: string, bounds: DeltaBounds): { ok: true; delta: JsonPatchOp[] } | { ok: false; reason: DeltaRefusal; error: string } {
  if (decision !== "apply") return { ok: false, reason: "delta_not_for_apply", error: `a delta goes with apply only (the decision is ${decision})` };
  // Depth first: the walk is bounded, where JSON.stringify of a value nested tens of thousands deep (an 80 KiB body
  // can hold one) overflows the stack.
  if (jsonDepth(value, bounds.maxDepth) > bounds.maxDepth) return { ok: false, reason: "delta_too_deep", error: `the delta is nested deeper than ${bounds.maxDepth} levels, which owners refuse inside a resolution (WRIT_MAX_JSON_DEPTH)` };
  const bytes = Buffer.byteLength(JSON.stringify(value) ?? "");
  if (bytes > bounds.maxBytes) return { ok: false, reason: "delta_too_large", error: `the delta is ${bytes} bytes as JSON; at most ${bounds.maxBytes} may be sent from the console (larger: writ escalations resolve --delta-file)` };
  const parsed = parseJsonPatch(value);
  if (!parsed.ok) return { ok: false, reason: "delta_invalid", error: `the delta is not a JSON Patch (RFC 6902), an array of operations such as ${JSON_PATCH_EXAMPLE}: ${parsed.problem}` };
  return { ok: true, delta: parsed.patch };
}
