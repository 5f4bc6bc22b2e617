// The HTTP adapter's API-shape options (issue 11, part 5): body shape, method and
// path of a write, where state and version are, how If-Match is sent, which
// statuses are conflicts, headers from a function, and no header value in an
// error. Local node:http endpoints only; no broker.
import jsonpatch from "fast-json-patch";
import type { Operation } from "fast-json-patch";
import type { ServerResponse } from "node:http";
import { describe, expect, it } from "vitest";
import { WritError } from "../../../src/errors.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import type { HttpSystemOfRecordOptions } from "../../../src/sor/http-adapter.ts";
import { json, startStub } from "../../helpers/http-stub.ts";

const C1 = { type: "contact", id: "C-1" };
const quick = { timeoutMs: 5000 };
const addTag = (tag: string): JsonPatchOp[] => [{ op: "add", path: "/tags/-", value: tag }];
const write = (ifMatch: string, idempotencyKey = "k-1") => ({ ifMatch, idempotencyKey, timeoutMs: 5000 });

function sor(baseUrl: string, opts: Partial<HttpSystemOfRecordOptions> = {}) {
  return createHttpSystemOfRecord({ name: "crm", baseUrl, ...opts });
}

/** A record answered as `{ data, meta: { version } }`, with an ETag too where asked. */
function wrappedRecord(res: ServerResponse, data: unknown, version: unknown, headers: Record<string, string> = {}) {
  json(res, 200, { data, meta: { version } }, headers);
}

/** Every string a thrown error or an outcome shows: message, JSON and context. */
function shown(value: unknown): string {
  if (value instanceof WritError) return `${value.message} ${JSON.stringify(value)} ${JSON.stringify(value.toJSON())}`;
  if (value instanceof Error) return `${value.message} ${JSON.stringify(value)}`;
  return JSON.stringify(value);
}

async function caught(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error("expected a rejection");
}

describe("http adapter shapes: the body, method and path of a write", () => {
  it("default: the bare JSON Patch array as application/json-patch+json, PATCH to recordPath", async () => {
    const api = await startStub((_req, res) => json(res, 200, { tags: ["a"] }, { etag: '"2"' }));
    await sor(api.url).patch(C1, addTag("a"), write('"1"'));
    expect(api.seen[0]).toMatchObject({ method: "PATCH", path: "/records/contact/C-1", headers: { "content-type": "application/json-patch+json" } });
    expect(JSON.parse(api.seen[0]!.body)).toEqual(addTag("a"));
  });

  it("wrapped: { ...extra, [field]: ops } as application/json, or the content type given", async () => {
    const api = await startStub((_req, res) => json(res, 200, { tags: ["a"] }, { etag: '"2"' }));
    await sor(api.url, { patchBody: { kind: "wrapped", field: "ops", extra: { validateOnly: false, source: { via: "writ" } } } }).patch(C1, addTag("a"), write('"1"'));
    expect(api.seen[0]!.headers["content-type"]).toBe("application/json");
    expect(JSON.parse(api.seen[0]!.body)).toEqual({ validateOnly: false, source: { via: "writ" }, ops: addTag("a") });
    await sor(api.url, { patchBody: { kind: "wrapped", field: "patch", contentType: "application/vnd.crm+json; charset=utf-8" } }).patch(C1, addTag("b"), write('"1"'));
    expect(api.seen[1]!.headers["content-type"]).toBe("application/vnd.crm+json; charset=utf-8");
    expect(JSON.parse(api.seen[1]!.body)).toEqual({ patch: addTag("b") });
  });

  it("json-patch with another content type; POST to a patchPath, URI-encoded", async () => {
    const api = await startStub((_req, res) => json(res, 200, { tags: [] }, { etag: '"2"' }));
    const system = sor(api.url + "/api/v3", {
      method: "POST",
      patchPath: "/{type}/{id}/patch",
      patchBody: { kind: "json-patch", contentType: "application/json" },
    });
    await system.patch({ type: "contact", id: "a/b c" }, addTag("a"), write('"1"'));
    await system.read({ type: "contact", id: "a/b c" }, quick);
    expect(api.seen.map((r) => `${r.method} ${r.path} ${r.headers["content-type"] ?? ""}`)).toEqual([
      "POST /api/v3/contact/a%2Fb%20c/patch application/json",
      "GET /api/v3/records/contact/a%2Fb%20c ",
    ]);
  });
});

