// The kafkajs 2.2.4 internals writ sends its own Kafka requests through, and
// the flexible-version (KIP-482) encoding kafkajs lacks: shared by the
// transaction admin (txn-admin.ts) and the owner's transactions v2
// (txn-v2.ts). Connections, SASL, TLS, metadata and FindCoordinator stay
// kafkajs's; these are request encoders, response decoders and error names.
//
// kafkajs has no `exports` map, so its internals are reachable by path; they
// have no type declarations, hence createRequire and the narrow interfaces below.
import { createRequire } from "node:module";
import { WritError } from "../errors.ts";

const require = createRequire(import.meta.url);

// ---------------------------------------------------------------------------
// kafkajs internals, typed as far as writ uses them

export interface KjsEncoder {
  writeInt8(value: number): KjsEncoder;
  writeInt16(value: number): KjsEncoder;
  writeInt32(value: number): KjsEncoder;
  writeInt64(value: bigint): KjsEncoder;
  writeBoolean(value: boolean): KjsEncoder;
  writeUVarInt(value: number): KjsEncoder;
  writeUVarIntString(value: string | null): KjsEncoder;
  /** Length + 1 as an unsigned varint, then the bytes (COMPACT_BYTES, COMPACT_RECORDS). */
  writeUVarIntBytes(value: Buffer): KjsEncoder;
}

export interface KjsDecoder {
  readInt8(): number;
  readInt16(): number;
  readInt32(): number;
  readInt64(): bigint;
  readBoolean(): boolean;
  readUVarInt(): number;
  readUVarIntString(): string | null;
  forward(bytes: number): void;
}

export interface KjsProtocolRequest<T> {
  request: { apiKey: number; apiVersion: number; apiName: string; encode: () => Promise<KjsEncoder> };
  response: { decode: (payload: Buffer) => Promise<T>; parse: (decoded: T) => Promise<T> };
}

export interface KjsBroker {
  nodeId: number | null;
  offsetCommit(args: {
    groupId: string;
    groupGenerationId: number;
    memberId: string;
    topics: { topic: string; partitions: { partition: number; offset: string }[] }[];
  }): Promise<{ responses: { topic: string; partitions: { partition: number; errorCode: number }[] }[] }>;
  versions: Record<number, { minVersion: number; maxVersion: number } | undefined> | null;
  connectionPool: { send<T>(protocolRequest: KjsProtocolRequest<T>): Promise<T> };
  lookupRequest(apiKey: number, definitions: unknown): (args: Record<string, unknown>) => KjsProtocolRequest<unknown>;
  disconnect(): Promise<void>;
}

export interface KjsCluster {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  refreshMetadataIfNecessary(): Promise<void>;
  getNodeIds(): string[];
  findBroker(opts: { nodeId: number | string }): Promise<KjsBroker>;
  findGroupCoordinator(opts: { groupId: string; coordinatorType: number }): Promise<KjsBroker>;
  refreshMetadata(): Promise<void>;
  /** Adds topics to those whose metadata the cluster keeps, loading it when one is new. */
  addMultipleTargetTopics(topics: string[]): Promise<void>;
  /** The partitions of `topic` in the loaded metadata (empty when unknown). */
  findTopicPartitionMetadata(topic: string): { partitionId: number; leader: number | null }[];
}

export const Encoder = require("kafkajs/src/protocol/encoder.js") as new (initialSize?: number) => KjsEncoder;
export const Decoder = require("kafkajs/src/protocol/decoder.js") as new (buffer: Buffer) => KjsDecoder;

// ---------------------------------------------------------------------------
// Protocol error codes

