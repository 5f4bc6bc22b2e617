import { randomUUID } from "node:crypto";
import { Partitioners, type Kafka, type KafkaMessage, type Message, type Producer, type TopicMessages } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import { WritError } from "../errors.ts";
import type { LedgerReader } from "../ledger/ledger-reader.ts";
import { markerKey } from "../ledger/ledger-reader.ts";
import type { LedgerTransaction, PartitionLedger } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import type { AcceptedIntent, IntentProcessor } from "./intent-processor.ts";
import { emptyOutputs, type BatchOutputs } from "./outputs.ts";

export interface PartitionOwnerDeps {
  kafka: Kafka;
  config: RouterConfig;
  codec: WireCodec;
  reader: LedgerReader;
  processor: IntentProcessor;
  log: Logger;
  ensureTopics: (topics: Iterable<string>) => Promise<void>;
}

/** Transactional id of the owner of intents partition p: one per partition fences a zombie owner (no KIP-447 in kafkajs). */
export function transactionalIdFor(config: RouterConfig, partition: number): string {
  return `${config.groupId}.${config.topics.intents}.${partition}`;
}

/**
 * The single writer of one intents partition. It alone holds the
 * transactional producer for the partition and the writable ledger; it
 * restores the ledger before it processes anything, and commits one Kafka
 * transaction per chunk of a batch: ledger entries, replies, escalations,
 * dead letters and the consumed offset.
 */
export class PartitionOwner {
  readonly partition: number;
  private readonly deps: PartitionOwnerDeps;
  private readonly ledger: PartitionLedger;
  private readonly log: Logger;
  private producer: Producer | null = null;
  private ready: Promise<void> | null = null;
  private closed = false;
  /** Serialises batches and sweeps on this partition's producer. */
  private turn: Promise<void> = Promise.resolve();

  constructor(partition: number, deps: PartitionOwnerDeps) {
    this.partition = partition;
    this.deps = deps;
    this.ledger = deps.reader.partition(partition);
    this.log = deps.log.child({ component: "partition-owner", topic: deps.config.topics.intents, partition });
  }

  /** Fences any earlier owner, then restores ledger partition p to its end. Idempotent. */
  open(heartbeat: () => Promise<void>): Promise<void> {
    this.ready ??= this.restore(heartbeat).catch((err: unknown) => {
      this.ready = null;
      throw err;
    });
    return this.ready;
  }

