// The process's budget of system-of-record answer bytes (WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT) on a real broker: a
// system whose every answer carries a megabyte (a large inline attachment) and many intents in flight at once. Each
// intent is applied once, counted at the records server (its Idempotency-Key dedupe off), and the most answer bytes
// the owner process held at once (its writ_sor_response_bytes_held_max) stay within the budget plus two answers.
// Records of a megabyte that intents keep from their reads while their PATCHes are out, counted at a proxy, stay
// within the budget plus one answer (without chains, every intent keeps its read at once).
import { randomUUID } from "node:crypto";
import { createServer, request } from "node:http";
import { describe, expect, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import type { RouterConfigInput } from "../../src/config.ts";
import type { RouterInternals } from "../../src/owner/router.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { sorResponseBudget } from "../../src/sor/response-budget.ts";
import { listenForTest } from "../helpers/listen.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { startHarness } from "../helpers/writ-harness.ts";

const ATTACHMENT_BYTES = 1024 * 1024;
const BUDGET = 4 * 1024 * 1024;
const INTENTS = 40;
/** GET answers whose ends are held until this many are open at once (then every answer passes as it comes). */
const OPEN_AT_ONCE = 12;

interface BulkyProxy {
  url: string;
  /** Largest answer body sent, bytes. */
  largest: number;
  /** Bytes of the reads answered for the PATCHes that came and are not answered yet (what their intents keep), and their most at once. */
  kept: number;
  keptMax: number;
}

interface ProxyOptions {
  /** The attachment goes into the record's state (what an intent keeps from its read), not beside it. */
  inState?: boolean;
  /** PATCHes are held (sent on only) once this says so, asked as requests come and every few milliseconds. */
  holdPatchesUntil?: (progress: { readsAnswered: number; patchesHeld: number }) => boolean;
}

/**
 * In front of the records server: every 2xx JSON answer under /records/ comes back as `{ record, attachment }`, the
 * attachment a megabyte (or, `inState`, as `{ record }` with the attachment in the record's state). Without
 * `holdPatchesUntil`, the first GET answers send all but their last bytes and hold those until OPEN_AT_ONCE are open
 * together: an owner that reads every answer it gets holds that many at once.
 */
async function startBulkyProxy(target: string, opts: ProxyOptions = {}): Promise<BulkyProxy> {
  const to = new URL(target);
  const attachment = "a".repeat(ATTACHMENT_BYTES);
  const proxy: BulkyProxy = { url: "", largest: 0, kept: 0, keptMax: 0 };
  const held: (() => void)[] = [];
  let gateOpen = opts.holdPatchesUntil === undefined;
  const heldPatches: (() => void)[] = [];
  const readBytes = new Map<string, number>();
  let readsAnswered = 0;
  const patchesOpen = () => {
    if (gateOpen || !opts.holdPatchesUntil?.({ readsAnswered, patchesHeld: heldPatches.length })) return;
    gateOpen = true;
    for (const send of heldPatches.splice(0)) send();
  };
  const poll = setInterval(patchesOpen, 5);
  const server = createServer((req, res) => {
    const path = req.url ?? "";
    const forward = () => {
      const upstream = request({ host: to.hostname, port: to.port, method: req.method, path, headers: { ...req.headers, host: to.host } }, (answer) => {
        const chunks: Buffer[] = [];
        answer.on("data", (c: Buffer) => chunks.push(c));
        answer.on("end", () => {
          const status = answer.statusCode ?? 502;
          let body = Buffer.concat(chunks);
          const bulky = path.startsWith("/records/") && status >= 200 && status < 300 && /json/.test(String(answer.headers["content-type"]));
          if (bulky && !opts.inState) body = Buffer.from(`{"record":${body.toString("utf8")},"attachment":"${attachment}"}`);
          else if (bulky && req.method === "GET") body = Buffer.from(`{"record":${body.toString("utf8").replace(/\}\s*$/, `,"attachment":"${attachment}"}`)}}`);
          else if (bulky) body = Buffer.from(`{"record":${body.toString("utf8")}}`);
          proxy.largest = Math.max(proxy.largest, body.length);
          res.writeHead(status, { ...answer.headers, "content-length": String(body.length) });
          if (bulky && req.method === "GET") {
            readBytes.set(path, body.length);
            readsAnswered++;
          }
          if (req.method === "PATCH") {
            proxy.kept -= readBytes.get(path) ?? 0;
            return void res.end(body);
          }
          if (!bulky || req.method !== "GET" || opts.holdPatchesUntil || gateOpen) return void res.end(body);
          res.write(body.subarray(0, body.length - 16));
          held.push(() => res.end(body.subarray(body.length - 16)));
          if (held.length >= OPEN_AT_ONCE) {
            gateOpen = true;
            for (const end of held.splice(0)) end();
          }
        });
      });
      upstream.on("error", () => res.destroy());
      req.pipe(upstream);
    };
    if (req.method !== "PATCH") return forward();
    // A PATCH came: its intent has read its record and keeps it until the PATCH is answered.
    proxy.kept += readBytes.get(path) ?? 0;
    proxy.keptMax = Math.max(proxy.keptMax, proxy.kept);
    if (gateOpen) return forward();
    heldPatches.push(forward);
    patchesOpen();
  });
  proxy.url = `http://127.0.0.1:${await listenForTest(server)}`;
  onTestFinished(() => {
    clearInterval(poll);
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return proxy;
}

/** The owner's metric `name` (no labels), from its Prometheus text. */
function metric(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  if (line === undefined) throw new Error(`${name} is not in the owner's metrics`);
  return Number(line.slice(name.length + 1));
}

async function bulkyRun(internals: RouterInternals, proxyOptions: ProxyOptions = {}, config: Partial<RouterConfigInput> = {}) {
  const h = await startHarness({ tools: [tagTicket] });
  h.records.setConfig({ honourIdempotencyKey: false });
  const tickets = Array.from({ length: INTENTS }, (_, i) => `T-${i}`);
  for (const id of tickets) h.records.seed("ticket", id, { status: "open", tags: [] });
  const proxy = await startBulkyProxy(h.records.url, proxyOptions);
  const helpdesk = createHttpSystemOfRecord({
    name: "helpdesk",
    baseUrl: proxy.url,
    idempotencyKeys: true,
    idempotencyLookupPath: "/idempotency-keys/{key}",
    state: { pointer: "/record" },
    maxResponseBytes: 2 * 1024 * 1024,
  });
  const router = await h.startRouter({ config: { ...h.config, sorResponseBytesInFlight: BUDGET, sorTimeoutMs: 20_000, ...config }, systems: [helpdesk] }, internals);
  const agent = await h.client("support-alice");
  const runId = `run-${randomUUID().slice(0, 8)}`;
  const replies = await Promise.all(
    tickets.map((id) =>
      agent.submit({ tool: tagTicket, entity: { type: "ticket", id }, runId, stepId: `tag-${id}`, baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" } }),
    ),
  );
  // Every run's chain ended (a leaked one would hold its bytes for ever).
  await waitFor(() => sorResponseBudget.held === 0 && sorResponseBudget.open === 0, { message: () => `${sorResponseBudget.held} bytes still held, ${sorResponseBudget.open} chains open` });
  return { h, proxy, replies, metrics: await router.metrics() };
}

describe("the answer budget on a real broker", () => {
  it("answers of a megabyte each for 40 intents in flight: each applied once, and the owner never holds more than the budget plus two answers", async () => {
    const { h, proxy, replies, metrics } = await bulkyRun({});

    expect(replies.map((r) => r.status)).toEqual(replies.map(() => "applied"));
    // Counted at the records server: one PATCH per intent, each ticket tagged once.
    for (const r of replies) expect(h.records.patchRequests(r.intentKey)).toHaveLength(1);
    for (const id of Array.from({ length: INTENTS }, (_, i) => `T-${i}`)) expect(h.records.history("ticket", id).filter((e) => e.kind === "patch")).toHaveLength(1);
    // The process's own measure: at most the budget, plus the oldest intent's, which may always go on: the read it
    // keeps and the answer it reads.
    expect(metric(metrics, "writ_sor_response_bytes_limit")).toBe(BUDGET);
    expect(metric(metrics, "writ_sor_response_bytes_held_max")).toBeLessThanOrEqual(BUDGET + 2 * proxy.largest);
    expect(metric(metrics, "writ_sor_response_budget_waits_total")).toBeGreaterThan(0);
    expect(metric(metrics, "writ_sor_response_bytes_held")).toBe(0);
  }, 120_000);

  /**
   * PATCHes held until all 40 have come, or until the owner can go no further (every read answered either has its
   * PATCH here or waits for the budget): the most the intents keep of their reads at once, counted here.
   */
  const keptReads = { inState: true, holdPatchesUntil: ({ readsAnswered, patchesHeld }: { readsAnswered: number; patchesHeld: number }) => patchesHeld === INTENTS || (sorResponseBudget.waiting > 0 && readsAnswered === patchesHeld + sorResponseBudget.waiting) };

  it("records of a megabyte that 40 intents keep from their reads until their PATCHes are answered: within the budget plus one answer, each applied once, every byte given back", async () => {
    const { h, proxy, replies, metrics } = await bulkyRun({}, keptReads, { maxInFlightPerPartition: 64 });

    expect(replies.map((r) => r.status)).toEqual(replies.map(() => "applied"));
    for (const r of replies) expect(h.records.patchRequests(r.intentKey)).toHaveLength(1);
    // Counted at the proxy: the reads of intents whose PATCH came and was not answered yet.
    expect(proxy.keptMax).toBeGreaterThan(0);
    expect(proxy.keptMax).toBeLessThanOrEqual(BUDGET + proxy.largest);
    expect(metric(metrics, "writ_sor_response_bytes_held_max")).toBeLessThanOrEqual(BUDGET + 2 * proxy.largest);
    expect(metric(metrics, "writ_sor_response_budget_waits_total")).toBeGreaterThan(0);
    expect(metric(metrics, "writ_sor_response_bytes_held")).toBe(0);
  }, 120_000);

  it("the ablation control: an answer's bytes given back once parsed, the intents keep every read at once, far past the budget", async () => {
    const { replies, proxy } = await bulkyRun({ ablateResponseChains: true }, keptReads, { maxInFlightPerPartition: 64 });
    expect(replies.map((r) => r.status)).toEqual(replies.map(() => "applied"));
    expect(proxy.keptMax).toBeGreaterThan(BUDGET + proxy.largest);
  }, 120_000);
});
