import { randomUUID } from "node:crypto";
import type { Kafka } from "kafkajs";
import { onTestFinished } from "vitest";
import { waitFor } from "./wait-for.ts";

/**
 * The records of `topic` a read_committed consumer sees from its start, once
 * at least `expected` arrived (in each partition's offset order). The
 * consumer disconnects when the test ends.
 */
export async function readCommitted(kafka: Kafka, topic: string, expected: number): Promise<{ partition: number; value: string }[]> {
  const seen: { partition: number; value: string }[] = [];
  const consumer = kafka.consumer({ groupId: `writ.test-reader.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 100 });
  await consumer.connect();
  onTestFinished(() => consumer.disconnect());
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({ eachMessage: async ({ partition, message }) => void seen.push({ partition, value: message.value?.toString() ?? "" }) });
  await waitFor(() => seen.length >= expected, { timeoutMs: 30_000, message: () => `${seen.length} of ${expected} records of ${topic}` });
  return seen;
}
