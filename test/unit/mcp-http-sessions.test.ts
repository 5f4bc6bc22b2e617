// The MCP streamable HTTP server without a broker (no tools, so no client is used): the session cap,
// idle expiry, and the bearer token compared as digests whatever its length.
import * as crypto from "node:crypto";
import { Agent, fetch } from "undici";
import { afterEach, describe, expect, it, onTestFinished, vi } from "vitest";
import { mcpMaxConnections, startWritMcpHttpServer, type WritMcpHttp, type WritMcpHttpOptions } from "../../producers/adapters/mcp-server.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { createLogger } from "../../src/logger.ts";
import { openSocket, silentSockets, whileAllOpen } from "../helpers/sockets.ts";
import { waitFor } from "../helpers/wait-for.ts";

// A spy that still compares: shows the token check reaches timingSafeEqual for any length.
vi.mock("node:crypto", async (importOriginal) => {
  const actual = await importOriginal<typeof import("node:crypto")>();
  return { ...actual, timingSafeEqual: vi.fn(actual.timingSafeEqual) };
});

const servers: WritMcpHttp[] = [];
afterEach(async () => {
  await Promise.all(servers.splice(0).map((s) => s.close()));
  vi.mocked(crypto.timingSafeEqual).mockClear();
});

async function start(opts: Partial<WritMcpHttpOptions> = {}): Promise<WritMcpHttp> {
  const mcp = await startWritMcpHttpServer({
    client: {} as WritClient,
    tools: [],
    read: async () => {
      throw new Error("no reads in these tests");
    },
    logger: createLogger({ level: "silent" }),
    ...opts,
  });
  servers.push(mcp);
  return mcp;
}

const HEADERS = { "content-type": "application/json", accept: "application/json, text/event-stream" };

/** POSTs an initialize; the body is read to the end so the exchange is over. */
async function initialize(mcp: WritMcpHttp, headers: Record<string, string> = {}) {
  const res = await fetch(mcp.url, {
    method: "POST",
    headers: { ...HEADERS, ...headers },
    body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-03-26", capabilities: {}, clientInfo: { name: "t", version: "1" } } }),
  });
  const body = await res.text();
  return { status: res.status, session: res.headers.get("mcp-session-id"), retryAfter: res.headers.get("retry-after"), body };
}

