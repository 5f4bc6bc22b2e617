import { randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { cliEnv, escalatedCase, readVersion, refundIntent, startHarness, tagTicketNoDelta, writ } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

describe("resolving escalations", () => {
  it("apply: the owner writes the escalated intent on the record as the operator saw it; the agent gets applied, a repeat is a duplicate", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const { agent, seen, escalation, escalatedReply } = await escalatedCase(h, "agent-a", "T-70");
    const ops = await h.client("ops-1");
    const now = await readVersion(h.records, "ticket", "T-70");

    // A base the operator did not see now: a conflict back to the operator, nothing written.
    const stale = await ops.resolve(escalation, { decision: "apply", baseVersion: '"v1"' });
    expect(stale).toMatchObject({ status: "rejected", reason: "resolution_conflict" });
    expect(h.records.history("ticket", "T-70").filter((e) => e.kind === "patch")).toHaveLength(0);

    const done = await ops.resolve(escalation, { decision: "apply", baseVersion: now.version });
    expect(done).toMatchObject({ status: "applied", resolvedBy: "ops-1" });
    expect((await readVersion(h.records, "ticket", "T-70")).state.tags).toEqual(["needs-human"]);
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
    // The agent hears it on its own reply topic, under the escalated intent's id.
    const toAgent = await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"));
    expect(toAgent).toMatchObject({ resolvedBy: "ops-1" });
    // The ledger holds the decision: the agent asking again is answered from it, nothing written.
    const again = await agent.submit({
      tool: tagTicket,
      entity: { type: "ticket", id: "T-70" },
      runId: escalation.intent.agent.runId,
      stepId: "tag-1",
      baseVersion: escalation.intent.baseVersion,
      delta: escalation.intent.delta,
      params: { tag: "needs-human" },
    });
    expect(again).toMatchObject({ status: "applied", duplicate: true });
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
  });

  it("discard: nothing is written, the agent is told, and the escalation is closed for good", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-b", "T-71");
    const ops = await h.client("ops-2");
    const discarded = await ops.resolve(escalation, { decision: "discard", message: "customer withdrew the request" });
    expect(discarded).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "customer withdrew the request" });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "rejected"));
    const twice = await ops.resolve(escalation, { decision: "apply" });
    expect(twice).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    expect(h.records.history("ticket", "T-71").filter((e) => e.kind === "patch")).toHaveLength(0);
  });

  it("writ escalations resolve --apply on a tool without a delta function: refused resolution_delta_required without --delta; with --delta, written once", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-c", "T-72", tagTicketNoDelta);
    const env = cliEnv(h);
    const operator = ["--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"];
    const patches = () => h.records.patchRequests(escalatedReply.intentKey);

    // Without a change to write: refused, saying how to give one; nothing written, still open.
    const bare = await writ(["escalations", "resolve", escalation.escalationId, "--apply", ...operator], env);
    expect(bare.code, bare.stderr).toBe(1);
    const refused = JSON.parse(bare.stdout);
    expect(refused).toMatchObject({ status: "rejected", reason: "resolution_delta_required" });
    expect(refused.message).toContain("--delta");
    expect(patches()).toHaveLength(0);

    // A --delta / --delta-file that is not a JSON Patch array: a usage error naming the option, nothing sent.
    const notArray = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta", '{"op":"replace","path":"/tags","value":[]}', ...operator], env);
    expect([notArray.code, notArray.stderr]).toEqual([2, expect.stringContaining("--delta is not a JSON Patch (RFC 6902), an array of operations")]);
    const file = join(mkdtempSync(join(tmpdir(), "writ-delta-")), "delta.json");
    writeFileSync(file, JSON.stringify([{ op: "frobnicate", path: "/tags" }]));
    const badOp = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta-file", file, ...operator], env);
    expect([badOp.code, badOp.stderr]).toEqual([2, expect.stringContaining(`--delta-file ${file} is not a JSON Patch`)]);
    const notApply = await writ(["escalations", "resolve", escalation.escalationId, "--discard", "--delta", "[]", ...operator], env);
    expect([notApply.code, notApply.stderr]).toEqual([2, expect.stringContaining("--delta goes with --apply")]);
    expect(patches()).toHaveLength(0);

    // With the change: applied once, on the record as it is now; the agent is told.
    const delta = [{ op: "replace", path: "/tags", value: ["needs-human"] }];
    const applied = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta", JSON.stringify(delta), ...operator], env);
    expect(applied.code, applied.stdout + applied.stderr).toBe(0);
    expect(JSON.parse(applied.stdout)).toMatchObject({ status: "applied", resolvedBy: `ops-cli-${h.id}` });
    expect(patches()).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-72")).state.tags).toEqual(["needs-human"]);
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"));
  });

  it("escalation-past-retention: an open escalation is kept past the ledger's retention, and a decision on it is still carried out and answered", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // 3.6 s of retention, so the sweep runs within the test (below the config's least hour: a test-only override).
    await h.startRouter({}, { ledgerRetentionHours: 0.001 });
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-d", "T-73");
    // A write settled after the escalation: once its entry is tombstoned, every sweep has passed the escalation's too.
    const billing = await h.client("billing-agent");
    const later = await billing.submit(refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_1")).version));
    expect(later).toMatchObject({ status: "applied" });

    const ledger = await h.watchLedger();
    await waitFor(() => ledger.some((m) => m.key === later.intentKey && m.tombstone), { timeoutMs: 30_000, message: "the later write's entry was never tombstoned" });
    expect(ledger.filter((m) => m.key === escalatedReply.intentKey && m.tombstone)).toEqual([]);

    // Past retention, the operator decides: carried out, and the agent hears it.
    const ops = await h.client("ops-4");
    const discarded = await ops.resolve(escalation, { decision: "discard", message: "not needed any more" });
    expect(discarded).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "not needed any more" });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "rejected"), { timeoutMs: 30_000, message: "the agent never heard the decision" });
  });
});
