// One HTTP exchange of the adapter: the transport (undici, TLS), the request under its deadline, and what a failure
// says about the write: known not sent (safe to try again), or maybe sent (reconcile).
import { STATUS_CODES } from "node:http";
import { tlsConnectOptions } from "../security/transport.ts";
import { parseRetryAfter } from "./retry-after.ts";
import { type Hold, type ResponseBudget, sorResponseBudget } from "./response-budget.ts";
import type { HttpSystemOfRecordConfig } from "./http-options.ts";

/**
 * Failures before the request left this machine (no TCP connection, no DNS
 * answer, a server certificate this side refused): the system cannot have seen the write.
 */
export const NOT_SENT_CODES = new Set([
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
export const NOT_SENT_WHEN_CONNECTING = new Set(["EHOSTUNREACH", "ENETUNREACH"]);

export type Exchange =
  /**
   * `secrets`: the configured header values sent, to be kept out of messages built from the answer. `release`: gives
   * the body's bytes back to the process's answer budget (in an owner's run, they stay charged as kept until the run
   * ends); call it once done with `body`, before any other request.
   */
  | { kind: "answered"; res: Answer; body: string; secrets: readonly string[]; release: () => void }
  /**
   * Known not to have been sent. `permanent`: trying again cannot help (a headers function that answers nonsense).
   * `unsendable`: the request itself cannot be made (its headers or path), whatever the system's state; a write is refused.
   */
  | { kind: "not_sent"; message: string; cause: unknown; permanent: boolean; unsendable: boolean }
  /** Maybe sent, no (complete) answer: timeout, socket hang up, reset; `tooLarge`: an answer over maxResponseBytes (or its headers over http.maxHeaderSize), cut off. */
  | { kind: "no_answer"; message: string; cause: unknown; tooLarge?: true };

export type Answered = Extract<Exchange, { kind: "answered" }>;

/** What writ reads of an HTTP answer's head. */
export interface Answer {
  status: number;
  statusText: string;
  ok: boolean;
  headers: { get(name: string): string | null };
}

/** Header names lower-cased, each once, values as sent: name, value, name, value… (what undici takes). */
export type HeaderList = string[];

export interface SendInit {
  method: string;
  headers: HeaderList;
  body?: string;
  signal: AbortSignal;
}

/** A request's target: the origin of the configured baseUrl, and the path (base path included) under it. */
export interface Target {
  origin: string;
  path: string;
}

type Dispatch = import("undici").Dispatcher.DispatchInterceptor extends (dispatch: infer D) => unknown ? D : never;

/** `text()` reads the body whole; `release()`, when given, gives its bytes back to the answer budget once it is used. */
export type Send = (target: Target, init: SendInit) => Promise<{ answer: Answer; text(): Promise<string>; release?: () => void }>;

export interface Transport {
  send: Send;
  close(): Promise<void>;
}

export type TlsConfig = NonNullable<HttpSystemOfRecordConfig["tls"]>;

/** `ca`, `cert` and `key` as node:tls takes them: strings, or Buffers. */
export const pemText = (v: string | Uint8Array): string | Buffer => (typeof v === "string" ? v : Buffer.from(v));

/**
 * Requests through undici's `request` on an Agent of this system's own (its
 * keep-alive pool; with `tls`, its `connect` options). Not `fetch`: the
 * owner's CPU profile under load had undici's fetch (WHATWG streams, Request
 * and Response objects, abort plumbing) at a fifth of the owner's busy time,
 * for answers writ reads whole anyway. `request` follows no redirects and
 * neither decompresses nor asks for compression. Loaded on first use. The body is read chunk by chunk under the
 * process's answer budget: while it is spent the stream is not read (the socket is paused), and the wait runs under
 * the request's deadline.
 */
export function undiciTransport(
  tls: TlsConfig | undefined,
  maxResponseBytes: number,
  budget: ResponseBudget = sorResponseBudget,
  pool: { connections?: number } = {},
): Transport {
  // A request not connected by its deadline is given up (not sent) while undici keeps connecting (its connect
  // timeout, 10 s), and each retry opens another socket: `connections` bounds the sockets per origin.
  const connect = tls === undefined ? undefined : tlsConnectOptions(tls, pemText);
  type Undici = typeof import("undici");
  let loaded: Promise<{ undici: Undici; agent: import("undici").Dispatcher }> | undefined;
  let closing: Promise<void> | undefined;
  // Requests (by their signal) that undici has started to write: it calls onRequestStart on a connected socket just
  // before the first byte, so a request failing or out of time before then never left.
  const started = new WeakMap<AbortSignal, { sent: boolean }>();
  const marking = (dispatch: Dispatch): Dispatch => (opts, handler) => {
    // The request's options, signal included, as `request` was given them.
    const signal = (opts as { signal?: unknown }).signal;
    const at = signal instanceof AbortSignal ? started.get(signal) : undefined;
    if (at === undefined) return dispatch(opts, handler);
    return dispatch(opts, {
      onRequestStart(controller, context) {
        // Aborted already: undici aborts it here, unwritten.
        if (!(signal as AbortSignal).aborted) at.sent = true;
        handler.onRequestStart?.(controller, context);
      },
      onRequestUpgrade: (...a) => handler.onRequestUpgrade?.(...a),
      onResponseStart: (...a) => handler.onResponseStart?.(...a),
      onResponseData: (...a) => handler.onResponseData?.(...a),
      onResponseEnd: (...a) => handler.onResponseEnd?.(...a),
      onResponseError: (...a) => handler.onResponseError?.(...a),
    });
  };
  const options = { maxResponseSize: maxResponseBytes, ...(connect === undefined ? {} : { connect }), ...(pool.connections === undefined ? {} : { connections: pool.connections }) };
  const load = () => (loaded ??= import("undici").then((undici) => ({ undici, agent: new undici.Agent(options).compose(marking) })));
  return {
    async send(target, init) {
      let client: Awaited<ReturnType<typeof load>>;
      try {
        client = await load();
      } catch (err) {
        throw new LocalFailure(`the undici package could not be loaded: ${describe(err)}`, true, err);
      }
      const at = { sent: false };
      started.set(init.signal, at);
      // The agent's own request: origin and path as they are, where undici's top-level `request` parses a URL per call.
      const pending = client.agent.request({
        origin: target.origin,
        path: target.path,
        method: init.method as "GET",
        headers: init.headers,
        ...(init.body === undefined ? {} : { body: init.body }),
        signal: init.signal,
      });
      let res: Awaited<typeof pending>;
      try {
        // undici settles a request aborted while it waits for its connection only once the connect ends (its connect
        // timeout, 10 s): the deadline is kept here. The request then stays unwritten (undici's abort).
        res = await new Promise<Awaited<typeof pending>>((resolve, reject) => {
          const onAbort = () => {
            if (!at.sent) reject(init.signal.reason);
          };
          init.signal.addEventListener("abort", onAbort, { once: true });
          pending.then(resolve, reject).finally(() => init.signal.removeEventListener("abort", onAbort));
        });
      } catch (err) {
        if (at.sent) throw err;
        // undici refused to build the request (a header value or path it does not take): it refuses the same request
        // every time, so trying again is an outage for ever.
        if (REFUSED_REQUEST_CODES.has(errorCode(err) ?? "")) throw new LocalFailure(`not sent: the HTTP client refused the request: ${describe(err)}`, true, err, true);
        const why = init.signal.aborted ? `no connection within the deadline (${describe(init.signal.reason)})` : describe(err);
        throw new LocalFailure(`not sent: ${why}`, false, err);
      }
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
      const hold = budget.hold();
      return { answer, text: () => readBody(res.body, res.headers["content-length"], maxResponseBytes, hold, init.signal), release: () => hold.release() };
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

/**
 * The body as text (UTF-8, a BOM dropped, as undici's `text()`), its bytes taken from `hold` before they are kept:
 * a Content-Length is taken whole before the first read, anything beyond it (or without it) chunk by chunk. On a
 * failure the hold is released here; on success the caller releases it once done with the text.
 */
export async function readBody(
  body: AsyncIterable<Uint8Array> & { text?: () => Promise<string> },
  contentLength: string | string[] | undefined,
  maxBytes: number,
  hold: Hold,
  signal: AbortSignal,
): Promise<string> {
  try {
    const length = typeof contentLength === "string" && /^\d{1,15}$/.test(contentLength) ? Number(contentLength) : 0;
    const declared = Math.min(length, maxBytes);
    if (declared > 0) await hold.take(declared, signal);
    // The whole body is taken already: HTTP/1.1 framing reads no byte past a Content-Length, so the stream's own
    // reader (undici's, cheaper than iterating it: the owner's CPU per request rose with the iteration) keeps it.
    if (declared > 0 && length <= maxBytes && body.text) return await body.text();
    const chunks: Uint8Array[] = [];
    let received = 0;
    for await (const chunk of body) {
      received += chunk.byteLength;
      // Taken before the chunk is kept: while the budget is spent, the next chunk is not read.
      if (received > hold.bytes) await hold.take(received - hold.bytes, signal);
      chunks.push(chunk);
    }
    return new TextDecoder().decode(Buffer.concat(chunks, received));
  } catch (err) {
    hold.release();
    throw err;
  }
}

/** undici's codes for a request it will not make as given (InvalidArgumentError, NotSupportedError). */
const REFUSED_REQUEST_CODES = new Set(["UND_ERR_INVALID_ARG", "UND_ERR_NOT_SUPPORTED"]);

/**
 * A request that never left: the headers function failed or answered nonsense, undici refused the request or could
 * not be loaded. `unsendable` (permanent too): the request itself is at fault, not the system or this process.
 */
export class LocalFailure extends Error {
  readonly permanent: boolean;
  readonly unsendable: boolean;
  constructor(message: string, permanent: boolean, cause?: unknown, unsendable = false) {
    super(message, cause === undefined ? undefined : { cause });
    this.permanent = permanent || unsendable;
    this.unsendable = unsendable;
  }
}

const notSent = (err: LocalFailure): Exchange => ({ kind: "not_sent", message: err.message, cause: err.cause, permanent: err.permanent, unsendable: err.unsendable });

export function errorCode(err: unknown): string | undefined {
  return systemError(err)?.code;
}

/** The first error in the cause chain with a code, and the system call it names (`connect`, `read`, …) if any. */
export function systemError(err: unknown): { code: string; syscall: string | undefined } | undefined {
  let current: unknown = err;
  for (let depth = 0; depth < 8 && typeof current === "object" && current !== null; depth++) {
    const { code, syscall } = current as { code?: unknown; syscall?: unknown };
    if (typeof code === "string") return { code, syscall: typeof syscall === "string" ? syscall : undefined };
    current = (current as { cause?: unknown }).cause;
  }
  return undefined;
}

/** Whether a failed send, by its system error, is known not to have left this machine. */
export function neverSent(system: { code: string; syscall: string | undefined }): boolean {
  return NOT_SENT_CODES.has(system.code) || (NOT_SENT_WHEN_CONNECTING.has(system.code) && system.syscall === "connect");
}

export function describe(err: unknown): string {
  const code = errorCode(err);
  const cause = err instanceof Error && err.cause instanceof Error ? `: ${err.cause.message}` : "";
  const message = err instanceof Error ? `${err.message}${cause}` : String(err);
  return code === undefined ? message : `${code} (${message})`;
}

/** `promise`, or a rejection when `signal` aborts first. */
export function untilAborted<T>(promise: Promise<T>, signal: AbortSignal): Promise<T> {
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

export interface Request {
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
export async function exchange(send: Send, request: Request, timeoutMs: number, maxResponseBytes: number): Promise<Exchange> {
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
      if (err instanceof LocalFailure) return notSent(err);
      return { kind: "not_sent", message: `the headers function gave no answer within ${timeoutMs} ms`, cause: undefined, permanent: false, unsendable: false };
    }
    try {
      const sent = await send(request.target, { method: request.method, headers, ...(request.body === undefined ? {} : { body: request.body }), signal });
      return { kind: "answered", res: sent.answer, body: await sent.text(), secrets, release: sent.release ?? noRelease };
    } catch (err) {
      if (err instanceof LocalFailure) return notSent(err);
      if (signal.aborted) return { kind: "no_answer", message: `no answer within ${timeoutMs} ms`, cause: err };
      const system = systemError(err);
      if (system?.code === "UND_ERR_RES_EXCEEDED_MAX_SIZE") {
        return { kind: "no_answer", message: `the answer's body is over ${maxResponseBytes} bytes (maxResponseBytes); cut off`, cause: err, tooLarge: true };
      }
      // An answer, but one writ cannot read: asking again gets the same headers (a read retried as an outage for ever).
      if (system?.code === "UND_ERR_HEADERS_OVERFLOW") {
        return { kind: "no_answer", message: "the answer's headers are over Node's http.maxHeaderSize (16 KiB unless --max-http-header-size says otherwise); cut off", cause: err, tooLarge: true };
      }
      if (system !== undefined && neverSent(system)) return { kind: "not_sent", message: describe(err), cause: err, permanent: false, unsendable: false };
      return { kind: "no_answer", message: describe(err), cause: err };
    }
  } finally {
    clearTimeout(timer);
  }
}

const noRelease = (): void => {};

/** Statuses that say the system cannot take the request now (RFC 9110 §15.5.9, §15.6; RFC 6585 §4): an outage. */
export function isOutageStatus(status: number): boolean {
  return status >= 500 || status === 408 || status === 429;
}

/** `{ retryAfterMs }` when the answer's Retry-After gives a usable wait, else nothing (only the number goes on, never the header's text). */
export function retryAfter(ex: { res: Answer }): { retryAfterMs?: number } {
  const ms = parseRetryAfter(ex.res.headers.get("retry-after"), Date.now());
  return ms === undefined ? {} : { retryAfterMs: ms };
}
