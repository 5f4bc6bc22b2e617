import { createServer } from "node:http";
import type { IncomingHttpHeaders, IncomingMessage, ServerResponse } from "node:http";
import { describe, expect, it, onTestFinished } from "vitest";
import { WritError } from "../../../src/errors.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import { startDemoRecordsServer } from "../../../src/testing/demo-records-server.ts";
import type { DemoRecordsServer, DemoRecordsServerOptions } from "../../../src/testing/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import type { HttpSystemOfRecordOptions } from "../../../src/sor/http-adapter.ts";
import { json, startStub } from "../../helpers/http-stub.ts";
import { listenForTest } from "../../helpers/listen.ts";
import { waitFor } from "../../helpers/wait-for.ts";

async function startServer(opts: DemoRecordsServerOptions = {}): Promise<DemoRecordsServer> {
  const server = await startDemoRecordsServer(opts);
  onTestFinished(() => server.close());
  return server;
}

function adapterFor(baseUrl: string, opts: Partial<HttpSystemOfRecordOptions> = {}) {
  return createHttpSystemOfRecord({
    name: "crm",
    baseUrl,
    idempotencyKeys: true,
    idempotencyLookupPath: "/idempotency-keys/{key}",
    ...opts,
  });
}

/** A URL nothing listens on: a server's port, after it closed. */
async function closedUrl(): Promise<string> {
  const server = await startDemoRecordsServer();
  await server.close();
  return server.url;
}

/** A hand-written HTTP endpoint for answers the demo server never gives. */
async function stub(handler: (req: IncomingMessage, res: ServerResponse) => void): Promise<{ url: string; seen: IncomingHttpHeaders[] }> {
  const seen: IncomingHttpHeaders[] = [];
  const server = createServer((req, res) => {
    seen.push(req.headers);
    req.resume().on("end", () => handler(req, res));
  });
  return { url: `http://127.0.0.1:${await listenForTest(server)}`, seen };
}

const T1 = { type: "ticket", id: "T-1" };
const addTag = (tag: string): JsonPatchOp[] => [{ op: "add", path: "/tags/-", value: tag }];
const quick = { timeoutMs: 5000 };

/** Each option set is config_invalid, naming its field, with a message matching, and no header value in it. */
function expectRefused(cases: Array<[Record<string, unknown>, string, RegExp]>): void {
  for (const [opts, field, message] of cases) {
    let err: unknown;
    try {
      createHttpSystemOfRecord({ name: "crm", baseUrl: "http://x", ...opts } as HttpSystemOfRecordOptions);
    } catch (e) {
      err = e;
    }
    expect(err, JSON.stringify(opts)).toMatchObject({ code: "config_invalid", retriable: false, context: { field } });
    expect((err as Error).message).toContain(`option "${field}"`);
    expect((err as Error).message).toMatch(message);
    expect((err as Error).message + JSON.stringify(err)).not.toContain("s3cret");
  }
}

