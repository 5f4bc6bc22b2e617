// One system of record down, another up, their intents on one partition (real broker, two real records servers):
// the down system's intents pause without holding the partition's in-flight places, so the healthy system's
// intents are applied meanwhile; once the down system answers again its intents are applied once each, in order.
import { describe, expect, it, onTestFinished } from "vitest";
import { z } from "zod";
import { refundPayment } from "../../examples/demo-tools.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { startDemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { declareWriteTool } from "../../src/tools.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { readVersion, startHarness } from "../helpers/writ-harness.ts";

/** A tag added to a CRM customer, on a system of its own. */
const tagCustomer = declareWriteTool({
  name: "tag_customer",
  recordType: "customer",
  description: "Add a tag to a CRM customer.",
  params: z.object({ tag: z.string().min(1).max(32) }),
  intentFields: ["tag"],
  allowedPaths: [{ path: "/tags/-", ops: ["add"] }],
  delta: (p) => [{ op: "add", path: "/tags/-", value: p.tag }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "crm",
  reconcile: "idempotency-key",
});

/** A note appended to a helpdesk ticket (appends commute: a second application would show as a second note). */
const noteTicket = declareWriteTool({
  name: "note_ticket",
  recordType: "ticket",
  description: "Append a note to a helpdesk ticket.",
  params: z.object({ note: z.string().min(1).max(64) }),
  intentFields: ["note"],
  allowedPaths: [{ path: "/notes/-", ops: ["add"] }],
  delta: (p) => [{ op: "add", path: "/notes/-", value: p.note }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

describe("an outage of one system of record beside a healthy one, on one partition", () => {
  it("helpdesk-503-billing-up: billing's intents are applied while helpdesk's fill more than the in-flight places, paused; then helpdesk's are applied once each, in order", async () => {
    const h = await startHarness({ tools: [refundPayment, noteTicket], intentPartitions: 1 });
    // Helpdesk: the harness's records server, behind a proxy that answers 503 while down. Billing: a server of its own.
    const helpdesk = h.records;
    const billing = await startDemoRecordsServer({ port: 0 });
    onTestFinished(() => billing.close());
    for (const server of [helpdesk, billing]) {
      // writ's dedupe is what is measured: the records servers apply a repeated Idempotency-Key again.
      server.setConfig({ honourIdempotencyKey: false });
    }
    const proxy = await startRecordingProxy(helpdesk.url);
    const systems = [
      createHttpSystemOfRecord({ name: "billing", baseUrl: billing.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    for (const id of ["T-1", "T-2", "T-3"]) helpdesk.seed("ticket", id, { status: "open", notes: [] });
    billing.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    billing.seed("payment", "pay_2", { amountCents: 10_000, refunds: [] });
    proxy.down = true;
    await h.startRouter({
      config: { ...h.config, maxInFlightPerPartition: 2, outageBackoffInitialMs: 50, outageBackoffMaxMs: 500 },
      systems,
    });
    const agent = await h.client("support-agent");
    const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
    const note = (ticket: string, step: string, text: string) => ({
      tool: noteTicket, entity: { type: "ticket", id: ticket }, runId, stepId: step, baseVersion: '"v1"',
      delta: [{ op: "add" as const, path: "/notes/-", value: text }], params: { note: text },
    });
    const refund = (payment: string, amountCents: number) => ({
      tool: refundPayment, entity: { type: "payment", id: payment }, runId, stepId: `refund-${payment}`, baseVersion: '"v1"',
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "damaged" } }], params: { amountCents, reason: "damaged" },
    });

    // Four helpdesk intents first: two on T-1 (in order), one each on T-2 and T-3. Three records, two places.
    const notes = [note("T-1", "n1", "first"), note("T-1", "n2", "second"), note("T-2", "n3", "two"), note("T-3", "n4", "three")];
    const helpdeskReplies = agent.submitAll(notes, { timeoutMs: 60_000 });
    const triedWhileDown = () => new Set(proxy.seen.filter((r) => r.status === 503 && r.path.startsWith("/records/")).map((r) => r.path));
    await waitFor(() => triedWhileDown().size >= 2, { timeoutMs: 30_000, message: () => `helpdesk records tried: ${JSON.stringify([...triedWhileDown()])}` });

    // Billing's intents come after them on the same partition, with both in-flight places taken by paused intents.
    const paid = await agent.submitAll([refund("pay_1", 500), refund("pay_2", 700)], { timeoutMs: 30_000 });
    expect(paid.map((r) => r.status)).toEqual(["applied", "applied"]);
    // Counted at the billing server: one write each.
    for (const r of paid) expect(billing.patchRequests(r.intentKey).map((p) => p.outcome)).toEqual(["applied"]);
    expect((await readVersion(billing, "payment", "pay_1")).state.refunds).toEqual([{ amountCents: 500, reason: "damaged" }]);
    expect((await readVersion(billing, "payment", "pay_2")).state.refunds).toEqual([{ amountCents: 700, reason: "damaged" }]);
    // Helpdesk is still down: nothing reached it, all three records were tried (more than the two places).
    await waitFor(() => triedWhileDown().size === 3, { timeoutMs: 30_000, message: () => `helpdesk records tried: ${JSON.stringify([...triedWhileDown()])}` });
    expect(helpdesk.patchRequests()).toEqual([]);
    for (const id of ["T-1", "T-2", "T-3"]) expect(helpdesk.history("ticket", id)).toHaveLength(1); // the seed

    // Helpdesk answers again: each note applied once, T-1's in offset order.
    proxy.down = false;
    const answered = await helpdeskReplies;
    expect(answered.map((r) => r.status)).toEqual(["applied", "applied", "applied", "applied"]);
    for (const r of answered) expect(helpdesk.patchRequests(r.intentKey).map((p) => p.outcome)).toEqual(["applied"]);
    expect((await readVersion(helpdesk, "ticket", "T-1")).state.notes).toEqual(["first", "second"]);
    expect((await readVersion(helpdesk, "ticket", "T-2")).state.notes).toEqual(["two"]);
    expect((await readVersion(helpdesk, "ticket", "T-3")).state.notes).toEqual(["three"]);
    expect(helpdesk.history("ticket", "T-1").map((e) => e.idempotencyKey)).toEqual([null, answered[0]!.intentKey, answered[1]!.intentKey]);
  });

  it("helpdesk-and-billing-down-crm-up: a second system going down while the first's paused intents fill their bound gives its in-flight places back, so a third system's intent is applied meanwhile", async () => {
    const h = await startHarness({ tools: [refundPayment, noteTicket, tagCustomer], intentPartitions: 1 });
    // Helpdesk: the harness's records server behind a proxy. Billing and CRM: one server of their own, billing's
    // requests through a second proxy, CRM's straight to it.
    const helpdesk = h.records;
    const other = await startDemoRecordsServer({ port: 0 });
    onTestFinished(() => other.close());
    for (const server of [helpdesk, other]) server.setConfig({ honourIdempotencyKey: false });
    const helpdeskProxy = await startRecordingProxy(helpdesk.url);
    const billingProxy = await startRecordingProxy(other.url);
    const lookup = { idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" } as const;
    const systems = [
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: helpdeskProxy.url, ...lookup }),
      createHttpSystemOfRecord({ name: "billing", baseUrl: billingProxy.url, ...lookup }),
      createHttpSystemOfRecord({ name: "crm", baseUrl: other.url, ...lookup }),
    ];
    for (const id of ["T-1", "T-2"]) helpdesk.seed("ticket", id, { status: "open", notes: [] });
    for (const id of ["pay_1", "pay_2"]) other.seed("payment", id, { amountCents: 10_000, refunds: [] });
    other.seed("customer", "C-1", { tags: [] });
    helpdeskProxy.down = true;
    billingProxy.down = true;
    await h.startRouter({
      config: { ...h.config, maxInFlightPerPartition: 2, maxPausedPerPartition: 2, outageBackoffInitialMs: 50, outageBackoffMaxMs: 500 },
      systems,
    });
    const agent = await h.client("support-agent");
    const runId = `run-${Math.random().toString(36).slice(2, 10)}`;
    const base = { runId, baseVersion: '"v1"' };
    const tried = (proxy: typeof helpdeskProxy) => () => new Set(proxy.seen.filter((r) => r.status === 503 && r.path.startsWith("/records/")).map((r) => r.path));

    // Helpdesk down: its two intents pause and fill the partition's paused bound (2).
    const notes = agent.submitAll(
      ["T-1", "T-2"].map((id) => ({ ...base, tool: noteTicket, entity: { type: "ticket", id }, stepId: `note-${id}`, delta: [{ op: "add" as const, path: "/notes/-", value: id }], params: { note: id } })),
      { timeoutMs: 90_000 },
    );
    await waitFor(() => tried(helpdeskProxy)().size === 2, { timeoutMs: 30_000, message: () => `helpdesk records tried: ${JSON.stringify([...tried(helpdeskProxy)()])}` });
    // Billing, not yet known to be down, takes both in-flight places; then its requests fail too.
    const refunds = agent.submitAll(
      ["pay_1", "pay_2"].map((id) => ({ ...base, tool: refundPayment, entity: { type: "payment", id }, stepId: `refund-${id}`, delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 500, reason: "damaged" } }], params: { amountCents: 500, reason: "damaged" } })),
      { timeoutMs: 90_000 },
    );
    await waitFor(() => tried(billingProxy)().size === 2, { timeoutMs: 30_000, message: () => `billing records tried: ${JSON.stringify([...tried(billingProxy)()])}` });

    // CRM is up: its intent is applied while both other systems are down (with one shared paused bound, billing's
    // intents kept both places and CRM's waited for billing to come back).
    const [tagged] = await agent.submitAll(
      [{ ...base, tool: tagCustomer, entity: { type: "customer", id: "C-1" }, stepId: "tag-C-1", delta: [{ op: "add" as const, path: "/tags/-", value: "vip" }], params: { tag: "vip" } }],
      { timeoutMs: 30_000 },
    );
    expect(tagged!.status).toBe("applied");
    expect(other.patchRequests(tagged!.intentKey).map((p) => p.outcome)).toEqual(["applied"]);
    expect(helpdesk.patchRequests()).toEqual([]);
    expect(other.patchRequests().filter((p) => p.type === "payment")).toEqual([]);

    // Both answer again: every intent applied once.
    helpdeskProxy.down = false;
    billingProxy.down = false;
    for (const r of [...(await notes), ...(await refunds)]) {
      expect(r.status).toBe("applied");
      const writes = [...helpdesk.patchRequests(r.intentKey), ...other.patchRequests(r.intentKey)];
      expect(writes.map((p) => p.outcome)).toEqual(["applied"]);
    }
    for (const id of ["T-1", "T-2"]) expect((await readVersion(helpdesk, "ticket", id)).state.notes).toEqual([id]);
    for (const id of ["pay_1", "pay_2"]) expect((await readVersion(other, "payment", id)).state.refunds).toHaveLength(1);
  });
});
