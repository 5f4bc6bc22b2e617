// Kafka's transaction admin operations (KIP-664) that kafkajs 2.2.4 lacks:
// DescribeProducers, ListTransactions, DescribeTransactions and WriteTxnMarkers,
// plus ListOffsets with both isolation levels (kafkajs's admin only returns the
// read_committed end). Built on kafkajs's own Cluster, Broker, connection pool,
// Encoder and Decoder: connections, SASL, TLS, metadata and FindCoordinator are
// kafkajs's; the four requests' encoders and decoders are in admin-requests.ts (the
// flexible-version encoding and the kafkajs internals' types in protocol.ts).
import { createRequire } from "node:module";
import { logLevel as LogLevel, type KafkaConfig, type RetryOptions, type logCreator } from "kafkajs";
import { WritError, type WritErrorContext } from "../errors.ts";
import { backoffMs } from "../retry.ts";
import {
  Decoder,
  Encoder,
  type KjsBroker,
  type KjsCluster,
  type KjsProtocolRequest,
  chooseVersion,
  isRetriableKafkaError,
  kafkaErrorName,
  send,
} from "./protocol.ts";
import { API, describeProducersRequest, describeTransactionsRequest, groupPartitionsByTopic, listTransactionsRequest, writeTxnMarkersRequest } from "./admin-requests.ts";

const require = createRequire(import.meta.url);

// ---------------------------------------------------------------------------
// kafkajs internals, typed as far as this module uses them (beside protocol.ts's)

interface KjsMetadataResponse {
  brokers: { nodeId: number; host: string; port: number }[];
  topicMetadata: {
    topic: string;
    topicErrorCode: number;
    partitionMetadata: { partitionId: number; leader: number; partitionErrorCode: number }[];
  }[];
}

interface KjsListOffsetsResponse {
  responses: { topic: string; partitions: { partition: number; errorCode: number; offset: string }[] }[];
}

type KjsLogger = unknown;

const Cluster = require("kafkajs/src/cluster/index.js") as new (opts: Record<string, unknown>) => KjsCluster;
const { createLogger } = require("kafkajs/src/loggers/index.js") as {
  createLogger: (opts: { level: LogLevel; logCreator: logCreator }) => KjsLogger;
};
const LoggerConsole = require("kafkajs/src/loggers/console.js") as logCreator;
const defaultSocketFactory = require("kafkajs/src/network/socketFactory.js") as () => unknown;
const { requests } = require("kafkajs/src/protocol/requests/index.js") as { requests: Record<string, unknown> };
const ISOLATION_LEVEL = require("kafkajs/src/protocol/isolationLevel.js") as { READ_UNCOMMITTED: number; READ_COMMITTED: number };
const COORDINATOR_TYPES = require("kafkajs/src/protocol/coordinatorTypes.js") as { GROUP: number; TRANSACTION: number };

// ---------------------------------------------------------------------------
// Public types

/** A partition of a topic. */
export interface TopicPartition {
  topic: string;
  partition: number;
}

/** The three ends of a partition's log. Offsets are 64-bit, hence bigint. */
export interface PartitionOffsets extends TopicPartition {
  /** Last stable offset (LSO): what a read_committed consumer can read up to; stops at the first open transaction. */
  lastStable: bigint;
  /** High watermark: what a read_uncommitted consumer can read up to. */
  highWatermark: bigint;
  /** First offset still in the log. */
  logStart: bigint;
}

/** A producer with state on a partition, as the partition leader reports it (DescribeProducers). */
export interface ProducerState {
  producerId: bigint;
  producerEpoch: number;
  /** Sequence number of the producer's last batch on this partition; -1 if unknown. */
  lastSequence: number;
  /** Timestamp (ms) of the producer's last batch on this partition; -1 if unknown. */
  lastTimestamp: number;
  /** Epoch of the coordinator that wrote this producer's last marker here; -1 when none was written yet. */
  coordinatorEpoch: number;
  /** First offset of the producer's open transaction on this partition; -1 when none is open. */
  currentTxnStartOffset: bigint;
}

/** The active producers of one partition. */
export interface PartitionProducers extends TopicPartition {
  activeProducers: ProducerState[];
}

/** States a transaction coordinator reports (Kafka's TransactionState names). */
export type TransactionState =
  | "Empty"
  | "Ongoing"
  | "PrepareCommit"
  | "PrepareAbort"
  | "CompleteCommit"
  | "CompleteAbort"
  | "Dead"
  | "PrepareEpochFence"
  | (string & {});

/** One transactional id as a coordinator lists it (ListTransactions). */
export interface TransactionListing {
  transactionalId: string;
  producerId: bigint;
  transactionState: TransactionState;
}

