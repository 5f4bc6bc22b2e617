import { createHash } from "node:crypto";
import { WritError } from "./errors.ts";

/**
 * Deepest nesting {@link canonicalJson} accepts. Input from Kafka is bounded at
 * admission (`maxJsonDepth`, default 32) before it gets here; this is the
 * backstop for every other caller, far below where V8's stack would overflow.
 */
export const CANONICAL_MAX_DEPTH = 256;

/**
 * Nesting depth of a JSON value (a scalar is 0, `[]` is 1), computed without
 * recursion and stopping as soon as `limit` is passed, so a hostile value
 * costs at most `limit` levels of work before it is refused.
 *
 * @returns the depth, or `limit + 1` when the value is deeper than `limit`.
 */
export function jsonDepth(value: unknown, limit: number): number {
  let max = 0;
  const stack: [unknown, number][] = [[value, 0]];
  while (stack.length > 0) {
    const [v, depth] = stack.pop()!;
    if (v === null || typeof v !== "object") continue;
    const d = depth + 1;
    if (d > limit) return limit + 1;
    if (d > max) max = d;
    const children = Array.isArray(v) ? v : Object.values(v);
    for (const child of children) if (child !== null && typeof child === "object") stack.push([child, d]);
  }
  return max;
}

/**
 * JSON with object keys sorted at every depth, so equal values hash equal
 * whatever order a model or a framework put the keys in. Refuses (a
 * non-retriable `input_too_deep` error) a value nested deeper than
 * {@link CANONICAL_MAX_DEPTH}, before it recurses.
 */
export function canonicalJson(value: unknown): string {
  if (jsonDepth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH) {
    throw new WritError("input_too_deep", `value nested deeper than ${CANONICAL_MAX_DEPTH} levels`, { retriable: false });
  }
  return JSON.stringify(sortKeys(value));
}

function sortKeys(value: unknown): unknown {
  if (Array.isArray(value)) return value.map(sortKeys);
  if (value !== null && typeof value === "object") {
    const out: Record<string, unknown> = {};
    for (const key of Object.keys(value).sort()) {
      const v = (value as Record<string, unknown>)[key];
      // defineProperty, not assignment: an own "__proto__" key (JSON.parse makes one) must stay a key.
      if (v !== undefined) Object.defineProperty(out, key, { value: sortKeys(v), enumerable: true, writable: true, configurable: true });
    }
    return out;
  }
  return value;
}

export function sha256Hex(text: string | Buffer): string {
  return createHash("sha256").update(text).digest("hex");
}
