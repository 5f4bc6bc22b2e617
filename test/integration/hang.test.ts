import { randomUUID } from "node:crypto";
import { Writable } from "node:stream";
import { Kafka, logLevel, type Transaction } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { RouterConfig, parseConfig } from "../../src/config.ts";
import { HANG_RUNBOOK } from "../../src/owner/hang-watch.ts";
import { createOffsetProbe } from "../../src/owner/offset-probe.ts";
import { CONTROL_HEADER, HEAL_KEY } from "../../src/schemas/control.ts";
import { ensureTopics, routerTopics } from "../../src/topics.ts";
import { brokers, readVersion, refundIntent, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

/** A transaction left open on `topic` partition 0 by a producer that is not writ's: the partition's last stable offset stops there. */
async function holdOpenTransaction(topic: string): Promise<{ txn: Transaction; offset: string }> {
  const kafka = new Kafka({ clientId: `hold-${randomUUID()}`, brokers: brokers(), logLevel: logLevel.NOTHING });
  // The topic was just created; a producer's first metadata answer may not have its leader yet.
  const admin = kafka.admin();
  await admin.connect();
  await waitFor(async () => (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0]?.partitions.every((p) => p.leader >= 0));
  await admin.disconnect();
  const producer = kafka.producer({ transactionalId: `hold-${randomUUID()}`, idempotent: true, maxInFlightRequests: 1, transactionTimeout: 60_000 });
  await producer.connect();
  onTestFinished(() => producer.disconnect());
  const txn = await producer.transaction();
  const [meta] = await txn.send({ topic, messages: [{ key: "x", value: "held", partition: 0 }] });
  onTestFinished(() => txn.abort().catch(() => undefined));
  return { txn, offset: String(meta!.baseOffset) };
}

describe("hanging transactions on reply partitions", () => {
  it("blocked-reply-topic: a submit whose reply partition is held by an open transaction resolves blocked, naming the offset; unblocked it is unknown", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // No owner runs (nothing will answer), so the intents topic an owner would create is made here.
    const admin = new Kafka({ clientId: "hang-test", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    await createTopicsWithLeaders(admin, [{ topic: h.config.topics.intents, numPartitions: 3 }]);
    await admin.disconnect();
    const agent = await h.client("blocked-agent");
    const replyTopic = `writ.replies.blocked-agent.${h.id}`;
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const { txn, offset } = await holdOpenTransaction(replyTopic);

    // No owner runs: nothing answers, and the reply partition cannot show anything past the open transaction.
    const blocked = await agent.submit(refundIntent(`run-${randomUUID()}`, version), { timeoutMs: 3000 });
    expect(blocked).toMatchObject({ status: "blocked", topic: replyTopic, partition: 0, offset });
    expect((blocked as { message: string }).message).toMatch(new RegExp(`blocked by an open transaction at offset ${offset}`));

    await txn.abort();
    // The abort's markers are written after it returns: unblocked once the partition's last stable offset is its end.
    const probe = createOffsetProbe({ brokers: brokers(), clientId: `hang-test-${h.id}`, log: pino({ level: "silent" }) });
    onTestFinished(() => probe.close?.());
    await waitFor(async () => (await probe.endOffsets([{ topic: replyTopic, partition: 0 }])).every((e) => e.lastStable === e.highWatermark), {
      message: `${replyTopic}-0 still blocked after the abort`,
    });
    const unknown = await agent.submit(refundIntent(`run-${randomUUID()}`, version), { timeoutMs: 3000 });
    expect(unknown.status).toBe("unknown");
  });

  it("owner-health-hang: a reply partition the owner writes, held open past the transaction timeout, fails its health and logs partition, offset and runbook; it clears once it moves", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const lines: string[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        lines.push(...chunk.toString("utf8").split("\n").filter((l) => l !== ""));
        done();
      },
    });
    const router = await h.startRouter({
      config: { ...h.config, transactionTimeoutMs: 4000, hangHealAfterMs: 1000, lsoCheckIntervalMs: 250 },
      logger: pino({ level: "warn" }, sink),
    });
    const agent = await h.client("watched-agent");
    const replyTopic = `writ.replies.watched-agent.${h.id}`;
    const { version } = await readVersion(h.records, "payment", "pay_1");
    // The owner's ledger now names the reply topic: it is one of the partitions the owner writes and watches.
    expect(await agent.submit(refundIntent(`run-${randomUUID()}`, version))).toMatchObject({ status: "applied" });
    expect(router.health().ok).toBe(true);

    const { txn, offset } = await holdOpenTransaction(replyTopic);
    const problem = await waitFor(() => router.health().problems.find((p) => p.key === `hang:${replyTopic}:0`), {
      timeoutMs: 30_000,
      message: () => JSON.stringify(router.health()),
    });
    expect(problem.message).toContain(`hanging transaction on ${replyTopic}-0 at offset ${offset}`);
    expect(problem.message).toContain(HANG_RUNBOOK);
    expect(router.health().ok).toBe(false);
    const logged = lines.map((l) => JSON.parse(l) as Record<string, unknown>).find((l) => l.level === 50 && l.topic === replyTopic);
    expect(logged).toMatchObject({ partition: 0, offset, runbook: HANG_RUNBOOK });

    await txn.abort();
    await waitFor(() => router.health().ok, { timeoutMs: 30_000, message: () => JSON.stringify(router.health()) });
  });

  it("intents-heal: owners heal the intents partitions they forward to (on open and when the watch finds one stuck), and skip the heal records they find there", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const lines: Record<string, unknown>[] = [];
    const sink = new Writable({
      write(chunk: Buffer, _enc, done) {
        for (const l of chunk.toString("utf8").split("\n")) if (l !== "") lines.push(JSON.parse(l) as Record<string, unknown>);
        done();
      },
    });
    // Every record of the intents topic, uncommitted ones too: a heal record written behind a held transaction is seen.
    const intents = h.config.topics.intents;
    const seen: { partition: number; offset: bigint; heal: boolean }[] = [];
    const kafka = new Kafka({ clientId: `intents-reader-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: intents, numPartitions: 2 }]);
    const reader = kafka.consumer({ groupId: `writ.test-reader.${randomUUID()}`, readUncommitted: true, maxWaitTimeInMs: 200 });
    await reader.connect();
    onTestFinished(() => reader.disconnect());
    await reader.subscribe({ topic: intents, fromBeginning: true });
    await reader.run({
      eachMessage: async ({ partition, message }) =>
        void seen.push({ partition, offset: BigInt(message.offset), heal: message.key?.toString() === HEAL_KEY && message.value === null && message.headers?.[CONTROL_HEADER]?.toString() === "heal" }),
    });
    const heals = (partition: number, after = -1n) => seen.filter((r) => r.heal && r.partition === partition && r.offset > after).length;
    // The owners' committed offsets are past every heal record seen so far: each was taken and passed.
    const passedHeals = () =>
      waitFor(async () => {
        const committed = (await admin.fetchOffsets({ groupId: h.config.groupId, topics: [intents] }))[0]!.partitions;
        return seen.filter((r) => r.heal).every((r) => BigInt(committed.find((c) => c.partition === r.partition)?.offset ?? "-1") > r.offset);
      }, { timeoutMs: 30_000, message: () => "the owners' committed offsets do not pass the heal records" });

    const router = await h.startRouter({
      config: { ...h.config, transactionTimeoutMs: 6000, hangHealAfterMs: 1000, lsoCheckIntervalMs: 250 },
      logger: pino({ level: "warn" }, sink),
    });
    await waitFor(() => router.ready() && router.ownedPartitions().length === 2, { timeoutMs: 30_000 });
    // On open each owner's heal transaction touches the other intents partition (a forward of its own may be open there).
    await waitFor(() => heals(0) >= 1 && heals(1) >= 1, { timeoutMs: 30_000, message: () => JSON.stringify(seen.map((r) => ({ ...r, offset: String(r.offset) }))) });

    // The owners skip them: intents after them are answered, and none of them is counted or dead-lettered.
    const agent = await h.client("intents-heal-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    expect(await agent.submit(refundIntent(`run-${randomUUID()}`, version))).toMatchObject({ status: "applied" });
    await passedHeals();
    // Counted once its transaction committed, which the reply may arrive before: waited for.
    const metrics = await waitFor(async () => {
      const now = await router.metrics();
      return /writ_intents_total\{[^}]*outcome="applied"[^}]*\} 1\b/.test(now) ? now : undefined;
    }, { timeoutMs: 30_000, message: "the owner counted no applied intent" });
    expect(metrics).not.toMatch(/outcome="(rejected|dead_lettered)"/);
    expect(metrics).not.toMatch(/^writ_dead_letters_total\{/m);

    // A transaction held open on intents partition 0 (not writ's: no owner can close it) is watched like any
    // partition the owners write: the owner of partition 1 adds heal records there, and past the transaction
    // timeout it is a health problem naming the partition and the runbook.
    const { txn, offset } = await holdOpenTransaction(intents);
    const held = BigInt(offset);
    const problem = await waitFor(() => router.health().problems.find((p) => p.key === `hang:${intents}:0`), { timeoutMs: 30_000, message: () => JSON.stringify(router.health()) });
    expect(problem.message).toContain(`hanging transaction on ${intents}-0 at offset ${offset}`);
    expect(problem.message).toContain(HANG_RUNBOOK);
    expect(lines.find((l) => l.msg === "last stable offset stuck; healing" && l.topic === intents && l.partition === 0)).toBeDefined();
    await waitFor(() => heals(0, held) >= 1, { timeoutMs: 30_000, message: () => `no heal record on ${intents}-0 after offset ${offset}` });

    await txn.abort();
    await waitFor(() => router.health().ok, { timeoutMs: 30_000, message: () => JSON.stringify(router.health()) });
    // Past the aborted transaction the heal records are committed, and the owner of partition 0 takes and passes them too.
    await passedHeals();
    expect(await router.metrics()).not.toMatch(/outcome="(rejected|dead_lettered)"/);
    expect(await router.metrics()).not.toMatch(/^writ_dead_letters_total\{/m);
  });

  it("ledger-hang-before-open: a transaction hanging on a ledger partition keeps its owner from opening; the watch names it past the transaction timeout, and once it is aborted the owner opens (its in-doubt scan skipping the aborted record)", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const config = { ...h.config, transactionTimeoutMs: 4000, hangHealAfterMs: 1000, lsoCheckIntervalMs: 250 };
    const admin = new Kafka({ clientId: `ledger-hang-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    // The router's own topics, as it would create them, and a transaction (not writ's) held open on ledger partition 0
    // before any owner opened it: the restore reads committed up to its marker, which lies past the open transaction.
    await ensureTopics(admin, routerTopics(parseConfig(RouterConfig, config, "router")));
    const { txn, offset } = await holdOpenTransaction(h.config.topics.ledger);
    const router = await h.startRouter({ config });
    const problem = await waitFor(() => router.health().problems.find((p) => p.key === `hang:${h.config.topics.ledger}:0`), {
      timeoutMs: 30_000,
      message: () => JSON.stringify(router.health()),
    });
    expect(problem.message).toContain(`hanging transaction on ${h.config.topics.ledger}-0 at offset ${offset}`);
    expect(problem.message).toContain(HANG_RUNBOOK);
    expect(router.ownedPartitions()).toEqual([]);

    // What `writ doctor --abort` does for a producer writ cannot heal; then the partition opens and works.
    await txn.abort();
    await waitFor(() => router.health().ok && router.ownedPartitions().length === 1, { timeoutMs: 60_000, message: () => JSON.stringify(router.health()) });
    const agent = await h.client("ledger-hang-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    expect(await agent.submit(refundIntent(`run-${randomUUID()}`, version))).toMatchObject({ status: "applied" });
  });
});