/** One transactional id as its coordinator describes it (DescribeTransactions). */
export interface TransactionDescription {
  transactionalId: string;
  state: TransactionState;
  producerId: bigint;
  producerEpoch: number;
  transactionTimeoutMs: number;
  /** When the current transaction started (ms); -1 when none is in progress. */
  transactionStartTimeMs: number;
  /** Partitions in the transaction; while preparing to commit or abort, only those still without a marker. */
  topicPartitions: TopicPartition[];
}

/** Which open transaction to abort on which partition: the values DescribeProducers reports. */
export interface AbortTransactionSpec extends TopicPartition {
  producerId: bigint;
  producerEpoch: number;
  /** The coordinator epoch DescribeProducers reports; -1 (no marker seen yet) is sent as 0, as kafka-transactions.sh does. */
  coordinatorEpoch: number;
}

/** An open transaction on a partition that no coordinator will close. */
export interface HangingTransaction extends TopicPartition {
  producerId: bigint;
  producerEpoch: number;
  coordinatorEpoch: number;
  /** First offset of the open transaction: the partition's LSO cannot pass it. */
  startOffset: bigint;
  /** Timestamp (ms) of the producer's last batch on the partition (its client's clock, or what it chose to write). */
  lastTimestamp: number;
  /** Sequence number of the producer's last batch on the partition: it moves with every batch the producer writes. */
  lastSequence: number;
  /** The transactional id that currently owns the producer id, when a coordinator lists one. */
  transactionalId?: string;
  /** That transactional id's state at its coordinator, when it has one. */
  transactionState?: TransactionState;
}

/** Connection options: the same ones writ hands to `new Kafka(...)`. */
export interface TxnAdminOptions {
  brokers: string[];
  clientId?: string;
  ssl?: KafkaConfig["ssl"];
  sasl?: KafkaConfig["sasl"];
  /** ms; default 1000 (kafkajs's). */
  connectionTimeout?: number;
  /** ms; default 30000 (kafkajs's). */
  requestTimeout?: number;
  authenticationTimeout?: number;
  /** kafkajs's log creator; default kafkajs's console logger. */
  logCreator?: logCreator;
  /** default WARN. */
  logLevel?: LogLevel;
  /** kafkajs's retry settings for metadata, connections and FindCoordinator. */
  retry?: RetryOptions;
  /** Attempts per operation, including the first, when Kafka answers with a retriable error (default 6). */
  maxAttempts?: number;
}

// ---------------------------------------------------------------------------
// Protocol error codes this module acts on

const CODE = {
  NONE: 0,
  UNKNOWN_TOPIC_OR_PARTITION: 3,
  LEADER_NOT_AVAILABLE: 5,
  TRANSACTIONAL_ID_NOT_FOUND: 105,
} as const;

function protocolError(api: string, code: number, message: string | null | undefined, context: WritErrorContext): WritError {
  const name = kafkaErrorName(code);
  const where = context.topic === undefined ? "" : context.partition === undefined ? ` for ${context.topic}` : ` for ${context.topic}[${context.partition}]`;
  return new WritError("kafka_failed", `${api} failed${where}: ${name}${message ? ` (${message})` : ""}`, {
    retriable: isRetriableKafkaError(code),
    context: { ...context, api, kafkaError: name, errorCode: code },
  });
}

/** kafkajs errors (connection, timeout, protocol) become `kafka_failed`, keeping kafkajs's retriable verdict. */
function asWritError(err: unknown, api: string, context: WritErrorContext = {}): WritError {
  if (err instanceof WritError) return err;
  const e = err as { name?: string; message?: string; retriable?: unknown; type?: string; code?: unknown };
  const code = typeof e.code === "number" ? e.code : undefined;
  const kafkaError = code !== undefined ? kafkaErrorName(code) : e.type;
  return new WritError("kafka_failed", `${api} failed: ${kafkaError ?? e.name ?? "error"}: ${e.message ?? String(err)}`, {
    retriable: code !== undefined ? isRetriableKafkaError(code) : e.retriable === true,
    cause: err,
    context: { ...context, api, ...(kafkaError === undefined ? {} : { kafkaError }), ...(code === undefined ? {} : { errorCode: code }) },
  });
}

// ---------------------------------------------------------------------------
// Helpers

const MAX_PARTITIONS_PER_REQUEST = 500;

/** Kafka's transaction log: the transaction coordinators' state, one coordinator per partition's leader. */
const TRANSACTION_LOG = "__transaction_state";

