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
import { SIGNATURE_HEADER, signIntent, type IntentSigner } from "../src/security/signing.ts";
import type { Reply } from "../src/schemas/reply.ts";
import type { WriteIntent } from "../src/schemas/write-intent.ts";
import type { Escalation } from "../src/schemas/escalation.ts";
import { KIND_HEADER, resolutionSubject, type Resolution } from "../src/schemas/resolution.ts";
import { TopicEnsurer } from "../src/topics.ts";
import { startSubmitSpan } from "../src/tracing/spans.ts";

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
}

export interface WritClient {
  /** The agent this client submits for (part of every `run`-scoped intent key). */
  readonly agentId: string;
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
  /**
   * An operator's decision on an escalation from `writ.human`: `apply` it on
   * the record at `baseVersion` (default: the version the escalation showed),
   * `discard` it, or `return` it to its agent with `message`. The record's
   * owner carries it out; the agent gets the outcome on its reply topic, and
   * this resolves with the reply the owner sends this client (keyed by the
   * resolution's id), or `unknown` at the deadline. This client's agent id is
   * the operator's (with an agent registry it must be allowed `writ.resolve`).
   */
  resolve(
    escalation: Escalation,
    decision: { decision: "apply" | "discard" | "return"; baseVersion?: string; delta?: JsonPatchOp[]; message?: string },
    opts?: { timeoutMs?: number },
  ): Promise<SubmitResult>;
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
export async function createWritClient(
  input: ClientConfigInput & {
    logger?: Logger;
    offsetProbe?: OffsetProbe;
    /** Signs every intent (Ed25519, `writ-signature` header): required where owners run with an agent registry. */
    signer?: IntentSigner;
  },
): Promise<WritClient> {
  const { logger, offsetProbe, signer, ...raw } = input;
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
  let ends: { partition: number; high: string }[];
  const groupId = `writ.client.${config.agentId}.${randomUUID()}`;
  try {
    // The agent provisions its own reply topic; owners never create one because an intent names it.
    await new TopicEnsurer(admin, { numPartitions: config.replyTopicPartitions, replicationFactor: config.replicationFactor }).ensure([config.replyTopic]);
    const { topics } = await admin.fetchTopicMetadata({ topics: [config.replyTopic] });
    replyPartitions = Math.max(1, topics[0]?.partitions.length ?? 1);
    // The reply consumer starts at the topic's current (read_committed) end, committed for its group before it
    // joins: a consumer that kafkajs restarts after a crash resumes there instead of at the end of the moment,
    // which would skip the replies written in between.
    ends = await admin.fetchTopicOffsets(config.replyTopic);
  } finally {
    await admin.disconnect();
  }
  const probe = offsetProbe ?? createOffsetProbe({ brokers: config.brokers, clientId: `${config.clientId ?? "writ-client"}-probe`, log });
  const start = ends.map((e) => ({ partition: e.partition, offset: e.high }));
  if (probe.commitGroupOffsets) await probe.commitGroupOffsets(groupId, config.replyTopic, start);
  else {
    const setter = kafka.admin();
    await setter.connect();
    await setter.setOffsets({ groupId, topic: config.replyTopic, partitions: start }).finally(() => setter.disconnect());
  }
  const client = new KafkaWritClient(config, kafka, log, probe, replyPartitions, groupId, signer);
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
  readonly agentId: string;
  /** Ends of the reply partitions as last probed, shared by submits within a second. */
  private lastProbe: { at: number; ends: Promise<EndOffsets[] | null> } | null = null;

  private readonly signer: IntentSigner | undefined;

  constructor(config: ClientConfig, kafka: Kafka, log: Logger, probe: OffsetProbe, replyPartitions: number, groupId: string, signer?: IntentSigner) {
    this.signer = signer;
    this.config = config;
    this.replyPartitions = replyPartitions;
    this.agentId = config.agentId;
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
      intentKey: intentKey({ tool: i.tool, agentId: this.config.agentId, runId: i.runId, stepId: i.stepId, entity: i.entity, params: i.params }),
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
    // One `writ.submit` span per intent, until its reply or its deadline; its trace context travels in the record's headers.
    const spans = intents.map((intent) => startSubmitSpan(intent, this.config.intentsTopic));
    // The reply partitions' ends as the wait begins: at the deadline, an end that has not moved tells a blocked topic from a slow owner.
    const before = this.ends();
    const timers: NodeJS.Timeout[] = [];
    const results = intents.map(
      (intent, i) =>
        new Promise<SubmitResult>((resolve) => {
          const timer = setTimeout(() => {
            this.waiting.delete(intent.intentId);
            void this.timedOut(intent, before).then((result) => {
              spans[i]!.answered(result);
              resolve(result);
            });
          }, timeoutMs);
          timers.push(timer);
          this.waiting.set(intent.intentId, (reply) => {
            clearTimeout(timer);
            this.waiting.delete(intent.intentId);
            spans[i]!.answered(reply);
            resolve(reply);
          });
        }),
    );
    try {
      const messages = await Promise.all(
        intents.map(async (intent) => ({
          key: entityKey(intent.entity),
          value: await this.codec.encode(this.config.intentsTopic, "WriteIntent", intent),
          ...(this.signer ? { headers: { [SIGNATURE_HEADER]: signIntent(intent, this.signer) } } : {}),
        })),
      );
      for (const [i, m] of messages.entries()) spans[i]!.stamp(m);
      await this.producer.send({ topic: this.config.intentsTopic, messages, acks: -1 });
    } catch (err) {
      for (const span of spans) span.failed(err);
      // Nothing is waited for when the send failed: drop the waiters and their timers.
      for (const t of timers) clearTimeout(t);
      for (const intent of intents) this.waiting.delete(intent.intentId);
      throw err;
    }
    return Promise.all(results);
  }

  async resolve(
    escalation: Escalation,
    d: { decision: "apply" | "discard" | "return"; baseVersion?: string; delta?: JsonPatchOp[]; message?: string },
    opts?: { timeoutMs?: number },
  ): Promise<SubmitResult> {
    const baseVersion = d.baseVersion ?? escalation.current?.version;
    const resolution: Resolution = {
      kind: "resolution",
      resolutionId: randomUUID(),
      escalationId: escalation.escalationId,
      intent: escalation.intent,
      decision: d.decision,
      ...(d.decision === "apply" && baseVersion !== undefined ? { baseVersion } : {}),
      ...(d.delta ? { delta: d.delta } : {}),
      ...(d.message ? { message: d.message } : {}),
      operator: { id: this.config.agentId },
      replyTo: this.config.replyTopic,
      entity: escalation.intent.entity,
      createdAt: new Date().toISOString(),
    };
    const timeoutMs = opts?.timeoutMs ?? this.config.submitTimeoutMs;
    const answer = new Promise<SubmitResult>((resolve) => {
      const timer = setTimeout(() => {
        this.waiting.delete(resolution.resolutionId);
        resolve({ status: "unknown", intentId: resolution.resolutionId, intentKey: resolution.intent.intentKey, message: "No answer to the resolution before the deadline; look at writ.human and the record before deciding again." });
      }, timeoutMs);
      this.waiting.set(resolution.resolutionId, (reply) => {
        clearTimeout(timer);
        this.waiting.delete(resolution.resolutionId);
        resolve(reply);
      });
    });
    const value = await this.codec.encode(this.config.intentsTopic, "Resolution", resolution, { subject: resolutionSubject(this.config.intentsTopic) });
    const headers: Record<string, string> = { [KIND_HEADER]: "resolution" };
    if (this.signer) headers[SIGNATURE_HEADER] = signIntent(resolution, this.signer);
    await this.producer.send({ topic: this.config.intentsTopic, messages: [{ key: entityKey(resolution.intent.entity), value, headers }], acks: -1 });
    return answer;
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
