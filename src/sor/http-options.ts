// The HTTP adapter's options (createHttpSystemOfRecord): their zod schema, validated at creation with messages that
// name the field, never a header value, and the header and version grammars the adapter checks against.
import { z } from "zod";
import { timerMs } from "../config.ts";

/** RFC 9110 §5.1 `token`: a header name. */
export const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;
/** RFC 9110 §5.5 field value: visible ASCII, space, tab and obs-text; no CR, LF, NUL or other control. */
export const HEADER_VALUE = /^[\t\x20-\x7e\x80-\xff]*$/;
/** Spaces and tabs at either end of a header value, which are not sent (RFC 9110 §5.5). */
export const OUTER_BLANKS = /^[\t ]+|[\t ]+$/g;
/** A strong or weak entity tag (RFC 9110 §8.8.3). */
export const ENTITY_TAG = /^(?:W\/)?"[\x21\x23-\x7e\x80-\xff]*"$/;
/** What may stand between the quotes of an entity tag. */
export const ETAG_CHARS = /^[\x21\x23-\x7e\x80-\xff]+$/;
/** A header value with no whitespace at either end, which is what is sent. */
export const RAW_VERSION = /^[\x21-\x7e\x80-\xff](?:[\t\x20-\x7e\x80-\xff]*[\x21-\x7e\x80-\xff])?$/;
/** Headers writ itself sets on a write: the If-Match header may not be one of them. */
export const PROTOCOL_HEADERS = new Set(["content-type", "content-length", "transfer-encoding", "accept", "host", "connection", "idempotency-key", "if-none-match"]);

/** Longest version (ETag or body value) writ carries in intents, replies and the ledger (schemas/common.ts `Version`). */
export const MAX_VERSION_LENGTH = 256;
export const MAX_POINTER_LENGTH = 1024;
export const MAX_EXTRA_JSON_LENGTH = 16 * 1024;

/** Headers on every request, or a function called before every request that gives them (e.g. a refreshed token). */
export type HttpHeadersSource = Record<string, string> | (() => Record<string, string> | Promise<Record<string, string>>);

/**
 * Headers of the message's framing and connection, which the HTTP client sets: undici refuses a request carrying one
 * when it is made (a read then looked like an outage, a write like an unknown outcome, though nothing was sent), and
 * a Content-Length of the caller's cannot match every body.
 */
export const FRAMING_HEADERS = new Set(["content-length", "transfer-encoding", "keep-alive", "upgrade", "expect"]);

/** Why a header set is not sendable, naming the header but never its value; null when it is. */
export function headersProblem(value: unknown): { path: string[]; message: string } | null {
  if (typeof value !== "object" || value === null || Array.isArray(value)) return { path: [], message: "must be an object of header values" };
  for (const [name, v] of Object.entries(value)) {
    if (!HEADER_NAME.test(name)) return { path: [name], message: "is not a valid header name" };
    if (FRAMING_HEADERS.has(name.toLowerCase())) return { path: [name], message: "is set by the HTTP client itself (message framing), never by configuration" };
    if (typeof v !== "string") return { path: [name], message: "must be a string" };
    if (!HEADER_VALUE.test(v)) return { path: [name], message: "has a value that is not a valid header value (control characters or characters above U+00FF)" };
    // undici takes only a list of connection options (close, keep-alive, header names).
    if (name.toLowerCase() === "connection" && !v.split(",").every((t) => HEADER_NAME.test(t.trim()))) return { path: [name], message: "must be a comma-separated list of connection options such as close" };
  }
  return null;
}

export const HeadersSource = z.custom<HttpHeadersSource>((v) => typeof v === "function" || (typeof v === "object" && v !== null && !Array.isArray(v)), {
  message: "must be an object of header values, or a function returning one",
}).superRefine((v, ctx) => {
  if (typeof v === "function") return;
  const problem = headersProblem(v);
  if (problem) ctx.addIssue({ code: "custom", path: problem.path, message: problem.message });
});

/** RFC 6901 tokens of a JSON Pointer, or null when it is not one. `""` is the whole document. */
export function compilePointer(pointer: string): string[] | null {
  if (pointer === "") return [];
  if (!pointer.startsWith("/") || /~(?![01])/.test(pointer)) return null;
  return pointer
    .slice(1)
    .split("/")
    .map((t) => t.replace(/~1/g, "/").replace(/~0/g, "~"));
}