/** Kafka's default `transaction.max.timeout.ms`: no coordinator keeps a transaction open longer (unless the brokers raise it). */
export const KAFKA_MAX_TRANSACTION_TIMEOUT_MS = 900_000;

function key(tp: TopicPartition): string {
  return `${tp.topic}\u0000${tp.partition}`;
}

function uniquePartitions(tps: readonly TopicPartition[]): TopicPartition[] {
  const seen = new Map<string, TopicPartition>();
  for (const tp of tps) {
    if (typeof tp.topic !== "string" || tp.topic === "" || !Number.isInteger(tp.partition) || tp.partition < 0) {
      throw new WritError("config_invalid", `not a topic partition: ${JSON.stringify(tp)}`, { retriable: false, context: { field: "topicPartitions" } });
    }
    seen.set(key(tp), { topic: tp.topic, partition: tp.partition });
  }
  return [...seen.values()];
}

function chunk<T>(items: readonly T[], size: number): T[][] {
  const out: T[][] = [];
  for (let i = 0; i < items.length; i += size) out.push(items.slice(i, i + size));
  return out;
}

/** A kafkajs request whose response is decoded but not parsed: per-partition error codes stay visible. */
function unparsed<T>(protocolRequest: KjsProtocolRequest<unknown>): KjsProtocolRequest<T> {
  return {
    request: protocolRequest.request,
    response: {
      decode: protocolRequest.response.decode as (payload: Buffer) => Promise<T>,
      parse: async (decoded: T) => decoded,
    },
  };
}

function sleep(ms: number): Promise<void> {
  return new Promise((resolve) => setTimeout(resolve, ms));
}

function toBigInt(value: string, what: string): bigint {
  try {
    return BigInt(value);
  } catch (cause) {
    throw new WritError("kafka_failed", `${what}: not an offset: ${value}`, { retriable: false, cause });
  }
}

// ---------------------------------------------------------------------------

/**
 * Kafka's transaction admin operations (KIP-664) for kafkajs users: list,
 * describe and abort transactions, and find hanging ones, as
 * `kafka-transactions.sh` does, without a JVM.
 *
 * Every method connects on first use; {@link TxnAdmin.close} releases the
 * connections. Failures are `WritError`s with code `kafka_failed`, the Kafka
 * error name in `context.kafkaError` and `retriable` as Kafka classifies it;
 * retriable answers (a moved leader, a loading coordinator) are retried with
 * backoff first, up to `maxAttempts` times.
 *
 * @example
 * const admin = new TxnAdmin({ brokers: ["localhost:9092"], clientId: "writ-doctor" });
 * for (const t of await admin.findHangingTransactions({ topics: ["writ.intents"], olderThanMs: 60_000 })) {
 *   await admin.abortTransaction(t);
 * }
 * await admin.close();
 */
export class TxnAdmin {
  private readonly cluster: KjsCluster;
  private readonly maxAttempts: number;
  private connecting: Promise<void> | undefined;
  private closed = false;

  constructor(opts: TxnAdminOptions) {
    if (!Array.isArray(opts.brokers) || opts.brokers.length === 0) {
      throw new WritError("config_invalid", "TxnAdmin needs at least one broker (host:port)", { retriable: false, context: { field: "brokers" } });
    }
    this.maxAttempts = opts.maxAttempts ?? 6;
    const logger = createLogger({ level: opts.logLevel ?? LogLevel.WARN, logCreator: opts.logCreator ?? LoggerConsole });
    // as kafkajs's Client builds the Cluster for its admin client
    this.cluster = new Cluster({
      logger,
      socketFactory: defaultSocketFactory(),
      brokers: opts.brokers,
      ssl: opts.ssl,
      sasl: opts.sasl,
      clientId: opts.clientId ?? "writ-txn-admin",
      connectionTimeout: opts.connectionTimeout ?? 1000,
      authenticationTimeout: opts.authenticationTimeout,
      requestTimeout: opts.requestTimeout ?? 30_000,
      enforceRequestTimeout: true,
      metadataMaxAge: 60_000,
      retry: opts.retry,
      // a Metadata request must never create a topic it names
      allowAutoTopicCreation: false,
      maxInFlightRequests: null,
      instrumentationEmitter: null,
      offsets: new Map(),
    });
  }

  /** Connects to the bootstrap brokers and loads the cluster's brokers. Optional: every method connects on first use. */
  async connect(): Promise<void> {
    if (this.closed) throw new WritError("kafka_failed", "TxnAdmin is closed", { retriable: false });
    this.connecting ??= (async () => {
      await this.cluster.connect();
      await this.cluster.refreshMetadataIfNecessary();
    })();
    try {
      await this.connecting;
    } catch (err) {
      this.connecting = undefined;
      throw asWritError(err, "connect");
    }
  }

