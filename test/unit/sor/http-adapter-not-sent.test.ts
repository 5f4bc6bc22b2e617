// What a write that never reached the system is: a connection that is not up by the deadline (a TLS handshake
// that stalls, as a SYN-flooded or overloaded load balancer does) or that fails before undici wrote the request
// is not sent (unavailable: tried again after a pause), never an unknown outcome (reconciled, and after
// WRIT_UNKNOWN_ROUNDS of them escalated to a person). Once undici has written the request, it stays unknown.
import { createServer as createTcpServer, type Server, type Socket } from "node:net";
import { describe, expect, it, onTestFinished } from "vitest";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";

const T1 = { type: "ticket", id: "T-1" };
const change = [{ op: "add" as const, path: "/tags/-", value: "vip" }];

/** A TCP endpoint that does `onData` with the first bytes of each connection; counts connections and their bytes. */
interface Endpoint {
  url: (scheme: "http" | "https") => string;
  connections: number;
  bytes: () => string;
  /** Ends every connection: a connect undici still waits for fails, so its agent closes without waiting for it. */
  hangUp: () => void;
  /** Takes no more connections, so requests undici still has queued fail at once. */
  refuse: () => void;
}

async function tcpEndpoint(onData: (socket: Socket) => void): Promise<Endpoint> {
  const sockets = new Set<Socket>();
  let got = "";
  let port = 0;
  const state: Endpoint = {
    url: (scheme) => `${scheme}://127.0.0.1:${port}`,
    connections: 0,
    bytes: () => got,
    hangUp: () => sockets.forEach((s) => s.destroy()),
    refuse: () => server.close(),
  };
  const server: Server = createTcpServer((socket) => {
    state.connections++;
    sockets.add(socket);
    socket.on("error", () => undefined);
    socket.once("data", (d) => {
      got += d.toString("latin1");
      onData(socket);
    });
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => {
    state.hangUp();
    return new Promise<void>((resolve) => (server.listening ? server.close(() => resolve()) : resolve()));
  });
  port = (server.address() as { port: number }).port;
  return state;
}

function system(endpoint: Endpoint, scheme: "http" | "https", opts: { readTimeoutMs?: number; maxConnections?: number } = {}) {
  const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: endpoint.url(scheme), readTimeoutMs: 300, ...opts });
  onTestFinished(() => {
    endpoint.hangUp();
    return sor.close();
  });
  return sor;
}

const write = { ifMatch: '"1"', idempotencyKey: "k-1", timeoutMs: 300 };

describe("http adapter: a write that never left", () => {
  it("a TLS handshake that stalls past the deadline: unavailable, not unknown; a read is a retriable outage", async () => {
    // Takes the connection and the ClientHello, answers nothing: no HTTP request can have been sent on it.
    const lb = await tcpEndpoint(() => undefined);
    const sor = system(lb, "https");
    expect(await sor.patch(T1, change, write)).toMatchObject({ kind: "unavailable", message: expect.stringMatching(/not sent/) });
    await expect(sor.read(T1, { timeoutMs: 300 })).rejects.toMatchObject({ code: "sor_unavailable", retriable: true });
    expect(lb.connections).toBeGreaterThan(0);
    expect(lb.bytes()).not.toContain("PATCH");
  });

  it("writes tried again during a TLS handshake stall open no more than maxConnections sockets", async () => {
    // undici keeps a connect going after the request's deadline gave it up, and opened a socket per retry.
    const lb = await tcpEndpoint(() => undefined);
    // The connect timeout (bounded by readTimeoutMs, here undici's 10 s) ends no connect during the test: every
    // socket the writes asked for is still open at the end, so the count is all they ever opened.
    const sor = system(lb, "https", { readTimeoutMs: 60_000, maxConnections: 2 });
    for (let round = 0; round < 3; round++) {
      const outcomes = await Promise.all(Array.from({ length: 4 }, (_, i) => sor.patch(T1, change, { ...write, idempotencyKey: `k-${round}-${i}` })));
      expect(outcomes.every((o) => o.kind === "unavailable"), JSON.stringify(outcomes)).toBe(true);
    }
    expect(lb.connections).toBeGreaterThan(0);
    expect(lb.connections).toBeLessThanOrEqual(2);
    // The writes given up wait in undici's queue for a connection: refused, they end at once.
    lb.refuse();
  });

  it("a connection reset during the TLS handshake: unavailable, not unknown", async () => {
    const lb = await tcpEndpoint((socket) => socket.resetAndDestroy());
    const sor = system(lb, "https");
    expect(await sor.patch(T1, change, write)).toMatchObject({ kind: "unavailable" });
    expect(lb.connections).toBeGreaterThan(0);
  });

  it("control: a request undici wrote stays unknown, whether the server then stalls or resets", async () => {
    const silent = await tcpEndpoint(() => undefined);
    expect(await system(silent, "http").patch(T1, change, write)).toMatchObject({ kind: "unknown" });
    expect(silent.bytes()).toMatch(/^PATCH \/records\/ticket\/T-1 HTTP\/1.1/);
    const reset = await tcpEndpoint((socket) => socket.resetAndDestroy());
    expect(await system(reset, "http").patch(T1, change, write)).toMatchObject({ kind: "unknown" });
    expect(reset.bytes()).toMatch(/^PATCH /);
  });
});
