import type { Admin } from "kafkajs";
import type { ReplyTopicDirectory } from "./admission.ts";

/**
 * Which topics exist and how many partitions they have, from the cluster's
 * metadata, cached: a topic seen is remembered for `positiveTtlMs`, a topic
 * missing is asked again after `negativeTtlMs` (its agent may create it any
 * moment). Owners use it to answer an intent whose reply topic is missing
 * with a dead letter instead of producing into nothing (or creating topics
 * because an intent names them), and to find the partitions a heal touches.
 */
export class TopicDirectory implements ReplyTopicDirectory {
  private readonly admin: Admin;
  private readonly positiveTtlMs: number;
  private readonly negativeTtlMs: number;
  private topics = new Set<string>();
  private listedAt = 0;
  private listing: Promise<void> | null = null;
  private readonly partitions = new Map<string, { count: number; at: number }>();

  constructor(admin: Admin, opts: { positiveTtlMs?: number; negativeTtlMs?: number } = {}) {
    this.admin = admin;
    this.positiveTtlMs = opts.positiveTtlMs ?? 300_000;
    this.negativeTtlMs = opts.negativeTtlMs ?? 250;
  }

  async exists(topic: string): Promise<boolean> {
    const age = Date.now() - this.listedAt;
    if (this.topics.has(topic) && age < this.positiveTtlMs) return true;
    if (!this.topics.has(topic) && age < this.negativeTtlMs) return false;
    await this.refresh();
    return this.topics.has(topic);
  }

  /** Partition count of each topic that exists; missing topics are left out. */
  async partitionCounts(topics: Iterable<string>): Promise<Map<string, number>> {
    const out = new Map<string, number>();
    const unknown: string[] = [];
    for (const t of new Set(topics)) {
      const cached = this.partitions.get(t);
      if (cached && Date.now() - cached.at < this.positiveTtlMs) out.set(t, cached.count);
      else if (await this.exists(t)) unknown.push(t);
    }
    if (unknown.length > 0) {
      const { topics: metadata } = await this.admin.fetchTopicMetadata({ topics: unknown });
      for (const m of metadata) {
        this.partitions.set(m.name, { count: m.partitions.length, at: Date.now() });
        out.set(m.name, m.partitions.length);
      }
    }
    return out;
  }

  private refresh(): Promise<void> {
    this.listing ??= this.admin
      .listTopics()
      .then((names) => {
        this.topics = new Set(names);
        this.listedAt = Date.now();
      })
      .finally(() => {
        this.listing = null;
      });
    return this.listing;
  }
}
