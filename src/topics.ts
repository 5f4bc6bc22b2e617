import type { Admin, ITopicConfig } from "kafkajs";
import type { RouterConfig } from "./config.ts";
import { WritError } from "./errors.ts";
import type { Logger } from "./logger.ts";
import { retry } from "./retry.ts";

/** The ledger's min.compaction.lag.ms: how long a partition may go without an owner and keep a crashed owner's in-doubt entries. */
export const LEDGER_MIN_COMPACTION_LAG_MS = 3_600_000;

/** The topic contract's topics with their partitioning and configs. */
export function routerTopics(config: RouterConfig): ITopicConfig[] {
  const rf = config.replicationFactor;
  const retentionMs = String(Math.ceil(config.ledgerRetentionHours * 3_600_000));
  return [
    { topic: config.topics.intents, numPartitions: config.intentPartitions, replicationFactor: rf },
    {
      topic: config.topics.ledger,
      numPartitions: config.intentPartitions,
      replicationFactor: rf,
      configEntries: [
        { name: "cleanup.policy", value: "compact" },
        // Tombstones must outlive a restore of the partition.
        { name: "delete.retention.ms", value: retentionMs },
        // The log cleaner drops the records of aborted transactions, and an owner that crashed leaves its last
        // `pending` entries in one until the next owner's restore finds and commits them again (see the scan in
        // partition-restore.ts): no record is compacted before it is this old.
        { name: "min.compaction.lag.ms", value: String(LEDGER_MIN_COMPACTION_LAG_MS) },
      ],
    },
    { topic: config.topics.human, numPartitions: 1, replicationFactor: rf },
    { topic: config.topics.dlq, numPartitions: 1, replicationFactor: rf },
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
async function waitForLeaders(admin: Admin, topics: string[], timeoutMs = 30_000): Promise<void> {
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
