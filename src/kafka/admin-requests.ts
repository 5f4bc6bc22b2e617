// The request encoders and response decoders of the transaction admin's four requests kafkajs 2.2.4 lacks
// (DescribeProducers, ListTransactions, DescribeTransactions, WriteTxnMarkers; all flexible versions), and the
// API keys TxnAdmin (txn-admin.ts) sends. The flexible encoding itself is protocol.ts's.
import type { ProducerState, TopicPartition, TransactionDescription, TransactionListing } from "./txn-admin.ts";
import {
  type KjsProtocolRequest,
  type Throttled,
  flexibleRequest,
  readCompactArray,
  readCompactString,
  skipTaggedFields,
  throttled,
  writeCompactArray,
  writeNoTaggedFields,
} from "./protocol.ts";

export const API = { ListOffsets: 2, Metadata: 3, WriteTxnMarkers: 27, DescribeProducers: 61, DescribeTransactions: 65, ListTransactions: 66 } as const;

// DescribeProducers v0 (flexible): Topics [Name PartitionIndexes[int32]]
interface DescribeProducersResponse extends Throttled {
  topics: {
    name: string;
    partitions: { partitionIndex: number; errorCode: number; errorMessage: string | null; activeProducers: ProducerState[] }[];
  }[];
}

export function describeProducersRequest(version: number, tps: readonly TopicPartition[]): KjsProtocolRequest<DescribeProducersResponse> {
  const byTopic = groupPartitionsByTopic(tps);
  return flexibleRequest(
    API.DescribeProducers,
    "DescribeProducers",
    version,
    (e) => {
      writeCompactArray(e, [...byTopic], ([topic, partitions]) => {
        e.writeUVarIntString(topic);
        writeCompactArray(e, partitions, (p) => e.writeInt32(p));
        writeNoTaggedFields(e);
      });
      writeNoTaggedFields(e);
    },
    (d) => {
      const throttleTimeMs = d.readInt32();
      const topics = readCompactArray(d, () => {
        const name = readCompactString(d);
        const partitions = readCompactArray(d, () => {
          const partitionIndex = d.readInt32();
          const errorCode = d.readInt16();
          const errorMessage = d.readUVarIntString();
          const activeProducers = readCompactArray(d, () => {
            const producer: ProducerState = {
              producerId: d.readInt64(),
              producerEpoch: d.readInt32(),
              lastSequence: d.readInt32(),
              lastTimestamp: Number(d.readInt64()),
              coordinatorEpoch: d.readInt32(),
              currentTxnStartOffset: d.readInt64(),
            };
            skipTaggedFields(d);
            return producer;
          });
          skipTaggedFields(d);
          return { partitionIndex, errorCode, errorMessage, activeProducers };
        });
        skipTaggedFields(d);
        return { name, partitions };
      });
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { topics });
    },
  );
}

// ListTransactions v0 (flexible): StateFilters[string] ProducerIdFilters[int64]
interface ListTransactionsResponse extends Throttled {
  errorCode: number;
  unknownStateFilters: string[];
  transactionStates: TransactionListing[];
}

export function listTransactionsRequest(
  version: number,
  stateFilters: readonly string[],
  producerIdFilters: readonly bigint[],
): KjsProtocolRequest<ListTransactionsResponse> {
  return flexibleRequest(
    API.ListTransactions,
    "ListTransactions",
    version,
    (e) => {
      writeCompactArray(e, stateFilters, (s) => e.writeUVarIntString(s));
      writeCompactArray(e, producerIdFilters, (p) => e.writeInt64(p));
      writeNoTaggedFields(e);
    },
    (d) => {
      const throttleTimeMs = d.readInt32();
      const errorCode = d.readInt16();
      const unknownStateFilters = readCompactArray(d, () => readCompactString(d));
      const transactionStates = readCompactArray(d, () => {
        const listing: TransactionListing = {
          transactionalId: readCompactString(d),
          producerId: d.readInt64(),
          transactionState: readCompactString(d),
        };
        skipTaggedFields(d);
        return listing;
      });
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { errorCode, unknownStateFilters, transactionStates });
    },
  );
}

