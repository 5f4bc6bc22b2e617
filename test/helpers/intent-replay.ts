// An intent's record copied off the intents topic and produced again by a plain kafkajs producer (not writ's
// client): the same bytes, value and headers, its signature among them. How the replay tests act as anyone who may
// read the intents topic and write to it.
import { randomUUID } from "node:crypto";
import { Kafka, type KafkaMessage, logLevel } from "kafkajs";
import { brokers } from "./writ-harness.ts";
import { waitFor } from "./wait-for.ts";

/** What the replayer needs of a harness: its id (for client ids) and its intents topic. */
interface Replaying {
  id: string;
  config: { topics: { intents: string } };
}

export interface RecordedIntent {
  partition: number;
  message: KafkaMessage;
}

/** The record that carried intent `intentId` on the intents topic. */
export async function recordedIntent(h: Replaying, intentId: string): Promise<RecordedIntent> {
  const kafka = new Kafka({ brokers: brokers(), clientId: `replayer-${h.id}`, logLevel: logLevel.NOTHING });
  // An idle fetch ends after 100 ms, not kafkajs's 5 s: disconnect() waits for the fetch in flight.
  const reader = kafka.consumer({ groupId: `writ.test-replayer.${randomUUID()}`, maxWaitTimeInMs: 100 });
  let found: RecordedIntent | undefined;
  await reader.connect();
  try {
    await reader.subscribe({ topic: h.config.topics.intents, fromBeginning: true });
    await reader.run({ eachMessage: async ({ partition, message }) => void (message.value?.includes(intentId) && !found ? (found = { partition, message }) : undefined) });
    return await waitFor(() => found, { message: `intent ${intentId} on the intents topic` });
  } finally {
    await reader.disconnect();
  }
}

/** The same bytes produced again, to the partition they were on. */
export async function produceAgain(h: Replaying, { partition, message }: RecordedIntent): Promise<void> {
  const producer = new Kafka({ brokers: brokers(), clientId: `replayer-${h.id}`, logLevel: logLevel.NOTHING }).producer();
  await producer.connect();
  try {
    await producer.send({ topic: h.config.topics.intents, messages: [{ partition, key: message.key, value: message.value, headers: message.headers }] });
  } finally {
    await producer.disconnect();
  }
}
