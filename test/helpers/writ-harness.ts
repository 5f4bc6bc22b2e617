import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { CompressionTypes, Kafka, logLevel } from "kafkajs";
import { onTestFinished } from "vitest";
import type { IntentInput } from "../../producers/client-api.ts";
import { createWritClient, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { sha256Hex } from "../../src/canonical-json.ts";
import { WireCodec } from "../../src/codec.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import { isControlRecord } from "../../src/schemas/control.ts";
import type { RouterConfigInput } from "../../src/config.ts";
import { createLogger } from "../../src/logger.ts";
import { startRouter, type Router, type RouterInternals, type RouterOptions } from "../../src/owner/router.ts";
import type { WIRE_SCHEMAS, WireSchemaName } from "../../src/schemas/index.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { declareWriteTool, type WriteToolDeclaration } from "../../src/tools.ts";
import { z } from "zod";
import { readRecord } from "../../examples/example-stack.ts";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";
import { ROOT } from "./build.ts";
import { waitFor } from "./wait-for.ts";

export const brokers = (): string[] => (process.env.KAFKA_BROKERS ?? "127.0.0.1:19092").split(",");
export const registryUrl = (): string | undefined => process.env.SCHEMA_REGISTRY_URL || undefined;

/** tag_ticket without a delta function: the owner cannot rebuild its change on another version of the ticket. */
export const tagTicketNoDelta = declareWriteTool({
  name: "tag_ticket_no_delta",
  recordType: "ticket",
  description: "Set a helpdesk ticket's tags (the agent's delta, no delta function).",
  params: z.object({ tag: z.string().min(1).max(64) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags"],
  keyScope: "run",
  versionPolicy: "strict",
  maxConflictCycles: 2,
  system: "helpdesk",
  reconcile: "idempotency-key",
});

const quietLogger = () => createLogger({ level: process.env.LOG_LEVEL ?? "warn", name: "writ-test" });

export interface Harness {
  id: string;
  records: DemoRecordsServer;
  config: RouterConfigInput & { topics: { intents: string; ledger: string; human: string; dlq: string }; groupId: string };
  routers: Router[];
  /** An owner of this harness's topics; `internals`: the fault suite's seams (ablations, a held commit). */
  startRouter(extra?: Partial<RouterOptions>, internals?: RouterInternals): Promise<Router>;
  /** `extra`: the client's other options (its logger, say). */
  client(agentId: string, extra?: Partial<Parameters<typeof createWritClient>[0]>): Promise<WritClient>;
  /** Reads every value of a topic so far, decoded; waits until `count` are there. */
  readTopic<N extends WireSchemaName>(topic: string, name: N, count: number): Promise<z.output<(typeof WIRE_SCHEMAS)[N]>[]>;
  /** The ledger's committed records from its start, as they arrive (key, and whether a tombstone): a live list. */
  watchLedger(): Promise<{ key: string; tombstone: boolean }[]>;
  produceRaw(key: string, value: Buffer): Promise<void>;
  /** Records in one batch, compressed with `compression` (kafkajs's CompressionTypes). */
  produceBatch(records: { key: string; value: Buffer }[], compression: number): Promise<void>;
}

/**
 * A records server, unique topics and group for this test, and owners and
 * clients that are stopped when the test finishes.
 */
export async function startHarness(opts: { tools: WriteToolDeclaration<any>[]; intentPartitions?: number; recordsLatencyMs?: number }): Promise<Harness> {
  const id = randomUUID().slice(0, 8);
  const records = await startDemoRecordsServer({ port: 0, latencyMs: opts.recordsLatencyMs ?? 0 });
  onTestFinished(() => records.close());
  const config = {
    brokers: brokers(),
    schemaRegistryUrl: registryUrl(),
    groupId: `writ.owners.${id}`,
    intentPartitions: opts.intentPartitions ?? 3,
    topics: { intents: `writ.intents.${id}`, ledger: `writ.ledger.${id}`, human: `writ.human.${id}`, dlq: `writ.dlq.${id}` },
    sorTimeoutMs: 1500,
    sessionTimeoutMs: 10_000,
  };
  const systems = () => [
    createHttpSystemOfRecord({ name: "billing", baseUrl: records.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    createHttpSystemOfRecord({ name: "helpdesk", baseUrl: records.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
  ];
  const kafka = new Kafka({ clientId: `writ-test-${id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
  const harness: Harness = {
    id,
    records,
    config,
    routers: [],
    async startRouter(extra = {}, internals = {}) {
      // Idle fetches of 100 ms, not 500: what a test's owner waits after opening its partitions and on its stop
      // (RouterInternals.fetchMaxWaitMs). What it reads, and when it may write, do not depend on it.
      const router = await startRouter({ config, tools: opts.tools, systems: systems(), logger: quietLogger(), ...extra }, { fetchMaxWaitMs: 100, ...internals });
      harness.routers.push(router);
      onTestFinished(() => router.stop());
      return router;
    },
    async client(agentId, extra = {}) {
      const client = await createWritClient({
        brokers: brokers(),
        agentId,
        replyTopic: `writ.replies.${agentId}.${id}`,
        intentsTopic: config.topics.intents,
        schemaRegistryUrl: registryUrl(),
        submitTimeoutMs: 30_000,
        // As the owners' idle fetches above: close() waits for the reply consumer's fetch in flight.
        replyFetchMaxWaitMs: 100,
        logger: quietLogger(),
        ...extra,
      });
      onTestFinished(() => client.close());
      return client;
    },
    async readTopic(topic, name, count) {
      const seen: unknown[] = [];
      // Idle fetches of 100 ms: its disconnect waits for the fetch in flight (the readers below too).
      const consumer = kafka.consumer({ groupId: `writ.test-reader.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 100 });
      await consumer.connect();
      try {
        await consumer.subscribe({ topic, fromBeginning: true });
        await consumer.run({
          eachMessage: async ({ message }) => {
            if (isControlRecord(message.headers)) return;
            const d = await codec.decode(name, message.value);
            seen.push(d.ok ? d.value : { undecodable: d.message });
          },
        });
        await waitFor(() => seen.length >= count, { timeoutMs: 30_000, message: () => `${topic}: ${seen.length} of ${count} records` });
      } finally {
        await consumer.disconnect();
      }
      return seen as z.output<(typeof WIRE_SCHEMAS)[typeof name]>[];
    },
    async watchLedger() {
      const seen: { key: string; tombstone: boolean }[] = [];
      const consumer = kafka.consumer({ groupId: `writ.test-reader.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 100 });
      onTestFinished(() => consumer.disconnect());
      await consumer.connect();
      await consumer.subscribe({ topic: config.topics.ledger, fromBeginning: true });
      await consumer.run({ eachMessage: async ({ message }) => void seen.push({ key: message.key?.toString() ?? "", tombstone: message.value === null }) });
      return seen;
    },
    async produceRaw(key, value) {
      await harness.produceBatch([{ key, value }], CompressionTypes.None);
    },
    async produceBatch(records, compression) {
      const producer = kafka.producer();
      await producer.connect();
      await producer.send({ topic: config.topics.intents, compression, messages: records });
      await producer.disconnect();
    },
  };
  return harness;
}

/** `writ <args>` from the sources (`node src/cli/main.ts`), with `env` and nothing from the caller's WRIT_* or LOG_LEVEL. */
export function writ(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(WRIT_|LOG_LEVEL$)/.test(k)));
  return new Promise((resolve) => {
    execFile(process.execPath, ["src/cli/main.ts", ...args], { cwd: ROOT, env: { ...base, ...env }, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr });
    });
  });
}

/** The CLI's environment for the harness's broker, registry and topics. */
export function cliEnv(h: Harness): Record<string, string> {
  return {
    KAFKA_BROKERS: brokers().join(","),
    ...(registryUrl() ? { SCHEMA_REGISTRY_URL: registryUrl()! } : {}),
    WRIT_INTENTS_TOPIC: h.config.topics.intents,
    WRIT_LEDGER_TOPIC: h.config.topics.ledger,
    WRIT_HUMAN_TOPIC: h.config.topics.human,
    WRIT_DLQ_TOPIC: h.config.topics.dlq,
  };
}

/** A refund of pay_1 by the demo's refund_payment tool, as an agent submits it against the version it read. */
export function refundIntent(runId: string, version: string, amountCents = 700, stepId = `refund-${amountCents}`) {
  return {
    tool: refundPayment,
    entity: { type: "payment", id: "pay_1" },
    runId,
    stepId,
    baseVersion: version,
    delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "late" as const } }],
    params: { amountCents, reason: "late" },
  };
}

/** The version a record has now, as an agent's read tool would carry it. */
export function readVersion(records: DemoRecordsServer, type: string, id: string): Promise<{ state: any; version: string }> {
  return readRecord<any>(records.url, type, id);
}

/**
 * Three conflict cycles on ticket `ticket` (seeded open; a writer outside writ touches it after each read, so
 * each `tag_ticket` of `agent` meets another version): the third is answered `escalated`, which this returns.
 * `tool`: tag_ticket, or a tool of the same params and paths (strict, two conflict cycles). `prepare`: what
 * each try submits, from the input it would (another change, or the intent built to a size).
 */
export async function escalateTicket(
  h: Harness,
  agent: WritClient,
  ticket: string,
  tool: WriteToolDeclaration<any> = tagTicket,
  prepare: (input: IntentInput) => IntentInput | WriteIntent | Promise<IntentInput | WriteIntent> = (input) => input,
): Promise<Extract<Reply, { status: "escalated" }>> {
  h.records.seed("ticket", ticket, { status: "open", tags: [] });
  const runId = `run-${randomUUID()}`;
  let base = await readVersion(h.records, "ticket", ticket);
  let last: SubmitResult | undefined;
  for (let i = 0; i < 3; i++) {
    h.records.seed("ticket", ticket, { status: `touched-${i}`, tags: [] });
    last = await agent.submit(
      await prepare({
        tool,
        entity: { type: "ticket", id: ticket },
        runId,
        stepId: "tag-1",
        baseVersion: base.version,
        delta: [{ op: "replace", path: "/tags", value: [...(base.state.tags as string[]), "needs-human"] }],
        params: { tag: "needs-human" },
      }),
    );
    if (last.status === "conflict") base = last.current as typeof base;
  }
  if (last?.status !== "escalated" || !("reason" in last) || last.reason !== "conflict_cycles_exhausted") throw new Error(`expected escalated (conflict_cycles_exhausted) after three cycles, got ${JSON.stringify(last)}`);
  return last;
}

/**
 * `agentName`'s client (its replies collected in `seen`), its tag of `ticket` escalated by {@link escalateTicket}
 * (with `tool`, and `prepare` given the client), and the escalation as writ.human carries it.
 */
export async function escalatedCase(
  h: Harness,
  agentName: string,
  ticket: string,
  tool: WriteToolDeclaration<any> = tagTicket,
  prepare: (agent: WritClient, input: IntentInput) => IntentInput | WriteIntent | Promise<IntentInput | WriteIntent> = (_agent, input) => input,
) {
  const agent = await h.client(agentName);
  const seen: Reply[] = [];
  void (async () => {
    for await (const r of agent.replies()) seen.push(r);
  })();
  const escalatedReply = await escalateTicket(h, agent, ticket, tool, (input) => prepare(agent, input));
  const escalation = await waitFor(async () => (await h.readTopic(h.config.topics.human, "Escalation", 1)).find((e) => e.intent.intentKey === escalatedReply.intentKey), {
    message: `the escalation of ${ticket} on ${h.config.topics.human}`,
  });
  return { agent, seen, escalation, escalatedReply };
}

/**
 * A dead letter of `bytes` (an intent of payment:pay_1 from `source`), as an owner writes one: whole, its length
 * and sha256 those of `bytes`; `carried` is the value it carries (other bytes: a forgery; a prefix: truncated).
 */
export function deadLetterOf(bytes: Buffer, source: DeadLetter["source"], over: { carried?: Buffer; reason?: string; truncated?: boolean } = {}): DeadLetter {
  return {
    reason: over.reason ?? "reply_topic_missing",
    message: "m",
    source,
    key: "payment:pay_1",
    valueBase64: (over.carried ?? bytes).toString("base64"),
    originalBytes: bytes.length,
    sha256: sha256Hex(bytes),
    truncated: over.truncated ?? false,
    headers: {},
    at: new Date().toISOString(),
  };
}
