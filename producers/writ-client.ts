import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type Consumer, type Producer } from "kafkajs";
import { WireCodec } from "../src/codec.ts";
import { ClientConfig, parseConfig, type ClientConfigInput } from "../src/config.ts";
import { kafkaLogCreator } from "../src/kafka-log.ts";
import { intentKey, type KeyedTool } from "../src/keys.ts";
import { createLogger, type Logger } from "../src/logger.ts";
import { entityKey, type EntityRef, type JsonPatchOp } from "../src/schemas/common.ts";
import type { Reply } from "../src/schemas/reply.ts";
import type { WriteIntent } from "../src/schemas/write-intent.ts";
import { TopicEnsurer } from "../src/topics.ts";

/** What `submit` resolves to when no reply came before the deadline. */
export interface UnknownOutcome {
  status: "unknown";
  intentId: string;
  intentKey: string;
  message: string;
}

export type SubmitResult = Reply | UnknownOutcome;

/** A write as a tool call describes it; the client adds ids, the key and the reply topic. */
export interface IntentInput {
  tool: KeyedTool;
  entity: EntityRef;
  runId: string;
  stepId: string;
  toolCallId?: string;
  baseVersion: string;
  delta: JsonPatchOp[];
  params: Record<string, unknown>;
  /** Overrides the derived key; only for callers that derive it the same way elsewhere. */
  intentKey?: string;
}

export interface WritClient {
  /** Builds the WriteIntent (id, key, reply topic) without sending it. */
  buildIntent(input: IntentInput): WriteIntent;
  /**
   * Publishes the intent and resolves with its reply. At the deadline it
   * resolves `{status: "unknown"}` and never replays on its own: the write may
   * have happened. Submitting the same intent key again asks the owner again,
   * and is always safe.
   */
  submit(intent: IntentInput | WriteIntent, opts?: { timeoutMs?: number }): Promise<SubmitResult>;
  /** Publishes many intents in one producer request and resolves each reply. */
  submitAll(intents: (IntentInput | WriteIntent)[], opts?: { timeoutMs?: number }): Promise<SubmitResult[]>;
  /** Every reply read from this agent's reply topic since `start`. */
  replies(opts?: { signal?: AbortSignal }): AsyncIterable<Reply>;
  close(): Promise<void>;
}

/**
 * The agent side of writ.
 *
 * @example
 * const writ = await createWritClient({ brokers: ["127.0.0.1:9092"], agentId: "billing-agent",
 *   replyTopic: "writ.replies.billing-agent" });
 * const reply = await writ.submit({ tool: refund, entity: { type: "payment", id: "pay_1" }, runId, stepId: "s1",
 *   baseVersion: '"v3"', delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 500 } }],
 *   params: { amountCents: 500 } }, { timeoutMs: 10_000 });
 */
