import { createServer, type Server } from "node:http";
import type { Socket } from "node:net";
import { afterEach, describe, expect, it } from "vitest";
import { becomes, openSocket, silentSockets, whileAllOpen } from "../helpers/sockets.ts";
import { applyConnectionLimits, connectionLimits, DEFAULT_HEADERS_TIMEOUT_MS, DEFAULT_KEEP_ALIVE_TIMEOUT_MS, DEFAULT_REQUEST_TIMEOUT_MS, listen, listenFault, type ConnectionLimits } from "../../src/listen.ts";

const quiet = { error: () => undefined };

/** One plain GET on a new connection: its body, or null when the connection is refused, reset or times out. */
async function get(port: number, path = "/"): Promise<string | null> {
  try {
    const res = await fetch(`http://127.0.0.1:${port}${path}`, { signal: AbortSignal.timeout(1000), headers: { connection: "close" } });
    return await res.text();
  } catch {
    return null;
  }
}

const servers: Server[] = [];
const sockets: Socket[] = [];
afterEach(async () => {
  for (const s of sockets.splice(0)) s.destroy();
  for (const server of servers.splice(0)) {
    server.closeAllConnections();
    await new Promise((r) => server.close(r));
  }
});

/**
 * A server answering "ok" (and an event stream on /sse, a comment every 50 ms), on 127.0.0.1. `limits` null:
 * the ablation, Node's own timeouts with only maxConnections set, as before.
 */
async function serve(limits: ConnectionLimits | null, maxConnections = limits?.maxConnections ?? 4): Promise<number> {
  const server = createServer((req, res) => {
    if (req.url === "/sse") {
      res.writeHead(200, { "content-type": "text/event-stream" });
      const beat = setInterval(() => res.write(": keep-alive\n\n"), 50);
      res.on("close", () => clearInterval(beat));
      return;
    }
    req.resume();
    req.on("end", () => res.end("ok"));
  });
  servers.push(server);
  if (limits === null) {
    server.maxConnections = maxConnections;
    await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  } else {
    await listen(server, { ...limits, port: 0, host: "127.0.0.1", log: quiet, what: "test server" });
  }
  return (server.address() as { port: number }).port;
}

const SHORT: ConnectionLimits = { maxConnections: 4, headersTimeoutMs: 500, requestTimeoutMs: 1000, keepAliveTimeoutMs: 300 };

