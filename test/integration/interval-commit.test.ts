// The reply consumer's offset commits (src/kafka/interval-commit.ts) against
// the real broker: batch after batch asks the broker for no commit, a flush
// commits the position after the last handled message, and the control shows
// what it replaces: kafkajs's autoCommit commits after every batch.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel, type Consumer } from "kafkajs";
import { afterEach, describe, expect, inject, it } from "vitest";
import { startIntervalCommit } from "../../src/kafka/interval-commit.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const brokers = (inject("kafkaBrokers") || process.env["KAFKA_BROKERS"] || "")
  .split(",")
  .map((b) => b.trim())
  .filter((b) => b !== "");
const kafka = new Kafka({ clientId: "writ-interval-commit-test", brokers, logLevel: logLevel.NOTHING });
const MESSAGES = 12;

const cleanups: (() => Promise<unknown>)[] = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => undefined);
});

/**
 * A topic, a consumer of its own group, and MESSAGES messages produced one at a time, each only once the consumer
 * handled the one before: MESSAGES batches. `interval` null: kafkajs's autoCommit (the control).
 */
async function consumeOneByOne(interval: number | null): Promise<{ commitEvents: () => number; groupOffset: () => Promise<string>; flush: () => Promise<void> }> {
  const topic = `test.interval-commit.${randomUUID().slice(0, 8)}`;
  const groupId = `test.interval-commit.${randomUUID()}`;
  const admin = kafka.admin();
  await admin.connect();
  cleanups.push(() => admin.disconnect());
  await createTopicsWithLeaders(admin, [{ topic, numPartitions: 1 }]);
  cleanups.push(() => admin.deleteTopics({ topics: [topic] }));
  const producer = kafka.producer();
  await producer.connect();
  cleanups.push(() => producer.disconnect());
  const consumer: Consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 100 });
  await consumer.connect();
  cleanups.push(() => consumer.disconnect());
  let commitEvents = 0;
  consumer.on(consumer.events.COMMIT_OFFSETS, () => commitEvents++);
  await consumer.subscribe({ topic, fromBeginning: true });
  const commits = interval === null ? null : startIntervalCommit(consumer, topic, interval);
  if (commits) cleanups.push(async () => commits.stop());
  let handled = 0;
  await consumer.run({
    autoCommit: interval === null,
    eachMessage: async ({ partition, message }) => {
      handled++;
      commits?.handled(partition, message.offset);
    },
  });
  for (let i = 0; i < MESSAGES; i++) {
    await producer.send({ topic, messages: [{ value: `m${i}` }] });
    await waitFor(() => handled === i + 1, { timeoutMs: 30_000, message: `message ${i} handled` });
  }
  const groupOffset = async () => (await admin.fetchOffsets({ groupId, topics: [topic] }))[0]!.partitions[0]!.offset;
  return { commitEvents: () => commitEvents, groupOffset, flush: async () => commits?.flush() };
}

describe("interval commit on the broker", () => {
  it("batch after batch sends no commit within the interval; a flush commits the position after the last handled", async () => {
    const run = await consumeOneByOne(3_600_000);
    expect(run.commitEvents()).toBe(0);
    expect(await run.groupOffset()).toBe("-1");
    await run.flush();
    await waitFor(async () => (await run.groupOffset()) === String(MESSAGES), { timeoutMs: 30_000, message: "group offset at the end" });
    expect(run.commitEvents()).toBe(1);
  });

  it("control: kafkajs's autoCommit commits after every batch", async () => {
    const run = await consumeOneByOne(null);
    expect(run.commitEvents()).toBeGreaterThanOrEqual(MESSAGES - 1);
    await waitFor(async () => (await run.groupOffset()) === String(MESSAGES), { timeoutMs: 30_000, message: "group offset at the end" });
  });
});
