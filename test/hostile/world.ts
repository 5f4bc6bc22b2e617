// The hostile-input suite's world: fresh topics (6 intents partitions), three registered agents with
// their reply topics, a decoy reply topic nobody registered, the demo records server with its
// Idempotency-Key dedupe off, schema ids of the intents and dead-letter subjects, and one kafkajs
// producer through which every kafkajs-sent record is first noted in the Book.
import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type Admin, type Producer } from "kafkajs";
import { WireCodec } from "../../src/codec.ts";
import { partitionFor } from "../../src/kafka/partition.ts";
import { registerCompressionCodecs } from "../../src/kafka/compression.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { Book, type Role, type SentHeaders } from "./measure.ts";
import { type Agent, type Json, makeAgents, frame, refundOf, sign, tagOf, SIGNATURE_HEADER } from "./wire.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

export const PARTITIONS = 6;

export interface Out {
  role: Role;
  label: string;
  key: string | Buffer | null;
  value: Buffer | null;
  headers?: SentHeaders;
  partition?: number;
  /** Show this record's outcome in the attack table under `label` (attack records always are). */
  track?: boolean;
}

export interface Ent {
  type: "payment" | "ticket";
  id: string;
  key: string;
  home: number;
}

export interface World {
  id: string;
  brokers: string[];
  registryUrl: string;
  kafka: Kafka;
  admin: Admin;
  producer: Producer;
  codec: WireCodec;
  groupId: string;
  topics: { intents: string; ledger: string; human: string; dlq: string };
  agents: Agent[];
  billing: Agent;
  alice: Agent;
  ops: Agent;
  /** An existing reply topic no agent registered; and one that does not exist (owners must never create it). */
  decoyTopic: string;
  missingTopic: string;
  schemaIds: { intents: number; dlq: number; reply: number };
  records: DemoRecordsServer;
  book: Book;
  seeds: number;
  runId: string;
  entity(type: "payment" | "ticket"): Ent;
  /** Notes each record in the Book, then produces them in order (acks -1). */
  send(outs: Out[]): Promise<void>;
  /** A valid signed intent as an Out (framed like writ's client with a registry). */
  valid(intent: Json, agent: Agent, label: string, extra?: Partial<Out>): Out;
  framed(json: string | Buffer): Buffer;
  refund(agent: Agent, e: Ent, step: string, amountCents?: number): Json;
  tag(agent: Agent, e: Ent, step: string, tag?: string): Json;
  sig(value: unknown, agent: Agent): SentHeaders;
}

export async function createWorld(opts: { brokers: string[]; registryUrl: string }): Promise<World> {
  registerCompressionCodecs();
  const id = randomUUID().slice(0, 8);
  const kafka = new Kafka({ clientId: `writ-hostile-${id}`, brokers: opts.brokers, logLevel: process.env.HOSTILE_KAFKA_LOG ? logLevel.WARN : logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const topics = { intents: `writ.intents.hostile.${id}`, ledger: `writ.ledger.hostile.${id}`, human: `writ.human.hostile.${id}`, dlq: `writ.dlq.hostile.${id}` };
  const agents = makeAgents(`hostile.${id}`);
  const [billing, alice, ops] = agents as [Agent, Agent, Agent];
  const decoyTopic = `writ.replies.decoy.hostile.${id}`;
  const missingTopic = `writ.replies.ghost.hostile.${id}`;
  await createTopicsWithLeaders(
    admin,
    [...agents.map((a) => a.replyTopic), decoyTopic].map((topic) => ({ topic, numPartitions: 1, replicationFactor: 1 })),
  );
  const records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
  const codec = new WireCodec({ schemaRegistryUrl: opts.registryUrl });
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, allowAutoTopicCreation: false, maxInFlightRequests: 1 });
  await producer.connect();
  const book = new Book(agents);
  let counter = 0;
  const w: World = {
    id,
    brokers: opts.brokers,
    registryUrl: opts.registryUrl,
    kafka,
    admin,
    producer,
    codec,
    groupId: `writ.owners.hostile.${id}`,
    topics,
    agents,
    billing,
    alice,
    ops,
    decoyTopic,
    missingTopic,
    schemaIds: { intents: 0, dlq: 0, reply: 0 },
    records,
    book,
    seeds: 0,
    runId: `run-${id}`,
    entity(type) {
      const eid = `${type === "payment" ? "pay" : "T"}-h${id}-${++counter}`;
      records.seed(type, eid, type === "payment" ? { amountCents: 1_000_000, refunds: [] } : { status: "open", tags: [] });
      w.seeds++;
      const key = `${type}:${eid}`;
      return { type, id: eid, key, home: partitionFor(key, PARTITIONS) };
    },
    async send(outs) {
      for (const o of outs) book.note(o.role, o.value, o.headers, o.label, o.key, o.track ?? o.role === "attack");
      await producer.send({
        topic: topics.intents,
        acks: -1,
        messages: outs.map((o) => ({ key: o.key, value: o.value, ...(o.headers ? { headers: o.headers as never } : {}), ...(o.partition === undefined ? {} : { partition: o.partition }) })),
      });
    },
    valid(intent, agent, label, extra = {}) {
      const e = intent.entity as { type: string; id: string };
      return { role: "valid", label, key: `${e.type}:${e.id}`, value: w.framed(JSON.stringify(intent)), headers: w.sig(intent, agent), ...extra };
    },
    framed: (json) => frame(w.schemaIds.intents, json),
    refund: (agent, e, step, amountCents = 700) => refundOf(agent, e.id, w.runId, step, amountCents),
    tag: (agent, e, step, tag = "vip") => tagOf(agent, e.id, w.runId, step, tag),
    sig: (value, agent) => ({ [SIGNATURE_HEADER]: sign(value, agent) }),
  };
  // Schema ids: the intents subject's (as writ's client registers it), the dead-letter subject's and a reply subject's (for wrong-subject framing).
  const probe = refundOf(billing, "pay-probe", w.runId, "probe", 1);
  w.schemaIds.intents = (await codec.encode(topics.intents, "WriteIntent", probe)).readInt32BE(1);
  const at = new Date().toISOString();
  const dead = { reason: "undecodable" as const, message: "probe", source: { topic: topics.intents, partition: 0, offset: "0" }, key: null, valueBase64: "", originalBytes: 0, sha256: "0".repeat(64), truncated: false, headers: {}, at };
  w.schemaIds.dlq = (await codec.encode(topics.dlq, "DeadLetter", dead)).readInt32BE(1);
  const reply = { status: "rejected" as const, intentId: "probe", intentKey: "0".repeat(64), duplicate: false, at, reason: "undecodable" as const, message: "probe" };
  w.schemaIds.reply = (await codec.encode(billing.replyTopic, "Reply", reply)).readInt32BE(1);
  return w;
}
