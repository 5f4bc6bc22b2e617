// Proves src/kafka/txn-admin.ts (KIP-664 transaction admin on kafkajs's
// internals) and `writ doctor` against real Kafka 4.4 brokers: the shared test
// broker, and for genuinely hanging transactions a private single-node broker
// (src/testing/local-stack.ts in a temp dir) whose KIP-890 partition verification
// is switched off, because Kafka 4.4 with its defaults refuses to create one.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { existsSync, mkdtempSync, readFileSync, rmSync } from 'node:fs';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { pathToFileURL } from 'node:url';
import { pino } from 'pino';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import { ConfigResourceTypes, Kafka, logLevel, Partitioners } from 'kafkajs';
import type { Admin, Consumer, Producer } from 'kafkajs';
import { TxnAdmin, type HangingTransaction, type PartitionOffsets } from '../../src/kafka/txn-admin.ts';
import { abortHangingTransaction, type DoctorReport } from '../../src/doctor/doctor.ts';
import { HangWatch } from '../../src/owner/hang-watch.ts';
import { HealthBoard } from '../../src/owner/health.ts';
import { createOffsetProbe } from '../../src/owner/offset-probe.ts';
import { isPortFree } from '../../src/testing/free-port.ts';
import { KAFKA_LIBS } from '../../src/testing/local-stack.ts';
import { PORT_CLASH } from '../../src/testing/stack-process.ts';
import { waitFor } from '../helpers/wait-for.ts';

const ROOT = resolve(import.meta.dirname, '../..');
const NODE = join(ROOT, 'node_modules', '.bin', 'node');
const WRIT = join(ROOT, 'src', 'cli', 'main.ts');
const LOCAL_STACK = pathToFileURL(join(ROOT, 'src', 'testing', 'local-stack.ts')).href;
// the JVM that src/testing/local-stack.ts runs the brokers with; only for Kafka's own tool, as a cross-check
const JAVA = process.env['JAVA_HOME'] ? join(process.env['JAVA_HOME'], 'bin', 'java') : 'java';

const sharedBrokers = (inject('kafkaBrokers') || process.env['KAFKA_BROKERS'] || '')
  .split(',')
  .map((b) => b.trim())
  .filter((b) => b !== '');

const levelName = (process.env['KAFKAJS_LOG_LEVEL'] ?? 'NOTHING').toUpperCase();
const level = levelName === 'ERROR' || levelName === 'WARN' || levelName === 'INFO' || levelName === 'DEBUG' ? logLevel[levelName] : logLevel.NOTHING;

function uniqueName(kind: string): string {
  return `txnadmin.${kind}.${Date.now().toString(36)}.${randomUUID().slice(0, 8)}`;
}

// ---------------------------------------------------------------------------
// cleanup: every client and topic a test creates is released after it

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

/** Clients for one cluster, each released after the test that made it. */
function clients(brokers: string[]) {
  const kafka = new Kafka({ clientId: 'writ-txn-admin-test', brokers, logLevel: level });
  return {
    kafka,
    async admin(): Promise<Admin> {
      const admin = kafka.admin();
      await admin.connect();
      cleanups.push(() => admin.disconnect());
      return admin;
    },
    txnAdmin(): TxnAdmin {
      const admin = new TxnAdmin({ brokers, clientId: 'writ-txn-admin-test', logLevel: level });
      cleanups.push(() => admin.close());
      return admin;
    },
    async topic(admin: Admin, numPartitions: number): Promise<string> {
      const topic = uniqueName('topic');
      // kafkajs's waitForLeaders gives up on UNKNOWN_TOPIC_OR_PARTITION, which a KRaft broker can answer
      // until the new topic reaches its metadata cache: wait for the leaders here instead
      const created = await admin.createTopics({ topics: [{ topic, numPartitions }], waitForLeaders: false });
      expect(created).toBe(true);
      cleanups.push(() => admin.deleteTopics({ topics: [topic] }));
      await waitFor(
        async () => {
          const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
          const partitions = topics[0]?.partitions ?? [];
          return partitions.length === numPartitions && partitions.every((p) => p.leader >= 0);
        },
        { timeoutMs: 30_000, message: `${topic} never got leaders` },
      );
      return topic;
    },
    async producer(config: Parameters<Kafka['producer']>[0] = {}): Promise<Producer> {
      const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, ...config });
      await producer.connect();
      cleanups.push(() => producer.disconnect());
      return producer;
    },
    async transactionalProducer(transactionalId = uniqueName('txn'), transactionTimeout = 45_000): Promise<{ producer: Producer; transactionalId: string }> {
      const producer = await this.producer({ transactionalId, transactionTimeout, idempotent: true, maxInFlightRequests: 1 });
      return { producer, transactionalId };
    },
    /** A consumer group that collects every value on `topic`. */
    async collect(topic: string, readUncommitted: boolean): Promise<{ consumer: Consumer; seen: string[] }> {
      const consumer = kafka.consumer({ groupId: uniqueName('collector'), readUncommitted, maxWaitTimeInMs: 300 });
      cleanups.push(() => consumer.disconnect());
      await consumer.connect();
      await consumer.subscribe({ topic, fromBeginning: true });
      const seen: string[] = [];
      await consumer.run({
        eachMessage: async ({ message }) => {
          seen.push(message.value?.toString() ?? '<null>');
        },
      });
      return { consumer, seen };
    },
  };
}

