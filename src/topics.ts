import type { Admin, ConfigResourceTypes, ITopicConfig } from "kafkajs";
import type { RouterConfig } from "./config.ts";
import { WritError } from "./errors.ts";
import type { Logger } from "./logger.ts";
import { retry } from "./retry.ts";

/** The ledger's min.compaction.lag.ms: how long a partition may go without an owner and keep a crashed owner's in-doubt entries. */
export const LEDGER_MIN_COMPACTION_LAG_MS = 3_600_000;

/**
 * Bytes a ledger entry of an intent takes at most beside its params (kept only for a tool that declares an undo,
 * within WRIT_MAX_INTENT_BYTES), as the record alone in a batch: at most 16 attempts (a base version of 256 characters
 * and a 64-character fingerprint each), an outcome (a message cut to 2,000 characters, a version of 256, a reason, an
 * escalation id, times), its ids (intent key, intent id 128, entity type 64 and id 256, tool 128, agent 128,
 * fingerprint, undoOf, replyTo 249): 8,721 characters, 52,326 bytes were each escaped as `\u00XX`; with the member
 * names, the registry's framing, the record's key and the batch's header, under 56 KiB. The rest is margin.
 */
export const LEDGER_ENTRY_FIELDS_BYTES = 64 * 1024;

/**
 * What a batch of one record must be allowed to take on each contract topic (its max.message.bytes and
 * segment.bytes, the brokers' message.max.bytes where the topic sets neither): the ledger, its largest entry (an
 * entry cannot be trimmed, and one refused fails its partition's transactions); the others, WRIT_MAX_MESSAGE_BYTES,
 * what owners write there at most (a forward, an escalation with its record, a dead letter with its payload; and
 * the resolutions clients write to the intents topic, which the config check fits into it).
 */
export function topicNeeds(config: Pick<RouterConfig, "maxIntentBytes" | "maxMessageBytes">): Record<"intents" | "ledger" | "human" | "dlq", number> {
  const most = config.maxMessageBytes;
  return { intents: most, ledger: config.maxIntentBytes + LEDGER_ENTRY_FIELDS_BYTES, human: most, dlq: most };
}

/** ConfigResourceTypes.TOPIC: kafkajs is CommonJS, and Node's named-export detection does not find its enums. */
export const TOPIC_RESOURCE = 2 as ConfigResourceTypes;

/** What a topic takes of a batch: the least of its max.message.bytes and segment.bytes, which config that is, and whether the topic sets it (else the brokers' default). */
export interface BatchLimit {
  bytes: number;
  config: "max.message.bytes" | "segment.bytes";
  overridden: boolean;
}

/** The batch limits of `topics` (DescribeConfigs; throws as it does). A topic whose configs are not answered is left out. */
export async function batchLimits(admin: Admin, topics: readonly string[]): Promise<Map<string, BatchLimit>> {
  const out = new Map<string, BatchLimit>();
  if (topics.length === 0) return out;
  const described = await admin.describeConfigs({
    includeSynonyms: false,
    resources: topics.map((name) => ({ type: TOPIC_RESOURCE, name, configNames: ["max.message.bytes", "segment.bytes"] })),
  });
  for (const r of described.resources) {
    let least: BatchLimit | undefined;
    for (const e of r.configEntries) {
      const bytes = Number(e.configValue);
      if (!Number.isSafeInteger(bytes) || bytes < 0 || (e.configName !== "max.message.bytes" && e.configName !== "segment.bytes")) continue;
      // configSource 1: TOPIC_CONFIG (the topic's own override).
      if (least === undefined || bytes < least.bytes) least = { bytes, config: e.configName, overridden: e.configSource === 1 };
    }
    if (least !== undefined) out.set(r.resourceName, least);
  }
  return out;
}

/**
 * Why `topic` (contract role `role`) takes too little of what writ writes there, with the fix; null when it takes enough.
 */
