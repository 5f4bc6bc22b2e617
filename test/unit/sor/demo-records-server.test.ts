import { spawn } from "node:child_process";
import { fileURLToPath } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import { startDemoRecordsServer } from "../../../src/testing/demo-records-server.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import type { DemoRecordsServer, DemoRecordsServerOptions } from "../../../src/testing/demo-records-server.ts";

async function startServer(opts: DemoRecordsServerOptions = {}): Promise<DemoRecordsServer> {
  const server = await startDemoRecordsServer(opts);
  onTestFinished(() => server.close());
  return server;
}

const JSON_PATCH = "application/json-patch+json";

function patch(server: DemoRecordsServer, path: string, ops: unknown, headers: Record<string, string> = {}) {
  return fetch(`${server.url}${path}`, {
    method: "PATCH",
    headers: { "content-type": JSON_PATCH, ...headers },
    body: JSON.stringify(ops),
  });
}

function put(server: DemoRecordsServer, path: string, state: unknown, headers: Record<string, string> = {}) {
  return fetch(`${server.url}${path}`, {
    method: "PUT",
    headers: { "content-type": "application/json", ...headers },
    body: JSON.stringify(state),
  });
}

const addTag = (tag: string) => [{ op: "add", path: "/tags/-", value: tag }];

describe("demo records server: reads", () => {
  it("GET answers the state with a strong ETag and no-store; HEAD the same headers without a body", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { status: "open", tags: [] });
    const res = await fetch(`${server.url}/records/ticket/T-1`);
    expect(res.status).toBe(200);
    expect(res.headers.get("etag")).toBe('"v1"');
    expect(res.headers.get("cache-control")).toBe("no-store");
    expect(await res.json()).toEqual({ status: "open", tags: [] });
    const head = await fetch(`${server.url}/records/ticket/T-1`, { method: "HEAD" });
    expect(head.status).toBe(200);
    expect(head.headers.get("etag")).toBe('"v1"');
    expect(await head.text()).toBe("");
  });

  it("an absent record is a 404 problem+json", async () => {
    const server = await startServer();
    const res = await fetch(`${server.url}/records/ticket/nope`);
    expect(res.status).toBe(404);
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    expect(await res.json()).toMatchObject({ status: 404, type: expect.any(String), title: expect.any(String), detail: expect.any(String) });
  });

  it("slow-read: the GET outlasts a client deadline, the next GET is prompt", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { n: 1 });
    server.setFaults([{ kind: "slow-read", delayMs: 60_000, match: { id: "T-1" } }]);
    // The client gives up once the server holds its GET (the fault taken), not after a fixed time: on a loaded
    // machine a short client deadline could end the request before it reached the server.
    const client = new AbortController();
    const read = fetch(`${server.url}/records/ticket/T-1`, { signal: client.signal });
    await waitFor(() => server.faults().length === 0, { timeoutMs: 10_000, intervalMs: 10, message: "the server never took the slow read" });
    client.abort();
    await expect(read).rejects.toThrow();
    expect((await fetch(`${server.url}/records/ticket/T-1`)).status).toBe(200);
  });
});

