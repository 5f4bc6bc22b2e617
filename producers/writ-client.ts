import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type Consumer, type Producer } from "kafkajs";
import { WireCodec } from "../src/codec.ts";
import { ClientConfig, parseConfig, type ClientConfigInput } from "../src/config.ts";
import { registerCompressionCodecs } from "../src/kafka/compression.ts";
import { kafkaLogCreator } from "../src/kafka-log.ts";
import { intentKey, type KeyedTool } from "../src/keys.ts";
import { createLogger, type Logger } from "../src/logger.ts";
import { createOffsetProbe } from "../src/owner/offset-probe.ts";
import type { EndOffsets, OffsetProbe } from "../src/owner/hang-watch.ts";
import { entityKey, type EntityRef, type JsonPatchOp } from "../src/schemas/common.ts";
import { isControlRecord } from "../src/schemas/control.ts";
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

/**
 * What `submit` resolves to when no reply came before the deadline because
 * the agent's reply partition is blocked: its last stable offset stayed at
 * `offset` for the whole wait while records were written after it, so an
 * open transaction hides every later reply from read_committed readers
 * (a "hanging transaction"; writ's owners heal their own, `writ doctor`
 * finds the rest). The write may or may not have happened, as with `unknown`.
 */
export interface BlockedOutcome {
  status: "blocked";
  intentId: string;
  intentKey: string;
  topic: string;
  partition: number;
  offset: string;
  message: string;
}

export type SubmitResult = Reply | UnknownOutcome | BlockedOutcome;

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
   * resolves `{status: "unknown"}` (or `{status: "blocked"}` when the reply
   * partition is held by an open transaction) and never replays on its own:
   * the write may have happened. Submitting the same intent key again asks
   * the owner again, and is always safe.
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
export async function createWritClient(input: ClientConfigInput & { logger?: Logger; offsetProbe?: OffsetProbe }): Promise<WritClient> {
  const { logger, offsetProbe, ...raw } = input;
  const config = parseConfig(ClientConfig, raw, "client");
  const log = (logger ?? createLogger()).child({ component: "writ-client", agent: config.agentId });
  registerCompressionCodecs();
  const kafka = new Kafka({
    clientId: config.clientId ?? `writ-client-${config.agentId}`,
    brokers: config.brokers,
    logLevel: logLevel.WARN,
    logCreator: kafkaLogCreator(log),
  });
  const admin = kafka.admin();
  await admin.connect();
  let replyPartitions: number;
  const groupId = `writ.client.${config.agentId}.${randomUUID()}`;
  try {
    // The agent provisions its own reply topic; owners never create one because an intent names it.
    await new TopicEnsurer(admin, { numPartitions: config.replyTopicPartitions, replicationFactor: config.replicationFactor }).ensure([config.replyTopic]);
    const { topics } = await admin.fetchTopicMetadata({ topics: [config.replyTopic] });
    replyPartitions = Math.max(1, topics[0]?.partitions.length ?? 1);
    // The reply consumer starts at the topic's current (read_committed) end, committed for its group before it
    // joins: a consumer that kafkajs restarts after a crash resumes there instead of at the end of the moment,
    // which would skip the replies written in between.
    const ends = await admin.fetchTopicOffsets(config.replyTopic);
    await admin.setOffsets({ groupId, topic: config.replyTopic, partitions: ends.map((e) => ({ partition: e.partition, offset: e.high })) });
  } finally {
    await admin.disconnect();
  }
  const probe = offsetProbe ?? createOffsetProbe({ brokers: config.brokers, clientId: `${config.clientId ?? "writ-client"}-probe`, log });
  const client = new KafkaWritClient(config, kafka, log, probe, replyPartitions, groupId);
  await client.start();
  return client;
}

