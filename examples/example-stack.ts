// What the examples share: the local broker and registry (started unless they
// already run, stopped at the end only if started here), a demo records server,
// one in-process owner on topics of this run, agent clients with reply topics of
// this run, and the run/shutdown/exit wrapper that prints the result as the last
// line. `npm run demo` uses the first and the last (its owners are processes).
//
// Library module: importing it has no side effects.
import { randomUUID } from "node:crypto";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { Kafka, logLevel } from "kafkajs";
import { createWritClient, type WritClient } from "../producers/writ-client.ts";
import { ensureStack } from "../src/testing/local-stack.ts";
import type { TopicsConfig } from "../src/config.ts";
import { createLogger, type Logger } from "../src/logger.ts";
import { startRouter, type Router } from "../src/owner/router.ts";
import type { EntityRef, Versioned } from "../src/schemas/common.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../src/testing/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../src/sor/http-adapter.ts";
import type { WriteToolDeclaration } from "../src/tools.ts";
import { systems, tools as demoTools } from "./demo-tools.ts";
import { exitWhenWritten } from "../src/cli/exit.ts";

/** A record as the records server holds it now: its JSON and its ETag. */
export interface RecordRead<S = unknown> {
  state: S;
  version: string;
}

/** The broker, registry and records server a demo or an example runs against. */
export interface LocalStack {
  /** `example` or `demo`: names the run in the failure and stop messages. */
  readonly label: string;
  readonly brokers: string[];
  /** Unset when the stack has no registry: values are plain JSON then. */
  readonly registryUrl: string | undefined;
  readonly records: DemoRecordsServer;
  /** `  Kafka …; registry …; records server …`, the second line every run prints. */
  readonly endpointsLine: string;
  /** Prints one line of the account on stdout. */
  say(line: string): void;
  /** GET of a record at the records server. Throws on any status but 2xx. */
  read<S = unknown>(type: string, id: string): Promise<RecordRead<S>>;
  /** Runs `stop` at shutdown, before the records server closes; the last registered runs first. */
  onShutdown(stop: () => Promise<void>): void;
  /** Runs the `onShutdown` callbacks, closes the records server, and stops the broker and registry if this run started them. */
  shutdown(): Promise<void>;
}

/** Options of {@link startExampleStack}. */
export interface ExampleStackOptions {
  /** Tags this run's topic and group names: `writ.intents.ex-<tag>-<id>`. Default: the example's name. */
  tag?: string;
  /** Delete this run's topics (the owner's and the reply topics) at shutdown. Default false. */
  deleteTopics?: boolean;
}

/** Options of {@link ExampleStack.startOwner}. */
export interface ExampleOwnerOptions {
  /** Default: the demo tools, `refund_payment` and `tag_ticket`. */
  tools?: readonly WriteToolDeclaration<any>[];
  /** Partitions of this run's intents and ledger topics. Default 1. */
  intentPartitions?: number;
}

/** A {@link LocalStack} plus an owner and agent clients on topics of this run only. */
export interface ExampleStack extends LocalStack {
  /** 8 hex characters, new each run; in every topic and group name. */
  readonly id: string;
  /** Level from `LOG_LEVEL`, default `error`: the account on stdout is the example's output. */
  readonly logger: Logger;
  /** This run's intents, ledger, human and dlq topics. */
  readonly topics: TopicsConfig;
  /** The owners' consumer group of this run. */
  readonly groupId: string;
  /** Reads a record through an HTTP system of record (5 s deadline), for an adapter's `read`. Throws if it does not exist. */
  readEntity(entity: EntityRef): Promise<Versioned>;
  /** The reply topic of `agentId` in this run, `writ.replies.<agentId>.ex-<tag>-<id>`. */
  replyTopic(agentId: string): string;
  /** Starts an owner in-process on this run's topics; stopped at shutdown. */
  startOwner(opts?: ExampleOwnerOptions): Promise<Router>;
  /** A writ client for `agentId` on its reply topic of this run; closed at shutdown. */
  client(agentId: string): Promise<WritClient>;
  /** Refunds on a payment at the records server, its version, and the PATCH requests that reached it. */
  refunds(paymentId: string): Promise<{ count: number; version: string; patchRequests: number }>;
}

/** Prints one line of the account on stdout. */
export function say(line: string): void {
  console.log(line);
}

/**
 * Ensures the local broker and registry (reused when they run, started when
 * not) and starts a demo records server on a free port, with its
 * Idempotency-Key dedupe off (`honourIdempotencyKey: false`; keys are still
 * recorded for reconcile's lookup), so what is measured is writ.
 *
 * @example
 * const stack = await startLocalStack("demo");
 * stack.onShutdown(async () => stopOwners());
 * await runExample(stack, main);
 */
export async function startLocalStack(label: string): Promise<LocalStack> {
  hideKafkajsTimeoutWarning();
  const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
  const brokers = stack.endpoints.brokers;
  const registryUrl = stack.endpoints.registryUrl || undefined;
  // Idempotency-Key dedupe off: every duplicate an example reports suppressed was suppressed by writ, not by the server.
  const records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
  const stops: (() => Promise<void>)[] = [];
  return {
    label,
    brokers,
    registryUrl,
    records,
    endpointsLine: `  Kafka ${brokers.join(",")}; registry ${registryUrl ?? "none (plain JSON)"}; records server ${records.url}`,
    say,
    read: (type, id) => readRecord(records.url, type, id),
    onShutdown: (stop) => void stops.unshift(stop),
    async shutdown() {
      for (const stop of stops) await stop();
      await records.close();
      if (stack.started) {
        say(`  stopping the local broker and registry this ${label} started`);
        await stack.stop();
      }
    },
  };
}

