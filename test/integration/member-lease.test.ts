// The member lease (src/owner/member-lease.ts) on a real consumer group: kafkajs's network events name the
// SyncGroup and Heartbeat requests and carry their send times, so the lease confirms after the join and is
// renewed by heartbeats; with the consumer gone it lapses.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { afterEach, describe, expect, inject, it } from "vitest";
import { memberLease } from "../../src/owner/member-lease.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const brokers = (inject("kafkaBrokers") || process.env["KAFKA_BROKERS"] || "")
  .split(",")
  .map((b) => b.trim())
  .filter((b) => b !== "");
const kafka = new Kafka({ clientId: "writ-member-lease-test", brokers, logLevel: logLevel.NOTHING });
const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

describe("member lease on a consumer group", () => {
  it("confirms after the join, is renewed by heartbeats sent after it, and is dated from their send times", async () => {
    const topic = `test.member-lease.${randomUUID().slice(0, 8)}`;
    const admin = kafka.admin();
    await admin.connect();
    cleanups.push(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic, numPartitions: 1 }]);
    cleanups.push(() => admin.deleteTopics({ topics: [topic] }));
    const sessionTimeout = 6_000;
    const consumer = kafka.consumer({ groupId: `test.member-lease.${randomUUID()}`, sessionTimeout, heartbeatInterval: 300, maxWaitTimeInMs: 100 });
    await consumer.connect();
    cleanups.push(() => consumer.disconnect());
    let clock = Date.now;
    const lease = memberLease(consumer, sessionTimeout, () => clock());
    const answered: { api: string; sentAt: number }[] = [];
    consumer.on(consumer.events.REQUEST, (e) => {
      if (e.payload.apiName === "Heartbeat" || e.payload.apiName === "SyncGroup") answered.push({ api: e.payload.apiName, sentAt: e.payload.sentAt });
    });
    let heartbeats = 0;
    consumer.on(consumer.events.HEARTBEAT, () => heartbeats++);
    expect(lease.confirmed()).toBe(false);
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({ eachMessage: async () => undefined });
    await waitFor(() => lease.confirmed(), { timeoutMs: 30_000, message: "lease confirmed after the join" });
    expect(answered.some((a) => a.api === "SyncGroup")).toBe(true);
    await waitFor(() => heartbeats >= 2, { timeoutMs: 30_000, message: "two heartbeats answered" });
    // Dated from the last answered heartbeat's send time: a clock half a session past it sees the lease lapse.
    await consumer.stop();
    const lastSent = Math.max(...answered.filter((a) => a.api === "Heartbeat").map((a) => a.sentAt));
    clock = () => lastSent + sessionTimeout / 2 - 1;
    expect(lease.confirmed()).toBe(true);
    clock = () => lastSent + sessionTimeout / 2;
    expect(lease.confirmed()).toBe(false);
  });
});
