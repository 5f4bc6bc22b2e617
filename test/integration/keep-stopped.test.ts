// A consumer stopped while kafkajs's restart after a crash is joining its group stays stopped, on a real broker
// (src/kafka/keep-stopped.ts): the group is left empty, where kafkajs's own disconnect() leaves that start to join
// after the stop, a member of a group its owner believes it left (a deleted group recreated, a stopped router back).
import { randomUUID } from "node:crypto";
import { type Admin, Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { keepStopped } from "../../src/kafka/keep-stopped.ts";
import { startKafkaRelay } from "../helpers/kafka-relay.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers } from "../helpers/writ-harness.ts";

const SESSION_MS = 6_000;

async function members(admin: Admin, groupId: string): Promise<number> {
  const { groups } = await admin.describeGroups([groupId]);
  return groups[0]?.members.length ?? 0;
}

/**
 * A consumer behind a relay: joined, then Kafka cut until it crashes (kafkajs schedules its restart), then back; as
 * the restart's start connects (its join waits for the old member's session to end: seconds), its owner stops it.
 */
async function stoppedWhileRestartJoins(guarded: boolean) {
  const id = randomUUID().slice(0, 8);
  const topic = `writ.keep-stopped.${id}`;
  const groupId = `writ.keep-stopped.${id}`;
  const admin = new Kafka({ clientId: "keep-stopped-admin", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  onTestFinished(async () => {
    await admin.deleteGroups([groupId]).catch(() => undefined);
    await admin.deleteTopics({ topics: [topic] }).catch(() => undefined);
    await admin.disconnect();
  });
  await createTopicsWithLeaders(admin, [{ topic, numPartitions: 1 }]);
  const relay = await startKafkaRelay(brokers()[0]!);
  onTestFinished(() => relay.close());
  const retry = { retries: 1, initialRetryTime: 100 };
  const kafka = new Kafka({ clientId: "keep-stopped", brokers: [relay.broker], logLevel: logLevel.NOTHING, retry });
  const consumer = kafka.consumer({ groupId, sessionTimeout: SESSION_MS, heartbeatInterval: 500, retry });
  const stopper = guarded ? keepStopped(consumer, { settleMs: 5 * SESSION_MS }) : null;
  const seen = { joins: 0, restarts: 0 };
  consumer.on(consumer.events.GROUP_JOIN, () => seen.joins++);
  consumer.on(consumer.events.CRASH, (e) => {
    if (e.payload.restart) seen.restarts++;
  });
  onTestFinished(() => consumer.disconnect().catch(() => undefined));
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({ eachMessage: async () => undefined });
  // Deadlines of a minute: a new group's first join and a rebalance wait on the broker, slow beside other files.
  const state = () => `${JSON.stringify(seen)}, relayed ${relay.relayed()}`;
  await waitFor(() => seen.joins >= 1, { timeoutMs: 60_000, message: () => `the consumer never joined (${state()})` });
  relay.cut();
  await waitFor(() => seen.restarts >= 1, { timeoutMs: 60_000, message: () => `no crash kafkajs restarts from (${state()})` });
  const before = relay.relayed();
  relay.restore();
  await waitFor(() => relay.relayed() > before, { timeoutMs: 60_000, message: () => `no restart connected once Kafka was back (${state()})` });
  const joinsAtStop = seen.joins;
  await (stopper ? stopper.disconnect() : consumer.disconnect());
  return { admin, groupId, seen, joinsAtStop };
}

describe("keepStopped on a real broker", () => {
  it("a stop while kafkajs's restart is joining waits for the join and leaves: the group stays empty", async () => {
    const { admin, groupId, seen, joinsAtStop } = await stoppedWhileRestartJoins(true);
    // The stop waited for that start: it joined, then left with the stop.
    expect(seen.joins).toBe(joinsAtStop + 1);
    expect(await members(admin, groupId)).toBe(0);
    // And nothing joins after it (a restart would, within its retry time and a join).
    await expect(waitFor(async () => seen.joins > joinsAtStop + 1 || (await members(admin, groupId)) > 0, { timeoutMs: SESSION_MS, intervalMs: 250 })).rejects.toThrow(/timed out/);
  }, 240_000);

  it("control: kafkajs's disconnect() alone returns while that start joins, and it joins the group after the stop", async () => {
    const { admin, groupId, seen, joinsAtStop } = await stoppedWhileRestartJoins(false);
    expect(seen.joins).toBe(joinsAtStop);
    await waitFor(async () => seen.joins > joinsAtStop && (await members(admin, groupId)) > 0, { timeoutMs: 60_000, message: "the stopped consumer's restart never joined" });
  }, 240_000);
});
