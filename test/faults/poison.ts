// Poison records interleaved with the fault suite's load: each is followed by a valid intent on the
// same partition (the same record key), which must be applied while the poison gets a dead letter.
import { Kafka, Partitioners, logLevel } from "kafkajs";
import type { WritClient } from "../../producers/writ-client.ts";
import { refundPayment } from "../../examples/demo-tools.ts";
import { readRecord } from "../../examples/example-stack.ts";
import { consoleProduce } from "../../scripts/kafka-cli.ts";

/** One poison record and the dead-letter reason it must get. */
export interface Poison {
  kind: "deep-json" | "huge-garbage" | "lz4-garbage";
  key: string;
  expect: "too_deep" | "too_large" | "undecodable";
}

/** A valid intent sent after poison on the same partition; it must be applied. */
export interface FollowUp {
  intentKey: string;
  via: "client" | "lz4-batch";
}

export interface PoisonRound {
  poisons: Poison[];
  followUps: FollowUp[];
}

function deepArray(depth: number): string {
  return "[".repeat(depth) + "]".repeat(depth);
}

/**
 * Sends, keyed by `entity`'s key: a schema-valid intent whose params hold a
 * 10,000-deep array (~20 KB), 900 KB of garbage, and, from the Kafka
 * distribution's own console producer with `compression.type=lz4`, a batch of
 * a garbage line and a valid intent (a foreign client, and a codec kafkajs
 * lacks by itself). Then a valid intent through writ's client. Returns what
 * must be checked afterwards.
 */
export async function injectPoison(opts: {
  brokers: string[];
  intentsTopic: string;
  client: WritClient;
  recordsUrl: string;
  entity: { type: "payment"; id: string };
  runId: string;
  tag: string;
}): Promise<PoisonRound> {
  const key = `${opts.entity.type}:${opts.entity.id}`;
  const base = await readRecord<unknown>(opts.recordsUrl, opts.entity.type, opts.entity.id);
  const intent = (step: string, amountCents: number) =>
    opts.client.buildIntent({
      tool: refundPayment,
      entity: opts.entity,
      runId: opts.runId,
      stepId: `${opts.tag}-${step}`,
      baseVersion: base.version,
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents, reason: "goodwill", ref: `${opts.tag}-${step}` } }],
      params: { amountCents, reason: "goodwill", ref: `${opts.tag}-${step}` },
    });
  const deep = intent("deep", 101);
  const deepJson = JSON.stringify({ ...deep, params: { ...deep.params, extra: 0 } }).replace('"extra":0', `"extra":${deepArray(10_000)}`);
  const huge = Buffer.alloc(900 * 1024, "poison-");
  const kafka = new Kafka({ clientId: "fault-poison", brokers: opts.brokers, logLevel: logLevel.NOTHING });
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, allowAutoTopicCreation: false });
  await producer.connect();
  try {
    await producer.send({ topic: opts.intentsTopic, messages: [{ key, value: deepJson }], acks: -1 });
    await producer.send({ topic: opts.intentsTopic, messages: [{ key, value: huge }], acks: -1 });
  } finally {
    await producer.disconnect();
  }
  const inLz4 = intent("lz4", 103);
  await consoleProduce({
    brokers: opts.brokers,
    topic: opts.intentsTopic,
    compression: "lz4",
    records: [
      { key, value: `lz4 poison ${opts.tag}: not an intent` },
      { key, value: JSON.stringify(inLz4) },
    ],
  });
  const after = await opts.client.submit(intent("after", 107), { timeoutMs: 120_000 });
  return {
    poisons: [
      { kind: "deep-json", key, expect: "too_deep" },
      { kind: "huge-garbage", key, expect: "too_large" },
      { kind: "lz4-garbage", key, expect: "undecodable" },
    ],
    followUps: [
      { intentKey: inLz4.intentKey, via: "lz4-batch" },
      { intentKey: after.intentKey, via: "client" },
    ],
  };
}
