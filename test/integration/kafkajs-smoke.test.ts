// Proves kafkajs 2.2.4 works against the Kafka 4.x broker that
// src/testing/local-stack.ts runs: admin topic creation, consumer groups with
// eachBatch, idempotent + transactional producers, sendOffsets, and that aborted
// transactions stay invisible to read_committed consumers.
import { randomUUID } from 'node:crypto';
import { afterEach, describe, expect, inject, it } from 'vitest';
import { Kafka, logLevel, Partitioners } from 'kafkajs';
import type { Admin, Consumer, Producer } from 'kafkajs';
import { waitFor } from '../helpers/wait-for.ts';
import { createTopicsWithLeaders } from '../helpers/topics.ts';

const brokers = (inject('kafkaBrokers') || process.env['KAFKA_BROKERS'] || '')
  .split(',')
  .map((b) => b.trim())
  .filter((b) => b !== '');

// kafkajs logs retriable protocol errors (COORDINATOR_LOAD_IN_PROGRESS on the first
// InitProducerId, CONCURRENT_TRANSACTIONS right after a commit) at ERROR level and
// then retries; keep the output quiet unless KAFKAJS_LOG_LEVEL=ERROR|WARN|INFO|DEBUG.
const levelName = (process.env['KAFKAJS_LOG_LEVEL'] ?? 'NOTHING').toUpperCase();
const level = levelName === 'ERROR' || levelName === 'WARN' || levelName === 'INFO' || levelName === 'DEBUG' ? logLevel[levelName] : logLevel.NOTHING;
const kafka = new Kafka({ clientId: 'writ-kafkajs-smoke', brokers, logLevel: level });

function uniqueName(kind: string): string {
  return `smoke.${kind}.${Date.now().toString(36)}.${randomUUID().slice(0, 8)}`;
}

// ---------------------------------------------------------------------------
// cleanup: every client and topic a test creates is released after it

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

async function newAdmin(): Promise<Admin> {
  const admin = kafka.admin();
  await admin.connect();
  cleanups.push(() => admin.disconnect());
  return admin;
}

async function createTopics(admin: Admin, topics: Array<{ topic: string; numPartitions: number }>): Promise<void> {
  const created = await createTopicsWithLeaders(admin, topics);
  expect(created).toBe(true);
  // runs before the admin's own disconnect (cleanups run in reverse) and after the clients that use the topics
  cleanups.push(() => admin.deleteTopics({ topics: topics.map((t) => t.topic) }));
}

async function newProducer(config: Parameters<Kafka['producer']>[0] = {}): Promise<Producer> {
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, ...config });
  await producer.connect();
  cleanups.push(() => producer.disconnect());
  return producer;
}

async function newTransactionalProducer(): Promise<Producer> {
  return newProducer({ transactionalId: uniqueName('txn'), idempotent: true, maxInFlightRequests: 1 });
}

/** A consumer group that collects every value it sees on `topic`, via eachBatch. */
async function collect(topic: string, opts: { readUncommitted: boolean }): Promise<{ consumer: Consumer; seen: string[] }> {
  const consumer = kafka.consumer({ groupId: uniqueName('collector'), readUncommitted: opts.readUncommitted, maxWaitTimeInMs: 100 });
  cleanups.push(() => consumer.disconnect());
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const seen: string[] = [];
  await consumer.run({
    eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
      for (const message of batch.messages) {
        seen.push(message.value?.toString() ?? '<null>');
        resolveOffset(message.offset);
      }
      await heartbeat();
    },
  });
  return { consumer, seen };
}

async function committedOffsets(admin: Admin, groupId: string, topic: string): Promise<Map<number, string>> {
  const result = await admin.fetchOffsets({ groupId, topics: [topic] });
  const partitions = result.find((t) => t.topic === topic)?.partitions ?? [];
  return new Map(partitions.map((p) => [p.partition, p.offset]));
}

function sumOffsets(offsets: Map<number, string>): number {
  let sum = 0;
  for (const offset of offsets.values()) if (Number(offset) > 0) sum += Number(offset);
  return sum;
}

// ---------------------------------------------------------------------------

