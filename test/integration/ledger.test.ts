import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, type Producer, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { WireCodec } from "../../src/codec.ts";
import { deltaFingerprint, paramsFingerprint } from "../../src/keys.ts";
import { type Harness, brokers, readVersion, refundIntent, registryUrl, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const refund = (runId: string, version: string) => refundIntent(runId, version, 700, "refund-1");

/** A producer that is no owner's, writing to h's ledger topic, created first (compacted) with `partitions`. */
async function foreignLedgerProducer(h: Harness, partitions: number): Promise<Producer> {
  const kafka = new Kafka({ clientId: "ledger-test", brokers: brokers(), logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  await createTopicsWithLeaders(admin, [{ topic: h.config.topics.ledger, numPartitions: partitions, configEntries: [{ name: "cleanup.policy", value: "compact" }] }]);
  await admin.disconnect();
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
  await producer.connect();
  onTestFinished(() => producer.disconnect());
  return producer;
}

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

  it("resume-at-progress: a new owner resumes after the last committed result, not at the group's lagging offset", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // The group's offset goes into a transaction once (with the first result), then not for a minute.
    const config = { ...h.config, offsetCommitIntervalMs: 60_000 };
    const first = await h.startRouter({ config });
    const agent = await h.client("billing-agent");
    for (let i = 0; i < 5; i++) {
      const { version } = await readVersion(h.records, "payment", "pay_1");
      expect(await agent.submit(refund(`run-${randomUUID()}`, version))).toMatchObject({ status: "applied", duplicate: false });
    }
    await first.stop();

    const kafka = new Kafka({ clientId: "ledger-test", brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    const [group] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
    // What makes this test mean something: the group's offset is behind the five results.
    expect(Number(group?.partitions[0]?.offset)).toBeLessThan(5);

    const second = await h.startRouter({ config });
    const { version } = await readVersion(h.records, "payment", "pay_1");
    // One record's intents run in offset order: when this one is answered, the new owner has handled all before it.
    expect(await agent.submit(refund(`run-${randomUUID()}`, version))).toMatchObject({ status: "applied", duplicate: false });
    const counted = async () =>
      Object.fromEntries(
        (await second.metrics())
          .split("\n")
          .filter((l) => l.startsWith("writ_intents_total{"))
          .map((l) => [/outcome="([a-z_]+)"/.exec(l)?.[1], Number(l.split(" ").at(-1))] as const)
          .filter(([, n]) => n > 0),
      );
    // The owner counts an intent once its transaction has committed, which the reply may arrive before: waited for.
    const outcomes = await waitFor(async () => {
      const now = await counted();
      return Object.keys(now).length > 0 ? now : undefined;
    }, { timeoutMs: 30_000, message: "the second owner counted no intent" });
    // Nothing of the first owner's five was read again: none answered a second time as redelivered.
    expect(outcomes).toEqual({ applied: 1 });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(6);
  });

  it("retention-tombstones: entries past the retention window are tombstoned on the compacted topic", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // 1.8 s of retention, so the sweep runs within the test (below the config's least hour: a test-only override).
    await h.startRouter({}, { ledgerRetentionHours: 0.0005 });
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const reply = await agent.submit(refund(`run-${randomUUID()}`, version));
    expect(reply.status).toBe("applied");

    const seen = await h.watchLedger();
    await waitFor(() => seen.some((m) => m.key === reply.intentKey && m.tombstone), {
      timeoutMs: 30_000,
      message: () => `ledger records for the key: ${JSON.stringify(seen.filter((m) => m.key === reply.intentKey))}`,
    });
    const forKey = seen.filter((m) => m.key === reply.intentKey);
    expect(forKey.map((m) => m.tombstone)).toEqual([false, false, true]);
  });

  it("older-owner-keeps-dedupe: entries a newer owner wrote with fields this one does not know are read and answered (FULL compatibility)", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const input = refund(`run-${randomUUID()}`, version);
    const intent = agent.buildIntent(input);
    // What a newer owner would have written: the same entry shape with fields (top level and nested) added.
    const newer = {
      kind: "intent",
      intentKey: intent.intentKey,
      intentId: "from-a-newer-owner",
      status: "done",
      entity: intent.entity,
      tool: refundPayment.name,
      agentId: "billing-agent",
      fingerprint: paramsFingerprint(refundPayment.name, intent.entity, intent.params, ["note"]),
      attempts: [{ baseVersion: version, deltaFingerprint: deltaFingerprint(intent.delta, () => false), observedAt: "later" }],
      cycles: 0,
      outcome: { status: "applied", version: '"v7"', via: "patch", at: new Date().toISOString(), settledBy: "owner-v2" },
      replyTo: intent.replyTo,
      updatedAt: new Date().toISOString(),
      tenant: "acme",
      lease: { holder: "none" },
    };
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
    // The owner creates the contract topics on start; the entry must be there before its first restore.
    const producer = await foreignLedgerProducer(h, 1);
    await producer.send({ topic: h.config.topics.ledger, messages: [{ key: intent.intentKey, value: await codec.encode(h.config.topics.ledger, "LedgerEntry", newer as never), partition: 0 }] });

    await h.startRouter();
    const repeat = await agent.submit(input);
    expect(repeat).toMatchObject({ status: "applied", duplicate: true, version: '"v7"' });
    expect(h.records.patchRequests(intent.intentKey)).toHaveLength(0);
  });

  it("unreadable-ledger-entry: its partition fails closed (not processed, health names it) while the others run", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    // Entities on each partition, by the partitioner every client uses.
    const partitioner = Partitioners.DefaultPartitioner();
    const partitionMetadata = [0, 1].map((p) => ({ partitionId: p, leader: 0, replicas: [0], isr: [0], partitionErrorCode: 0 }));
    const partitionOf = (id: string) => partitioner({ topic: h.config.topics.intents, partitionMetadata, message: { key: `payment:${id}`, value: null } });
    const ids = Array.from({ length: 40 }, (_, i) => `pay_${i}`);
    const onBad = ids.find((id) => partitionOf(id) === 0)!;
    const onGood = ids.find((id) => partitionOf(id) === 1)!;
    for (const id of [onBad, onGood]) h.records.seed("payment", id, { amountCents: 10_000, refunds: [] });
    const producer = await foreignLedgerProducer(h, 2);
    await producer.send({ topic: h.config.topics.ledger, messages: [{ key: "k".repeat(64), value: "{ not a ledger entry", partition: 0 }] });

    const router = await h.startRouter();
    const problem = await waitFor(() => router.health().problems.find((p) => p.key === "ledger-0"), { timeoutMs: 60_000, message: () => JSON.stringify(router.health()) });
    expect(problem.message).toMatch(/cannot be read/);
    await waitFor(() => router.ownedPartitions().includes(1), { timeoutMs: 60_000, message: () => JSON.stringify(router.ownedPartitions()) });
    expect(router.ownedPartitions()).toEqual([1]);
    const agent = await h.client("billing-agent");
    const good = await readVersion(h.records, "payment", onGood);
    expect(await agent.submit({ ...refund(`run-${randomUUID()}`, good.version), entity: { type: "payment", id: onGood } })).toMatchObject({ status: "applied" });
    const bad = await readVersion(h.records, "payment", onBad);
    const held = await agent.submit({ ...refund(`run-${randomUUID()}`, bad.version), entity: { type: "payment", id: onBad } }, { timeoutMs: 3000 });
    expect(held.status).toBe("unknown");
    expect(h.records.history("payment", onBad).filter((e) => e.kind === "patch")).toHaveLength(0);
  });

  // Any producer with write access to writ.ledger can write a valid entry naming any topic. The restore's heal
  // writes a control record to every partition of each reply topic its ledger names: one the owners cannot produce
  // to (an internal topic) failed every heal, so every open of the partition, for good, with no health problem.
  it("foreign-reply-topic: an entry naming a topic outside the reply prefix (an internal topic) does not stop its partition", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const at = new Date().toISOString();
    const foreign = {
      kind: "intent",
      intentKey: "f".repeat(64),
      intentId: "forged",
      status: "done",
      entity: { type: "payment", id: "pay_9" },
      tool: refundPayment.name,
      fingerprint: "x",
      attempts: [{ baseVersion: '"1"', deltaFingerprint: "y" }],
      cycles: 0,
      outcome: { status: "applied", version: '"2"', via: "patch", at },
      replyTo: "__consumer_offsets",
      updatedAt: at,
    };
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
    const producer = await foreignLedgerProducer(h, 1);
    await producer.send({ topic: h.config.topics.ledger, messages: [{ key: foreign.intentKey, value: await codec.encode(h.config.topics.ledger, "LedgerEntry", foreign as never), partition: 0 }] });

    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    expect(await agent.submit(refund(`run-${randomUUID()}`, version), { timeoutMs: 30_000 })).toMatchObject({ status: "applied", duplicate: false });
  });

  // Each `pending` entry is sent into the partition's open transaction and its PATCH goes out once the broker has
  // acknowledged it; the entry commits with the results that follow. A transaction that fails (or an owner that
  // crashes) leaves it only in an aborted transaction: the next restore finds it with a read_uncommitted scan.
  // The ablation control skips that scan, and the same run must then write twice.
  for (const ablate of [false, true]) {
    const name = ablate
      ? "in-doubt-scan ablation control: without the scan, the intent of an aborted pending entry is written twice"
      : "in-doubt-after-abort: a pending entry left in an aborted transaction after its PATCH is reconciled, never written again";
    it(name, async () => {
      const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
      // The system of record's own Idempotency-Key dedupe is off: only writ's can stop a second PATCH.
      h.records.setConfig({ honourIdempotencyKey: false });
      h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
      let armed = false;
      let injected = 0;
      const router = await h.startRouter(
        {},
        {
          ablateInDoubtScan: ablate,
          // The first transaction to carry a ledger entry once armed (the one the pending entry was sent into) waits
          // until the PATCH has reached the system of record, then fails before its commit: it is aborted.
          beforeCommit: async ({ topics }) => {
            if (!armed || !topics.includes(h.config.topics.ledger)) return;
            armed = false;
            await waitFor(() => h.records.patchRequests().length >= 1, { timeoutMs: 20_000, message: "the PATCH never reached the system of record" });
            injected++;
            throw new Error("injected: the transaction fails before its commit");
          },
        },
      );
      await waitFor(() => router.ready(), { timeoutMs: 60_000, message: "the router never became ready" });
      const agent = await h.client("billing-agent");
      const { version } = await readVersion(h.records, "payment", "pay_1");
      armed = true;
      const runId = `run-${randomUUID()}`;
      const reply = await agent.submit(refund(runId, version));

      expect(injected).toBe(1);
      const refunds = (await readVersion(h.records, "payment", "pay_1")).state.refunds;
      if (ablate) {
        expect(h.records.patchRequests(reply.intentKey)).toHaveLength(2);
        expect(refunds).toHaveLength(2);
      } else {
        expect(reply).toMatchObject({ status: "applied", duplicate: false });
        expect(h.records.patchRequests(reply.intentKey)).toHaveLength(1);
        expect(refunds).toHaveLength(1);
        // Committed again by the new session: a later owner finds it without the aborted transaction.
        const entries = await h.readTopic(h.config.topics.ledger, "LedgerEntry", 1);
        expect(entries.some((e) => e.kind === "intent" && e.intentKey === reply.intentKey && e.status === "pending")).toBe(true);
        // A later restore does not take the aborted entry up again: its committed result comes after it in the log.
        await router.stop();
        const next = await h.startRouter();
        await waitFor(() => next.ready(), { timeoutMs: 60_000, message: "the second router never became ready" });
        let text = "";
        const pendingGauge = await waitFor(
          async () => {
            text = await next.metrics();
            return /^writ_ledger_pending_entries\{[^}]*partition="0"[^}]*\} (\d+)$/m.exec(text)?.[1];
          },
          { timeoutMs: 30_000, message: () => text.split("\n").filter((l) => l.includes("pending")).join("\n") },
        );
        expect(pendingGauge).toBe("0");
        expect(await agent.submit(refund(runId, version))).toMatchObject({ status: "applied", duplicate: true, intentKey: reply.intentKey });
        expect(h.records.patchRequests(reply.intentKey)).toHaveLength(1);
      }
    });
  }
});
