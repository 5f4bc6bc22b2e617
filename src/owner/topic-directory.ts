import type { Admin } from "kafkajs";
import type { ReplyTopicDirectory } from "./admission.ts";

/**
 * Which topics exist and how many partitions they have, from the cluster's
 * metadata, cached: a topic seen is remembered for `positiveTtlMs`; a topic
 * missing is asked about again every time (its agent may have created it a
 * moment ago), concurrent questions sharing one listing. Owners use it to answer an intent whose reply topic is missing
 * with a dead letter instead of producing into nothing (or creating topics
 * because an intent names them), and to find the partitions a heal touches.
 */
export class TopicDirectory implements ReplyTopicDirectory {
  private readonly admin: Admin;
  private readonly positiveTtlMs: number;
  private topics = new Set<string>();
  private listedAt = 0;
  private listing: Promise<void> | null = null;
  private listStartedAt = 0;
  private readonly partitions = new Map<string, { count: number; at: number }>();

  constructor(admin: Admin, opts: { positiveTtlMs?: number } = {}) {
    this.admin = admin;
    this.positiveTtlMs = opts.positiveTtlMs ?? 300_000;
  }

  async exists(topic: string): Promise<boolean> {
    const asked = Date.now();
    if (this.topics.has(topic) && asked - this.listedAt < this.positiveTtlMs) return true;
    // Missing: ask the cluster again, with a listing begun after this question (an agent creates its reply
    // topic just before its first intent; a listing from before that would miss it). Concurrent questions
    // share one listing.
    if (this.listStartedAt < asked || this.listing === null) await this.refresh(asked);
    else await this.listing;
    return this.topics.has(topic);
  }

  /**
   * Forgets what it has seen, so the next question asks the cluster: after a failed transaction or a failed
   * open, which may be a topic deleted while remembered (an agent's reply topic). Remembered, it would be
   * produced to, and healed, again and again until the cache expired, the partition stopped meanwhile.
   */
  forget(): void {
    this.topics = new Set();
    this.listedAt = 0;
    this.partitions.clear();
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

  private refresh(notBefore = Date.now()): Promise<void> {
    if (this.listing && this.listStartedAt >= notBefore) return this.listing;
    const started = Date.now();
    const listing = (this.listing ?? Promise.resolve())
      .catch(() => undefined)
      .then(() => this.admin.listTopics())
      .then((names) => {
        this.topics = new Set(names);
        this.listedAt = started;
      })
      .finally(() => {
        if (this.listing === listing) this.listing = null;
      });
    this.listing = listing;
    this.listStartedAt = started;
    return listing;
  }
}
