// Creates by external id and undo on the real broker, against the demo
// records server with its own Idempotency-Key dedupe off: every effect is
// counted at the records server (PUT and PATCH requests per intent key, the
// record's history), never taken from writ's replies.
import { randomUUID } from "node:crypto";
import { describe, expect, it, onTestFinished } from "vitest";
import { openTicket, refundPayment, systems, tagTicket } from "../../examples/demo-tools.ts";
import { createIntentInput } from "../../producers/writ-client.ts";
import { undoIntentKey } from "../../src/keys.ts";
import { createLogger } from "../../src/logger.ts";
import { startRouter } from "../../src/owner/router.ts";
import type { AppliedReply, ConflictReply, RejectedReply } from "../../src/schemas/reply.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { startFaultProxy } from "../../src/verify/fault-proxy.ts";
import { type WriteToolDeclaration, declareWriteTool } from "../../src/tools.ts";
import { readVersion, startHarness } from "../helpers/writ-harness.ts";

const TOOLS = [refundPayment, tagTicket, openTicket];

/** tag_ticket scoped to its tags, whose undo also reopens the ticket: `/status` is outside its allowedPaths. */
const tagTicketReaching = declareWriteTool({
  ...tagTicket,
  name: "tag_ticket_reaching",
  allowedPaths: ["/tags", "/tags/-"],
  undo: (p, applied, ctx) => [...tagTicket.undo!(p, applied, ctx), { op: "replace", path: "/status", value: "open" }],
});
const run = () => `run-${randomUUID().slice(0, 8)}`;

/** A harness whose records server does not dedupe by Idempotency-Key: only writ can stop a duplicate. */
async function harness(tools: WriteToolDeclaration<any>[] = TOOLS) {
  const h = await startHarness({ tools });
  h.records.setConfig({ honourIdempotencyKey: false });
  return h;
}

/** Ticket T-1 (`status`, tags ["billing"]) tagged "vip" by support-alice with `tool`, applied at "v2". */
async function taggedVip(tool: typeof tagTicket, status: string) {
  const h = await harness([tool]);
  h.records.seed("ticket", "T-1", { status, tags: ["billing"] });
  await h.startRouter();
  const alice = await h.client("support-alice");
  const read = await readVersion(h.records, "ticket", "T-1");
  const tag = await alice.submit({
    tool,
    entity: { type: "ticket", id: "T-1" },
    runId: run(),
    stepId: "tag-1",
    baseVersion: read.version,
    delta: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
    params: { tag: "vip" },
  });
  expect(tag).toMatchObject({ status: "applied", version: '"v2"' });
  return { h, alice, tag };
}

const open = (runId: string, orderRef: string, subject: string, stepId = "open-ticket-1") =>
  createIntentInput(openTicket, { runId, stepId, params: { orderRef, subject } });

