import { canonicalJson } from "../canonical-json.ts";
import { WritError } from "../errors.ts";
import type { JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { AdmittedTool } from "../tools.ts";

/** Why a delta was refused against the one its params give on the current record. */
export interface DeltaRefusal {
  reason: "not_canonical" | "delta_mismatch";
  message: string;
}

/** Each caller's own words for the three refusals (prefixes are followed by the error's message). */
export interface DeltaRefusalWording {
  /** The rebuilt delta has no canonical form (RFC 8785 cannot write it). */
  notCanonical: string;
  /** The tool's delta function threw. */
  failed: string;
  /** The rebuilt delta differs from the one given. */
  mismatch: string;
}

/**
 * Rebuilds the change from `params` on `current` with the tool's delta
 * function and compares it with `delta` (which has a canonical form: admission
 * refused it otherwise). Null when they are the same, or the tool declares no
 * delta function; otherwise the refusal to answer with.
 */
export function deltaRefusal(
  tool: Pick<AdmittedTool, "deriveDelta">,
  params: Record<string, unknown>,
  current: Versioned,
  delta: JsonPatchOp[],
  wording: DeltaRefusalWording,
): DeltaRefusal | null {
  if (!tool.deriveDelta) return null;
  let expected: string;
  try {
    expected = canonicalJson(tool.deriveDelta(params, current));
  } catch (err) {
    // The record as the system of record holds it can put what RFC 8785 cannot write (a lone surrogate) in the delta.
    if (err instanceof WritError && err.code === "not_canonical") {
      return { reason: "not_canonical", message: `${wording.notCanonical}${err.message}`.slice(0, 2000) };
    }
    return { reason: "delta_mismatch", message: `${wording.failed}${err instanceof Error ? err.message : String(err)}`.slice(0, 2000) };
  }
  if (expected !== canonicalJson(delta)) return { reason: "delta_mismatch", message: wording.mismatch };
  return null;
}