/**
 * {@link startLocalStack} for a framework example, with an in-process owner
 * and clients on topics named `ex-<tag>-<id>`. Also quiets two kafkajs
 * warnings that tell a reader of an example nothing.
 *
 * @example
 * const ex = await startExampleStack("ai-sdk");
 * await runExample(ex, async () => {
 *   await ex.startOwner();
 *   const client = await ex.client("billing-agent");
 *   return { refunds_created: (await ex.refunds("pay_1001")).count };
 * });
 */
export async function startExampleStack(name: string, opts: ExampleStackOptions = {}): Promise<ExampleStack> {
  const base = await startLocalStack("example");
  const { brokers, registryUrl, records } = base;
  const id = randomUUID().slice(0, 8);
  const run = `ex-${opts.tag ?? name}-${id}`;
  const topics = { intents: `writ.intents.${run}`, ledger: `writ.ledger.${run}`, human: `writ.human.${run}`, dlq: `writ.dlq.${run}` };
  const groupId = `writ.owners.${run}`;
  const logger = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: `example-${name}` });
  const sor = createHttpSystemOfRecord({ name: "records", baseUrl: records.url });
  const replyTopics = new Set<string>();
  const routers: Router[] = [];
  const clients: WritClient[] = [];
  const replyTopic = (agentId: string): string => {
    const topic = `writ.replies.${agentId}.${run}`;
    replyTopics.add(topic);
    return topic;
  };

  base.onShutdown(async () => {
    await Promise.all(clients.map((c) => c.close()));
    for (const router of routers) await router.stop();
    if (opts.deleteTopics) await deleteTopics(brokers, [...Object.values(topics), ...replyTopics]).catch(() => undefined);
  });
  return {
    ...base,
    id,
    logger,
    topics,
    groupId,
    replyTopic,
    async readEntity(entity) {
      const record = await sor.read(entity, { timeoutMs: 5_000 });
      if (!record) throw new Error(`${entity.type}:${entity.id} does not exist`);
      return record;
    },
    async startOwner({ tools = demoTools, intentPartitions = 1 } = {}) {
      const router = await startRouter({
        config: { brokers, schemaRegistryUrl: registryUrl, groupId, topics, intentPartitions },
        tools,
        systems: systems({ RECORDS_URL: records.url }),
        logger,
      });
      routers.push(router);
      return router;
    },
    async client(agentId) {
      const client = await createWritClient({ brokers, agentId, replyTopic: replyTopic(agentId), intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger });
      clients.push(client);
      return client;
    },
    async refunds(paymentId) {
      const payment = await base.read<{ refunds: unknown[] }>("payment", paymentId);
      const patchRequests = records.patchRequests().filter((r) => r.type === "payment" && r.id === paymentId).length;
      return { count: payment.state.refunds.length, version: payment.version, patchRequests };
    },
  };
}

/**
 * Runs `main`, shuts the stack down, prints `main`'s result as JSON on the
 * last line of stdout and exits 0; on an error it prints it on stderr (then
 * `onError`), shuts down what it can and exits 1.
 */
export async function runExample<R>(stack: Pick<LocalStack, "label" | "shutdown">, main: () => Promise<R>, opts: { onError?: () => void } = {}): Promise<never> {
  let exitCode = 0;
  try {
    const result = await main();
    await stack.shutdown();
    console.log(JSON.stringify(result));
  } catch (err) {
    console.error(`${stack.label} failed:`, err);
    opts.onError?.();
    exitCode = 1;
    await stack.shutdown().catch(() => undefined);
  }
  // The result line is read through a pipe (CI, a user's jq): out before the exit (src/cli/exit.ts).
  return exitWhenWritten(exitCode);
}

/** GET `/records/<type>/<id>` at the records server: the JSON and the ETag. */
export async function readRecord<S = unknown>(recordsUrl: string, type: string, id: string): Promise<RecordRead<S>> {
  const res = await fetch(`${recordsUrl}/records/${type}/${id}`);
  if (!res.ok) throw new Error(`records server: GET ${type}/${id} answered ${res.status}`);
  return { state: (await res.json()) as S, version: res.headers.get("etag")! };
}

/**
 * A tool's output as one line of an example's account: a read, an applied
 * write (and whether it was the ledger's stored reply), or anything else with
 * the instruction the model got.
 */
export function describeToolOutput(output: unknown): string {
  const o = output as { status: string; version?: string; duplicate?: boolean; record?: { refunds?: unknown[] }; instruction?: string };
  switch (o.status) {
    case "read":
      return `read at ${o.version}, ${o.record?.refunds?.length ?? 0} refund(s)`;
    case "applied":
      return o.duplicate ? `applied at ${o.version} (duplicate: the ledger's stored reply, nothing written)` : `applied at ${o.version}`;
    default:
      return `${o.status}: ${o.instruction}`;
  }
}

async function deleteTopics(brokers: string[], names: string[]): Promise<void> {
  const admin = new Kafka({ clientId: "writ-example-cleanup", brokers, logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const existing = new Set(await admin.listTopics());
    await admin.deleteTopics({ topics: names.filter((n) => existing.has(n)) });
  } finally {
    await admin.disconnect();
  }
}