describe("create by external id on a real broker", () => {
  it("three creates of one external id from two agents: one record, one successful create request; applied, duplicate, conflict", async () => {
    const h = await harness();
    await h.startRouter();
    const [alice, bob] = await Promise.all([h.client("support-alice"), h.client("support-bob")]);
    const aliceRun = run();

    const first = await alice.submit(open(aliceRun, "ORD-1", "Parcel arrived damaged"));
    // A harness retry of the same step: the model reworded the subject (free text), the intent is the same.
    const retry = await alice.submit(open(aliceRun, "ORD-1", "Damaged parcel"));
    const other = await bob.submit(open(run(), "ORD-1", "Customer asks about ORD-1"));

    expect(first).toMatchObject({ status: "applied", via: "create", duplicate: false, entity: { type: "ticket", id: "ORD-1" }, tool: "open_ticket" });
    expect(retry).toMatchObject({ status: "applied", duplicate: true, intentKey: first.intentKey, version: (first as AppliedReply).version });
    expect(other).toMatchObject({ status: "conflict", cycle: 1, duplicate: false });
    const conflict = other as ConflictReply;
    expect(conflict.current).toEqual({ state: { subject: "Parcel arrived damaged", status: "open", tags: [], orderRef: "ORD-1" }, version: '"v1"' });
    expect(conflict.your_change).toEqual([{ op: "add", path: "", value: { subject: "Customer asks about ORD-1", status: "open", tags: [], orderRef: "ORD-1" } }]);

    // Counted at the records server.
    expect(h.records.history("ticket", "ORD-1").map((e) => [e.kind, e.idempotencyKey])).toEqual([["create", first.intentKey]]);
    const puts = h.records.putRequests().filter((r) => r.type === "ticket" && r.id === "ORD-1");
    expect(puts.filter((r) => r.outcome === "created")).toHaveLength(1);
    expect(h.records.putRequests(first.intentKey).map((r) => [r.ifNoneMatch, r.outcome])).toEqual([["*", "created"]]);
    expect(h.records.putRequests(other.intentKey).map((r) => r.outcome)).toEqual(["precondition_failed"]);
    expect(puts).toHaveLength(2);
  });

  it("ablation: with the ledger ablated, the repeat is not answered from the ledger and reaches the records server again", async () => {
    const h = await harness();
    const router = await startRouter(
      { config: h.config, tools: TOOLS, systems: systems({ RECORDS_URL: h.records.url }), logger: createLogger({ level: "silent" }) },
      { ablateLedger: true },
    );
    onTestFinished(() => router.stop());
    const alice = await h.client("support-alice");
    const aliceRun = run();
    const first = await alice.submit(open(aliceRun, "ORD-9", "Damaged"));
    const retry = await alice.submit(open(aliceRun, "ORD-9", "Damaged"));
    expect(first).toMatchObject({ status: "applied" });
    // Not a duplicate any more: the create went out a second time, and only If-None-Match: * kept the record single.
    expect(retry).toMatchObject({ status: "conflict" });
    expect(h.records.putRequests(first.intentKey).length).toBeGreaterThan(1);
    expect(h.records.history("ticket", "ORD-9")).toHaveLength(1);
  });

  it("a create whose answer is lost after it committed (commit-then-timeout) reconciles to applied, with no second create", async () => {
    const h = await harness();
    await h.startRouter();
    const alice = await h.client("support-alice");
    // The records server commits the next PUT of ticket ORD-2, then answers after 4 s (the owner's deadline is 1.5 s).
    h.records.setFaults([{ kind: "commit-then-delay", method: "PUT", delayMs: 4000, times: 1, match: { type: "ticket", id: "ORD-2" } }]);
    const aliceRun = run();

    const first = await alice.submit(open(aliceRun, "ORD-2", "Refund stuck"));
    const again = await alice.submit(open(aliceRun, "ORD-2", "Refund stuck"));

    expect(first).toMatchObject({ status: "applied", via: "reconcile", version: '"v1"' });
    expect(again).toMatchObject({ status: "applied", duplicate: true });
    expect(h.records.putRequests(first.intentKey).map((r) => [r.outcome, r.fault])).toEqual([["created", "commit-then-delay"]]);
    expect(h.records.history("ticket", "ORD-2")).toHaveLength(1);
  });

  it("a create whose connection drops after it committed, behind the fault proxy, reconciles to applied, with no second create", async () => {
    const h = await harness();
    const proxy = await startFaultProxy({ upstream: h.records.url });
    onTestFinished(() => proxy.close());
    const via = (name: string) => createHttpSystemOfRecord({ name, baseUrl: proxy.url, idempotencyLookupPath: "/idempotency-keys/{key}" });
    await h.startRouter({ systems: [via("billing"), via("helpdesk")] });
    const alice = await h.client("support-alice");
    const input = open(run(), "ORD-3", "Wrong size");
    const key = alice.buildIntent(input).intentKey;
    proxy.arm({ kind: "commit-then-drop", match: { method: "PUT", idempotencyKey: key } });

    const reply = await alice.submit(input);

    expect(reply).toMatchObject({ status: "applied", via: "reconcile", intentKey: key });
    expect(proxy.pending()).toEqual([]);
    expect(proxy.countByIdempotencyKey(key, "PUT")).toBe(1);
    expect(h.records.putRequests(key).map((r) => r.outcome)).toEqual(["created"]);
    expect(h.records.history("ticket", "ORD-3")).toHaveLength(1);
  });
});

