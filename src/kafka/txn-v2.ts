/**
 * Kafka transactions v2 (KIP-890 part 2) for writ's owner, which kafkajs
 * 2.2.4 (its last release) cannot speak: it knows Produce up to v7 and EndTxn
 * up to v1, and its transaction manager keeps one producer epoch for the
 * producer's life.
 *
 * With `transaction.version` 2 finalized on the cluster (Kafka 4.0 and later
 * finalize it by default), a transaction is:
 * - **Produce v12**, whose partitions the partition leader adds to the
 *   transaction itself: no AddPartitionsToTxn round trip from the client;
 * - **TxnOffsetCommit v5** when the consumed offset goes in, which adds the
 *   group's offsets partition likewise: no AddOffsetsToTxn;
 * - **EndTxn v5**, which answers with the producer epoch the coordinator bumped
 *   for the next transaction (and a new producer id when the epoch ran out);
 *   sequence numbers start again at 0 under it.
 * Two requests per transaction where kafkajs sends three (four with offsets),
 * each a client round trip and a broker request less. Fencing is unchanged: an
 * InitProducerId by a newer owner bumps the epoch, and every request of the
 * old one is then refused with PRODUCER_FENCED or INVALID_PRODUCER_EPOCH.
 *
 * A transaction begun while the coordinator still writes the last one's
 * markers waits on the broker: the partition leader's add of the first
 * Produce meets CONCURRENT_TRANSACTIONS and tries again after
 * `add.partitions.to.txn.retry.backoff.ms` (20 ms by default; KAFKA-18654,
 * and KAFKA-20000 for a shorter one). `spacingMs` keeps a producer's next
 * transaction that long after its last EndTxn answered: on a local broker,
 * 2 ms took 12 producers' back-to-back transactions from 1,350-1,460 to
 * 2,770-3,090 a second (README, Benchmark, `txn-floor`).
 *
 * Connections, SASL, TLS, metadata and FindCoordinator are kafkajs's (its own
 * Cluster, built with the client's settings); record batches are kafkajs's
 * encoder's; failures are kafkajs's protocol errors (their `type` is what the
 * owner's fencing check reads). {@link probeTransactionVersion} asks a broker
 * (ApiVersions v3) which transaction version the cluster has finalized.
 */
import { createRequire } from "node:module";
import { setTimeout as sleep } from "node:timers/promises";
import { Partitioners, type Kafka, type PartitionMetadata } from "kafkajs";
import { backoffMs } from "../retry.ts";
import { partitionFor } from "./partition.ts";
import {
  Decoder,
  Encoder,
  type KjsBroker,
  type KjsCluster,
  type KjsDecoder,
  type KjsProtocolRequest,
  type Throttled,
  flexibleRequest,
  readCompactArray,
  readCompactString,
  send,
  skipTaggedFields,
  throttled,
  writeCompactArray,
  writeNoTaggedFields,
} from "./protocol.ts";
import { encodeRecordBatch } from "./record-batch.ts";
import { askCoordinator, forgetsCoordinator, patchTransactionalRequests, transactionCoordinators } from "./txn-requests.ts";

const require = createRequire(import.meta.url);
const { createErrorFromCode } = require("kafkajs/src/protocol/error.js") as { createErrorFromCode: (code: number) => Error & { type: string; retriable: boolean } };

const API = { Produce: 0, ApiVersions: 18, InitProducerId: 22, EndTxn: 26, TxnOffsetCommit: 28 } as const;
/** The request versions of transactions v2: the first that carry it. */
const V2 = { Produce: 12, EndTxn: 5, TxnOffsetCommit: 5 } as const;
const COORDINATOR = { GROUP: 0, TRANSACTION: 1 } as const;
const INT32_MAX = 2_147_483_647;

/** Error codes a Produce or TxnOffsetCommit is sent again after (the same batch and sequence: the broker drops a duplicate). */
const RESEND = new Set([
  3, // UNKNOWN_TOPIC_OR_PARTITION (metadata behind)
  5, // LEADER_NOT_AVAILABLE
  6, // NOT_LEADER_OR_FOLLOWER
  7, // REQUEST_TIMED_OUT
  13, // NETWORK_EXCEPTION
  14, // COORDINATOR_LOAD_IN_PROGRESS
  15, // COORDINATOR_NOT_AVAILABLE
  16, // NOT_COORDINATOR
  19, // NOT_ENOUGH_REPLICAS
  20, // NOT_ENOUGH_REPLICAS_AFTER_APPEND
  51, // CONCURRENT_TRANSACTIONS (the last transaction's markers still being written)
  74, // FENCED_LEADER_EPOCH
  75, // UNKNOWN_LEADER_EPOCH
]);
const COORDINATOR_MOVED = new Set([14, 15, 16]);
const DUPLICATE_SEQUENCE_NUMBER = 46;
/** Attempts of one Produce or TxnOffsetCommit, the first included; waits 20 ms … 1 s between them. */
const ATTEMPTS = 8;