describe("demo records server: conditional PATCH", () => {
  it("the ETag changes with every write and the history links from-version to to-version", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const first = await patch(server, "/records/ticket/T-1", addTag("a"), { "if-match": '"v1"' });
    expect(first.status).toBe(200);
    expect(first.headers.get("etag")).toBe('"v2"');
    expect(await first.json()).toEqual({ tags: ["a"] });
    const second = await patch(server, "/records/ticket/T-1", addTag("b"), { "if-match": '"v2"' });
    expect(second.headers.get("etag")).toBe('"v3"');
    const chain = server.history("ticket", "T-1").map((h) => [h.kind, h.fromVersion, h.toVersion]);
    expect(chain).toEqual([["create", 0, 1], ["patch", 1, 2], ["patch", 2, 3]]);
  });

  it("a stale If-Match is a 412 carrying the current ETag and state, and nothing is written", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.seed("ticket", "T-1", { tags: ["outside"] });
    const res = await patch(server, "/records/ticket/T-1", addTag("mine"), { "if-match": '"v1"' });
    expect(res.status).toBe(412);
    expect(res.headers.get("etag")).toBe('"v2"');
    expect(await res.json()).toEqual({ tags: ["outside"] });
    expect(server.history("ticket", "T-1")).toHaveLength(2);
  });

  it("strong comparison: a weak tag never matches, * and a list containing the tag do", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    expect((await patch(server, "/records/ticket/T-1", addTag("x"), { "if-match": 'W/"v1"' })).status).toBe(412);
    expect((await patch(server, "/records/ticket/T-1", addTag("x"), { "if-match": '"v0", "v1"' })).status).toBe(200);
    expect((await patch(server, "/records/ticket/T-1", addTag("y"), { "if-match": "*" })).status).toBe(200);
    expect(server.stats().writes).toBe(3);
  });

  it("a PATCH without If-Match is 428 Precondition Required", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const res = await patch(server, "/records/ticket/T-1", addTag("x"));
    expect(res.status).toBe(428);
    expect(res.headers.get("content-type")).toBe("application/problem+json");
    expect(server.history("ticket", "T-1")).toHaveLength(1);
  });

  it("race-two-agents with enforceIfMatch=false: the stale write goes through and the first update is lost", async () => {
    const server = await startServer({ enforceIfMatch: false });
    server.seed("ticket", "T-1", { tags: [] });
    const a = await patch(server, "/records/ticket/T-1", [{ op: "replace", path: "/tags", value: ["a"] }], { "if-match": '"v1"' });
    const b = await patch(server, "/records/ticket/T-1", [{ op: "replace", path: "/tags", value: ["b"] }], { "if-match": '"v1"' });
    expect([a.status, b.status]).toEqual([200, 200]);
    const res = await fetch(`${server.url}/records/ticket/T-1`);
    expect(await res.json()).toEqual({ tags: ["b"] });
    expect(server.history("ticket", "T-1").map((h) => h.toVersion)).toEqual([1, 2, 3]);
  });

  it("an invalid patch changes nothing: failed test op 409, bad path or shape 422, wrong type 415, bad JSON 400", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { status: "open" });
    const m = { "if-match": '"v1"' };
    const failedTest = await patch(server, "/records/ticket/T-1", [{ op: "test", path: "/status", value: "closed" }], m);
    expect(failedTest.status).toBe(409);
    expect(failedTest.headers.get("content-type")).toBe("application/problem+json");
    expect((await patch(server, "/records/ticket/T-1", [{ op: "replace", path: "/a/b", value: 1 }], m)).status).toBe(422);
    expect((await patch(server, "/records/ticket/T-1", { op: "replace" }, m)).status).toBe(422);
    expect((await patch(server, "/records/ticket/T-1", [{ op: "bogus", path: "/x" }], m)).status).toBe(422);
    const text = await fetch(`${server.url}/records/ticket/T-1`, { method: "PATCH", headers: { "content-type": "text/plain", ...m }, body: "[]" });
    expect(text.status).toBe(415);
    const broken = await fetch(`${server.url}/records/ticket/T-1`, { method: "PATCH", headers: { "content-type": JSON_PATCH, ...m }, body: "[" });
    expect(broken.status).toBe(400);
    expect(server.history("ticket", "T-1")).toHaveLength(1);
    expect(await (await fetch(`${server.url}/records/ticket/T-1`)).json()).toEqual({ status: "open" });
    expect(server.stats().patchRequests).toBe(6);
  });

  it("a body nested past 256 levels is a 422 problem naming the depth, for PUT and PATCH; nothing is stored", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { status: "open" });
    const deep = `${"[".repeat(3000)}${"]".repeat(3000)}`;
    const send = (method: string, path: string, type: string, body: string, headers: Record<string, string> = {}) =>
      fetch(`${server.url}${path}`, { method, headers: { "content-type": type, ...headers }, body });
    for (const res of [
      await send("PUT", "/records/ticket/T-2", "application/json", `{"x":${deep}}`),
      await send("PATCH", "/records/ticket/T-1", JSON_PATCH, `[{"op":"add","path":"/x","value":${deep}}]`, { "if-match": '"v1"' }),
    ]) {
      expect(res.status).toBe(422);
      expect(await res.json()).toMatchObject({ detail: "the body is nested deeper than 256 levels" });
    }
    expect((await fetch(`${server.url}/records/ticket/T-2`)).status).toBe(404);
    expect(server.history("ticket", "T-1")).toHaveLength(1);
  });

  it("accepts application/json as a JSON Patch media type, and a PATCH of an absent record is 404", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { n: 1 });
    const ops = [{ op: "replace", path: "/n", value: 2 }];
    const res = await fetch(`${server.url}/records/ticket/T-1`, {
      method: "PATCH",
      headers: { "content-type": "application/json; charset=utf-8", "if-match": '"v1"' },
      body: JSON.stringify(ops),
    });
    expect(res.status).toBe(200);
    expect((await patch(server, "/records/ticket/T-2", ops, { "if-match": "*" })).status).toBe(404);
  });
});

