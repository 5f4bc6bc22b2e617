import { createServer, type Server } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it, onTestFinished } from "vitest";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../../src/testing/demo-records-server.ts";
import { startFaultProxy, type FaultProxy } from "../../../src/verify/fault-proxy.ts";
import { waitFor } from "../../helpers/wait-for.ts";

async function setup(): Promise<{ records: DemoRecordsServer; proxy: FaultProxy }> {
  const records = await startDemoRecordsServer({ port: 0 });
  onTestFinished(() => records.close());
  const proxy = await startFaultProxy({ upstream: records.url });
  onTestFinished(() => proxy.close());
  records.seed("ticket", "T-1", { status: "open", tags: [] });
  return { records, proxy };
}

/** `server` listening on an ephemeral port of 127.0.0.1, closed after the test: its URL. */
async function listening(server: Server): Promise<string> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

const patchTag = (base: string, tag: string, headers: Record<string, string>, signal?: AbortSignal) =>
  fetch(`${base}/records/ticket/T-1`, {
    method: "PATCH",
    headers: { "content-type": "application/json-patch+json", ...headers },
    body: JSON.stringify([{ op: "add", path: "/tags/-", value: tag }]),
    ...(signal ? { signal } : {}),
  });

describe("fault proxy in front of the demo records server", () => {
  it("forwards requests unchanged: ETags, If-Match, 412 bodies and Idempotency-Key replays come through", async () => {
    const { records, proxy } = await setup();
    const got = await fetch(`${proxy.url}/records/ticket/T-1`);
    expect(got.status).toBe(200);
    expect(got.headers.get("etag")).toBe('"v1"');
    expect(await got.json()).toEqual({ status: "open", tags: [] });

    const applied = await patchTag(proxy.url, "a", { "if-match": '"v1"', "idempotency-key": "k-1" });
    expect(applied.status).toBe(200);
    expect(applied.headers.get("etag")).toBe('"v2"');
    const replay = await patchTag(proxy.url, "a", { "if-match": '"v1"', "idempotency-key": "k-1" });
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    const stale = await patchTag(proxy.url, "b", { "if-match": '"v1"', "idempotency-key": "k-2" });
    expect(stale.status).toBe(412);
    expect(await stale.json()).toEqual({ status: "open", tags: ["a"] });

    expect(records.history("ticket", "T-1").filter((h) => h.kind === "patch")).toHaveLength(1);
    expect(proxy.countByIdempotencyKey("k-1", "PATCH")).toBe(2);
    expect(proxy.countByIdempotencyKey("k-2")).toBe(1);
    expect(proxy.countsByRoute()).toEqual({ "GET /records/ticket/T-1": 1, "PATCH /records/ticket/T-1": 3 });
    expect(records.patchRequests()).toHaveLength(3);
  });

  it("commit-then-timeout: the upstream commits, the answer is withheld until the client gives up", async () => {
    const { records, proxy } = await setup();
    proxy.arm({ kind: "commit-then-timeout", match: { idempotencyKey: "k-1" } });
    const client = new AbortController();
    const sent = patchTag(proxy.url, "a", { "if-match": '"v1"', "idempotency-key": "k-1" }, client.signal);
    // The client's deadline, without a clock: it gives up once the write committed.
    await waitFor(() => records.history("ticket", "T-1").some((h) => h.idempotencyKey === "k-1"));
    client.abort();
    await expect(sent).rejects.toThrow();

    await waitFor(() => proxy.requests()[0]?.held === "client-gave-up");
    expect(proxy.requests()[0]).toMatchObject({ method: "PATCH", upstreamStatus: 200, fault: "commit-then-timeout" });
    expect(((await (await fetch(`${records.url}/records/ticket/T-1`)).json()) as { tags: string[] }).tags).toEqual(["a"]);
    expect(proxy.pending()).toEqual([]);
  });

  it("commit-then-timeout: a client still waiting after maxHoldMs gets the committed answer", async () => {
    const { proxy } = await setup();
    proxy.arm({ kind: "commit-then-timeout", maxHoldMs: 1 });
    const res = await patchTag(proxy.url, "a", { "if-match": '"v1"' });
    expect(res.status).toBe(200);
    expect(proxy.requests()[0]?.held).toBe("answered-late");
  });

  it("commit-then-drop: the upstream commits, the client's connection is dropped without an answer", async () => {
    const { records, proxy } = await setup();
    proxy.arm({ kind: "commit-then-drop" });
    await expect(patchTag(proxy.url, "a", { "if-match": '"v1"', "idempotency-key": "k-1" })).rejects.toThrow();
    expect(records.patchRequests("k-1")).toMatchObject([{ outcome: "applied", status: 200 }]);
    expect(proxy.requests()[0]).toMatchObject({ fault: "commit-then-drop", upstreamStatus: 200 });
    // The next request is not affected.
    expect((await fetch(`${proxy.url}/records/ticket/T-1`)).headers.get("etag")).toBe('"v2"');
  });

  it("a fault waits for a matching committed request: other keys, reads and 412s pass through and leave it armed", async () => {
    const { proxy } = await setup();
    proxy.arm({ kind: "commit-then-drop", match: { idempotencyKey: "k-target" } });
    expect((await patchTag(proxy.url, "a", { "if-match": '"v1"', "idempotency-key": "k-other" })).status).toBe(200);
    expect((await fetch(`${proxy.url}/records/ticket/T-1`)).status).toBe(200);
    expect((await patchTag(proxy.url, "b", { "if-match": '"v1"', "idempotency-key": "k-target" })).status).toBe(412);
    expect(proxy.pending()).toEqual([{ kind: "commit-then-drop", times: 1 }]);
    await expect(patchTag(proxy.url, "b", { "if-match": '"v2"', "idempotency-key": "k-target" })).rejects.toThrow();
    expect(proxy.pending()).toEqual([]);
  });

  it("an unreachable upstream is a 502", async () => {
    const records = await startDemoRecordsServer({ port: 0 });
    const proxy = await startFaultProxy({ upstream: records.url });
    onTestFinished(() => proxy.close());
    await records.close();
    const res = await fetch(`${proxy.url}/records/ticket/T-1`);
    expect(res.status).toBe(502);
  });

  it("an upstream that takes the connection and drops the request is a 502, but not said unreachable: the request may be why", async () => {
    let dropped = 0;
    const upstream = createServer((req) => void (dropped++, req.socket.destroy()));
    const url = await listening(upstream);
    const seen: string[] = [];
    const proxy = await startFaultProxy({ upstream: url, onUnreachable: (req, message) => void seen.push(`${req.method} ${req.path}: ${message}`) });
    onTestFinished(() => proxy.close());
    const res = await fetch(`${proxy.url}/records/ticket/T-1`, { method: "PATCH", body: "not json" });
    expect([res.status, dropped]).toEqual([502, 1]);
    expect(proxy.requests()).toMatchObject([{ method: "PATCH", upstreamStatus: null }]);
    // Before: "PATCH /records/ticket/T-1: socket hang up", a sign of the system's outage that excused the tool.
    expect(seen).toEqual([]);
  });

  it("forwards each request on a connection of its own: none goes out on a kept-alive one the upstream may be closing", async () => {
    const connections: number[] = [];
    const upstream = createServer((_req, res) => void res.end("ok"));
    upstream.on("connection", () => void connections.push(connections.length));
    const url = await listening(upstream);
    const proxy = await startFaultProxy({ upstream: url });
    onTestFinished(() => proxy.close());
    for (let i = 0; i < 3; i++) expect((await fetch(`${proxy.url}/records/ticket/T-1`)).status).toBe(200);
    // Before: one connection, kept alive by Node's global agent, for all three.
    expect(connections).toHaveLength(3);
  });

  it("refuses an upstream that is not http(s)", async () => {
    await expect(startFaultProxy({ upstream: "ftp://example.com" })).rejects.toThrow(/upstream must be an http\(s\) URL/);
  });
});
