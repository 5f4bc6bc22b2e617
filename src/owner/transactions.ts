/**
 * The owner's transactional producer, in one of two protocols (config
 * `transactionProtocol`, WRIT_TRANSACTION_PROTOCOL):
 * - **v2** (src/kafka/txn-v2.ts): Produce v12 adds its partitions to the
 *   transaction and EndTxn v5 bumps the epoch; two requests per transaction
 *   (three with the consumed offset). Used when the cluster has
 *   `transaction.version` 2 finalized (Kafka 4.0+ by default).
 * - **v1**: kafkajs's own producer: AddPartitionsToTxn, Produce, EndTxn
 *   (AddOffsetsToTxn and TxnOffsetCommit with the offset), with writ's patch of
 *   its coordinator requests (src/kafka/txn-requests.ts).
 * Both fence alike: a new owner's InitProducerId bumps the epoch of the
 * partition's transactional id, and the old owner's next request is refused.
 */
import { Partitioners, type Kafka, type ProducerConfig, type TopicMessages, type Transaction } from "kafkajs";
import { WritError } from "../errors.ts";
import { patchTransactionalRequests } from "../kafka/txn-requests.ts";
import { TransactionalProducerV2, type TxnOffset, type TxnRecord, clusterOf, probeTransactionVersion } from "../kafka/txn-v2.ts";

export type TransactionProtocol = "auto" | "v1" | "v2";

/** One open transaction. */
export interface OwnerTransaction {
  /** Produces one round of records (sized by the caller to fit a request). */
  send(round: readonly TopicMessages[]): Promise<void>;
  /** Commits the consumed offset in this transaction. */
  sendOffset(offset: TxnOffset): Promise<void>;
  commit(): Promise<void>;
  abort(): Promise<void>;
}

export interface OwnerProducer {
  readonly protocol: "v1" | "v2";
  /** InitProducerId: fences the previous holder of the transactional id. */
  connect(): Promise<void>;
  transaction(): Promise<OwnerTransaction>;
  disconnect(): Promise<void>;
}

/**
 * The settings of kafkajs's transactional producer (protocol v1), also used
 * by the bench's transaction floor so that it measures what the owner gets.
 * The owner also patches kafkajs's transactional requests before it makes one
 * (src/kafka/txn-requests.ts: the coordinator cached, CONCURRENT_TRANSACTIONS
 * asked again in place).
 */
export function ownerProducerOptions(transactionalId: string, transactionTimeout: number): ProducerConfig {
  return {
    transactionalId,
    idempotent: true,
    maxInFlightRequests: 1,
    transactionTimeout,
    allowAutoTopicCreation: false,
    createPartitioner: Partitioners.DefaultPartitioner,
    // kafkajs #304: right after a commit the coordinator answers CONCURRENT_TRANSACTIONS while it writes
    // the markers; kafkajs retries that after its retry delay. A short first delay (markers to a local
    // leader take a few ms; the Java client waits 20 ms for this case) keeps back-to-back transactions
    // from stalling 200–300 ms.
    retry: { initialRetryTime: 5, maxRetryTime: 1000, retries: 14, factor: 0.2, multiplier: 2 },
  };
}

/**
 * The producer for `transactionalId` in `protocol`; `auto` asks the cluster
 * (ApiVersions v3) whether transactions v2 are finalized. Not connected yet.
 * `spacingMs` (v2 only): a transaction begins at least that long after the
 * last one ended (src/kafka/txn-v2.ts; v1 asks its add again after 1 ms).
 */
