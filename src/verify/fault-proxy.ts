import { createServer, request as httpRequest } from "node:http";
import type { IncomingHttpHeaders, IncomingMessage, OutgoingHttpHeaders, ServerResponse } from "node:http";
import { request as httpsRequest } from "node:https";
import type { AddressInfo } from "node:net";
import { WritError } from "../errors.ts";

/**
 * A reverse proxy in front of an HTTP system of record that `writ verify`
 * uses to inject faults a staging system has no knobs for. It forwards every
 * request unchanged and, when armed, lets the next matching request reach the
 * upstream and commit there, then withholds or drops the answer: the
 * "timeout after the downstream committed" that turns a retry into a
 * duplicate refund.
 */

/** Which requests an armed fault applies to. Every given field must match. */
export interface FaultMatch {
  /** Default `PATCH`. */
  method?: string;
  /** The request path (without query), exactly as the client sent it. */
  path?: string;
  /** The `Idempotency-Key` header; writ sends the intent key there. */
  idempotencyKey?: string;
}

export type ProxyFaultKind =
  /** Answer nothing until the client gives up (its deadline closes the connection), or `maxHoldMs` passes. */
  | "commit-then-timeout"
  /** Destroy the client's connection without answering. */
  | "commit-then-drop";

export interface ProxyFault {
  kind: ProxyFaultKind;
  match?: FaultMatch;
  /** How many matching committed requests it applies to. Default 1. */
  times?: number;
  /** `commit-then-timeout` only: answer anyway after this long, if the client is still waiting. ms. Default 120 000. */
  maxHoldMs?: number;
}

/** One request that passed through the proxy. */
export interface ProxiedRequest {
  method: string;
  path: string;
  idempotencyKey: string | null;
  /** Its If-Match: a retry of one write after a fresh read carries the same Idempotency-Key with another. */
  ifMatch: string | null;
  /** The upstream's status, or null when the upstream could not be reached. */
  upstreamStatus: number | null;
  /** The upstream answer's ETag: a write that committed twice answers two; a replay of a stored answer, the same one. */
  etag: string | null;
  /** The fault that was applied to the answer, if any. */
  fault: ProxyFaultKind | null;
  /** For a held answer: how it ended. */
  held?: "client-gave-up" | "answered-late";
}

export interface FaultProxyOptions {
  /** The system of record, e.g. `https://crm.staging.example.com`. Only its origin is used: paths are forwarded as they come. */
  upstream: string;
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0: an ephemeral port. */
  port?: number;
  /**
   * A request the upstream could not be reached for (no connection made: refused, no such host, unroutable, timed
   * out; answered 502): `writ verify` records it as the system's outage. A connection the upstream took and then
   * dropped is answered 502 too, but not said here: the request itself may be why (a malformed one, say).
   */
  onUnreachable?: (request: { method: string; path: string }, message: string) => void;
}

export interface FaultProxy {
  /** e.g. `http://127.0.0.1:41234`, no trailing slash. A system's base URL `https://crm/api` becomes `${url}/api`. */
  readonly url: string;
  readonly upstream: string;
  /** Arms a fault; it fires on the next matching request the upstream answered with a 2xx (committed). */
  arm(fault: ProxyFault): void;
  /** Faults still armed, with the times left. */
  pending(): Required<Pick<ProxyFault, "kind" | "times">>[];
  /** Drops every armed fault. */
  disarm(): void;
  /** Every request so far, oldest first. */
  requests(): ProxiedRequest[];
  /** Requests that carried this Idempotency-Key, optionally of one method. */
  countByIdempotencyKey(key: string, method?: string): number;
  /** Requests per `"<METHOD> <path>"`. */
  countsByRoute(): Record<string, number>;
  /** Stops listening and drops open connections (also held ones). */
  close(): Promise<void>;
}