describe("demo records server: Idempotency-Key", () => {
  it("a replay returns the stored response with Idempotent-Replayed, before If-Match, and writes once", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const headers = { "if-match": '"v1"', "idempotency-key": "intent-1" };
    const first = await patch(server, "/records/ticket/T-1", addTag("a"), headers);
    const replay = await patch(server, "/records/ticket/T-1", addTag("a"), headers);
    expect(replay.status).toBe(first.status);
    expect(replay.headers.get("etag")).toBe(first.headers.get("etag"));
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect(first.headers.get("idempotent-replayed")).toBeNull();
    expect(await replay.json()).toEqual(await first.json());
    const stats = server.stats();
    expect(stats.writesByKey["intent-1"]).toBe(1);
    expect(stats.patchRequestsByKey["intent-1"]).toBe(2);
    expect(server.history("ticket", "T-1").filter((h) => h.idempotencyKey === "intent-1")).toHaveLength(1);
  });

  it("a key reused with other ops is a 422", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    await patch(server, "/records/ticket/T-1", addTag("a"), { "if-match": '"v1"', "idempotency-key": "k" });
    const res = await patch(server, "/records/ticket/T-1", addTag("b"), { "if-match": '"v2"', "idempotency-key": "k" });
    expect(res.status).toBe(422);
    expect(server.stats().writesByKey.k).toBe(1);
  });

  it("honourIdempotencyKey=false applies twice, yet the lookup still reports the key applied", async () => {
    const server = await startServer({ honourIdempotencyKey: false });
    server.seed("ticket", "T-1", { tags: [] });
    await patch(server, "/records/ticket/T-1", addTag("a"), { "if-match": '"v1"', "idempotency-key": "dup" });
    const second = await patch(server, "/records/ticket/T-1", addTag("a"), { "if-match": '"v2"', "idempotency-key": "dup" });
    expect(second.headers.get("idempotent-replayed")).toBeNull();
    expect(server.stats().writesByKey.dup).toBe(2);
    const lookup = await fetch(`${server.url}/idempotency-keys/dup`);
    expect(lookup.status).toBe(200);
    expect(await lookup.json()).toEqual({ applied: true, type: "ticket", id: "T-1", version: '"v2"' });
    expect((await fetch(`${server.url}/idempotency-keys/never`)).status).toBe(404);
  });
});

describe("demo records server: PUT", () => {
  it("creates with If-None-Match: *, refuses a second create, needs If-Match to replace", async () => {
    const server = await startServer();
    const created = await put(server, "/records/account/A-1", { name: "Acme" }, { "if-none-match": "*" });
    expect(created.status).toBe(201);
    expect(created.headers.get("etag")).toBe('"v1"');
    expect(created.headers.get("location")).toBe("/records/account/A-1");
    const again = await put(server, "/records/account/A-1", { name: "Other" }, { "if-none-match": "*" });
    expect(again.status).toBe(412);
    expect(await again.json()).toEqual({ name: "Acme" });
    expect((await put(server, "/records/account/A-1", { name: "Blind" })).status).toBe(428);
    expect((await put(server, "/records/account/A-1", { name: "Stale" }, { "if-match": '"v0"' })).status).toBe(412);
    const replaced = await put(server, "/records/account/A-1", { name: "Acme Ltd" }, { "if-match": '"v1"' });
    expect(replaced.status).toBe(200);
    expect(replaced.headers.get("etag")).toBe('"v2"');
    expect(server.history("account", "A-1").map((h) => h.kind)).toEqual(["create", "replace"]);
    expect(server.putRequests().map((r) => [r.outcome, r.status])).toEqual([
      ["created", 201],
      ["precondition_failed", 412],
      ["precondition_required", 428],
      ["precondition_failed", 412],
      ["replaced", 200],
    ]);
  });

  it("a create's Idempotency-Key: recorded for lookup, replayed while dedupe is on, a 412 when it is off", async () => {
    const server = await startServer();
    const create = (name: string) => put(server, "/records/account/A-1", { name }, { "if-none-match": "*", "idempotency-key": "create-1" });
    expect((await create("Acme")).status).toBe(201);
    const replay = await create("Acme");
    expect(replay.status).toBe(201);
    expect(replay.headers.get("idempotent-replayed")).toBe("true");
    expect((await create("Other")).status).toBe(422);
    expect(await (await fetch(`${server.url}/idempotency-keys/create-1`)).json()).toEqual({ applied: true, type: "account", id: "A-1", version: '"v1"' });

    server.setConfig({ honourIdempotencyKey: false });
    const again = await create("Acme");
    expect(again.status).toBe(412);
    expect(server.stats()).toMatchObject({ writesByKey: { "create-1": 1 }, putRequestsByKey: { "create-1": 4 } });
    expect(server.putRequests("create-1").map((r) => r.outcome)).toEqual(["created", "replayed", "key_reused", "precondition_failed"]);
  });

  it("commit faults hit a PUT only when they say method PUT", async () => {
    const server = await startServer();
    server.setFaults([{ kind: "commit-then-drop", match: { type: "account" } }]);
    expect((await put(server, "/records/account/A-1", { name: "Acme" }, { "if-none-match": "*" })).status).toBe(201);
    expect(server.faults()).toHaveLength(1);
    server.setFaults([{ kind: "commit-then-drop", method: "PUT", match: { type: "account" } }]);
    await expect(put(server, "/records/account/A-2", { name: "Beta" }, { "if-none-match": "*" })).rejects.toThrow();
    expect(server.faults()).toEqual([]);
    expect(server.history("account", "A-2").map((h) => h.kind)).toEqual(["create"]);
    expect(server.putRequests().at(-1)).toMatchObject({ outcome: "created", fault: "commit-then-drop" });
  });
});