describe("http adapter: options", () => {
  it("applies defaults and derives the capabilities", () => {
    const plain = createHttpSystemOfRecord({ name: "crm", baseUrl: "http://127.0.0.1:1" });
    expect(plain.capabilities).toEqual({ idempotencyKeys: false, idempotencyLookup: false });
    expect(plain.lookupIdempotencyKey).toBeUndefined();
    expect(plain.config).toMatchObject({ recordPath: "/records/{type}/{id}", readTimeoutMs: 5000 });
    const full = adapterFor("http://127.0.0.1:1");
    expect(full.capabilities).toEqual({ idempotencyKeys: true, idempotencyLookup: true });
    expect(typeof full.lookupIdempotencyKey).toBe("function");
  });

  it("a bad option throws config_invalid naming the field, never a header value", () => {
    const attempt = (opts: unknown) => () => createHttpSystemOfRecord(opts as HttpSystemOfRecordOptions);
    expect(attempt({ name: "crm", baseUrl: "ftp://x" })).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "baseUrl" } }));
    expect(attempt({ name: "crm", baseUrl: "http://x", idempotencyLookupPath: "/keys" })).toThrow(/idempotencyLookupPath/);
    expect(attempt({ name: "crm", baseUrl: "http://x", readTimeoutMs: 0 })).toThrow(/readTimeoutMs/);
    let message = "";
    try {
      createHttpSystemOfRecord({ name: "crm", baseUrl: "http://x", headers: { authorization: "Bearer s3cret" }, bogus: 1 } as HttpSystemOfRecordOptions);
    } catch (err) {
      message = String((err as WritError).message);
      expect(err).toBeInstanceOf(WritError);
    }
    expect(message).not.toBe("");
    expect(message).not.toContain("s3cret");
  });

  it("the API-shape options default to today's behaviour, and config shows neither headers nor tls", () => {
    const plain = createHttpSystemOfRecord({ name: "crm", baseUrl: "https://127.0.0.1:1", headers: () => ({ authorization: "Bearer s3cret" }), tls: { rejectUnauthorized: true } });
    expect(plain.config).toMatchObject({
      method: "PATCH",
      patchBody: { kind: "json-patch", contentType: "application/json-patch+json" },
      state: { pointer: "" },
      version: { from: "etag" },
      ifMatch: { header: "If-Match", format: "etag" },
      conflictStatuses: [412],
    });
    expect(plain.config).not.toHaveProperty("patchPath");
    expect(plain.config).not.toHaveProperty("headers");
    expect(plain.config).not.toHaveProperty("tls");
    const wrapped = createHttpSystemOfRecord({ name: "crm", baseUrl: "http://x", patchBody: { kind: "wrapped", field: "ops" } });
    expect(wrapped.config.patchBody).toEqual({ kind: "wrapped", field: "ops", contentType: "application/json" });
  });

  it("each new option is validated strictly, the error naming the field", () => {
    const cases: Array<[Record<string, unknown>, string, RegExp]> = [
      [{ method: "PUT" }, "method", /PATCH|POST/],
      [{ patchPath: "/records/{type}" }, "patchPath", /\{id\}/],
      [{ patchBody: { kind: "merge-patch" } }, "patchBody.kind", /./],
      [{ patchBody: { kind: "json-patch", field: "ops" } }, "patchBody", /Unrecognized key: "field"/],
      [{ patchBody: { kind: "wrapped" } }, "patchBody.field", /./],
      [{ patchBody: { kind: "wrapped", field: "ops", extra: { ops: [] } } }, "patchBody.extra", /must not contain the ops field/],
      [{ patchBody: { kind: "wrapped", field: "ops", contentType: "json\r\nx: y" } }, "patchBody.contentType", /media type/],
      [{ state: { pointer: "data" } }, "state.pointer", /JSON Pointer/],
      [{ state: { pointer: "/a~2b" } }, "state.pointer", /JSON Pointer/],
      [{ state: { pointr: "/data" } }, "state", /Unrecognized key: "pointr"/],
      [{ version: { from: "body" } }, "version.pointer", /./],
      [{ version: { from: "body", pointer: "" } }, "version.pointer", /must point into the body/],
      [{ version: { from: "header" } }, "version.from", /./],
      [{ version: { from: "etag", pointer: "/v" } }, "version", /Unrecognized key: "pointer"/],
      [{ ifMatch: { header: "If Match" } }, "ifMatch.header", /header name/],
      [{ ifMatch: { header: "Content-Type" } }, "ifMatch.header", /writ sets itself/],
      [{ ifMatch: { format: "quoted" } }, "ifMatch.format", /etag|raw/],
      [{ conflictStatuses: [404] }, "conflictStatuses.0", /not found/],
      [{ conflictStatuses: [500] }, "conflictStatuses.0", /./],
      [{ conflictStatuses: [] }, "conflictStatuses", /./],
      [{ headers: "Bearer s3cret" }, "headers", /object of header values, or a function/],
      [{ headers: { "x-key": "s3cret\n" } }, "headers.x-key", /not a valid header value/],
      [{ headers: { "bad name": "s3cret" } }, "headers.bad name", /not a valid header name/],
      // Headers undici refuses on every request: each read an outage, each write an unknown outcome, nothing sent.
      [{ headers: { "Transfer-Encoding": "chunked" } }, "headers.Transfer-Encoding", /HTTP client itself/],
      [{ headers: { expect: "100-continue" } }, "headers.expect", /HTTP client itself/],
      [{ headers: { "keep-alive": "timeout=5" } }, "headers.keep-alive", /HTTP client itself/],
      [{ headers: { upgrade: "h2c" } }, "headers.upgrade", /HTTP client itself/],
      [{ headers: { "content-length": "3" } }, "headers.content-length", /HTTP client itself/],
      [{ headers: { connection: "keep alive" } }, "headers.connection", /connection options/],
      [{ ifMatch: { header: "Expect" } }, "ifMatch.header", /writ sets itself/],
      [{ tls: { rejectUnauthorized: false } }, "tls", /https/],
    ];
    expectRefused(cases);
  });
});

