import type { Admin, ITopicConfig } from "kafkajs";
import type { RouterConfig } from "./config.ts";
import { retry } from "./retry.ts";

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
        if (!/already exists/i.test(String((err as Error).message))) throw err;
      }
    },
    { maxAttempts: 6, initialDelayMs: 300 },
  );
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