describe("http adapter shapes: where state and version are", () => {
  it("state and version by JSON Pointer: a number version is carried as its JSON text", async () => {
    const api = await startStub((_req, res) => wrappedRecord(res, { name: "Ada" }, 7));
    const system = sor(api.url, { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" } });
    expect(await system.read(C1, quick)).toEqual({ state: { name: "Ada" }, version: "7" });
  });

  it("pointer tokens are unescaped (~1 is /, ~0 is ~) and index arrays", async () => {
    const api = await startStub((_req, res) => json(res, 200, { "a/b": [{ "m~n": { rev: "3-abc" } }], items: [{ v: 1 }] }));
    const system = sor(api.url, { state: { pointer: "/items/0" }, version: { from: "body", pointer: "/a~1b/0/m~0n/rev" } });
    expect(await system.read(C1, quick)).toEqual({ state: { v: 1 }, version: "3-abc" });
  });

  it("a version beyond 2^53 keeps its digits, and goes back as sent", async () => {
    const big = "12345678901234567890";
    const api = await startStub((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end(`{"data":{"n":1},"meta":{"version":${big}}}`));
    const system = sor(api.url, { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" }, ifMatch: { format: "raw" } });
    const fresh = await system.read(C1, quick);
    expect(fresh?.version).toBe(big);
    expect(await system.patch(C1, addTag("a"), write(fresh!.version))).toEqual({ kind: "applied", state: { n: 1 }, version: big });
    expect(api.seen[1]!.headers["if-match"]).toBe(big);
  });

  it("the version goes back as an entity tag by default, raw or in another header when asked", async () => {
    const api = await startStub((_req, res) => wrappedRecord(res, { n: 1 }, 8));
    const body = { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" } } as const;
    await sor(api.url, body).patch(C1, addTag("a"), write("7"));
    await sor(api.url, { ...body, ifMatch: { format: "raw" } }).patch(C1, addTag("a"), write("7"));
    await sor(api.url, { ...body, ifMatch: { header: "X-Expected-Version", format: "raw" } }).patch(C1, addTag("a"), write("7"));
    expect(api.seen.map((r) => [r.headers["if-match"], r.headers["x-expected-version"]])).toEqual([
      ['"7"', undefined],
      ["7", undefined],
      [undefined, "7"],
    ]);
  });

  it("a body version that already is an entity tag (an OData @odata.etag) is sent as it is, weak or not", async () => {
    const api = await startStub((_req, res) => json(res, 200, { "@odata.etag": 'W/"4711"', name: "Ada" }));
    const system = sor(api.url, { version: { from: "body", pointer: "/@odata.etag" } });
    const fresh = await system.read(C1, quick);
    expect(fresh).toEqual({ state: { "@odata.etag": 'W/"4711"', name: "Ada" }, version: 'W/"4711"' });
    await system.patch(C1, addTag("a"), write(fresh!.version));
    expect(api.seen[1]!.headers["if-match"]).toBe('W/"4711"');
  });

  it("an answer that breaks the shape is a non-retriable sor_protocol naming what is wrong", async () => {
    const answers: Array<[string, string]> = [
      ["not json", "application/json"],
      ['{"data":{}}', "application/json"],
      ['{"data":{},"meta":{"version":true}}', "application/json"],
      ['{"data":{},"meta":{"version":""}}', "application/json"],
      [JSON.stringify({ data: {}, meta: { version: "v".repeat(257) } }), "application/json"],
      ['{"meta":{"version":3}}', "application/json"],
      ['{"data":{},"meta":{"version":"has space"}}', "application/json"],
    ];
    const api = await startStub((_req, res) => {
      const [body, type] = answers[Math.min(api.seen.length - 1, answers.length - 1)]!;
      res.writeHead(200, { "content-type": type }).end(body);
    });
    const system = sor(api.url, { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" } });
    const messages: string[] = [];
    for (let i = 0; i < answers.length; i++) {
      const err = await caught(system.read(C1, quick));
      expect(err).toMatchObject({ code: "sor_protocol", retriable: false });
      messages.push((err as Error).message);
    }
    expect(messages[0]).toMatch(/not JSON/);
    expect(messages[1]).toMatch(/no version at \/meta\/version/);
    expect(messages[2]).toMatch(/is a boolean; it must be a string or a number/);
    expect(messages[3]).toMatch(/empty/);
    expect(messages[4]).toMatch(/257 characters long; writ carries at most 256/);
    expect(messages[5]).toMatch(/nothing at \/data/);
    expect(messages[6]).toMatch(/cannot be sent as an entity tag.*"raw"/);
    // Raw, the same version is fine: a space inside is a valid header value.
    const raw = sor(api.url, { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" }, ifMatch: { format: "raw" } });
    expect(await raw.read(C1, quick)).toEqual({ state: {}, version: "has space" });
  });

  it("a state pointer into a body that is not JSON is sor_protocol with ETags too", async () => {
    const api = await startStub((_req, res) => res.writeHead(200, { etag: '"1"', "content-type": "text/html" }).end("<html></html>"));
    await expect(sor(api.url, { state: { pointer: "/data" } }).read(C1, quick)).rejects.toMatchObject({ code: "sor_protocol", message: /not JSON/ });
  });

  it("a body nested past 256 levels is sor_protocol with a reason, for a read and for a write's answer", async () => {
    // 3,000 levels and a fractional body version: its exact digits come from a reparse that would recurse.
    const deep = `{"version":1.5,"x":${"[".repeat(3000)}${"]".repeat(3000)}}`;
    const api = await startStub((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end(deep));
    const system = sor(api.url, { version: { from: "body", pointer: "/version" } });
    await expect(system.read(C1, quick)).rejects.toMatchObject({ code: "sor_protocol", retriable: false, message: /nested deeper than 256 levels/ });
    // The write's 2xx answer cannot be read, nor can the re-read: an unknown outcome, for reconcile.
    expect(await system.patch(C1, addTag("a"), write("1.5"))).toMatchObject({ kind: "unknown", message: /nested deeper than 256 levels.*re-read failed/ });
    // 256 levels are carried.
    const fine = await startStub((_req, res) => res.writeHead(200, { "content-type": "application/json" }).end(`{"version":1.5,"x":${"[".repeat(255)}${"]".repeat(255)}}`));
    expect(await sor(fine.url, { version: { from: "body", pointer: "/version" } }).read(C1, quick)).toMatchObject({ version: "1.5" });
  });

  it("an ETag over 256 characters is sor_protocol", async () => {
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: `"${"e".repeat(300)}"` }));
    await expect(sor(api.url).read(C1, quick)).rejects.toMatchObject({ code: "sor_protocol", message: /302 characters long/ });
  });
});

describe("http adapter shapes: conflictStatuses", () => {
  const bodyVersion = { state: { pointer: "/data" }, version: { from: "body", pointer: "/meta/version" }, ifMatch: { format: "raw" } } as const;

  it("by default a 409 is rejected, as before", async () => {
    const api = await startStub((_req, res) => json(res, 409, { title: "conflict" }));
    expect(await sor(api.url).patch(C1, addTag("a"), write('"1"'))).toEqual({ kind: "rejected", status: 409, message: "conflict" });
  });

  it("a listed 409 that carries the current record is precondition_failed with it", async () => {
    const api = await startStub((_req, res) => json(res, 409, { data: { n: 2 }, meta: { version: 9 } }));
    expect(await sor(api.url, { ...bodyVersion, conflictStatuses: [409], conflictAnswer: "record" }).patch(C1, addTag("a"), write("7"))).toEqual({
      kind: "precondition_failed",
      current: { state: { n: 2 }, version: "9" },
    });
  });

  it("a listed 409 without a record: a read tells a stale version (conflict) from another refusal (rejected)", async () => {
    let version = 7;
    const api = await startStub((req, res) => {
      if (req.method === "GET") return wrappedRecord(res, { n: version }, version);
      json(res, 409, { error: { code: "conflict", message: "cannot apply" } });
    });
    const system = sor(api.url, { ...bodyVersion, conflictStatuses: [409, 412] });
    expect(await system.patch(C1, addTag("a"), write("7"))).toMatchObject({ kind: "rejected", status: 409, message: expect.stringContaining("cannot apply") });
    version = 8;
    expect(await system.patch(C1, addTag("a"), write("7"))).toEqual({ kind: "precondition_failed", current: { state: { n: 8 }, version: "8" } });
  });

  it("a listed 409 on a record since deleted is not_found; a 412 stays a conflict without a read", async () => {
    const api = await startStub((req, res) => {
      if (req.method === "GET") return json(res, 404, { title: "gone" });
      json(res, api.seen.length === 1 ? 409 : 412, { title: "stale" });
    });
    const system = sor(api.url, { ...bodyVersion, conflictStatuses: [409, 412] });
    expect(await system.patch(C1, addTag("a"), write("7"))).toEqual({ kind: "not_found" });
    expect(await system.patch(C1, addTag("a"), write("7"))).toEqual({ kind: "precondition_failed", current: null });
    expect(api.seen.map((r) => r.method)).toEqual(["PATCH", "GET", "PATCH"]);
  });
});

describe("http adapter shapes: headers from a function", () => {
  it("is called before every request, so a refreshed token is used", async () => {
    let token = 0;
    const api = await startStub((req, res) => (req.method === "GET" ? json(res, 200, { n: 1 }, { etag: '"1"' }) : json(res, 200, { n: 2 }, { etag: '"2"' })));
    const system = sor(api.url, {
      idempotencyLookupPath: "/keys/{key}",
      headers: async () => {
        token++;
        await new Promise((r) => setTimeout(r, 1));
        return { authorization: `Bearer token-${token}`, "x-tenant": "acme" };
      },
    });
    await system.read(C1, quick);
    await system.patch(C1, addTag("a"), write('"1"'));
    await system.lookupIdempotencyKey!(C1, "k-1", quick);
    expect(api.seen.map((r) => r.headers.authorization)).toEqual(["Bearer token-1", "Bearer token-2", "Bearer token-3"]);
    expect(api.seen.every((r) => r.headers["x-tenant"] === "acme")).toBe(true);
    // A synchronous function works too.
    const sync = sor(api.url, { headers: () => ({ authorization: "Bearer sync" }) });
    await sync.read(C1, quick);
    expect(api.seen.at(-1)!.headers.authorization).toBe("Bearer sync");
  });

  it("writ's own headers win over the function's", async () => {
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: '"2"' }));
    await sor(api.url, { headers: () => ({ "if-match": "x", "content-type": "text/plain" }) }).patch(C1, addTag("a"), write('"1"'));
    expect(api.seen[0]!.headers).toMatchObject({ "if-match": '"1"', "content-type": "application/json-patch+json" });
  });

  it("a function that throws: nothing sent; read and lookup throw a retriable sor_unavailable, patch is unavailable", async () => {
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: '"1"' }));
    const system = sor(api.url, { idempotencyLookupPath: "/keys/{key}", headers: () => Promise.reject(new Error("token endpoint down")) });
    await expect(system.read(C1, quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true, message: /headers function failed: token endpoint down/ });
    await expect(system.lookupIdempotencyKey!(C1, "k", quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true });
    expect(await system.patch(C1, addTag("a"), write('"1"'))).toMatchObject({ kind: "unavailable", message: expect.stringMatching(/headers function failed/) });
    expect(api.seen).toHaveLength(0);
  });

  it("a function that never answers is bounded by the request's deadline", async () => {
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: '"1"' }));
    const system = sor(api.url, { headers: () => new Promise<Record<string, string>>(() => {}) });
    const started = Date.now();
    await expect(system.read(C1, { timeoutMs: 150 })).rejects.toMatchObject({ code: "sor_unavailable", message: /gave no answer within 150 ms/ });
    expect(await system.patch(C1, addTag("a"), { ...write('"1"'), timeoutMs: 150 })).toMatchObject({ kind: "unavailable" });
    expect(Date.now() - started).toBeLessThan(3000);
    expect(api.seen).toHaveLength(0);
  });

  it("a function that answers a bad header: read is sor_protocol, write rejected, naming the header, never its value", async () => {
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: '"1"' }));
    const cases: Array<[unknown, RegExp]> = [
      [{ authorization: "Bearer sk-live-0123456789\r\nx-evil: 1" }, /header "authorization" has a value that is not a valid header value/],
      [{ authorization: 42 }, /header "authorization" must be a string/],
      [{ "bad name": "sk-live-0123456789" }, /header "bad name" is not a valid header name/],
      [null, /it must be an object of header values/],
      // undici refuses these when the request is made: it was taken for an outage (read retried for ever), nothing sent.
      [{ authorization: "Bearer sk-live-0123456789", expect: "100-continue" }, /header "expect" is set by the HTTP client itself/],
      [{ authorization: "Bearer sk-live-0123456789", "Transfer-Encoding": "chunked" }, /header "Transfer-Encoding" is set by the HTTP client itself/],
    ];
    for (const [answer, message] of cases) {
      const system = sor(api.url, { headers: () => answer as Record<string, string> });
      const err = await caught(system.read(C1, quick));
      expect(err).toMatchObject({ code: "sor_protocol", retriable: false, message });
      expect(shown(err)).not.toContain("sk-live");
      // The same answer comes next time: a write is refused, not an outage retried for ever.
      const outcome = await system.patch(C1, addTag("a"), write('"1"'));
      expect(outcome).toMatchObject({ kind: "rejected", status: 0, message });
      expect(shown(outcome)).not.toContain("sk-live");
    }
    expect(api.seen).toHaveLength(0);
  });
});

