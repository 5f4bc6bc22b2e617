// Regression: an operator's apply whose PATCH met a 5xx with Retry-After (an unknown outcome: the write may have
// happened) read the record and reconciled at once, against a system that had just asked to be left alone; that
// read met the same refusal, and the escalation was put back open with "the outcome is unknown". Now the apply
// waits like an intent does, max(backoff, min(Retry-After, sorRetryAfterMaxMs)), then reconciles first: it never
// writes blind. A real PartitionOwner over the real HTTP adapter; requests timed and counted at a stub system.
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { tagTicket } from "../../../examples/demo-tools.ts";
import type { RouterConfigInput } from "../../../src/config.ts";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { KIND_HEADER, type Resolution } from "../../../src/schemas/resolution.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import { admitTools } from "../../../src/tools.ts";
import { json, startStub } from "../../helpers/http-stub.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

const T1 = { type: "ticket", id: "T-1" };
const PARAMS = { tag: "vip" };
const KEY = intentKey({ agentId: "agent-1", tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, runId: "run-1", stepId: "s-1", entity: T1, params: PARAMS });
const OPS_REPLY_TO = "writ.replies.ops";
const NOW = new Date().toISOString();
const INTENT: WriteIntent = {
  intentId: "intent-1",
  intentKey: KEY,
  entity: T1,
  tool: "tag_ticket",
  agent: { id: "agent-1", runId: "run-1", stepId: "s-1" },
  baseVersion: '"1"',
  delta: [{ op: "replace", path: "/tags", value: ["vip"] }],
  params: PARAMS,
  replyTo: "writ.replies.agent-1",
  createdAt: NOW,
};
/** The ledger's entry for the intent: escalated after its conflict cycles, the escalation open. */
const ESCALATED: LedgerIntentEntry = {
  kind: "intent",
  intentKey: KEY,
  intentId: "intent-1",
  status: "done",
  entity: T1,
  tool: "tag_ticket",
  fingerprint: paramsFingerprint("tag_ticket", T1, PARAMS, []),
  attempts: [{ baseVersion: '"1"', deltaFingerprint: deltaFingerprint(INTENT.delta, () => false) }],
  cycles: 2,
  replyTo: INTENT.replyTo,
  updatedAt: NOW,
  outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: "conflicts", escalationId: "esc-1", at: NOW },
};

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([[KEY, ESCALATED as RestoredEntry]]) };
});

afterEach(() => {
  txns.length = 0;
});

/** Timers may fire a little before their delay by the wall clock (the event loop's cached time): a few ms. */
const CLOCK_SLACK_MS = 25;

/**
 * The helpdesk: T-1 at "1" with no tags. The first PATCH is applied, then answered 503 with `retryAfter` (the
 * answer of a gateway that timed out on a write that went through); the idempotency-key lookup tells the truth.
 */
async function helpdesk(retryAfter: string) {
  const requests: { method: string; path: string; at: number }[] = [];
  let tags: string[] = [];
  let version = 1;
  const applied = new Set<string>();
  const stub = await startStub((req, res) => {
    requests.push({ method: req.method, path: req.path, at: performance.now() });
    if (req.path.startsWith("/idempotency-keys/")) {
      const key = decodeURIComponent(req.path.split("/").pop() ?? "");
      return applied.has(key) ? json(res, 200, { applied: true }) : json(res, 404, { title: "no such key" });
    }
    if (req.method === "GET") return json(res, 200, { tags }, { etag: `"${version}"` });
    if (req.headers["if-match"] !== `"${version}"`) return json(res, 412, { title: "precondition failed" }, { etag: `"${version}"` });
    tags = ["vip"];
    version++;
    applied.add(String(req.headers["idempotency-key"]));
    return json(res, 503, { title: "upstream timed out" }, { "retry-after": retryAfter });
  });
  const sor = createHttpSystemOfRecord({ name: "helpdesk", baseUrl: stub.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" });
  return { requests, tools: admitTools([tagTicket], [sor], { sorTimeoutMs: 5_000 }), patches: () => requests.filter((r) => r.method === "PATCH") };
}

/** The operator's decision, as `writ escalations resolve --apply` sends it. */
function applyRecord(offset: number) {
  const resolution: Resolution = {
    kind: "resolution",
    resolutionId: "res-1",
    escalationId: "esc-1",
    intent: INTENT,
    decision: "apply",
    baseVersion: '"1"',
    operator: { id: "ops" },
    replyTo: OPS_REPLY_TO,
    entity: T1,
    createdAt: NOW,
  };
  const record = intentRecord(offset, JSON.stringify(resolution));
  record.headers = { [KIND_HEADER]: Buffer.from("resolution") };
  return record;
}

function operatorAnswers(): { status: string; reason?: string }[] {
  return txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic === OPS_REPLY_TO && r.value !== null)
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { status: string; reason?: string });
}

async function runningOwner(tools: ReturnType<typeof admitTools>, config: Partial<RouterConfigInput> = {}) {
  const owner = ownerWith({ tools, config, log: pino({ level: "silent" }) });
  owner.start();
  await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
  return owner;
}

describe("an operator's apply honours a system of record's Retry-After", () => {
  it("a 503 with Retry-After: 1 after the PATCH: the apply waits at least 1 s, then reconciles (applied) and never writes again", async () => {
    const system = await helpdesk("1");
    const owner = await runningOwner(system.tools);
    owner.accept([applyRecord(0)], "0");
    await waitFor(() => operatorAnswers().length > 0, { timeoutMs: 15_000, message: () => JSON.stringify(system.requests) });
    expect(operatorAnswers()[0]).toMatchObject({ status: "applied" });
    expect(system.patches()).toHaveLength(1);
    const patchAt = system.patches()[0]!.at;
    const after = system.requests.filter((r) => r.at > patchAt);
    // Nothing was asked of the system until its Retry-After had passed; the first thing asked was the reconcile.
    expect(after.length).toBeGreaterThan(0);
    expect(after[0]!.at - patchAt).toBeGreaterThanOrEqual(1000 - CLOCK_SLACK_MS);
    expect(after.find((r) => r.path.startsWith("/idempotency-keys/"))).toBeDefined();
    await owner.close();
  });

  it("with sorRetryAfterMaxMs 0 the header is ignored: the apply reconciles at once, and still writes once", async () => {
    const system = await helpdesk("3600");
    const owner = await runningOwner(system.tools, { sorRetryAfterMaxMs: 0 });
    owner.accept([applyRecord(0)], "0");
    await waitFor(() => operatorAnswers().length > 0, { timeoutMs: 15_000, message: () => JSON.stringify(system.requests) });
    expect(operatorAnswers()[0]).toMatchObject({ status: "applied" });
    expect(system.patches()).toHaveLength(1);
    await owner.close();
  });
});
