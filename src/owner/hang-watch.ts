import type { TopicPartition } from "../kafka/txn-admin.ts";
import { componentLogger, type Logger } from "../logger.ts";
import type { HealthBoard } from "./health.ts";

export type { TopicPartition };

/** The two ends of a partition: read_committed (last stable offset) and read_uncommitted (high watermark). */
export interface EndOffsets extends TopicPartition {
  lastStable: string;
  highWatermark: string;
}

export interface OffsetProbe {
  endOffsets(partitions: readonly TopicPartition[]): Promise<EndOffsets[]>;
  /** Commits a not-yet-joined consumer group's starting offsets (fast; see TxnAdmin.commitGroupOffsets). */
  commitGroupOffsets?(groupId: string, topic: string, partitions: readonly { partition: number; offset: string }[]): Promise<void>;
  close?(): Promise<void>;
}

interface Watch {
  lastStable: string;
  since: number;
  healedAt: number;
  reported: boolean;
}

/** Where the README explains what to do about a hanging transaction. */
export const HANG_RUNBOOK = "README.md#runbook-a-hanging-transaction";

/**
 * Watches the last stable offset of every partition this process's owners
 * write (their ledger partitions, the reply topics their ledgers name,
 * `writ.human`, `writ.dlq`, and the intents topic, where they forward). A last stable offset that stays put behind the
 * high watermark means a transaction is open there; writ's own transactions
 * last milliseconds, so after `healAfterMs` the owners that may have left it
 * (the ones that write that partition) add a control record for it to their
 * next transaction, which closes it if it was theirs (see `healTargets` in
 * partition-restore.ts). Past `reportAfterMs` (the transaction timeout) it is a
 * health failure and an error naming the partition, the offset and the
 * runbook: something only `writ doctor` or an operator can close.
 */
export class HangWatch {
  private readonly watches = new Map<string, Watch>();
  /** Topics that failed when asked alone, asked after the others when a round falls back to one topic at a time. */
  private readonly failedAlone = new Set<string>();
  private readonly probe: OffsetProbe;
  private readonly health: HealthBoard;
  private readonly log: Logger;
  private readonly healAfterMs: number;
  private readonly reportAfterMs: number;

  constructor(opts: { probe: OffsetProbe; health: HealthBoard; log: Logger; healAfterMs: number; reportAfterMs: number }) {
    this.probe = opts.probe;
    this.health = opts.health;
    this.log = componentLogger(opts.log, "hang-watch");
    this.healAfterMs = opts.healAfterMs;
    this.reportAfterMs = opts.reportAfterMs;
  }

  /**
   * One round: probes `partitions`, and calls `heal` for each partition
   * stuck past `healAfterMs` (again every `healAfterMs` while it stays stuck);
   * `heal` returns false when no owner could take the request (none running
   * writes that partition here). Returns the partitions stuck now.
   */
  async check(partitions: readonly TopicPartition[], heal: (tp: TopicPartition) => boolean): Promise<EndOffsets[]> {
    const now = Date.now();
    const ends = await this.endOffsets(partitions);
    const seen = new Set<string>();
    const stuck: EndOffsets[] = [];
    for (const end of ends) {
      const id = `${end.topic}:${end.partition}`;
      seen.add(id);
      if (BigInt(end.lastStable) >= BigInt(end.highWatermark)) {
        this.forget(id);
        continue;
      }
      let w = this.watches.get(id);
      if (!w || w.lastStable !== end.lastStable) {
        if (w?.reported) this.log.info({ topic: end.topic, partition: end.partition, offset: end.lastStable }, "last stable offset moves again");
        this.forget(id);
        w = { lastStable: end.lastStable, since: now, healedAt: 0, reported: false };
        this.watches.set(id, w);
        continue;
      }
      const age = now - w.since;
      if (age >= this.healAfterMs) {
        stuck.push(end);
        if (now - w.healedAt >= this.healAfterMs) {
          w.healedAt = now;
          const at = { topic: end.topic, partition: end.partition, offset: end.lastStable, stuckMs: age };
          // A ledger partition whose owner cannot open (a transaction hangs there) has no running owner to heal it.
          if (heal(end)) this.log.warn(at, "last stable offset stuck; healing");
          else this.log.warn(at, "last stable offset stuck; no running owner here writes it, nothing to heal it with (reported past the transaction timeout)");
        }
      }
      if (age >= this.reportAfterMs && !w.reported) {
        w.reported = true;
        const message =
          `hanging transaction on ${end.topic}-${end.partition} at offset ${end.lastStable} ` +
          `(high watermark ${end.highWatermark}, stuck ${Math.round(age / 1000)} s): read_committed readers see nothing past it; see ${HANG_RUNBOOK}`;
        this.health.problem(`hang:${id}`, message);
        this.log.error({ topic: end.topic, partition: end.partition, offset: end.lastStable, highWatermark: end.highWatermark, runbook: HANG_RUNBOOK }, message);
      }
    }
    // A partition asked about but not answered keeps its watch (and its report): not seen is not healed.
    const asked = new Set(partitions.map((tp) => `${tp.topic}:${tp.partition}`));
    for (const id of [...this.watches.keys()]) if (!seen.has(id) && !asked.has(id)) this.forget(id);
    return stuck;
  }

  /**
   * The probe's answer for `partitions`; when it fails, topic by topic, so that one topic it cannot read (deleted
   * since it was listed, a partition without a leader: the probe answers all or nothing) does not blind the watch
   * to the others, the ledger's among them. Throws when the first topics asked alone fail too (an outage). Topics
   * that failed alone before are asked last, so that two of them cannot end every round before the others are read.
   */
  private async endOffsets(partitions: readonly TopicPartition[]): Promise<EndOffsets[]> {
    try {
      const ends = await this.probe.endOffsets(partitions);
      this.failedAlone.clear();
      return ends;
    } catch (err) {
      const byTopic = new Map<string, TopicPartition[]>();
      for (const tp of partitions) byTopic.set(tp.topic, [...(byTopic.get(tp.topic) ?? []), tp]);
      if (byTopic.size < 2) throw err;
      for (const topic of this.failedAlone) if (!byTopic.has(topic)) this.failedAlone.delete(topic);
      const order = [...byTopic.keys()].sort((a, b) => Number(this.failedAlone.has(a)) - Number(this.failedAlone.has(b)));
      const ends: EndOffsets[] = [];
      const unread: string[] = [];
      // One topic at a time: hundreds of reply topics must not become hundreds of requests at once. The first two
      // failing with nothing read is an outage, not a topic: the round ends there instead of trying every topic.
      for (const topic of order) {
        try {
          ends.push(...(await this.probe.endOffsets(byTopic.get(topic) ?? [])));
          this.failedAlone.delete(topic);
        } catch {
          unread.push(topic);
          this.failedAlone.add(topic);
          if (ends.length === 0 && unread.length >= 2) throw err;
        }
      }
      this.log.debug({ err, topics: unread }, "could not read the end offsets of these topics; watching the others");
      return ends;
    }
  }

  private forget(id: string): void {
    if (this.watches.get(id)?.reported) this.health.clear(`hang:${id}`);
    this.watches.delete(id);
  }
}