describe('kafkajs 2.2.4 against the local Kafka 4.x broker', () => {
  it('talks to the broker (ApiVersions, Metadata) and creates topics with admin', async () => {
    expect(brokers.length).toBeGreaterThan(0);
    const admin = await newAdmin();
    const cluster = await admin.describeCluster();
    expect(cluster.brokers.length).toBeGreaterThan(0);
    const topic = uniqueName('admin');
    await createTopics(admin, [{ topic, numPartitions: 3 }]);
    const meta = await admin.fetchTopicMetadata({ topics: [topic] });
    expect(meta.topics[0]?.partitions).toHaveLength(3);
  });

  it('an idempotent producer and an eachBatch consumer group round-trip messages and commit offsets', async () => {
    const admin = await newAdmin();
    const topic = uniqueName('plain');
    await createTopics(admin, [{ topic, numPartitions: 3 }]);
    const producer = await newProducer({ idempotent: true, maxInFlightRequests: 1 });
    const values = Array.from({ length: 30 }, (_, i) => `m${i}`);
    await producer.send({ topic, acks: -1, messages: values.map((value, i) => ({ key: `k${i % 7}`, value })) });

    const groupId = uniqueName('group');
    const consumer = kafka.consumer({ groupId, maxWaitTimeInMs: 500 });
    cleanups.push(() => consumer.disconnect());
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    const seen: string[] = [];
    await consumer.run({
      eachBatchAutoResolve: true,
      eachBatch: async ({ batch, heartbeat, commitOffsetsIfNecessary }) => {
        for (const message of batch.messages) seen.push(message.value?.toString() ?? '');
        await heartbeat();
        await commitOffsetsIfNecessary();
      },
    });

    await waitFor(() => seen.length >= values.length, { timeoutMs: 30_000, message: () => `consumer saw ${seen.length}/${values.length}` });
    expect([...seen].sort()).toEqual([...values].sort());
    await waitFor(async () => sumOffsets(await committedOffsets(admin, groupId, topic)) === values.length, {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: 'group offsets never reached the end of the topic',
    });
    // ListOffsets and DescribeGroups
    const highWatermarks = await admin.fetchTopicOffsets(topic);
    expect(highWatermarks.reduce((sum, p) => sum + Number(p.high), 0)).toBe(values.length);
    const described = await admin.describeGroups([groupId]);
    expect(described.groups[0]?.state).toBe('Stable');
    expect(described.groups[0]?.members).toHaveLength(1);
  });

  it('a transactional producer commits with sendOffsets; an aborted transaction stays invisible to read_committed', async () => {
    const admin = await newAdmin();
    const out = uniqueName('out');
    const input = uniqueName('in');
    await createTopics(admin, [
      { topic: out, numPartitions: 1 },
      { topic: input, numPartitions: 1 },
    ]);
    const producer = await newTransactionalProducer();
    const groupId = uniqueName('txn-group');

    const committed = await producer.transaction();
    await committed.send({ topic: out, messages: [{ value: 'c1' }, { value: 'c2' }, { value: 'c3' }] });
    await committed.sendOffsets({ consumerGroupId: groupId, topics: [{ topic: input, partitions: [{ partition: 0, offset: '5' }] }] });
    await committed.commit();

    const aborted = await producer.transaction();
    await aborted.send({ topic: out, messages: [{ value: 'a1' }, { value: 'a2' }] });
    await aborted.sendOffsets({ consumerGroupId: groupId, topics: [{ topic: input, partitions: [{ partition: 0, offset: '99' }] }] });
    await aborted.abort();

    // a committed marker after the aborted range: once read_committed sees it, it has read past the abort
    const after = await producer.transaction();
    await after.send({ topic: out, messages: [{ value: 'c4' }] });
    await after.commit();

    const readCommitted = await collect(out, { readUncommitted: false });
    const readUncommitted = await collect(out, { readUncommitted: true });
    await waitFor(() => readCommitted.seen.includes('c4'), { timeoutMs: 30_000, message: () => `read_committed saw ${JSON.stringify(readCommitted.seen)}` });
    await waitFor(() => readUncommitted.seen.includes('c4'), { timeoutMs: 30_000, message: () => `read_uncommitted saw ${JSON.stringify(readUncommitted.seen)}` });

    expect(readCommitted.seen).toEqual(['c1', 'c2', 'c3', 'c4']);
    // the aborted records really are in the log; only isolation hides them
    expect(readUncommitted.seen).toEqual(['c1', 'c2', 'c3', 'a1', 'a2', 'c4']);
    // the committed transaction's offsets landed, the aborted one's did not
    expect(await committedOffsets(admin, groupId, input)).toEqual(new Map([[0, '5']]));
  });

  it('consume-transform-produce: eachBatch in a transaction with sendOffsets (the owner loop shape)', async () => {
    const admin = await newAdmin();
    const input = uniqueName('ctp-in');
    const out = uniqueName('ctp-out');
    await createTopics(admin, [
      { topic: input, numPartitions: 3 },
      { topic: out, numPartitions: 1 },
    ]);
    const plain = await newProducer({ idempotent: true, maxInFlightRequests: 1 });
    const count = 20;
    await plain.send({ topic: input, acks: -1, messages: Array.from({ length: count }, (_, i) => ({ key: `e${i % 5}`, value: `v${i}` })) });

    const txProducer = await newTransactionalProducer();
    const groupId = uniqueName('ctp-group');
    const worker = kafka.consumer({ groupId, readUncommitted: false, maxWaitTimeInMs: 500 });
    cleanups.push(() => worker.disconnect());
    await worker.connect();
    await worker.subscribe({ topic: input, fromBeginning: true });
    await worker.run({
      autoCommit: false,
      eachBatch: async ({ batch, heartbeat, resolveOffset }) => {
        if (batch.messages.length === 0) return;
        const txn = await txProducer.transaction();
        try {
          await txn.send({ topic: out, messages: batch.messages.map((m) => ({ value: `T:${m.value?.toString() ?? ''}` })) });
          await txn.sendOffsets({
            consumerGroupId: groupId,
            topics: [{ topic: batch.topic, partitions: [{ partition: batch.partition, offset: (BigInt(batch.lastOffset()) + 1n).toString() }] }],
          });
          await txn.commit();
        } catch (err) {
          await txn.abort().catch(() => {});
          throw err;
        }
        for (const m of batch.messages) resolveOffset(m.offset);
        await heartbeat();
      },
    });

    const verifier = await collect(out, { readUncommitted: false });
    await waitFor(() => verifier.seen.length >= count, { timeoutMs: 45_000, message: () => `output has ${verifier.seen.length}/${count}` });
    expect([...verifier.seen].sort()).toEqual(Array.from({ length: count }, (_, i) => `T:v${i}`).sort());
    await waitFor(async () => sumOffsets(await committedOffsets(admin, groupId, input)) === count, {
      timeoutMs: 30_000,
      intervalMs: 250,
      message: 'transactional offset commits never covered the input',
    });
  });
});