async function ping(mcp: WritMcpHttp, session: string): Promise<number> {
  const res = await fetch(mcp.url, {
    method: "POST",
    headers: { ...HEADERS, "mcp-session-id": session, "mcp-protocol-version": "2025-03-26" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" }),
  });
  await res.text();
  return res.status;
}

/** A ping in `session`: the status, and the session id the answer carries (the SDK's transport echoes it). */
async function pingWithSession(mcp: WritMcpHttp, session: string, headers: Record<string, string> = {}): Promise<{ status: number; session: string | null }> {
  // A connection of its own: after a restart on the same port, a kept-alive one to the old server would be dead.
  const dispatcher = new Agent({ pipelining: 0 });
  onTestFinished(() => dispatcher.close());
  const res = await fetch(mcp.url, {
    dispatcher,
    method: "POST",
    headers: { ...HEADERS, ...headers, "mcp-session-id": session, "mcp-protocol-version": "2025-03-26" },
    body: JSON.stringify({ jsonrpc: "2.0", id: 2, method: "ping" }),
  });
  await res.text();
  return { status: res.status, session: res.headers.get("mcp-session-id") };
}

describe("MCP HTTP sessions", () => {
  it("session-cap: past maxSessions an initialize is refused 503 (session_limit) and opens nothing; a closed session frees its slot", async () => {
    const mcp = await start({ maxSessions: 2 });
    const a = await initialize(mcp);
    const b = await initialize(mcp);
    expect([a.status, b.status]).toEqual([200, 200]);

    const refused = await initialize(mcp);
    expect(refused.status).toBe(503);
    expect(refused.retryAfter).not.toBeNull();
    expect(JSON.parse(refused.body)).toMatchObject({ jsonrpc: "2.0", error: { code: -32000, message: "too many MCP sessions", data: { reason: "session_limit", maxSessions: 2 } } });
    expect(mcp.sessions()).toBe(2);
    // the sessions already open are still served
    expect(await ping(mcp, a.session!)).toBe(200);

    const del = await fetch(mcp.url, { method: "DELETE", headers: { "mcp-session-id": b.session!, "mcp-protocol-version": "2025-03-26" } });
    await del.text();
    expect(del.status).toBe(200);
    await waitFor(() => mcp.sessions() === 1, { timeoutMs: 5_000, intervalMs: 10 });
    expect((await initialize(mcp)).status).toBe(200);
    expect(mcp.sessions()).toBe(2);
  });

  it("session-cap: concurrent initializes do not overshoot the cap", async () => {
    const mcp = await start({ maxSessions: 3 });
    const results = await Promise.all(Array.from({ length: 8 }, () => initialize(mcp)));
    expect(results.filter((r) => r.status === 200)).toHaveLength(3);
    expect(results.filter((r) => r.status === 503)).toHaveLength(5);
    expect(mcp.sessions()).toBe(3);
  });

  it("session-idle-expiry: a session with no request for sessionIdleMs is let go, and its next request re-opens it under the same id", async () => {
    const mcp = await start({ sessionIdleMs: 200 });
    const a = await initialize(mcp);
    expect(a.status).toBe(200);
    expect(mcp.sessions()).toBe(1);

    await waitFor(() => mcp.sessions() === 0, { timeoutMs: 5_000, intervalMs: 20, message: () => `${mcp.sessions()} sessions open` });
    // Its id is its run: served again, in that session, not a new one (a 404 would make its client start a new run).
    const again = await pingWithSession(mcp, a.session!);
    expect(again).toEqual({ status: 200, session: a.session });
    expect(mcp.sessions()).toBe(1);
    // a new one can be opened
    expect((await initialize(mcp)).status).toBe(200);
  });

  it("session-ids: only ids this server issued are re-opened; a session its client ended (DELETE) answers 404", async () => {
    const mcp = await start();
    const a = await initialize(mcp);
    const [nonce, tag] = a.session!.split(".") as [string, string];
    const flipped = `${nonce}.${tag[0] === "A" ? "B" : "A"}${tag.slice(1)}`;
    for (const forged of [crypto.randomUUID(), flipped, `${nonce}.`, "x".repeat(45), `${a.session}x`]) {
      expect(await ping(mcp, forged), forged).toBe(404);
    }
    expect(mcp.sessions()).toBe(1);
    const del = await fetch(mcp.url, { method: "DELETE", headers: { "mcp-session-id": a.session!, "mcp-protocol-version": "2025-03-26" } });
    await del.text();
    expect(del.status).toBe(200);
    await waitFor(() => mcp.sessions() === 0, { timeoutMs: 5_000, intervalMs: 10 });
    expect(await ping(mcp, a.session!)).toBe(404);
    expect(mcp.sessions()).toBe(0);
  });

  it("session-restart: a server restarted with the same token serves the sessions its predecessor issued; another token, or none, does not", async () => {
    const token = "t0ken-for-the-restart-test-0123456789";
    const auth = { authorization: `Bearer ${token}` };
    const before = await start({ token });
    const a = await initialize(before, auth);
    const port = Number(new URL(before.url).port);
    await before.close();

    const after = await start({ token, port });
    expect(await pingWithSession(after, a.session!, auth)).toEqual({ status: 200, session: a.session });
    expect(after.sessions()).toBe(1);
    // Concurrent requests of a session being re-opened share one re-opening.
    await after.close();
    const again = await start({ token, port });
    const pings = await Promise.all(Array.from({ length: 5 }, () => pingWithSession(again, a.session!, auth)));
    expect(pings.map((p) => p.status)).toEqual([200, 200, 200, 200, 200]);
    expect(again.sessions()).toBe(1);
    await again.close();

    const other = "another-t0ken-0123456789abcdef";
    const rotated = await start({ token: other, port });
    expect((await pingWithSession(rotated, a.session!, { authorization: `Bearer ${other}` })).status).toBe(404);
    await rotated.close();
    const open = await start({ port });
    const b = await initialize(open);
    await open.close();
    // Without a token the key is the process's own: its sessions outlive idle expiry, not a restart.
    expect((await pingWithSession(await start({ port }), b.session!)).status).toBe(404);
  });

  it("session-idle-expiry: requests keep a session open; it expires only once they stop", async () => {
    const mcp = await start({ sessionIdleMs: 1_000 });
    const a = await initialize(mcp);
    const until = Date.now() + 2_500;
    while (Date.now() < until) {
      expect(await ping(mcp, a.session!)).toBe(200);
      await new Promise((r) => setTimeout(r, 100));
    }
    expect(mcp.sessions()).toBe(1);
    await waitFor(() => mcp.sessions() === 0, { timeoutMs: 5_000, intervalMs: 20 });
  });

  it("refuses a cap or an idle time that is not a positive integer", async () => {
    await expect(start({ maxSessions: 0 })).rejects.toThrow(/maxSessions/);
    await expect(start({ sessionIdleMs: -1 })).rejects.toThrow(/sessionIdleMs/);
    await expect(start({ maxVersions: 0 })).rejects.toThrow(/maxVersions/);
    await expect(start({ headersTimeoutMs: 0 })).rejects.toThrow(/headersTimeoutMs must be a whole number from 1/);
  });
});

describe("MCP HTTP connection limits (src/listen.ts)", () => {
  it("silent sockets holding every slot are closed after headersTimeoutMs, then a client gets in; its event stream outlives the timeouts", async () => {
    const mcp = await start({ maxSessions: 1, headersTimeoutMs: 1_500 });
    const port = Number(new URL(mcp.url).port);
    // maxSessions + 256 slots, every one taken by a socket that sends nothing (opened well within the 1.5 s they have).
    const idle = await silentSockets(port, mcpMaxConnections(1));
    const tryInitialize = async () => {
      const dispatcher = new Agent({ pipelining: 0 });
      try {
        const res = await fetch(mcp.url, {
          dispatcher,
          method: "POST",
          headers: HEADERS,
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-03-26", capabilities: {}, clientInfo: { name: "t", version: "1" } } }),
          signal: AbortSignal.timeout(2000),
        });
        await res.text();
        return res.status === 200 ? res.headers.get("mcp-session-id") : null;
      } catch {
        return null;
      } finally {
        await dispatcher.close();
      }
    };
    const full = await whileAllOpen(idle, tryInitialize);
    if (full.allOpen) expect(full.value).toBeNull();
    const session = await waitFor(tryInitialize, { timeoutMs: 10_000, intervalMs: 20, message: "no initialize got in" });
    // Closed by the server (408), every one: the client's close events may trail the first.
    await waitFor(() => idle.every((s) => s.isClosed()), { timeoutMs: 5_000, intervalMs: 20 });
    expect(idle[0]!.got).toMatch(/^HTTP\/1\.1 408 /);

    const stream = await openSocket(port);
    onTestFinished(() => void stream.destroy());
    stream.write(`GET /mcp HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nAccept: text/event-stream\r\nmcp-session-id: ${session}\r\nmcp-protocol-version: 2025-03-26\r\n\r\n`);
    await waitFor(() => /^HTTP\/1\.1 200 [^]*text\/event-stream/i.test(stream.got), { timeoutMs: 5_000, intervalMs: 20 });
    // A whole headers timeout (and more) passes, as a silent socket's close shows; the stream is still open and serves.
    const witness = await openSocket(port);
    await waitFor(() => witness.isClosed(), { timeoutMs: 5_000, intervalMs: 20 });
    const second = await openSocket(port);
    await waitFor(() => second.isClosed(), { timeoutMs: 5_000, intervalMs: 20 });
    expect(stream.isClosed()).toBe(false);
    expect(await ping(mcp, session)).toBe(200);
  });
});

describe("MCP HTTP bearer token", () => {
  const token = "t0ken-for-the-mcp-test-0123456789";

  it("bearer-any-length: a wrong token of another length is refused 401 after a digest comparison (no early length check)", async () => {
    const mcp = await start({ token });
    const spy = vi.mocked(crypto.timingSafeEqual);

    for (const wrong of ["x", `${token}-longer`, "y".repeat(token.length)]) {
      spy.mockClear();
      const res = await initialize(mcp, { authorization: `Bearer ${wrong}` });
      expect(res.status).toBe(401);
      expect(spy).toHaveBeenCalledTimes(1);
      const [given, expected] = spy.mock.calls[0]! as [Buffer, Buffer];
      expect([given.length, expected.length]).toEqual([32, 32]);
    }
    expect((await initialize(mcp)).status).toBe(401);
    expect(mcp.sessions()).toBe(0);

    expect((await initialize(mcp, { authorization: `Bearer ${token}` })).status).toBe(200);
    expect(mcp.sessions()).toBe(1);
  });

  it("a refused request closes its connection, body read or not: cheap requests without a token cannot keep a slot on a keep-alive connection", async () => {
    const mcp = await start({ token });
    const port = Number(new URL(mcp.url).port);
    const head = (extra: string) => `POST /mcp HTTP/1.1\r\nHost: 127.0.0.1:${port}\r\nContent-Type: application/json\r\nConnection: keep-alive\r\n${extra}\r\n`;
    // Keep-alive asked for, no token: answered 401 and closed by the server.
    const plain = await openSocket(port);
    onTestFinished(() => void plain.destroy());
    plain.write(head("Content-Length: 2\r\n") + "{}");
    await waitFor(() => plain.isClosed(), { timeoutMs: 5_000, intervalMs: 20, message: "the refused keep-alive connection stayed open" });
    expect(plain.got).toMatch(/^HTTP\/1\.1 401 [^]*connection: close/i);
    // Headers at once, a body promised and never sent: answered 401 and closed, not held until the request timeout.
    const dribble = await openSocket(port);
    onTestFinished(() => void dribble.destroy());
    dribble.write(head("Content-Length: 100000\r\n") + "{");
    await waitFor(() => dribble.isClosed(), { timeoutMs: 5_000, intervalMs: 20, message: "the refused connection with a body to come stayed open" });
    expect(dribble.got).toMatch(/^HTTP\/1\.1 401 /);
    expect(dribble.got).not.toMatch(/ 408 /);
  });
});