describe("http adapter: path templates", () => {
  it("a template no request can carry is config_invalid at start naming it, where it used to fail every request as an outage", () => {
    const cases: Array<[Record<string, unknown>, string, RegExp]> = [
      // A trailing space (a YAML or env value): undici refuses the path at each request (UND_ERR_INVALID_ARG).
      [{ recordPath: "/records/{type}/{id} " }, "recordPath", /printable ASCII/],
      [{ recordPath: "/records/{type}/{id}?q=a b" }, "recordPath", /printable ASCII/],
      [{ patchPath: "/records/{id}\r\nx-injected: 1" }, "patchPath", /printable ASCII/],
      [{ recordPath: "/records/{id}\x7f" }, "recordPath", /printable ASCII/],
      [{ recordPath: "/r\u0100cords/{id}" }, "recordPath", /printable ASCII/],
      // Sent as they are by undici, never meant for the wire: a fragment, raw Latin-1, a placeholder writ does not fill.
      [{ recordPath: "/records/{id}#x" }, "recordPath", /#/],
      [{ recordPath: "/récords/{id}" }, "recordPath", /printable ASCII/],
      [{ recordPath: "/records/{Type}/{id}" }, "recordPath", /placeholders/],
      [{ recordPath: "/records/{id}}" }, "recordPath", /placeholders/],
      [{ recordPath: "/records/{type}" }, "recordPath", /\{id\}/],
      [{ patchPath: "/records/{id}/%zz" }, "patchPath", /percent-escape/],
      // Servers and proxies resolve dot segments away: the request would name another resource.
      [{ recordPath: "/records/../{id}" }, "recordPath", /\.\. segment/],
      [{ recordPath: "/records/%2E%2e/{id}" }, "recordPath", /\.\. segment/],
      [{ create: { path: "/records/./{id}" } }, "create.path", /\.\. segment/],
      [{ idempotencyLookupPath: "/keys/{key} " }, "idempotencyLookupPath", /printable ASCII/],
    ];
    expectRefused(cases);
  });

  it("an entity id . or .. never reaches a server that resolves dot segments: nothing read or written elsewhere", async () => {
    // Routes by the resolved path, as WHATWG URL parsing (and most proxies) do: /tickets/../settings is /settings.
    const docs = new Map<string, { v: number; doc: Record<string, unknown> }>([
      ["/tickets/T-1/settings", { v: 1, doc: { owner: "ada" } }],
      ["/tickets/settings", { v: 1, doc: { kind: "defaults for every ticket" } }],
      ["/settings", { v: 1, doc: { kind: "global settings" } }],
    ]);
    const writes: string[] = [];
    const server = await startStub((req, res) => {
      const path = new URL(req.path, "http://records.test").pathname;
      const at = docs.get(path);
      if (at === undefined) return void json(res, 404, { error: "no such record" });
      if (req.method === "PATCH") {
        if (req.headers["if-match"] !== `"${at.v}"`) return void json(res, 412, { error: "stale" });
        writes.push(path);
        for (const op of JSON.parse(req.body) as Array<{ path: string; value: unknown }>) at.doc[op.path.slice(1)] = op.value;
        at.v++;
      }
      json(res, 200, at.doc, { etag: `"${at.v}"` });
    });
    const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: server.url, recordPath: "/{type}s/{id}/settings" });
    onTestFinished(() => sor.close());
    const change: JsonPatchOp[] = [{ op: "replace", path: "/owner", value: "mallory" }];
    for (const id of ["..", "."]) {
      const entity = { type: "ticket", id };
      await expect(sor.read(entity, quick)).rejects.toMatchObject({ code: "sor_protocol", retriable: false, message: expect.stringMatching(/path segment/) });
      await expect(sor.patch(entity, change, { ifMatch: '"1"', idempotencyKey: "k", timeoutMs: 5000 })).resolves.toMatchObject({ kind: "rejected", status: 0 });
      await expect(sor.upsertByExternalId(entity, { owner: "mallory" }, { ifNoneMatch: "*", idempotencyKey: "k", timeoutMs: 5000 })).resolves.toMatchObject({ kind: "rejected", status: 0 });
    }
    // An id no URL can carry (a lone surrogate) is refused the same way, not thrown as a URIError.
    await expect(sor.read({ type: "ticket", id: "T-\ud800" }, quick)).rejects.toMatchObject({ code: "sor_protocol", retriable: false });
    await expect(sor.patch({ type: "ticket", id: "T-\ud800" }, change, { ifMatch: '"1"', idempotencyKey: "k", timeoutMs: 5000 })).resolves.toMatchObject({ kind: "rejected", status: 0 });
    // An id that only contains dots is a record like any other.
    await expect(sor.read({ type: "ticket", id: "..." }, quick)).resolves.toBeNull();
    expect(writes).toEqual([]);
    expect(server.seen.map((r) => r.path)).toEqual(["/tickets/.../settings"]);
  });

  it("templates with a query, percent-escapes and sub-delimiters are sent as written", async () => {
    const server = await stub((req, res) => {
      res.writeHead(200, { "content-type": "application/json", etag: '"1"' }).end(JSON.stringify({ url: req.url }));
    });
    const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: `${server.url}/api`, recordPath: "/v2/{type}s/{id};v=1?expand=a,b&x=%20/?" });
    onTestFinished(() => sor.close());
    await expect(sor.read({ type: "ticket", id: "T 1" }, quick)).resolves.toEqual({ state: { url: "/api/v2/tickets/T%201;v=1?expand=a,b&x=%20/?" }, version: '"1"' });
  });

  it("templates with characters outside RFC 3986 that undici sends ([ ] | ^ ` \\ \" < >) are accepted and sent as written", async () => {
    const server = await stub((req, res) => {
      res.writeHead(200, { "content-type": "application/json", etag: '"1"' }).end(JSON.stringify({ url: req.url }));
    });
    const templates: Array<[string, string]> = [
      ["/items?filter[id]={id}", "/items?filter[id]=T%201"],
      ["/items?ids[]={id}", "/items?ids[]=T%201"],
      ["/api/{type}|{id}", "/api/ticket|T%201"],
      ['/x/{id}?q=^`\\"<>', '/x/T%201?q=^`\\"<>'],
    ];
    for (const [recordPath, sent] of templates) {
      const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: server.url, recordPath });
      onTestFinished(() => sor.close());
      await expect(sor.read({ type: "ticket", id: "T 1" }, quick), recordPath).resolves.toEqual({ state: { url: sent }, version: '"1"' });
    }
    expect(server.seen).toHaveLength(templates.length);
  });
});