/** Waiters keyed by intent id; a reply resolves its waiter and goes to every `replies()` listener. */
class KafkaWritClient implements WritClient {
  private readonly config: ClientConfig;
  private readonly log: Logger;
  private readonly codec: WireCodec;
  private readonly producer: Producer;
  private readonly consumer: Consumer;
  private readonly probe: OffsetProbe;
  private readonly waiting = new Map<string, (reply: Reply) => void>();
  private readonly listeners = new Set<(reply: Reply) => void>();
  private readonly partitioner = Partitioners.DefaultPartitioner();
  private readonly replyPartitions: number;
  /** Ends of the reply partitions as last probed, shared by submits within a second. */
  private lastProbe: { at: number; ends: Promise<EndOffsets[] | null> } | null = null;

  constructor(config: ClientConfig, kafka: Kafka, log: Logger, probe: OffsetProbe, replyPartitions: number, groupId: string) {
    this.config = config;
    this.replyPartitions = replyPartitions;
    this.log = log;
    this.probe = probe;
    this.codec = new WireCodec({ schemaRegistryUrl: config.schemaRegistryUrl });
    // The producer's own retries stay on (they are safe: idempotent producer); it never re-sends at the writ layer.
    // The Java-compatible murmur2 partitioner: an entity key lands on the same partition from any Kafka client.
    this.producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    this.consumer = kafka.consumer({
      groupId,
      readUncommitted: false,
      // Fetches return as soon as a reply arrives; this only bounds an idle wait.
      maxWaitTimeInMs: 1000,
      allowAutoTopicCreation: false,
    });
  }

  async start(): Promise<void> {
    await this.producer.connect();
    await this.consumer.connect();
    await this.consumer.subscribe({ topic: this.config.replyTopic, fromBeginning: false });
    // Replies sent before the consumer's first fetch resolved its start offsets would be missed: wait for that fetch.
    const firstFetch = new Promise<void>((resolve) => {
      const off = this.consumer.on(this.consumer.events.FETCH, () => {
        off();
        resolve();
      });
    });
    await this.consumer.run({
      eachMessage: async ({ message }) => {
        if (isControlRecord(message.headers) || message.value === null) return;
        const decoded = await this.codec.decode("Reply", message.value);
        if (!decoded.ok) {
          this.log.warn({ reason: decoded.message, offset: message.offset }, "unreadable reply skipped");
          return;
        }
        const reply = decoded.value;
        this.waiting.get(reply.intentId)?.(reply);
        for (const l of this.listeners) l(reply);
      },
    });
    await firstFetch;
  }

  buildIntent(i: IntentInput): WriteIntent {
    return {
      intentId: randomUUID(),
      intentKey: i.intentKey ?? intentKey({ tool: i.tool, runId: i.runId, stepId: i.stepId, entity: i.entity, params: i.params }),
      entity: i.entity,
      tool: i.tool.name,
      agent: { id: this.config.agentId, runId: i.runId, stepId: i.stepId, ...(i.toolCallId ? { toolCallId: i.toolCallId } : {}) },
      baseVersion: i.baseVersion,
      delta: i.delta,
      params: i.params,
      replyTo: this.config.replyTopic,
      createdAt: new Date().toISOString(),
    };
  }

  async submit(i: IntentInput | WriteIntent, opts?: { timeoutMs?: number }): Promise<SubmitResult> {
    const [result] = await this.submitAll([i], opts);
    return result!;
  }

