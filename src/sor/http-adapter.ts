import { z } from "zod";
import { WritError } from "../errors.ts";
import { entityKey } from "../schemas/common.ts";
import type { EntityRef, JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { PatchOptions, PatchOutcome, ReadOptions, ReconcileResult, SystemOfRecord } from "./adapter.ts";

/**
 * Options of {@link createHttpSystemOfRecord}. Paths are templates: `{type}`,
 * `{id}` and `{key}` are replaced with URI-encoded values and appended to
 * `baseUrl` (whose own path is kept).
 */
export const HttpSystemOfRecordOptions = z
  .object({
    /** Name tools refer to in their declaration. */
    name: z.string().min(1),
    /** e.g. `https://crm.example.com/api/v2`. */
    baseUrl: z.url({ protocol: /^https?$/ }),
    /** Default `/records/{type}/{id}`. */
    recordPath: z
      .string()
      .startsWith("/")
      .refine((p) => p.includes("{id}"), "must contain {id} (and usually {type})")
      .default("/records/{type}/{id}"),
    /** The system dedupes writes by Idempotency-Key. Default false. The header is sent either way. */
    idempotencyKeys: z.boolean().default(false),
    /** e.g. `/idempotency-keys/{key}`: 200 = applied, 404 = not applied. When set, reconcile can ask the system. */
    idempotencyLookupPath: z.string().startsWith("/").includes("{key}").optional(),
    /** Static headers on every request, e.g. Authorization. Never logged, never put in an error. */
    headers: z.record(z.string(), z.string()).default({}),
    /** Ceiling in ms on read() and lookups, and the deadline of the read after a body-less 2xx. Default 5000. */
    readTimeoutMs: z.number().int().positive().default(5000),
  })
  .strict();
export type HttpSystemOfRecordOptions = z.input<typeof HttpSystemOfRecordOptions>;
export type HttpSystemOfRecordConfig = z.output<typeof HttpSystemOfRecordOptions>;

/** An HTTP system of record; `lookupIdempotencyKey` is present exactly when `idempotencyLookupPath` is set. */
export type HttpSystemOfRecord = SystemOfRecord & { readonly config: Readonly<Omit<HttpSystemOfRecordConfig, "headers">> };

/**
 * Failures before the request left this machine (no TCP connection, no DNS
 * answer, no TLS session): the system cannot have seen the write.
 */
const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EHOSTUNREACH",
  "ENETUNREACH",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "CERT_HAS_EXPIRED",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
]);

/** Longest ETag writ carries in intents, replies and the ledger (schemas/common.ts `Version`). */
const MAX_ETAG_LENGTH = 256;

type Exchange =
  | { kind: "answered"; res: Response; body: string }
  /** Known not to have been sent. */
  | { kind: "not_sent"; message: string; cause: unknown }
  /** Maybe sent, no (complete) answer: timeout, socket hang up, reset. */
  | { kind: "no_answer"; message: string; cause: unknown };

