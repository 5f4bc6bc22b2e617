import * as crypto from "node:crypto";
import canonicalize from "canonicalize";
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
 * The canonical JSON of a value: RFC 8785, the JSON Canonicalization Scheme
 * (JCS), so equal values hash equal whatever order a model or a framework put
 * the keys in, and a client in any language can use an off-the-shelf JCS
 * library. What is hashed (intent keys, params and delta fingerprints) and
 * signed (`writ-signature`) is the UTF-8 of this text:
 *
 * - no whitespace; arrays keep their order;
 * - object members in ascending order of their keys' UTF-16 code units, at
 *   every depth (plain code-unit order: `"10"` before `"9"`, `""` first; an own
 *   `"__proto__"` key, as JSON.parse makes one, is an ordinary key);
 * - strings and keys escaped as JSON.stringify does (`\"`, `\\`, `\b \t \n \f \r`,
 *   other U+0000–U+001F as `\u00xx`, everything else as itself);
 * - numbers as ECMAScript Number::toString (`100.0` → `100`, `-0` → `0`,
 *   `1e21` → `1e+21`);
 * - members whose value is `undefined` (or a function, a symbol) left out, and
 *   `toJSON()` applied, as JSON.stringify does.
 *
 * A value with no canonical form is refused with a non-retriable WritError:
 * `input_too_deep` when nested deeper than {@link CANONICAL_MAX_DEPTH} (checked
 * before anything walks it); `not_canonical` for a string or key holding a
 * lone surrogate, a NaN or ±Infinity (JSON text such as `1e400` parses to
 * Infinity), a BigInt, or anything else with no JSON form.
 */
export function canonicalJson(value: unknown): string {
  if (jsonDepth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH) {
    throw new WritError("input_too_deep", `value nested deeper than ${CANONICAL_MAX_DEPTH} levels`, { retriable: false });
  }
  let text: string | undefined;
  try {
    // The reference implementation of RFC 8785 (by the RFC's author), not our own: its key order, string
    // escaping and number formatting are the ones every other JCS library is tested against. It walks
    // with an explicit stack (no recursion) and refuses lone surrogates, NaN and Infinity.
    text = canonicalize(value);
  } catch (err) {
    throw notCanonical(value, err);
  }
  if (text === undefined) throw notCanonical(value, new Error(`${typeof value} has no JSON form`));
  return text;
}

/** The `not_canonical` error for `value`, saying what has no canonical form and where (a JSON Pointer). */
function notCanonical(value: unknown, cause: unknown): WritError {
  const found = firstUncanonical(value);
  const message = found
    ? `no canonical JSON (RFC 8785) for ${found.what} at ${found.at || "(root)"}`
    : `no canonical JSON (RFC 8785): ${cause instanceof Error ? cause.message : String(cause)}`;
  return new WritError("not_canonical", message.slice(0, 1000), { retriable: false, cause });
}

export const LONE_SURROGATE = /\p{Cs}/u;

/**
 * Where a value breaks RFC 8785 (a lone surrogate in a string or key, a
 * non-finite number, a BigInt), for the error message only: the first such
 * place in the value's own member order. Iterative, and run only on the error
 * path, after the depth check.
 */
function firstUncanonical(value: unknown): { what: string; at: string } | null {
  // The pointer is shown to whoever sent the value: its own lone surrogates become U+FFFD.
  const token = (k: string) => k.replace(/~/g, "~0").replace(/\//g, "~1").replace(/\p{Cs}/gu, "\uFFFD");
  const stack: [unknown, string, string | null][] = [[value, "", null]];
  while (stack.length > 0) {
    const [v, at, key] = stack.pop()!;
    if (key !== null && LONE_SURROGATE.test(key)) return { what: "an object key with a lone surrogate (U+D800–U+DFFF outside a pair)", at };
    if (typeof v === "string" && LONE_SURROGATE.test(v)) return { what: "a string with a lone surrogate (U+D800–U+DFFF outside a pair)", at };
    if (typeof v === "number" && !Number.isFinite(v)) return { what: `the number ${v} (NaN and ±Infinity have no JSON form; JSON text such as 1e400 parses to Infinity)`, at };
    if (typeof v === "bigint") return { what: "a BigInt", at };
    if (v === null || typeof v !== "object") continue;
    const array = Array.isArray(v);
    const entries = array ? v.map((c, i) => [String(i), c] as const) : Object.entries(v);
    // Pushed last to first, so the first member is looked at first.
    for (let i = entries.length - 1; i >= 0; i--) {
      const [k, c] = entries[i]!;
      stack.push([c, `${at}/${token(k)}`.slice(0, 300), array ? null : k]);
    }
  }
  return null;
}

/**
 * Node's one-shot `crypto.hash` (20.12 and later) where there is one: a
 * third of `createHash().update().digest()`'s time on an intent key's text,
 * computed several times per intent on both the agent's side and the owner's.
 */
const oneShot = (crypto as { hash?: (algorithm: string, data: string | Buffer, encoding: "hex") => string }).hash;

export function sha256Hex(text: string | Buffer): string {
  return oneShot ? oneShot("sha256", text, "hex") : crypto.createHash("sha256").update(text).digest("hex");
}
