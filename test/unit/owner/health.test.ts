import type { AddressInfo } from "node:net";
import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { HEALTH_MAX_CONNECTIONS, HealthBoard, OUTAGE_LISTED_MS } from "../../../src/owner/health.ts";
import { openSocket, silentSockets, type TrackedSocket } from "../../helpers/sockets.ts";
import { waitFor } from "../../helpers/wait-for.ts";

const T0 = new Date("2025-06-01T12:00:00.000Z").getTime();
let lines: { level: number; msg: string; system?: string }[];
let board: HealthBoard;

beforeEach(() => {
  vi.useFakeTimers({ toFake: ["Date"], now: T0 });
  lines = [];
  board = new HealthBoard(pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line)) }));
});
afterEach(() => vi.useRealTimers());

const at = (ms: number) => vi.setSystemTime(T0 + ms);
const iso = (ms: number) => new Date(T0 + ms).toISOString();

describe("HealthBoard outages", () => {
  it("say since when a system has been out and when it was last seen out, and when it answered again", () => {
    board.outage("billing", "timeout");
    at(5_000);
    board.outage("billing", "503");
    expect(board.health().outages).toEqual([{ system: "billing", reason: "503", since: iso(0), lastSeenAt: iso(5_000) }]);
    at(7_000);
    board.answered("billing");
    // still listed (by design, a minute after it was last seen), now with when it answered
    at(5_000 + OUTAGE_LISTED_MS);
    expect(board.health().outages).toEqual([{ system: "billing", reason: "503", since: iso(0), lastSeenAt: iso(5_000), answeredAt: iso(7_000) }]);
    at(5_001 + OUTAGE_LISTED_MS);
    expect(board.health().outages).toEqual([]);
    expect(board.health().ok).toBe(true);
  });

  it("log the start once (warn) and the end once (info)", () => {
    board.outage("billing", "timeout");
    board.outage("billing", "timeout");
    at(1_000);
    board.answered("billing");
    board.answered("billing");
    board.answered("helpdesk"); // never out: nothing to say
    expect(lines.map((l) => [l.level, l.system, l.msg.split(";")[0]])).toEqual([
      [40, "billing", "system of record unavailable"],
      [30, "billing", "system of record answers again after an outage"],
    ]);
    expect(lines[1]).toMatchObject({ since: iso(0), outageMs: 1_000 });
    // out again after it answered: a new outage, said again
    at(2_000);
    board.outage("billing", "reset");
    expect(lines).toHaveLength(3);
    expect(board.health().outages).toEqual([{ system: "billing", reason: "reset", since: iso(2_000), lastSeenAt: iso(2_000) }]);
  });
});

describe("HealthBoard.serve connection limits (src/listen.ts)", () => {
  it("64 silent sockets are closed after the headers timeout, then /healthz answers; one address's share is capped when asked", async () => {
    vi.useRealTimers();
    const server = await board.serve({ host: "127.0.0.1", port: 0, log: pino({ level: "silent" }), headersTimeoutMs: 5_000, maxConnectionsPerAddress: HEALTH_MAX_CONNECTIONS - 1 });
    const sockets: TrackedSocket[] = [];
    try {
      expect([server.maxConnections, server.headersTimeout, server.requestTimeout, server.keepAliveTimeout]).toEqual([HEALTH_MAX_CONNECTIONS, 5_000, 30_000, 5_000]);
      const port = (server.address() as AddressInfo).port;
      const healthz = async () => {
        try {
          return (await fetch(`http://127.0.0.1:${port}/healthz`, { headers: { connection: "close" }, signal: AbortSignal.timeout(2000) })).status;
        } catch {
          return null;
        }
      };
      // One address takes all it may (well within the 5 s the silent sockets have): the last slot is still another's (127.0.0.2 stands for Prometheus).
      sockets.push(...(await silentSockets(port, HEALTH_MAX_CONNECTIONS - 1)));
      const refused = await openSocket(port);
      sockets.push(refused);
      await waitFor(() => refused.isClosed(), { timeoutMs: 2_000, intervalMs: 20 });
      expect(refused.got).toBe("");
      const scraper = await openSocket(port, "127.0.0.2");
      sockets.push(scraper);
      scraper.write("GET /healthz HTTP/1.1\r\nHost: 127.0.0.1\r\nConnection: close\r\n\r\n");
      await waitFor(() => scraper.isClosed(), { timeoutMs: 2_000, intervalMs: 20 });
      expect(scraper.got).toMatch(/^HTTP\/1\.1 200 /);
      // After the headers timeout the silent ones are gone and the address may connect again.
      expect(await waitFor(async () => (await healthz()) === 200, { timeoutMs: 10_000, intervalMs: 20 })).toBe(true);
      await waitFor(() => sockets.slice(0, HEALTH_MAX_CONNECTIONS - 1).every((s) => s.isClosed()), { timeoutMs: 5_000, intervalMs: 20 });
      expect(sockets[0]!.got).toMatch(/^HTTP\/1\.1 408 /);
    } finally {
      for (const s of sockets) s.destroy();
      server.closeAllConnections();
      await new Promise((r) => server.close(r));
    }
  });
});
