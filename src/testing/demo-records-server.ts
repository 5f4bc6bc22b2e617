import { createServer } from "node:http";
import type { IncomingMessage, ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import jsonpatch from "fast-json-patch";
import type { Operation } from "fast-json-patch";
import { z } from "zod";
import { WritError } from "../errors.ts";
import type { Versioned } from "../schemas/common.ts";
import {
  HttpProblem,
  etagsIn,
  header,
  ifMatchSatisfied,
  mediaType,
  parseJsonBody,
  readBody,
  readJson,
  sendJson,
  sendProblem,
  sendRecord,
} from "./demo-records-http.ts";
import { listen } from "../listen.ts";
import { DemoRecordsStore, formatEtag } from "./demo-records-store.ts";
import type { DemoRecordsStats, HistoryEntry, PatchRequestOutcome, PatchRequestRow, PutRequestOutcome, PutRequestRow, StoredRecord } from "./demo-records-store.ts";

export { formatEtag } from "./demo-records-store.ts";
export type { DemoRecordsStats, HistoryEntry, PatchRequestOutcome, PatchRequestRow, PutRequestOutcome, PutRequestRow, WriteKind } from "./demo-records-store.ts";

/**
 * A demo system of record over real HTTP: stands in for a customer's CRM. It
 * speaks RFC 9110 conditional requests (strong ETags `"v<N>"`, If-Match,
 * If-None-Match, 412, 428): a PUT with `If-None-Match: *` creates a record
 * (201) or answers 412 with the one that exists. It dedupes PATCHes and PUTs
 * by Idempotency-Key like Stripe (switchable off; keys are recorded for
 * lookup either way), and takes injected faults so the owner's
 * unknown-outcome paths can be shown.
 *
 * Endpoints: `GET|HEAD|PUT|PATCH /records/:type/:id`, `GET /idempotency-keys/:key`,
 * and under `/_admin/`: `faults` (GET, POST, DELETE), `stats`, `history/:type/:id`,
 * `config` (GET, POST), `reset` (POST), `records/:type/:id` (PUT, an unconditional seed).
 */

/** Which requests a fault hits: by record, and (for writes) by the request's Idempotency-Key. */
const Match = z.object({ type: z.string().optional(), id: z.string().optional(), idempotencyKey: z.string().optional() }).strict();
const times = z.number().int().positive();
const delayMs = z.number().int().nonnegative();
/** Which writes a commit fault hits: `PATCH` (the default) or `PUT` (creates and replaces). */
const method = z.enum(["PATCH", "PUT"]).optional();

/** An injected fault; each fires `times` times on matching requests, then is gone. */
export const DemoFault = z.discriminatedUnion("kind", [
  /** Commit the PATCH (or the PUT, with `method: "PUT"`), then answer only after `delayMs` (past the client's deadline). */
  z.object({ kind: z.literal("commit-then-delay"), delayMs, times: times.default(1), match: Match.optional(), method }).strict(),
  /** Commit the PATCH (or the PUT, with `method: "PUT"`), then destroy the socket without answering. */
  z.object({ kind: z.literal("commit-then-drop"), times: times.default(1), match: Match.optional(), method }).strict(),
  /** Answer 412 (with the current state) without applying. */
  z.object({ kind: z.literal("412-storm"), times, match: Match.optional() }).strict(),
  /** Refuse the PATCH with 422 (a business rule of the system, `problem` its type) without applying it. */
  z.object({ kind: z.literal("refuse-write"), times: times.default(1), match: Match.optional(), problem: z.string().min(1).max(64).default("business-rule") }).strict(),
  /** Answer GET/HEAD of a record after `delayMs`; the state is read on arrival, so it may be stale on delivery. */
  z.object({ kind: z.literal("slow-read"), delayMs, times: times.default(1), match: Match.optional() }).strict(),
]);
export type DemoFault = z.output<typeof DemoFault>;
export type DemoFaultInput = z.input<typeof DemoFault>;
const DemoFaults = z.array(DemoFault);

export const DemoRecordsConfig = z
  .object({
    /** Answer 428 to writes without If-Match and 412 to a stale one. Default true; false is a careless system (lost updates). */
    enforceIfMatch: z.boolean().default(true),
    /** Replay the stored response for an applied Idempotency-Key. Default true; when false keys are still recorded for lookup. */
    honourIdempotencyKey: z.boolean().default(true),
  })
  .strict();
export type DemoRecordsConfig = z.output<typeof DemoRecordsConfig>;

export const DemoRecordsServerOptions = DemoRecordsConfig.extend({
  /** TCP port; 0 (the default) takes an ephemeral one. */
  port: z.number().int().min(0).max(65535).default(0),
  host: z.string().min(1).default("127.0.0.1"),
  /** SQLite file, or ":memory:" (the default). The folder must exist. */
  dbPath: z.string().min(1).default(":memory:"),
  /**
   * Delay every request under `/records/` and `/idempotency-keys/` by this
   * many ms before it is handled (a slow system of record; `/_admin/` is not
   * delayed). Default 0: no delay.
   */
  latencyMs: z.number().int().nonnegative().default(0),
}).strict();
export type DemoRecordsServerOptions = z.input<typeof DemoRecordsServerOptions>;

/**
 * The running server. Helpers act in-process on the same store and fault list
 * the HTTP API uses (no HTTP round trip), so they are synchronous; the same
 * operations are under `/_admin/` for a server in another process.
 */
export interface DemoRecordsServer {
  /** e.g. `http://127.0.0.1:4010`, no trailing slash. */
  readonly url: string;
  readonly port: number;
  /** Creates or replaces a record unconditionally (a committed write, `kind` create/replace). */
  seed(type: string, id: string, state: unknown): Versioned;
  /** Replaces the pending faults; `[]` clears them. Throws `config_invalid` naming the bad field. */
  setFaults(faults: readonly DemoFaultInput[]): void;
  /** The faults still pending, with their remaining `times`. */
  faults(): DemoFault[];
  stats(): DemoRecordsStats;
  /** The version chain of a record: every committed write, oldest first. */
  history(type: string, id: string): HistoryEntry[];
  /** PATCH requests that reached the server, optionally for one Idempotency-Key. */
  patchRequests(idempotencyKey?: string): PatchRequestRow[];
  /** PUT requests of records (creates, replaces) that reached the server, optionally for one Idempotency-Key. */
  putRequests(idempotencyKey?: string): PutRequestRow[];
  setConfig(config: Partial<DemoRecordsConfig>): DemoRecordsConfig;
  config(): DemoRecordsConfig;
  /** Wipes records, history, keys, PATCH log and faults; config goes back to the start options. */
  reset(): void;
  /** Stops listening, drops open connections (also ones held by a delay fault), closes the DB. */
  close(): Promise<void>;
}

const PATCH_TYPES = new Set(["application/json-patch+json", "application/json"]);

function zodDetail(error: z.ZodError): { field: string; message: string } {
  const issue = error.issues[0];
  return { field: issue?.path.join(".") || "(root)", message: issue?.message ?? "invalid" };
}

/**
 * Starts the demo records server.
 *
 * @example
 * const records = await startDemoRecordsServer({ port: 0 });
 * records.seed("ticket", "T-1", { status: "open", tags: [] });
 * // PATCH `${records.url}/records/ticket/T-1` with If-Match: "v1"
 * await records.close();
 */
export async function startDemoRecordsServer(opts: DemoRecordsServerOptions = {}): Promise<DemoRecordsServer> {
  const parsed = DemoRecordsServerOptions.safeParse(opts);
  if (!parsed.success) {
    const { field, message } = zodDetail(parsed.error);
    throw new WritError("config_invalid", `demo records server option "${field}": ${message}`, {
      retriable: false,
      context: { field },
    });
  }
  const options = parsed.data;
  const store = new DemoRecordsStore(options.dbPath);
  let config: DemoRecordsConfig = { enforceIfMatch: options.enforceIfMatch, honourIdempotencyKey: options.honourIdempotencyKey };
  let faults: DemoFault[] = [];
  const timers = new Set<NodeJS.Timeout>();

  function takeFault<K extends DemoFault["kind"]>(kinds: readonly K[], type: string, id: string, writeMethod: "PATCH" | "PUT" = "PATCH", idempotencyKey?: string) {
    const index = faults.findIndex(
      (f) =>
        (kinds as readonly string[]).includes(f.kind) &&
        (("method" in f ? f.method : undefined) ?? "PATCH") === writeMethod &&
        (f.match?.type === undefined || f.match.type === type) &&
        (f.match?.id === undefined || f.match.id === id) &&
        (f.match?.idempotencyKey === undefined || f.match.idempotencyKey === idempotencyKey),
    );
    const fault = faults[index];
    if (fault === undefined) return undefined;
    faults = fault.times > 1 ? faults.with(index, { ...fault, times: fault.times - 1 }) : faults.toSpliced(index, 1);
    return fault as Extract<DemoFault, { kind: K }>;
  }

  function sleep(ms: number): Promise<void> {
    return new Promise((resolve) => {
      const timer = setTimeout(() => {
        timers.delete(timer);
        resolve();
      }, ms);
      timers.add(timer);
    });
  }

  function seed(type: string, id: string, state: unknown): StoredRecord {
    const current = store.get(type, id);
    return store.commit({
      type,
      id,
      kind: current === undefined ? "create" : "replace",
      fromVersion: current?.version ?? 0,
      state,
    });
  }

  function parseFaults(body: unknown): DemoFault[] {
    // One fault object is taken as a list of one.
    const result = DemoFaults.safeParse(Array.isArray(body) ? body : [body]);
    if (result.success) return result.data;
    const { field, message } = zodDetail(result.error);
    throw new WritError("config_invalid", `fault "${field}": ${message}`, { retriable: false, context: { field } });
  }

  function parseConfig(body: unknown): DemoRecordsConfig {
    const result = DemoRecordsConfig.partial().safeParse(body);
    if (result.success) return { ...config, ...stripUndefined(result.data) };
    const { field, message } = zodDetail(result.error);
    throw new WritError("config_invalid", `config "${field}": ${message}`, { retriable: false, context: { field } });
  }

  /**
   * While dedupe is on, a write whose Idempotency-Key committed before gets the
   * stored answer (true: answered), and one that reuses the key for another
   * request a 422 (thrown). Off, or a new key: false, handle the write.
   */
  function replayed(
    res: ServerResponse,
    key: string | undefined,
    type: string,
    id: string,
    fingerprint: string,
    log: (outcome: "replayed" | "key_reused", status: number) => void,
  ): boolean {
    if (key === undefined || !config.honourIdempotencyKey) return false;
    const stored = store.findIdempotencyKey(key);
    if (stored === undefined) return false;
    if (stored.type !== type || stored.id !== id || stored.fingerprint !== fingerprint) {
      log("key_reused", 422);
      throw new HttpProblem(422, "idempotency-key-reused", "this Idempotency-Key was used with another request");
    }
    log("replayed", stored.status);
    sendJson(res, stored.status, stored.body, { etag: stored.etag, "idempotent-replayed": "true" });
    return true;
  }

  async function handlePatch(req: IncomingMessage, res: ServerResponse, type: string, id: string): Promise<void> {
    const key = header(req, "idempotency-key");
    const ifMatch = header(req, "if-match");
    const owner = header(req, "x-writ-owner")?.slice(0, 128) ?? null;
    const log = (outcome: PatchRequestOutcome, status: number, fault: string | null = null) =>
      store.recordPatchRequest({ idempotencyKey: key ?? null, type, id, ifMatch: ifMatch ?? null, outcome, status, fault, owner });
    if (!PATCH_TYPES.has(mediaType(req))) {
      log("unsupported_media_type", 415);
      throw new HttpProblem(415, "unsupported-media-type", "send application/json-patch+json");
    }
    let ops: unknown;
    try {
      ops = parseJsonBody(await readBody(req));
    } catch (err) {
      log("bad_request", err instanceof HttpProblem ? err.status : 400);
      throw err instanceof HttpProblem ? err : new HttpProblem(400, "malformed-json", "the body is not JSON");
    }
    if (!Array.isArray(ops)) {
      log("invalid_patch", 422);
      throw new HttpProblem(422, "invalid-patch", "a JSON Patch is an array of operations (RFC 6902)");
    }
    const fingerprint = JSON.stringify(ops);
    // Checked before the preconditions, like Stripe: a retry of an applied write gets the first answer, not a 412.
    if (replayed(res, key, type, id, fingerprint, log)) return;
    const current = store.get(type, id);
    if (current === undefined) {
      log("not_found", 404);
      throw new HttpProblem(404, "not-found", `no ${type} ${id}`);
    }
    if (config.enforceIfMatch && ifMatch === undefined) {
      log("precondition_required", 428);
      throw new HttpProblem(428, "precondition-required", "send If-Match with the ETag you read (RFC 6585)");
    }
    const refusal = takeFault(["refuse-write"], type, id, "PATCH", key);
    if (refusal !== undefined) {
      log("refused", 422, "refuse-write");
      throw new HttpProblem(422, refusal.problem, `the ${type} system refuses this change (${refusal.problem})`);
    }
    if (takeFault(["412-storm"], type, id) !== undefined) {
      log("storm_412", 412, "412-storm");
      return sendRecord(res, 412, current);
    }
    if (config.enforceIfMatch && ifMatch !== undefined && !ifMatchSatisfied(ifMatch, current)) {
      log("precondition_failed", 412);
      return sendRecord(res, 412, current);
    }
    let next: unknown;
    try {
      next = jsonpatch.applyPatch(jsonpatch.deepClone(current.state), ops as Operation[], true, true, true).newDocument;
    } catch (err) {
      const failedTest = err instanceof jsonpatch.JsonPatchError && err.name === "TEST_OPERATION_FAILED";
      log(failedTest ? "test_failed" : "invalid_patch", failedTest ? 409 : 422);
      const detail = err instanceof Error ? err.message.split("\n")[0] ?? "invalid patch" : "invalid patch";
      throw failedTest
        ? new HttpProblem(409, "test-failed", detail)
        : new HttpProblem(422, "invalid-patch", detail);
    }
    if (next === undefined) {
      log("invalid_patch", 422);
      throw new HttpProblem(422, "invalid-patch", "the patch removes the whole record");
    }
    const written = store.commit({
      type,
      id,
      kind: "patch",
      fromVersion: current.version,
      state: next,
      ops,
      ...(key === undefined ? {} : { idempotency: { key, fingerprint, status: 200 } }),
    });
    const fault = takeFault(["commit-then-delay", "commit-then-drop"], type, id, "PATCH");
    log("applied", 200, fault?.kind ?? null);
    if (fault?.kind === "commit-then-drop") {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === "commit-then-delay") await sleep(fault.delayMs);
    sendRecord(res, 200, written);
  }

  /**
   * PUT of a whole record: `If-None-Match: *` creates it only if absent (201,
   * else 412 with the record that exists), `If-Match` replaces the version
   * named. An Idempotency-Key is recorded with the write (for lookup), and a
   * repeat of it is answered with the stored response while dedupe is on.
   */
  async function handlePut(req: IncomingMessage, res: ServerResponse, type: string, id: string): Promise<void> {
    const key = header(req, "idempotency-key");
    const ifNoneMatch = header(req, "if-none-match");
    const ifMatch = header(req, "if-match");
    const owner = header(req, "x-writ-owner")?.slice(0, 128) ?? null;
    const log = (outcome: PutRequestOutcome, status: number, fault: string | null = null) =>
      store.recordPutRequest({ idempotencyKey: key ?? null, type, id, ifMatch: ifMatch ?? null, ifNoneMatch: ifNoneMatch ?? null, outcome, status, fault, owner });
    if (mediaType(req) !== "application/json") {
      log("unsupported_media_type", 415);
      throw new HttpProblem(415, "unsupported-media-type", "send application/json");
    }
    let state: unknown;
    try {
      state = parseJsonBody(await readBody(req));
    } catch (err) {
      log("bad_request", err instanceof HttpProblem ? err.status : 400);
      throw err instanceof HttpProblem ? err : new HttpProblem(400, "malformed-json", "the body is not JSON");
    }
    // A PUT's fingerprint never equals a PATCH's: one key is one request, whatever its method.
    const fingerprint = `PUT ${JSON.stringify(state)}`;
    if (replayed(res, key, type, id, fingerprint, log)) return;
    const current = store.get(type, id);
    if (ifNoneMatch !== undefined && current !== undefined) {
      if (ifNoneMatch.trim() === "*" || etagsIn(ifNoneMatch).some((t) => t.tag === formatEtag(current.version))) {
        log("precondition_failed", 412);
        return sendRecord(res, 412, current);
      }
    }
    if (config.enforceIfMatch) {
      if (ifMatch !== undefined && (current === undefined || !ifMatchSatisfied(ifMatch, current))) {
        log("precondition_failed", 412);
        if (current === undefined) throw new HttpProblem(412, "precondition-failed", `no ${type} ${id} to match`);
        return sendRecord(res, 412, current);
      }
      if (current !== undefined && ifMatch === undefined && ifNoneMatch === undefined) {
        log("precondition_required", 428);
        throw new HttpProblem(428, "precondition-required", "send If-Match to replace, or If-None-Match: * to create");
      }
    }
    const status = current === undefined ? 201 : 200;
    const written = store.commit({
      type,
      id,
      kind: current === undefined ? "create" : "replace",
      fromVersion: current?.version ?? 0,
      state,
      ...(key === undefined ? {} : { idempotency: { key, fingerprint, status } }),
    });
    const fault = takeFault(["commit-then-delay", "commit-then-drop"], type, id, "PUT");
    log(current === undefined ? "created" : "replaced", status, fault?.kind ?? null);
    if (fault?.kind === "commit-then-drop") {
      req.socket.destroy();
      return;
    }
    if (fault?.kind === "commit-then-delay") await sleep(fault.delayMs);
    if (current === undefined) res.setHeader("location", `/records/${encodeURIComponent(type)}/${encodeURIComponent(id)}`);
    sendRecord(res, status, written);
  }

  async function route(req: IncomingMessage, res: ServerResponse): Promise<void> {
    const url = new URL(req.url ?? "/", "http://localhost");
    let parts: string[];
    try {
      parts = url.pathname.split("/").slice(1).map(decodeURIComponent);
    } catch {
      throw new HttpProblem(400, "bad-path", "the path is not valid percent-encoding");
    }
    const method = req.method ?? "GET";
    const [a, b, c, d] = parts;
    const allow = (methods: string) => {
      if (!methods.split(", ").includes(method)) {
        res.setHeader("allow", methods);
        throw new HttpProblem(405, "method-not-allowed", `${method} is not allowed here; allowed: ${methods}`);
      }
    };
    if (parts.length === 3 && a === "records" && b && c) {
      allow("GET, HEAD, PUT, PATCH");
      if (method === "PATCH") return handlePatch(req, res, b, c);
      if (method === "PUT") return handlePut(req, res, b, c);
      const record = store.get(b, c);
      const slow = takeFault(["slow-read"], b, c);
      if (slow !== undefined) await sleep(slow.delayMs);
      if (record === undefined) throw new HttpProblem(404, "not-found", `no ${b} ${c}`);
      return sendRecord(res, 200, record, method);
    }
    if (parts.length === 2 && a === "idempotency-keys" && b) {
      allow("GET, HEAD");
      const stored = store.findIdempotencyKey(b);
      if (stored === undefined) throw new HttpProblem(404, "not-found", "no write committed with this Idempotency-Key");
      return sendJson(res, 200, { applied: true, type: stored.type, id: stored.id, version: stored.etag }, {}, method);
    }
    if (a !== "_admin") throw new HttpProblem(404, "not-found", `no route ${url.pathname}`);
    const body = method === "POST" || method === "PUT" ? await readJson(req) : undefined;
    if (parts.length === 2 && b === "faults") {
      allow("GET, POST, DELETE");
      if (method === "POST") faults = parseFaults(body);
      if (method === "DELETE") faults = [];
      return sendJson(res, 200, faults);
    }
    if (parts.length === 2 && b === "stats") {
      allow("GET");
      return sendJson(res, 200, store.stats());
    }
    if (parts.length === 4 && b === "history" && c && d) {
      allow("GET");
      return sendJson(res, 200, store.history(c, d));
    }
    if (parts.length === 2 && b === "config") {
      allow("GET, POST");
      if (method === "POST") config = parseConfig(body);
      return sendJson(res, 200, config);
    }
    if (parts.length === 2 && b === "reset") {
      allow("POST");
      reset();
      return sendJson(res, 200, { reset: true });
    }
    if (parts.length === 4 && b === "records" && c && d) {
      allow("PUT");
      return sendRecord(res, 200, seed(c, d, body));
    }
    throw new HttpProblem(404, "not-found", `no route ${url.pathname}`);
  }

  function reset(): void {
    store.reset();
    faults = [];
    config = { enforceIfMatch: options.enforceIfMatch, honourIdempotencyKey: options.honourIdempotencyKey };
  }

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    if (options.latencyMs > 0 && !(req.url ?? "/").startsWith("/_admin/")) await sleep(options.latencyMs);
    return route(req, res);
  };

  const server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      if (res.headersSent || res.destroyed) return;
      const method = req.method ?? "GET";
      if (err instanceof HttpProblem) return sendProblem(res, err.status, err.slug, err.message, method);
      if (err instanceof WritError && err.code === "config_invalid") {
        return sendProblem(res, 400, "invalid-request", err.message, method);
      }
      sendProblem(res, 500, "internal", err instanceof Error ? err.message : String(err), method);
    });
  });
  try {
    const log = { error: (obj: { err?: unknown }, msg: string) => void process.stderr.write(`${msg}: ${String(obj.err)}\n`) };
    await listen(server, { port: options.port, host: options.host, maxConnections: 4096, log, what: "records server" });
  } catch (err) {
    store.close();
    throw err;
  }
  const port = (server.address() as AddressInfo).port;
  const host = options.host.includes(":") ? `[${options.host}]` : options.host;

  return {
    url: `http://${host}:${port}`,
    port,
    seed: (type, id, state) => {
      const written = seed(type, id, state);
      return { state: written.state, version: formatEtag(written.version) };
    },
    setFaults: (list) => {
      faults = parseFaults(list);
    },
    faults: () => [...faults],
    stats: () => store.stats(),
    history: (type, id) => store.history(type, id),
    patchRequests: (key) => store.patchRequests(key),
    putRequests: (key) => store.putRequests(key),
    setConfig: (partial) => (config = parseConfig(partial)),
    config: () => ({ ...config }),
    reset,
    close: async () => {
      for (const timer of timers) clearTimeout(timer);
      timers.clear();
      const closed = new Promise<void>((resolve) => server.close(() => resolve()));
      server.closeAllConnections();
      await closed;
      store.close();
    },
  };
}

function stripUndefined<T extends object>(obj: T): Partial<T> {
  return Object.fromEntries(Object.entries(obj).filter(([, v]) => v !== undefined)) as Partial<T>;
}
