// The MCP streamable HTTP server without a broker (no tools, so no client is used): the session cap,
// idle expiry, and the bearer token compared as digests whatever its length.
import * as crypto from "node:crypto";
import { afterEach, describe, expect, it, vi } from "vitest";
import { startWritMcpHttpServer, type WritMcpHttp, type WritMcpHttpOptions } from "../../producers/adapters/mcp-server.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { createLogger } from "../../src/logger.ts";
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

  it("session-idle-expiry: a session with no request for sessionIdleMs is closed and then answers 404", async () => {
    const mcp = await start({ sessionIdleMs: 200 });
    const a = await initialize(mcp);
    expect(a.status).toBe(200);
    expect(mcp.sessions()).toBe(1);

    await waitFor(() => mcp.sessions() === 0, { timeoutMs: 5_000, intervalMs: 20, message: () => `${mcp.sessions()} sessions open` });
    expect(await ping(mcp, a.session!)).toBe(404);
    // a new one can be opened
    expect((await initialize(mcp)).status).toBe(200);
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
});
