// The floor writ is compared with: a raw kafkajs request-reply echo on the
// same broker, with the same keys, partition count, client settings and
// closed-loop submitters as the writ run, and no records server at all.
//
// Client: the producer and reply consumer of producers/writ-client.ts
// (idempotent, maxInFlightRequests 1, Java-compatible partitioner, acks -1;
// read_committed reply consumer, 1 s max wait, its position committed once a
// second by src/kafka/interval-commit.ts). Service: one consumer group
// member, 12 partitions consumed concurrently, each batch echoed in one send
// to the reply topic keyed by the request's correlation id.
import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type Consumer, type Producer } from "kafkajs";
import { REPLY_COMMIT_INTERVAL_MS, startIntervalCommit } from "../src/kafka/interval-commit.ts";
import { kafkaLogCreator } from "../src/kafka-log.ts";
import type { Logger } from "../src/logger.ts";
import { ensureTopics } from "../src/topics.ts";
import { startChild, stopChild } from "./child.ts";
import { closedLoop, deleteTopics, entityId, entityKeyOf, JobQueue, onePerPartition, say, warmUpProcesses, type LoopResult, type Plan } from "./workload.ts";

export interface EchoOptions {
  brokers: string[];
  /** Names this run's topics and groups. */
  tag: string;
  partitions: number;
  concurrency: number;
  plan: Plan;
  logger: Logger;
  timeoutMs: number;
  keepTopics: boolean;
  /** The local broker's pid, for the CPU it spends (bench/cpu.ts); undefined for a broker elsewhere. */
  brokerPid?: number | undefined;
  /** Count the local broker's requests during the loop, by API (bench/broker-requests.ts). */
  countBrokerRequests?: boolean;
  /** Untimed requests through the same service process before the clock starts, as writ's `processWarmup`. */
  processWarmup?: Plan | null;
}

const CORRELATION = "correlation-id";

export async function runEcho(opts: EchoOptions): Promise<LoopResult> {
  const requestTopic = `bench.echo.${opts.tag}.requests`;
  const replyTopic = `bench.echo.${opts.tag}.replies`;
  /** Disconnects of what has connected, run last first; then the topics go, whatever failed. */
  const stops: (() => Promise<void>)[] = [];
  try {
    return await echo(opts, requestTopic, replyTopic, stops);
  } finally {
    for (const stop of stops.reverse()) await stop().catch(() => undefined);
    if (!opts.keepTopics) await deleteTopics(opts.brokers, [requestTopic, replyTopic]);
  }
}

async function echo(opts: EchoOptions, requestTopic: string, replyTopic: string, stops: (() => Promise<void>)[]): Promise<LoopResult> {
  const { brokers, tag, partitions, logger } = opts;
  const kafka = (clientId: string) => new Kafka({ clientId, brokers, logLevel: logLevel.WARN, logCreator: kafkaLogCreator(logger) });

  const admin = kafka("writ-bench-echo-admin").admin();
  await admin.connect();
  // As the owner creates its topics (retrying while a busy broker settles new leaders).
  await ensureTopics(admin, [
    { topic: requestTopic, numPartitions: partitions, replicationFactor: 1 },
    // writ's client creates its reply topic with one partition.
    { topic: replyTopic, numPartitions: 1, replicationFactor: 1 },
  ]).finally(() => admin.disconnect());

  // The service.
  // The service runs in a process of its own, as writ's owner does (bench/child.ts).
  const service = await startChild(
    "echo-service.ts",
    { BENCH_ECHO: JSON.stringify({ brokers, requestTopic, replyTopic, partitions, groupId: `bench.echo.${tag}`, correlationHeader: CORRELATION }) },
    `bench-echo-${tag}.log`,
  );
  stops.push(() => stopChild(service));

  const clientKafka = kafka("writ-bench-echo-client");
  const producer: Producer = clientKafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
  });
  await producer.connect();
  stops.push(() => producer.disconnect());
  const waiting = new Map<string, () => void>();
  const consumer: Consumer = clientKafka.consumer({
    groupId: `bench.echo.client.${tag}.${randomUUID()}`,
    readUncommitted: false,
    maxWaitTimeInMs: 1000,
    allowAutoTopicCreation: false,
  });
  await consumer.connect();
  stops.push(() => consumer.disconnect());
  await consumer.subscribe({ topic: replyTopic, fromBeginning: false });
  const firstFetch = new Promise<void>((resolve) => {
    const off = consumer.on(consumer.events.FETCH, () => {
      off();
      resolve();
    });
  });
  const commits = startIntervalCommit(consumer, replyTopic, REPLY_COMMIT_INTERVAL_MS);
  stops.push(async () => commits.stop());
  await consumer.run({
    autoCommit: false,
    eachMessage: async ({ partition, message }) => {
      const corr = message.key?.toString();
      if (corr !== undefined) waiting.get(corr)?.();
      commits.handled(partition, message.offset);
    },
  });
  await firstFetch;

  /** Sends one request keyed by `entity` and resolves its latency, or null at the deadline. */
  const request = async (entity: string, payload: object): Promise<number | null> => {
    const corr = randomUUID();
    const t0 = performance.now();
    const replied = new Promise<number | null>((resolve) => {
      const timer = setTimeout(() => {
        waiting.delete(corr);
        resolve(null);
      }, opts.timeoutMs);
      waiting.set(corr, () => {
        clearTimeout(timer);
        waiting.delete(corr);
        resolve(performance.now() - t0);
      });
    });
    await producer.send({
      topic: requestTopic,
      acks: -1,
      messages: [{ key: entityKeyOf(entity), value: JSON.stringify({ ...payload, correlationId: corr }), headers: { [CORRELATION]: corr } }],
    });
    return replied;
  };
  // A body the size of a writ intent, so the echo moves as many bytes.
  const payload = (entity: string, i: number) => ({
    intentId: randomUUID(),
    intentKey: "0".repeat(64),
    entity: { type: "payment", id: entity },
    tool: "refund_payment",
    agent: { id: "bench", runId: `bench-${tag}`, stepId: `s${i}` },
    baseVersion: '"v1"',
    delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 1, reason: "goodwill", ref: `${tag}-r${i}` } }],
    params: { amountCents: 1, reason: "goodwill", ref: `${tag}-r${i}` },
    replyTo: replyTopic,
    createdAt: new Date().toISOString(),
  });

  // Warm-up: group assignment and every partition's first fetch, before the clock starts.
  const warm = await Promise.all(onePerPartition("warm_", partitions).map((id, k) => request(id, payload(id, -k - 1))));
  if (warm.some((w) => w === null)) throw new Error("echo warm-up: a request got no reply");
  if (opts.processWarmup) {
    await warmUpProcesses("echo", opts.concurrency, opts.processWarmup, async (id, job) => (await request(id, payload(id, -job.i - partitions - 1))) !== null);
  }
  const queue = new JobQueue(opts.plan);
  const result = await closedLoop(opts.concurrency, queue, async (job) => {
    const id = entityId(opts.plan.entityOf[job.i]!);
    const latency = await request(id, payload(id, job.i));
    return latency === null ? { latencyMs: opts.timeoutMs, answered: false } : { latencyMs: latency, answered: true };
  }, undefined, { broker: opts.brokerPid, service: service.pid }, opts.countBrokerRequests ?? false);
  say(`  echo: ${queue.total} requests in ${result.seconds.toFixed(1)} s`);
  return result;
}
