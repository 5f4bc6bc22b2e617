import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { escalateTicket, readVersion, startHarness, type Harness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

/** An agent (its replies collected) whose tag_ticket on `ticket` is escalated after three conflict cycles. */
async function escalate(h: Harness, agentName: string, ticket: string) {
  const agent = await h.client(agentName);
  const seen: Reply[] = [];
  void (async () => {
    for await (const r of agent.replies()) seen.push(r);
  })();
  const last = await escalateTicket(h, agent, ticket);
  const escalations = await h.readTopic(h.config.topics.human, "Escalation", 1);
  const escalation = escalations.find((e) => e.intent.intentKey === last.intentKey)!;
  return { agent, seen, escalation, escalatedReply: last };
}

describe("resolving escalations", () => {
  it("apply: the owner writes the escalated intent on the record as the operator saw it; the agent gets applied, a repeat is a duplicate", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const { agent, seen, escalation, escalatedReply } = await escalate(h, "agent-a", "T-70");
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
    const { seen, escalation, escalatedReply } = await escalate(h, "agent-b", "T-71");
    const ops = await h.client("ops-2");
    const discarded = await ops.resolve(escalation, { decision: "discard", message: "customer withdrew the request" });
    expect(discarded).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "customer withdrew the request" });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "rejected"));
    const twice = await ops.resolve(escalation, { decision: "apply" });
    expect(twice).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    expect(h.records.history("ticket", "T-71").filter((e) => e.kind === "patch")).toHaveLength(0);
  });
});