  /** Disconnects from every broker. The instance cannot be used afterwards. */
  async close(): Promise<void> {
    this.closed = true;
    await this.cluster.disconnect();
  }

  /**
   * The log start, last stable offset (LSO) and high watermark of each
   * partition, from its leader: ListOffsets (kafkajs's request, the newest
   * version it and the broker share, at least v2) for the earliest offset, and
   * for the latest one under READ_UNCOMMITTED (high watermark) and
   * READ_COMMITTED (LSO). LSO < high watermark means a transaction is open on
   * the partition (or its markers are still being written).
   */
  async listOffsets(topicPartitions: readonly TopicPartition[]): Promise<PartitionOffsets[]> {
    const wanted = uniquePartitions(topicPartitions);
    if (wanted.length === 0) return [];
    return this.withRetries("ListOffsets", async () => {
      const byLeader = await this.partitionsByLeader(wanted);
      const found = new Map<string, PartitionOffsets>();
      await Promise.all(
        [...byLeader].map(async ([nodeId, tps]) => {
          const broker = await this.cluster.findBroker({ nodeId });
          const query = async (isolationLevel: number, timestamp: number): Promise<Map<string, bigint>> => {
            const make = broker.lookupRequest(API.ListOffsets, requests["ListOffsets"]);
            const protocolRequest = make({
              replicaId: -1,
              isolationLevel,
              topics: [...groupPartitionsByTopic(tps)].map(([topic, partitions]) => ({
                topic,
                partitions: partitions.map((partition) => ({ partition, timestamp })),
              })),
            });
            if (protocolRequest.request.apiVersion < 2) {
              throw new WritError("kafka_failed", `broker ${nodeId} serves ListOffsets below v2, which has no isolation level`, {
                retriable: false,
                context: { api: "ListOffsets", broker: nodeId },
              });
            }
            const response = await send(broker, unparsed<KjsListOffsetsResponse>(protocolRequest));
            const out = new Map<string, bigint>();
            for (const { topic, partitions } of response.responses) {
              for (const { partition, errorCode, offset } of partitions) {
                if (errorCode !== CODE.NONE) throw protocolError("ListOffsets", errorCode, null, { topic, partition, broker: nodeId });
                out.set(key({ topic, partition }), toBigInt(offset, `ListOffsets ${topic}[${partition}]`));
              }
            }
            return out;
          };
          const [logStart, highWatermark, lastStable] = await Promise.all([
            query(ISOLATION_LEVEL.READ_UNCOMMITTED, -2),
            query(ISOLATION_LEVEL.READ_UNCOMMITTED, -1),
            query(ISOLATION_LEVEL.READ_COMMITTED, -1),
          ]);
          for (const tp of tps) {
            const k = key(tp);
            const start = logStart.get(k);
            const hw = highWatermark.get(k);
            const lso = lastStable.get(k);
            if (start === undefined || hw === undefined || lso === undefined) {
              throw new WritError("kafka_failed", `ListOffsets: broker ${nodeId} did not answer for ${tp.topic}[${tp.partition}]`, {
                retriable: true,
                context: { ...tp, api: "ListOffsets", broker: nodeId },
              });
            }
            found.set(k, { ...tp, lastStable: lso, highWatermark: hw, logStart: start });
          }
        }),
      );
      return wanted.map((tp) => found.get(key(tp)) as PartitionOffsets);
    });
  }

  /**
   * The active producers of each partition and their open transactions
   * (DescribeProducers v0, API key 61, KIP-664), asked of each partition's
   * leader. A producer with `currentTxnStartOffset >= 0` has a transaction open
   * on the partition.
   */
  async describeProducers(topicPartitions: readonly TopicPartition[]): Promise<PartitionProducers[]> {
    const wanted = uniquePartitions(topicPartitions);
    if (wanted.length === 0) return [];
    return this.withRetries("DescribeProducers", async () => {
      const byLeader = await this.partitionsByLeader(wanted);
      const found = new Map<string, PartitionProducers>();
      await Promise.all(
        [...byLeader].map(async ([nodeId, tps]) => {
          const broker = await this.cluster.findBroker({ nodeId });
          const version = chooseVersion(broker, API.DescribeProducers, "DescribeProducers", [0]);
          for (const batch of chunk(tps, MAX_PARTITIONS_PER_REQUEST)) {
            const response = await send(broker, describeProducersRequest(version, batch));
            for (const topic of response.topics) {
              for (const p of topic.partitions) {
                const tp = { topic: topic.name, partition: p.partitionIndex };
                if (p.errorCode !== CODE.NONE) throw protocolError("DescribeProducers", p.errorCode, p.errorMessage, { ...tp, broker: nodeId });
                found.set(key(tp), { ...tp, activeProducers: p.activeProducers });
              }
            }
          }
        }),
      );
      return wanted.map((tp) => {
        const result = found.get(key(tp));
        if (result === undefined) {
          throw new WritError("kafka_failed", `DescribeProducers: no answer for ${tp.topic}[${tp.partition}]`, {
            retriable: true,
            context: { ...tp, api: "DescribeProducers" },
          });
        }
        return result;
      });
    });
  }