function offsetsOf(offsets: PartitionOffsets[], partition: number): PartitionOffsets {
  const found = offsets.find((o) => o.partition === partition);
  if (found === undefined) throw new Error(`no offsets for partition ${partition} in ${JSON.stringify(offsets, (_k, v: unknown) => (typeof v === 'bigint' ? v.toString() : v))}`);
  return found;
}

const show = (value: unknown): string => JSON.stringify(value, (_k, v: unknown) => (typeof v === 'bigint' ? `${v}n` : v));

// ---------------------------------------------------------------------------
// A transactional batch written straight to the partition leader (raw Produce
// through kafkajs's Broker), for a producer id/epoch whose coordinator state is
// Empty: InitProducerId for a fresh transactional id, no AddPartitionsToTxn.

interface RawBroker {
  initProducerId(opts: { transactionalId: string; transactionTimeout: number }): Promise<{ producerId: string; producerEpoch: number }>;
  produce(opts: Record<string, unknown>): Promise<unknown>;
}
interface RawCluster {
  connect(): Promise<void>;
  disconnect(): Promise<void>;
  addTargetTopic(topic: string): Promise<void>;
  findLeaderForPartitions(topic: string, partitions: number[]): Record<string, number[]>;
  findBroker(opts: { nodeId: string | number }): Promise<RawBroker>;
  findGroupCoordinator(opts: { groupId: string; coordinatorType: number }): Promise<RawBroker>;
}
const kafkajsInternals = createRequire(import.meta.url);
const RawClusterCtor = kafkajsInternals('kafkajs/src/cluster/index.js') as new (opts: Record<string, unknown>) => RawCluster;
const { createLogger: createKafkajsLogger } = kafkajsInternals('kafkajs/src/loggers/index.js') as {
  createLogger: (opts: { level: number; logCreator: () => () => void }) => unknown;
};
const socketFactory = kafkajsInternals('kafkajs/src/network/socketFactory.js') as () => unknown;

async function rawCluster(brokers: string[]): Promise<RawCluster> {
  const cluster = new RawClusterCtor({
    logger: createKafkajsLogger({ level: logLevel.NOTHING, logCreator: () => () => {} }),
    socketFactory: socketFactory(),
    brokers,
    clientId: 'writ-txn-admin-test-raw',
    connectionTimeout: 3000,
    requestTimeout: 30_000,
    enforceRequestTimeout: true,
    allowAutoTopicCreation: false,
    offsets: new Map(),
  });
  await cluster.connect();
  cleanups.push(() => cluster.disconnect());
  return cluster;
}

/** InitProducerId for a fresh transactional id at its coordinator (which may still be loading). */
async function initFreshTransactionalId(cluster: RawCluster): Promise<{ transactionalId: string; producerId: string; producerEpoch: number }> {
  const transactionalId = uniqueName('raw-txn');
  const init = await waitFor(
    async () => {
      const coordinator = await cluster.findGroupCoordinator({ groupId: transactionalId, coordinatorType: 1 });
      return coordinator.initProducerId({ transactionalId, transactionTimeout: 60_000 });
    },
    { timeoutMs: 30_000, intervalMs: 250, message: 'InitProducerId never succeeded' },
  );
  return { transactionalId, producerId: init.producerId, producerEpoch: init.producerEpoch };
}

async function rawTransactionalProduce(
  cluster: RawCluster,
  topic: string,
  partition: number,
  producer: { transactionalId: string; producerId: string; producerEpoch: number },
  value: string,
): Promise<void> {
  await cluster.addTargetTopic(topic);
  const [leader] = Object.keys(cluster.findLeaderForPartitions(topic, [partition]));
  if (leader === undefined) throw new Error(`no leader for ${topic}[${partition}]`);
  const broker = await cluster.findBroker({ nodeId: leader });
  await broker.produce({
    transactionalId: producer.transactionalId,
    producerId: producer.producerId,
    producerEpoch: producer.producerEpoch,
    acks: -1,
    topicData: [{ topic, partitions: [{ partition, firstSequence: 0, messages: [{ key: 'k', value }] }] }],
  });
}

// ---------------------------------------------------------------------------
// child processes

function run(cmd: string, args: string[], env: NodeJS.ProcessEnv = process.env, timeoutMs = 120_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolvePromise) => {
    execFile(cmd, args, { cwd: ROOT, env, timeout: timeoutMs, maxBuffer: 16 * 1024 * 1024 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === 'number' ? error.code : 1;
      resolvePromise({ code, stdout, stderr });
    });
  });
}

