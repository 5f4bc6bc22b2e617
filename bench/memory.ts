// The bench's memory line: the RSS of an owner process whose partitions hold
// `entries` ledger entries, against an owner of the same topics with an
// almost empty ledger, in the same run.
//
// 1. An owner (child process, bench/owner-process.ts) on fresh topics answers
//    one refund per intents partition: it now owns all 12 partitions with a
//    restored ledger of 12 entries. Its RSS (VmRSS in /proc/<pid>/status,
//    after a full GC) is the baseline. It stops.
// 2. One `done` intent entry the owner wrote is read back from the ledger
//    topic, checked against the exported zod schema (LedgerEntry, whatever
//    its shape is today), and cloned `entries` times with fresh intent keys,
//    intent ids and entity ids, written straight to the ledger topic (same
//    framing as the original, partition i mod 12) with a plain producer.
// 3. A new owner starts on the same topics; one new refund per partition is
//    answered only after that partition's ledger is restored. Its RSS is read
//    the same way.
import type { ChildProcess } from "node:child_process";
import { nextMessage, startChild, stopChild } from "./child.ts";
import { createHash, randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { Kafka, logLevel, type Message } from "kafkajs";
import { createWritClient, type WritClient } from "../producers/writ-client.ts";
import { refundPayment } from "../examples/demo-tools.ts";
import type { Logger } from "../src/logger.ts";
import { LedgerEntry } from "../src/schemas/ledger-entry.ts";
import { startDemoRecordsServer } from "../src/testing/demo-records-server.ts";
import { deleteTopics, onePerPartition, round, say } from "./workload.ts";

export interface MemoryOptions {
  brokers: string[];
  registryUrl: string | undefined;
  tag: string;
  partitions: number;
  entries: number;
  logger: Logger;
  keepTopics: boolean;
}

export interface MemoryResult {
  entries: number;
  ownerRssMb: number;
  baselineRssMb: number;
  bytesPerEntry: number;
  /** Size of one synthesized ledger value on the wire. */
  valueBytes: number;
  /** From the second owner's start to every partition's first answer. */
  restoreSeconds: number;
  seconds: number;
}

const MiB = 1024 * 1024;

export async function runMemory(opts: MemoryOptions): Promise<MemoryResult> {
  const started = performance.now();
  const { brokers, registryUrl, tag, partitions, logger } = opts;
  const topics = { intents: `writ.bench.${tag}.intents`, ledger: `writ.bench.${tag}.ledger`, human: `writ.bench.${tag}.human`, dlq: `writ.bench.${tag}.dlq` };
  const replyTopic = `writ.replies.bench.${tag}`;
  const ownerConfig = { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.bench.${tag}`, intentPartitions: partitions, topics };
  const records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
  const warmIds = onePerPartition("warm_", partitions);
  for (const id of warmIds) records.seed("payment", id, { customer: "bench", amountCents: 1_000_000, currency: "EUR", refunds: [] });
  let owner: ChildProcess | null = null;
  let client: WritClient | null = null;

  const startOwner = (n: number): Promise<ChildProcess> =>
    startChild("owner-process.ts", { BENCH_OWNER_CONFIG: JSON.stringify(ownerConfig), RECORDS_URL: records.url, WRIT_INSTANCE_ID: `bench-memory-${n}` }, `bench-memory-owner-${n}.log`, { execArgv: ["--expose-gc"] });
  /** One new refund per intents partition; resolves once each is answered `applied`. */
  const answerEveryPartition = async (round: string, timeoutMs: number): Promise<void> => {
    client ??= await createWritClient({ brokers, agentId: "bench-memory", replyTopic, intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger });
    const replies = await client.submitAll(
      warmIds.map((id) => ({
        tool: refundPayment,
        entity: { type: "payment", id },
        runId: `bench-${tag}`,
        stepId: `${round}-${id}`,
        baseVersion: '"v1"',
        delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 1, reason: "goodwill", ref: `${round}-${id}` } }],
        params: { amountCents: 1, reason: "goodwill", ref: `${round}-${id}` },
      })),
      { timeoutMs },
    );
    const bad = replies.filter((r) => r.status !== "applied");
    if (bad.length > 0) throw new Error(`memory: ${bad.length} of ${replies.length} ${round} intents answered ${bad[0]!.status}`);
  };
  const measure = async (child: ChildProcess): Promise<number> => {
    child.send({ type: "measure" });
    const m = (await nextMessage(child, "measured", 60_000)) as { owned: number[] };
    if (m.owned.length !== partitions) throw new Error(`memory: the owner owns ${m.owned.length} of ${partitions} partitions`);
    return vmRssBytes(child.pid!);
  };
  const stopOwner = stopChild;

  try {
    owner = await startOwner(1);
    await answerEveryPartition("baseline", 120_000);
    const baseline = await measure(owner);
    say(`  memory: owner with an empty ledger (${partitions} entries): RSS ${(baseline / MiB).toFixed(1)} MB`);
    await stopOwner(owner);
    owner = null;

    const template = await readDoneEntry(brokers, topics.ledger);
    const produced = await writeEntries(brokers, topics.ledger, partitions, opts.entries, template);
    say(`  memory: wrote ${opts.entries.toLocaleString("en")} ledger entries (${produced.valueBytes} bytes each) in ${produced.seconds.toFixed(1)} s`);

    const restoreStart = performance.now();
    owner = await startOwner(2);
    await answerEveryPartition("loaded", 900_000);
    const restoreSeconds = (performance.now() - restoreStart) / 1000;
    const loaded = await measure(owner);
    say(`  memory: owner with ${opts.entries.toLocaleString("en")} more entries: RSS ${(loaded / MiB).toFixed(1)} MB, restored in ${restoreSeconds.toFixed(1)} s`);
    await stopOwner(owner);
    owner = null;
    return {
      entries: opts.entries,
      ownerRssMb: round(loaded / MiB, 1)!,
      baselineRssMb: round(baseline / MiB, 1)!,
      bytesPerEntry: Math.round((loaded - baseline) / opts.entries),
      valueBytes: produced.valueBytes,
      restoreSeconds: round(restoreSeconds, 1)!,
      seconds: round((performance.now() - started) / 1000, 1)!,
    };
  } finally {
    if (owner && owner.exitCode === null) owner.kill("SIGKILL");
    await (client as WritClient | null)?.close();
    await records.close();
    if (!opts.keepTopics) await deleteTopics(brokers, [...Object.values(topics), replyTopic]);
  }
}

function vmRssBytes(pid: number): number {
  const line = readFileSync(`/proc/${pid}/status`, "utf8")
    .split("\n")
    .find((l) => l.startsWith("VmRSS:"));
  if (!line) throw new Error(`memory: no VmRSS in /proc/${pid}/status`);
  return Number(line.replace(/\D+/g, "")) * 1024;
}

interface Template {
  /** Wire-format header (magic byte and schema id) when the owner framed its values; empty for plain JSON. */
  header: Buffer;
  /** The entry's JSON cut at the values that change per clone: [text, slot, text, slot, …, text]. */
  parts: string[];
  slots: ("key" | "id" | "entity")[];
}

/** The first `done` intent entry in the ledger topic, as the owner wrote it, validated with the zod schema. */
async function readDoneEntry(brokers: string[], topic: string): Promise<Template> {
  const kafka = new Kafka({ clientId: "writ-bench-memory-reader", brokers, logLevel: logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: `writ.bench.memory-reader.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 500 });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  try {
    return await new Promise<Template>((resolvePromise, reject) => {
      const timer = setTimeout(() => reject(new Error(`memory: no done intent entry in ${topic} within 60 s`)), 60_000);
      void consumer.run({
        eachMessage: async ({ message }) => {
          const bytes = message.value;
          if (!bytes || bytes.length === 0) return;
          const framed = bytes[0] === 0;
          const header = framed ? bytes.subarray(0, 5) : Buffer.alloc(0);
          const parsed = LedgerEntry.safeParse(JSON.parse(bytes.subarray(header.length).toString("utf8")));
          if (!parsed.success) throw new Error(`memory: a ledger entry the owner wrote fails LedgerEntry: ${parsed.error.message}`);
          const entry = parsed.data as Record<string, unknown>;
          if (entry.kind !== "intent" || entry.status !== "done") return;
          clearTimeout(timer);
          resolvePromise(templateOf(Buffer.from(header), JSON.stringify(entry), message.key?.toString() ?? "", entry));
        },
      });
    });
  } finally {
    await consumer.disconnect();
  }
}

