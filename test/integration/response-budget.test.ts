// The process's budget of system-of-record answer bytes (WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT) on a real broker: a
// system whose every answer carries a megabyte (a large inline attachment) and many intents in flight at once. Each
// intent is applied once, counted at the records server (its Idempotency-Key dedupe off), and the most answer bytes
// the owner process held at once (its writ_sor_response_bytes_held_max) stay within the budget plus one answer.
import { randomUUID } from "node:crypto";
import { createServer, request } from "node:http";
import { describe, expect, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import type { RouterInternals } from "../../src/owner/router.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { listenForTest } from "../helpers/listen.ts";
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
}

/**
 * In front of the records server: every 2xx JSON answer under /records/ comes back as `{ record, attachment }`, the
 * attachment a megabyte. The first GET answers send all but their last bytes and hold those until OPEN_AT_ONCE
 * are open together: an owner that reads every answer it gets holds that many at once.
 */
async function startBulkyProxy(target: string): Promise<BulkyProxy> {
  const to = new URL(target);
  const attachment = "a".repeat(ATTACHMENT_BYTES);
  const proxy: BulkyProxy = { url: "", largest: 0 };
  const held: (() => void)[] = [];
  let gateOpen = false;
  const server = createServer((req, res) => {
    const upstream = request({ host: to.hostname, port: to.port, method: req.method, path: req.url, headers: { ...req.headers, host: to.host } }, (answer) => {
      const chunks: Buffer[] = [];
      answer.on("data", (c: Buffer) => chunks.push(c));
      answer.on("end", () => {
        const status = answer.statusCode ?? 502;
        let body = Buffer.concat(chunks);
        const bulky = (req.url ?? "").startsWith("/records/") && status >= 200 && status < 300 && /json/.test(String(answer.headers["content-type"]));
        if (bulky) body = Buffer.from(`{"record":${body.toString("utf8")},"attachment":"${attachment}"}`);
        proxy.largest = Math.max(proxy.largest, body.length);
        res.writeHead(status, { ...answer.headers, "content-length": String(body.length) });
        if (!bulky || req.method !== "GET" || gateOpen) return void res.end(body);
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
  });
  proxy.url = `http://127.0.0.1:${await listenForTest(server)}`;
  onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
  return proxy;
}

/** The owner's metric `name` (no labels), from its Prometheus text. */
function metric(text: string, name: string): number {
  const line = text.split("\n").find((l) => l.startsWith(`${name} `));
  if (line === undefined) throw new Error(`${name} is not in the owner's metrics`);
  return Number(line.slice(name.length + 1));
}

async function bulkyRun(internals: RouterInternals) {
  const h = await startHarness({ tools: [tagTicket] });
  h.records.setConfig({ honourIdempotencyKey: false });
  const tickets = Array.from({ length: INTENTS }, (_, i) => `T-${i}`);
  for (const id of tickets) h.records.seed("ticket", id, { status: "open", tags: [] });
  const proxy = await startBulkyProxy(h.records.url);
  const helpdesk = createHttpSystemOfRecord({
    name: "helpdesk",
    baseUrl: proxy.url,
    idempotencyKeys: true,
    idempotencyLookupPath: "/idempotency-keys/{key}",
    state: { pointer: "/record" },
    maxResponseBytes: 2 * 1024 * 1024,
  });
  const router = await h.startRouter({ config: { ...h.config, sorResponseBytesInFlight: BUDGET, sorTimeoutMs: 20_000 }, systems: [helpdesk] }, internals);
  const agent = await h.client("support-alice");
  const runId = `run-${randomUUID().slice(0, 8)}`;
  const replies = await Promise.all(
    tickets.map((id) =>
      agent.submit({ tool: tagTicket, entity: { type: "ticket", id }, runId, stepId: `tag-${id}`, baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" } }),
    ),
  );
  return { h, proxy, replies, metrics: await router.metrics() };
}

describe("the answer budget on a real broker", () => {
  it("answers of a megabyte each for 40 intents in flight: each applied once, and the owner never holds more than the budget plus one answer", async () => {
    const { h, proxy, replies, metrics } = await bulkyRun({});

    expect(replies.map((r) => r.status)).toEqual(replies.map(() => "applied"));
    // Counted at the records server: one PATCH per intent, each ticket tagged once.
    for (const r of replies) expect(h.records.patchRequests(r.intentKey)).toHaveLength(1);
    for (const id of Array.from({ length: INTENTS }, (_, i) => `T-${i}`)) expect(h.records.history("ticket", id).filter((e) => e.kind === "patch")).toHaveLength(1);
    // The process's own measure: at most the budget, plus the one answer that may always go on.
    expect(metric(metrics, "writ_sor_response_bytes_limit")).toBe(BUDGET);
    expect(metric(metrics, "writ_sor_response_bytes_held_max")).toBeLessThanOrEqual(BUDGET + proxy.largest);
    expect(metric(metrics, "writ_sor_response_budget_waits_total")).toBeGreaterThan(0);
    expect(metric(metrics, "writ_sor_response_bytes_held")).toBe(0);
  }, 120_000);
});