describe("http adapter shapes: an answer over maxResponseBytes", () => {
  it("is cut off, never buffered whole: a read is sor_protocol, a write an unknown outcome for reconcile", async () => {
    // 4 MiB of JSON where 1 KiB is allowed.
    const api = await startStub((_req, res) => json(res, 200, { pad: "x".repeat(4 * 1024 * 1024) }, { etag: '"1"' }));
    const system = sor(api.url, { maxResponseBytes: 1024 });
    const readErr = await caught(system.read(C1, quick));
    expect(readErr).toMatchObject({ code: "sor_protocol", retriable: false, message: /over 1024 bytes \(maxResponseBytes\)/ });
    expect(await system.patch(C1, addTag("a"), write('"1"'))).toMatchObject({ kind: "unknown", message: /over 1024 bytes/ });
    // The same answers under the default bound are read whole.
    expect(await sor(api.url).read(C1, quick)).toMatchObject({ version: '"1"' });
  });

  it("headers over Node's limit are an answer writ cannot use: a read is sor_protocol (no longer an outage retried for ever), a write unknown", async () => {
    // A 64 KiB cookie on every answer: undici stops at http.maxHeaderSize (16 KiB); asking again gets the same.
    const api = await startStub((_req, res) => json(res, 200, {}, { etag: '"1"', "set-cookie": `s=${"x".repeat(64 * 1024)}` }));
    const system = sor(api.url, { idempotencyLookupPath: "/keys/{key}" });
    expect(await caught(system.read(C1, quick))).toMatchObject({ code: "sor_protocol", retriable: false, message: /headers are over/ });
    expect(await caught(system.lookupIdempotencyKey!(C1, "k-1", quick))).toMatchObject({ code: "sor_protocol", retriable: false });
    // The write reached the system, which answered: whether it applied is for reconcile.
    expect(await system.patch(C1, addTag("a"), write('"1"'))).toMatchObject({ kind: "unknown", message: /headers are over/ });
    expect(api.seen.filter((r) => r.method === "PATCH")).toHaveLength(1);
  });

  it("is a bound checked at start", () => {
    expect(() => createHttpSystemOfRecord({ name: "crm", baseUrl: "http://x", maxResponseBytes: 10 } as HttpSystemOfRecordOptions)).toThrow(/maxResponseBytes/);
  });
});

