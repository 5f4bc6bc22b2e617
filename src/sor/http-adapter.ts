import { X509Certificate } from "node:crypto";
import { createSecureContext } from "node:tls";
import { LONE_SURROGATE } from "../canonical-json.ts";
import { WritError } from "../errors.ts";
import { entityKey } from "../schemas/common.ts";
import { tlsConnectOptions } from "../security/transport.ts";
import type { EntityRef, JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { CreateOptions, PatchOptions, PatchOutcome, ReadOptions, ReconcileResult, SystemOfRecord } from "./adapter.ts";
import { compilePointer, ENTITY_TAG, ETAG_CHARS, HEADER_VALUE, headersProblem, HttpSystemOfRecordOptions, MAX_VERSION_LENGTH, OUTER_BLANKS, PLACEHOLDER, RAW_VERSION, type HttpSystemOfRecordConfig } from "./http-options.ts";
import { sorResponseBudget } from "./response-budget.ts";
import { describe, errorCode, exchange, isOutageStatus, LocalFailure, pemText, retryAfter, undiciTransport, type Answer, type Answered, type Exchange, type HeaderList, type Request, type Target } from "./http-exchange.ts";
import { isJsonMedia, lookupAnswer, numberText, parseJson, problemMessage, resolvePointer, secretsOf } from "./http-answers.ts";

export { HttpSystemOfRecordOptions, type HttpSystemOfRecordConfig, type HttpHeadersSource } from "./http-options.ts";

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
 * connections, a connection not up by the deadline, anything failing before
 * undici wrote the request, and a headers function that failed →
 * `unavailable` (not sent, safe to retry); other 4xx → `rejected`; 5xx, 3xx, timeouts and dropped
 * connections → `unknown` (reconcile). A 408, 429 or 5xx carries its
 * Retry-After as `retryAfterMs` (a read's `sor_unavailable` in its context).
 * An `ifMatch` that cannot be a header value (only a version `read` did not
 * give), an entity id that would be a `.`/`..` path segment, or a request
 * the HTTP client refuses to make (a header from the headers function it does
 * not take), is `rejected` with status 0, nothing sent. After `close()`,
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
  // With several systems in a tools module, which one is wrong matters as much as the field.
  const which = typeof opts?.name === "string" && opts.name !== "" ? ` ${JSON.stringify(opts.name.slice(0, 64))}` : "";
  const invalid = (field: string, message: string) =>
    // The message names the field only: header values and keys may be credentials.
    new WritError("config_invalid", `http system of record${which} option "${field}": ${message}`, { retriable: false, context: { field } });
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
  const transport = undiciTransport(config.tls, config.maxResponseBytes, sorResponseBudget, { ...(config.maxConnections === undefined ? {} : { connections: config.maxConnections }) });
  /**
   * One request. An answer's body holds bytes of the process's answer budget until `ex.release()`: every caller
   * releases once done with the body, and before any further request of its own (a re-read waiting for the budget
   * while its write's answer holds part of it could wait for itself).
   */
  const call = (request: Request, timeoutMs: number) => exchange(transport.send, request, timeoutMs, config.maxResponseBytes);

  /**
   * Where a request for `template` with `values` goes: the configured origin, and the base path then the template,
   * values URI-encoded; or why no request may go. An id `.` or `..` makes a dot segment (the template has none), which
   * servers and proxies resolve away (WHATWG URLs `%2E` too): `/records/ticket/..` is `/records/`, another resource.
   */
  const targetOf = (template: string, values: Record<string, string>): Target | { refused: string } => {
    for (const k of ["type", "id", "key"]) {
      if (LONE_SURROGATE.test(values[k] ?? "")) return { refused: `the ${k} has a lone surrogate, which no URL can carry; nothing was sent` };
    }
    const path = template.replace(PLACEHOLDER, (_, k: string) => encodeURIComponent(values[k] ?? ""));
    if (path.split("?")[0]!.split("/").some((segment) => segment === "." || segment === "..")) {
      return { refused: `the id ${JSON.stringify((values.id ?? "").slice(0, 64))} would make a . or .. path segment, which names another resource; nothing was sent` };
    }
    return { origin, path: basePath + path };
  };

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
        throw new LocalFailure(`the headers function's answer is unusable: ${what} ${problem.message}`, true, undefined, true);
      }
    }
    // The static headers were checked at start and a function's answer just above; the caller's and writ's own here.
    if (headersProblem(passed) !== null || headersProblem(extra) !== null) throw new LocalFailure("a request header is not a valid HTTP header value", true, undefined, true);
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
    const where = `${name}: GET ${entityKey(entity)}`;
    if ("refused" in target) throw new WritError("sor_protocol", `${where}: ${target.refused}`, { retriable: false, context: context(entity) });
    const ex = await call({ target, method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    if ((ex.kind === "not_sent" && ex.permanent) || (ex.kind === "no_answer" && ex.tooLarge)) {
      throw new WritError("sor_protocol", `${where}: ${ex.message}`, { retriable: false, cause: ex.cause, context: context(entity) });
    }
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    try {
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
    } finally {
      ex.release();
    }
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
    if ("refused" in target) return { kind: "rejected", status: 0, message: target.refused };
    const ex = await sendWrite(target, config.method, config.patchBody.contentType, { [config.ifMatch.header]: condition }, body, opts);
    if (ex.kind === "not_sent") return notSentOutcome(ex);
    if (ex.kind === "no_answer") return { kind: "unknown", message: ex.message };
    try {
      const { res, body: answer } = ex;
      const status = res.status;
      if (res.ok) return await written(ex, entity, opts);
      if (conflictStatuses.has(status)) {
        const record = conflictRecord(res, answer);
        let current: Versioned | null = "error" in record ? null : record;
        if (status !== 412) {
          // A 409 may mean a stale version or something else (a failed `test` op): only a changed version makes it a conflict.
          const message = problemMessage(ex);
          ex.release();
          if (current === null) {
            const fresh = await reread(entity, opts);
            if (fresh === null) return { kind: "not_found" };
            if (!("failed" in fresh)) current = fresh;
          }
          if (current !== null && current.version === opts.ifMatch) return { kind: "rejected", status, message };
        }
        return { kind: "precondition_failed", current };
      }
      return refused(ex);
    } finally {
      ex.release();
    }
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
    ex.release();
    if (!("error" in record)) return { kind: "applied", ...record };
    const fresh = await reread(entity, opts);
    if (fresh === null) return { kind: "unknown", message: `${status} (${record.error}), and the record is not there on re-read` };
    if ("failed" in fresh) return { kind: "unknown", message: `${status} (${record.error}), and the re-read failed: ${fresh.failed}` };
    return { kind: "applied", state: fresh.state, version: fresh.version };
  }

  /** A write known not sent: refused when the request itself cannot be made (asking again is refused the same), else tried again later. */
  function notSentOutcome(ex: Extract<Exchange, { kind: "not_sent" }>): PatchOutcome {
    return ex.unsendable ? { kind: "rejected", status: 0, message: ex.message } : { kind: "unavailable", message: ex.message };
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
    if ("refused" in target) return { kind: "rejected", status: 0, message: target.refused };
    const ex = await sendWrite(target, c.method, c.body.contentType, c.ifNoneMatch ? { "if-none-match": opts.ifNoneMatch } : {}, body, opts);
    if (ex.kind === "not_sent") return notSentOutcome(ex);
    if (ex.kind === "no_answer") return { kind: "unknown", message: ex.message };
    try {
      const { res, body: answer } = ex;
      if (res.ok) return await written(ex, entity, opts);
      if (existsStatuses.has(res.status)) {
        const current = conflictRecord(res, answer);
        return { kind: "precondition_failed", current: "error" in current ? null : current };
      }
      return refused(ex);
    } finally {
      ex.release();
    }
  }

  async function lookupIdempotencyKey(entity: EntityRef, idempotencyKey: string, opts: ReadOptions): Promise<ReconcileResult> {
    if (config.idempotencyLookupPath === undefined) return "unknown";
    const target = targetOf(config.idempotencyLookupPath, { type: entity.type, id: entity.id, key: idempotencyKey });
    const timeoutMs = Math.min(opts.timeoutMs, config.readTimeoutMs);
    const where = `${name}: GET idempotency key ${idempotencyKey.slice(0, 12)}…`;
    if ("refused" in target) throw new WritError("sor_protocol", `${where}: ${target.refused}`, { retriable: false, context: context(entity) });
    const ex = await call({ target, method: "GET", headers: headers({ accept: "application/json" }, opts.headers) }, timeoutMs);
    if ((ex.kind === "not_sent" && ex.permanent) || (ex.kind === "no_answer" && ex.tooLarge)) {
      throw new WritError("sor_protocol", `${where}: ${ex.message}`, { retriable: false, cause: ex.cause, context: context(entity) });
    }
    if (ex.kind !== "answered") {
      throw new WritError("sor_unavailable", `${where}: ${ex.message}`, { retriable: true, cause: ex.cause, context: context(entity) });
    }
    try {
      if (ex.res.status === 404) return "not_applied";
      if (isOutageStatus(ex.res.status)) throw outageAnswer(where, ex, entity);
      if (ex.res.status !== 200) return "unknown";
      return lookupAnswer(ex);
    } finally {
      ex.release();
    }
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