/** One record of a transaction (the owner's OutRecord). */
export interface TxnRecord {
  topic: string;
  /** Explicit partition; otherwise by key as the Java client's default partitioner, or, keyless, kafkajs's. */
  partition?: number;
  key: string | Buffer | null;
  value: string | Buffer | null;
  headers?: Record<string, string | Buffer | (string | Buffer)[]>;
}

/** The consumed offset a transaction commits for a group. */
export interface TxnOffset {
  groupId: string;
  topic: string;
  partition: number;
  offset: bigint;
}

interface PartitionBatch {
  topic: string;
  partition: number;
  records: TxnRecord[];
}

// ---------------------------------------------------------------------------
// Requests

interface ProduceResponse extends Throttled {
  topics: { topic: string; partitions: { partition: number; errorCode: number; errorMessage: string | null }[] }[];
}

/** Produce v12 (flexible): TransactionalId Acks TimeoutMs [Name [Index Records]]. Records are whole encoded batches. */
function produceRequest(transactionalId: string, timeoutMs: number, batches: readonly { topic: string; partitions: { partition: number; batch: Buffer }[] }[]): KjsProtocolRequest<ProduceResponse> {
  return flexibleRequest(
    API.Produce,
    "Produce",
    V2.Produce,
    (e) => {
      e.writeUVarIntString(transactionalId);
      e.writeInt16(-1);
      e.writeInt32(timeoutMs);
      writeCompactArray(e, batches, (t) => {
        e.writeUVarIntString(t.topic);
        writeCompactArray(e, t.partitions, (p) => {
          e.writeInt32(p.partition);
          e.writeUVarIntBytes(p.batch);
          writeNoTaggedFields(e);
        });
        writeNoTaggedFields(e);
      });
      writeNoTaggedFields(e);
    },
    (d) => {
      const topics = readCompactArray(d, () => {
        const topic = readCompactString(d);
        const partitions = readCompactArray(d, () => {
          const partition = d.readInt32();
          const errorCode = d.readInt16();
          d.readInt64(); // base offset
          d.readInt64(); // log append time
          d.readInt64(); // log start offset
          readCompactArray(d, () => {
            d.readInt32();
            d.readUVarIntString();
            skipTaggedFields(d);
          });
          const errorMessage = d.readUVarIntString();
          skipTaggedFields(d);
          return { partition, errorCode, errorMessage };
        });
        skipTaggedFields(d);
        return { topic, partitions };
      });
      const throttleTimeMs = d.readInt32();
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { topics });
    },
    // The batches, and for each topic and partition its name, index and lengths.
    transactionalId.length * 3 + batches.reduce((n, t) => n + t.topic.length * 3 + 16 + t.partitions.reduce((m, p) => m + p.batch.length + 16, 0), 0),
  );
}

interface EndTxnResponse extends Throttled {
  errorCode: number;
  producerId: bigint;
  producerEpoch: number;
}

/** EndTxn v5 (flexible): TransactionalId ProducerId ProducerEpoch Committed; answers with the next epoch. */
function endTxnRequest(transactionalId: string, producerId: bigint, producerEpoch: number, committed: boolean): KjsProtocolRequest<EndTxnResponse> {
  return flexibleRequest(
    API.EndTxn,
    "EndTxn",
    V2.EndTxn,
    (e) => {
      e.writeUVarIntString(transactionalId);
      e.writeInt64(producerId);
      e.writeInt16(producerEpoch);
      e.writeBoolean(committed);
      writeNoTaggedFields(e);
    },
    (d) => {
      const throttleTimeMs = d.readInt32();
      const errorCode = d.readInt16();
      const producerId = d.readInt64();
      const producerEpoch = d.readInt16();
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { errorCode, producerId: BigInt(producerId), producerEpoch });
    },
  );
}

interface TxnOffsetCommitResponse extends Throttled {
  errorCodes: number[];
}

