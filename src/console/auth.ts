// Who may use `writ console`: a token to read (the page, its event stream and
// API), and a second one for the operator role, which may resolve
// escalations. Tokens are compared in constant time (sha256 of each side, then
// timingSafeEqual, both roles always checked) and never logged. Requests must
// name an allowed Host, and an Origin, when sent, of the same (DNS
// rebinding), as producers/adapters/mcp-server.ts checks them.
import { createHash, timingSafeEqual } from "node:crypto";
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

  constructor(token: string, operatorToken?: string) {
    checkToken("the console token", token);
    if (operatorToken !== undefined) {
      checkToken("the operator token", operatorToken);
      if (operatorToken === token) throw new WritError("config_invalid", "the operator token must differ from the read-only token", { retriable: false, context: { field: "operatorToken" } });
    }
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

  /** The token of a request: `Authorization: Bearer`, else (where `query` is allowed) `?token=`. */
  static tokenOf(req: IncomingMessage, url: URL, allowQuery: boolean): string | null {
    const m = /^Bearer (\S+)$/.exec(req.headers.authorization ?? "");
    if (m) return m[1]!;
    return allowQuery ? url.searchParams.get("token") : null;
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