// DescribeTransactions v0 (flexible): TransactionalIds[string]
interface DescribeTransactionsResponse extends Throttled {
  transactionStates: (TransactionDescription & { errorCode: number })[];
}

export function describeTransactionsRequest(version: number, transactionalIds: readonly string[]): KjsProtocolRequest<DescribeTransactionsResponse> {
  return flexibleRequest(
    API.DescribeTransactions,
    "DescribeTransactions",
    version,
    (e) => {
      writeCompactArray(e, transactionalIds, (id) => e.writeUVarIntString(id));
      writeNoTaggedFields(e);
    },
    (d) => {
      const throttleTimeMs = d.readInt32();
      const transactionStates = readCompactArray(d, () => {
        const errorCode = d.readInt16();
        const transactionalId = readCompactString(d);
        const state = readCompactString(d);
        const transactionTimeoutMs = d.readInt32();
        const transactionStartTimeMs = Number(d.readInt64());
        const producerId = d.readInt64();
        const producerEpoch = d.readInt16();
        const topicPartitions: TopicPartition[] = [];
        readCompactArray(d, () => {
          const topic = readCompactString(d);
          for (const partition of readCompactArray(d, () => d.readInt32())) topicPartitions.push({ topic, partition });
          skipTaggedFields(d);
        });
        skipTaggedFields(d);
        return { errorCode, transactionalId, state, transactionTimeoutMs, transactionStartTimeMs, producerId, producerEpoch, topicPartitions };
      });
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { transactionStates });
    },
  );
}

// WriteTxnMarkers v1 (flexible) / v2 (+ TransactionVersion int8 per marker, KIP-1228):
// Markers [ProducerId ProducerEpoch TransactionResult Topics[Name PartitionIndexes[int32]] CoordinatorEpoch]
interface WriteTxnMarkersResponse extends Throttled {
  markers: { producerId: bigint; topics: { name: string; partitions: { partitionIndex: number; errorCode: number }[] }[] }[];
}

export function writeTxnMarkersRequest(
  version: number,
  marker: { producerId: bigint; producerEpoch: number; committed: boolean; topic: string; partition: number; coordinatorEpoch: number },
): KjsProtocolRequest<WriteTxnMarkersResponse> {
  return flexibleRequest(
    API.WriteTxnMarkers,
    "WriteTxnMarkers",
    version,
    (e) => {
      writeCompactArray(e, [marker], (m) => {
        e.writeInt64(m.producerId);
        e.writeInt16(m.producerEpoch);
        e.writeBoolean(m.committed);
        writeCompactArray(e, [m.topic], (topic) => {
          e.writeUVarIntString(topic);
          writeCompactArray(e, [m.partition], (p) => e.writeInt32(p));
          writeNoTaggedFields(e);
        });
        e.writeInt32(m.coordinatorEpoch);
        // 0 = a legacy (TV0/TV1) marker: what Kafka's own Admin.abortTransaction sends, since it leaves the field at its default
        if (version >= 2) e.writeInt8(0);
        writeNoTaggedFields(e);
      });
      writeNoTaggedFields(e);
    },
    (d) => {
      const markers = readCompactArray(d, () => {
        const producerId = d.readInt64();
        const topics = readCompactArray(d, () => {
          const name = readCompactString(d);
          const partitions = readCompactArray(d, () => {
            const result = { partitionIndex: d.readInt32(), errorCode: d.readInt16() };
            skipTaggedFields(d);
            return result;
          });
          skipTaggedFields(d);
          return { name, partitions };
        });
        skipTaggedFields(d);
        return { producerId, topics };
      });
      skipTaggedFields(d);
      return throttled(0, { markers });
    },
  );
}

/** Partitions grouped by topic, in the order met. */
export function groupPartitionsByTopic(tps: readonly TopicPartition[]): Map<string, number[]> {
  const byTopic = new Map<string, number[]>();
  for (const { topic, partition } of tps) {
    const list = byTopic.get(topic) ?? [];
    list.push(partition);
    byTopic.set(topic, list);
  }
  return byTopic;
}