/** TxnOffsetCommit v5 (flexible), without a group generation (as a producer outside the group commits). */
function txnOffsetCommitRequest(transactionalId: string, producerId: bigint, producerEpoch: number, o: TxnOffset): KjsProtocolRequest<TxnOffsetCommitResponse> {
  return flexibleRequest(
    API.TxnOffsetCommit,
    "TxnOffsetCommit",
    V2.TxnOffsetCommit,
    (e) => {
      e.writeUVarIntString(transactionalId);
      e.writeUVarIntString(o.groupId);
      e.writeInt64(producerId);
      e.writeInt16(producerEpoch);
      e.writeInt32(-1); // generation id: none
      e.writeUVarIntString(""); // member id: none
      e.writeUVarIntString(null); // group instance id
      writeCompactArray(e, [o], (t) => {
        e.writeUVarIntString(t.topic);
        writeCompactArray(e, [t], (p) => {
          e.writeInt32(p.partition);
          e.writeInt64(p.offset);
          e.writeInt32(-1); // committed leader epoch: unknown
          e.writeUVarIntString(null); // metadata
          writeNoTaggedFields(e);
        });
        writeNoTaggedFields(e);
      });
      writeNoTaggedFields(e);
    },
    (d) => {
      const throttleTimeMs = d.readInt32();
      const errorCodes: number[] = [];
      readCompactArray(d, () => {
        readCompactString(d);
        readCompactArray(d, () => {
          d.readInt32();
          errorCodes.push(d.readInt16());
          skipTaggedFields(d);
        });
        skipTaggedFields(d);
      });
      skipTaggedFields(d);
      return throttled(throttleTimeMs, { errorCodes });
    },
  );
}

interface ApiVersionsV3 extends Throttled {
  errorCode: number;
  finalized: Map<string, number>;
}

/**
 * ApiVersions v3: its request is flexible, but its response header stays v0
 * (no tagged fields: a client must be able to read it before it knows what
 * the broker speaks). Finalized features are tagged field 2 of the body.
 */
function apiVersionsRequest(): KjsProtocolRequest<ApiVersionsV3> {
  return {
    request: {
      apiKey: API.ApiVersions,
      apiVersion: 3,
      apiName: "ApiVersions",
      encode: async () => {
        const e = new Encoder();
        writeNoTaggedFields(e); // request header v2
        e.writeUVarIntString("writ");
        e.writeUVarIntString("1");
        writeNoTaggedFields(e);
        return e;
      },
    },
    response: {
      decode: async (payload: Buffer) => decodeApiVersionsV3(new Decoder(payload)),
      parse: async (decoded: ApiVersionsV3) => decoded,
    },
  };
}

/** The body of an ApiVersions v3 response: its error code and the cluster's finalized feature levels. */
export function decodeApiVersionsV3(d: KjsDecoder): ApiVersionsV3 {
  const errorCode = d.readInt16();
  readCompactArray(d, () => {
    d.readInt16();
    d.readInt16();
    d.readInt16();
    skipTaggedFields(d);
  });
  const throttleTimeMs = d.readInt32();
  const finalized = new Map<string, number>();
  const tagged = d.readUVarInt();
  for (let i = 0; i < tagged; i++) {
    const tag = d.readUVarInt();
    const size = d.readUVarInt();
    if (tag !== 2) {
      d.forward(size);
      continue;
    }
    readCompactArray(d, () => {
      const name = readCompactString(d);
      const maxLevel = d.readInt16();
      d.readInt16(); // min level
      skipTaggedFields(d);
      finalized.set(name, maxLevel);
    });
  }
  return throttled(throttleTimeMs, { errorCode, finalized });
}

// ---------------------------------------------------------------------------

/** A kafkajs Cluster with the settings of `kafka` (its brokers, TLS, SASL, timeouts, retry), as kafkajs's producer makes one. */
export function clusterOf(kafka: Kafka): KjsCluster {
  const create = Object.getOwnPropertySymbols(kafka).find((s) => s.description === "private:Kafka:createCluster");
  const make = create === undefined ? undefined : (kafka as unknown as Record<symbol, unknown>)[create];
  if (typeof make !== "function") throw new Error("kafkajs Kafka has no createCluster: writ's transactions v2 do not fit this kafkajs");
  return (make as (opts: Record<string, unknown>) => KjsCluster)({ allowAutoTopicCreation: false, maxInFlightRequests: null, metadataMaxAge: 300_000 });
}