function errorCode(err: unknown): string | undefined {
  let current: unknown = err;
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const code = (current as { code?: unknown }).code;
    if (typeof code === "string") return code;
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

function describe(err: unknown): string {
  const code = errorCode(err);
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
  const message = err instanceof Error ? `${err.message}${cause}` : String(err);
  return code === undefined ? message : `${code} (${message})`;
}

/** One request with a deadline covering the answer's body too; undici's fetch throws the same TypeError for every failure, so the cause's code tells them apart. */
async function exchange(url: string, init: RequestInit, timeoutMs: number): Promise<Exchange> {
  const signal = AbortSignal.timeout(timeoutMs);
  try {
    const res = await fetch(url, { ...init, signal, redirect: "manual" });
    return { kind: "answered", res, body: await res.text() };
  } catch (err) {
    if (signal.aborted) return { kind: "no_answer", message: `no answer within ${timeoutMs} ms`, cause: err };
    const code = errorCode(err);
    if (code !== undefined && NOT_SENT_CODES.has(code)) return { kind: "not_sent", message: describe(err), cause: err };
    return { kind: "no_answer", message: describe(err), cause: err };
  }
}

function mediaType(res: Response): string {
  return (res.headers.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
}

function parseJson(body: string): { ok: true; value: unknown } | { ok: false } {
  try {
    return { ok: true, value: JSON.parse(body) };
  } catch {
    return { ok: false };
  }
}

/** `detail` or `title` of an RFC 9457 problem, else the start of the body, else the status line. */
function problemMessage(res: Response, body: string): string {
  const parsed = parseJson(body);
  if (parsed.ok && typeof parsed.value === "object" && parsed.value !== null) {
    const { detail, title } = parsed.value as { detail?: unknown; title?: unknown };
    if (typeof detail === "string" && detail !== "") return detail;
    if (typeof title === "string" && title !== "") return title;
  }
  const snippet = body.trim().slice(0, 200);
  return snippet !== "" ? `${res.status}: ${snippet}` : `${res.status} ${res.statusText}`.trim();
}

/**
 * The record a response carries: a JSON body and a strong ETag. A weak ETag
 * (`W/"…"`) is refused: If-Match compares strongly (RFC 9110 §13.1.1), so it
 * could never match and every write would be a 412.
 */
function versionedFrom(res: Response, body: string): Versioned | { error: string } {
  const etag = res.headers.get("etag");
  if (etag === null || etag === "") return { error: "the answer has no ETag header" };
  if (etag.startsWith("W/")) return { error: `the ETag ${etag.slice(0, 64)} is weak; If-Match needs a strong one` };
  if (etag.length > MAX_ETAG_LENGTH) return { error: `the ETag is ${etag.length} characters long; writ carries at most ${MAX_ETAG_LENGTH}` };
  const parsed = parseJson(body);
  if (!parsed.ok) return { error: "the body is not JSON" };
  return { state: parsed.value, version: etag };
}

/**
 * A system of record over HTTP with RFC 9110 conditional requests: GET gives
 * the state and its ETag, PATCH sends a JSON Patch (RFC 6902) with If-Match and
 * Idempotency-Key, 412 is a conflict.
 *
 * Outcomes of `patch`: 2xx → `applied`; 412 → `precondition_failed` (with the
 * current record when the 412 carries a JSON body and an ETag, else null);
 * 404/410 → `not_found`; 408/429 and refused/unresolvable connections →
 * `unavailable` (not processed, safe to retry); other 4xx → `rejected`;
 * 5xx, 3xx, timeouts and dropped connections → `unknown` (reconcile).
 *
 * @example
 * const crm = createHttpSystemOfRecord({
 *   name: "crm",
 *   baseUrl: "https://crm.example.com/api",
 *   idempotencyKeys: true,
 *   idempotencyLookupPath: "/idempotency-keys/{key}",
 *   headers: { authorization: `Bearer ${process.env.CRM_TOKEN}` },
 * });
 * const ticket = { type: "ticket", id: "T-1" };
 * const fresh = await crm.read(ticket, { timeoutMs: 2000 });
 * const outcome = await crm.patch(ticket, [{ op: "add", path: "/tags/-", value: "refund-issued" }], {
 *   ifMatch: fresh!.version, idempotencyKey: "intent-123", timeoutMs: 5000,
 * });
 *
 * @throws WritError `config_invalid` naming the bad option.
 */
export function createHttpSystemOfRecord(opts: HttpSystemOfRecordOptions): HttpSystemOfRecord {
  const parsed = HttpSystemOfRecordOptions.safeParse(opts);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    const field = issue?.path.join(".") || "(options)";
    // The message names the field only: header values may be credentials.
    throw new WritError("config_invalid", `http system of record option "${field}": ${issue?.message ?? "invalid"}`, {
      retriable: false,
      context: { field },
    });
  }
  const config = parsed.data;
  const { name } = config;
  const base = config.baseUrl.replace(/\/+$/, "");

  const url = (template: string, values: Record<string, string>): string =>
    base + template.replace(/\{(type|id|key)\}/g, (_, k: string) => encodeURIComponent(values[k] ?? ""));
  const headers = (extra: Record<string, string>, passed: Readonly<Record<string, string>> = {}): Headers => {
    const h = new Headers(config.headers);
    for (const [k, v] of Object.entries(passed)) h.set(k, v);
    for (const [k, v] of Object.entries(extra)) h.set(k, v);
    return h;
  };
  const context = (entity: EntityRef, extra: Record<string, unknown> = {}) => ({ entity: entityKey(entity), sor: name, ...extra });

  async function read(entity: EntityRef, opts: ReadOptions): Promise<Versioned | null> {
    const timeoutMs = Math.min(opts.timeoutMs, config.readTimeoutMs);
    const target = url(config.recordPath, { type: entity.type, id: entity.id });
    const ex = await exchange(target, { method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    const where = `${name}: GET ${entityKey(entity)}`;
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    const { res, body } = ex;
    if (res.status === 404 || res.status === 410) return null;
    if (res.ok) {
      const record = versionedFrom(res, body);
      if ("error" in record) {
        throw new WritError("sor_protocol", `${where}: ${record.error}`, { retriable: false, context: context(entity, { status: res.status }) });
      }
      return record;
    }
    if (res.status >= 500 || res.status === 408 || res.status === 429) {
      throw new WritError("sor_unavailable", `${where}: ${res.status} ${problemMessage(res, body)}`, {
        retriable: true,
        context: context(entity, { status: res.status }),
      });
    }
    throw new WritError("sor_protocol", `${where}: ${problemMessage(res, body)}`, {
      retriable: false,
      context: context(entity, { status: res.status }),
    });
  }

  async function patch(entity: EntityRef, ops: readonly JsonPatchOp[], opts: PatchOptions): Promise<PatchOutcome> {
    const ex = await exchange(
      url(config.recordPath, { type: entity.type, id: entity.id }),
      {
        method: "PATCH",
        headers: headers(
          {
            "content-type": "application/json-patch+json",
            accept: "application/json",
            "if-match": opts.ifMatch,
            "idempotency-key": opts.idempotencyKey,
          },
          opts.headers,
        ),
        body: JSON.stringify(ops),
      },
      opts.timeoutMs,
    );
    if (ex.kind === "not_sent") return { kind: "unavailable", message: ex.message };
    if (ex.kind === "no_answer") return { kind: "unknown", message: ex.message };
    const { res, body } = ex;
    const status = res.status;
    if (res.ok) {
      const record = body.trim() === "" ? { error: "no body" } : versionedFrom(res, body);
      if (!("error" in record)) return { kind: "applied", ...record };
      // Applied, but the answer does not carry the new state and version: read them.
      try {
        const fresh = await read(entity, { timeoutMs: config.readTimeoutMs, ...(opts.headers ? { headers: opts.headers } : {}) });
        if (fresh !== null) return { kind: "applied", state: fresh.state, version: fresh.version };
        return { kind: "unknown", message: `${status} (${record.error}), and the record is gone on re-read` };
      } catch (err) {
        return { kind: "unknown", message: `${status} (${record.error}), and the re-read failed: ${describe(err)}` };
      }
    }
    if (status === 412) {
      const record = mediaType(res) === "application/json" ? versionedFrom(res, body) : { error: "no record" };
      return { kind: "precondition_failed", current: "error" in record ? null : record };
    }
    if (status === 404 || status === 410) return { kind: "not_found" };
    if (status === 408 || status === 429) return { kind: "unavailable", message: `${status}: ${problemMessage(res, body)}` };
    if (status >= 400 && status < 500) return { kind: "rejected", status, message: problemMessage(res, body) };
    return { kind: "unknown", message: `${status}: ${problemMessage(res, body)}` };
  }

  async function lookupIdempotencyKey(entity: EntityRef, idempotencyKey: string, opts: ReadOptions): Promise<ReconcileResult> {
    if (config.idempotencyLookupPath === undefined) return "unknown";
    const target = url(config.idempotencyLookupPath, { type: entity.type, id: entity.id, key: idempotencyKey });
    const timeoutMs = Math.min(opts.timeoutMs, config.readTimeoutMs);
    const ex = await exchange(target, { method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    const where = `${name}: GET idempotency key ${idempotencyKey.slice(0, 12)}…`;
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    if (ex.res.status === 404) return "not_applied";
    if (ex.res.status >= 500 || ex.res.status === 408 || ex.res.status === 429) {
      throw new WritError("sor_unavailable", `${where}: ${ex.res.status} ${problemMessage(ex.res, ex.body)}`, {
        retriable: true,
        context: context(entity, { status: ex.res.status }),
      });
    }
    if (ex.res.status !== 200) return "unknown";
    const parsed = parseJson(ex.body);
    const applied = parsed.ok && typeof parsed.value === "object" && parsed.value !== null
      ? (parsed.value as { applied?: unknown }).applied
      : undefined;
    return applied === false ? "not_applied" : "applied";
  }

  const { headers: _secret, ...visible } = config;
  return {
    name,
    config: visible,
    capabilities: { idempotencyKeys: config.idempotencyKeys, idempotencyLookup: config.idempotencyLookupPath !== undefined },
    read,
    patch,
    ...(config.idempotencyLookupPath === undefined ? {} : { lookupIdempotencyKey }),
  };
}
