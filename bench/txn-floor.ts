// The transaction floor: what this broker and kafkajs give back-to-back
// transactions with nothing else to do, measured in the same bench run as
// writ. One transactional producer per intents partition, as writ's owner has
// (one transactional id per input partition: kafkajs has no KIP-447), each
// committing transactions one after another for a fixed time; each transaction
// writes two records to its ledger partition and one to a reply partition, the
// shape of a writ transaction carrying one result and one `pending` entry.
// writ needs one to two transaction slots per intent (its `pending` entry,
// sent before the write, commits with its result unless the write outlasts
// 250 ms), so its throughput is at most about
// txn_per_s × the results a transaction carries. The producers are the
// owner's (src/owner/transactions.ts), in the protocol asked for: v2
// (transactions v2, KIP-890) or v1 (kafkajs's, with writ's patch). Under v2
// a producer begins a transaction `spacingMs` after its last one ended (the
// owner's WRIT_TRANSACTION_SPACING_MS); the run with 0 is its control: back
// to back, the partition leader holds the first Produce of many transactions
// for its add backoff while the coordinator still writes the last markers.
//
// `block`: one producer per block of that many partitions instead, each
// transaction carrying that same shape for every partition of its block at
// once: the floor of an owner that would commit one transaction per round over
// a block of its partitions, fenced by one transactional id per block
// (docs/architecture.md §5.5); a block of all partitions is one producer over
// all of them. Its figures per partition-transaction say what that design
// would save.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import type { Logger } from "pino";
import { kafkaLogCreator } from "../src/kafka-log.ts";
import { perRequest, startRequestCount } from "./broker-requests.ts";
import { startCpuCount } from "./cpu.ts";
import { percentile, round, say } from "./workload.ts";
import { type OwnerProducer, ownerProducer } from "../src/owner/transactions.ts";

export interface TxnFloorResult {
  protocol: "v1" | "v2";
  /** ms between a producer's transactions (v2), 0 for none. */
  spacingMs: number;
  producers: number;
  /** Partitions each transaction writes (1, or a block's). */
  partitionsPerTxn: number;
  /** Transactions × partitions per transaction, per second: the slots an owner's partitions get. */
  partitionTxnPerSecond: number;
  seconds: number;
  transactions: number;
  txnPerSecond: number;
  p50Ms: number;
  p99Ms: number;
  /** CPU ms per transaction: the broker's (when local) and the producers' process's (bench/cpu.ts). */
  cpuMsPerTxn: { broker: number | null; producers: number };
  /** The same per partition-transaction (equal to cpuMsPerTxn for blocks of 1). */
  cpuMsPerPartitionTxn: { broker: number | null; producers: number };
  /** The broker's requests per transaction, by API (bench/broker-requests.ts); null when not counted. */
  brokerRequestsPerTxn: Record<string, number> | null;
}

export async function runTxnFloor(opts: {
  brokers: string[];
  brokerPid?: number | undefined;
  partitions: number;
  replyPartitions?: number;
  seconds: number;
  protocol: "v1" | "v2";
  /** Under v2: the owner's spacing of a producer's transactions (src/kafka/txn-v2.ts). */
  spacingMs: number;
  /** Partitions per producer, each of its transactions covering all of them (1, the default: one producer per partition, as the owner has them). */
  block?: number;
  logger: Logger;
  keepTopics: boolean;
}): Promise<TxnFloorResult> {
  const replyPartitions = opts.replyPartitions ?? 1;
  const kafka = new Kafka({ clientId: "writ-bench-txn-floor", brokers: opts.brokers, logLevel: logLevel.WARN, logCreator: kafkaLogCreator(opts.logger) });
  const admin = kafka.admin();
  await admin.connect();
  const id = randomUUID().slice(0, 8);
  const ledger = `writ.bench.txn-floor.ledger.${id}`;
  const replies = `writ.bench.txn-floor.replies.${id}`;
  const producers: OwnerProducer[] = [];
  try {
    await admin.createTopics({
      topics: [
        { topic: ledger, numPartitions: opts.partitions, replicationFactor: 1 },
        { topic: replies, numPartitions: replyPartitions, replicationFactor: 1 },
      ],
      waitForLeaders: true,
    });
    const all = Array.from({ length: opts.partitions }, (_, p) => p);
    // Which partitions each producer's transactions write.
    const block = Math.max(1, Math.min(opts.block ?? 1, opts.partitions));
    const shares = Array.from({ length: Math.ceil(opts.partitions / block) }, (_, b) => all.slice(b * block, (b + 1) * block));
    for (const [i] of shares.entries()) {
      const producer = await ownerProducer(kafka, { transactionalId: `writ.bench.txn-floor.${id}.${opts.protocol}.b${block}.${i}`, transactionTimeoutMs: 60_000, protocol: opts.protocol, spacingMs: opts.spacingMs });
      producers.push(producer);
      await producer.connect();
    }
    const value = Buffer.alloc(400, 0x78);
    const latencies: number[] = [];
    const countRequests = await startRequestCount(opts.brokerPid, say);
    const started = Date.now();
    const cpu = startCpuCount({ broker: opts.brokerPid });
    const end = started + opts.seconds * 1000;
    await Promise.all(
      producers.map(async (producer, i) => {
        const share = shares[i]!;
        while (Date.now() < end) {
          const t0 = performance.now();
          const txn = await producer.transaction();
          try {
            await txn.send([
              { topic: ledger, messages: share.flatMap((p) => [{ partition: p, key: `result-${p}`, value }, { partition: p, key: `pending-${p}`, value }]) },
              { topic: replies, messages: share.map((p) => ({ partition: p % replyPartitions, key: `reply-${p}`, value })) },
            ]);
            await txn.commit();
          } catch (err) {
            await txn.abort().catch(() => undefined);
            throw err;
          }
          latencies.push(performance.now() - t0);
        }
      }),
    );
    const seconds = (Date.now() - started) / 1000;
    const used = cpu();
    const requests = await countRequests();
    const perTxn = (ms: number | null | undefined, per = latencies.length) => (ms === null || ms === undefined ? null : round(ms / per, 2));
    const partitionsPerTxn = shares[0]!.length;
    const partitionTxns = latencies.length * partitionsPerTxn;
    return {
      protocol: opts.protocol,
      spacingMs: opts.protocol === "v2" ? opts.spacingMs : 0,
      cpuMsPerTxn: { broker: perTxn(used.broker), producers: perTxn(used.harness)! },
      cpuMsPerPartitionTxn: { broker: perTxn(used.broker, partitionTxns), producers: perTxn(used.harness, partitionTxns)! },
      brokerRequestsPerTxn: perRequest(requests, latencies.length),
      producers: shares.length,
      partitionsPerTxn,
      partitionTxnPerSecond: round(partitionTxns / seconds, 0)!,
      seconds: round(seconds, 1)!,
      transactions: latencies.length,
      txnPerSecond: round(latencies.length / seconds, 0)!,
      p50Ms: round(percentile(latencies, 50))!,
      p99Ms: round(percentile(latencies, 99))!,
    };
  } finally {
    await Promise.all(producers.map((p) => p.disconnect().catch(() => undefined)));
    if (!opts.keepTopics) await admin.deleteTopics({ topics: [ledger, replies] }).catch(() => undefined);
    await admin.disconnect();
  }
}
