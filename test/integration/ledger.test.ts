import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { brokers, readVersion, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

const refund = (runId: string, version: string) => ({
  tool: refundPayment,
  entity: { type: "payment", id: "pay_1" },
  runId,
  stepId: "refund-1",
  baseVersion: version,
  delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 700, reason: "late" } }],
  params: { amountCents: 700, reason: "late" },
});

describe("the ledger on writ.ledger", () => {
  it("owner-restart-restores-ledger: a new owner process answers a repeat from the restored ledger, writing nothing", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const first = await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const runId = `run-${randomUUID()}`;
    const applied = await agent.submit(refund(runId, version));
    await first.stop();

    await h.startRouter();
    const repeat = await agent.submit(refund(runId, version));

    expect(applied).toMatchObject({ status: "applied", duplicate: false });
    expect(repeat).toMatchObject({ status: "applied", duplicate: true, intentKey: applied.intentKey });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
    expect(h.records.patchRequests(applied.intentKey)).toHaveLength(1);
  });

  it("retention-tombstones: entries past the retention window are tombstoned on the compacted topic", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // 1.8 s of retention, so the sweep runs within the test.
    await h.startRouter({ config: { ...h.config, ledgerRetentionHours: 0.0005 } });
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const reply = await agent.submit(refund(`run-${randomUUID()}`, version));
    expect(reply.status).toBe("applied");

    const kafka = new Kafka({ clientId: "ledger-test", brokers: brokers(), logLevel: logLevel.NOTHING });
    const consumer = kafka.consumer({ groupId: `ledger-test-${randomUUID()}`, maxWaitTimeInMs: 500 });
    onTestFinished(() => consumer.disconnect());
    const seen: { key: string; tombstone: boolean }[] = [];
    await consumer.connect();
    await consumer.subscribe({ topic: h.config.topics.ledger, fromBeginning: true });
    await consumer.run({ eachMessage: async ({ message }) => void seen.push({ key: message.key!.toString(), tombstone: message.value === null }) });
    await waitFor(() => seen.some((m) => m.key === reply.intentKey && m.tombstone), {
      timeoutMs: 30_000,
      message: () => `ledger records for the key: ${JSON.stringify(seen.filter((m) => m.key === reply.intentKey))}`,
    });
    const forKey = seen.filter((m) => m.key === reply.intentKey);
    expect(forKey.map((m) => m.tombstone)).toEqual([false, false, true]);
  });
});
