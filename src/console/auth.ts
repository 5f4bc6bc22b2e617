// Who may use `writ console`: a token to read (the page, its event stream and
// API), and a second one for the operator role, which may resolve
// escalations. Tokens are compared in constant time (sha256 of each side, then
// timingSafeEqual, both roles always checked) and never logged. Requests must
// name an allowed Host, and an Origin, when sent, of the same (DNS
// rebinding), as producers/adapters/mcp-server.ts checks them.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { WritError } from "../errors.ts";

export type Role = "reader" | "operator";

/** Shortest token accepted. */
export const MIN_TOKEN_LENGTH = 16;

const digest = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();

/** A config error unless `token` is long enough and fits an HTTP header (printable ASCII, no spaces). */
export function checkToken(name: string, token: string): void {
  if (token.length < MIN_TOKEN_LENGTH) {
    throw new WritError("config_invalid", `${name} must be at least ${MIN_TOKEN_LENGTH} characters (it is ${token.length})`, { retriable: false, context: { field: name } });
  }
  if (!/^[\x21-\x7e]+$/.test(token)) {
    throw new WritError("config_invalid", `${name} must be printable ASCII without spaces`, { retriable: false, context: { field: name } });
  }
}

export class ConsoleAuth {
  private readonly reader: Buffer;
  private readonly operator: Buffer | null;

  /**
   * A config error unless both tokens are acceptable and differ; the CLI calls it before it touches the network,
   * with `names` saying where each came from (its flag or variable).
   */
  static check(token: string, operatorToken?: string, names = { token: "the console token", operatorToken: "the operator token" }): void {
    checkToken(names.token, token);
    if (operatorToken !== undefined) {
      checkToken(names.operatorToken, operatorToken);
      if (operatorToken === token) {
        throw new WritError("config_invalid", `${names.operatorToken} must differ from the read-only token`, { retriable: false, context: { field: names.operatorToken } });
      }
    }
  }

  constructor(token: string, operatorToken?: string) {
    ConsoleAuth.check(token, operatorToken);
    this.reader = digest(token);
    this.operator = operatorToken === undefined ? null : digest(operatorToken);
  }

  get operatorEnabled(): boolean {
    return this.operator !== null;
  }

  /** The role a token gives, or null. Constant time in the token's content. */
  role(given: string | null | undefined): Role | null {
    if (typeof given !== "string" || given.length === 0 || given.length > 1024) return null;
    const g = digest(given);
    const isReader = timingSafeEqual(g, this.reader);
    const isOperator = this.operator !== null && timingSafeEqual(g, this.operator);
    return isOperator ? "operator" : isReader ? "reader" : null;
  }

  /** The token of a request: `Authorization: Bearer` only. A token in a URL would reach access logs, history and Referer. */
  static tokenOf(req: IncomingMessage): string | null {
    const m = /^Bearer (\S+)$/.exec(req.headers.authorization ?? "");
    return m ? m[1]! : null;
  }
}

/**
 * Tickets for the event stream. `EventSource` sends no header, so the page asks for a ticket with its token
 * (`POST /api/stream-ticket`, `Authorization: Bearer`) and opens `/events?ticket=…`: what lands in a proxy's
 * access log is a random string that worked once, within seconds, and never again. A ticket carries the role of
 * the token that asked for it. Kept by their sha256 (a lookup's timing says nothing of a live ticket), at most
 * `max` outstanding: past it, with the expired swept, a request is refused (the caller answers 429) rather than
 * another page's ticket evicted.
 */
export class StreamTickets {
  private readonly live = new Map<string, { role: Role; expires: number }>();
  private readonly ttlMs: number;
  private readonly max: number;
  private readonly now: () => number;

  constructor(opts: { ttlMs?: number; max?: number; now?: () => number } = {}) {
    this.ttlMs = opts.ttlMs ?? 30_000;
    this.max = opts.max ?? 1000;
    // monotonic: a step of the wall clock neither stretches nor cuts a ticket's 30 s
    this.now = opts.now ?? (() => performance.now());
  }

  get lifetimeMs(): number {
    return this.ttlMs;
  }

  /** A new ticket for `role`, or null when `max` are outstanding. */
  issue(role: Role): string | null {
    if (this.live.size >= this.max) this.sweep();
    if (this.live.size >= this.max) return null;
    const ticket = randomBytes(32).toString("base64url");
    this.live.set(digest(ticket).toString("hex"), { role, expires: this.now() + this.ttlMs });
    return ticket;
  }

  /** The role a ticket gives, once: an unknown, used or expired ticket gives null. */
  redeem(ticket: string | null): Role | null {
    if (ticket === null || ticket.length === 0 || ticket.length > 128) return null;
    const key = digest(ticket).toString("hex");
    const found = this.live.get(key);
    this.live.delete(key);
    return found !== undefined && found.expires > this.now() ? found.role : null;
  }

  private sweep(): void {
    const now = this.now();
    for (const [key, t] of this.live) if (t.expires <= now) this.live.delete(key);
  }
}

/** Host headers a server bound to `host`:`port` answers, plus the ones named (`name` or `name:port`). */
export function allowedHostsFor(host: string, port: number, extra: readonly string[] = []): Set<string> {
  const out = new Set<string>();
  const bare = host.replace(/^\[|\]$/g, "");
  const loopback = ["127.0.0.1", "localhost", "::1"].includes(bare);
  const any = bare === "0.0.0.0" || bare === "::";
  if (loopback || any) for (const h of ["127.0.0.1", "localhost", "[::1]"]) out.add(`${h}:${port}`);
  if (!loopback && !any) out.add(`${bare.includes(":") ? `[${bare}]` : bare}:${port}`.toLowerCase());
  for (const raw of extra) {
    const h = raw.toLowerCase();
    out.add(h);
    // a name without a port: also as the server's own port (a proxy in front may leave the port out)
    if (!/:\d+$/.test(h)) out.add(`${h}:${port}`);
  }
  return out;
}

/** Null when the request's Host (and Origin, when sent) are allowed; else why not. */
export function refusedOrigin(req: IncomingMessage, allowed: ReadonlySet<string>): string | null {
  const host = (req.headers.host ?? "").toLowerCase();
  if (!allowed.has(host)) return "host not allowed";
  const origin = req.headers.origin;
  if (origin === undefined) return null;
  const m = /^https?:\/\/([^/]+)$/.exec(origin.toLowerCase());
  if (!m || !allowed.has(m[1]!)) return "origin not allowed";
  return null;
}