/** Hop-by-hop headers (RFC 9110 §7.6.1) are not forwarded; bodies are buffered, so lengths are recomputed. */
const HOP_BY_HOP = new Set([
  "connection",
  "keep-alive",
  "proxy-connection",
  "proxy-authenticate",
  "proxy-authorization",
  "te",
  "trailer",
  "transfer-encoding",
  "upgrade",
  "content-length",
]);

function forwardable(headers: IncomingHttpHeaders): OutgoingHttpHeaders {
  const out: OutgoingHttpHeaders = {};
  for (const [k, v] of Object.entries(headers)) if (v !== undefined && !HOP_BY_HOP.has(k)) out[k] = v;
  return out;
}

function readAll(stream: IncomingMessage): Promise<Buffer> {
  return new Promise((resolve, reject) => {
    const chunks: Buffer[] = [];
    stream.on("data", (c: Buffer) => chunks.push(c));
    stream.on("end", () => resolve(Buffer.concat(chunks)));
    stream.on("error", reject);
  });
}

/** An upstream no connection could be made to (the error as it came, before any byte was sent). */
class Unreached extends Error {
  constructor(cause: Error) {
    super(cause.message, { cause });
  }
}

interface Armed {
  kind: ProxyFaultKind;
  match: FaultMatch;
  times: number;
  maxHoldMs: number;
}

/**
 * Starts a fault-injecting reverse proxy.
 *
 * @example
 * const proxy = await startFaultProxy({ upstream: "https://crm.staging.example.com" });
 * proxy.arm({ kind: "commit-then-timeout", match: { idempotencyKey: intentKey } });
 * // point the system of record at proxy.url, submit, then:
 * proxy.countByIdempotencyKey(intentKey, "PATCH"); // 1
 * await proxy.close();
 *
 * @throws WritError `config_invalid` when `upstream` is not an http(s) URL.
 */
