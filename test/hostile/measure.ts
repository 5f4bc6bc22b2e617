// Measuring from outside the owner: every record the suite sends is noted in the Book (with the oracle's
// view of it) before it is sent; replies and dead letters are read back with read_committed; the owners'
// committed offsets are polled against the intents topic; the records server's own logs count effects.
import { randomUUID } from "node:crypto";
import type { Admin, Consumer, Kafka } from "kafkajs";
import type { WireCodec } from "../../src/codec.ts";
import { isControlRecord } from "../../src/schemas/control.ts";
import type { DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { type Agent, oracle, sha256, SIGNATURE_HEADER } from "./wire.ts";

export type Role = "valid" | "attack" | "mutation";

/** Headers as the suite sends them (kafkajs shape; a `null` value only via the Java producer). */
export type SentHeaders = Record<string, string | Buffer | null | (string | Buffer)[]>;

interface IdEntry {
  /** Agents that records with this intent id claim. */
  claimed: Set<string>;
  /** Some record with this id was a genuinely signed intent. */
  validSigned: boolean;
}

export interface ValidRecord {
  intentId: string;
  intentKey: string;
  agent: string;
  label: string;
}

/** Every record sent, as far as the measure needs it. */
export class Book {
  readonly agents: ReadonlyMap<string, Agent>;
  private readonly ids = new Map<string, IdEntry>();
  /** Intent keys a genuinely signed intent carries: the only keys that may reach the records server. */
  readonly authorizedKeys = new Set<string>();
  /** Records sent as valid intents, which must be answered (and applied once). */
  readonly valid: ValidRecord[] = [];
  /** sha256 of the values of hand-written attacks → attack label (for the outcome table). */
  readonly attackBySha = new Map<string, string>();
  readonly attackByIntentId = new Map<string, string>();
  inputs = 0;
  oracleValidMutations = 0;

  constructor(agents: Agent[]) {
    this.agents = new Map(agents.map((a) => [a.id, a]));
  }

  /** Notes a record before it is sent. `track`: show its outcome under `label` in the attack table (attack records always are). */
  note(role: Role, value: Buffer | null, headers: SentHeaders | undefined, label: string, key?: string | Buffer | null, track = role === "attack"): void {
    const raw = headers?.[SIGNATURE_HEADER];
    const sig = raw === undefined ? [] : Array.isArray(raw) ? raw : [raw];
    const view = oracle(value, sig, this.agents);
    let e = this.ids.get(view.intentId);
    if (!e) this.ids.set(view.intentId, (e = { claimed: new Set(), validSigned: false }));
    if (view.claimed !== null) e.claimed.add(view.claimed);
    if (view.valid) {
      e.validSigned = true;
      this.authorizedKeys.add(view.intentKey!);
      if (role === "mutation") this.oracleValidMutations++;
    }
    if (role === "valid") {
      if (!view.valid) throw new Error(`the suite's own valid intent ${label} is not valid by the oracle`);
      this.valid.push({ intentId: view.intentId, intentKey: view.intentKey!, agent: view.claimed!, label });
    } else {
      this.inputs++;
    }
    if (track) {
      this.attackBySha.set(deadLetterId(value, key), label);
      if (view.intentId !== "") this.attackByIntentId.set(view.intentId, label);
    }
  }

  id(intentId: string): IdEntry | undefined {
    return this.ids.get(intentId);
  }
}

/** How a dead letter names its record: the value's sha256 and the key as the owner reads it (UTF-8, first 1024 characters). */
export function deadLetterId(value: Buffer | null, key: string | Buffer | null | undefined): string {
  const k = key === null || key === undefined ? "" : Buffer.from(key).toString("utf8").slice(0, 1024);
  return `${sha256(value ?? Buffer.alloc(0))}|${k}`;
}

export interface ReplySeen {
  topic: string;
  intentId: string;
  intentKey: string;
  status: string;
  reason?: string;
  duplicate: boolean;
}

/**
 * Reads reply topics and the dead-letter topic with read_committed, skipping control records, and
 * judges every reply against the Book as it arrives (the Book notes a record before it is sent).
 */
export class Taps {
  readonly replies = new Map<string, ReplySeen[]>();
  readonly dlqReasons = new Map<string, number>();
  readonly attackOutcomes = new Map<string, string[]>();
  rejected = 0;
  dlq = 0;
  /** Replies by status (and reason), for the report. */
  readonly tally = new Map<string, number>();
  unauthorizedReplies: string[] = [];
  private readonly positions = new Map<string, bigint>();
  private consumer: Consumer | null = null;
  private readonly registeredTopics: Map<string, string>;

  private readonly kafka: Kafka;
  private readonly codec: WireCodec;
  private readonly book: Book;
  private readonly replyTopics: string[];
  private readonly dlqTopic: string;

  constructor(kafka: Kafka, codec: WireCodec, book: Book, replyTopics: string[], dlqTopic: string) {
    this.kafka = kafka;
    this.codec = codec;
    this.book = book;
    this.replyTopics = replyTopics;
    this.dlqTopic = dlqTopic;
    this.registeredTopics = new Map([...book.agents.values()].map((a) => [a.replyTopic, a.id]));
  }

  async start(): Promise<void> {
    const c = this.kafka.consumer({ groupId: `writ.hostile.taps.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 250, maxBytesPerPartition: 4 << 20 });
    this.consumer = c;
    c.on(c.events.END_BATCH_PROCESS, ({ payload }) => {
      const k = `${payload.topic}/${payload.partition}`;
      const next = BigInt(payload.lastOffset) + 1n;
      if ((this.positions.get(k) ?? 0n) < next) this.positions.set(k, next);
    });
    await c.connect();
    for (const topic of [...this.replyTopics, this.dlqTopic]) await c.subscribe({ topic, fromBeginning: true });
    await c.run({
      partitionsConsumedConcurrently: 4,
      eachMessage: async ({ topic, message }) => {
        if (isControlRecord(message.headers)) return;
        if (topic === this.dlqTopic) return this.onDeadLetter(message.value);
        const d = await this.codec.decode("Reply", message.value);
        if (!d.ok) {
          this.unauthorizedReplies.push(`${topic}: an undecodable reply (${d.message})`);
          return;
        }
        this.onReply(topic, d.value as unknown as ReplySeen & { reason?: string });
      },
    });
  }

  private async onDeadLetter(value: Buffer | null): Promise<void> {
    const d = await this.codec.decode("DeadLetter", value);
    this.dlq++;
    if (!d.ok) return;
    this.dlqReasons.set(d.value.reason, (this.dlqReasons.get(d.value.reason) ?? 0) + 1);
    const label = this.book.attackBySha.get(`${d.value.sha256}|${d.value.key ?? ""}`);
    if (label) this.attackOutcomes.set(label, [...(this.attackOutcomes.get(label) ?? []), `dlq:${d.value.reason}`]);
  }

  private onReply(topic: string, r: { intentId: string; intentKey: string; status: string; reason?: string; duplicate: boolean }): void {
    const seen: ReplySeen = { topic, intentId: r.intentId, intentKey: r.intentKey, status: r.status, duplicate: r.duplicate, ...(r.reason ? { reason: r.reason } : {}) };
    if (r.status === "rejected") this.rejected++;
    const t = `${r.status}${r.reason ? `:${r.reason}` : ""}${r.duplicate ? "(dup)" : ""}`;
    this.tally.set(t, (this.tally.get(t) ?? 0) + 1);
    const entry = this.book.id(r.intentId);
    const owner = this.registeredTopics.get(topic);
    // Only the registered topic of an agent some record with this id claimed may carry its reply.
    if (!entry || owner === undefined || !entry.claimed.has(owner)) {
      this.unauthorizedReplies.push(`${topic}: ${r.status} for intent id ${JSON.stringify(r.intentId.slice(0, 80))}, which no record claiming ${owner ?? "(no agent)"} carries`);
    }
    // Replies that carry record state only for genuinely signed intents.
    if ((r.status === "applied" || r.status === "conflict") && (!entry?.validSigned || !this.book.authorizedKeys.has(r.intentKey))) {
      this.unauthorizedReplies.push(`${topic}: ${r.status} reply for intent id ${JSON.stringify(r.intentId.slice(0, 80))}, not a genuinely signed intent`);
    }
    const list = this.replies.get(r.intentId);
    if (list) list.push(seen);
    else if (this.book.attackByIntentId.has(r.intentId) || this.isValidId(r.intentId)) this.replies.set(r.intentId, [seen]);
    const label = this.book.attackByIntentId.get(r.intentId);
    if (label) this.attackOutcomes.set(label, [...(this.attackOutcomes.get(label) ?? []), `${r.status}${r.reason ? `:${r.reason}` : ""}${r.duplicate ? "(dup)" : ""}`]);
  }

  private validIds: Set<string> | null = null;
  private isValidId(id: string): boolean {
    if (!this.validIds || this.validIds.size !== this.book.valid.length) this.validIds = new Set(this.book.valid.map((v) => v.intentId));
    return this.validIds.has(id);
  }

  /** True when the taps have read every partition of their topics up to its end (control records included). */
  async caughtUp(admin: Admin): Promise<boolean> {
    for (const topic of [...this.replyTopics, this.dlqTopic]) {
      for (const o of await admin.fetchTopicOffsets(topic)) {
        if (BigInt(o.high) > BigInt(o.low) && (this.positions.get(`${topic}/${o.partition}`) ?? BigInt(o.low)) < BigInt(o.high)) return false;
      }
    }
    return true;
  }

  async stop(): Promise<void> {
    await this.consumer?.disconnect().catch(() => undefined);
  }
}

/** Reads the intents topic (read_committed) to know, per partition, the offset after its last data record. */
export class IntentsTail {
  readonly lastData = new Map<number, bigint>();
  private readonly positions = new Map<number, bigint>();
  private consumer: Consumer | null = null;

  private readonly kafka: Kafka;
  private readonly topic: string;

  constructor(kafka: Kafka, topic: string) {
    this.kafka = kafka;
    this.topic = topic;
  }

  async start(): Promise<void> {
    const c = this.kafka.consumer({ groupId: `writ.hostile.tail.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 250, maxBytesPerPartition: 4 << 20 });
    this.consumer = c;
    c.on(c.events.END_BATCH_PROCESS, ({ payload }) => {
      const next = BigInt(payload.lastOffset) + 1n;
      if ((this.positions.get(payload.partition) ?? 0n) < next) this.positions.set(payload.partition, next);
    });
    await c.connect();
    await c.subscribe({ topic: this.topic, fromBeginning: true });
    await c.run({
      eachBatch: async ({ batch }) => {
        const last = batch.messages.at(-1);
        if (last) this.lastData.set(batch.partition, BigInt(last.offset) + 1n);
      },
    });
  }

  /**
   * Partitions whose committed offset (the owners' group) has not yet passed their last data record, or
   * that this reader has not read to the end. A committed offset may stop before trailing transaction
   * markers (of forwarded records): control records are not intents.
   */
  async behind(admin: Admin, groupId: string): Promise<{ partition: number; committed: string; lastData: string; high: string }[]> {
    const ends = await admin.fetchTopicOffsets(this.topic);
    const [committed] = await admin.fetchOffsets({ groupId, topics: [this.topic] });
    const out = [];
    for (const e of ends) {
      const c = committed?.partitions.find((p) => p.partition === e.partition)?.offset ?? "-1";
      const data = this.lastData.get(e.partition) ?? 0n;
      const read = (this.positions.get(e.partition) ?? BigInt(e.low)) >= BigInt(e.high);
      if (!read || (data > 0n && BigInt(c) < data)) out.push({ partition: e.partition, committed: c, lastData: data.toString(), high: e.high });
    }
    return out;
  }

  async stop(): Promise<void> {
    await this.consumer?.disconnect().catch(() => undefined);
  }
}

/** Polls `check` until it returns a value that `done` accepts, or the deadline passes; returns the last value. */
export async function pollUntil<T>(check: () => Promise<T>, done: (v: T) => boolean, deadlineMs: number, everyMs = 250): Promise<{ value: T; ok: boolean }> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    const value = await check();
    if (done(value)) return { value, ok: true };
    if (Date.now() >= end) return { value, ok: false };
    await new Promise((r) => setTimeout(r, everyMs));
  }
}

