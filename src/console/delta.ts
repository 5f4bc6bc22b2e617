// The change an operator gives with Apply on the console's page (a JSON Patch, RFC 6902), checked on the server
// before anything is sent: the page checks it too, but the endpoint takes requests from anything holding the
// operator token. Bounded as owners admit a resolution's delta (resolutionBounds, src/schemas/resolution.ts), and
// by the console's own bound on its size; then parsed with the schema the clients use (JsonPatch, src/schemas/common.ts).
import { ownersIntentBounds } from "../../producers/writ-client.ts";
import { jsonDepth } from "../canonical-json.ts";
import { JSON_PATCH_EXAMPLE, parseJsonPatch, type JsonPatchOp } from "../schemas/common.ts";
import { RESOLUTION_FIELDS_BYTES, resolutionBounds, type JsonBounds } from "../schemas/resolution.ts";

/** Most bytes of a delta the page may send (its compact JSON), whatever the owners' maxIntentBytes. */
export const MAX_DELTA_BYTES = 64 * 1024;

/** Why a delta is refused (the endpoint's 400 `reason`). */
export type DeltaRefusal = "delta_not_for_apply" | "delta_too_large" | "delta_too_deep" | "delta_invalid";

/** Most bytes of its compact JSON; most levels of nesting of the patch itself (jsonDepth: the array is one). */
export type DeltaBounds = JsonBounds;

/** The bounds of a delta for owners admitting `maxIntentBytes` and `maxJsonDepth`: theirs, and at most {@link MAX_DELTA_BYTES}. */
export function deltaBounds(settings: { maxIntentBytes?: number; maxJsonDepth?: number } = {}): DeltaBounds {
  const { delta } = resolutionBounds(ownersIntentBounds(settings));
  return { maxBytes: Math.min(MAX_DELTA_BYTES, delta.maxBytes), maxDepth: delta.maxDepth };
}

/**
 * Bytes a delta may take beside the escalated intent the resolution carries whole, within what owners admit of a
 * resolution (its other fields, the operator's message among them, in their allowance); may be negative. At least
 * the delta's own bound for any intent owners admitted: less only for an intent no owner could have (a forged
 * escalation's).
 */
export function deltaRoom(settings: { maxIntentBytes?: number; maxJsonDepth?: number } = {}, intent: unknown): number {
  return resolutionBounds(ownersIntentBounds(settings)).maxBytes - RESOLUTION_FIELDS_BYTES - Buffer.byteLength(JSON.stringify(intent));
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