describe("http adapter: read", () => {
  it("gives the state and ETag, null when absent", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const sor = adapterFor(server.url);
    expect(await sor.read(T1, quick)).toEqual({ state: { tags: [] }, version: '"v1"' });
    expect(await sor.read({ type: "ticket", id: "nope" }, quick)).toBeNull();
  });

  it("refused connection: a retriable sor_unavailable", async () => {
    const sor = adapterFor(await closedUrl());
    await expect(sor.read(T1, quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true, context: { entity: "ticket:T-1" } });
  });

  it("slow-read past the deadline: a retriable sor_unavailable", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.setFaults([{ kind: "slow-read", delayMs: 60_000 }]);
    await expect(adapterFor(server.url).read(T1, { timeoutMs: 200 })).rejects.toMatchObject({ code: "sor_unavailable", retriable: true });
  });

  it("a 200 without an ETag, or with a weak one, is a non-retriable sor_protocol", async () => {
    const noTag = await stub((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end("{}"));
    await expect(adapterFor(noTag.url).read(T1, quick)).rejects.toMatchObject({ code: "sor_protocol", retriable: false });
    const weak = await stub((_req, res) => res.writeHead(200, { etag: 'W/"1"', "content-type": "application/json" }).end("{}"));
    await expect(adapterFor(weak.url).read(T1, quick)).rejects.toThrow(/weak/);
  });
});

describe("http adapter: create by external id", () => {
  const ACME = { type: "account", id: "ext-42" };
  const create = { ifNoneMatch: "*" as const, idempotencyKey: "c-1", timeoutMs: 5000 };

  it("PUT with If-None-Match: * to the record: created once; a second create is precondition_failed carrying the record", async () => {
    const server = await startServer({ honourIdempotencyKey: false });
    const sor = adapterFor(server.url, { conflictAnswer: "record" });
    expect(await sor.upsertByExternalId(ACME, { name: "Acme" }, create)).toEqual({ kind: "applied", state: { name: "Acme" }, version: '"v1"' });
    expect(await sor.upsertByExternalId(ACME, { name: "Other" }, { ...create, idempotencyKey: "c-2" })).toEqual({
      kind: "precondition_failed",
      current: { state: { name: "Acme" }, version: '"v1"' },
    });
    expect(server.putRequests().map((r) => [r.ifNoneMatch, r.idempotencyKey, r.outcome])).toEqual([
      ["*", "c-1", "created"],
      ["*", "c-2", "precondition_failed"],
    ]);
    expect(await sor.lookupIdempotencyKey!(ACME, "c-1", quick)).toBe("applied");
  });

  it("the answer lost after the create committed is unknown (reconcile), a refused connection unavailable", async () => {
    const server = await startServer();
    server.setFaults([{ kind: "commit-then-drop", method: "PUT" }]);
    expect(await adapterFor(server.url).upsertByExternalId(ACME, { name: "Acme" }, create)).toMatchObject({ kind: "unknown" });
    expect(server.history("account", "ext-42")).toHaveLength(1);
    expect(await adapterFor(await closedUrl()).upsertByExternalId(ACME, { name: "Acme" }, create)).toMatchObject({ kind: "unavailable" });
  });

  it("a system's own upsert: method, path, wrapped body, the external id in the body, 409 for exists", async () => {
    const seen: { method?: string; url?: string; body: string; headers: IncomingHttpHeaders }[] = [];
    let n = 0;
    const server = createServer((req, res) => {
      let body = "";
      req.on("data", (c: Buffer) => (body += c.toString("utf8")));
      req.on("end", () => {
        seen.push({ method: req.method, url: req.url, body, headers: req.headers });
        if (n++ === 0) res.writeHead(201, { etag: '"7"', "content-type": "application/json" }).end(JSON.stringify({ name: "Acme", externalId: "ext-42" }));
        else res.writeHead(409, { etag: '"7"', "content-type": "application/json" }).end(JSON.stringify({ name: "Acme", externalId: "ext-42" }));
      });
    });
    const sor = adapterFor(`http://127.0.0.1:${await listenForTest(server)}/api`, {
      create: { path: "/{type}s/upsert/{id}", method: "POST", ifNoneMatch: false, existsStatuses: [409], body: { kind: "wrapped", field: "record", extra: { mode: "create" } }, externalIdField: "externalId" },
      conflictAnswer: "record",
    });
    expect(await sor.upsertByExternalId(ACME, { name: "Acme" }, create)).toEqual({ kind: "applied", state: { name: "Acme", externalId: "ext-42" }, version: '"7"' });
    expect(await sor.upsertByExternalId(ACME, { name: "Acme" }, create)).toMatchObject({ kind: "precondition_failed", current: { version: '"7"' } });
    expect(seen[0]).toMatchObject({ method: "POST", url: "/api/accounts/upsert/ext-42" });
    expect(JSON.parse(seen[0]!.body)).toEqual({ mode: "create", record: { name: "Acme", externalId: "ext-42" } });
    expect(seen[0]!.headers["if-none-match"]).toBeUndefined();
    expect(seen[0]!.headers["idempotency-key"]).toBe("c-1");
  });

  it("refuses create options that cannot work, naming them", () => {
    expect(() => adapterFor("http://127.0.0.1:1", { create: { existsStatuses: [404] } })).toThrow(/create\.existsStatuses\.0/);
    expect(() => adapterFor("http://127.0.0.1:1", { create: { body: { kind: "wrapped", field: "r", extra: { r: 1 } } } })).toThrow(/must not contain the record field/);
    expect(() => adapterFor("http://127.0.0.1:1", { create: { method: "GET" } as never })).toThrow(/create\.method/);
  });
});