export function batchLimitProblem(topic: string, role: "intents" | "ledger" | "human" | "dlq", limit: BatchLimit, need: number): string | null {
  if (limit.bytes >= need) return null;
  const source = limit.overridden ? "" : ", the brokers' default: the topic does not set it";
  const why =
    role === "ledger"
      ? "its largest entry (WRIT_MAX_INTENT_BYTES of params and the entry's fields): an entry the broker refuses fails its partition's transactions, and the partition stops"
      : "WRIT_MAX_MESSAGE_BYTES, what owners write there at most: larger records are trimmed, dead-lettered or dropped";
  return (
    `${topic} (${role}) takes records of at most ${limit.bytes} bytes (${limit.config}=${limit.bytes}${source}); writ needs ${need}, ${why} ` +
    `(kafka-configs --alter --entity-type topics --entity-name ${topic} --add-config ${limit.config}=${need})`
  );
}

/** Kafka's default `max.message.bytes` (the brokers' `message.max.bytes`): a topic created without an override takes this. */
export const KAFKA_DEFAULT_MAX_MESSAGE_BYTES = 1_048_588;

/** The topic contract's topics with their partitioning and configs. */
export function routerTopics(config: RouterConfig): ITopicConfig[] {
  const rf = config.replicationFactor;
  const retentionMs = String(Math.ceil(config.ledgerRetentionHours * 3_600_000));
  const needs = topicNeeds(config);
  // A topic created for writ takes what writ writes there: an override only where that is more than Kafka's default.
  // Transactions write with acks=all, which waits for min.insync.replicas copies: at the brokers' default (1) one
  // broker's loss can lose acknowledged records (`writ topics check` fails on it at replication factor 3 or more).
  const durable = rf >= 3 ? [{ name: "min.insync.replicas", value: "2" }] : [];
  const sized = (need: number) => [...(need > KAFKA_DEFAULT_MAX_MESSAGE_BYTES ? [{ name: "max.message.bytes", value: String(need) }] : []), ...durable];
  const withSize = (need: number) => (sized(need).length > 0 ? { configEntries: sized(need) } : {});
  return [
    { topic: config.topics.intents, numPartitions: config.intentPartitions, replicationFactor: rf, ...withSize(needs.intents) },
    {
      topic: config.topics.ledger,
      numPartitions: config.intentPartitions,
      replicationFactor: rf,
      configEntries: [
        ...sized(needs.ledger),
        { name: "cleanup.policy", value: "compact" },
        // Tombstones must outlive a restore of the partition.
        { name: "delete.retention.ms", value: retentionMs },
        // The log cleaner drops the records of aborted transactions, and an owner that crashed leaves its last
        // `pending` entries in one until the next owner's restore finds and commits them again (see the scan in
        // partition-restore.ts): no record is compacted before it is this old.
        { name: "min.compaction.lag.ms", value: String(LEDGER_MIN_COMPACTION_LAG_MS) },
      ],
    },
    { topic: config.topics.human, numPartitions: 1, replicationFactor: rf, ...withSize(needs.human) },
    { topic: config.topics.dlq, numPartitions: 1, replicationFactor: rf, ...withSize(needs.dlq) },
  ];
}

/**
 * Creates missing topics and waits for their leaders. Existing topics are left
 * as they are; an intents topic whose partition count differs from the
 * ledger's is refused, since partition p's ledger must live in partition p.
 */
export async function ensureTopics(admin: Admin, topics: ITopicConfig[]): Promise<void> {
  // A freshly started broker answers UNKNOWN_TOPIC_OR_PARTITION while leaders settle; kafkajs marks that retriable.
  await retry(
    async () => {
      const existing = new Set(await admin.listTopics());
      const missing = topics.filter((t) => !existing.has(t.topic));
      if (missing.length === 0) return;
      try {
        await admin.createTopics({ topics: missing, waitForLeaders: true });
      } catch (err) {
        // Another process may have created them first.
        if (!/already exists/i.test(String((err as Error).message))) throw topicCreationError(err);
      }
    },
    { maxAttempts: 6, initialDelayMs: 300 },
  );
  await waitForLeaders(admin, topics.map((t) => t.topic));
}

