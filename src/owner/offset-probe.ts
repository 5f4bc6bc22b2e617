import { kafkaLogCreator } from "../kafka-log.ts";
import { TxnAdmin } from "../kafka/txn-admin.ts";
import type { Logger } from "../logger.ts";
import { kafkaConnection, type KafkaSecurity } from "../security/transport.ts";
import type { OffsetProbe } from "./hang-watch.ts";

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
    commitGroupOffsets: (groupId, topic, partitions) => admin.commitGroupOffsets(groupId, topic, partitions),
    close: () => admin.close(),
  };
}