/**
 * The `transaction.version` the cluster has finalized, asked of any broker
 * (ApiVersions v3), and whether that broker serves the request versions of
 * transactions v2. 0 when the broker is older than ApiVersions v3.
 */
export async function probeTransactionVersion(cluster: KjsCluster): Promise<{ level: number; requests: boolean }> {
  await cluster.connect();
  await cluster.refreshMetadataIfNecessary();
  const nodeId = cluster.getNodeIds()[0];
  if (nodeId === undefined) return { level: 0, requests: false };
  const broker = await cluster.findBroker({ nodeId });
  const serves = (api: number, version: number) => (broker.versions?.[api]?.maxVersion ?? -1) >= version;
  const requests = serves(API.Produce, V2.Produce) && serves(API.EndTxn, V2.EndTxn) && serves(API.TxnOffsetCommit, V2.TxnOffsetCommit);
  if (!serves(API.ApiVersions, 3)) return { level: 0, requests };
  const answer = await send(broker, apiVersionsRequest());
  if (answer.errorCode !== 0) throw createErrorFromCode(answer.errorCode);
  return { level: answer.finalized.get("transaction.version") ?? 0, requests };
}

/** How long a transaction about to begin at `now` waits so that it begins `spacingMs` after the last one ended at `endedAt`. Whole ms, 0 when none. */
export function spacingWaitMs(spacingMs: number, endedAt: number, now: number): number {
  const left = spacingMs - (now - endedAt);
  return left > 0 ? Math.ceil(left) : 0;
}

/**
 * One transactional producer speaking transactions v2, for one transactional
 * id. Not safe for concurrent transactions: the owner runs one at a time per
 * partition.
 */
export class TransactionalProducerV2 {
  readonly transactionalId: string;
  private readonly cluster: KjsCluster;
  private readonly transactionTimeoutMs: number;
  private readonly requestTimeoutMs: number;
  private producerId = -1n;
  private producerEpoch = -1;
  /** Next sequence number per `topic\0partition`, under the current epoch. */
  private readonly sequences = new Map<string, number>();
  private groupCoordinator: KjsBroker | undefined;
  private readonly keyless = Partitioners.DefaultPartitioner();
  private readonly spacingMs: number;
  /** When the last transaction ended (performance.now()), and the wait of the one begun since (null: none yet). */
  private endedAt = Number.NEGATIVE_INFINITY;
  private begun: Promise<void> | null = null;

  constructor(cluster: KjsCluster, opts: { transactionalId: string; transactionTimeoutMs: number; requestTimeoutMs?: number; spacingMs?: number }) {
    this.cluster = cluster;
    this.transactionalId = opts.transactionalId;
    this.transactionTimeoutMs = opts.transactionTimeoutMs;
    this.requestTimeoutMs = opts.requestTimeoutMs ?? 30_000;
    this.spacingMs = opts.spacingMs ?? 0;
    patchTransactionalRequests();
  }

  /** The producer id and epoch the next transaction uses. */
  get identity(): { producerId: bigint; producerEpoch: number } {
    return { producerId: this.producerId, producerEpoch: this.producerEpoch };
  }

  /**
   * InitProducerId: fences the previous holder of the transactional id and
   * aborts (or completes) its open transaction. Asked again while the
   * coordinator answers that it is loading, moved, or still ending that
   * transaction (CONCURRENT_TRANSACTIONS), up to `budgetMs`.
   */
  async init(budgetMs = 30_000): Promise<void> {
    await this.cluster.connect();
    await this.cluster.refreshMetadataIfNecessary();
    const deadline = Date.now() + budgetMs;
    for (let attempt = 1; ; attempt++) {
      try {
        const coordinator = await this.transactionCoordinator();
        const r = await (coordinator as unknown as { initProducerId(a: object): Promise<{ producerId: string; producerEpoch: number }> }).initProducerId({
          transactionalId: this.transactionalId,
          transactionTimeout: this.transactionTimeoutMs,
        });
        this.producerId = BigInt(r.producerId);
        this.producerEpoch = r.producerEpoch;
        this.sequences.clear();
        this.ended(); // it ended the last holder's open transaction, whose markers may still be on their way
        return;
      } catch (err) {
        const type = (err as { type?: unknown }).type;
        const again = type === "CONCURRENT_TRANSACTIONS" || type === "GROUP_LOAD_IN_PROGRESS" || type === "GROUP_COORDINATOR_NOT_AVAILABLE" || type === "NOT_COORDINATOR_FOR_GROUP";
        if (!again || Date.now() >= deadline) throw err;
        await sleep(backoffMs(attempt, { initialDelayMs: 20, maxDelayMs: 1000 }));
      }
    }
  }