/**
 * kafkajs's "Topic creation errors" with each topic's reason, e.g.
 * `writ.replies.agent-b: TOPIC_AUTHORIZATION_FAILED` (the principal's ACLs do
 * not let it create the topic).
 */
function topicCreationError(err: unknown): unknown {
  const errors = (err as { errors?: unknown } | null)?.errors;
  if (!Array.isArray(errors) || errors.length === 0) return err;
  const detail = errors.map((e: { topic?: unknown; type?: unknown; message?: unknown }) => `${String(e.topic ?? "?")}: ${String(e.type ?? e.message)}`).join(", ");
  return new WritError("kafka_failed", `creating topics failed: ${detail}`, { retriable: (err as { retriable?: unknown }).retriable === true, cause: err });
}

/**
 * Polls metadata until every partition of `topics` has a leader. kafkajs's
 * own `waitForLeaders` gives up when a KRaft broker that has just created a
 * topic still answers UNKNOWN_TOPIC_OR_PARTITION; a consumer subscribing in
 * that window fails.
 */
export async function waitForLeaders(admin: Admin, topics: string[], timeoutMs = 30_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    try {
      const { topics: metadata } = await admin.fetchTopicMetadata({ topics });
      if (metadata.length === topics.length && metadata.every((m) => m.partitions.length > 0 && m.partitions.every((p) => p.leader >= 0))) return;
    } catch (err) {
      if (Date.now() > deadline) throw err;
    }
    if (Date.now() > deadline) throw new WritError("kafka_failed", `topics ${topics.join(", ")} have no leader after ${timeoutMs} ms`, { retriable: true });
    await new Promise((r) => setTimeout(r, 200));
  }
}

/** Caches topics known to exist; creates the others (reply topics). */
export class TopicEnsurer {
  private readonly known = new Set<string>();
  private readonly admin: Admin;
  private readonly defaults: { numPartitions: number; replicationFactor: number };

  constructor(admin: Admin, defaults: { numPartitions: number; replicationFactor: number }) {
    this.admin = admin;
    this.defaults = defaults;
  }

  async ensure(topics: Iterable<string>): Promise<void> {
    const wanted = [...new Set(topics)].filter((t) => !this.known.has(t));
    if (wanted.length === 0) return;
    await ensureTopics(
      this.admin,
      wanted.map((topic) => ({ topic, ...this.defaults })),
    );
    for (const t of wanted) this.known.add(t);
  }
}

/**
 * Warns when a cluster of more than one broker holds contract topics with a
 * single replica: one broker crash then loses the partition's leader, which
 * is also how a transaction's markers get skipped and a reply partition
 * hangs. Replication factor 3 with min.insync.replicas 2 is the production
 * default (`WRIT_REPLICATION_FACTOR`).
 */
export async function warnOnSingleReplicaTopics(admin: Admin, topics: ITopicConfig[], log: Logger): Promise<string[]> {
  try {
    const cluster = await admin.describeCluster();
    if (cluster.brokers.length < 2) return [];
    const { topics: metadata } = await admin.fetchTopicMetadata({ topics: topics.map((t) => t.topic) });
    const single = metadata.filter((m) => m.partitions.some((p) => p.replicas.length < 2)).map((m) => m.name);
    if (single.length > 0) {
      log.warn(
        { topics: single, brokers: cluster.brokers.length },
        "contract topics have replication factor 1 on a multi-broker cluster: a broker crash can stop them; use 3 with min.insync.replicas 2",
      );
    }
    return single;
  } catch (err) {
    log.debug({ err }, "could not check the replication of the contract topics");
    return [];
  }
}
