import { Kafka, logLevel, type Admin, type Consumer } from "kafkajs";
import { WireCodec } from "../codec.ts";
import { RouterConfig, parseConfig, type RouterConfigInput } from "../config.ts";
import { LedgerReader } from "../ledger/ledger-reader.ts";
import { createLogger, type Logger } from "../logger.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import { admitTools, type WriteToolDeclaration } from "../tools.ts";
import { TopicEnsurer, ensureTopics, routerTopics } from "../topics.ts";
import { IntentProcessor, type ProcessorDeps } from "./intent-processor.ts";
import { PartitionOwner } from "./partition-owner.ts";
import { kafkaLogCreator } from "../kafka-log.ts";

export interface RouterOptions {
  config: RouterConfigInput | RouterConfig;
  tools: readonly WriteToolDeclaration<any>[];
  systems: readonly SystemOfRecord[];
  logger?: Logger;
  /** Called when the owner cannot go on (its consumer crashed for good); a process should exit and be restarted. */
  onFatal?: (err: Error) => void;
  /** Test hook for crash-point injection; see {@link ProcessorDeps.afterPatch}. */
  afterPatch?: ProcessorDeps["afterPatch"];
}

export interface Router {
  readonly config: RouterConfig;
  /** Partitions this process owns right now. */
  ownedPartitions(): number[];
  stop(): Promise<void>;
}

/**
 * Starts an owner process: admits the tools (refusing to start otherwise),
 * creates the topics, starts the ledger reader and joins the owners' group on
 * `writ.intents`.
 *
 * @example
 * const router = await startRouter({ config: routerConfigFromEnv(), tools: [refund], systems: [billing] });
 */
export async function startRouter(opts: RouterOptions): Promise<Router> {
  const config = parseConfig(RouterConfig, opts.config, "router");
  const log = (opts.logger ?? createLogger()).child({ component: "router", instance: config.instanceId });
  const tools = admitTools(opts.tools, opts.systems, { sorTimeoutMs: config.sorTimeoutMs });
  const kafka = new Kafka({
    clientId: config.clientId,
    brokers: config.brokers,
    logLevel: logLevel.WARN,
    logCreator: kafkaLogCreator(log),
    retry: { retries: 8, initialRetryTime: 200, maxRetryTime: 5000 },
  });
  const codec = new WireCodec({ schemaRegistryUrl: config.schemaRegistryUrl });
  const admin: Admin = kafka.admin();
  await admin.connect();
  await ensureTopics(admin, routerTopics(config));
  const replyTopics = new TopicEnsurer(admin, { numPartitions: 1, replicationFactor: config.replicationFactor });

  const reader = new LedgerReader({
    kafka,
    topic: config.topics.ledger,
    codec,
    log,
    groupId: `${config.groupId}.ledger-reader.${config.instanceId}`,
  });
  await reader.start();

  const processor = new IntentProcessor({
    tools,
    codec,
    replyTopicPrefix: config.replyTopicPrefix,
    intentsTopic: config.topics.intents,
    log,
    ...(opts.afterPatch ? { afterPatch: opts.afterPatch } : {}),
  });
  const owners = new Map<number, PartitionOwner>();
  const ownerFor = (partition: number): PartitionOwner => {
    let owner = owners.get(partition);
    if (!owner) {
      owner = new PartitionOwner(partition, { kafka, config, codec, reader, processor, log, ensureTopics: (t) => replyTopics.ensure(t) });
      owners.set(partition, owner);
    }
    return owner;
  };
  const release = async (partition: number) => {
    const owner = owners.get(partition);
    owners.delete(partition);
    await owner?.close();
  };

  const consumer: Consumer = kafka.consumer({
    groupId: config.groupId,
    readUncommitted: false,
    sessionTimeout: config.sessionTimeoutMs,
    heartbeatInterval: Math.floor(config.sessionTimeoutMs / 10),
    allowAutoTopicCreation: false,
    maxBytesPerPartition: 1_048_576,
    // A fetch returns as soon as intents arrive; this bounds only an idle long poll, which
    // holds up a clean leave (shutdown) and this member's rejoin in a rebalance.
    maxWaitTimeInMs: 1000,
  });
  consumer.on(consumer.events.GROUP_JOIN, (event) => {
    const assigned = new Set(event.payload.memberAssignment[config.topics.intents] ?? []);
    for (const p of [...owners.keys()]) if (!assigned.has(p)) void release(p);
    log.info({ partitions: [...assigned].sort((a, b) => a - b), isLeader: event.payload.isLeader, memberId: event.payload.memberId }, "assignment");
  });
  consumer.on(consumer.events.CRASH, (event) => {
    log.error({ err: event.payload.error, restart: event.payload.restart }, "owner consumer crashed");
    // kafkajs restarts after retriable crashes; anything else leaves a member that owns nothing.
    if (!event.payload.restart) opts.onFatal?.(event.payload.error);
  });
  await consumer.connect();
  await consumer.subscribe({ topic: config.topics.intents, fromBeginning: true });
  await consumer.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    partitionsConsumedConcurrently: Math.min(config.intentPartitions, 12),
    eachBatch: async ({ batch, resolveOffset, heartbeat, isRunning, isStale }) => {
      if (batch.messages.length === 0) return;
      const owner = ownerFor(batch.partition);
      try {
        await owner.handle(batch.messages, { heartbeat, resolveOffset, isActive: () => isRunning() && !isStale() });
      } catch (err) {
        log.warn({ err, partition: batch.partition }, "batch failed; it will be fetched again");
        await release(batch.partition);
        throw err;
      }
    },
  });
  log.info({ tools: [...tools.keys()], groupId: config.groupId, registry: config.schemaRegistryUrl !== undefined }, "router started");

  // Retention: idle partitions get their expired ledger entries tombstoned too.
  const sweepEveryMs = Math.max(250, Math.min(60_000, (config.ledgerRetentionHours * 3_600_000) / 4));
  const sweeper = setInterval(() => {
    for (const owner of owners.values()) {
      owner.sweep().then(
        (n) => n > 0 && log.info({ partition: owner.partition, tombstones: n }, "ledger entries past retention tombstoned"),
        (err: unknown) => log.warn({ err, partition: owner.partition }, "ledger sweep failed; next sweep retries"),
      );
    }
  }, sweepEveryMs);
  sweeper.unref();

  let stopped = false;
  return {
    config,
    ownedPartitions: () => [...owners.keys()].sort((a, b) => a - b),
    async stop() {
      if (stopped) return;
      stopped = true;
      clearInterval(sweeper);
      await consumer.disconnect().catch(() => undefined);
      await Promise.all([...owners.keys()].map(release));
      await reader.stop().catch(() => undefined);
      await admin.disconnect().catch(() => undefined);
      log.info("router stopped");
    },
  };
}
