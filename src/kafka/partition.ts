import { Partitioners, type PartitionMetadata } from "kafkajs";

const partitioner = Partitioners.DefaultPartitioner();
const metadataCache = new Map<number, PartitionMetadata[]>();

/**
 * The partition a keyed record lands on with the Java client's default
 * partitioner (murmur2 of the key bytes, positive, modulo the partition
 * count), which kafkajs's DefaultPartitioner reproduces. Every writ client
 * must produce intents this way (librdkafka: `partitioner=murmur2_random`);
 * owners check it and forward a record that landed elsewhere.
 */
export function partitionFor(key: string | Buffer, partitions: number): number {
  let partitionMetadata = metadataCache.get(partitions);
  if (!partitionMetadata) {
    partitionMetadata = Array.from({ length: partitions }, (_, p) => ({ partitionId: p, leader: 0, replicas: [0], isr: [0], partitionErrorCode: 0 }));
    metadataCache.set(partitions, partitionMetadata);
  }
  return partitioner({ topic: "", partitionMetadata, message: { key, value: null } });
}