  /** Produces `records` into the open transaction (it opens with the first), in rounds the caller sized. */
  async send(records: readonly TxnRecord[]): Promise<void> {
    if (records.length === 0) return;
    await this.opening();
    const topics = [...new Set(records.map((r) => r.topic))];
    await this.cluster.addMultipleTargetTopics(topics);
    await this.cluster.refreshMetadataIfNecessary();
    const batches = new Map<string, PartitionBatch>();
    for (const r of records) {
      const partition = r.partition ?? this.partitionOf(r.topic, r.key);
      const k = `${r.topic}\0${partition}`;
      let b = batches.get(k);
      if (b === undefined) batches.set(k, (b = { topic: r.topic, partition, records: [] }));
      b.records.push(r);
    }
    const encoded = new Map<string, Buffer>();
    for (const [k, b] of batches) encoded.set(k, this.encodeBatch(b));
    let pending = [...batches.keys()];
    for (let attempt = 1; pending.length > 0; attempt++) {
      const failed = await this.produceOnce(pending.map((k) => batches.get(k)!), encoded);
      for (const k of pending) if (!failed.has(k)) this.advance(k, batches.get(k)!.records.length);
      if (failed.size === 0) return;
      const worst = [...failed.values()].find((f) => f.fatal) ?? failed.values().next().value!;
      if (attempt >= ATTEMPTS || worst.fatal) throw worst.error;
      pending = [...failed.keys()];
      await sleep(backoffMs(attempt, { initialDelayMs: 20, maxDelayMs: 1000 }));
      await this.cluster.refreshMetadata().catch(() => undefined);
    }
  }

  /** Commits the consumed offset `o` in the open transaction (it opens the transaction if nothing was sent yet). */
  async sendOffset(o: TxnOffset): Promise<void> {
    await this.opening();
    for (let attempt = 1; ; attempt++) {
      let code = -1; // no answer: connection lost or timed out
      try {
        this.groupCoordinator ??= await this.cluster.findGroupCoordinator({ groupId: o.groupId, coordinatorType: COORDINATOR.GROUP });
        const answer = await send(this.groupCoordinator, txnOffsetCommitRequest(this.transactionalId, this.producerId, this.producerEpoch, o));
        code = answer.errorCodes.find((c) => c !== 0) ?? 0;
      } catch (err) {
        this.groupCoordinator = undefined;
        // a protocol error (kafkajs's lookup gave up) is final; no answer is tried again
        if (typeof (err as { type?: unknown }).type === "string" || attempt >= ATTEMPTS) throw err;
      }
      if (code === 0) return;
      if (code !== -1 && (!RESEND.has(code) || attempt >= ATTEMPTS)) {
        this.groupCoordinator = undefined;
        throw createErrorFromCode(code);
      }
      if (COORDINATOR_MOVED.has(code)) this.groupCoordinator = undefined;
      await sleep(backoffMs(attempt, { initialDelayMs: 20, maxDelayMs: 1000 }));
    }
  }