// Kafka 4.4's org.apache.kafka.common.protocol.Errors, by code from -1 to 136.
const ERROR_NAMES = [
  "UNKNOWN_SERVER_ERROR", "NONE", "OFFSET_OUT_OF_RANGE", "CORRUPT_MESSAGE", "UNKNOWN_TOPIC_OR_PARTITION",
  "INVALID_FETCH_SIZE", "LEADER_NOT_AVAILABLE", "NOT_LEADER_OR_FOLLOWER", "REQUEST_TIMED_OUT",
  "BROKER_NOT_AVAILABLE", "REPLICA_NOT_AVAILABLE", "MESSAGE_TOO_LARGE", "STALE_CONTROLLER_EPOCH",
  "OFFSET_METADATA_TOO_LARGE", "NETWORK_EXCEPTION", "COORDINATOR_LOAD_IN_PROGRESS",
  "COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR", "INVALID_TOPIC_EXCEPTION", "RECORD_LIST_TOO_LARGE",
  "NOT_ENOUGH_REPLICAS", "NOT_ENOUGH_REPLICAS_AFTER_APPEND", "INVALID_REQUIRED_ACKS", "ILLEGAL_GENERATION",
  "INCONSISTENT_GROUP_PROTOCOL", "INVALID_GROUP_ID", "UNKNOWN_MEMBER_ID", "INVALID_SESSION_TIMEOUT",
  "REBALANCE_IN_PROGRESS", "INVALID_COMMIT_OFFSET_SIZE", "TOPIC_AUTHORIZATION_FAILED",
  "GROUP_AUTHORIZATION_FAILED", "CLUSTER_AUTHORIZATION_FAILED", "INVALID_TIMESTAMP",
  "UNSUPPORTED_SASL_MECHANISM", "ILLEGAL_SASL_STATE", "UNSUPPORTED_VERSION", "TOPIC_ALREADY_EXISTS",
  "INVALID_PARTITIONS", "INVALID_REPLICATION_FACTOR", "INVALID_REPLICA_ASSIGNMENT", "INVALID_CONFIG",
  "NOT_CONTROLLER", "INVALID_REQUEST", "UNSUPPORTED_FOR_MESSAGE_FORMAT", "POLICY_VIOLATION",
  "OUT_OF_ORDER_SEQUENCE_NUMBER", "DUPLICATE_SEQUENCE_NUMBER", "INVALID_PRODUCER_EPOCH", "INVALID_TXN_STATE",
  "INVALID_PRODUCER_ID_MAPPING", "INVALID_TRANSACTION_TIMEOUT", "CONCURRENT_TRANSACTIONS",
  "TRANSACTION_COORDINATOR_FENCED", "TRANSACTIONAL_ID_AUTHORIZATION_FAILED", "SECURITY_DISABLED",
  "OPERATION_NOT_ATTEMPTED", "KAFKA_STORAGE_ERROR", "LOG_DIR_NOT_FOUND", "SASL_AUTHENTICATION_FAILED",
  "UNKNOWN_PRODUCER_ID", "REASSIGNMENT_IN_PROGRESS", "DELEGATION_TOKEN_AUTH_DISABLED",
  "DELEGATION_TOKEN_NOT_FOUND", "DELEGATION_TOKEN_OWNER_MISMATCH", "DELEGATION_TOKEN_REQUEST_NOT_ALLOWED",
  "DELEGATION_TOKEN_AUTHORIZATION_FAILED", "DELEGATION_TOKEN_EXPIRED", "INVALID_PRINCIPAL_TYPE",
  "NON_EMPTY_GROUP", "GROUP_ID_NOT_FOUND", "FETCH_SESSION_ID_NOT_FOUND", "INVALID_FETCH_SESSION_EPOCH",
  "LISTENER_NOT_FOUND", "TOPIC_DELETION_DISABLED", "FENCED_LEADER_EPOCH", "UNKNOWN_LEADER_EPOCH",
  "UNSUPPORTED_COMPRESSION_TYPE", "STALE_BROKER_EPOCH", "OFFSET_NOT_AVAILABLE", "MEMBER_ID_REQUIRED",
  "PREFERRED_LEADER_NOT_AVAILABLE", "GROUP_MAX_SIZE_REACHED", "FENCED_INSTANCE_ID",
  "ELIGIBLE_LEADERS_NOT_AVAILABLE", "ELECTION_NOT_NEEDED", "NO_REASSIGNMENT_IN_PROGRESS",
  "GROUP_SUBSCRIBED_TO_TOPIC", "INVALID_RECORD", "UNSTABLE_OFFSET_COMMIT", "THROTTLING_QUOTA_EXCEEDED",
  "PRODUCER_FENCED", "RESOURCE_NOT_FOUND", "DUPLICATE_RESOURCE", "UNACCEPTABLE_CREDENTIAL",
  "INCONSISTENT_VOTER_SET", "INVALID_UPDATE_VERSION", "FEATURE_UPDATE_FAILED",
  "PRINCIPAL_DESERIALIZATION_FAILURE", "SNAPSHOT_NOT_FOUND", "POSITION_OUT_OF_RANGE", "UNKNOWN_TOPIC_ID",
  "DUPLICATE_BROKER_REGISTRATION", "BROKER_ID_NOT_REGISTERED", "INCONSISTENT_TOPIC_ID",
  "INCONSISTENT_CLUSTER_ID", "TRANSACTIONAL_ID_NOT_FOUND", "FETCH_SESSION_TOPIC_ID_ERROR",
  "INELIGIBLE_REPLICA", "NEW_LEADER_ELECTED", "OFFSET_MOVED_TO_TIERED_STORAGE", "FENCED_MEMBER_EPOCH",
  "UNRELEASED_INSTANCE_ID", "UNSUPPORTED_ASSIGNOR", "STALE_MEMBER_EPOCH", "MISMATCHED_ENDPOINT_TYPE",
  "UNSUPPORTED_ENDPOINT_TYPE", "UNKNOWN_CONTROLLER_ID", "UNKNOWN_SUBSCRIPTION_ID", "TELEMETRY_TOO_LARGE",
  "INVALID_REGISTRATION", "TRANSACTION_ABORTABLE", "INVALID_RECORD_STATE", "SHARE_SESSION_NOT_FOUND",
  "INVALID_SHARE_SESSION_EPOCH", "FENCED_STATE_EPOCH", "INVALID_VOTER_KEY", "DUPLICATE_VOTER",
  "VOTER_NOT_FOUND", "INVALID_REGULAR_EXPRESSION", "REBOOTSTRAP_REQUIRED", "STREAMS_INVALID_TOPOLOGY",
  "STREAMS_INVALID_TOPOLOGY_EPOCH", "STREAMS_TOPOLOGY_FENCED", "SHARE_SESSION_LIMIT_REACHED",
  "GROUP_DELETION_FAILED", "STREAMS_TOPOLOGY_DESCRIPTION_UPDATE_FAILED", "CONTROLLER_ID_NOT_REGISTERED",
] as const;