  private async restore(heartbeat: () => Promise<void>): Promise<void> {
    const { config, kafka, reader, codec } = this.deps;
    const started = Date.now();
    const producer = kafka.producer({
      transactionalId: transactionalIdFor(config, this.partition),
      idempotent: true,
      maxInFlightRequests: 1,
      transactionTimeout: config.transactionTimeoutMs,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    await producer.connect();
    this.producer = producer;
    const nonce = randomUUID();
    // Beginning a transaction runs InitProducerId, which fences the previous owner and aborts its open transaction.
    const txn = await producer.transaction();
    try {
      const value = await codec.encode(config.topics.ledger, "LedgerEntry", {
        kind: "marker",
        partition: this.partition,
        nonce,
        owner: config.instanceId,
        at: new Date().toISOString(),
      });
      await txn.send({ topic: config.topics.ledger, messages: [{ key: markerKey(this.partition), value, partition: this.partition }] });
      await txn.commit();
    } catch (err) {
      await txn.abort().catch(() => undefined);
      throw err;
    }
    const interval = setInterval(() => void heartbeat().catch(() => undefined), 1000);
    try {
      await reader.waitForMarker(this.partition, nonce, config.restoreTimeoutMs);
    } finally {
      clearInterval(interval);
    }
    this.ledger.own();
    this.log.info({ entries: this.ledger.size, ms: Date.now() - started }, "partition restored; owning it");
  }

  /**
   * Processes a fetched batch in order, in chunks that each commit one
   * transaction. Returns the offset of the last message committed.
   */
  async handle(
    messages: KafkaMessage[],
    hooks: { heartbeat: () => Promise<void>; resolveOffset: (offset: string) => void; isActive: () => boolean },
  ): Promise<void> {
    await this.open(hooks.heartbeat);
    await this.exclusive(async () => {
      let i = 0;
      while (i < messages.length && hooks.isActive() && !this.closed) {
        const chunk = this.nextChunk(messages, i);
        await this.processChunk(chunk);
        const last = chunk.at(-1)!;
        hooks.resolveOffset(last.offset);
        await hooks.heartbeat();
        i += chunk.length;
      }
    });
  }

  /**
   * Tombstones ledger entries past the retention window, also on a partition
   * that receives no intents. Runs between batches, never inside one: a
   * producer carries one transaction at a time.
   */
  async sweep(): Promise<number> {
    if (!this.ledger.owned || this.closed) return 0;
    return this.exclusive(async () => {
      const txn = this.ledger.begin();
      this.expire(txn);
      const count = txn.changes().length;
      if (count > 0) await this.commit(txn, emptyOutputs(), null);
      return count;
    });
  }

  private exclusive<T>(fn: () => Promise<T>): Promise<T> {
    const run = this.turn.then(fn);
    this.turn = run.then(
      () => undefined,
      () => undefined,
    );
    return run;
  }

  /** A chunk ends before a key repeats, so each intent's pending entry is planned once and durable before its write. */
  private nextChunk(messages: KafkaMessage[], start: number): KafkaMessage[] {
    const keys = new Set<string>();
    const chunk: KafkaMessage[] = [];
    for (let i = start; i < messages.length && chunk.length < this.deps.config.maxIntentsPerTransaction; i++) {
      const m = messages[i]!;
      const key = intentKeyHint(m);
      if (key !== null && keys.has(key)) break;
      if (key !== null) keys.add(key);
      chunk.push(m);
    }
    return chunk;
  }

  private async processChunk(chunk: KafkaMessage[]): Promise<void> {
    const { processor } = this.deps;
    const out = emptyOutputs();
    const ledger = this.ledger.begin();
    const accepted: AcceptedIntent[] = [];
    for (const message of chunk) {
      const d = await processor.decode(message, this.partition, out);
      if (d.kind === "accepted") accepted.push(d);
    }
    const inherited = new Set<string>();
    const pendingTxn = this.ledger.begin();
    for (const a of accepted) {
      const before = this.ledger.get(a.intent.intentKey);
      const pending = processor.planPending(a, pendingTxn);
      if (!pending) continue;
      if (before?.status === "pending") inherited.add(a.intent.intentKey);
      pendingTxn.put(pending);
    }
    if (!pendingTxn.empty) {
      // Step 3: pending is durable in Kafka before the system of record is called.
      await this.commit(pendingTxn, emptyOutputs(), null);
    }
    for (const a of accepted) await processor.process(a, ledger, inherited, out);
    this.expire(ledger);
    const lastOffset = chunk.at(-1)!.offset;
    await this.commit(ledger, out, (BigInt(lastOffset) + 1n).toString());
    if (out.replies.length > 0 || accepted.length > 0) {
      this.log.debug({ intents: chunk.length, replies: out.replies.length, offset: lastOffset }, "chunk committed");
    }
  }

  private expire(ledger: LedgerTransaction): void {
    const cutoff = new Date(Date.now() - this.deps.config.ledgerRetentionHours * 3_600_000);
    for (const key of this.ledger.expired(cutoff, 100)) {
      if (ledger.get(key)?.status !== "pending") ledger.tombstone(key);
    }
  }

  /** One Kafka transaction: ledger changes (explicit partition p), replies, escalations, dead letters and, if given, the offset. */
  private async commit(ledger: LedgerTransaction, out: BatchOutputs, nextOffset: string | null): Promise<void> {
    const { config, codec } = this.deps;
    const producer = this.producer;
    if (!producer || this.closed) {
      throw new WritError("producer_fenced", "partition is no longer owned here", { retriable: true, context: { partition: this.partition } });
    }
    const ledgerMessages: Message[] = [];
    for (const [key, entry] of ledger.changes()) {
      ledgerMessages.push({
        key,
        value: entry === null ? null : await codec.encode(config.topics.ledger, "LedgerEntry", entry),
        partition: this.partition,
      });
    }
    const byTopic = new Map<string, Message[]>();
    const push = (topic: string, m: Message) => {
      const list = byTopic.get(topic) ?? [];
      list.push(m);
      byTopic.set(topic, list);
    };
    if (ledgerMessages.length > 0) byTopic.set(config.topics.ledger, ledgerMessages);
    for (const r of out.replies) push(r.topic, { key: r.key, value: await codec.encode(r.topic, "Reply", r.value) });
    for (const e of out.escalations) push(config.topics.human, { key: e.key, value: await codec.encode(config.topics.human, "Escalation", e.value) });
    for (const d of out.deadLetters) push(config.topics.dlq, { key: d.key, value: await codec.encode(config.topics.dlq, "DeadLetter", d.value) });
    await this.deps.ensureTopics(out.replies.map((r) => r.topic));
    if (byTopic.size === 0 && nextOffset === null) return;
    const txn = await producer.transaction();
    try {
      const topicMessages: TopicMessages[] = [...byTopic].map(([topic, messages]) => ({ topic, messages }));
      if (topicMessages.length > 0) await txn.sendBatch({ topicMessages, acks: -1 });
      if (nextOffset !== null) {
        await txn.sendOffsets({
          consumerGroupId: config.groupId,
          topics: [{ topic: config.topics.intents, partitions: [{ partition: this.partition, offset: nextOffset }] }],
        });
      }
      await txn.commit();
    } catch (err) {
      await txn.abort().catch(() => undefined);
      if (isFencing(err)) {
        this.log.warn({ err }, "fenced by a newer owner of this partition");
        await this.close();
      }
      throw new WritError("kafka_failed", "batch transaction failed; the batch will be processed again", {
        retriable: true,
        cause: err,
        context: { partition: this.partition },
      });
    }
    ledger.commit();
  }

  async close(): Promise<void> {
    if (this.closed) return;
    this.closed = true;
    this.ledger.release();
    const producer = this.producer;
    this.producer = null;
    await producer?.disconnect().catch(() => undefined);
  }
}

/** The intent key of a message, read cheaply for chunking; null when it cannot be read (decode handles that). */
function intentKeyHint(message: KafkaMessage): string | null {
  const value = message.value;
  if (!value) return null;
  const text = value.toString("utf8", value[0] === 0 ? 5 : 0);
  const match = /"intentKey"\s*:\s*"([0-9a-f]{64})"/.exec(text);
  return match?.[1] ?? null;
}

function isFencing(err: unknown): boolean {
  const text = `${(err as Error)?.name ?? ""} ${(err as Error)?.message ?? ""} ${(err as { type?: string })?.type ?? ""}`;
  return /fenc|INVALID_PRODUCER_EPOCH|PRODUCER_FENCED|epoch/i.test(text);
}
