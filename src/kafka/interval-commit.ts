// Offset commits for a consumer whose position matters only to itself, at
// most once per interval.
//
// kafkajs's autoCommit sends an OffsetCommit after every batch it hands out,
// whatever autoCommitInterval says (the interval only adds commits inside a
// batch). An agent's reply consumer gets a batch of one or two replies at a
// time, so it asked the broker for an offset commit for nearly every reply:
// 0.67 OffsetCommit per request at C=8 in `npm run bench` (bench's
// broker_requests). Its group is its own (one per client instance), and the
// committed offset serves one case: kafkajs restarting the consumer after a
// crash resumes there instead of at the log's end, which would skip the
// replies written in between. Committing what was handled at most once per
// interval keeps that (nothing handled is skipped; a restart may hand out
// again what came in the last interval: replies are matched to waiters by
// intent id, so a second copy finds none; a listener sees it twice, as after
// any at-least-once redelivery).
import type { Consumer } from "kafkajs";
import type { Logger } from "../logger.ts";

/** How often an agent's reply consumer commits its position. */
export const REPLY_COMMIT_INTERVAL_MS = 1000;

export interface IntervalCommit {
  /** The message at `offset` of `partition` is handled: commit the position after it with the next commit. */
  handled(partition: number, offset: string): void;
  /** Commits what is handled now (after a commit in flight); a failure is kept for the next one, as on a tick. */
  flush(): Promise<void>;
  /** Stops the timer; what is handled and not yet committed stays uncommitted. */
  stop(): void;
}

/**
 * Commits, every `intervalMs`, the positions after the last handled message
 * of each partition of `topic` that moved. The consumer runs with
 * `autoCommit: false`. A commit that fails (a rebalance, a broker away) is
 * logged at debug and tried again at the next tick with the positions then.
 */
export function startIntervalCommit(consumer: Consumer, topic: string, intervalMs: number, log?: Logger): IntervalCommit {
  const due = new Map<number, string>();
  let inFlight: Promise<void> | null = null;
  const commit = async (): Promise<void> => {
    await inFlight;
    if (due.size === 0) return;
    const offsets = [...due].map(([partition, offset]) => ({ topic, partition, offset }));
    due.clear();
    inFlight = consumer.commitOffsets(offsets).catch((err: unknown) => {
      for (const o of offsets) if (!due.has(o.partition)) due.set(o.partition, o.offset);
      log?.debug({ err, topic }, "offset commit failed; trying again at the next interval");
    });
    await inFlight;
    inFlight = null;
  };
  const timer = setInterval(() => void commit(), intervalMs);
  timer.unref();
  return {
    handled(partition, offset) {
      due.set(partition, (BigInt(offset) + 1n).toString());
    },
    flush: commit,
    stop() {
      clearInterval(timer);
    },
  };
}
