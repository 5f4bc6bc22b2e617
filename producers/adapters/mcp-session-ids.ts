// Session ids of writ's MCP HTTP server, signed so that a session outlives the memory that held it.
//
// On streamable HTTP the session id is the run id of a tool call that names none (mcp-server.ts), and the run
// id is part of the intent key. A server that forgot a session (closed for being idle, or restarted: sessions
// live in memory) answered its next request 404; the client then opened a new session, a new run, and a retry
// of a call whose outcome it never saw (the restart cut it off) was a new intent that could write a second
// time. Signed ids let the server re-open a session it issued instead: same id, same run, the retry answered
// from the owner's ledger as a repeat.
//
// The key: HKDF of the bearer token when there is one (servers sharing a token, or one restarted with it,
// honour each other's sessions; a new token ends them all), else random per process (sessions outlive idle
// expiry, not a restart). Knowing the token is not a way in either: every request must carry it anyway.
import { createHmac, hkdfSync, randomBytes, timingSafeEqual } from "node:crypto";

const RANDOM_BYTES = 16;
const TAG_BYTES = 16;
/** base64url of 16 bytes, a dot, base64url of 16 bytes: visible ASCII, as the MCP transports spec requires of session ids. */
const SHAPE = /^[A-Za-z0-9_-]{22}\.[A-Za-z0-9_-]{22}$/;

export interface SessionIds {
  /** A new session id, signed. */
  issue(): string;
  /** Whether `id` is one this key issued (compared in constant time). */
  issued(id: string): boolean;
}

export function sessionIds(token: string | undefined): SessionIds {
  const key =
    token === undefined ? randomBytes(32) : Buffer.from(hkdfSync("sha256", Buffer.from(token, "utf8"), Buffer.alloc(0), Buffer.from("writ mcp session ids v1"), 32));
  const tag = (nonce: string): Buffer => createHmac("sha256", key).update(nonce).digest().subarray(0, TAG_BYTES);
  return {
    issue() {
      const nonce = randomBytes(RANDOM_BYTES).toString("base64url");
      return `${nonce}.${tag(nonce).toString("base64url")}`;
    },
    issued(id) {
      if (!SHAPE.test(id)) return false;
      const [nonce, given] = id.split(".") as [string, string];
      const expected = tag(nonce);
      const got = Buffer.from(given, "base64url");
      return got.length === expected.length && timingSafeEqual(got, expected);
    },
  };
}