function templateOf(header: Buffer, json: string, key: string, entry: Record<string, unknown>): Template {
  const tokens: [string, Template["slots"][number]][] = [];
  if (key) tokens.push([JSON.stringify(key), "key"]);
  if (typeof entry.intentId === "string") tokens.push([JSON.stringify(entry.intentId), "id"]);
  const entity = entry.entity as { id?: unknown } | undefined;
  if (typeof entity?.id === "string") tokens.push([JSON.stringify(entity.id), "entity"]);
  let parts = [json];
  const slots: Template["slots"] = [];
  // Split at every occurrence of every token, left to right.
  const re = new RegExp(tokens.map(([t]) => t.replace(/[.*+?^${}()|[\]\\]/g, "\\$&")).join("|"), "g");
  if (tokens.length > 0) {
    parts = [];
    let last = 0;
    for (const m of json.matchAll(re)) {
      parts.push(json.slice(last, m.index));
      slots.push(tokens.find(([t]) => t === m[0])![1]);
      last = m.index + m[0].length;
    }
    parts.push(json.slice(last));
  }
  return { header, parts, slots };
}

async function writeEntries(brokers: string[], topic: string, partitions: number, entries: number, template: Template): Promise<{ valueBytes: number; seconds: number }> {
  const started = performance.now();
  const clone = (i: number): { key: string; value: Buffer } => {
    const key = createHash("sha256").update(`bench-memory-${i}`).digest("hex");
    const values = { key: JSON.stringify(key), id: JSON.stringify(randomUUID()), entity: JSON.stringify(`mem_${i}`) };
    let json = template.parts[0]!;
    for (let s = 0; s < template.slots.length; s++) json += values[template.slots[s]!] + template.parts[s + 1]!;
    return { key, value: template.header.length > 0 ? Buffer.concat([template.header, Buffer.from(json)]) : Buffer.from(json) };
  };
  // Spot checks against the schema: the clones must be entries an owner accepts.
  for (const i of [0, 1, entries - 1]) {
    const { value } = clone(i);
    const parsed = LedgerEntry.safeParse(JSON.parse(value.subarray(template.header.length).toString("utf8")));
    if (!parsed.success) throw new Error(`memory: a synthesized ledger entry fails LedgerEntry: ${parsed.error.message}`);
  }
  const valueBytes = clone(0).value.length;
  const kafka = new Kafka({ clientId: "writ-bench-memory-writer", brokers, logLevel: logLevel.ERROR });
  const producer = kafka.producer({ allowAutoTopicCreation: false });
  await producer.connect();
  try {
    // Keep each partition's record batch well under the broker's 1 MB message.max.bytes.
    const perRequest = Math.max(partitions, Math.floor((400 * 1024) / (valueBytes + 80)) * partitions);
    let next = 0;
    let reported = 0;
    const worker = async () => {
      while (next < entries) {
        const from = next;
        const to = Math.min(entries, from + perRequest);
        next = to;
        const messages: Message[] = [];
        for (let i = from; i < to; i++) messages.push({ ...clone(i), partition: i % partitions });
        await producer.send({ topic, acks: 1, messages });
        if (to - reported >= 100_000) {
          reported = to;
          say(`  memory: ${to.toLocaleString("en")} entries written (${((performance.now() - started) / 1000).toFixed(1)} s)`);
        }
      }
    };
    await Promise.all([worker(), worker(), worker()]);
  } finally {
    await producer.disconnect();
  }
  return { valueBytes, seconds: (performance.now() - started) / 1000 };
}