describe("http adapter: patch", () => {
  it("applied: the new state and ETag, one committed write", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const outcome = await adapterFor(server.url).patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "k-1", timeoutMs: 5000 });
    expect(outcome).toEqual({ kind: "applied", state: { tags: ["a"] }, version: '"v2"' });
    expect(server.stats().writesByKey["k-1"]).toBe(1);
  });

  it("stale If-Match: precondition_failed, nothing written; the answer is the current record only where conflictAnswer says so", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.seed("ticket", "T-1", { tags: ["outside"] });
    const stale = { ifMatch: '"v1"', idempotencyKey: "k-1", timeoutMs: 5000 };
    expect(await adapterFor(server.url, { conflictAnswer: "record" }).patch(T1, addTag("a"), stale)).toEqual({
      kind: "precondition_failed",
      current: { state: { tags: ["outside"] }, version: '"v2"' },
    });
    // By default the owner reads the record afresh (IntentPipeline.readAfterConflict).
    expect(await adapterFor(server.url).patch(T1, addTag("a"), stale)).toEqual({ kind: "precondition_failed", current: null });
    expect(server.stats().writesByKey["k-1"]).toBeUndefined();
  });

  it("a 412 whose body is an error document with an ETag is never taken for the record by default", async () => {
    // The whole body is the state (state pointer ""): {"error": ...} would be a record the agent builds its next change on.
    const api = await stub((_req, res) => res.writeHead(412, { etag: '"v9"', "content-type": "application/json" }).end(JSON.stringify({ error: "precondition failed" })));
    const stale = { ifMatch: '"v1"', idempotencyKey: "k-1", timeoutMs: 5000 };
    expect(await adapterFor(api.url).patch(T1, addTag("a"), stale)).toEqual({ kind: "precondition_failed", current: null });
    expect(await adapterFor(api.url).upsertByExternalId(T1, { tags: [] }, { ifNoneMatch: "*", idempotencyKey: "c", timeoutMs: 5000 })).toEqual({ kind: "precondition_failed", current: null });
    // What the option is for, and what it costs on such an API.
    expect(await adapterFor(api.url, { conflictAnswer: "record" }).patch(T1, addTag("a"), stale)).toEqual({
      kind: "precondition_failed",
      current: { state: { error: "precondition failed" }, version: '"v9"' },
    });
  });

  it("412-storm: two conflicts, then the write lands once", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.setFaults([{ kind: "412-storm", times: 2, match: { type: "ticket" } }]);
    const sor = adapterFor(server.url);
    const opts = { ifMatch: '"v1"', idempotencyKey: "storm", timeoutMs: 5000 };
    const outcomes = [await sor.patch(T1, addTag("a"), opts), await sor.patch(T1, addTag("a"), opts), await sor.patch(T1, addTag("a"), opts)];
    expect(outcomes.map((o) => o.kind)).toEqual(["precondition_failed", "precondition_failed", "applied"]);
    expect(outcomes[0]).toMatchObject({ current: null });
    expect(server.stats().patchRequestsByKey.storm).toBe(3);
    expect(server.stats().writesByKey.storm).toBe(1);
  });

  it("an absent record is not_found", async () => {
    const server = await startServer();
    const outcome = await adapterFor(server.url).patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "k", timeoutMs: 5000 });
    expect(outcome).toEqual({ kind: "not_found" });
  });

  it("never sends If-Match: * (any version, an unconditional write), and reads no version that would be one or a list", async () => {
    const etags = ["*", '"a", "b"'];
    let next = 0;
    const { url, seen } = await stub((req, res) => {
      if (req.method === "GET") return void res.writeHead(200, { "content-type": "application/json", etag: etags[next++]! }).end('{"tags":[]}');
      res.writeHead(200, { "content-type": "application/json", etag: '"v2"' }).end('{"tags":["a"]}');
    });
    const sor = adapterFor(url);
    expect(await sor.patch(T1, addTag("a"), { ifMatch: "*", idempotencyKey: "k", timeoutMs: 5000 })).toMatchObject({ kind: "rejected", status: 0 });
    expect(seen).toHaveLength(0);
    for (const etag of etags) await expect(sor.read(T1, quick), etag).rejects.toMatchObject({ code: "sor_protocol", message: expect.stringContaining("not one entity tag") });
  });

  it("an invalid patch is rejected with the problem detail, and the record is unchanged", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { status: "open" });
    const sor = adapterFor(server.url);
    const opts = { ifMatch: '"v1"', idempotencyKey: "bad", timeoutMs: 5000 };
    const badPath = await sor.patch(T1, [{ op: "replace", path: "/a/b", value: 1 }], opts);
    expect(badPath).toMatchObject({ kind: "rejected", status: 422, message: expect.any(String) });
    const failedTest = await sor.patch(T1, [{ op: "test", path: "/status", value: "closed" }], opts);
    expect(failedTest).toMatchObject({ kind: "rejected", status: 409 });
    expect(server.history("ticket", "T-1")).toHaveLength(1);
    expect(await sor.read(T1, quick)).toEqual({ state: { status: "open" }, version: '"v1"' });
  });

  it("commit-then-timeout: unknown, the write committed exactly once, lookup says applied, a retry is replayed", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.setFaults([{ kind: "commit-then-delay", delayMs: 60_000, match: { id: "T-1" } }]);
    const sor = adapterFor(server.url);
    const outcome = await sor.patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "slow", timeoutMs: 200 });
    expect(outcome.kind).toBe("unknown");
    await waitFor(() => server.stats().writesByKey.slow === 1, { timeoutMs: 5000 });
    expect(server.history("ticket", "T-1").filter((h) => h.idempotencyKey === "slow")).toHaveLength(1);
    expect(await sor.lookupIdempotencyKey?.(T1, "slow", quick)).toBe("applied");
    const retry = await sor.patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "slow", timeoutMs: 5000 });
    expect(retry).toEqual({ kind: "applied", state: { tags: ["a"] }, version: '"v2"' });
    expect(server.stats().writesByKey.slow).toBe(1);
  });

  it("commit-then-drop: unknown, and the write committed exactly once", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    server.setFaults([{ kind: "commit-then-drop" }]);
    const outcome = await adapterFor(server.url).patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "drop", timeoutMs: 5000 });
    expect(outcome.kind).toBe("unknown");
    expect(server.stats().writesByKey.drop).toBe(1);
    expect(server.stats().patchRequestsByKey.drop).toBe(1);
  });

  it("refused connection: unavailable (known not sent)", async () => {
    const outcome = await adapterFor(await closedUrl()).patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "k", timeoutMs: 5000 });
    expect(outcome.kind).toBe("unavailable");
  });

  it("sends If-Match, Idempotency-Key, the JSON Patch media type and static headers", async () => {
    const endpoint = await stub((_req, res) => res.writeHead(200, { etag: '"7"', "content-type": "application/json" }).end('{"ok":true}'));
    const sor = adapterFor(endpoint.url, { headers: { authorization: "Bearer t", "if-match": "overridden" } });
    expect(await sor.patch(T1, addTag("a"), { ifMatch: '"6"', idempotencyKey: "k-9", timeoutMs: 5000 })).toEqual({
      kind: "applied",
      state: { ok: true },
      version: '"7"',
    });
    expect(endpoint.seen[0]).toMatchObject({
      authorization: "Bearer t",
      "if-match": '"6"',
      "idempotency-key": "k-9",
      "content-type": "application/json-patch+json",
    });
  });

  it("keeps the base path, sends each header once under its last setting, without outer blanks", async () => {
    const paths: string[] = [];
    const endpoint = await stub((req, res) => {
      paths.push(`${req.method} ${req.url}`);
      res.writeHead(200, { etag: '"7"', "content-type": "application/json" }).end('{"ok":true}');
    });
    const sor = adapterFor(`${endpoint.url}/api/v2/`, { headers: { "X-Tenant": "  acme\t", Authorization: "Bearer t" } });
    await sor.read({ type: "ticket", id: "a b/c" }, { ...quick, headers: { "x-tenant": "beta", traceparent: "00-1-2-01" } });
    await sor.patch(T1, addTag("a"), { ifMatch: '"6"', idempotencyKey: "k-9", timeoutMs: 5000, headers: { "IF-MATCH": "caller's" } });
    expect(paths).toEqual(["GET /api/v2/records/ticket/a%20b%2Fc", "PATCH /api/v2/records/ticket/T-1"]);
    expect(endpoint.seen[0]).toMatchObject({ "x-tenant": "beta", authorization: "Bearer t", traceparent: "00-1-2-01", accept: "application/json" });
    expect(endpoint.seen[1]).toMatchObject({ "x-tenant": "acme", "if-match": '"6"' });
    // A caller's header that is no header value is refused before anything is sent.
    await expect(sor.read(T1, { ...quick, headers: { "x-bad": "a\r\nb" } })).rejects.toMatchObject({ code: "sor_protocol", retriable: false });
    expect(paths).toHaveLength(2);
  });

  it("refuses a baseUrl with a query, a fragment or credentials, or no URL at all (an unset variable's empty string), naming the field", () => {
    for (const baseUrl of ["http://x/api?tenant=1", "http://x/api#top", "http://user:pw@x/api", "", "not a url", "http://", "http://crm example.com"]) {
      expect(() => createHttpSystemOfRecord({ name: "crm", baseUrl })).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "baseUrl" } }));
      expect(() => createHttpSystemOfRecord({ name: "crm", baseUrl })).toThrow(/^http system of record "crm" option "baseUrl": /);
    }
  });

  it("a 204 is applied with the state and version of a follow-up read; 5xx is unknown; 429 unavailable; 428 rejected", async () => {
    const statuses = [204, 503, 429, 428];
    const endpoint = await stub((req, res) => {
      if (req.method === "GET") return res.writeHead(200, { etag: '"8"', "content-type": "application/json" }).end('{"n":8}');
      res.writeHead(statuses.shift() ?? 500, { "content-type": "application/problem+json" }).end('{"title":"nope","detail":"no"}');
    });
    const sor = adapterFor(endpoint.url);
    const opts = { ifMatch: '"7"', idempotencyKey: "k", timeoutMs: 5000 };
    expect(await sor.patch(T1, addTag("a"), opts)).toEqual({ kind: "applied", state: { n: 8 }, version: '"8"' });
    expect((await sor.patch(T1, addTag("a"), opts)).kind).toBe("unknown");
    expect((await sor.patch(T1, addTag("a"), opts)).kind).toBe("unavailable");
    expect(await sor.patch(T1, addTag("a"), opts)).toEqual({ kind: "rejected", status: 428, message: "no" });
  });

  it("a 412 without a record body gives precondition_failed with current null", async () => {
    const endpoint = await stub((_req, res) => res.writeHead(412, { "content-type": "application/problem+json" }).end('{"title":"stale"}'));
    expect(await adapterFor(endpoint.url).patch(T1, addTag("a"), { ifMatch: '"1"', idempotencyKey: "k", timeoutMs: 5000 })).toEqual({
      kind: "precondition_failed",
      current: null,
    });
  });
});