export async function createWritClient(input: ClientConfigInput & { logger?: Logger }): Promise<WritClient> {
  const { logger, ...raw } = input;
  const config = parseConfig(ClientConfig, raw, "client");
  const log = (logger ?? createLogger()).child({ component: "writ-client", agent: config.agentId });
  const kafka = new Kafka({
    clientId: config.clientId ?? `writ-client-${config.agentId}`,
    brokers: config.brokers,
    logLevel: logLevel.WARN,
    logCreator: kafkaLogCreator(log),
  });
  const codec = new WireCodec({ schemaRegistryUrl: config.schemaRegistryUrl });
  const admin = kafka.admin();
  await admin.connect();
  await new TopicEnsurer(admin, { numPartitions: config.replyTopicPartitions, replicationFactor: config.replicationFactor }).ensure([
    config.replyTopic,
  ]);
  await admin.disconnect();

  // The producer's own retries stay on (they are safe: idempotent producer); it never re-sends at the writ layer.
  // The Java-compatible murmur2 partitioner: an entity key lands on the same partition from any Kafka client.
  const producer: Producer = kafka.producer({
    idempotent: true,
    maxInFlightRequests: 1,
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
  });
  await producer.connect();

  const waiting = new Map<string, (reply: Reply) => void>();
  const listeners = new Set<(reply: Reply) => void>();
  const consumer: Consumer = kafka.consumer({
    groupId: `writ.client.${config.agentId}.${randomUUID()}`,
    readUncommitted: false,
    // Fetches return as soon as a reply arrives; this only bounds an idle wait.
    maxWaitTimeInMs: 1000,
    allowAutoTopicCreation: false,
  });
  await consumer.connect();
  await consumer.subscribe({ topic: config.replyTopic, fromBeginning: false });
  // Replies sent before the consumer's first fetch resolved its start offsets would be missed: wait for that fetch.
  const firstFetch = new Promise<void>((resolve) => {
    const off = consumer.on(consumer.events.FETCH, () => {
      off();
      resolve();
    });
  });
  await consumer.run({
    eachMessage: async ({ message }) => {
      const decoded = await codec.decode("Reply", message.value);
      if (!decoded.ok) {
        log.warn({ reason: decoded.message, offset: message.offset }, "unreadable reply skipped");
        return;
      }
      const reply = decoded.value;
      waiting.get(reply.intentId)?.(reply);
      for (const l of listeners) l(reply);
    },
  });
  await firstFetch;

  const toIntent = (i: IntentInput | WriteIntent): WriteIntent => ("intentId" in i ? i : client.buildIntent(i));

  const client: WritClient = {
    buildIntent(i) {
      return {
        intentId: randomUUID(),
        intentKey: i.intentKey ?? intentKey({ tool: i.tool, runId: i.runId, stepId: i.stepId, entity: i.entity, params: i.params }),
        entity: i.entity,
        tool: i.tool.name,
        agent: { id: config.agentId, runId: i.runId, stepId: i.stepId, ...(i.toolCallId ? { toolCallId: i.toolCallId } : {}) },
        baseVersion: i.baseVersion,
        delta: i.delta,
        params: i.params,
        replyTo: config.replyTopic,
        createdAt: new Date().toISOString(),
      };
    },

    async submit(i, opts) {
      const [result] = await client.submitAll([i], opts);
      return result!;
    },

    async submitAll(list, opts) {
      const timeoutMs = opts?.timeoutMs ?? config.submitTimeoutMs;
      const intents = list.map(toIntent);
      const results = intents.map(
        (intent) =>
          new Promise<SubmitResult>((resolve) => {
            const timer = setTimeout(() => {
              waiting.delete(intent.intentId);
              resolve({
                status: "unknown",
                intentId: intent.intentId,
                intentKey: intent.intentKey,
                message: "No reply before the deadline. The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.",
              });
            }, timeoutMs);
            waiting.set(intent.intentId, (reply) => {
              clearTimeout(timer);
              waiting.delete(intent.intentId);
              resolve(reply);
            });
          }),
      );
      const messages = await Promise.all(
        intents.map(async (intent) => ({ key: entityKey(intent.entity), value: await codec.encode(config.intentsTopic, "WriteIntent", intent) })),
      );
      await producer.send({ topic: config.intentsTopic, messages, acks: -1 });
      return Promise.all(results);
    },

    replies(opts) {
      const queue: Reply[] = [];
      let wake: (() => void) | null = null;
      const listener = (r: Reply) => {
        queue.push(r);
        wake?.();
      };
      listeners.add(listener);
      const signal = opts?.signal;
      signal?.addEventListener("abort", () => wake?.());
      return {
        async *[Symbol.asyncIterator]() {
          try {
            while (!signal?.aborted) {
              const next = queue.shift();
              if (next) {
                yield next;
                continue;
              }
              await new Promise<void>((r) => (wake = r));
              wake = null;
            }
          } finally {
            listeners.delete(listener);
          }
        },
      };
    },

    async close() {
      await consumer.disconnect().catch(() => undefined);
      await producer.disconnect().catch(() => undefined);
    },
  };
  return client;
}