describe("demo records server: admin API", () => {
  it("faults, config, stats, history and reset over HTTP", async () => {
    const server = await startServer();
    const post = (path: string, body: unknown) =>
      fetch(`${server.url}/_admin/${path}`, { method: "POST", headers: { "content-type": "application/json" }, body: JSON.stringify(body) });
    const bad = await post("faults", [{ kind: "412-storm" }]);
    expect(bad.status).toBe(400);
    expect(((await bad.json()) as { detail: string }).detail).toContain("times");
    expect(await (await post("faults", [{ kind: "commit-then-drop", match: { type: "ticket" } }])).json()).toEqual([
      { kind: "commit-then-drop", times: 1, match: { type: "ticket" } },
    ]);
    expect(server.faults()).toHaveLength(1);
    expect((await fetch(`${server.url}/_admin/faults`, { method: "DELETE" })).status).toBe(200);
    expect(server.faults()).toEqual([]);

    expect(await (await post("config", { enforceIfMatch: false })).json()).toEqual({ enforceIfMatch: false, honourIdempotencyKey: true });
    expect((await post("config", { enforceIfMatch: "no" })).status).toBe(400);

    const seeded = await fetch(`${server.url}/_admin/records/ticket/T-9`, { method: "PUT", body: JSON.stringify({ n: 1 }) });
    expect(seeded.headers.get("etag")).toBe('"v1"');
    const history = await (await fetch(`${server.url}/_admin/history/ticket/T-9`)).json();
    expect(history).toMatchObject([{ kind: "create", fromVersion: 0, toVersion: 1, etag: '"v1"' }]);
    expect(await (await fetch(`${server.url}/_admin/stats`)).json()).toEqual({
      records: 1,
      writes: 1,
      patchRequests: 0,
      patchRequestsByKey: {},
      writesByKey: {},
      putRequests: 0,
      putRequestsByKey: {},
    });

    expect((await post("reset", {})).status).toBe(200);
    expect(server.stats()).toMatchObject({ records: 0, writes: 0 });
    expect(server.config()).toEqual({ enforceIfMatch: true, honourIdempotencyKey: true });
    expect((await fetch(`${server.url}/_admin/stats`, { method: "DELETE" })).status).toBe(405);
  });

  it("the helpers validate: a bad fault or option throws config_invalid naming the field", async () => {
    const server = await startServer();
    expect(() => server.setFaults([{ kind: "slow-read", delayMs: -1 }])).toThrow(/delayMs/);
    await expect(startDemoRecordsServer({ port: 70_000 })).rejects.toMatchObject({ code: "config_invalid", context: { field: "port" } });
  });
});

describe("demo records server: CLI", () => {
  const main = fileURLToPath(new URL("../../../src/testing/demo-records-server-main.ts", import.meta.url));

  function run(env: Record<string, string>) {
    const child = spawn(process.execPath, [main], { env: { ...process.env, ...env }, stdio: ["ignore", "pipe", "pipe"] });
    onTestFinished(() => {
      if (child.exitCode === null) child.kill("SIGKILL");
    });
    let out = "";
    child.stdout.on("data", (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (out += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    return { child, exited, output: () => out };
  }

  it("a bad environment variable exits non-zero with a message naming it", async () => {
    const { exited, output } = run({ RECORDS_ENFORCE_IF_MATCH: "yes", RECORDS_DB: ":memory:" });
    expect(await exited).not.toBe(0);
    expect(output()).toContain("RECORDS_ENFORCE_IF_MATCH");
  });

  it("logs its url, serves, and stops cleanly on SIGTERM", async () => {
    const { child, exited, output } = run({ RECORDS_PORT: "0", RECORDS_DB: ":memory:", RECORDS_HONOUR_IDEMPOTENCY_KEY: "false" });
    const url = await new Promise<string>((resolve, reject) => {
      child.stdout.on("data", () => {
        const match = /"url":"([^"]+)"/.exec(output());
        if (match?.[1]) resolve(match[1]);
      });
      child.on("exit", () => reject(new Error(`exited before listening: ${output()}`)));
    });
    expect(output()).toContain('"honourIdempotencyKey":false');
    expect((await fetch(`${url}/records/ticket/T-1`)).status).toBe(404);
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(output()).toContain("stopped");
  });
});