  /**
   * The transactional ids every broker's transaction coordinator knows
   * (ListTransactions v0, API key 66, KIP-664), gathered from all brokers.
   * Empty filters mean no filtering; `stateFilters` takes Kafka's state names
   * (e.g. "Ongoing"; a name the broker does not know is a `config_invalid`
   * error), `producerIdFilters` producer ids.
   */
  async listTransactions(filters: { stateFilters?: readonly TransactionState[]; producerIdFilters?: readonly (bigint | number)[] } = {}): Promise<TransactionListing[]> {
    const stateFilters = [...(filters.stateFilters ?? [])];
    const producerIdFilters = (filters.producerIdFilters ?? []).map((p) => BigInt(p));
    return this.withRetries("ListTransactions", async () => {
      await this.connect();
      await this.cluster.refreshMetadataIfNecessary();
      const nodeIds = this.cluster.getNodeIds();
      const perBroker = await Promise.all(
        nodeIds.map(async (nodeId) => {
          const broker = await this.cluster.findBroker({ nodeId });
          const version = chooseVersion(broker, API.ListTransactions, "ListTransactions", [0]);
          const response = await send(broker, listTransactionsRequest(version, stateFilters, producerIdFilters));
          if (response.errorCode !== CODE.NONE) throw protocolError("ListTransactions", response.errorCode, null, { broker: nodeId });
          if (response.unknownStateFilters.length > 0) {
            // the broker would otherwise just list nothing for them
            throw new WritError("config_invalid", `ListTransactions: unknown transaction state filter(s): ${response.unknownStateFilters.join(", ")}`, {
              retriable: false,
              context: { api: "ListTransactions", field: "stateFilters", broker: nodeId },
            });
          }
          return response.transactionStates;
        }),
      );
      return perBroker.flat();
    });
  }

  /**
   * Commits offsets for a consumer group that has no members yet (OffsetCommit
   * with generation -1 and no member id, which Kafka accepts for an empty
   * group), in two round trips: kafkajs's `admin.setOffsets` runs a consumer
   * for it, which takes seconds.
   */
  async commitGroupOffsets(groupId: string, topic: string, partitions: readonly { partition: number; offset: string }[]): Promise<void> {
    if (partitions.length === 0) return;
    await this.withRetries("OffsetCommit", async () => {
      await this.connect();
      let coordinator: KjsBroker;
      try {
        coordinator = await this.cluster.findGroupCoordinator({ groupId, coordinatorType: COORDINATOR_TYPES.GROUP });
      } catch (err) {
        throw asWritError(err, "FindCoordinator", { groupId });
      }
      let response;
      try {
        response = await coordinator.offsetCommit({ groupId, groupGenerationId: -1, memberId: "", topics: [{ topic, partitions: [...partitions] }] });
      } catch (err) {
        throw asWritError(err, "OffsetCommit", { groupId, topic });
      }
      for (const r of response.responses) {
        for (const p of r.partitions) {
          if (p.errorCode !== CODE.NONE) throw protocolError("OffsetCommit", p.errorCode, null, { groupId, topic: r.topic, partition: p.partition });
        }
      }
    });
  }