export async function ownerProducer(
  kafka: Kafka,
  opts: { transactionalId: string; transactionTimeoutMs: number; protocol: TransactionProtocol; spacingMs?: number },
): Promise<OwnerProducer> {
  if (opts.protocol !== "v1") {
    const cluster = clusterOf(kafka);
    let chosen: "v1" | "v2" = "v1";
    try {
      chosen = chooseTransactionProtocol(opts.protocol, await probeTransactionVersion(cluster));
    } finally {
      if (chosen !== "v2") await cluster.disconnect().catch(() => undefined);
    }
    if (chosen === "v2") return new V2Producer(new TransactionalProducerV2(cluster, { transactionalId: opts.transactionalId, transactionTimeoutMs: opts.transactionTimeoutMs, spacingMs: opts.spacingMs }));
  }
  patchTransactionalRequests();
  return new KafkajsProducer(kafka.producer(ownerProducerOptions(opts.transactionalId, opts.transactionTimeoutMs)));
}

/**
 * The protocol for `requested` on a cluster that finalized transaction.version
 * `probe.level` and whose broker serves the v2 requests (`probe.requests`):
 * v2 only with both; `v2` asked of a cluster without them is a configuration
 * error naming the field.
 */
export function chooseTransactionProtocol(requested: TransactionProtocol, probe: { level: number; requests: boolean }): "v1" | "v2" {
  if (requested === "v1") return "v1";
  if (probe.level >= 2 && probe.requests) return "v2";
  if (requested === "auto") return "v1";
  throw new WritError(
    "config_invalid",
    `WRIT_TRANSACTION_PROTOCOL (transactionProtocol) is v2, but the cluster has transaction.version ${probe.level} finalized` +
      `${probe.requests ? "" : " and its broker does not serve Produce v12, EndTxn v5 and TxnOffsetCommit v5"}; use auto or v1`,
    { retriable: false, context: { field: "transactionProtocol" } },
  );
}

class KafkajsProducer implements OwnerProducer {
  readonly protocol = "v1" as const;
  private readonly producer: ReturnType<Kafka["producer"]>;
  constructor(producer: ReturnType<Kafka["producer"]>) {
    this.producer = producer;
  }

  connect(): Promise<void> {
    return this.producer.connect();
  }

  async transaction(): Promise<OwnerTransaction> {
    const txn: Transaction = await this.producer.transaction();
    return {
      send: async (round) => {
        await txn.sendBatch({ topicMessages: [...round], acks: -1 });
      },
      // CONCURRENT_TRANSACTIONS (the previous commit's markers still being written) is asked again in place
      // by src/kafka/txn-requests.ts, for AddOffsetsToTxn as for AddPartitionsToTxn.
      sendOffset: (o) =>
        txn.sendOffsets({ consumerGroupId: o.groupId, topics: [{ topic: o.topic, partitions: [{ partition: o.partition, offset: o.offset.toString() }] }] }),
      commit: () => txn.commit(),
      abort: () => txn.abort(),
    };
  }

  disconnect(): Promise<void> {
    return this.producer.disconnect();
  }
}

class V2Producer implements OwnerProducer {
  readonly protocol = "v2" as const;
  private readonly producer: TransactionalProducerV2;
  constructor(producer: TransactionalProducerV2) {
    this.producer = producer;
  }

  connect(): Promise<void> {
    return this.producer.init();
  }

  async transaction(): Promise<OwnerTransaction> {
    const producer = this.producer;
    // EndTxn only for a transaction that began: one with records or an offset in it.
    let open = false;
    return {
      send: async (round) => {
        const records: TxnRecord[] = [];
        for (const { topic, messages } of round) {
          for (const m of messages) {
            const r: TxnRecord = { topic, key: m.key ?? null, value: m.value ?? null };
            if (m.partition !== undefined) r.partition = m.partition;
            if (m.headers) r.headers = m.headers as NonNullable<TxnRecord["headers"]>;
            records.push(r);
          }
        }
        open ||= records.length > 0;
        await producer.send(records);
      },
      sendOffset: async (o) => {
        open = true;
        await producer.sendOffset(o);
      },
      commit: async () => {
        if (open) await producer.end(true);
      },
      abort: async () => {
        if (open) await producer.end(false);
      },
    };
  }

  disconnect(): Promise<void> {
    return this.producer.disconnect();
  }
}