describe("http adapter shapes: no header value in an error", () => {
  const SECRET = "sk-live-9f8e7d6c5b4a";

  /** A read and a write the server answers 401: all each shows. */
  async function refusedShown(system: ReturnType<typeof sor>): Promise<string[]> {
    const readErr = await caught(system.read(C1, quick));
    expect(readErr).toMatchObject({ code: "sor_protocol" });
    const outcome = await system.patch(C1, addTag("a"), write('"1"'));
    expect(outcome).toMatchObject({ kind: "rejected", status: 401 });
    return [shown(readErr), shown(outcome)];
  }

  it("a server that echoes the token: messages of read, patch and lookup carry [redacted] instead", async () => {
    const api = await startStub((req, res) => {
      const echoed = `invalid credentials: ${String(req.headers.authorization)} / ${String(req.headers["x-api-key"])}`;
      res.writeHead(req.method === "GET" && req.path.startsWith("/keys") ? 503 : 401, { "content-type": "text/plain" }).end(echoed);
    });
    for (const headers of [{ authorization: `Bearer ${SECRET}`, "x-api-key": `${SECRET}-2` }, () => ({ authorization: `Bearer ${SECRET}`, "x-api-key": `${SECRET}-2` })]) {
      const system = sor(api.url, { headers, idempotencyLookupPath: "/keys/{key}" });
      const readErr = await caught(system.read(C1, quick));
      expect(readErr).toMatchObject({ code: "sor_protocol" });
      expect((readErr as Error).message).toContain("[redacted]");
      const lookupErr = await caught(system.lookupIdempotencyKey!(C1, "k", quick));
      expect(lookupErr).toMatchObject({ code: "sor_unavailable" });
      const outcome = await system.patch(C1, addTag("a"), write('"1"'));
      expect(outcome).toMatchObject({ kind: "rejected", status: 401 });
      for (const shownValue of [shown(readErr), shown(lookupErr), shown(outcome), shown(system.config)]) {
        expect(shownValue).not.toContain(SECRET);
      }
    }
  });

  it("a token the answer quotes across the message's cut, and a short key: neither shows, not even in part", async () => {
    const long = `sk-live-${"0123456789abcdef".repeat(4)}`;
    const short = "k9Z2x7";
    const api = await startStub((req, res) => {
      // Plain JSON, not a problem: the message is the start of the body, cut at 200 characters, with the token across the cut.
      const error = `key ${String(req.headers["x-api-key"])} ${"x".repeat(170)} ${String(req.headers.authorization)}`;
      json(res, 401, { error });
    });
    for (const text of await refusedShown(sor(api.url, { headers: { authorization: `Bearer ${long}`, "x-api-key": short } }))) {
      expect(text).toContain("key [redacted] xxx");
      expect(text).not.toContain(short);
      expect(text).not.toContain(long.slice(0, 12));
    }
  });

  it("a token the answer echoes escaped (\\/ as PHP writes /, \\u002B as .NET writes +) or percent-encoded does not show either", async () => {
    const token = "abc/def+ghi/jkl==";
    // Raw text, so the escapes reach the adapter as each server wrote them.
    const echoes = [
      (sent: string) => `{"error":"bad token ${sent.replaceAll("/", "\\/")}"}`,
      (sent: string) => `{"error":"bad token ${encodeURIComponent(sent)}"}`,
      (sent: string) => `{"error":"bad token ${sent.replaceAll("+", "\\u002B")}"}`,
      (sent: string) => `{"error":"bad token ${encodeURIComponent(sent).replace(/%[0-9A-F]{2}/g, (e) => e.toLowerCase())}"}`,
    ];
    let next = 0;
    const api = await startStub((req, res) => {
      res.writeHead(401, { "content-type": "application/json" }).end(echoes[next++ % echoes.length]!(String(req.headers.authorization)));
    });
    const system = sor(api.url, { headers: { authorization: `Bearer ${token}` } });
    for (const text of [...(await refusedShown(system)), ...(await refusedShown(system))]) {
      expect(text).toContain("[redacted]");
      for (const part of ["def+ghi", "def%2Bghi", "def%2bghi", "def\\u002Bghi", "def\\/"]) expect(text).not.toContain(part);
    }
  });

  it("config errors name the field, never a header value or a key", () => {
    const attempts: unknown[] = [
      { name: "crm", baseUrl: "http://x", headers: { authorization: `Bearer ${SECRET}\n` } },
      { name: "crm", baseUrl: "http://x", headers: { authorization: `Bearer ${SECRET}` }, bogus: true },
      { name: "crm", baseUrl: "http://x", headers: { authorization: `Bearer ${SECRET}` }, state: { pointer: "data" } },
      { name: "crm", baseUrl: "https://x", tls: { cert: `-----BEGIN CERTIFICATE-----\n${SECRET}\n-----END CERTIFICATE-----`, key: SECRET } },
    ];
    const fields: string[] = [];
    for (const opts of attempts) {
      let err: unknown;
      try {
        createHttpSystemOfRecord(opts as HttpSystemOfRecordOptions);
      } catch (e) {
        err = e;
      }
      expect(err).toBeInstanceOf(WritError);
      expect(shown(err)).not.toContain(SECRET);
      fields.push((err as WritError).context.field as string);
    }
    expect(fields).toEqual(["headers.authorization", "(options)", "state.pointer", "tls"]);
  });
});

