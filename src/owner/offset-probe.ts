import { kafkaLogCreator } from "../kafka-log.ts";
import { TxnAdmin } from "../kafka/txn-admin.ts";
import { WritError } from "../errors.ts";
import type { Logger } from "../logger.ts";
import { kafkaConnection, type KafkaSecurity } from "../security/transport.ts";
import type { OffsetProbe } from "./hang-watch.ts";

/** How long a client's start waits for the group coordinator to take its reply consumer's first offsets. */
const COMMIT_PATIENCE_MS = 30_000;

/**
 * The end offsets of partitions under both isolation levels, through
 * {@link TxnAdmin} (kafkajs's own admin reports only the read_committed end).
 * Connects on first use.
 */
export function createOffsetProbe(opts: { brokers: string[]; clientId: string; log: Logger; security?: KafkaSecurity | undefined }): OffsetProbe {
  const admin = new TxnAdmin({ brokers: opts.brokers, clientId: opts.clientId, ...kafkaConnection(opts.security), logCreator: kafkaLogCreator(opts.log), maxAttempts: 2 });
  return {
    async endOffsets(partitions) {
      const ends = await admin.listOffsets(partitions);
      return ends.map((e) => ({ topic: e.topic, partition: e.partition, lastStable: e.lastStable.toString(), highWatermark: e.highWatermark.toString() }));
    },
    // Once, at a client's start: worth waiting for. A coordinator that is still loading, or that moved (a broker
    // just started or restarted), answers NOT_COORDINATOR or COORDINATOR_LOAD_IN_PROGRESS for a while; each try
    // finds the coordinator again. The probe's two attempts suit the end-offset checks, not this.
    async commitGroupOffsets(groupId, topic, partitions) {
      const deadline = Date.now() + COMMIT_PATIENCE_MS;
      for (;;) {
        try {
          return await admin.commitGroupOffsets(groupId, topic, partitions);
        } catch (err) {
          if (!(err instanceof WritError && err.retriable) || Date.now() >= deadline) throw err;
          await new Promise((r) => setTimeout(r, 250));
        }
      }
    },
    close: () => admin.close(),
  };
}
