import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { readWholeTopic } from "../../src/cli/topic-reader.ts";
import { WireCodec } from "../../src/codec.ts";
import { OWNER_GROUPS_WATCH, type KafkaLogEntry } from "../../src/kafka-log.ts";
import { RouterConfig, parseConfig } from "../../src/config.ts";
import type { Router, RouterInternals } from "../../src/owner/router.ts";
import { ensureTopics, routerTopics } from "../../src/topics.ts";
import { type Harness, brokers, readVersion, refundIntent, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

// The fence is per transactional id, `<group>.<intents topic>.<p>`: owners started with another WRIT_GROUP_ID on the
// same intents topic are not fenced by it, and would write the same records (docs/architecture.md §5.2).

async function refundOnce(h: Harness, agent: Awaited<ReturnType<Harness["client"]>>) {
  const { version } = await readVersion(h.records, "payment", "pay_1");
  const reply = await agent.submit(refundIntent(`run-${randomUUID()}`, version));
  expect(reply).toMatchObject({ status: "applied", duplicate: false });
  return reply.intentKey;
}

/** A stack with one intents partition and a payment to refund, the first group's owner started. */
async function firstGroup(internals: RouterInternals) {
  const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
  // The records server's own Idempotency-Key dedupe off: it must not do writ's job here.
  h.records.setConfig({ honourIdempotencyKey: false });
  h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
  return { h, first: await h.startRouter({}, internals), group: `${h.config.groupId}.other` };
}

async function setUp(internals: RouterInternals = {}) {
  const { h, first, group } = await firstGroup(internals);
  const agent = await h.client("billing-agent");
  // A result, and with it the ledger's progress entry naming the first group.
  await refundOnce(h, agent);
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

/** Waits until `router` owns partition 0. */
const owning = (router: Router) => waitFor(() => router.ownedPartitions().includes(0), { timeoutMs: 60_000, message: () => `not opened: ${JSON.stringify(router.health())}` });

/**
 * Two groups of owners on one intents topic and one ledger that has no progress entry yet (a fresh deployment):
 * the start's check skipped for both, which is what starting them at the same moment amounts to (neither has joined
 * when the other looks). The first owns the partition before the second starts; no intent has been submitted.
 */
async function besideOnEmptyLedger(internals: RouterInternals) {
  const { h, first, group } = await firstGroup(internals);
  await owning(first);
  // What the second group's owner tells its supervisor (writ owner exits 2 on config_invalid).
  const fatal: Error[] = [];
  const second = await h.startRouter({ config: { ...h.config, groupId: group }, onFatal: (err) => fatal.push(err) }, internals);
  const agent = await h.client("billing-agent");
  return { h, first, second, agent, group, fatal };
}

/** Waits until `router`'s watch names `group` on /healthz: the problem. */
const namesOtherGroup = (router: Router, group: string) =>
  waitFor(() => router.health().problems.find((p) => p.key === "other-owner-groups" && p.message.includes(group)), {
    timeoutMs: 30_000,
    message: () => `the first group's owner says nothing: ${JSON.stringify(router.health())}`,
  });

/** One intent submitted while both groups' owners take intents: each sends its PATCH (one may meet 412, or both apply). */
async function patchedTwice(h: Harness, agent: Awaited<ReturnType<Harness["client"]>>) {
  const { version } = await readVersion(h.records, "payment", "pay_1");
  const reply = await agent.submit(refundIntent(`run-${randomUUID()}`, version));
  await waitFor(() => h.records.patchRequests(reply.intentKey).length >= 2, {
    timeoutMs: 30_000,
    message: () => `${h.records.patchRequests(reply.intentKey).length} PATCH requests`,
  });
}

/**
 * Another application's consumer group on the harness's intents topic (created here, as the owners would), held
 * rebalancing: its first member, assigned the intents partition, is stuck on a record (kafkajs heartbeats between
 * records, so it does not rejoin) when a second member joins, and the group waits for it up to its rebalance timeout
 * (2 min). Meanwhile DescribeGroups shows that member without metadata and with its assignment: an owner that never
 * saw the group Stable cannot tell whether it is writ owners. Released when the test ends.
 */
async function rebalancingGroup(h: Harness) {
  const kafka = new Kafka({ clientId: `writ-test-other-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const group = `other.app.${h.id}`;
  const options = { groupId: group, sessionTimeout: 120_000, rebalanceTimeout: 120_000, maxWaitTimeInMs: 200 };
  const [first, second] = [kafka.consumer(options), kafka.consumer(options)];
  let unstick!: () => void;
  const stuck = new Promise<void>((resolve) => (unstick = resolve));
  onTestFinished(async () => {
    unstick();
    await Promise.all([first.disconnect(), second.disconnect()]).catch(() => undefined);
    await admin.disconnect();
  });
  await ensureTopics(admin, routerTopics(parseConfig(RouterConfig, h.config, "router")));
  await h.produceRaw("stuck", Buffer.from("the record the first member sticks on"));
  let sticking = false;
  await first.connect();
  await first.subscribe({ topic: h.config.topics.intents, fromBeginning: true });
  await first.run({
    eachMessage: async () => {
      sticking = true;
      await stuck;
    },
  });
  await waitFor(() => sticking, { timeoutMs: 30_000, message: "the first member never got its record" });
  await second.connect();
  await second.subscribe({ topic: h.config.topics.intents, fromBeginning: true });
  // Its join is answered only once the rebalance completes: not awaited.
  void second.run({ eachMessage: async () => undefined }).catch(() => undefined);
  await waitFor(async () => (await admin.describeGroups([group])).groups[0]?.state === "PreparingRebalance", { timeoutMs: 30_000, message: `${group} never rebalanced` });
  return { kafka, admin, group };
}

/** Who wrote each marker in the ledger topic, read at the broker (committed records, to the end the topic has now). */
async function ledgerMarkers(h: Harness, kafka: Kafka): Promise<string[]> {
  const codec = new WireCodec({});
  const owners: string[] = [];
  await readWholeTopic(kafka, h.config.topics.ledger, pino({ level: "silent" }), async (record) => {
    const decoded = await codec.decode("LedgerEntry", record.value);
    if (decoded.ok && decoded.value.kind === "marker") owners.push(decoded.value.owner);
  });
  return owners;
}

// The watch's hold is not what these look at: its next round would hold the first group too (tested below).
const noWatch = { ownerGroupsCheckMs: 3_600_000 };

describe("one group of owners per intents topic", () => {
  it("the minute's watch asks on a client of its own, named in its log entries (writ verify counts no broker only it reaches); the take-up look is the owner's own client", async () => {
    const seen: KafkaLogEntry[] = [];
    const { first } = await firstGroup({ ownerGroupsCheckMs: 250, kafkaLogTap: (e) => void seen.push(e) });
    await owning(first);
    const listGroups = (e: KafkaLogEntry) => e.namespace === "Connection" && e.message.startsWith("Request ListGroups");
    await waitFor(() => seen.some((e) => listGroups(e) && e.client === OWNER_GROUPS_WATCH), { timeoutMs: 30_000, message: () => "no ListGroups from the watch's client" });
    const fromWatch = seen.filter((e) => e.client === OWNER_GROUPS_WATCH && e.namespace === "Connection");
    expect(new Set(fromWatch.map((e) => e.extra.clientId))).toEqual(new Set([`${first.config.clientId}-${OWNER_GROUPS_WATCH}`]));
    // The take-up look of the partition's open (a ledger with no progress entry): unnamed, so its errors count.
    expect(seen.some((e) => listGroups(e) && e.client === undefined && e.extra.clientId === first.config.clientId)).toBe(true);
  });

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
    // Neither the start's look nor the take-up look (which, first in a restore, would find the first group running
    // and stop this owner, config_invalid): only the ledger's check.
    const second = await h.startRouter(sameLedger, { ablateOwnerGroupsCheck: true, ablateTakeUp: true });
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

  it("control: without the checks, and with the first group's hold off (its watch only reports), both groups own the partition and one intent reaches the system of record twice; the first group's owner says so", async () => {
    const { h, first, agent, ownLedger, group } = await setUp({ ownerGroupsCheckMs: 250, ablateTakeUp: true });
    const second = await h.startRouter(ownLedger, { ablateSingleWriter: true });
    await owning(second);
    expect(first.ownedPartitions()).toEqual([0]);
    await namesOtherGroup(first, group);
    await patchedTwice(h, agent);
  });

  it("two groups started at once on a ledger without a progress entry: the later one's take-up check stops it (config_invalid naming the other group, as at the start) before it takes the partition, and every intent reaches the system of record once", async () => {
    const { h, first, second, agent, fatal } = await besideOnEmptyLedger({ ablateOwnerGroupsCheck: true, ownerGroupsCheckMs: 250 });
    await waitFor(() => fatal.length > 0, { timeoutMs: 30_000, message: () => `the second group's owner goes on: ${JSON.stringify(second.health())}` });
    expect(fatal[0]).toMatchObject({ code: "config_invalid", context: { field: "groupId", otherGroups: [h.config.groupId] } });
    expect(fatal[0]!.message).toContain(`writ owners of consumer group ${h.config.groupId} (1 member, ledger ${h.config.topics.ledger}) also consume intents topic ${h.config.topics.intents}`);
    expect(second.health().problems.find((p) => p.key === "other-owner-groups")?.message).toContain(`consumer group ${h.config.groupId}`);
    expect(second.ownedPartitions()).toEqual([]);
    // The second group's owner left its group: the first's watch, which may have seen it for a moment and held, ends
    // any hold (that group is Empty) and the first group's owner runs.
    await waitFor(() => !first.health().problems.some((p) => p.key === "other-owner-groups") && first.ownedPartitions().includes(0), {
      timeoutMs: 30_000,
      message: () => `the first group's owner does not run: ${JSON.stringify(first.health())}`,
    });
    const keys = [];
    for (let i = 0; i < 3; i++) keys.push(await refundOnce(h, agent));
    for (const key of keys) expect(h.records.patchRequests(key)).toHaveLength(1);
    expect(await refunds(h)).toBe(3);
    expect(second.ownedPartitions()).toEqual([]);
  });

  it("control: without the take-up check (the ledger's on), both groups own the partition of an empty ledger and one intent reaches the system of record twice", async () => {
    const { h, first, second, agent } = await besideOnEmptyLedger({ ablateOwnerGroupsCheck: true, ablateTakeUp: true, ...noWatch });
    await owning(second);
    expect(first.ownedPartitions()).toEqual([0]);
    await patchedTwice(h, agent);
  });

  it("a partition the take-up check refuses (a group that may be owners kept rebalancing) is not fenced and gets no marker: nothing is written to the ledger partition", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    const { kafka, admin, group } = await rebalancingGroup(h);
    const owner = await h.startRouter({}, noWatch);
    const refused = await waitFor(() => owner.health().problems.find((p) => p.key === "ledger-0"), {
      timeoutMs: 45_000,
      message: () => `the owner reports nothing: ${JSON.stringify(owner.health())}`,
    });
    expect(refused.message).toContain(`consumer group ${group} (PreparingRebalance, 1 member) kept rebalancing while described`);
    expect(owner.ownedPartitions()).toEqual([]);
    // At the broker: no marker in the ledger, and nothing else either (a marker's transaction would leave its
    // record and its commit's control record).
    expect(await ledgerMarkers(h, kafka)).toEqual([]);
    expect((await admin.fetchTopicOffsets(h.config.topics.ledger)).map((o) => o.high)).toEqual(["0"]);
  });

  it("an owner whose watch finds another group of owners holds its partition (takes no new intent), says so, and takes it up again and answers once that group has stopped", async () => {
    const { h, first, agent, group, sameLedger } = await setUp({ ownerGroupsCheckMs: 250 });
    // A group that checks nothing (as if it could see nothing): it owns the partition beside the first.
    const second = await h.startRouter(sameLedger, { ablateSingleWriter: true });
    await owning(second);
    const held = await namesOtherGroup(first, group);
    expect(held.message).toContain("This owner holds its partitions meanwhile");
    expect(held.message).toContain("stop one of the groups");

    // Held: only the second group's owner takes the intent.
    const during = await refundOnce(h, agent);
    expect(h.records.patchRequests(during)).toHaveLength(1);

    await second.stop();
    await waitFor(() => !first.health().problems.some((p) => p.key === "other-owner-groups") && first.ownedPartitions().includes(0), {
      timeoutMs: 60_000,
      message: () => `not taken up again: ${JSON.stringify(first.health())}`,
    });
    const after = await refundOnce(h, agent);
    expect(h.records.patchRequests(after)).toHaveLength(1);
    // Taken up again from the ledger, which the second group wrote: the intent it answered is not replayed.
    expect(h.records.patchRequests(during)).toHaveLength(1);
    expect(await refunds(h)).toBe(3);
  });
});