export async function startFaultProxy(opts: FaultProxyOptions): Promise<FaultProxy> {
  let upstream: URL;
  try {
    upstream = new URL(opts.upstream);
    if (upstream.protocol !== "http:" && upstream.protocol !== "https:") throw new Error("not http(s)");
  } catch {
    throw new WritError("config_invalid", `fault proxy: upstream must be an http(s) URL, got ${JSON.stringify(opts.upstream)}`, {
      retriable: false,
      context: { field: "upstream" },
    });
  }
  const send = upstream.protocol === "https:" ? httpsRequest : httpRequest;
  let armed: Armed[] = [];
  const log: ProxiedRequest[] = [];
  const timers = new Set<NodeJS.Timeout>();

  function take(method: string, path: string, key: string | null): Armed | undefined {
    const index = armed.findIndex(
      (f) =>
        (f.match.method ?? "PATCH").toUpperCase() === method &&
        (f.match.path === undefined || f.match.path === path) &&
        (f.match.idempotencyKey === undefined || f.match.idempotencyKey === key),
    );
    const fault = armed[index];
    if (fault === undefined) return undefined;
    armed = fault.times > 1 ? armed.with(index, { ...fault, times: fault.times - 1 }) : armed.toSpliced(index, 1);
    return fault;
  }

  function forward(req: IncomingMessage, body: Buffer): Promise<{ status: number; headers: OutgoingHttpHeaders; body: Buffer }> {
    return new Promise((resolve, reject) => {
      const headers = forwardable(req.headers);
      headers.host = upstream.host;
      if (body.length > 0) headers["content-length"] = body.length;
      // A connection of its own for each request (agent: false): a kept-alive one the upstream closed as idle just as
      // a request went out on it fails that request, which would read as the system going away.
      const out = send(
        { protocol: upstream.protocol, hostname: upstream.hostname, port: upstream.port, method: req.method, path: req.url, headers, agent: false },
        (res) => {
          readAll(res).then((b) => resolve({ status: res.statusCode ?? 502, headers: forwardable(res.headers), body: b }), reject);
        },
      );
      let connected = false;
      out.on("socket", (socket) => {
        if (socket.connecting) socket.once("connect", () => void (connected = true));
        else connected = true;
      });
      out.on("error", (err) => reject(connected ? err : new Unreached(err)));
      out.end(body);
    });
  }

  async function handle(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const method = (req.method ?? "GET").toUpperCase();
    const path = (req.url ?? "/").split("?")[0] ?? "/";
    const keyHeader = req.headers["idempotency-key"];
    const key = typeof keyHeader === "string" ? keyHeader : null;
    const ifMatch = req.headers["if-match"];
    const entry: ProxiedRequest = { method, path, idempotencyKey: key, ifMatch: typeof ifMatch === "string" ? ifMatch : null, upstreamStatus: null, etag: null, fault: null };
    log.push(entry);
    const body = await readAll(req);
    let answer: Awaited<ReturnType<typeof forward>>;
    try {
      answer = await forward(req, body);
    } catch (err) {
      const detail = err instanceof Error ? err.message : String(err);
      if (err instanceof Unreached) opts.onUnreachable?.({ method, path }, detail);
      res.writeHead(502, { "content-type": "application/problem+json" });
      res.end(JSON.stringify({ title: "upstream unreachable", status: 502, detail }));
      return;
    }
    entry.upstreamStatus = answer.status;
    entry.etag = typeof answer.headers.etag === "string" ? answer.headers.etag : null;
    const deliver = () => {
      if (res.destroyed) return;
      res.writeHead(answer.status, { ...answer.headers, "content-length": answer.body.length });
      res.end(answer.body);
    };
    // A fault fires only on a committed write: a 412 or 5xx left nothing to duplicate, so it stays armed.
    const fault = answer.status >= 200 && answer.status < 300 ? take(method, path, key) : undefined;
    if (fault === undefined) return deliver();
    entry.fault = fault.kind;
    if (fault.kind === "commit-then-drop") {
      req.socket.destroy();
      return;
    }
    // The client's own deadline ends the wait: no delay to tune against its timeout.
    const timer = setTimeout(() => {
      timers.delete(timer);
      entry.held = "answered-late";
      deliver();
    }, fault.maxHoldMs);
    timers.add(timer);
    res.on("close", () => {
      if (entry.held !== undefined) return;
      entry.held = "client-gave-up";
      clearTimeout(timer);
      timers.delete(timer);
    });
  }

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (res.headersSent || res.destroyed) return;
      res.writeHead(500, { "content-type": "text/plain" });
      res.end(`fault proxy: ${err instanceof Error ? err.message : String(err)}`);
    });
  });
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port ?? 0, opts.host ?? "127.0.0.1", () => {
      server.off("error", reject);
      resolve();
    });
  });
  const { port } = server.address() as AddressInfo;
  const host = (opts.host ?? "127.0.0.1").includes(":") ? `[${opts.host}]` : (opts.host ?? "127.0.0.1");

  return {
    url: `http://${host}:${port}`,
    upstream: upstream.origin,
    arm(fault) {
      const times = fault.times ?? 1;
      if (!Number.isInteger(times) || times < 1) {
        throw new WritError("config_invalid", "fault proxy: times must be a positive integer", { retriable: false, context: { field: "times" } });
      }
      armed = [...armed, { kind: fault.kind, match: { ...fault.match }, times, maxHoldMs: fault.maxHoldMs ?? 120_000 }];
    },
    pending: () => armed.map(({ kind, times }) => ({ kind, times })),
    disarm: () => {
      armed = [];
    },
    requests: () => log.map((r) => ({ ...r })),
    countByIdempotencyKey: (k, m) => log.filter((r) => r.idempotencyKey === k && (m === undefined || r.method === m.toUpperCase())).length,
    countsByRoute: () => {
      const counts: Record<string, number> = {};
      for (const r of log) counts[`${r.method} ${r.path}`] = (counts[`${r.method} ${r.path}`] ?? 0) + 1;
      return counts;
    },
    close: async () => {
      for (const t of timers) clearTimeout(t);
      timers.clear();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
    },
  };
}