  async submitAll(list: (IntentInput | WriteIntent)[], opts?: { timeoutMs?: number }): Promise<SubmitResult[]> {
    const timeoutMs = opts?.timeoutMs ?? this.config.submitTimeoutMs;
    const intents = list.map((i) => ("intentId" in i ? i : this.buildIntent(i)));
    // The reply partitions' ends as the wait begins: at the deadline, an end that has not moved tells a blocked topic from a slow owner.
    const before = this.ends();
    const timers: NodeJS.Timeout[] = [];
    const results = intents.map(
      (intent) =>
        new Promise<SubmitResult>((resolve) => {
          const timer = setTimeout(() => {
            this.waiting.delete(intent.intentId);
            void this.timedOut(intent, before).then(resolve);
          }, timeoutMs);
          timers.push(timer);
          this.waiting.set(intent.intentId, (reply) => {
            clearTimeout(timer);
            this.waiting.delete(intent.intentId);
            resolve(reply);
          });
        }),
    );
    try {
      const messages = await Promise.all(
        intents.map(async (intent) => ({ key: entityKey(intent.entity), value: await this.codec.encode(this.config.intentsTopic, "WriteIntent", intent) })),
      );
      await this.producer.send({ topic: this.config.intentsTopic, messages, acks: -1 });
    } catch (err) {
      // Nothing is waited for when the send failed: drop the waiters and their timers.
      for (const t of timers) clearTimeout(t);
      for (const intent of intents) this.waiting.delete(intent.intentId);
      throw err;
    }
    return Promise.all(results);
  }

  /** The deadline passed: `blocked` when the intent's reply partition is held by an open transaction, else `unknown`. */
  private async timedOut(intent: WriteIntent, before: Promise<EndOffsets[] | null>): Promise<SubmitResult> {
    const unknown: UnknownOutcome = {
      status: "unknown",
      intentId: intent.intentId,
      intentKey: intent.intentKey,
      message: "No reply before the deadline. The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.",
    };
    const partition = this.partitioner({
      topic: this.config.replyTopic,
      partitionMetadata: Array.from({ length: this.replyPartitions }, (_, p) => ({ partitionId: p, leader: 0, replicas: [0], isr: [0], partitionErrorCode: 0 })),
      message: { key: intent.intentId, value: null },
    });
    const [start, now] = await Promise.all([before, this.ends(true)]);
    const was = start?.find((e) => e.partition === partition);
    const is = now?.find((e) => e.partition === partition);
    if (!was || !is || was.lastStable !== is.lastStable || BigInt(is.lastStable) >= BigInt(is.highWatermark)) return unknown;
    const message =
      `reply topic blocked by an open transaction at offset ${is.lastStable} (${this.config.replyTopic}-${partition}, high watermark ${is.highWatermark}): ` +
      "replies past it are invisible to read_committed readers. The write may or may not have happened; ask again once it is healed (writ doctor).";
    this.log.warn({ topic: this.config.replyTopic, partition, offset: is.lastStable, highWatermark: is.highWatermark }, "reply partition blocked");
    return { status: "blocked", intentId: intent.intentId, intentKey: intent.intentKey, topic: this.config.replyTopic, partition, offset: is.lastStable, message };
  }

  /** Both ends of every reply partition; probes at most once a second unless `fresh`. */
  private ends(fresh = false): Promise<EndOffsets[] | null> {
    if (!fresh && this.lastProbe && Date.now() - this.lastProbe.at < 1000) return this.lastProbe.ends;
    const tps = Array.from({ length: this.replyPartitions }, (_, p) => ({ topic: this.config.replyTopic, partition: p }));
    const ends = this.probe.endOffsets(tps).catch(() => null);
    this.lastProbe = { at: Date.now(), ends };
    return ends;
  }

  replies(opts?: { signal?: AbortSignal }): AsyncIterable<Reply> {
    const queue: Reply[] = [];
    let wake: (() => void) | null = null;
    const listener = (r: Reply) => {
      queue.push(r);
      wake?.();
    };
    this.listeners.add(listener);
    const signal = opts?.signal;
    const onAbort = () => wake?.();
    signal?.addEventListener("abort", onAbort);
    const listeners = this.listeners;
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
          signal?.removeEventListener("abort", onAbort);
        }
      },
    };
  }

  async close(): Promise<void> {
    await this.consumer.disconnect().catch(() => undefined);
    await this.producer.disconnect().catch(() => undefined);
    await this.probe.close?.().catch(() => undefined);
  }
}