describe("http adapter: lookupIdempotencyKey", () => {
  it("applied after a committed write, not_applied for an unknown key, sor_unavailable (retriable) when unreachable", async () => {
    const server = await startServer();
    server.seed("ticket", "T-1", { tags: [] });
    const sor = adapterFor(server.url);
    expect(await sor.lookupIdempotencyKey?.(T1, "k-1", quick)).toBe("not_applied");
    await sor.patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "k-1", timeoutMs: 5000 });
    expect(await sor.lookupIdempotencyKey?.(T1, "k-1", quick)).toBe("applied");
    // Unreachable is not an answer: the owner pauses and asks again rather than treating the outcome as unknown.
    await expect(adapterFor(await closedUrl()).lookupIdempotencyKey!(T1, "k-1", quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true });
  });

  it("a 200 settles an intent as applied only when it says so: a sign-in page or an applied that is no boolean is unknown", async () => {
    const answers: [string, string, string][] = [
      ["text/html", "<html>Sign in</html>", "unknown"],
      ["application/json", '{"status":"failed","applied":"false"}', "unknown"],
      ["application/json", "[true]", "unknown"],
      ["application/json", "not json", "unknown"],
      ["application/json", '{"applied":false}', "not_applied"],
      ["application/json", '{"applied":true,"version":"\\"v2\\""}', "applied"],
      ["application/json", '{"key":"k-1"}', "applied"],
      ["text/plain", "", "applied"],
    ];
    let next = 0;
    const { url } = await stub((_req, res) => {
      const [type, body] = answers[next++]!;
      res.writeHead(200, { "content-type": type }).end(body);
    });
    const sor = adapterFor(url, { idempotencyLookupPath: "/idempotency-keys/{key}" });
    const seen: string[] = [];
    for (let i = 0; i < answers.length; i++) seen.push(await sor.lookupIdempotencyKey!(T1, "k-1", quick));
    expect(seen).toEqual(answers.map(([, , expected]) => expected));
  });

  it("honourIdempotencyKey=false: the same key applies twice, and the lookup still says applied", async () => {
    const server = await startServer({ honourIdempotencyKey: false });
    server.seed("ticket", "T-1", { tags: [] });
    const sor = adapterFor(server.url, { idempotencyKeys: false });
    await sor.patch(T1, addTag("a"), { ifMatch: '"v1"', idempotencyKey: "twice", timeoutMs: 5000 });
    await sor.patch(T1, addTag("a"), { ifMatch: '"v2"', idempotencyKey: "twice", timeoutMs: 5000 });
    expect(server.stats().writesByKey.twice).toBe(2);
    expect(await sor.lookupIdempotencyKey?.(T1, "twice", quick)).toBe("applied");
  });
});