// ---------------------------------------------------------------------------
// Two API shapes modelled on real ones.

/** Apply ops to a copy; throws on a failed `test` op or a bad path. */
function applied(doc: unknown, ops: Operation[]): unknown {
  return jsonpatch.applyPatch(structuredClone(doc), ops, true, false).newDocument;
}

describe("http adapter shapes: a CRM that wraps records and versions them in the body", () => {
  /**
   * GET /v2/contacts/{id} → `{ data, meta: { version } }`; PATCH takes
   * `{ ops: [...] }` with `If-Match: <version>` and answers 409 on a mismatch
   * (and on a failed `test` op, with the version unchanged).
   */
  async function crm() {
    const records = new Map<string, { data: unknown; version: number }>([["C-1", { data: { name: "Ada", tags: [] as string[] }, version: 7 }]]);
    const api = await startStub((req, res) => {
      const m = /^\/v2\/contacts\/([^/?]+)$/.exec(req.path);
      const rec = m ? records.get(decodeURIComponent(m[1]!)) : undefined;
      if (rec === undefined) return json(res, 404, { error: { code: "not_found" } });
      if (req.method === "GET") return json(res, 200, { data: rec.data, meta: { version: rec.version } });
      if (req.method !== "PATCH") return json(res, 405, { error: { code: "method_not_allowed" } });
      if (req.headers["if-match"] !== String(rec.version)) return json(res, 409, { error: { code: "version_mismatch", message: "the record has changed" } });
      const { ops } = JSON.parse(req.body) as { ops: Operation[] };
      try {
        rec.data = applied(rec.data, ops);
      } catch {
        return json(res, 409, { error: { code: "patch_failed", message: "a test operation failed" } });
      }
      rec.version++;
      json(res, 200, { data: rec.data, meta: { version: rec.version } });
    });
    const system = sor(api.url, {
      recordPath: "/v2/{type}s/{id}",
      patchBody: { kind: "wrapped", field: "ops" },
      state: { pointer: "/data" },
      version: { from: "body", pointer: "/meta/version" },
      ifMatch: { header: "If-Match", format: "raw" },
      conflictStatuses: [409, 412],
    });
    return { api, records, system };
  }

  it("read, write, conflict on a stale version, rejection of a failed test op", async () => {
    const { api, records, system } = await crm();
    const fresh = await system.read(C1, quick);
    expect(fresh).toEqual({ state: { name: "Ada", tags: [] }, version: "7" });
    expect(await system.patch(C1, addTag("vip"), write(fresh!.version))).toEqual({ kind: "applied", state: { name: "Ada", tags: ["vip"] }, version: "8" });
    const sent = api.seen.at(-1)!;
    expect(sent.headers).toMatchObject({ "if-match": "7", "content-type": "application/json", "idempotency-key": "k-1" });
    expect(JSON.parse(sent.body)).toEqual({ ops: addTag("vip") });
    // Someone else writes: version 9. Our write conditional on 8 is a conflict with the current record.
    records.get("C-1")!.data = { name: "Ada L.", tags: ["vip"] };
    records.get("C-1")!.version = 9;
    expect(await system.patch(C1, addTag("late"), write("8", "k-2"))).toEqual({
      kind: "precondition_failed",
      current: { state: { name: "Ada L.", tags: ["vip"] }, version: "9" },
    });
    // A failed test op is a 409 too, but the version has not moved: rejected, not a conflict.
    expect(await system.patch(C1, [{ op: "test", path: "/name", value: "Bob" }], write("9", "k-3"))).toMatchObject({ kind: "rejected", status: 409 });
    expect(records.get("C-1")!.version).toBe(9);
    expect(await system.patch({ type: "contact", id: "nope" }, addTag("x"), write("1", "k-4"))).toEqual({ kind: "not_found" });
  });
});