  /**
   * Describes transactional ids at their transaction coordinators
   * (DescribeTransactions v0, API key 65, KIP-664; each coordinator found with
   * FindCoordinator key type 1 through kafkajs). An id no coordinator knows
   * (TRANSACTIONAL_ID_NOT_FOUND) is left out of the result.
   */
  async describeTransactions(transactionalIds: readonly string[]): Promise<TransactionDescription[]> {
    const ids = [...new Set(transactionalIds)];
    if (ids.length === 0) return [];
    return this.withRetries("DescribeTransactions", async () => {
      await this.connect();
      const byCoordinator = new Map<KjsBroker, string[]>();
      for (const id of ids) {
        let coordinator: KjsBroker;
        try {
          coordinator = await this.cluster.findGroupCoordinator({ groupId: id, coordinatorType: COORDINATOR_TYPES.TRANSACTION });
        } catch (err) {
          throw asWritError(err, "FindCoordinator", { transactionalId: id });
        }
        byCoordinator.set(coordinator, [...(byCoordinator.get(coordinator) ?? []), id]);
      }
      const found = new Map<string, TransactionDescription>();
      await Promise.all(
        [...byCoordinator].map(async ([broker, idsHere]) => {
          const version = chooseVersion(broker, API.DescribeTransactions, "DescribeTransactions", [0]);
          const response = await send(broker, describeTransactionsRequest(version, idsHere));
          for (const { errorCode, ...description } of response.transactionStates) {
            if (errorCode === CODE.TRANSACTIONAL_ID_NOT_FOUND) continue;
            if (errorCode !== CODE.NONE) {
              throw protocolError("DescribeTransactions", errorCode, null, { transactionalId: description.transactionalId, broker: broker.nodeId });
            }
            found.set(description.transactionalId, description);
          }
        }),
      );
      return ids.flatMap((id) => {
        const description = found.get(id);
        return description === undefined ? [] : [description];
      });
    });
  }

  /**
   * Aborts an open transaction on one partition by writing an ABORT marker
   * there: WriteTxnMarkers (API key 27, v1 or v2 as the leader serves them;
   * Kafka 4 removed v0) with `TransactionResult = false`, sent to the
   * partition's leader. This is what `kafka-transactions.sh abort` does; use it
   * only for a transaction no coordinator will finish (see
   * {@link TxnAdmin.findHangingTransactions}). The caller needs the
   * ClusterAction permission on the cluster when ACLs are on.
   */
  async abortTransaction(spec: AbortTransactionSpec): Promise<void> {
    const [tp] = uniquePartitions([spec]);
    if (tp === undefined) throw new WritError("config_invalid", "abortTransaction needs a topic partition", { retriable: false });
    if (!Number.isInteger(spec.producerEpoch) || spec.producerEpoch < 0 || spec.producerEpoch > 32767) {
      throw new WritError("config_invalid", `producer epoch must be 0..32767, got ${spec.producerEpoch}`, { retriable: false, context: { ...tp, field: "producerEpoch" } });
    }
    if (!Number.isInteger(spec.coordinatorEpoch)) {
      throw new WritError("config_invalid", `coordinator epoch must be an integer, got ${spec.coordinatorEpoch}`, { retriable: false, context: { ...tp, field: "coordinatorEpoch" } });
    }
    const producerId = BigInt(spec.producerId);
    // -1 = the partition has seen no marker from this producer's coordinator yet; 0 is <= any real coordinator epoch
    const coordinatorEpoch = Math.max(0, spec.coordinatorEpoch);
    await this.withRetries("WriteTxnMarkers", async () => {
      const byLeader = await this.partitionsByLeader([tp]);
      const [[nodeId] = []] = [...byLeader];
      if (nodeId === undefined) throw new WritError("kafka_failed", `no leader for ${tp.topic}[${tp.partition}]`, { retriable: true, context: { ...tp } });
      const broker = await this.cluster.findBroker({ nodeId });
      const version = chooseVersion(broker, API.WriteTxnMarkers, "WriteTxnMarkers", [1, 2]);
      const response = await send(
        broker,
        writeTxnMarkersRequest(version, { producerId, producerEpoch: spec.producerEpoch, committed: false, ...tp, coordinatorEpoch }),
      );
      const result = response.markers
        .flatMap((m) => m.topics)
        .filter((t) => t.name === tp.topic)
        .flatMap((t) => t.partitions)
        .find((p) => p.partitionIndex === tp.partition);
      const context = { ...tp, broker: nodeId, producerId: producerId.toString(), producerEpoch: spec.producerEpoch };
      if (result === undefined) {
        throw new WritError("kafka_failed", `WriteTxnMarkers: no answer for ${tp.topic}[${tp.partition}]`, { retriable: true, context: { ...context, api: "WriteTxnMarkers" } });
      }
      if (result.errorCode !== CODE.NONE) throw protocolError("WriteTxnMarkers", result.errorCode, null, context);
    });
  }