// Codes whose exception extends Kafka 4.4's RetriableException.
const RETRIABLE_CODES = new Set([
  2, 3, 5, 6, 7, 9, 13, 14, 15, 16, 19, 20, 41, 51, 56, 70, 71, 72, 74, 75, 78, 80, 83, 84, 88, 89, 100, 103, 106, 122, 123, 133,
]);

/** Kafka's name for a protocol error code (e.g. 6 → NOT_LEADER_OR_FOLLOWER); `UNKNOWN_ERROR_CODE_<n>` beyond Kafka 4.4's list. */
export function kafkaErrorName(code: number): string {
  return ERROR_NAMES[code + 1] ?? `UNKNOWN_ERROR_CODE_${code}`;
}

/** Whether Kafka marks the error code retriable (its exception extends RetriableException). */
export function isRetriableKafkaError(code: number): boolean {
  return RETRIABLE_CODES.has(code);
}

// ---------------------------------------------------------------------------
// Flexible-version encoding (KIP-482): compact strings and arrays, tagged fields.
// kafkajs 2.2.4 speaks no flexible version itself: its connection writes request
// header v1 (api key, version, correlation id, client id) and hands back the
// response after the correlation id. Header v2 adds a tagged-field section after
// the client id, response header v1 one after the correlation id; both are
// written/read here, as the first thing in the body.

export function writeCompactArray<T>(e: KjsEncoder, items: readonly T[], write: (item: T) => void): void {
  e.writeUVarInt(items.length + 1);
  for (const item of items) write(item);
}

export function writeNoTaggedFields(e: KjsEncoder): void {
  e.writeUVarInt(0);
}

export function readCompactArray<T>(d: KjsDecoder, read: () => T): T[] {
  const lengthPlusOne = d.readUVarInt();
  const out: T[] = [];
  for (let i = 0; i < lengthPlusOne - 1; i++) out.push(read());
  return out;
}

export function readCompactString(d: KjsDecoder): string {
  return d.readUVarIntString() ?? "";
}

/** Skips a tagged-field section (kafkajs's readTaggedFields misreads the field size as a compact length). */
export function skipTaggedFields(d: KjsDecoder): void {
  const count = d.readUVarInt();
  for (let i = 0; i < count; i++) {
    d.readUVarInt(); // tag
    d.forward(d.readUVarInt()); // size, then the value
  }
}

export interface Throttled {
  throttleTimeMs: number;
  /** read by kafkajs's connection (KIP-219) to hold back the next request */
  clientSideThrottleTime: number;
}

export function flexibleRequest<T extends Throttled>(
  apiKey: number,
  apiName: string,
  apiVersion: number,
  writeBody: (e: KjsEncoder) => void,
  readBody: (d: KjsDecoder) => T,
  /** Bytes the body will take, about: kafkajs's encoder starts at 512 and doubles, copying, as it fills. */
  sizeHint = 0,
): KjsProtocolRequest<T> {
  return {
    request: {
      apiKey,
      apiVersion,
      apiName,
      encode: async () => {
        const e = new Encoder(sizeHint + 64);
        writeNoTaggedFields(e); // request header v2
        writeBody(e);
        return e;
      },
    },
    response: {
      decode: async (payload: Buffer) => {
        const d = new Decoder(payload);
        skipTaggedFields(d); // response header v1
        return readBody(d);
      },
      parse: async (decoded: T) => decoded,
    },
  };
}

export function throttled<T extends object>(throttleTimeMs: number, body: T): T & Throttled {
  return { throttleTimeMs, clientSideThrottleTime: throttleTimeMs, ...body };
}

export function chooseVersion(broker: KjsBroker, apiKey: number, apiName: string, mine: readonly number[]): number {
  const range = broker.versions?.[apiKey];
  const usable = range === undefined ? [] : mine.filter((v) => v >= range.minVersion && v <= range.maxVersion);
  if (usable.length === 0) {
    const serves = range === undefined ? "not at all" : `v${range.minVersion}-v${range.maxVersion}`;
    throw new WritError("kafka_failed", `broker ${broker.nodeId} serves ${apiName} ${serves}; writ speaks v${mine.join(", v")}`, {
      retriable: false,
      context: { api: apiName, broker: broker.nodeId },
    });
  }
  return Math.max(...usable);
}

/** Sends through the broker's kafkajs connection pool, as kafkajs's Broker does. */
export async function send<T>(broker: KjsBroker, protocolRequest: KjsProtocolRequest<T>): Promise<T> {
  try {
    return await broker.connectionPool.send(protocolRequest);
  } catch (err) {
    if ((err as { name?: string }).name === "KafkaJSConnectionClosedError") await broker.disconnect().catch(() => undefined);
    throw err;
  }
}