describe("http adapter shapes: a helpdesk with ETags that takes writes as POST /records/{id}/patch", () => {
  /**
   * GET /records/{id} → `{ record }` with a strong ETag; POST
   * /records/{id}/patch takes the JSON Patch array as application/json with
   * If-Match, answers 412 with the current record on a mismatch and 202
   * `{ status: "accepted" }` (no record) on success.
   */
  async function helpdesk() {
    const records = new Map<string, { record: unknown; rev: number }>([["T-1", { record: { status: "open", tags: [] as string[] }, rev: 3 }]]);
    const etag = (rev: number) => `"r${rev}"`;
    const api = await startStub((req, res) => {
      const m = /^\/records\/([^/]+)(\/patch)?$/.exec(req.path);
      const rec = m ? records.get(decodeURIComponent(m[1]!)) : undefined;
      if (rec === undefined) return json(res, 404, { error: "RecordNotFound" });
      if (req.method === "GET" && m![2] === undefined) return json(res, 200, { record: rec.record }, { etag: etag(rec.rev) });
      if (req.method !== "POST" || m![2] === undefined) return json(res, 405, { error: "MethodNotAllowed" });
      if (req.headers["content-type"] !== "application/json") return json(res, 415, { error: "UnsupportedMediaType" });
      if (req.headers["if-match"] !== etag(rec.rev)) return json(res, 412, { record: rec.record }, { etag: etag(rec.rev) });
      rec.record = applied(rec.record, JSON.parse(req.body) as Operation[]);
      rec.rev++;
      json(res, 202, { status: "accepted" });
    });
    const system = sor(api.url, {
      recordPath: "/records/{id}",
      patchPath: "/records/{id}/patch",
      method: "POST",
      patchBody: { kind: "json-patch", contentType: "application/json" },
      state: { pointer: "/record" },
      conflictAnswer: "record",
    });
    return { api, records, system };
  }

  it("read, write (state and version from a follow-up read), 412 with the current record", async () => {
    const { api, records, system } = await helpdesk();
    const T1 = { type: "ticket", id: "T-1" };
    const fresh = await system.read(T1, quick);
    expect(fresh).toEqual({ state: { status: "open", tags: [] }, version: '"r3"' });
    expect(await system.patch(T1, addTag("refund"), write(fresh!.version))).toEqual({ kind: "applied", state: { status: "open", tags: ["refund"] }, version: '"r4"' });
    expect(api.seen.slice(1).map((r) => `${r.method} ${r.path}`)).toEqual(["POST /records/T-1/patch", "GET /records/T-1"]);
    expect(api.seen[1]!.headers["if-match"]).toBe('"r3"');
    records.get("T-1")!.record = { status: "closed", tags: ["refund"] };
    records.get("T-1")!.rev = 5;
    expect(await system.patch(T1, addTag("late"), write('"r4"', "k-2"))).toEqual({
      kind: "precondition_failed",
      current: { state: { status: "closed", tags: ["refund"] }, version: '"r5"' },
    });
  });
});