describe("listen", () => {
  it("an accept error after listening (descriptors run out) is logged, not thrown; the server still answers", async () => {
    const logged: string[] = [];
    const server = createServer((_req, res) => res.end("ok"));
    await listen(server, { port: 0, host: "127.0.0.1", maxConnections: 8, log: { error: (_obj, msg) => void logged.push(msg) }, what: "test server" });
    try {
      expect(server.maxConnections).toBe(8);
      // What net.Server does when accept() fails with EMFILE: emit "error" on the server. Unheard, it would throw.
      const emfile = Object.assign(new Error("accept EMFILE"), { code: "EMFILE" });
      expect(() => server.emit("error", emfile)).not.toThrow();
      expect(() => server.emit("error", emfile)).not.toThrow();
      expect(logged).toEqual(["test server: a connection could not be accepted", "test server: a connection could not be accepted"]);
      const { port } = server.address() as { port: number };
      expect(await (await fetch(`http://127.0.0.1:${port}/`)).text()).toBe("ok");
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("a port in use is a rejected promise, with no listener left behind", async () => {
    const first = createServer();
    await listen(first, { port: 0, host: "127.0.0.1", maxConnections: 8, log: { error: () => undefined }, what: "first" });
    const second = createServer();
    try {
      const { port } = first.address() as { port: number };
      await expect(listen(second, { port, host: "127.0.0.1", maxConnections: 8, log: { error: () => undefined }, what: "second" })).rejects.toMatchObject({ code: "EADDRINUSE" });
      expect(second.listenerCount("error")).toBe(0);
    } finally {
      await new Promise((r) => first.close(r));
    }
  });

  it("listenFault names the setting to change: the port when it is held or not this process's, else the host", () => {
    const err = (code?: string) => Object.assign(new Error("listen failed"), code === undefined ? {} : { code });
    expect(listenFault("the console", "127.0.0.1", 80, err("EACCES"))).toEqual({ setting: "port", reason: "the console cannot listen on 127.0.0.1:80: this process may not bind the port (EACCES)" });
    expect(listenFault("the console", "127.0.0.1", 9, err("EADDRINUSE"))).toEqual({ setting: "port", reason: "the console cannot listen on 127.0.0.1:9: the port is in use (EADDRINUSE)" });
    expect(listenFault("x", "10.9.9.9", 0, err("EADDRNOTAVAIL"))).toEqual({ setting: "host", reason: "x cannot listen on 10.9.9.9:0: the host is not an address of this machine (EADDRNOTAVAIL)" });
    // no code (or not an object at all): the host's, said so; a host's control characters shown, not acted on
    expect(listenFault("x", "h\x1b[2J", 0, "boom")).toEqual({ setting: "host", reason: "x cannot listen on h\\x1b[2J:0: the host is not an address of this machine (listen failed)" });
    expect(listenFault("x", "h", 0, null).setting).toBe("host");
  });

  it("applies the defaults a production operator expects, and Node's checking interval to match", () => {
    const server = createServer();
    const applied = applyConnectionLimits(server, { maxConnections: 64 });
    expect(applied).toEqual({ maxConnections: 64, maxConnectionsPerAddress: undefined, headersTimeoutMs: DEFAULT_HEADERS_TIMEOUT_MS, requestTimeoutMs: DEFAULT_REQUEST_TIMEOUT_MS, keepAliveTimeoutMs: DEFAULT_KEEP_ALIVE_TIMEOUT_MS });
    expect([server.maxConnections, server.headersTimeout, server.requestTimeout, server.keepAliveTimeout]).toEqual([64, 10_000, 30_000, 5_000]);
    expect((server as Server & { connectionsCheckingInterval: number }).connectionsCheckingInterval).toBe(1000);
  });

  it("refuses bad limits with a config_invalid error naming the field as the caller calls it", () => {
    expect(() => connectionLimits({ maxConnections: 4, headersTimeoutMs: 0 })).toThrow(/headersTimeoutMs must be a whole number from 1 to 3600000 \(it is 0\)/);
    expect(() => connectionLimits({ maxConnections: 4, headersTimeoutMs: 1.5 }, { headersTimeoutMs: "WRIT_HEALTH_HEADERS_TIMEOUT_MS" })).toThrow(/^WRIT_HEALTH_HEADERS_TIMEOUT_MS must be/);
    expect(() => connectionLimits({ maxConnections: 4, headersTimeoutMs: 5000, requestTimeoutMs: 1000 })).toThrow(/requestTimeoutMs must be a whole number from 5000/);
    expect(() => connectionLimits({ maxConnections: 4, maxConnectionsPerAddress: 5 }, { maxConnectionsPerAddress: "--max-connections-per-address" })).toThrow(/--max-connections-per-address must be a whole number from 1 to 4/);
    try {
      connectionLimits({ maxConnections: 4, keepAliveTimeoutMs: -1 });
      expect.unreachable();
    } catch (err) {
      expect(err).toMatchObject({ code: "config_invalid", context: { field: "keepAliveTimeoutMs" } });
    }
    // A headers timeout past the default request timeout raises the request timeout's default with it.
    expect(connectionLimits({ maxConnections: 4, headersTimeoutMs: 60_000 }).requestTimeoutMs).toBe(60_000);
  });

  // The attack: every slot taken by sockets that send nothing. With the limits, Node closes them once the
  // headers timeout passes and a legitimate request gets in; without (Node's defaults: 60 s, checked every
  // 30 s), it is refused for as long as the test waits.
  for (const protectedServer of [true, false]) {
    it(`maxConnections silent sockets ${protectedServer ? "are closed after the headers timeout; then a request succeeds" : "(ablation: Node's defaults) hold every slot: requests are refused"}`, async () => {
      const port = await serve(protectedServer ? SHORT : null);
      const idle = await silentSockets(port, 4);
      sockets.push(...idle);
      // Full: a new connection is closed at once (asserted when the sockets were all still open after it).
      const full = await whileAllOpen(idle, () => get(port));
      if (full.allOpen) expect(full.value).toBeNull();
      const answered = await becomes(async () => (await get(port)) === "ok", 4000);
      expect(answered).toBe(protectedServer);
      // Closed by the server (408), every one: the client's close events may trail the request that got in.
      expect(await becomes(() => idle.every((s) => s.isClosed()), protectedServer ? 3000 : 0)).toBe(protectedServer);
      if (protectedServer) expect(idle[0]!.got).toMatch(/^HTTP\/1\.1 408 /);
    });
  }

  for (const protectedServer of [true, false]) {
    it(`a socket dribbling its headers ${protectedServer ? "is closed after the headers timeout" : "(ablation) stays open"}`, async () => {
      const port = await serve(protectedServer ? SHORT : null);
      const slow = await openSocket(port);
      sockets.push(slow);
      const head = `GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nX-Slow: ${"y".repeat(10_000)}`;
      let i = 0;
      const drip = setInterval(() => !slow.destroyed && slow.write(head[i++]!), 20);
      try {
        expect(await becomes(() => slow.isClosed(), 3000)).toBe(protectedServer);
        expect(i).toBeGreaterThan(10);
      } finally {
        clearInterval(drip);
      }
    });
  }

  for (const protectedServer of [true, false]) {
    it(`a request body dribbling in ${protectedServer ? "is cut off after the request timeout" : "(ablation) keeps its slot"}`, async () => {
      const port = await serve(protectedServer ? SHORT : null);
      const slow = await openSocket(port);
      sockets.push(slow);
      slow.write("POST / HTTP/1.1\r\nHost: 127.0.0.1\r\nContent-Length: 100000\r\n\r\n");
      const drip = setInterval(() => !slow.destroyed && slow.write("z"), 20);
      try {
        expect(await becomes(() => slow.isClosed(), 3000)).toBe(protectedServer);
        // Node answers 408 as it closes; without the timeout nothing has been said.
        if (protectedServer) expect(slow.got).toMatch(/^HTTP\/1\.1 408 /);
        else expect(slow.got).toBe("");
      } finally {
        clearInterval(drip);
      }
    });
  }

  it("an idle keep-alive connection is closed after keepAliveTimeoutMs", async () => {
    const port = await serve(SHORT);
    const s = await openSocket(port);
    sockets.push(s);
    s.write("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    expect(await becomes(() => s.got.endsWith("ok"), 2000)).toBe(true);
    expect(s.got).toMatch(/keep-alive/i);
    expect(await becomes(() => s.isClosed(), 3000)).toBe(true);
  });

  it("an event stream stays open well past every timeout", async () => {
    const port = await serve(SHORT);
    const s = await openSocket(port);
    sockets.push(s);
    s.write("GET /sse HTTP/1.1\r\nHost: 127.0.0.1\r\n\r\n");
    // 60 heartbeats: 3 s, three times the request timeout, six times the headers one, ten times the keep-alive one.
    const beats = () => s.got.split(": keep-alive").length - 1;
    expect(await becomes(() => beats() >= 60 || s.isClosed(), 10_000)).toBe(true);
    expect(s.isClosed()).toBe(false);
    expect(s.got).toMatch(/^HTTP\/1\.1 200 /);
  });

  for (const capped of [true, false]) {
    it(`maxConnectionsPerAddress ${capped ? "keeps one address from taking every slot" : "(ablation: unset) lets one address take them all"}`, async () => {
      const port = await serve({ maxConnections: 4, ...(capped ? { maxConnectionsPerAddress: 2 } : {}) });
      // Another loopback address stands for another client (Linux routes all of 127/8 to lo).
      const other = "127.0.0.2";
      const mine = [await openSocket(port), await openSocket(port)];
      sockets.push(...mine);
      const third = await openSocket(port);
      sockets.push(third);
      // Closed at once when capped: no timeout involved, so a short deadline only bounds the wait.
      expect(await becomes(() => third.isClosed(), capped ? 2000 : 300)).toBe(capped);
      const fourth = await openSocket(port);
      sockets.push(fourth);
      expect(await becomes(() => fourth.isClosed(), capped ? 2000 : 300)).toBe(capped);
      const theirs = await openSocket(port, other);
      sockets.push(theirs);
      theirs.write("GET / HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
      expect(await becomes(() => theirs.isClosed(), 2000)).toBe(true);
      expect(theirs.got.endsWith("ok")).toBe(capped);
      // The slots held by the capped address come back when its sockets close.
      if (capped) {
        mine[0]!.destroy();
        expect(await becomes(async () => (await get(port)) === "ok", 2000)).toBe(true);
      }
    });
  }
});