async function doctor(args: string[]): Promise<{ code: number; report: DoctorReport | undefined; stdout: string; stderr: string }> {
  const result = await run(NODE, [WRIT, 'doctor', ...args]);
  let report: DoctorReport | undefined;
  try {
    report = JSON.parse(result.stdout) as DoctorReport;
  } catch {
    report = undefined;
  }
  return { ...result, report };
}

// ===========================================================================

describe('txn-admin against the shared Kafka 4.4 broker', () => {
  const k = clients(sharedBrokers);

  it('listOffsets: LSO < high watermark while a transaction is open on a partition, LSO == high watermark after it commits', async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 2);
    const plain = await k.producer();
    await plain.send({ topic, acks: -1, messages: [{ partition: 1, value: 'plain' }] });
    const { producer } = await k.transactionalProducer();
    const txa = k.txnAdmin();
    const tps = [
      { topic, partition: 0 },
      { topic, partition: 1 },
    ];

    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ partition: 0, value: 'open' }] });
    const open = await txa.listOffsets(tps);
    expect(offsetsOf(open, 0)).toEqual({ topic, partition: 0, logStart: 0n, lastStable: 0n, highWatermark: 1n });
    // the other partition has no open transaction: both ends agree
    expect(offsetsOf(open, 1)).toEqual({ topic, partition: 1, logStart: 0n, lastStable: 1n, highWatermark: 1n });

    await txn.commit();
    // the commit marker is written asynchronously by the coordinator
    const committed = await waitFor(
      async () => {
        const p0 = offsetsOf(await txa.listOffsets(tps), 0);
        return p0.lastStable === p0.highWatermark ? p0 : undefined;
      },
      { timeoutMs: 20_000, message: 'LSO never reached the high watermark after commit' },
    );
    // the record and the commit marker
    expect(committed).toEqual({ topic, partition: 0, logStart: 0n, lastStable: 2n, highWatermark: 2n });
  });

  it("describeProducers: shows the open transaction's start offset, and none once it commits", async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 1);
    const plain = await k.producer();
    await plain.send({ topic, acks: -1, messages: [{ value: 'p0' }, { value: 'p1' }] });
    const { producer, transactionalId } = await k.transactionalProducer();
    const txa = k.txnAdmin();

    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ value: 't0' }, { value: 't1' }] });
    const [state] = await txa.describeProducers([{ topic, partition: 0 }]);
    const [description] = await txa.describeTransactions([transactionalId]);
    // the non-idempotent producer has no producer state; the transactional one has, with its transaction open at offset 2
    expect(state?.activeProducers).toHaveLength(1);
    const active = state?.activeProducers[0];
    expect(active?.producerId).toBe(description?.producerId);
    expect(active?.producerEpoch).toBe(description?.producerEpoch);
    expect(active?.currentTxnStartOffset).toBe(2n);
    expect(active?.lastSequence).toBe(1);
    expect(Math.abs((active?.lastTimestamp ?? 0) - Date.now())).toBeLessThan(120_000);

    await txn.commit();
    const after = await waitFor(
      async () => {
        const [s] = await txa.describeProducers([{ topic, partition: 0 }]);
        const p = s?.activeProducers.find((x) => x.producerId === active?.producerId);
        return p !== undefined && p.currentTxnStartOffset === -1n ? p : undefined;
      },
      { timeoutMs: 20_000, message: 'the transaction never closed on the partition' },
    );
    // the coordinator's marker recorded its epoch on the partition
    expect(after.coordinatorEpoch).toBeGreaterThanOrEqual(0);
  });

  it('listTransactions and describeTransactions show the transactional id as Ongoing, then CompleteCommit', async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 3);
    const { producer, transactionalId } = await k.transactionalProducer(undefined, 45_000);
    const txa = k.txnAdmin();

    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ partition: 2, value: 'x' }] });

    const ongoing = await txa.listTransactions({ stateFilters: ['Ongoing'] });
    const listing = ongoing.find((l) => l.transactionalId === transactionalId);
    expect(listing?.transactionState).toBe('Ongoing');
    if (listing === undefined) throw new Error('not listed');
    expect(ongoing.every((l) => l.transactionState === 'Ongoing')).toBe(true);
    // by producer id: exactly this transactional id
    expect(await txa.listTransactions({ producerIdFilters: [listing.producerId] })).toEqual([
      { transactionalId, producerId: listing.producerId, transactionState: 'Ongoing' },
    ]);
    // the state filter really filters; a state name the broker does not know is an error, not an empty list
    expect((await txa.listTransactions({ stateFilters: ['CompleteCommit'] })).some((l) => l.transactionalId === transactionalId)).toBe(false);
    await expect(txa.listTransactions({ stateFilters: ['ongoing'] })).rejects.toMatchObject({ code: 'config_invalid', retriable: false });

    const unknownId = uniqueName('never-used');
    const described = await txa.describeTransactions([transactionalId, unknownId]);
    // an id no coordinator knows is left out
    expect(described).toHaveLength(1);
    expect(described[0]).toMatchObject({
      transactionalId,
      state: 'Ongoing',
      producerId: listing.producerId,
      transactionTimeoutMs: 45_000,
      topicPartitions: [{ topic, partition: 2 }],
    });
    expect(described[0]?.transactionStartTimeMs).toBeGreaterThan(0);

    await txn.commit();
    const done = await waitFor(
      async () => {
        const [d] = await txa.describeTransactions([transactionalId]);
        return d?.state === 'CompleteCommit' ? d : undefined;
      },
      { timeoutMs: 20_000, message: 'the transaction never completed' },
    );
    expect(done.topicPartitions).toEqual([]);
  });

  it('abortTransaction writes an abort marker: the LSO moves to the high watermark and read_committed consumers never see the record', async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 1);
    const tp = { topic, partition: 0 };
    const plain = await k.producer();
    await plain.send({ topic, acks: -1, messages: [{ value: 'before' }] });
    // a transaction that is started and never committed
    const { producer } = await k.transactionalProducer(undefined, 60_000);
    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ value: 'open' }] });
    const txa = k.txnAdmin();

    const stuck = offsetsOf(await txa.listOffsets([tp]), 0);
    expect(stuck.lastStable).toBe(1n);
    expect(stuck.highWatermark).toBe(2n);
    const [state] = await txa.describeProducers([tp]);
    const open = state?.activeProducers.find((p) => p.currentTxnStartOffset >= 0n);
    expect(open?.currentTxnStartOffset).toBe(1n);
    if (open === undefined) throw new Error('no open transaction');

    // what `writ doctor --abort` (and kafka-transactions.sh abort) does
    await txa.abortTransaction({ ...tp, producerId: open.producerId, producerEpoch: open.producerEpoch, coordinatorEpoch: open.coordinatorEpoch });
    const healed = await waitFor(
      async () => {
        const o = offsetsOf(await txa.listOffsets([tp]), 0);
        return o.lastStable === o.highWatermark ? o : undefined;
      },
      { timeoutMs: 20_000, message: 'LSO never reached the high watermark after the abort' },
    );
    // the record and the abort marker
    expect(healed.highWatermark).toBe(3n);
    const [after] = await txa.describeProducers([tp]);
    expect(after?.activeProducers.find((p) => p.producerId === open.producerId)?.currentTxnStartOffset).toBe(-1n);

    await plain.send({ topic, acks: -1, messages: [{ value: 'after' }] });
    const readCommitted = await k.collect(topic, false);
    const readUncommitted = await k.collect(topic, true);
    await waitFor(() => readCommitted.seen.includes('after'), { timeoutMs: 30_000, message: () => `read_committed saw ${JSON.stringify(readCommitted.seen)}` });
    await waitFor(() => readUncommitted.seen.includes('after'), { timeoutMs: 30_000, message: () => `read_uncommitted saw ${JSON.stringify(readUncommitted.seen)}` });
    expect(readCommitted.seen).toEqual(['before', 'after']);
    // the aborted record is in the log; only the marker hides it
    expect(readUncommitted.seen).toEqual(['before', 'open', 'after']);
  });

  it('findHangingTransactions does not report an open transaction that its coordinator still tracks, however old', async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 2);
    const { producer } = await k.transactionalProducer();
    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ partition: 1, value: 'open' }] });
    const txa = k.txnAdmin();

    // there is an open transaction, older than the threshold (0 ms)
    await waitFor(async () => {
      const [, p1] = await txa.describeProducers([
        { topic, partition: 0 },
        { topic, partition: 1 },
      ]);
      return p1?.activeProducers.some((p) => p.currentTxnStartOffset === 0n && Date.now() - p.lastTimestamp > 0);
    });
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0 })).toEqual([]);
    await txn.abort();
  });

  /** A topic of one partition with a live transaction open on it (one record, `value`), and a TxnAdmin. */
  async function openTransaction(value: string) {
    const topic = await k.topic(await k.admin(), 1);
    const { producer } = await k.transactionalProducer();
    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ value }] });
    return { topic, txn, txa: k.txnAdmin() };
  }

  /** The transaction open at offset 0 of `topic`'s partition 0, as a find would have reported it. */
  async function asFound(txa: TxnAdmin, topic: string): Promise<HangingTransaction> {
    const [p0] = await txa.describeProducers([{ topic, partition: 0 }]);
    const open = p0?.activeProducers.find((p) => p.currentTxnStartOffset === 0n);
    if (open === undefined) throw new Error(`no open transaction: ${show(p0)}`);
    const { producerId, producerEpoch, coordinatorEpoch, lastTimestamp, lastSequence } = open;
    return { topic, partition: 0, producerId, producerEpoch, coordinatorEpoch, startOffset: 0n, lastTimestamp, lastSequence };
  }

  it("findHangingTransactions does not take a live transaction whose transactional id ListTransactions leaves out (an id this principal may not Describe) for hanging, until it is older than the longest transaction timeout", async () => {
    const { topic, txn, txa } = await openTransaction('live');
    // Kafka 4.4's KafkaApis.handleListTransactionsRequest removes every transactional id the principal may not
    // Describe from the answer, without an error: a principal with Read on the topic (DescribeProducers) and
    // ClusterAction (WriteTxnMarkers) but no Describe on the owners' ids sees no coordinator for their transactions.
    txa.listTransactions = async () => [];
    await waitFor(async () => {
      const [p0] = await txa.describeProducers([{ topic, partition: 0 }]);
      return p0?.activeProducers.some((p) => p.currentTxnStartOffset === 0n && Date.now() - p.lastTimestamp > 0);
    });
    // Reported, doctor --abort would write an ABORT marker under the live producer, whose commit then succeeds
    // at its coordinator while the partition has dropped the record.
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0 })).toEqual([]);
    // Past the longest timeout any coordinator allows (Kafka's default 900000 ms), no coordinator can still end it.
    const later = await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0, now: () => Date.now() + 900_001 });
    expect(later).toMatchObject([{ topic, partition: 0, startOffset: 0n }]);
    expect(later[0]?.transactionalId).toBeUndefined();
    await txn.commit();
  });

  it("findHangingTransactions does not take an unlisted producer's transaction for hanging, however old, while a partition of the transaction log has no leader", async () => {
    const { topic, txn, txa } = await openTransaction('committed-soon');
    expect(await txa.transactionLogOnline()).toBe(true);
    // What a multi-broker outage looks like (the shared broker is one node): a __transaction_state partition without
    // a leader, whose coordinator, the one of this id, lists nothing. A transaction it has prepared to commit (its
    // producer told so) gets its COMMIT markers once the partition is back: an ABORT marker before them drops it.
    txa.transactionLogOnline = async () => false;
    txa.listTransactions = async () => [];
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0, now: () => Date.now() + 900_001 })).toEqual([]);
    await txn.commit();
  });

  it("writ doctor --abort leaves alone a transaction its producer wrote to after it was found (alive, e.g. an owner healing it): the producer's commit keeps its records", async () => {
    const { topic, txn, txa } = await openTransaction('first');
    // The transaction as a find would have reported it (the rule is shown on the private broker below).
    const found = await asFound(txa, topic);
    const open = { producerId: found.producerId, lastTimestamp: found.lastTimestamp };
    // Its producer writes to the partition again before the abort, with the same timestamp (a client's to choose,
    // as a producer passing on its input's timestamps does): only the sequence number tells.
    await txn.send({ topic, messages: [{ value: 'second', timestamp: String(open.lastTimestamp) }] });

    const abort = await abortHangingTransaction(txa, found, 5_000);
    expect(abort).toMatchObject({ ok: false, error: expect.stringContaining(`producer ${open.producerId} wrote to the partition since it was found`) });
    await txn.commit();
    const readCommitted = await k.collect(topic, false);
    await waitFor(() => readCommitted.seen.length >= 2, { timeoutMs: 20_000, message: `read_committed saw ${show(readCommitted.seen)}` });
    expect(readCommitted.seen).toEqual(['first', 'second']);
  });

  it("the owners' hang watch, through its real probe, still reports a stuck partition in a round that also asks about a topic deleted since it was listed", async () => {
    const { topic, txn } = await openTransaction('held');
    const gone = uniqueName('deleted');
    const probe = createOffsetProbe({ brokers: sharedBrokers, clientId: 'writ-hang-watch-test', log: pino({ level: 'silent' }) });
    cleanups.push(async () => probe.close?.());
    // the probe answers all or nothing: a request naming the deleted topic fails whole
    await expect(probe.endOffsets([{ topic, partition: 0 }, { topic: gone, partition: 0 }])).rejects.toThrow(/UNKNOWN_TOPIC_OR_PARTITION/);
    const health = new HealthBoard();
    const watch = new HangWatch({ probe, health, log: pino({ level: 'silent' }), healAfterMs: 0, reportAfterMs: 0 });
    const tps = [{ topic, partition: 0 }, { topic: gone, partition: 0 }];
    await watch.check(tps, () => false);
    expect(await watch.check(tps, () => false)).toMatchObject([{ topic, partition: 0, lastStable: '0', highWatermark: '1' }]);
    expect(health.health().problems.map((p) => p.key)).toEqual([`hang:${topic}:0`]);
    await txn.abort();
  });

  it("writ doctor --abort answers a finding it cannot check, or whose abort it cannot confirm, with ABORT FAILED instead of failing the run (and the report of the aborts before it)", async () => {
    // a topic deleted since the find: its partition cannot be read
    const strict = new TxnAdmin({ brokers: sharedBrokers, clientId: 'writ-txn-admin-test', logLevel: level, maxAttempts: 1 });
    cleanups.push(() => strict.close());
    const gone: HangingTransaction = { topic: uniqueName('deleted'), partition: 0, producerId: 1n, producerEpoch: 0, coordinatorEpoch: 0, startOffset: 0n, lastTimestamp: 0, lastSequence: 0 };
    expect(await abortHangingTransaction(strict, gone, 1_000)).toMatchObject({ ok: false, error: expect.stringMatching(/^not aborted: .*UNKNOWN_TOPIC_OR_PARTITION/) });

    // the marker written, then the leader stops answering ListOffsets
    const { topic, txn, txa } = await openTransaction('aborted');
    const found = await asFound(txa, topic);
    const listOffsets = txa.listOffsets.bind(txa);
    let calls = 0;
    txa.listOffsets = async (tps) => (++calls === 1 ? listOffsets(tps) : Promise.reject(new Error('ListOffsets failed: REQUEST_TIMED_OUT')));
    expect(await abortHangingTransaction(txa, found, 1_000)).toMatchObject({
      ok: false,
      lastStableBefore: '0',
      error: expect.stringContaining('the ABORT marker was written, but reading the last stable offset failed: ListOffsets failed: REQUEST_TIMED_OUT'),
    });
    await txn.abort();
  });

  it("Kafka 4.4 refuses a transactional Produce for a partition its coordinator never added (KIP-890 partition verification), so no hanging transaction can be made that way here", async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 1);
    const cluster = await rawCluster(sharedBrokers);
    const fresh = await initFreshTransactionalId(cluster);
    const refused = await rawTransactionalProduce(cluster, topic, 0, fresh, 'raw').then(
      () => undefined,
      (err: unknown) => err as { type?: string },
    );
    expect(refused?.type).toBe('INVALID_TXN_STATE');
    const txa = k.txnAdmin();
    expect(offsetsOf(await txa.listOffsets([{ topic, partition: 0 }]), 0)).toMatchObject({ lastStable: 0n, highWatermark: 0n });
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0 })).toEqual([]);
  });

  it('writ doctor --json exits 0 on a clean topic (a committed transaction, nothing open); bad usage exits 2', async () => {
    const admin = await k.admin();
    const topic = await k.topic(admin, 3);
    const { producer } = await k.transactionalProducer();
    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ partition: 0, value: 'a' }, { partition: 2, value: 'b' }] });
    await txn.commit();

    const clean = await doctor(['--brokers', sharedBrokers.join(','), '--topics', topic, '--older-than-ms', '0', '--json']);
    expect(clean.code, clean.stderr).toBe(0);
    expect(clean.report).toMatchObject({ ok: true, topics: [topic], partitions: 3, findings: [] });

    const bad = await doctor(['--brokers', sharedBrokers.join(','), '--older-than-ms', 'soon']);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain('--older-than-ms');
    const unknownTopic = await doctor(['--brokers', sharedBrokers.join(','), '--topics', uniqueName('absent'), '--json']);
    expect(unknownTopic.code).toBe(2);
    expect(unknownTopic.stderr).toContain('no such topic');
  });
});