export const JsonPointer = z
  .string()
  .max(MAX_POINTER_LENGTH)
  .refine((p) => compilePointer(p) !== null, "must be a JSON Pointer (RFC 6901): empty for the whole body, or /-separated tokens, ~0 for ~ and ~1 for /");

/** Placeholders a path template may hold. */
export const PLACEHOLDER = /\{(type|id|key)\}/g;

/**
 * Why a path template cannot be sent, else null. undici takes any path of bytes 0x21-0xFF (so `[`, `]`, `|` and
 * other characters outside RFC 3986, which many APIs use, e.g. JSON:API `?filter[id]={id}`) but refuses a space,
 * a control character or one past U+00FF only when a request is made (every read then an outage, every write an
 * unknown outcome, nothing sent); it sends a `#`, raw non-ASCII or a stray brace as it is, never meant for the wire;
 * a `.` or `..` segment (`%2E` too) is resolved away by servers and proxies, so the request would name another
 * resource.
 */
export function pathTemplateProblem(template: string): string | null {
  const filled = template.replace(PLACEHOLDER, "x");
  if (!/^[\x21-\x7e]*$/.test(filled)) return "must be printable ASCII: no space, control character or non-ASCII (percent-encode it)";
  if (filled.includes("#")) return "must not contain # (a fragment is never sent)";
  if (/[{}]/.test(filled)) return "must use only {type}, {id} or {key} as placeholders";
  if (/%(?![0-9A-Fa-f]{2})/.test(filled)) return "must use % only in a percent-escape such as %20";
  const segments = filled.split("?")[0]!.replace(/%2e/gi, ".").split(/[/\\]/);
  if (segments.some((s) => s === "." || s === "..")) return "must not contain a . or .. segment";
  return null;
}

const sendablePath = (p: string, ctx: z.RefinementCtx) => {
  const problem = pathTemplateProblem(p);
  if (problem !== null) ctx.addIssue({ code: "custom", message: problem });
};

export const PathTemplate = z
  .string()
  .startsWith("/")
  .refine((p) => p.includes("{id}"), "must contain {id} (and usually {type})")
  .superRefine(sendablePath);

export const MediaType = z
  .string()
  .max(200)
  .regex(/^[A-Za-z0-9!#$&^_.+-]+\/[A-Za-z0-9!#$&^_.+-]+(?:\s*;[\t\x20-\x7e]*)?$/, "must be a media type such as application/json");

/** A 4xx status an option may give a meaning to: not 404/410 (not found) nor 408/429 (unavailable). */
export const ClientErrorStatus = z
  .number()
  .int()
  .min(400)
  .max(499)
  .refine((s) => ![404, 408, 410, 429].includes(s), "404 and 410 mean not found, 408 and 429 unavailable");

/** `{ ...extra, [field]: payload }` as a request body, `what` naming the payload (ops, record) in messages. */
export const wrappedBody = (what: string) =>
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

// z.custom, not z.instanceof: that types it Uint8Array<ArrayBuffer>, which refuses Node's Buffer (Buffer<ArrayBufferLike>).
export const Pem = z.union([z.string().min(1), z.custom<Uint8Array>((v) => v instanceof Uint8Array)], { error: "must be a PEM string or a Buffer" });

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
      // zod runs this after z.url() refused the value too: no URL is z.url()'s issue, not a TypeError from here.
      if (!URL.canParse(u)) return true;
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
          .refine((h) => !PROTOCOL_HEADERS.has(h.toLowerCase()) && !FRAMING_HEADERS.has(h.toLowerCase()), "must not be a header writ sets itself")
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
    idempotencyLookupPath: z
      .string()
      .startsWith("/")
      .includes("{key}")
      .superRefine(sendablePath)
      .optional(),
    /**
     * Headers on every request, e.g. Authorization: an object, or a function
     * called before every request (so a token can be refreshed). Never logged,
     * never put in an error.
     */
    headers: HeadersSource.default({}),
    /** Ceiling in ms on read() and lookups, and the deadline of the read after a body-less 2xx. Default 5000. */
    readTimeoutMs: timerMs(1).default(5000),
    /**
     * Connections open to the system at once, connecting ones included; more requests wait for one (under their
     * deadline). No bound by default (an owner runs up to WRIT_MAX_IN_FLIGHT_PER_PARTITION × its partitions
     * requests at once). Bounds the sockets a stalled connect (a TLS handshake a load balancer never answers)
     * piles up while writes are tried again.
     */
    maxConnections: z.number().int().min(1).max(10_000).optional(),
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
