import type { Server } from "node:http";
import { createServer as createNetServer, type Socket } from "node:net";
import { WritError } from "./errors.ts";
import { printable } from "./printable.ts";

/**
 * How long a connection may hold one of a server's slots without doing its part, and how many slots one
 * remote address may hold. Node's own defaults (Node 24, measured) let a client that opens `maxConnections`
 * sockets and sends nothing, or dribbles its headers, hold every slot for 60 to 90 s at a time
 * (`headersTimeout` 60 s, checked every 30 s), and a request body 300 s (`requestTimeout`), and open them
 * again as soon as they close: the console, `/metrics` or the MCP server then refuse everyone else.
 */
export interface ConnectionLimits {
  /** Open connections at most; past it Node closes a new connection at once. */
  maxConnections: number;
  /** Open connections from one remote address at most (past it a new one is closed at once); default: no cap of its own. */
  maxConnectionsPerAddress?: number | undefined;
  /** ms from a connection's opening (or, on a keep-alive connection, its next request's first byte) to that request's complete headers; then it is closed (408). */
  headersTimeoutMs?: number;
  /** ms from a connection's opening (or, on a keep-alive connection, its next request's first byte) to the complete request, body included; then it is closed (408). A handler should read a body before it awaits anything slow. */
  requestTimeoutMs?: number;
  /** ms an idle keep-alive connection is kept after a response. */
  keepAliveTimeoutMs?: number;
}

/** Defaults of {@link ConnectionLimits}' timeouts: a browser, curl or Prometheus sends a request's headers in milliseconds. */
export const DEFAULT_HEADERS_TIMEOUT_MS = 10_000;
export const DEFAULT_REQUEST_TIMEOUT_MS = 30_000;
export const DEFAULT_KEEP_ALIVE_TIMEOUT_MS = 5_000;

/** The limits as validated, defaults filled in. */
export type ResolvedConnectionLimits = Required<Omit<ConnectionLimits, "maxConnectionsPerAddress">> & { maxConnectionsPerAddress: number | undefined };

const MAX_TIMEOUT_MS = 3_600_000;

/**
 * The limits checked, defaults filled in: a bad one is a config_invalid error naming its field (as the
 * caller names it: `names` maps a field to its option, flag or variable).
 */
export function connectionLimits(limits: ConnectionLimits, names: Partial<Record<keyof ConnectionLimits, string>> = {}): ResolvedConnectionLimits {
  const check = (field: keyof ConnectionLimits, value: number, min: number, max: number): number => {
    if (!Number.isSafeInteger(value) || value < min || value > max) {
      const name = names[field] ?? field;
      throw new WritError("config_invalid", `${name} must be a whole number from ${min} to ${max} (it is ${value})`, { retriable: false, context: { field: name } });
    }
    return value;
  };
  const maxConnections = check("maxConnections", limits.maxConnections, 1, 1_000_000);
  const perAddress = limits.maxConnectionsPerAddress === undefined ? undefined : check("maxConnectionsPerAddress", limits.maxConnectionsPerAddress, 1, maxConnections);
  const headersTimeoutMs = check("headersTimeoutMs", limits.headersTimeoutMs ?? DEFAULT_HEADERS_TIMEOUT_MS, 1, MAX_TIMEOUT_MS);
  // Node refuses a request timeout shorter than the headers': the headers are part of the request.
  const requestTimeoutMs = check("requestTimeoutMs", limits.requestTimeoutMs ?? Math.max(DEFAULT_REQUEST_TIMEOUT_MS, headersTimeoutMs), headersTimeoutMs, MAX_TIMEOUT_MS);
  const keepAliveTimeoutMs = check("keepAliveTimeoutMs", limits.keepAliveTimeoutMs ?? DEFAULT_KEEP_ALIVE_TIMEOUT_MS, 1, MAX_TIMEOUT_MS);
  return { maxConnections, maxConnectionsPerAddress: perAddress, headersTimeoutMs, requestTimeoutMs, keepAliveTimeoutMs };
}

