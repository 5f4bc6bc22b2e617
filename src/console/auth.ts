// Who may use `writ console`: a token to read (the page, its event stream and
// API), and a second one for the operator role, which may resolve
// escalations. Tokens are compared in constant time (sha256 of each side, then
// timingSafeEqual, both roles always checked) and never logged. Requests must
// name an allowed Host, and an Origin, when sent, of the same (DNS
// rebinding), as producers/adapters/mcp-server.ts checks them.
import { createHash, randomBytes, timingSafeEqual } from "node:crypto";
import type { IncomingMessage } from "node:http";
import { isIPv6 } from "node:net";
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

/** A host name or IPv4 address as a Host header carries it: dot-separated labels (letters, digits, `-`, `_`). */
const HOST_NAME = /^(?=.{1,253}$)[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?(?:\.[a-z0-9_](?:[a-z0-9_-]{0,61}[a-z0-9_])?)*$/i;

/**
 * Why `entry` cannot be a Host the console is reached by, or null when it can: `name[:port]` or `[IPv6][:port]`, as
 * a Host header carries it. Anything else never matches a request (a URL, an IPv6 address without brackets: every
 * request refused), or, empty, matches one sent without a Host header.
 */
export function allowedHostFault(entry: string): string | null {
  if (entry === "") return "empty: a request without a Host header would be let through";
  if (/^[a-z][a-z0-9+.-]*:\/\//i.test(entry)) return "a Host name, not a URL: no scheme and no path (e.g. console.example.com or console.example.com:8443)";
  if (isIPv6(entry)) return `an IPv6 address goes in brackets, as a Host header carries it: [${entry}]`;
  const m = /^(\[[^\]]*\]|[^:[\]]+)(?::([1-9][0-9]{0,4}))?$/.exec(entry);
  if (m === null || Number(m[2] ?? 1) > 65535 || !(m[1]!.startsWith("[") ? isIPv6(m[1]!.slice(1, -1)) : HOST_NAME.test(m[1]!))) {
    return "not name[:port] or [IPv6 address][:port] (a port from 1 to 65535), as a Host header carries it";
  }
  // Browsers send the host as a URL's parser writes it (lower case, IPv6 compressed, an IPv4 address in dotted
  // decimal): any other spelling of it never matches a request.
  const name = m[1]!;
  const port = m[2] === undefined ? "" : `:${m[2]}`;
  let canonical: string;
  try {
    canonical = new URL(`http://${name}`).hostname;
  } catch {
    if (name.includes("%")) return `a zone id (${name.slice(name.indexOf("%"), -1)}) is never in a Host header: give the address without it`;
    return "not a host a browser sends (it is no URL's host)";
  }
  if (canonical !== name.toLowerCase()) return `browsers send this host as ${canonical}, so it would never match: give ${canonical}${port}`;
  return null;
}

/** The first entry of `entries` that cannot be an allowed Host, with why (allowedHostFault); null when none. */
export function badAllowedHost(entries: readonly string[]): { entry: string; fault: string } | null {
  for (const entry of entries) {
    const fault = allowedHostFault(entry);
    if (fault !== null) return { entry, fault };
  }
  return null;
}

/**
 * Host headers a server bound to `host`:`port` answers, plus the ones named (`name` or `name:port`, checked by
 * allowedHostFault). Browsers leave the default port out of Host and Origin: on port 80 (the console serves no TLS,
 * so no 443) the bare name is allowed too.
 */
export function allowedHostsFor(host: string, port: number, extra: readonly string[] = []): Set<string> {
  const out = new Set<string>();
  const add = (name: string, p: number) => {
    out.add(`${name}:${p}`);
    if (p === 80) out.add(name);
  };
  const bare = host.replace(/^\[|\]$/g, "");
  const loopback = ["127.0.0.1", "localhost", "::1"].includes(bare);
  const any = bare === "0.0.0.0" || bare === "::";
  if (loopback || any) for (const h of ["127.0.0.1", "localhost", "[::1]"]) add(h, port);
  if (!loopback && !any) add((bare.includes(":") ? `[${bare}]` : bare).toLowerCase(), port);
  for (const raw of extra) {
    const h = raw.toLowerCase();
    const named = /^(.+):(\d+)$/.exec(h);
    if (named) add(named[1]!, Number(named[2]));
    else {
      // a name without a port: also as the server's own port (a proxy in front may leave the port out)
      out.add(h);
      add(h, port);
    }
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