  /**
   * Open transactions that no coordinator will ever finish, on every partition
   * of `topics`: the rule of `kafka-transactions.sh find-hanging`. A producer's
   * open transaction on a partition (DescribeProducers `currentTxnStartOffset
   * >= 0`) whose last write is more than `olderThanMs` ago is hanging when no
   * coordinator lists a transactional id for its producer id
   * (ListTransactions), when that id's coordinator no longer knows it
   * (DescribeTransactions), or when the id's current transaction does not
   * include the partition (an ongoing or preparing transaction lists every
   * partition still waiting for a marker, so the coordinator will still write
   * one there). Set `olderThanMs` above the producers' transaction timeout
   * (writ's default is 60 s) so that transactions the coordinator is about to
   * time out are not reported.
   *
   * A producer id that no coordinator lists is not proof that none knows it:
   * Kafka leaves out of ListTransactions every transactional id this client's
   * principal may not Describe, so a live transaction of another principal
   * looks unknown. Such a transaction counts only once its last write is older
   * than `maxTransactionTimeoutMs` (the brokers' `transaction.max.timeout.ms`,
   * default 900000 as Kafka's): by then any coordinator that knew it has timed
   * it out, as `kafka-transactions.sh find-hanging --max-transaction-timeout`
   * assumes. Nor is it while a partition of the transaction log has no leader
   * (see {@link TxnAdmin.transactionLogOnline}): its coordinator, and the
   * transactions it has yet to finish, are then listed by no broker, and one
   * whose commit its producer was told of still gets its COMMIT markers when the
   * partition is back, too late if an ABORT marker came first.
   */
  async findHangingTransactions(opts: { topics: readonly string[]; olderThanMs: number; maxTransactionTimeoutMs?: number; now?: () => number }): Promise<HangingTransaction[]> {
    if (!Number.isFinite(opts.olderThanMs) || opts.olderThanMs < 0) {
      throw new WritError("config_invalid", `olderThanMs must be a non-negative number, got ${opts.olderThanMs}`, { retriable: false, context: { field: "olderThanMs" } });
    }
    const maxTransactionTimeoutMs = opts.maxTransactionTimeoutMs ?? KAFKA_MAX_TRANSACTION_TIMEOUT_MS;
    if (!Number.isFinite(maxTransactionTimeoutMs) || maxTransactionTimeoutMs < 0) {
      throw new WritError("config_invalid", `maxTransactionTimeoutMs must be a non-negative number, got ${maxTransactionTimeoutMs}`, {
        retriable: false,
        context: { field: "maxTransactionTimeoutMs" },
      });
    }
    const topics = [...new Set(opts.topics)];
    if (topics.length === 0) return [];
    const partitions = await this.withRetries("Metadata", () => this.partitionsOf(topics));
    const producers = await this.describeProducers(partitions);
    const now = (opts.now ?? Date.now)();
    const open: { tp: TopicPartition; producer: ProducerState }[] = [];
    for (const { activeProducers, ...tp } of producers) {
      for (const producer of activeProducers) {
        if (producer.currentTxnStartOffset >= 0n && now - producer.lastTimestamp > opts.olderThanMs) open.push({ tp, producer });
      }
    }
    if (open.length === 0) return [];

    const producerIds = [...new Set(open.map((o) => o.producer.producerId))];
    const wanted = new Set(producerIds);
    const transactionalIdOf = new Map<bigint, string>();
    for (const listing of await this.listTransactions({ producerIdFilters: producerIds })) {
      if (wanted.has(listing.producerId)) transactionalIdOf.set(listing.producerId, listing.transactionalId);
    }
    const descriptions = new Map(
      (await this.describeTransactions([...new Set(transactionalIdOf.values())])).map((d) => [d.transactionalId, d] as const),
    );

    const hanging: HangingTransaction[] = [];
    let logOnline: Promise<boolean> | undefined;
    for (const { tp, producer } of open) {
      const transactionalId = transactionalIdOf.get(producer.producerId);
      const description = transactionalId === undefined ? undefined : descriptions.get(transactionalId);
      const stillTracked = description?.topicPartitions.some((p) => p.topic === tp.topic && p.partition === tp.partition) ?? false;
      if (stillTracked) continue;
      // Unlisted may mean not visible to this principal: only past any coordinator's timeout is it surely left open.
      if (transactionalId === undefined && now - producer.lastTimestamp <= maxTransactionTimeoutMs) continue;
      // ...or a coordinator that is not answering now: only with the whole transaction log led is no listing proof.
      if (transactionalId === undefined && !(await (logOnline ??= this.transactionLogOnline()))) continue;
      hanging.push({
        ...tp,
        producerId: producer.producerId,
        producerEpoch: producer.producerEpoch,
        coordinatorEpoch: producer.coordinatorEpoch,
        startOffset: producer.currentTxnStartOffset,
        lastTimestamp: producer.lastTimestamp,
        lastSequence: producer.lastSequence,
        ...(transactionalId === undefined ? {} : { transactionalId }),
        ...(description === undefined ? {} : { transactionState: description.state }),
      });
    }
    return hanging;
  }

