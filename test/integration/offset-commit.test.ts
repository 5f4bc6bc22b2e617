import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { brokers, readVersion, refundIntent, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

const INTERVAL_MS = 300;
const INTENTS = 30;

describe("the group's consumed offset", () => {
  it("rides in the results' transactions while intents come, and goes in alone only once the partition is quiet", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 1_000_000, refunds: [] });
    // Every transaction the owner commits, when it reached its commit and which topics it wrote.
    const commits: { at: number; topics: string[] }[] = [];
    await h.startRouter(
      { config: { ...h.config, offsetCommitIntervalMs: INTERVAL_MS } },
      { beforeCommit: async ({ topics }) => void commits.push({ at: Date.now(), topics }) },
    );
    const agent = await h.client("billing-agent");
    for (let i = 0; i < INTENTS; i++) {
      const { version } = await readVersion(h.records, "payment", "pay_1");
      const reply = await agent.submit(refundIntent(`run-${randomUUID()}`, version, 100));
      expect(reply).toMatchObject({ status: "applied", duplicate: false });
    }

    // At the broker: the quiet partition's offset still goes in, after the last intent.
    const kafka = new Kafka({ clientId: `offset-commit-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await waitFor(
      async () => {
        const [group] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
        return Number(group?.partitions[0]?.offset) === INTENTS;
      },
      { timeoutMs: 20_000, message: "the group's offset never reached the last intent" },
    );

    // A transaction that writes no record carries the offset alone: each came at least an interval after the
    // transaction before it (a partition that committed more recently has its offset carried by the next
    // result's transaction instead). The last one is the quiet partition's, after the flow.
    const alone = commits.flatMap((c, i) => (c.topics.length === 0 && i > 0 ? [{ at: c.at, after: c.at - commits[i - 1]!.at }] : []));
    expect(alone.length).toBeGreaterThanOrEqual(1);
    expect(alone.filter((c) => c.after < INTERVAL_MS)).toEqual([]);
    // Every intent's result committed: the flow was transactions that carried results, not offsets.
    expect(h.records.history("payment", "pay_1").filter((e) => e.kind !== "create")).toHaveLength(INTENTS);
  });
});