  /**
   * EndTxn: commits (or aborts) the open transaction and takes the epoch the
   * coordinator bumped for the next one. Asked again when the coordinator
   * moved or did not answer: under v2 the coordinator keeps the previous epoch
   * to recognise a retried EndTxn of a transaction it already ended, and
   * answers it as the first time.
   */
  async end(commit: boolean): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        const coordinator = await this.transactionCoordinator();
        const answer = await askCoordinator(
          transactionCoordinators,
          this.transactionalId,
          async () => {
            const r = await send(coordinator, endTxnRequest(this.transactionalId, this.producerId, this.producerEpoch, commit));
            if (r.errorCode !== 0) throw createErrorFromCode(r.errorCode);
            return r;
          },
          { retryConcurrent: true },
        );
        if (answer.producerId !== this.producerId || answer.producerEpoch !== this.producerEpoch) this.sequences.clear();
        this.producerId = answer.producerId;
        this.producerEpoch = answer.producerEpoch;
        this.ended();
        return;
      } catch (err) {
        if (!forgetsCoordinator(err) || attempt >= ATTEMPTS) throw err;
        await sleep(backoffMs(attempt, { initialDelayMs: 20, maxDelayMs: 1000 }));
      }
    }
  }

  private ended(): void {
    this.begun = null;
    this.endedAt = performance.now();
  }

  /**
   * Before each request of a transaction: the first waits out what is left of `spacingMs` since the last one
   * ended; any other request of the same transaction, even one sent alongside it, waits for that same wait.
   */
  private opening(): Promise<void> {
    if (this.begun === null) {
      const wait = spacingWaitMs(this.spacingMs, this.endedAt, performance.now());
      this.begun = wait > 0 ? sleep(wait) : Promise.resolve();
    }
    return this.begun;
  }

  async disconnect(): Promise<void> {
    await this.cluster.disconnect();
  }

  private transactionCoordinator(): Promise<KjsBroker> {
    return this.cluster.findGroupCoordinator({ groupId: this.transactionalId, coordinatorType: COORDINATOR.TRANSACTION });
  }

  /**
   * The partition kafkajs's producer would pick: by key, the Java client's
   * murmur2 over all partitions; without a key (dead letters), kafkajs's
   * default partitioner's turn over the partitions that have a leader.
   */
  private partitionOf(topic: string, key: string | Buffer | null): number {
    const partitionMetadata = this.cluster.findTopicPartitionMetadata(topic);
    if (partitionMetadata.length === 0) throw createErrorFromCode(3);
    if (key !== null) return partitionFor(key, partitionMetadata.length);
    return this.keyless({ topic, partitionMetadata: partitionMetadata as PartitionMetadata[], message: { key: null, value: null } });
  }

  private advance(k: string, count: number): void {
    const next = (this.sequences.get(k) ?? 0) + count;
    this.sequences.set(k, next > INT32_MAX ? next - INT32_MAX - 1 : next);
  }

  private encodeBatch(b: PartitionBatch): Buffer {
    return encodeRecordBatch(b.records, {
      producerId: this.producerId,
      producerEpoch: this.producerEpoch,
      firstSequence: this.sequences.get(`${b.topic}\0${b.partition}`) ?? 0,
      timestamp: Date.now(),
      transactional: true,
    });
  }

  /** One Produce per partition leader, in parallel. Returns the batches that failed, with whether another try may succeed. */
  private async produceOnce(batches: readonly PartitionBatch[], encoded: Map<string, Buffer>): Promise<Map<string, { error: Error; fatal: boolean }>> {
    const byLeader = new Map<number, PartitionBatch[]>();
    const failed = new Map<string, { error: Error; fatal: boolean }>();
    for (const b of batches) {
      const leader = this.cluster.findTopicPartitionMetadata(b.topic).find((p) => p.partitionId === b.partition)?.leader;
      if (leader === undefined || leader === null || leader < 0) {
        failed.set(`${b.topic}\0${b.partition}`, { error: createErrorFromCode(5), fatal: false });
        continue;
      }
      const list = byLeader.get(leader);
      if (list === undefined) byLeader.set(leader, [b]);
      else list.push(b);
    }
    await Promise.all(
      [...byLeader].map(async ([nodeId, list]) => {
        const topics = new Map<string, { partition: number; batch: Buffer }[]>();
        for (const b of list) {
          const partitions = topics.get(b.topic) ?? [];
          if (partitions.length === 0) topics.set(b.topic, partitions);
          partitions.push({ partition: b.partition, batch: encoded.get(`${b.topic}\0${b.partition}`)! });
        }
        try {
          const broker = await this.cluster.findBroker({ nodeId });
          const answer = await send(broker, produceRequest(this.transactionalId, this.requestTimeoutMs, [...topics].map(([topic, partitions]) => ({ topic, partitions }))));
          for (const t of answer.topics) {
            for (const p of t.partitions) {
              if (p.errorCode === 0 || p.errorCode === DUPLICATE_SEQUENCE_NUMBER) continue;
              failed.set(`${t.topic}\0${p.partition}`, { error: withMessage(createErrorFromCode(p.errorCode), p.errorMessage), fatal: !RESEND.has(p.errorCode) });
            }
          }
        } catch (err) {
          // No answer (connection lost, timed out): the batches may have landed; the same sequence is sent again.
          const fatal = typeof (err as { type?: unknown }).type === "string" && !(err as { retriable?: unknown }).retriable;
          for (const b of list) failed.set(`${b.topic}\0${b.partition}`, { error: err as Error, fatal });
        }
      }),
    );
    return failed;
  }
}

function withMessage(err: Error, message: string | null): Error {
  if (message) err.message = `${err.message} (${message})`;
  return err;
}

