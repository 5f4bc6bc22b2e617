import { X509Certificate } from "node:crypto";
import { STATUS_CODES } from "node:http";
import { createSecureContext } from "node:tls";
import { z } from "zod";
import { CANONICAL_MAX_DEPTH, jsonDepth } from "../canonical-json.ts";
import { timerMs } from "../config.ts";
import { WritError } from "../errors.ts";
import { entityKey } from "../schemas/common.ts";
import { tlsConnectOptions } from "../security/transport.ts";
import type { EntityRef, JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { CreateOptions, PatchOptions, PatchOutcome, ReadOptions, ReconcileResult, SystemOfRecord } from "./adapter.ts";
import { parseRetryAfter } from "./retry-after.ts";

/** RFC 9110 §5.1 `token`: a header name. */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** RFC 9110 §5.5 field value: visible ASCII, space, tab and obs-text; no CR, LF, NUL or other control. */
const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
/** Spaces and tabs at either end of a header value, which are not sent (RFC 9110 §5.5). */
const OUTER_BLANKS = /^[\t ]+|[\t ]+$/g;
/** A strong or weak entity tag (RFC 9110 §8.8.3). */
const ENTITY_TAG = /^(?:W\/)?"[\x21\x23-\x7e\x80-\xff]*"$/;
/** What may stand between the quotes of an entity tag. */
const ETAG_CHARS = /^[\x21\x23-\x7e\x80-\xff]+$/;
/** A header value with no whitespace at either end, which is what is sent. */
const RAW_VERSION = /^[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?$/;
/** Headers writ itself sets on a write: the If-Match header may not be one of them. */
const PROTOCOL_HEADERS = new Set(["content-type", "content-length", "transfer-encoding", "accept", "host", "connection", "idempotency-key", "if-none-match"]);

/** Longest version (ETag or body value) writ carries in intents, replies and the ledger (schemas/common.ts `Version`). */
const MAX_VERSION_LENGTH = 256;
const MAX_POINTER_LENGTH = 1024;
const MAX_EXTRA_JSON_LENGTH = 16 * 1024;

/** Headers on every request, or a function called before every request that gives them (e.g. a refreshed token). */
export type HttpHeadersSource = Record<string, string> | (() => Record<string, string> | Promise<Record<string, string>>);

/** Why a header set is not sendable, naming the header but never its value; null when it is. */
function headersProblem(value: unknown): { path: string[]; message: string } | null {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { path: [], message: "must be an object of header values" };
  for (const [name, v] of Object.entries(value)) {
    if (!HEADER_NAME.test(name)) return { path: [name], message: "is not a valid header name" };
    if (typeof v !== "string") return { path: [name], message: "must be a string" };
    if (!HEADER_VALUE.test(v)) return { path: [name], message: "has a value that is not a valid header value (control characters or characters above U+00FF)" };
  }
  return null;
}

const HeadersSource = z.custom<HttpHeadersSource>((v) => typeof v === "function" || (typeof v === "object" && v !== null && !Array.isArray(v)), {
  message: "must be an object of header values, or a function returning one",
}).superRefine((v, ctx) => {
  if (typeof v === "function") return;
  const problem = headersProblem(v);
  if (problem) ctx.addIssue({ code: "custom", path: problem.path, message: problem.message });
});

/** RFC 6901 tokens of a JSON Pointer, or null when it is not one. `""` is the whole document. */
function compilePointer(pointer: string): string[] | null {
  if (pointer === "") return [];
  if (!pointer.startsWith("/") || /~(?![01])/.test(pointer)) return null;
  return pointer
    .slice(1)
    .split("/")
    .map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}

const JsonPointer = z
  .string()
  .max(MAX_POINTER_LENGTH)
  .refine((p) => compilePointer(p) !== null, "must be a JSON Pointer (RFC 6901): empty for the whole body, or /-separated tokens, ~0 for ~ and ~1 for /");

const PathTemplate = z
  .string()
  .startsWith("/")
  .refine((p) => p.includes("{id}"), "must contain {id} (and usually {type})");

const MediaType = z
  .string()
  .max(200)
  .regex(/^[A-Za-z0-9!#$&^_.+-]+\/[A-Za-z0-9!#$&^_.+-]+(?:\s*;[\t\x20-\x7e]*)?$/, "must be a media type such as application/json");

/** A 4xx status an option may give a meaning to: not 404/410 (not found) nor 408/429 (unavailable). */
const ClientErrorStatus = z
  .number()
  .int()
  .min(400)
  .max(499)
  .refine((s) => ![404, 408, 410, 429].includes(s), "404 and 410 mean not found, 408 and 429 unavailable");

/** `{ ...extra, [field]: payload }` as a request body, `what` naming the payload (ops, record) in messages. */
const wrappedBody = (what: string) =>
  z
    .object({
      kind: z.literal("wrapped"),
      field: z.string().min(1).max(128),
      contentType: MediaType.default("application/json"),
      extra: z.record(z.string(), z.json()).optional(),
    })
    .strict()
    .refine((b) => b.extra === undefined || !Object.hasOwn(b.extra, b.field), { message: `must not contain the ${what} field`, path: ["extra"] })
    .refine((b) => b.extra === undefined || JSON.stringify(b.extra).length <= MAX_EXTRA_JSON_LENGTH, {
      message: `must be at most ${MAX_EXTRA_JSON_LENGTH} characters as JSON`,
      path: ["extra"],
    });

const Pem = z.union([z.string().min(1), z.instanceof(Uint8Array)], { error: "must be a PEM string or a Buffer" });

/**
 * Options of {@link createHttpSystemOfRecord}. Paths are templates: `{type}`,
 * `{id}` and `{key}` are replaced with URI-encoded values and appended to
 * `baseUrl` (whose own path is kept). Every object is strict: an unknown key
 * is refused, naming it.
 */
export const HttpSystemOfRecordOptions = z
  .object({
    /** Name tools refer to in their declaration. */
    name: z.string().min(1),
    /** e.g. `https://crm.example.com/api/v2`: an origin and a path; credentials go in `headers`. */
    baseUrl: z.url({ protocol: /^https?$/ }).refine((u) => {
      const parsed = new URL(u);
      return parsed.search === "" && parsed.hash === "" && parsed.username === "" && parsed.password === "";
    }, "must be an origin and a path, without a query, a fragment or credentials (send credentials in `headers`)"),
    /** Where a record is read. Default `/records/{type}/{id}`. */
    recordPath: PathTemplate.default("/records/{type}/{id}"),
    /** Where a write is sent, e.g. `/records/{id}/patch`. Default: `recordPath`. */
    patchPath: PathTemplate.optional(),
    /** Method of a write. Default `PATCH`; some APIs take `POST /…/patch`. */
    method: z.enum(["PATCH", "POST"]).default("PATCH"),
    /**
     * Body of a write. `json-patch` (default): the RFC 6902 array, as
     * `application/json-patch+json`. `wrapped`: `{ ...extra, [field]: ops }`,
     * as `application/json` unless `contentType` says otherwise.
     */
    patchBody: z
      .discriminatedUnion("kind", [z.object({ kind: z.literal("json-patch"), contentType: MediaType.default("application/json-patch+json") }).strict(), wrappedBody("ops")])
      .prefault({ kind: "json-patch" }),
    /** Where the record's state is in a response body: a JSON Pointer. Default `""`, the whole body. */
    state: z.object({ pointer: JsonPointer.default("") }).strict().prefault({}),
    /**
     * Where the record's version is. `etag` (default): the ETag header, which
     * must be strong. `body`: the string or number at a JSON Pointer into the
     * body, carried as an opaque string (a number as its JSON text).
     */
    version: z
      .discriminatedUnion("from", [
        z.object({ from: z.literal("etag") }).strict(),
        z.object({ from: z.literal("body"), pointer: JsonPointer.refine((p) => p !== "", "must point into the body, e.g. /version") }).strict(),
      ])
      .prefault({ from: "etag" }),
    /**
     * How a write names the version it is conditional on. `header`: default
     * `If-Match`. `format`: `etag` (default) sends an entity tag, the version
     * quoted unless it is one already; `raw` sends the version as it is
     * (`If-Match: 7`). An ETag version is sent as it came either way.
     */
    ifMatch: z
      .object({
        header: z
          .string()
          .regex(HEADER_NAME, "must be a header name")
          .refine((h) => !PROTOCOL_HEADERS.has(h.toLowerCase()), "must not be a header writ sets itself")
          .default("If-Match"),
        format: z.enum(["etag", "raw"]).default("etag"),
      })
      .strict()
      .prefault({}),
    /**
     * Statuses of a write that mean "the version did not match". Default
     * `[412]`. An API that answers 409 for a stale version: `[409, 412]`. A
     * status other than 412 is a conflict only when the record's version is
     * no longer the one sent (from the answer, else a read); otherwise the
     * write is `rejected` with that status.
     */
    conflictStatuses: z
      .array(ClientErrorStatus)
      .min(1)
      .max(8)
      .default([412]),
    /**
     * What a conflict's answer (a `conflictStatuses` or `existsStatuses` status) is taken for. `read`
     * (default): nothing; the current record comes from a read. `record`: the record itself, read from the
     * answer as from a read's (the state at `state.pointer`, the version from the ETag or the body), else a
     * read. Only for an API that answers a conflict with the record: an error document with an ETag (a
     * `{"error": …}` body, the state pointer "") would be taken for the record, and the agent would build
     * its next change on it.
     */
    conflictAnswer: z.enum(["read", "record"]).default("read"),
    /**
     * How a record is created under its external id (`upsertByExternalId`, for tools that declare
     * `create`). Default: `PUT` of the record to `recordPath` (`{id}` is the external id) with
     * `If-None-Match: *` (RFC 9110 §13.1.2), and 412 when a record with that id exists. A system's own
     * upsert endpoint: its `path` and `method`, the statuses by which it says "exists", and the body
     * shape; with `ifNoneMatch: false` the endpoint itself must refuse to overwrite (answer an
     * `existsStatuses` status), or a create could replace another agent's record. 2xx → created (the
     * record and its version from the answer, else a read); 404/410 → not found; 408/429 and connections
     * refused → not sent; other 4xx → rejected; 5xx and no answer → unknown (reconcile).
     */
    create: z
      .object({
        /** Where a create is sent. Default: `recordPath`. */
        path: PathTemplate.optional(),
        method: z.enum(["PUT", "POST", "PATCH"]).default("PUT"),
        /** Send `If-None-Match: *`. Default true. */
        ifNoneMatch: z.boolean().default(true),
        /** Statuses that mean "a record with this external id exists". Default `[412]`; e.g. `[409, 412]`. */
        existsStatuses: z.array(ClientErrorStatus).min(1).max(8).default([412]),
        /** `record` (default): the record as the body, as `application/json`; `wrapped`: `{ ...extra, [field]: record }`. */
        body: z
          .discriminatedUnion("kind", [z.object({ kind: z.literal("record"), contentType: MediaType.default("application/json") }).strict(), wrappedBody("record")])
          .prefault({ kind: "record" }),
        /** Also write the external id into the record, at this top-level member (an endpoint that takes it from the body). */
        externalIdField: z.string().min(1).max(128).optional(),
      })
      .strict()
      .prefault({}),
    /** The system dedupes writes by Idempotency-Key. Default false. The header is sent either way. */
    idempotencyKeys: z.boolean().default(false),
    /** e.g. `/idempotency-keys/{key}`: 200 = applied, 404 = not applied. When set, reconcile can ask the system. */
    idempotencyLookupPath: z.string().startsWith("/").includes("{key}").optional(),
    /**
     * Headers on every request, e.g. Authorization: an object, or a function
     * called before every request (so a token can be refreshed). Never logged,
     * never put in an error.
     */
    headers: HeadersSource.default({}),
    /** Ceiling in ms on read() and lookups, and the deadline of the read after a body-less 2xx. Default 5000. */
    readTimeoutMs: timerMs(1).default(5000),
    /**
     * The largest answer body read, in bytes (default 8 MiB): a larger one is cut off as it arrives and never
     * buffered whole. A read or lookup answered with one is `sor_protocol` (an answer writ cannot use); a
     * write answered with one is an unknown outcome, settled by reconcile, as the write may have happened.
     */
    maxResponseBytes: z.number().int().min(1024).max(1024 * 1024 * 1024).default(8 * 1024 * 1024),
    /**
     * TLS of an `https` baseUrl: `ca` replaces the default trust store (PEM),
     * `cert` and `key` are a client certificate (mutual TLS), and
     * `rejectUnauthorized: false` turns verification off. Without it, the
     * process-wide fetch dispatcher is used.
     */
    tls: z
      .object({
        ca: Pem.optional(),
        cert: Pem.optional(),
        key: Pem.optional(),
        rejectUnauthorized: z.boolean().optional(),
      })
      .strict()
      .refine((t) => (t.cert === undefined) === (t.key === undefined), "cert and key go together")
      .optional(),
  })
  .strict()
  .superRefine((o, ctx) => {
    if (o.tls !== undefined && !o.baseUrl.toLowerCase().startsWith("https:")) {
      ctx.addIssue({ code: "custom", path: ["tls"], message: "needs an https baseUrl" });
    }
  });
export type HttpSystemOfRecordOptions = z.input<typeof HttpSystemOfRecordOptions>;
export type HttpSystemOfRecordConfig = z.output<typeof HttpSystemOfRecordOptions>;

/**
 * An HTTP system of record; `lookupIdempotencyKey` is present exactly when
 * `idempotencyLookupPath` is set, `upsertByExternalId` always (see `create`).
 * `config` leaves out `headers` and `tls` (credentials); `close` ends the TLS
 * connections, if any.
 */
export type HttpSystemOfRecord = SystemOfRecord & {
  upsertByExternalId: NonNullable<SystemOfRecord["upsertByExternalId"]>;
  readonly config: Readonly<Omit<HttpSystemOfRecordConfig, "headers" | "tls">>;
  close(): Promise<void>;
};

/**
 * Failures before the request left this machine (no TCP connection, no DNS
 * answer, a server certificate this side refused): the system cannot have seen the write.
 */
const NOT_SENT_CODES = new Set([
  "ECONNREFUSED",
  "ENOTFOUND",
  "EAI_AGAIN",
  "EADDRNOTAVAIL",
  "UND_ERR_CONNECT_TIMEOUT",
  "ERR_TLS_CERT_ALTNAME_INVALID",
  "CERT_HAS_EXPIRED",
  "CERT_NOT_YET_VALID",
  "CERT_UNTRUSTED",
  "CERT_REJECTED",
  "CERT_SIGNATURE_FAILURE",
  "UNABLE_TO_VERIFY_LEAF_SIGNATURE",
  "UNABLE_TO_GET_ISSUER_CERT",
  "UNABLE_TO_GET_ISSUER_CERT_LOCALLY",
  "DEPTH_ZERO_SELF_SIGNED_CERT",
  "SELF_SIGNED_CERT_IN_CHAIN",
]);

/**
 * Unreachable host or network: not sent only when the connect itself failed. The same codes come on a kept-alive
 * connection (an ICMP unreachable after the request went out): then the system may have seen the write.
 */
const NOT_SENT_WHEN_CONNECTING = new Set(["EHOSTUNREACH", "ENETUNREACH"]);

type Exchange =
  /** `secrets`: the configured header values sent, to be kept out of messages built from the answer. */
  | { kind: "answered"; res: Answer; body: string; secrets: readonly string[] }
  /** Known not to have been sent. `permanent`: trying again cannot help (a headers function that answers nonsense). */
  | { kind: "not_sent"; message: string; cause: unknown; permanent: boolean }
  /** Maybe sent, no (complete) answer: timeout, socket hang up, reset; `tooLarge`: an answer over maxResponseBytes, cut off. */
  | { kind: "no_answer"; message: string; cause: unknown; tooLarge?: true };

type Answered = Extract<Exchange, { kind: "answered" }>;

/** What writ reads of an HTTP answer's head. */
interface Answer {
  status: number;
  statusText: string;
  ok: boolean;
  headers: { get(name: string): string | null };
}

/** Header names lower-cased, each once, values as sent: name, value, name, value… (what undici takes). */
type HeaderList = string[];

interface SendInit {
  method: string;
  headers: HeaderList;
  body?: string;
  signal: AbortSignal;
}

/** A request's target: the origin of the configured baseUrl, and the path (base path included) under it. */
interface Target {
  origin: string;
  path: string;
}

type Send = (target: Target, init: SendInit) => Promise<{ answer: Answer; text(): Promise<string> }>;

interface Transport {
  send: Send;
  close(): Promise<void>;
}

type TlsConfig = NonNullable<HttpSystemOfRecordConfig["tls"]>;

/** `ca`, `cert` and `key` as node:tls takes them: strings, or Buffers. */
const pemText = (v: string | Uint8Array): string | Buffer => (typeof v === "string" ? v : Buffer.from(v));

/**
 * Requests through undici's `request` on an Agent of this system's own (its
 * keep-alive pool; with `tls`, its `connect` options). Not `fetch`: the
 * owner's CPU profile under load had undici's fetch (WHATWG streams, Request
 * and Response objects, abort plumbing) at a fifth of the owner's busy time,
 * for answers writ reads whole anyway. `request` follows no redirects and
 * neither decompresses nor asks for compression. Loaded on first use.
 */
function undiciTransport(tls: TlsConfig | undefined, maxResponseBytes: number): Transport {
  const connect = tls === undefined ? undefined : tlsConnectOptions(tls, pemText);
  type Undici = typeof import("undici");
  let loaded: Promise<{ undici: Undici; agent: InstanceType<Undici["Agent"]> }> | undefined;
  let closing: Promise<void> | undefined;
  const load = () => (loaded ??= import("undici").then((undici) => ({ undici, agent: new undici.Agent({ maxResponseSize: maxResponseBytes, ...(connect === undefined ? {} : { connect }) }) })));
  return {
    async send(target, init) {
      let client: Awaited<ReturnType<typeof load>>;
      try {
        client = await load();
      } catch (err) {
        throw new LocalFailure(`the undici package could not be loaded: ${describe(err)}`, true, err);
      }
      // The agent's own request: origin and path as they are, where undici's top-level `request` parses a URL per call.
      const res = await client.agent.request({
        origin: target.origin,
        path: target.path,
        method: init.method as "GET",
        headers: init.headers,
        ...(init.body === undefined ? {} : { body: init.body }),
        signal: init.signal,
      });
      const status = res.statusCode;
      const answer: Answer = {
        status,
        statusText: STATUS_CODES[status] ?? "",
        ok: status >= 200 && status <= 299,
        headers: {
          get(name) {
            const v = res.headers[name.toLowerCase()];
            return v === undefined ? null : Array.isArray(v) ? v.join(", ") : v;
          },
        },
      };
      return { answer, text: () => res.body.text() };
    },
    close() {
      closing ??= (async () => {
        const client = await loaded?.catch(() => undefined);
        await client?.agent.close();
      })();
      return closing;
    },
  };
}

/** A request that never left: the headers function failed or answered nonsense, or undici could not be loaded. */
class LocalFailure extends Error {
  readonly permanent: boolean;
  constructor(message: string, permanent: boolean, cause?: unknown) {
    super(message, cause === undefined ? undefined : { cause });
    this.permanent = permanent;
  }
}

function errorCode(err: unknown): string | undefined {
  return systemError(err)?.code;
}

/** The first error in the cause chain with a code, and the system call it names (`connect`, `read`, …) if any. */
function systemError(err: unknown): { code: string; syscall: string | undefined } | undefined {
  let current: unknown = err;
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const { code, syscall } = current as { code?: unknown; syscall?: unknown };
    if (typeof code === "string") return { code, syscall: typeof syscall === "string" ? syscall : undefined };
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Whether a failed send, by its system error, is known not to have left this machine. */
function neverSent(system: { code: string; syscall: string | undefined }): boolean {
  return NOT_SENT_CODES.has(system.code) || (NOT_SENT_WHEN_CONNECTING.has(system.code) && system.syscall === "connect");
}

function describe(err: unknown): string {
  const code = errorCode(err);
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
  const message = err instanceof Error ? `${err.message}${cause}` : String(err);
  return code === undefined ? message : `${code} (${message})`;
}

/** `promise`, or a rejection when `signal` aborts first. */
function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) return Promise.reject(signal.reason);
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener("abort", onAbort, { once: true });
    promise.then(
      (v) => {
        signal.removeEventListener("abort", onAbort);
        resolve(v);
      },
      (e: unknown) => {
        signal.removeEventListener("abort", onAbort);
        reject(e);
      },
    );
  });
}

interface Request {
  target: Target;
  method: string;
  /** Builds the request headers, and lists the configured values; may call the user's headers function. Throws LocalFailure. */
  headers: () => Promise<{ headers: HeaderList; secrets: string[] }>;
  body?: string;
}

/**
 * One request with a deadline covering the headers function and the answer's
 * body too; the error's code (undici's, or the socket's, on the error or its
 * cause) tells a request that never left from one that got no answer.
 */
async function exchange(send: Send, request: Request, timeoutMs: number, maxResponseBytes: number): Promise<Exchange> {
  // A timer cleared when the exchange ends, not AbortSignal.timeout: that one's timer cannot be cleared, so every
  // request's signal fired its timeout (a DOMException with its stack, an abort event) long after the answer came.
  const deadline = new AbortController();
  const { signal } = deadline;
  const timer = setTimeout(() => deadline.abort(new DOMException(`no answer within ${timeoutMs} ms`, "TimeoutError")), timeoutMs);
  timer.unref();
  try {
    let headers: HeaderList;
    let secrets: string[];
    try {
      ({ headers, secrets } = await untilAborted(request.headers(), signal));
    } catch (err) {
      if (err instanceof LocalFailure) return { kind: "not_sent", message: err.message, cause: err.cause, permanent: err.permanent };
      return { kind: "not_sent", message: `the headers function gave no answer within ${timeoutMs} ms`, cause: undefined, permanent: false };
    }
    try {
      const sent = await send(request.target, { method: request.method, headers, ...(request.body === undefined ? {} : { body: request.body }), signal });
      return { kind: "answered", res: sent.answer, body: await sent.text(), secrets };
    } catch (err) {
      if (err instanceof LocalFailure) return { kind: "not_sent", message: err.message, cause: err.cause, permanent: err.permanent };
      if (signal.aborted) return { kind: "no_answer", message: `no answer within ${timeoutMs} ms`, cause: err };
      const system = systemError(err);
      if (system?.code === "UND_ERR_RES_EXCEEDED_MAX_SIZE") {
        return { kind: "no_answer", message: `the answer's body is over ${maxResponseBytes} bytes (maxResponseBytes); cut off`, cause: err, tooLarge: true };
      }
      if (system !== undefined && neverSent(system)) return { kind: "not_sent", message: describe(err), cause: err, permanent: false };
      return { kind: "no_answer", message: describe(err), cause: err };
    }
  } finally {
    clearTimeout(timer);
  }
}

/**
 * What a 200 to an idempotency-key lookup says. "Applied" settles an intent for good (ledger `done`, no write
 * again), so only an answer that says so: an empty body, or a JSON object (with a JSON media type) whose
 * `applied`, if present, is a boolean (`false`: not applied). Anything else (a proxy's HTML sign-in page,
 * `"applied": "false"`, an array) is unknown, which escalates rather than guess.
 */
function lookupAnswer(ex: { res: Answer; body: string }): ReconcileResult {
  if (ex.body.trim() === "") return "applied";
  if (!isJsonMedia(ex.res)) return "unknown";
  const parsed = parseJson(ex.body);
  if (!parsed.ok || typeof parsed.value !== "object" || parsed.value === null || Array.isArray(parsed.value)) return "unknown";
  if (!Object.hasOwn(parsed.value, "applied")) return "applied";
  const applied = (parsed.value as { applied: unknown }).applied;
  return applied === true ? "applied" : applied === false ? "not_applied" : "unknown";
}

/** Statuses that say the system cannot take the request now (RFC 9110 §15.5.9, §15.6; RFC 6585 §4): an outage. */
function isOutageStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/** `{ retryAfterMs }` when the answer's Retry-After gives a usable wait, else nothing (only the number goes on, never the header's text). */
function retryAfter(ex: { res: Answer }): { retryAfterMs?: number } {
  const ms = parseRetryAfter(ex.res.headers.get("retry-after"), Date.now());
  return ms === undefined ? {} : { retryAfterMs: ms };
}

/** application/json or a `+json` type, but not an RFC 9457 problem. */
function isJsonMedia(res: Answer): boolean {
  const type = (res.headers.get("content-type") ?? "").split(";")[0]?.trim().toLowerCase() ?? "";
  return type === "application/json" || (type.endsWith("+json") && type !== "application/problem+json");
}

/**
 * The body as JSON, refused past CANONICAL_MAX_DEPTH levels (counted without recursion): writ carries
 * a state on (replies, the ledger, canonical fingerprints) only within that depth, and what runs on it
 * later may recurse (the version's reparse below, JSON.stringify, JSON Patch).
 */
function parseJson(body: string): { ok: true; value: unknown } | { ok: false; reason: string } {
  let value: unknown;
  try {
    value = JSON.parse(body);
  } catch {
    return { ok: false, reason: "the body is not JSON" };
  }
  if (jsonDepth(value, CANONICAL_MAX_DEPTH) > CANONICAL_MAX_DEPTH) return { ok: false, reason: `the body is nested deeper than ${CANONICAL_MAX_DEPTH} levels` };
  return { ok: true, value };
}

type Found = { found: true; value: unknown } | { found: false };

/** RFC 6901 §4: array tokens are decimal indexes without leading zeros; object members are own properties only. */
function resolvePointer(doc: unknown, tokens: readonly string[]): Found {
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

class NumberText {
  readonly text: string;
  constructor(text: string) {
    this.text = text;
  }
}

/** The JSON text of a number in the body, where `String(value)` may not round-trip (beyond 2^53, or a fraction). */
function numberText(body: string, tokens: readonly string[], value: number): string | null {
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
const MAX_PROBLEM_DETAIL = 1000;
const MAX_BODY_SNIPPET = 200;

/**
 * `detail` or `title` of an RFC 9457 problem, else the start of the body,
 * else the status line; with every configured header value the server may
 * have echoed (a 401 quoting the token) replaced before the text is cut to
 * length, so a cut cannot leave part of a secret behind.
 */
function problemMessage(ex: { res: Answer; body: string; secrets: readonly string[] }): string {
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
const CREDENTIAL_HEADER = /authorization|cookie|key|token|secret|pass|auth|session|signature|credential/i;

/** Configured header values worth keeping out of messages: each value and its last word (the token after `Bearer`). */
function secretsOf(configured: Record<string, string>): string[] {
  const out = new Set<string>();
  for (const [name, value] of Object.entries(configured)) {
    const min = CREDENTIAL_HEADER.test(name) ? 4 : 8;
    for (const s of [value.trim(), value.trim().split(/\s+/).pop() ?? ""]) if (s.length >= min) out.add(s);
  }
  // Longest first, so a value is replaced before the token inside it.
  return [...out].sort((a, b) => b.length - a.length);
}

/**
 * A system of record over HTTP with conditional writes: GET gives the state
 * and its version, a write (PATCH by default) sends the JSON Patch (RFC 6902)
 * with If-Match and Idempotency-Key, 412 (or a configured status) is a
 * conflict. The body shape, where state and version are, the If-Match header
 * and TLS are options; see docs/http-adapter.md.
 *
 * Outcomes of `patch`: 2xx → `applied` (with the state and version of the
 * answer, else of a follow-up read); a `conflictStatuses` status →
 * `precondition_failed` (with the current record when the answer carries it,
 * else null); 404/410 → `not_found`; 408/429, refused/unresolvable
 * connections and a headers function that failed → `unavailable` (not sent,
 * safe to retry); other 4xx → `rejected`; 5xx, 3xx, timeouts and dropped
 * connections → `unknown` (reconcile). A 408, 429 or 5xx carries its
 * Retry-After as `retryAfterMs` (a read's `sor_unavailable` in its context).
 * An `ifMatch` that cannot be a header value (only a version `read` did not
 * give) is `rejected` with status 0, nothing sent. After `close()`,
 * requests are refused without being sent.
 *
 * @example
 * const crm = createHttpSystemOfRecord({
 *   name: "crm",
 *   baseUrl: "https://crm.example.com/api",
 *   idempotencyKeys: true,
 *   idempotencyLookupPath: "/idempotency-keys/{key}",
 *   headers: async () => ({ authorization: `Bearer ${await tokens.current()}` }),
 * });
 * const ticket = { type: "ticket", id: "T-1" };
 * const fresh = await crm.read(ticket, { timeoutMs: 2000 });
 * const outcome = await crm.patch(ticket, [{ op: "add", path: "/tags/-", value: "refund-issued" }], {
 *   ifMatch: fresh!.version, idempotencyKey: "intent-123", timeoutMs: 5000,
 * });
 *
 * @throws WritError `config_invalid` naming the bad option, never a header value.
 */
export function createHttpSystemOfRecord(opts: HttpSystemOfRecordOptions): HttpSystemOfRecord {
  const invalid = (field: string, message: string) =>
    // The message names the field only: header values and keys may be credentials.
    new WritError("config_invalid", `http system of record option "${field}": ${message}`, { retriable: false, context: { field } });
  const parsed = HttpSystemOfRecordOptions.safeParse(opts);
  if (!parsed.success) {
    const issue = parsed.error.issues[0];
    throw invalid(issue?.path.join(".") || "(options)", issue?.message ?? "invalid");
  }
  const config = parsed.data;
  const { name } = config;
  // Requests go to the origin with the base path kept (undici's dispatcher takes them apart; no URL parsed per call).
  const baseUrl = new URL(config.baseUrl);
  const origin = baseUrl.origin;
  const basePath = baseUrl.pathname.replace(/\/+$/, "");
  const statePointer = compilePointer(config.state.pointer) ?? [];
  const versionPointer = config.version.from === "body" ? (compilePointer(config.version.pointer) ?? []) : null;
  const conflictStatuses = new Set(config.conflictStatuses);
  const patchTemplate = config.patchPath ?? config.recordPath;
  const createTemplate = config.create.path ?? config.recordPath;
  const existsStatuses = new Set(config.create.existsStatuses);
  if (config.tls?.ca !== undefined) {
    // node:tls quietly trusts nothing for a `ca` that holds no certificate: refuse it here instead.
    const pem = typeof config.tls.ca === "string" ? config.tls.ca : Buffer.from(config.tls.ca).toString("latin1");
    const blocks = pem.match(/-----BEGIN CERTIFICATE-----[\s\S]+?-----END CERTIFICATE-----/g) ?? [];
    if (blocks.length === 0) throw invalid("tls.ca", "holds no PEM certificate (-----BEGIN CERTIFICATE-----)");
    for (const block of blocks) {
      try {
        new X509Certificate(block);
      } catch (err) {
        throw invalid("tls.ca", `a certificate could not be parsed (${errorCode(err) ?? "invalid"})`);
      }
    }
  }
  if (config.tls !== undefined) {
    try {
      // Loads the PEMs now, so a bad certificate or key is a config error at startup and not a failed write.
      createSecureContext(tlsConnectOptions(config.tls, pemText));
    } catch (err) {
      throw invalid("tls", `the CA, certificate or key could not be loaded (${errorCode(err) ?? "invalid"})`);
    }
  }
  const transport = undiciTransport(config.tls, config.maxResponseBytes);
  const call = (request: Request, timeoutMs: number) => exchange(transport.send, request, timeoutMs, config.maxResponseBytes);

  /** Where a request for `template` with `values` goes: the configured origin, and the base path then the template, values URI-encoded. */
  const targetOf = (template: string, values: Record<string, string>): Target => ({
    origin,
    path: basePath + template.replace(/\{(type|id|key)\}/g, (_, k: string) => encodeURIComponent(values[k] ?? "")),
  });

  let closed = false;
  /**
   * The configured headers, fresh from the function if there is one, then the
   * caller's, then writ's own; a later name replaces an earlier one whatever
   * its case, and a value is sent without spaces or tabs at either end (what
   * WHATWG Headers did here, without its per-request object).
   */
  const headers = (extra: Record<string, string>, passed: Readonly<Record<string, string>> = {}) => async (): Promise<{ headers: HeaderList; secrets: string[] }> => {
    if (closed) throw new LocalFailure("the system of record is closed", true);
    let configured: unknown = config.headers;
    if (typeof config.headers === "function") {
      try {
        configured = await config.headers();
      } catch (err) {
        throw new LocalFailure(`the headers function failed: ${describe(err).slice(0, 300)}`, false, err);
      }
      const problem = headersProblem(configured);
      if (problem) {
        const what = problem.path.length === 0 ? "it" : `header "${problem.path.join("")}"`;
        throw new LocalFailure(`the headers function's answer is unusable: ${what} ${problem.message}`, true);
      }
    }
    // The static headers were checked at start and a function's answer just above; the caller's and writ's own here.
    if (headersProblem(passed) !== null || headersProblem(extra) !== null) throw new LocalFailure("a request header is not a valid HTTP header value", true);
    const h = new Map<string, string>();
    for (const set of [configured as Record<string, string>, passed, extra]) {
      for (const name in set) if (Object.hasOwn(set, name)) h.set(name.toLowerCase(), (set[name] as string).replace(OUTER_BLANKS, ""));
    }
    const list: HeaderList = [];
    for (const [name, value] of h) list.push(name, value);
    return { headers: list, secrets: secretsOf(configured as Record<string, string>) };
  };
  const context = (entity: EntityRef, extra: Record<string, unknown> = {}) => ({ entity: entityKey(entity), sor: name, ...extra });
  /** A read's or lookup's 5xx/408/429: `sor_unavailable`, with the wait its Retry-After asked for. */
  const outageAnswer = (where: string, ex: Answered, entity: EntityRef) =>
    new WritError("sor_unavailable", `${where}: ${ex.res.status} ${problemMessage(ex)}`, {
      retriable: true,
      context: context(entity, { status: ex.res.status, ...retryAfter(ex) }),
    });

  /** Why a version cannot be carried or sent back, else null. */
  function unsendable(version: string): string | null {
    if (version.length > MAX_VERSION_LENGTH) return `the version is ${version.length} characters long; writ carries at most ${MAX_VERSION_LENGTH}`;
    // If-Match: * matches any version: a write sent on it would be unconditional.
    if (version === "*") return `the version is "*", which ${config.ifMatch.header} takes for any version`;
    if (config.ifMatch.format === "etag" ? !ENTITY_TAG.test(version) && !ETAG_CHARS.test(version) : !RAW_VERSION.test(version)) {
      return config.ifMatch.format === "etag"
        ? `the version ${JSON.stringify(version.slice(0, 64))} cannot be sent as an entity tag (a quote, space, control or non-Latin-1 character); ifMatch.format "raw" sends it as it is`
        : `the version ${JSON.stringify(version.slice(0, 64))} cannot be sent in a header (control or non-Latin-1 characters, or spaces at either end)`;
    }
    return null;
  }

  /** The If-Match value for a carried version, or null when it cannot be a header value. */
  function ifMatchValue(version: string): string | null {
    if (version === "*") return null;
    const value = config.ifMatch.format === "raw" || ENTITY_TAG.test(version) ? version : `"${version}"`;
    return value !== "" && HEADER_VALUE.test(value) && !/^\s|\s$/.test(value) ? value : null;
  }

  /**
   * The record a response carries: state at the state pointer, version from a
   * strong ETag or at the version pointer. A weak ETag (`W/"…"`) is refused:
   * If-Match compares strongly (RFC 9110 §13.1.1), so it could never match
   * and every write would be a 412.
   */
  /** The record a conflict's answer carries, where `conflictAnswer` says it carries one (else an error: read it). */
  function conflictRecord(res: Answer, body: string): Versioned | { error: string } {
    if (config.conflictAnswer !== "record") return { error: "a conflict's answer is not taken for the record (conflictAnswer: read)" };
    return isJsonMedia(res) ? recordFrom(res, body) : { error: "no record" };
  }

  function recordFrom(res: Answer, body: string): Versioned | { error: string } {
    let version: string;
    let parsed: ReturnType<typeof parseJson> | undefined;
    if (versionPointer === null) {
      const etag = res.headers.get("etag");
      if (etag === null || etag === "") return { error: "the answer has no ETag header" };
      if (etag.startsWith("W/")) return { error: `the ETag ${etag.slice(0, 64)} is weak; If-Match needs a strong one` };
      if (etag.length > MAX_VERSION_LENGTH) return { error: `the ETag is ${etag.length} characters long; writ carries at most ${MAX_VERSION_LENGTH}` };
      // One entity tag: two ETag headers arrive joined ("a", "b"), which If-Match would take as either; "*", any.
      if (etag === "*" || (!ENTITY_TAG.test(etag) && !ETAG_CHARS.test(etag))) return { error: `the ETag ${JSON.stringify(etag.slice(0, 64))} is not one entity tag` };
      version = etag;
    } else {
      parsed = parseJson(body);
      if (!parsed.ok) return { error: parsed.reason };
      const at = resolvePointer(parsed.value, versionPointer);
      const where = config.version.from === "body" ? config.version.pointer : "";
      if (!at.found || at.value === null) return { error: `the body has no version at ${where}` };
      if (typeof at.value === "number") {
        const text = numberText(body, versionPointer, at.value);
        if (text === null) return { error: `the version at ${where} is a number beyond 2^53 that this runtime cannot carry exactly; send it as a string` };
        version = text;
      } else if (typeof at.value === "string") {
        if (at.value === "") return { error: `the version at ${where} is empty` };
        version = at.value;
      } else {
        return { error: `the version at ${where} is ${Array.isArray(at.value) ? "an array" : `a ${typeof at.value}`}; it must be a string or a number` };
      }
      const problem = unsendable(version);
      if (problem !== null) return { error: problem };
    }
    parsed ??= parseJson(body);
    if (!parsed.ok) return { error: parsed.reason };
    const state = resolvePointer(parsed.value, statePointer);
    if (!state.found) return { error: `the body has nothing at ${config.state.pointer}` };
    return { state: state.value, version };
  }

  async function read(entity: EntityRef, opts: ReadOptions): Promise<Versioned | null> {
    const timeoutMs = Math.min(opts.timeoutMs, config.readTimeoutMs);
    const target = targetOf(config.recordPath, { type: entity.type, id: entity.id });
    const ex = await call({ target, method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    const where = `${name}: GET ${entityKey(entity)}`;
    if ((ex.kind === "not_sent" && ex.permanent) || (ex.kind === "no_answer" && ex.tooLarge)) {
      throw new WritError("sor_protocol", `${where}: ${ex.message}`, { retriable: false, cause: ex.cause, context: context(entity) });
    }
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    const { res, body } = ex;
    if (res.status === 404 || res.status === 410) return null;
    if (res.ok) {
      const record = recordFrom(res, body);
      if ("error" in record) {
        throw new WritError("sor_protocol", `${where}: ${record.error}`, { retriable: false, context: context(entity, { status: res.status }) });
      }
      return record;
    }
    if (isOutageStatus(res.status)) throw outageAnswer(where, ex, entity);
    throw new WritError("sor_protocol", `${where}: ${problemMessage(ex)}`, {
      retriable: false,
      context: context(entity, { status: res.status }),
    });
  }

  /** A read after a write, on the write's behalf: its failure is a value, not a throw. */
  async function reread(entity: EntityRef, opts: { headers?: Readonly<Record<string, string>> | undefined }): Promise<Versioned | null | { failed: string }> {
    try {
      return await read(entity, { timeoutMs: config.readTimeoutMs, ...(opts.headers ? { headers: opts.headers } : {}) });
    } catch (err) {
      return { failed: describe(err) };
    }
  }

  async function patch(entity: EntityRef, ops: readonly JsonPatchOp[], opts: PatchOptions): Promise<PatchOutcome> {
    const condition = ifMatchValue(opts.ifMatch);
    if (condition === null) {
      // Only a version read() did not give can get here; nothing was sent.
      return { kind: "rejected", status: 0, message: `the version ${JSON.stringify(opts.ifMatch.slice(0, 64))} cannot be sent as ${config.ifMatch.header}` };
    }
    const body = config.patchBody.kind === "json-patch" ? ops : { ...config.patchBody.extra, [config.patchBody.field]: ops };
    const target = targetOf(patchTemplate, { type: entity.type, id: entity.id });
    const ex = await sendWrite(target, config.method, config.patchBody.contentType, { [config.ifMatch.header]: condition }, body, opts);
    if (ex.kind === "not_sent") return { kind: "unavailable", message: ex.message };
    if (ex.kind === "no_answer") return { kind: "unknown", message: ex.message };
    const { res, body: answer } = ex;
    const status = res.status;
    if (res.ok) return written(ex, entity, opts);
    if (conflictStatuses.has(status)) {
      const record = conflictRecord(res, answer);
      let current: Versioned | null = "error" in record ? null : record;
      if (status !== 412) {
        // A 409 may mean a stale version or something else (a failed `test` op): only a changed version makes it a conflict.
        if (current === null) {
          const fresh = await reread(entity, opts);
          if (fresh === null) return { kind: "not_found" };
          if (!("failed" in fresh)) current = fresh;
        }
        if (current !== null && current.version === opts.ifMatch) return { kind: "rejected", status, message: problemMessage(ex) };
      }
      return { kind: "precondition_failed", current };
    }
    return refused(ex);
  }

  /** One write request: the body as JSON, writ's headers (type, Accept, the precondition, Idempotency-Key) over the caller's. */
  function sendWrite(
    target: Target,
    method: string,
    contentType: string,
    precondition: Record<string, string>,
    body: unknown,
    opts: { idempotencyKey: string; timeoutMs: number; headers?: Readonly<Record<string, string>> | undefined },
  ): Promise<Exchange> {
    const own = { "content-type": contentType, accept: "application/json", ...precondition, "idempotency-key": opts.idempotencyKey };
    return call({ target, method, headers: headers(own, opts.headers), body: JSON.stringify(body) }, opts.timeoutMs);
  }

  /** A write's 2xx: applied, with the record the answer carries, else (no body, no version) with a read of it. */
  async function written(ex: Answered, entity: EntityRef, opts: { headers?: Readonly<Record<string, string>> | undefined }): Promise<PatchOutcome> {
    const status = ex.res.status;
    const record = ex.body.trim() === "" ? { error: "no body" } : recordFrom(ex.res, ex.body);
    if (!("error" in record)) return { kind: "applied", ...record };
    const fresh = await reread(entity, opts);
    if (fresh === null) return { kind: "unknown", message: `${status} (${record.error}), and the record is not there on re-read` };
    if ("failed" in fresh) return { kind: "unknown", message: `${status} (${record.error}), and the re-read failed: ${fresh.failed}` };
    return { kind: "applied", state: fresh.state, version: fresh.version };
  }

  /** A write's answer that is neither 2xx nor a conflict: not found, not taken (408/429), refused (4xx), or unknown. */
  function refused(ex: Answered): PatchOutcome {
    const status = ex.res.status;
    if (status === 404 || status === 410) return { kind: "not_found" };
    if (status === 408 || status === 429) return { kind: "unavailable", message: `${status}: ${problemMessage(ex)}`, ...retryAfter(ex) };
    if (status >= 400 && status < 500) return { kind: "rejected", status, message: problemMessage(ex) };
    // A 5xx may still have written: unknown, but a Retry-After it carries is kept (reconcile waits for it too).
    return { kind: "unknown", message: `${status}: ${problemMessage(ex)}`, ...(status >= 500 ? retryAfter(ex) : {}) };
  }

  /**
   * A create-if-absent under the external id `entity.id`: the configured
   * method to `create.path` with `If-None-Match: *` (unless switched off) and
   * the intent key as Idempotency-Key. A conflicting record comes back as
   * `precondition_failed`, with the record when the answer carries it.
   */
  async function upsertByExternalId(entity: EntityRef, state: unknown, opts: CreateOptions): Promise<PatchOutcome> {
    const c = config.create;
    let record = state;
    if (c.externalIdField !== undefined) {
      if (typeof state !== "object" || state === null || Array.isArray(state)) {
        return { kind: "rejected", status: 0, message: `create.externalIdField needs the record to be a JSON object; nothing was sent` };
      }
      record = { ...state, [c.externalIdField]: entity.id };
    }
    const body = c.body.kind === "record" ? record : { ...c.body.extra, [c.body.field]: record };
    const target = targetOf(createTemplate, { type: entity.type, id: entity.id });
    const ex = await sendWrite(target, c.method, c.body.contentType, c.ifNoneMatch ? { "if-none-match": opts.ifNoneMatch } : {}, body, opts);
    if (ex.kind === "not_sent") return { kind: "unavailable", message: ex.message };
    if (ex.kind === "no_answer") return { kind: "unknown", message: ex.message };
    const { res, body: answer } = ex;
    if (res.ok) return written(ex, entity, opts);
    if (existsStatuses.has(res.status)) {
      const current = conflictRecord(res, answer);
      return { kind: "precondition_failed", current: "error" in current ? null : current };
    }
    return refused(ex);
  }

  async function lookupIdempotencyKey(entity: EntityRef, idempotencyKey: string, opts: ReadOptions): Promise<ReconcileResult> {
    if (config.idempotencyLookupPath === undefined) return "unknown";
    const target = targetOf(config.idempotencyLookupPath, { type: entity.type, id: entity.id, key: idempotencyKey });
    const timeoutMs = Math.min(opts.timeoutMs, config.readTimeoutMs);
    const ex = await call({ target, method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    const where = `${name}: GET idempotency key ${idempotencyKey.slice(0, 12)}…`;
    if ((ex.kind === "not_sent" && ex.permanent) || (ex.kind === "no_answer" && ex.tooLarge)) {
      throw new WritError("sor_protocol", `${where}: ${ex.message}`, { retriable: false, cause: ex.cause, context: context(entity) });
    }
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    if (ex.res.status === 404) return "not_applied";
    if (isOutageStatus(ex.res.status)) throw outageAnswer(where, ex, entity);
    if (ex.res.status !== 200) return "unknown";
    return lookupAnswer(ex);
  }

  const { headers: _secret, tls: _tls, ...visible } = config;
  return {
    name,
    config: visible,
    capabilities: { idempotencyKeys: config.idempotencyKeys, idempotencyLookup: config.idempotencyLookupPath !== undefined },
    read,
    patch,
    upsertByExternalId,
    ...(config.idempotencyLookupPath === undefined ? {} : { lookupIdempotencyKey }),
    close: () => {
      closed = true;
      return transport.close();
    },
  };
}
