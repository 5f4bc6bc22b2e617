import { randomUUID } from "node:crypto";
import { describe, expect, it } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { Router, RouterInternals } from "../../src/owner/router.ts";
import { type Harness, readVersion, refundIntent, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

// The fence is per transactional id, `<group>.<intents topic>.<p>`: owners started with another WRIT_GROUP_ID on the
// same intents topic are not fenced by it, and would write the same records (docs/architecture.md §5.2).

async function refundOnce(h: Harness, agent: Awaited<ReturnType<Harness["client"]>>) {
  const { version } = await readVersion(h.records, "payment", "pay_1");
  const reply = await agent.submit(refundIntent(`run-${randomUUID()}`, version));
  expect(reply).toMatchObject({ status: "applied", duplicate: false });
  return reply.intentKey;
}

async function setUp(internals: RouterInternals = {}) {
  const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
  // The records server's own Idempotency-Key dedupe off: it must not do writ's job here.
  h.records.setConfig({ honourIdempotencyKey: false });
  h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
  const first = await h.startRouter({}, internals);
  const agent = await h.client("billing-agent");
  // A result, and with it the ledger's progress entry naming the first group.
  await refundOnce(h, agent);
  const group = `${h.config.groupId}.other`;
  const { topics } = h.config;
  return {
    h,
    first,
    agent,
    group,
    // Another group on the same intents topic: with the same ledger, or with ledger, human and dlq topics of its own.
    sameLedger: { config: { ...h.config, groupId: group } },
    ownLedger: { config: { ...h.config, groupId: group, topics: { ...topics, ledger: `${topics.ledger}.other`, human: `${topics.human}.other`, dlq: `${topics.dlq}.other` } } },
  };
}

const refunds = async (h: Harness) => ((await readVersion(h.records, "payment", "pay_1")).state.refunds as unknown[]).length;

describe("one group of owners per intents topic", () => {
  it("an owner of another group refuses to start beside a running one, whatever ledger it is given", async () => {
    const { h, group, sameLedger, ownLedger } = await setUp();
    for (const other of [ownLedger, sameLedger]) {
      const started = h.startRouter(other);
      await expect(started).rejects.toMatchObject({ code: "config_invalid" });
      await expect(started).rejects.toThrow(`writ owners of consumer group ${h.config.groupId} (1 member, ledger ${h.config.topics.ledger}) also consume intents topic ${h.config.topics.intents}`);
    }
    expect(group).not.toBe(h.config.groupId);
  });

  it("where it cannot see them, the ledger's progress entry stops it: it does not take the partition, and takes it over once that group has stopped", async () => {
    const { h, first, agent, sameLedger } = await setUp();
    const second = await h.startRouter(sameLedger, { ablateOwnerGroupsCheck: true });
    await waitFor(() => second.health().problems.some((p) => p.key === "ledger-0"), {
      timeoutMs: 30_000,
      message: () => `the second group's owner reports nothing: ${JSON.stringify(second.health())}`,
    });
    expect(second.health().problems.find((p) => p.key === "ledger-0")?.message).toContain(`written by consumer group ${h.config.groupId}`);
    expect(second.ownedPartitions()).toEqual([]);

    const key = await refundOnce(h, agent);
    expect(h.records.patchRequests(key)).toHaveLength(1);
    expect(await refunds(h)).toBe(2);

    // A renamed group: the old one's owners stopped, the new one's take over and answer from the same ledger.
    await first.stop();
    await second.stop();
    const renamed: Router = await h.startRouter(sameLedger);
    await waitFor(() => renamed.ownedPartitions().includes(0), { timeoutMs: 60_000, message: () => `not taken over: ${JSON.stringify(renamed.health())}` });
    const after = await refundOnce(h, agent);
    expect(h.records.patchRequests(after)).toHaveLength(1);
    expect(await refunds(h)).toBe(3);
  });

  it("control: without the checks, both groups own the partition and one intent reaches the system of record twice; the first group's owner says so", async () => {
    const { h, first, agent, ownLedger, group } = await setUp({ ownerGroupsCheckMs: 250 });
    const second = await h.startRouter(ownLedger, { ablateSingleWriter: true });
    await waitFor(() => second.ownedPartitions().includes(0), { timeoutMs: 30_000, message: () => `not opened: ${JSON.stringify(second.health())}` });
    expect(first.ownedPartitions()).toEqual([0]);
    await waitFor(() => first.health().problems.some((p) => p.key === "other-owner-groups" && p.message.includes(group)), {
      timeoutMs: 30_000,
      message: () => `the first group's owner says nothing: ${JSON.stringify(first.health())}`,
    });

    const { version } = await readVersion(h.records, "payment", "pay_1");
    const reply = await agent.submit(refundIntent(`run-${randomUUID()}`, version));
    // Both owners take the intent: each sends its PATCH (one may meet 412, or both apply).
    await waitFor(() => h.records.patchRequests(reply.intentKey).length >= 2, {
      timeoutMs: 30_000,
      message: () => `${h.records.patchRequests(reply.intentKey).length} PATCH requests`,
    });
  });
});
