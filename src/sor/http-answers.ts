// Reading the adapter's answers: JSON bodies and pointers into them, lookup answers, problem details for messages
// (with configured credentials kept out).
import { CANONICAL_MAX_DEPTH, jsonDepth } from "../canonical-json.ts";
import type { ReconcileResult } from "./adapter.ts";
import type { Answer } from "./http-exchange.ts";

/** application/json or a `+json` type, but not an RFC 9457 problem. */
export function isJsonMedia(res: Answer): boolean {
  const type = (res.headers.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  return type === "application/json" || (type.endsWith("+json") && type !== "application/problem+json");
}

/**
 * The body as JSON, refused past CANONICAL_MAX_DEPTH levels (counted without recursion): writ carries
 * a state on (replies, the ledger, canonical fingerprints) only within that depth, and what runs on it
 * later may recurse (the version's reparse below, JSON.stringify, JSON Patch).
 */
export function parseJson(body: string): { ok: true; value: unknown } | { ok: false; reason: string } {
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return { ok: false, reason: "the body is not JSON" };
  }
  if (jsonDepth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH) return { ok: false, reason: `the body is nested deeper than ${CANONICAL_MAX_DEPTH} levels` };
  return { ok: true, value };
}

export type Found = { found: true; value: unknown } | { found: false };

/** RFC 6901 §4: array tokens are decimal indexes without leading zeros; object members are own properties only. */
export function resolvePointer(doc: unknown, tokens: readonly string[]): Found {
  let current = doc;
  for (const token of tokens) {
    if (Array.isArray(current)) {
      if (!/^(?:0|[1-9][0-9]{0,8})$/.test(token)) return { found: false };
      const index = Number(token);
      if (index >= current.length) return { found: false };
      current = current[index];
    } else if (typeof current === "object" && current !== null) {
      if (!Object.hasOwn(current, token)) return { found: false };
      current = (current as Record<string, unknown>)[token];
    } else {
      return { found: false };
    }
  }
  return { found: true, value: current };
}

export class NumberText {
  readonly text: string;
  constructor(text: string) {
    this.text = text;
  }
}

/** The JSON text of a number in the body, where `String(value)` may not round-trip (beyond 2^53, or a fraction). */
export function numberText(body: string, tokens: readonly string[], value: number): string | null {
  if (Number.isSafeInteger(value)) return String(value);
  // JSON.parse source text access (V8 11.4+, Node 21+): the digits as sent, not the nearest double.
  const tree: unknown = JSON.parse(body, (_key, v: unknown, context?: { source?: unknown }) =>
    typeof v === "number" && typeof context?.source === "string" ? new NumberText(context.source) : v,
  );
  const at = resolvePointer(tree, tokens);
  if (at.found && at.value instanceof NumberText) return at.value.text;
  return Number.isFinite(value) && !Number.isInteger(value) ? String(value) : null;
}

/** Longest message taken from an answer: a problem's `detail` or `title`, else this much of the body (after redaction). */
export const MAX_PROBLEM_DETAIL = 1000;
export const MAX_BODY_SNIPPET = 200;

/**
 * `detail` or `title` of an RFC 9457 problem, else the start of the body,
 * else the status line; with every configured header value the server may
 * have echoed (a 401 quoting the token) replaced before the text is cut to
 * length, so a cut cannot leave part of a secret behind.
 */
export function problemMessage(ex: { res: Answer; body: string; secrets: readonly string[] }): string {
  const { res, body } = ex;
  // Each secret as sent and as an answer may echo it: JSON-escaped (PHP's json_encode escapes "/" as "\/"),
  // percent-encoded. Longest first, so a value is replaced before the token inside it.
  const forms = [...new Set(ex.secrets.flatMap((secret) => {
    const json = JSON.stringify(secret).slice(1, -1);
    const percent = encodeURIComponent(secret);
    return [secret, json, json.replaceAll("/", "\\/"), percent, percent.replace(/%[0-9A-F]{2}/g, (e) => e.toLowerCase())];
  }))].sort((a, b) => b.length - a.length);
  const longest = forms[0]?.length ?? 0;
  const redacted = (text: string, max: number): string => {
    // Only the part that can show, plus room for a secret that starts inside it and runs past the cut.
    let out = text.slice(0, max + longest);
    for (const secret of forms) out = out.split(secret).join("[redacted]");
    return out.slice(0, max);
  };
  const parsed = parseJson(body);
  if (parsed.ok && typeof parsed.value === "object" && parsed.value !== null) {
    const { detail, title } = parsed.value as { detail?: unknown; title?: unknown };
    if (typeof detail === "string" && detail !== "") return redacted(detail, MAX_PROBLEM_DETAIL);
    if (typeof title === "string" && title !== "") return redacted(title, MAX_PROBLEM_DETAIL);
  }
  // A JSON body as JSON.stringify writes it, so escapes the server chose (`\/`, `\u002B`) cannot hide a secret.
  const snippet = redacted(parsed.ok ? JSON.stringify(parsed.value) : body.trim(), MAX_BODY_SNIPPET);
  return snippet !== "" ? `${res.status}: ${snippet}` : `${res.status} ${res.statusText}`.trim();
}

/** Header names whose values are credentials, however short: hidden from messages from 4 characters, where other values are from 8. */
export const CREDENTIAL_HEADER = /authorization|cookie|key|token|secret|pass|auth|session|signature|credential/i;

/** Configured header values worth keeping out of messages: each value and its last word (the token after `Bearer`). */
export function secretsOf(configured: Record<string, string>): string[] {
  const out = new Set<string>();
  for (const [name, value] of Object.entries(configured)) {
    const min = CREDENTIAL_HEADER.test(name) ? 4 : 8;
    for (const s of [value.trim(), value.trim().split(/\s+/).pop() ?? ""]) if (s.length >= min) out.add(s);
  }
  // Longest first, so a value is replaced before the token inside it.
  return [...out].sort((a, b) => b.length - a.length);
}

/**
 * What a 200 to an idempotency-key lookup says. "Applied" settles an intent for good (ledger `done`, no write
 * again), so only an answer that says so: an empty body, or a JSON object (with a JSON media type) whose
 * `applied`, if present, is a boolean (`false`: not applied). Anything else (a proxy's HTML sign-in page,
 * `"applied": "false"`, an array) is unknown, which escalates rather than guess.
 */
export function lookupAnswer(ex: { res: Answer; body: string }): ReconcileResult {
  if (ex.body.trim() === "") return "applied";
  if (!isJsonMedia(ex.res)) return "unknown";
  const parsed = parseJson(ex.body);
  if (!parsed.ok || typeof parsed.value !== "object" || parsed.value === null || Array.isArray(parsed.value)) return "unknown";
  if (!Object.hasOwn(parsed.value, "applied")) return "applied";
  const applied = (parsed.value as { applied: unknown }).applied;
  return applied === true ? "applied" : applied === false ? "not_applied" : "unknown";
}