// ===========================================================================
// Genuinely hanging transactions need a broker that accepts a transactional
// batch its coordinator never heard of. Kafka 4.4 refuses that by default (see
// above); this private broker has the dynamic broker config
// transaction.partition.verification.enable=false, so the shared broker's
// configuration is never touched.

/**
 * Two adjacent free ports (local-stack puts the controller on port + 1) below the OS's ephemeral range, as every
 * stack's (src/testing/local-stack.ts's header says why); a port the kernel picks for port 0 lies inside it.
 */
async function freePortPair(from = 22692): Promise<number> {
  for (let port = from; port < 22792; port += 2) if ((await isPortFree(port)) && (await isPortFree(port + 1))) return port;
  throw new Error(`no two adjacent free ports in ${from}-22792`);
}

/** The cluster id a stack dir's single node was formatted with. */
const clusterIdIn = (dir: string): string | undefined => {
  const meta = join(dir, 'kafka-data', 'meta.properties');
  return existsSync(meta) ? /^cluster\.id=(.+)$/m.exec(readFileSync(meta, 'utf8'))?.[1]?.trim() : undefined;
};

/** The cluster id of the broker answering on `port`, or undefined. */
async function clusterIdAt(port: number): Promise<string | undefined> {
  const admin = new Kafka({ clientId: 'writ-txn-admin-test-whose', brokers: [`127.0.0.1:${port}`], logLevel: logLevel.NOTHING, retry: { retries: 2 } }).admin();
  try {
    await admin.connect();
    return (await admin.describeCluster()).clusterId;
  } catch {
    return undefined;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

/**
 * A private broker, in a temp stack dir, on the first pair of ports free when looked at. Another run's broker (two
 * runs on one machine both look at 22692 first) can bind the pair before this JVM does: the JVM then exits on the
 * clash after local-stack's own retries on the same ports, or local-stack's start fails at once as the other broker
 * answers there (PortServedByAnotherCluster). Either way, it is stopped and the next free pair tried, in a new dir;
 * the cluster id is checked here too, since only a broker of this dir is ever to be reconfigured (below).
 */
async function startPrivateBroker(): Promise<{ dir: string; env: NodeJS.ProcessEnv; port: number }> {
  let from = 22692;
  for (let attempt = 1; ; attempt++) {
    const dir = mkdtempSync(join(tmpdir(), 'writ-txn-admin-broker-'));
    const port = await freePortPair(from);
    const env: NodeJS.ProcessEnv = { ...process.env, WRIT_LOCAL_STACK_DIR: dir, WRIT_LOCAL_KAFKA_PORT: String(port) };
    delete env['KAFKA_BROKERS'];
    const started = await run(NODE, ['--input-type=module', '-e', `const m = await import(${JSON.stringify(LOCAL_STACK)}); await m.startBroker({ timeoutMs: 150000 });`], env, 170_000);
    const ours = clusterIdIn(dir);
    const answering = started.code === 0 ? await clusterIdAt(port) : undefined;
    if (answering !== undefined && answering === ours) return { dir, env, port };
    const clash =
      started.code === 0 || ['broker.log', 'broker.out'].some((f) => existsSync(join(dir, f)) && PORT_CLASH.test(readFileSync(join(dir, f), 'utf8')));
    await stopPrivateStack(dir, env);
    const why = started.code === 0 ? `the broker answering there is of cluster ${answering}, not of this dir's ${ours}` : started.stderr;
    if (!clash || attempt >= 3) throw new Error(`private broker did not start on ${port} (attempt ${attempt}): ${why}`);
    from = port + 2;
  }
}

async function stopPrivateStack(dir: string, env: NodeJS.ProcessEnv): Promise<void> {
  await run(NODE, ['--input-type=module', '-e', `const m = await import(${JSON.stringify(LOCAL_STACK)}); await m.stopStack({ log: () => {} });`], env, 60_000);
  rmSync(dir, { recursive: true, force: true });
}

describe('hanging transactions on a broker without partition verification', () => {
  let dir = '';
  let env: NodeJS.ProcessEnv = {};
  let brokers: string[] = [];

  beforeAll(async () => {
    const broker = await startPrivateBroker();
    ({ dir, env } = broker);
    brokers = [`127.0.0.1:${broker.port}`];

    const kafka = new Kafka({ clientId: 'writ-txn-admin-test-config', brokers, logLevel: level });
    const admin = kafka.admin();
    await admin.connect();
    try {
      const { brokers: nodes } = await admin.describeCluster();
      const nodeId = String(nodes[0]?.nodeId ?? 1);
      await admin.alterConfigs({
        validateOnly: false,
        resources: [{ type: ConfigResourceTypes.BROKER, name: nodeId, configEntries: [{ name: 'transaction.partition.verification.enable', value: 'false' }] }],
      });
      // dynamic broker configs take effect through the metadata log
      await waitFor(
        async () => {
          const described = await admin.describeConfigs({
            includeSynonyms: false,
            resources: [{ type: ConfigResourceTypes.BROKER, name: nodeId, configNames: ['transaction.partition.verification.enable'] }],
          });
          return described.resources[0]?.configEntries[0]?.configValue === 'false';
        },
        { timeoutMs: 30_000, message: 'the broker never applied transaction.partition.verification.enable=false' },
      );
    } finally {
      await admin.disconnect();
    }
  }, 600_000); // up to three starts (startPrivateBroker), each bounded

  afterAll(async () => {
    if (dir === '') return;
    await stopPrivateStack(dir, env);
  }, 90_000);

  /** A transaction open on `topic[partition]` whose coordinator state is Empty: it never heard of the partition. */
  async function makeHangingTransaction(topic: string, partition: number) {
    const cluster = await rawCluster(brokers);
    const fresh = await initFreshTransactionalId(cluster);
    await rawTransactionalProduce(cluster, topic, partition, fresh, 'hanging');
    return { ...fresh, producerId: BigInt(fresh.producerId) };
  }

  it('findHangingTransactions reports exactly the transaction no coordinator will finish (as kafka-transactions.sh find-hanging does), and abortTransaction heals it', async () => {
    const k = clients(brokers);
    const admin = await k.admin();
    const topic = await k.topic(admin, 2);
    const tps = [
      { topic, partition: 0 },
      { topic, partition: 1 },
    ];
    const hanging = await makeHangingTransaction(topic, 0);
    // and a legitimate open transaction on the other partition
    const { producer } = await k.transactionalProducer();
    const txn = await producer.transaction();
    await txn.send({ topic, messages: [{ partition: 1, value: 'legit' }] });
    const txa = k.txnAdmin();

    const before = await txa.listOffsets(tps);
    expect(offsetsOf(before, 0)).toMatchObject({ lastStable: 0n, highWatermark: 1n });
    expect(offsetsOf(before, 1)).toMatchObject({ lastStable: 0n, highWatermark: 1n });
    const [description] = await txa.describeTransactions([hanging.transactionalId]);
    expect(description).toMatchObject({ state: 'Empty', producerId: hanging.producerId, topicPartitions: [] });

    const found = await waitFor(
      async () => {
        const h = await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0 });
        return h.length > 0 ? h : undefined;
      },
      { timeoutMs: 20_000, message: 'the hanging transaction was never reported' },
    );
    const expected: HangingTransaction = {
      topic,
      partition: 0,
      producerId: hanging.producerId,
      producerEpoch: hanging.producerEpoch,
      coordinatorEpoch: -1,
      startOffset: 0n,
      lastTimestamp: found[0]?.lastTimestamp ?? -1,
      // the one raw batch, first sequence 0
      lastSequence: 0,
      transactionalId: hanging.transactionalId,
      transactionState: 'Empty',
    };
    expect(found, show(found)).toEqual([expected]);
    // younger than the threshold: not reported
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 3_600_000 })).toEqual([]);

    // parity with Kafka's own tool
    const java = await run(JAVA, ['-cp', `${KAFKA_LIBS}/*`, 'org.apache.kafka.tools.TransactionsCommand', '--bootstrap-server', brokers.join(','), 'find-hanging', '--topic', topic, '--max-transaction-timeout', '0']);
    expect(java.code, java.stderr).toBe(0);
    const rows = java.stdout
      .split('\n')
      .map((line) => line.trim().split(/\s+/))
      .filter((cols) => cols[0] === topic);
    expect(rows.map((cols) => [cols[1], cols[2], cols[3], cols[5]])).toEqual([['0', hanging.producerId.toString(), String(hanging.producerEpoch), '0']]);

    await txa.abortTransaction(expected);
    const healed = await waitFor(
      async () => {
        const o = offsetsOf(await txa.listOffsets(tps), 0);
        return o.lastStable === o.highWatermark ? o : undefined;
      },
      { timeoutMs: 20_000, message: 'LSO never reached the high watermark after the abort' },
    );
    expect(healed).toMatchObject({ lastStable: 2n, highWatermark: 2n });
    expect(await txa.findHangingTransactions({ topics: [topic], olderThanMs: 0 })).toEqual([]);
    // the legitimate transaction was left alone
    expect(offsetsOf(await txa.listOffsets(tps), 1)).toMatchObject({ lastStable: 0n, highWatermark: 1n });
    await txn.commit();
  });

  it('writ doctor reports a hanging transaction (exit 1) and --abort aborts it and sees the LSO move (exit 0)', async () => {
    const k = clients(brokers);
    const admin = await k.admin();
    const topic = await k.topic(admin, 1);
    const hanging = await makeHangingTransaction(topic, 0);
    const base = ['--brokers', brokers.join(','), '--topics', topic, '--older-than-ms', '0'];

    const found = await doctor([...base, '--json']);
    expect(found.code, found.stderr).toBe(1);
    expect(found.report?.ok).toBe(false);
    expect(found.report?.findings).toHaveLength(1);
    expect(found.report?.findings[0]).toMatchObject({
      topic,
      partition: 0,
      startOffset: '0',
      producerId: hanging.producerId.toString(),
      producerEpoch: hanging.producerEpoch,
      transactionalId: hanging.transactionalId,
      transactionState: 'Empty',
    });
    expect(found.report?.findings[0]?.abort).toBeUndefined();

    const text = await doctor(base);
    expect(text.code).toBe(1);
    const line = text.stdout.split('\n').find((l) => l.startsWith('HANGING'));
    expect(line).toContain(`${topic}[0] start offset 0, producer ${hanging.producerId} epoch ${hanging.producerEpoch}, transactional id ${hanging.transactionalId}`);
    expect(line).toContain('runbook:');

    const aborted = await doctor([...base, '--abort', '--json']);
    expect(aborted.code, aborted.stderr).toBe(0);
    expect(aborted.report?.ok).toBe(true);
    expect(aborted.report?.findings[0]?.abort).toEqual({ ok: true, lastStableBefore: '0', lastStableAfter: '2', highWatermark: '2' });

    const txa = k.txnAdmin();
    expect(offsetsOf(await txa.listOffsets([{ topic, partition: 0 }]), 0)).toMatchObject({ lastStable: 2n, highWatermark: 2n });
    const again = await doctor([...base, '--json']);
    expect(again.code).toBe(0);
    expect(again.report?.findings).toEqual([]);
  });
});
