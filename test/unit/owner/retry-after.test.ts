// Regression: an owner paused an intent whose system of record answered 429 (or 503) with Retry-After on its
// own backoff (200 ms first) and asked again long before the system allowed, hammering a rate-limited API.
// Now the pause is the longer of the backoff and the Retry-After, capped by sorRetryAfterMaxMs. Measured at a
// stub system over the real HTTP adapter, as when each request arrived: a lower bound the owner guarantees.
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { tagTicket } from "../../../examples/demo-tools.ts";
import type { RouterConfigInput } from "../../../src/config.ts";
import { intentKey } from "../../../src/keys.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import { admitTools } from "../../../src/tools.ts";
import { json, startStub } from "../../helpers/http-stub.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([] as [string, RestoredEntry][]) };
});

afterEach(() => {
  txns.length = 0;
});

const REPLY_TO = "writ.replies.agent-1";
/** Timers may fire a little before their delay by the wall clock (the event loop's cached time): a few ms. */
const CLOCK_SLACK_MS = 25;

/**
 * A system of record whose reads of the records in `limited` answer 429 with `retryAfter` (`times` times, for
 * good when Infinity); every other read gives the record at "1", every write applies. Arrivals in ms.
 */
async function rateLimitedSystem(limited: Set<string>, retryAfter: string, times = 1) {
  const reads: { id: string; at: number }[] = [];
  let refused = 0;
  const stub = await startStub((req, res) => {
    const id = decodeURIComponent(req.path.split("/").pop() ?? "");
    if (req.path.startsWith("/idempotency-keys/")) return json(res, 404, { title: "no such key" });
    if (req.method === "GET") {
      reads.push({ id, at: performance.now() });
      if (limited.has(id) && refused < times) {
        refused++;
        return json(res, 429, { title: "rate limited" }, { "retry-after": retryAfter });
      }
      return json(res, 200, { tags: [] }, { etag: '"1"' });
    }
    return json(res, 200, { tags: ["vip"] }, { etag: '"2"' });
  });
  const sor = createHttpSystemOfRecord({ name: "helpdesk", baseUrl: stub.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" });
  const tools = admitTools([tagTicket], [sor], { sorTimeoutMs: 5_000 });
  return { reads, tools, readsOf: (id: string) => reads.filter((r) => r.id === id) };
}

/** An intent of the demo's tag_ticket for ticket `id` at "1" (tags []), as a writ client sends it (plain JSON, keyed by its record). */
function tagIntent(offset: number, id: string) {
  const entity = { type: "ticket", id };
  const params = { tag: "vip" };
  const key = intentKey({ agentId: "agent-1", tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, runId: "run-1", stepId: `s-${id}`, entity, params });
  const intent = {
    intentId: `intent-${id}`,
    intentKey: key,
    entity,
    tool: "tag_ticket",
    agent: { id: "agent-1", runId: "run-1", stepId: `s-${id}` },
    baseVersion: '"1"',
    delta: [{ op: "replace", path: "/tags", value: ["vip"] }],
    params,
    replyTo: REPLY_TO,
    createdAt: new Date().toISOString(),
  };
  return intentRecord(offset, JSON.stringify(intent), `ticket:${id}`);
}

/** Replies committed so far, by the ticket they answer. */
function repliesFor(id: string): { status: string }[] {
  return txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic === REPLY_TO && r.value !== null)
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { status: string; entity: { id: string } })
    .filter((r) => r.entity.id === id);
}

async function runningOwner(tools: ReturnType<typeof admitTools>, config: Partial<RouterConfigInput> = {}, lines: Record<string, unknown>[] = []) {
  const log = pino({ level: "warn" }, { write: (line: string) => void lines.push(JSON.parse(line) as Record<string, unknown>) });
  const owner = ownerWith({ tools, config, log });
  owner.start();
  await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
  return owner;
}

/** The gap between the first two reads of a ticket. */
function gapMs(reads: { at: number }[]): number {
  expect(reads.length).toBeGreaterThanOrEqual(2);
  return reads[1]!.at - reads[0]!.at;
}

describe("the owner honours a system of record's Retry-After", () => {
  it("a 429 with Retry-After: 1 pauses the intent at least 1 s (its own first backoff is about 200 ms), and the warning says so", async () => {
    const system = await rateLimitedSystem(new Set(["T-1"]), "1");
    const lines: Record<string, unknown>[] = [];
    const owner = await runningOwner(system.tools, {}, lines);
    owner.accept([tagIntent(0, "T-1")], "0");
    await waitFor(() => repliesFor("T-1").length > 0, { timeoutMs: 15_000, message: () => `reads: ${JSON.stringify(system.reads)}` });
    expect(repliesFor("T-1")[0]).toMatchObject({ status: "applied" });
    expect(gapMs(system.readsOf("T-1"))).toBeGreaterThanOrEqual(1000 - CLOCK_SLACK_MS);
    expect(lines.find((l) => l.msg === "system of record unavailable; pausing this intent")).toMatchObject({ retryAfterMs: 1000 });
    await owner.close();
  });

  it("WRIT_SOR_RETRY_AFTER_MAX_MS caps an hour's Retry-After; 0 ignores it", async () => {
    const capped = await rateLimitedSystem(new Set(["T-1"]), "3600");
    const owner = await runningOwner(capped.tools, { sorRetryAfterMaxMs: 1000 });
    owner.accept([tagIntent(0, "T-1")], "0");
    await waitFor(() => repliesFor("T-1").length > 0, { timeoutMs: 15_000, message: "an hour's Retry-After was not capped" });
    expect(gapMs(capped.readsOf("T-1"))).toBeGreaterThanOrEqual(1000 - CLOCK_SLACK_MS);
    await owner.close();
    txns.length = 0;

    const ignored = await rateLimitedSystem(new Set(["T-1"]), "3600");
    const ignoring = await runningOwner(ignored.tools, { sorRetryAfterMaxMs: 0 });
    ignoring.accept([tagIntent(0, "T-1")], "0");
    await waitFor(() => repliesFor("T-1").length > 0, { timeoutMs: 15_000, message: "Retry-After was waited for with sorRetryAfterMaxMs 0" });
    expect(ignored.readsOf("T-1")).toHaveLength(2);
    await ignoring.close();
  });

  it("only the record that met it waits: another record of the partition is written meanwhile, and a close ends the pause", async () => {
    const system = await rateLimitedSystem(new Set(["T-1"]), "600", Infinity);
    const lines: Record<string, unknown>[] = [];
    // A 1 ms backoff of its own: had the Retry-After been ignored, T-1 would be asked again many times over while T-2 is written.
    const owner = await runningOwner(system.tools, { sorRetryAfterMaxMs: 3_600_000, outageBackoffInitialMs: 1, outageBackoffMaxMs: 1 }, lines);
    owner.accept([tagIntent(0, "T-1"), tagIntent(1, "T-2")], "1");
    await waitFor(() => repliesFor("T-2").length > 0, { timeoutMs: 15_000, message: () => `reads: ${JSON.stringify(system.reads)}` });
    expect(repliesFor("T-2")[0]).toMatchObject({ status: "applied" });
    expect(repliesFor("T-1")).toEqual([]);
    expect(system.readsOf("T-1")).toHaveLength(1);
    // The paused intent ends with its session: close does not wait out its in-flight work's deadline.
    await owner.close();
    expect(lines.filter((l) => l.msg === "in-flight work did not finish in time; closing the producer anyway")).toEqual([]);
    expect(system.readsOf("T-1")).toHaveLength(1);
  });
});
