// The echo's service process (bench/echo.ts): one consumer of the request
// topic that produces each batch's records to the reply topic, keyed by their
// correlation id. Configuration in BENCH_ECHO (JSON); IPC as bench/child.ts says.
import { Kafka, Partitioners, logLevel } from "kafkajs";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";

hideKafkajsTimeoutWarning();
const cfg = JSON.parse(process.env.BENCH_ECHO ?? "{}") as { brokers: string[]; requestTopic: string; replyTopic: string; partitions: number; groupId: string; correlationHeader: string };
const kafka = new Kafka({ clientId: "writ-bench-echo-service", brokers: cfg.brokers, logLevel: logLevel.ERROR });
const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false, createPartitioner: Partitioners.DefaultPartitioner });
await producer.connect();
const consumer = kafka.consumer({ groupId: cfg.groupId, readUncommitted: false, allowAutoTopicCreation: false, maxBytesPerPartition: 1_048_576, maxWaitTimeInMs: 1000 });
await consumer.connect();
await consumer.subscribe({ topic: cfg.requestTopic, fromBeginning: true });
await consumer.run({
  partitionsConsumedConcurrently: Math.min(cfg.partitions, 12),
  eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
    if (batch.messages.length === 0) return;
    await producer.send({
      topic: cfg.replyTopic,
      acks: -1,
      messages: batch.messages.map((m) => ({ key: m.headers?.[cfg.correlationHeader]?.toString() ?? null, value: m.value })),
    });
    resolveOffset(batch.messages.at(-1)!.offset);
    await heartbeat();
  },
});
process.send?.({ type: "started" });
process.on("message", (m: { type?: string }) => {
  if (m.type === "stop") void Promise.allSettled([consumer.disconnect(), producer.disconnect()]).finally(() => process.exit(0));
});
