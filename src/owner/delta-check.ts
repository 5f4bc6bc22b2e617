import { canonicalJson } from "../canonical-json.ts";
import { WritError } from "../errors.ts";
import type { JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { AdmittedTool } from "../tools.ts";

/** Why a delta touches what its tool may not: a path outside its `allowedPaths`, or an operation not allowed there. */
export type ScopeRefusal =
  | { reason: "patch_path_not_allowed"; message: string; details: { paths: string[] } }
  | { reason: "patch_op_not_allowed"; message: string; details: { ops: string[] } };

/** At most this many refused paths or operations are named in a refusal. */
const SCOPE_SHOWN = 10;

/**
 * The tool's scope, checked on a delta before it may be written: every path it touches (a move's or copy's `from`
 * too) must match the tool's `allowedPaths` (`patch_path_not_allowed`), and each operation must be allowed where it
 * acts (`patch_op_not_allowed`). Null when the whole delta is within it. The one check of an agent's intent at
 * admission and of an operator's resolution before its PATCH: a person's decision widens nothing the tool declares.
 */
export function scopeRefusal(tool: Pick<AdmittedTool, "name" | "isAllowedPath" | "isAllowedOp">, delta: readonly JsonPatchOp[]): ScopeRefusal | null {
  const paths = delta.flatMap((op) => ("from" in op ? [op.path, op.from] : [op.path])).filter((p) => !tool.isAllowedPath(p));
  if (paths.length > 0) {
    const shown = paths.slice(0, SCOPE_SHOWN);
    return { reason: "patch_path_not_allowed", message: `tool ${tool.name} may not touch ${shown.join(", ")}`, details: { paths: shown } };
  }
  const forbidden = delta.filter((op) => !tool.isAllowedOp(op));
  if (forbidden.length > 0) {
    const ops = forbidden.slice(0, SCOPE_SHOWN).map((op) => `${op.op} ${op.path}`);
    return { reason: "patch_op_not_allowed", message: `tool ${tool.name} may not ${ops.join(", ")}`, details: { ops } };
  }
  return null;
}

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
