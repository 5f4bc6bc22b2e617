import type { Admin } from "kafkajs";
import { WritError } from "../errors.ts";
import type { Logger } from "../logger.ts";
import { LruMap } from "../lru-map.ts";
import { batchLimits } from "../topics.ts";
import type { ReplyTopicDirectory } from "./admission.ts";
import type { ProduceLimits } from "./produce-limits.ts";

/** Topics whose configs are remembered at most (each reply topic is one). */
const MAX_DESCRIBED_TOPICS = 4096;

/**
 * Which topics exist and how many partitions they have, from the cluster's
 * metadata, cached: a topic seen is remembered for `positiveTtlMs`; a topic
 * missing is asked about again every time (its agent may have created it a
 * moment ago), concurrent questions sharing one listing. Owners use it to answer an intent whose reply topic is missing
 * with a dead letter instead of producing into nothing (or creating topics
 * because an intent names them), and to find the partitions a heal touches.
 *
 * With `limits`, a topic found also has its configs read (DescribeConfigs:
 * max.message.bytes, segment.bytes), as often as its existence, into what the
 * encoder writes within: an agent creates its own reply topic, with any
 * limits, and a record produced there and refused fails the transaction; one
 * below a transaction marker's size (100 bytes) would even leave the
 * partition's transaction unable to end. Best effort: owners without
 * DESCRIBE_CONFIGS on a topic learn its limit from the broker's refusal
 * instead (produce-limits.ts).
 */
export class TopicDirectory implements ReplyTopicDirectory {
  private readonly admin: Admin;
  private readonly positiveTtlMs: number;
  private topics = new Set<string>();
  private listedAt = 0;
  private listing: Promise<void> | null = null;
  private listStartedAt = 0;
  private readonly partitions = new Map<string, { count: number; at: number }>();
  private readonly limits: ProduceLimits | undefined;
  private readonly log: Logger | undefined;
  /** When each topic's configs were last read (or could not be), and the read under way. */
  private readonly described = new LruMap<string, { at: number; reading: Promise<void> | null }>(MAX_DESCRIBED_TOPICS);
  private deniedLogged = false;

  constructor(admin: Admin, opts: { positiveTtlMs?: number; limits?: ProduceLimits; log?: Logger } = {}) {
    this.admin = admin;
    this.positiveTtlMs = opts.positiveTtlMs ?? 300_000;
    this.limits = opts.limits;
    this.log = opts.log;
  }

  async exists(topic: string): Promise<boolean> {
    const asked = Date.now();
    if (this.topics.has(topic) && asked - this.listedAt < this.positiveTtlMs) {
      await this.describe(topic);
      return true;
    }
    // Missing: ask the cluster again, with a listing begun after this question (an agent creates its reply
    // topic just before its first intent; a listing from before that would miss it). Concurrent questions
    // share one listing.
    if (this.listStartedAt < asked || this.listing === null) await this.refresh(asked);
    else await this.listing;
    if (!this.topics.has(topic)) {
      // Deleted: created again, it may take less than it did.
      this.described.delete(topic);
      return false;
    }
    await this.describe(topic);
    return true;
  }

  /**
   * What `topic` takes, from its configs, into the limits (at most once per `positiveTtlMs`; concurrent questions
   * share one read). Never throws: a topic whose configs cannot be read is written as if it took all, and its limit
   * is learned from a refusal.
   */
  async describe(topic: string): Promise<void> {
    const limits = this.limits;
    if (!limits) return;
    const seen = this.described.get(topic);
    if (seen?.reading) return seen.reading;
    // Read again after a size refusal of a round with a record of it, else once per TTL (not on every reopening
    // of a partition: each would read every reply topic again, on the owners' shared cores).
    const refused = limits.takeRefused(topic);
    if (seen && !refused && Date.now() - seen.at < this.positiveTtlMs) return;
    const entry: { at: number; reading: Promise<void> | null } = { at: Date.now(), reading: null };
    entry.reading = batchLimits(this.admin, [topic])
      .then(
        (read) => {
          const limit = read.get(topic);
          if (limit) limits.described(topic, limit.bytes);
        },
        (err: unknown) => {
          const denied = /AUTHORIZATION_FAILED$/.test(String((err as { type?: unknown } | null)?.type ?? ""));
          if (!denied) return this.log?.debug({ err, topic }, "reading a topic's configs failed; read again later");
          if (this.deniedLogged) return;
          this.deniedLogged = true;
          this.log?.warn(
            { err, topic },
            "cannot read topics' configs (the owners need DESCRIBE_CONFIGS on the reply topics): a topic that takes less than WRIT_MAX_MESSAGE_BYTES is learned from the broker's refusal instead, at the cost of a failed transaction",
          );
        },
      )
      .finally(() => {
        entry.reading = null;
        entry.at = Date.now();
      });
    this.described.set(topic, entry);
    return entry.reading;
  }

  /**
   * Forgets which topics exist, so the next question asks the cluster: after a failed transaction or a failed
   * open, which may be a topic deleted while remembered (an agent's reply topic). Remembered, it would be
   * produced to, and healed, again and again until the cache expired, the partition stopped meanwhile. Topics'
   * configs are kept: one found missing has them dropped (read again if it comes back), and one refused a
   * record for its size has them read again ({@link describe}).
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
      const { topics: metadata } = await this.admin.fetchTopicMetadata({ topics: unknown }).catch(clusterUnreachable("read the topics' metadata"));
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
      .then(() => this.admin.listTopics().catch(clusterUnreachable("list the topics")))
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

/**
 * A metadata request that failed says the cluster could not answer, never anything about a record: a retriable
 * `kafka_failed`, which admission takes for an outage (intake pauses). kafkajs's admin can fail such a request with
 * a plain TypeError (its broker pool swallows each broker's error and hands `null` on: kafkajs #461, #549), which
 * would otherwise look like a fault of the record and dead-letter a valid intent after a few tries.
 */
function clusterUnreachable(what: string): (err: unknown) => never {
  return (err) => {
    throw new WritError("kafka_failed", `could not ${what}: ${(err as Error)?.message ?? String(err)}`.slice(0, 500), { retriable: true, cause: err });
  };
}