  /**
   * Whether every partition of the transaction log (`__transaction_state`) has a leader, so that every
   * transaction coordinator answers ListTransactions now. True when the log does not exist (no transaction
   * was ever begun); false when its metadata is refused (TOPIC_AUTHORIZATION_FAILED: not known).
   */
  async transactionLogOnline(): Promise<boolean> {
    const response = await this.withRetries("Metadata", () => this.metadata([TRANSACTION_LOG]));
    const meta = response.topicMetadata.find((t) => t.topic === TRANSACTION_LOG);
    if (meta === undefined || meta.topicErrorCode === CODE.UNKNOWN_TOPIC_OR_PARTITION) return true;
    if (meta.topicErrorCode !== CODE.NONE) return false;
    return meta.partitionMetadata.every((p) => p.leader !== undefined && p.leader >= 0);
  }

  // -------------------------------------------------------------------------

  /** Runs `fn`, again after a backoff while it fails with a retriable error, up to `maxAttempts` in all. */
  private async withRetries<T>(api: string, fn: () => Promise<T>): Promise<T> {
    for (let attempt = 1; ; attempt++) {
      try {
        return await fn();
      } catch (err) {
        const error = asWritError(err, api);
        if (this.closed || !error.retriable || attempt >= this.maxAttempts) throw error;
        await sleep(backoffMs(attempt, { initialDelayMs: 150, maxDelayMs: 3000 }));
      }
    }
  }

  /** Fresh Metadata for `topics` from any broker (kafkajs's request, unparsed so each partition's error stays visible). */
  private async metadata(topics: readonly string[]): Promise<KjsMetadataResponse> {
    await this.connect();
    await this.cluster.refreshMetadataIfNecessary();
    let lastError: unknown = new WritError("kafka_failed", "no brokers known", { retriable: true });
    for (const nodeId of this.cluster.getNodeIds()) {
      try {
        const broker = await this.cluster.findBroker({ nodeId });
        const make = broker.lookupRequest(API.Metadata, requests["Metadata"]);
        return await send(broker, unparsed<KjsMetadataResponse>(make({ topics: [...topics], allowAutoTopicCreation: false })));
      } catch (err) {
        lastError = err;
      }
    }
    throw asWritError(lastError, "Metadata");
  }

  /** Every partition of `topics`; a topic Kafka does not know fails the call. */
  private async partitionsOf(topics: readonly string[]): Promise<TopicPartition[]> {
    const response = await this.metadata(topics);
    const out: TopicPartition[] = [];
    for (const topic of topics) {
      const meta = response.topicMetadata.find((t) => t.topic === topic);
      if (meta === undefined) throw protocolError("Metadata", CODE.UNKNOWN_TOPIC_OR_PARTITION, null, { topic });
      if (meta.topicErrorCode !== CODE.NONE) throw protocolError("Metadata", meta.topicErrorCode, null, { topic });
      for (const p of [...meta.partitionMetadata].sort((a, b) => a.partitionId - b.partitionId)) out.push({ topic, partition: p.partitionId });
    }
    return out;
  }

  /** The current leader's node id for each partition; a partition without one fails the call (LEADER_NOT_AVAILABLE, retriable). */
  private async partitionsByLeader(tps: readonly TopicPartition[]): Promise<Map<number, TopicPartition[]>> {
    const response = await this.metadata([...new Set(tps.map((tp) => tp.topic))]);
    const byLeader = new Map<number, TopicPartition[]>();
    for (const tp of tps) {
      const meta = response.topicMetadata.find((t) => t.topic === tp.topic);
      if (meta === undefined) throw protocolError("Metadata", CODE.UNKNOWN_TOPIC_OR_PARTITION, null, { ...tp });
      if (meta.topicErrorCode !== CODE.NONE) throw protocolError("Metadata", meta.topicErrorCode, null, { ...tp });
      const partition = meta.partitionMetadata.find((p) => p.partitionId === tp.partition);
      if (partition === undefined) throw protocolError("Metadata", CODE.UNKNOWN_TOPIC_OR_PARTITION, "no such partition", { ...tp });
      if (partition.leader === undefined || partition.leader < 0) {
        const code = partition.partitionErrorCode !== CODE.NONE ? partition.partitionErrorCode : CODE.LEADER_NOT_AVAILABLE;
        throw protocolError("Metadata", code, "the partition has no leader", { ...tp });
      }
      byLeader.set(partition.leader, [...(byLeader.get(partition.leader) ?? []), tp]);
    }
    return byLeader;
  }
}