describe("undo on a real broker", () => {
  it("an undo submitted twice is applied once: one compensating PATCH (a reversal), the repeat a duplicate", async () => {
    const h = await harness();
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const billing = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const refund = await billing.submit({
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: run(),
      stepId: "refund-1",
      baseVersion: version,
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 500, reason: "damaged" } }],
      params: { amountCents: 500, reason: "damaged" },
    });
    expect(refund).toMatchObject({ status: "applied", version: '"v2"', tool: "refund_payment" });

    const undo = await billing.undo(refund as AppliedReply);
    // Another agent (a supervisor, a resumed run) asks for the same undo by key: the same intent.
    const again = await (await h.client("supervisor")).undo({ intentKey: refund.intentKey, entity: { type: "payment", id: "pay_1" }, tool: "refund_payment" });

    const undoKey = undoIntentKey(refund.intentKey);
    expect(undo).toMatchObject({ status: "applied", via: "patch", intentKey: undoKey, undoOf: refund.intentKey, version: '"v3"', duplicate: false });
    expect(again).toMatchObject({ status: "applied", intentKey: undoKey, duplicate: true, version: '"v3"' });
    expect(h.records.patchRequests(undoKey).map((r) => [r.ifMatch, r.outcome])).toEqual([['"v2"', "applied"]]);
    const payment = await readVersion(h.records, "payment", "pay_1");
    expect(payment.state.refunds).toEqual([{ amountCents: 500, reason: "damaged" }]);
    expect(payment.state.reversals).toEqual([{ reverses: refund.intentKey, amountCents: 500, reason: "damaged" }]);
  });

  it("an undo whose compensating change leaves its tool's allowedPaths is undo_failed (patch_path_not_allowed): no PATCH of it reaches the records server", async () => {
    const { h, alice, tag } = await taggedVip(tagTicketReaching, "pending");

    const undo = await alice.undo(tag.intentKey);

    expect(undo).toMatchObject({ status: "rejected", reason: "undo_failed", details: { reason: "patch_path_not_allowed", paths: ["/status"] } });
    expect((undo as RejectedReply).message).toMatch(/outside its undo paths: tool tag_ticket_reaching may not touch \/status/);
    expect(h.records.patchRequests(undoIntentKey(tag.intentKey))).toEqual([]);
    expect(h.records.patchRequests()).toHaveLength(1);
    expect(await readVersion(h.records, "ticket", "T-1")).toMatchObject({ version: '"v2"', state: { status: "pending", tags: ["billing", "vip"] } });
  });

  it("an undo after a newer change is a conflict carrying the current state; nothing is written", async () => {
    const { h, alice, tag } = await taggedVip(tagTicket, "open");
    // Someone else changes the ticket after the tag was added.
    const res = await fetch(`${h.records.url}/records/ticket/T-1`, {
      method: "PUT",
      headers: { "content-type": "application/json", "if-match": '"v2"' },
      body: JSON.stringify({ status: "pending", tags: ["billing", "vip"] }),
    });
    expect(res.status).toBe(200);

    const undo = await alice.undo(tag.intentKey);

    expect(undo).toMatchObject({ status: "conflict", cycle: 1, current: { state: { status: "pending", tags: ["billing", "vip"] }, version: '"v3"' } });
    expect((undo as ConflictReply).your_change).toEqual([{ op: "replace", path: "/tags", value: ["billing"] }]);
    expect(h.records.patchRequests(undoIntentKey(tag.intentKey))).toEqual([]);
    expect((await readVersion(h.records, "ticket", "T-1")).version).toBe('"v3"');
  });

  it("an undo of an intent that was never applied is rejected with the reason; nothing is written", async () => {
    const h = await harness();
    h.records.seed("ticket", "T-1", { status: "open", tags: ["billing"] });
    await h.startRouter();
    const alice = await h.client("support-alice");
    // Made from a version the ticket is no longer at: a conflict, not applied.
    h.records.seed("ticket", "T-1", { status: "open", tags: ["billing", "urgent"] });
    const stale = await alice.submit({
      tool: tagTicket,
      entity: { type: "ticket", id: "T-1" },
      runId: run(),
      stepId: "tag-1",
      baseVersion: '"v1"',
      delta: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
      params: { tag: "vip" },
    });
    expect(stale).toMatchObject({ status: "conflict" });

    const notApplied = await alice.undo(stale.intentKey);
    const unknown = await alice.undo({ intentKey: "0".repeat(64), entity: { type: "ticket", id: "T-1" }, tool: "tag_ticket" });

    expect(notApplied).toMatchObject({ status: "rejected", reason: "undo_target_not_applied", details: { status: "conflict" } });
    expect((notApplied as RejectedReply).message).toMatch(/not applied/);
    expect(unknown).toMatchObject({ status: "rejected", reason: "undo_target_unknown" });
    expect(h.records.patchRequests().filter((r) => r.type === "ticket")).toEqual([]);
  });
});