describe("http adapter: Retry-After", () => {
  const opts = { ifMatch: '"7"', idempotencyKey: "k", timeoutMs: 5000 };
  /** An endpoint answering every request `status` with these headers (a problem body). */
  const answering = (status: number, headers: Record<string, string>) =>
    stub((_req, res) => res.writeHead(status, { "content-type": "application/problem+json", ...headers }).end('{"title":"slow down"}'));

  it("a read's 429 with Retry-After: 2 is a retriable sor_unavailable carrying retryAfterMs 2000", async () => {
    const { url } = await answering(429, { "retry-after": "2" });
    await expect(adapterFor(url).read(T1, quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true, context: { status: 429, retryAfterMs: 2000 } });
  });

  it("a write's 429 or 408 is unavailable with the wait; a 503's is kept on its unknown outcome", async () => {
    for (const status of [429, 408]) {
      const { url } = await answering(status, { "retry-after": "2" });
      expect(await adapterFor(url).patch(T1, addTag("a"), opts)).toMatchObject({ kind: "unavailable", retryAfterMs: 2000 });
    }
    const { url } = await answering(503, { "retry-after": new Date(Date.now() + 30_000).toUTCString() });
    const outcome = await adapterFor(url).patch(T1, addTag("a"), opts);
    expect(outcome.kind).toBe("unknown");
    // An HTTP-date is whole seconds from now: between 29 and 30 s once it arrives.
    expect(outcome.kind === "unknown" ? outcome.retryAfterMs : undefined).toBeGreaterThan(28_000);
    expect(outcome.kind === "unknown" ? outcome.retryAfterMs : undefined).toBeLessThanOrEqual(30_000);
    const created = await adapterFor(url).upsertByExternalId({ type: "account", id: "x" }, {}, { ifNoneMatch: "*", idempotencyKey: "c", timeoutMs: 5000 });
    expect(created).toMatchObject({ kind: "unknown", retryAfterMs: expect.any(Number) });
  });

  it("an idempotency-key lookup's 503 carries the wait on its sor_unavailable", async () => {
    const { url } = await answering(503, { "retry-after": "5" });
    await expect(adapterFor(url).lookupIdempotencyKey!(T1, "k-1", quick)).rejects.toMatchObject({ code: "sor_unavailable", context: { retryAfterMs: 5000 } });
  });

  it("a Retry-After that is no wait (garbage, negative, oversize) is left out; on a refusal or a success it means nothing", async () => {
    for (const value of ["soon", "-1", "9".repeat(65)]) {
      const { url } = await answering(429, { "retry-after": value });
      const outcome = await adapterFor(url).patch(T1, addTag("a"), opts);
      expect(outcome).toMatchObject({ kind: "unavailable" });
      expect(outcome).not.toHaveProperty("retryAfterMs");
      const err = await adapterFor(url).read(T1, quick).catch((e: unknown) => e as WritError);
      expect(err).toMatchObject({ code: "sor_unavailable" });
      expect((err as WritError).context).not.toHaveProperty("retryAfterMs");
    }
    const refused = await answering(400, { "retry-after": "2" });
    expect(await adapterFor(refused.url).patch(T1, addTag("a"), opts)).toEqual({ kind: "rejected", status: 400, message: "slow down" });
  });

  it("the header's text goes into no message, only the wait", async () => {
    const { url } = await answering(503, { "retry-after": "Sun, 06 Nov 2033 08:49:37 GMT" });
    const err = (await adapterFor(url).read(T1, quick).catch((e: unknown) => e)) as WritError;
    expect(err.context.retryAfterMs).toBeGreaterThan(0);
    expect(JSON.stringify(err)).not.toMatch(/2033|Nov/);
  });
});