export interface Effects {
  count: number;
  examples: string[];
}

/**
 * Effects at the records server for intent keys that no genuinely signed intent carries: PATCH
 * requests (with no key, or an unauthorized one), and committed writes not explained by seeds or
 * authorized keys. Also: authorized keys written more than once (reported apart, as duplicates).
 */
export function recordsServerEffects(records: DemoRecordsServer, book: Book, seeds: number): { unauthorized: Effects; duplicates: string[] } {
  const examples: string[] = [];
  let count = 0;
  for (const row of records.patchRequests()) {
    if (row.idempotencyKey === null || !book.authorizedKeys.has(row.idempotencyKey)) {
      count++;
      if (examples.length < 10) examples.push(`PATCH ${row.type}/${row.id} with key ${row.idempotencyKey} (${row.outcome})`);
    }
  }
  const stats = records.stats();
  let authorizedWrites = 0;
  const duplicates: string[] = [];
  for (const [k, n] of Object.entries(stats.writesByKey)) {
    if (book.authorizedKeys.has(k)) {
      authorizedWrites += n;
      if (n > 1) duplicates.push(`${k} written ${n} times`);
    } else {
      count += n;
      if (examples.length < 10) examples.push(`${n} write(s) for key ${k}`);
    }
  }
  const unexplained = stats.writes - seeds - authorizedWrites - Object.entries(stats.writesByKey).filter(([k]) => !book.authorizedKeys.has(k)).reduce((s, [, n]) => s + n, 0);
  if (unexplained > 0) {
    count += unexplained;
    examples.push(`${unexplained} write(s) without an idempotency key`);
  }
  return { unauthorized: { count, examples }, duplicates };
}