/**
 * Applies `limits` to `server` (before it listens). Node checks the headers and request timeouts of open
 * connections every `connectionsCheckingInterval` (30 s by default, which would let a connection hold its slot
 * up to 30 s past its timeout); here a tenth of the headers timeout, between 10 ms and 1 s. The idle time
 * between requests on a keep-alive connection is `keepAliveTimeout`'s; a response in progress (an event
 * stream) is bounded by neither: a server keeps its streams few and sends them heartbeats.
 */
export function applyConnectionLimits(server: Server, limits: ConnectionLimits): ResolvedConnectionLimits {
  const l = connectionLimits(limits);
  server.maxConnections = l.maxConnections;
  server.headersTimeout = l.headersTimeoutMs;
  server.requestTimeout = l.requestTimeoutMs;
  server.keepAliveTimeout = l.keepAliveTimeoutMs;
  // Read by Node when the server starts listening.
  (server as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval = Math.max(10, Math.min(1000, Math.floor(l.headersTimeoutMs / 10)));
  if (l.maxConnectionsPerAddress !== undefined) capPerAddress(server, l.maxConnectionsPerAddress);
  return l;
}

/** Closes at once a new connection from an address that already holds `cap` open ones. */
function capPerAddress(server: Server, cap: number): void {
  const open = new Map<string, number>();
  // Before the HTTP server's own listener: a refused socket is destroyed before the server reads anything from it.
  server.prependListener("connection", (socket: Socket) => {
    const address = socket.remoteAddress ?? "";
    const n = open.get(address) ?? 0;
    if (n >= cap) {
      socket.destroy();
      return;
    }
    open.set(address, n + 1);
    socket.once("close", () => {
      const left = (open.get(address) ?? 1) - 1;
      if (left <= 0) open.delete(address);
      else open.set(address, left);
    });
  });
}

/**
 * Listens on `host:port` and keeps the server alive afterwards. Once listening, a server's "error"
 * events come from accepting connections (EMFILE, ENFILE when file descriptors run out); with no
 * listener Node throws them and the process dies, so a client that opens sockets until the limit
 * could stop an owner or a console. They are logged instead, and the server goes on accepting when
 * descriptors are free again. The connections are bounded by `limits` ({@link applyConnectionLimits}).
 */
export async function listen(server: Server, opts: ConnectionLimits & { port: number; host: string; log: { error(obj: object, msg: string): void }; what: string }): Promise<ResolvedConnectionLimits> {
  const { port, host, log, what, ...limits } = opts;
  const applied = applyConnectionLimits(server, limits);
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(port, host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  server.on("error", (err) => log.error({ err }, `${what}: a connection could not be accepted`));
  return applied;
}

/**
 * Listens on `host:port` and lets go at once, so that a process whose address cannot be had (a port in use, a host
 * that is not an address of this machine) fails at its start with the listen error, before it connects anywhere.
 */
export async function probeListen(host: string, port: number): Promise<void> {
  const probe = createNetServer();
  await new Promise<void>((resolve, reject) => {
    probe.once("error", reject);
    probe.listen(port, host, () => resolve());
  });
  await new Promise<void>((resolve) => probe.close(() => resolve()));
}

/** A listen error's code (EADDRINUSE, ENOTFOUND …), if it has one. */
function listenCode(err: unknown): string | undefined {
  const code = typeof err === "object" && err !== null ? (err as { code?: unknown }).code : undefined;
  return typeof code === "string" ? code : undefined;
}

/** Whether a listen error is the port's (in use, or not this process's to bind) rather than the host's. */
function portsFault(err: unknown): boolean {
  const code = listenCode(err);
  return code === "EADDRINUSE" || code === "EACCES";
}

/**
 * Why `what` cannot listen on `host:port`, and which of the two settings the operator must change: a port another
 * process holds (or one this process may not bind) is the port's, anything else (a name that does not resolve, an
 * address of another machine) the host's. Each caller puts its own name for that setting (a flag, a variable) in
 * front of `reason`.
 */
export function listenFault(what: string, host: string, port: number, err: unknown): { setting: "host" | "port"; reason: string } {
  const code = listenCode(err);
  const why = code === "EADDRINUSE" ? "the port is in use" : code === "EACCES" ? "this process may not bind the port" : "the host is not an address of this machine";
  return { setting: portsFault(err) ? "port" : "host", reason: `${what} cannot listen on ${printable(host)}:${port}: ${why} (${code ?? "listen failed"})` };
}
