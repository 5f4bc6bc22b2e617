// node scripts/check-three-brokers.ts — proves the three-node local stack
// (src/testing/local-stack.ts, `ensureStack({ brokers: 3 })`) survives losing a
// partition leader: starts its own stack (ports 21192-21197, registry 21181,
// .cache/run-check3), creates a topic with replication factor 3, produces with
// acks=-1, SIGKILLs the leader of partition 0 — chosen to also host the
// transaction coordinator of a transaction that is open across the kill — shows
// a new leader is elected and idempotent and transactional produce and a
// read_committed consumer group still work with two live nodes (min ISR 2),
// restarts the killed node and waits until it is back in the ISR. Then pauses
// (SIGSTOP) and cleanly stops a node, kills and restarts the registry, and stops
// everything. Prints timings; the last line is them as JSON. Exit 1 on failure.
import { join, resolve } from 'node:path';
import { hideKafkajsTimeoutWarning } from '../src/node-warnings.ts';

hideKafkajsTimeoutWarning();
const root = resolve(import.meta.dirname, '..');
process.env['WRIT_LOCAL_STACK_DIR'] ??= join(root, '.cache', 'run-check3');
// Below the ephemeral port range, as every stack's (src/testing/local-stack.ts's header says why).
process.env['WRIT_LOCAL_KAFKA_PORT'] ??= '21192';
process.env['WRIT_LOCAL_REGISTRY_PORT'] ??= '21181';
if (process.env['KAFKA_BROKERS']) {
  console.error('check-three-brokers starts and kills its own brokers; unset KAFKA_BROKERS');
  process.exit(2);
}

const stackModule = await import('../src/testing/local-stack.ts');
const { ensureStack, stopStack, killBroker, startBroker, stopBroker, pauseBroker, resumeBroker, brokerPids, leaderOf, partitionInfo, killRegistry, startRegistry, LOCAL_REGISTRY_URL } =
  stackModule;
// kafkajs is CommonJS: its enums are only reachable through the default export
const { Kafka, logLevel, ConfigResourceTypes, CompressionTypes } = (await import('kafkajs')).default;
type Producer = import('kafkajs').Producer;

const t0 = Date.now();
const timings: Record<string, number> = {};
const say = (line: string): void => console.log(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(6)} s] ${line}`);
function check(ok: boolean, what: string): void {
  if (!ok) throw new Error(`check failed: ${what}`);
  say(`ok: ${what}`);
}
async function timed<T>(name: string, fn: () => Promise<T>): Promise<T> {
  const start = Date.now();
  const out = await fn();
  timings[name] = Number(((Date.now() - start) / 1000).toFixed(2));
  say(`${name}: ${timings[name]} s`);
  return out;
}
async function until<T>(what: string, fn: () => Promise<T | undefined>, timeoutMs = 60_000): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const v = await fn().catch(() => undefined);
    if (v !== undefined) return v;
    if (Date.now() > deadline) throw new Error(`timed out after ${timeoutMs} ms waiting for ${what}`);
    await new Promise((r) => setTimeout(r, 250));
  }
}
/** Kafka's transaction coordinator partition: Utils.abs(transactionalId.hashCode()) % partitions. */
function txnPartition(transactionalId: string, partitions = 10): number {
  let h = 0;
  for (let i = 0; i < transactionalId.length; i++) h = (Math.imul(h, 31) + transactionalId.charCodeAt(i)) | 0;
  return (h === -2147483648 ? 0 : Math.abs(h)) % partitions;
}

const id = Date.now().toString(36);
const topic = `check3.t${id}`;
let paused: number | undefined;

say(`three-node check ${id}: stack dir ${process.env['WRIT_LOCAL_STACK_DIR']}, ports ${process.env['WRIT_LOCAL_KAFKA_PORT']}+`);
await stopStack({ log: (l) => say(`  [stack] leftover: ${l}`) }); // this dir is the script's own: always measure a fresh start
const stack = await timed('ensureStack({ brokers: 3 }) (3 brokers + registry)', () => ensureStack({ brokers: 3, log: (l) => say(`  [stack] ${l}`) }));
const brokers = stack.endpoints.brokers;
const kafka = new Kafka({
  clientId: 'check-three-brokers',
  brokers,
  logLevel: logLevel.NOTHING,
  connectionTimeout: 2000,
  requestTimeout: 10_000,
  retry: { retries: 10, initialRetryTime: 200, maxRetryTime: 5000 },
});
const admin = kafka.admin();
const producers: Producer[] = [];
let failed = false;
try {
  say(`KAFKA_BROKERS=${brokers.join(',')} pids ${JSON.stringify(brokerPids())}`);
  check(brokers.length === 3, 'ensureStack returned three brokers');
  await admin.connect();
  const cluster = await admin.describeCluster();
  check(cluster.brokers.length === 3 && cluster.controller !== null, `describeCluster: brokers ${cluster.brokers.map((b) => b.nodeId).join(',')}, controller ${cluster.controller}`);

  await admin.createTopics({ topics: [{ topic, numPartitions: 3, replicationFactor: 3 }], waitForLeaders: true });
  const topicConfig = await admin.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: topic, configNames: ['min.insync.replicas'] }],
    includeSynonyms: false,
  });
  const minIsr = topicConfig.resources[0]?.configEntries.find((e) => e.configName === 'min.insync.replicas')?.configValue;
  check(minIsr === '2', `topic ${topic}: min.insync.replicas ${minIsr} (cluster default)`);
  const before = await partitionInfo(brokers, topic, 0);
  check(before.replicas.length === 3 && before.isr.length === 3, `partition 0: leader ${before.leader}, replicas ${before.replicas}, isr ${before.isr}`);

  // acks=-1, idempotent
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1, allowAutoTopicCreation: false });
  producers.push(producer);
  await producer.connect();
  const send = (p: Producer, prefix: string, n: number) =>
    p.send({ topic, acks: -1, compression: CompressionTypes.None, messages: Array.from({ length: n }, (_, i) => ({ partition: 0, value: `${prefix}-${i}` })) });
  await timed('produce 100 (acks=-1, 3 live nodes)', () => send(producer, 'pre', 100));

  // a transaction that creates __transaction_state, then one whose coordinator sits on the leader we kill
  const warm = kafka.producer({ transactionalId: `check3.warm.${id}`, idempotent: true, maxInFlightRequests: 1 });
  producers.push(warm);
  await warm.connect();
  const tw = await warm.transaction();
  await tw.send({ topic, acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: `tx-before-${i}` })) });
  await tw.commit();
  const victim = before.leader;
  const coordinators = await Promise.all(Array.from({ length: 10 }, (_, p) => leaderOf(brokers, '__transaction_state', p)));
  let txId = '';
  for (let k = 0; k < 1000 && txId === ''; k++) {
    const candidate = `check3.tx.${id}.${k}`;
    if (coordinators[txnPartition(candidate)] === victim) txId = candidate;
  }
  check(txId !== '', `transactional id ${txId} has its coordinator (__transaction_state-${txnPartition(txId)}) on node ${victim}, the leader of ${topic}-0`);
  const txProducer = kafka.producer({ transactionalId: txId, idempotent: true, maxInFlightRequests: 1 });
  producers.push(txProducer);
  await txProducer.connect();
  const open = await txProducer.transaction();
  await open.send({ topic, acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: `tx-span-a-${i}` })) });
  say('transaction open with 10 records sent; killing the leader now');

  // SIGKILL the leader of partition 0
  const killedPid = await timed(`killBroker(${victim}) (SIGKILL)`, () => killBroker(victim));
  say(`killed node ${victim} (pid ${killedPid}); pids ${JSON.stringify(brokerPids())}`);
  const elected = await timed('new leader of partition 0 elected', () =>
    until('a new leader', async () => {
      const p = await partitionInfo(brokers, topic, 0);
      return p.leader >= 0 && p.leader !== victim ? p : undefined;
    }),
  );
  check(elected.leader !== victim && !elected.isr.includes(victim) && elected.isr.length === 2, `partition 0: leader ${elected.leader}, isr ${elected.isr} (node ${victim} out)`);

  await timed('produce 100 (acks=-1, 2 live nodes, same idempotent producer)', () => send(producer, 'post', 100));
  await timed('transaction open across the kill: send 10 more + commit', async () => {
    await open.send({ topic, acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: `tx-span-b-${i}` })) });
    await open.commit();
  });
  await timed('new transaction after the kill: send 10 + commit', async () => {
    const t = await txProducer.transaction();
    await t.send({ topic, acks: -1, messages: Array.from({ length: 10 }, (_, i) => ({ partition: 0, value: `tx-after-${i}` })) });
    await t.commit();
  });
  // an aborted transaction must stay invisible to read_committed
  const aborted = await txProducer.transaction();
  await aborted.send({ topic, acks: -1, messages: [{ partition: 0, value: 'tx-aborted-0' }] });
  await aborted.abort();

  // read_committed consumer group, offsets committed to __consumer_offsets (RF 3) with one node down
  const expected = new Set<string>();
  for (const [prefix, n] of [['pre', 100], ['tx-before', 10], ['tx-span-a', 10], ['tx-span-b', 10], ['post', 100], ['tx-after', 10]] as const) {
    for (let i = 0; i < n; i++) expected.add(`${prefix}-${i}`);
  }
  const groupId = `check3.g${id}`;
  const seen: string[] = [];
  const consumer = kafka.consumer({ groupId, readUncommitted: false, sessionTimeout: 10_000, heartbeatInterval: 1000, maxWaitTimeInMs: 500 });
  await timed(`consume partition 0 (read_committed, group ${groupId})`, async () => {
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ partition, message }) => {
        if (partition === 0) seen.push(message.value?.toString() ?? '');
      },
    });
    await until('all committed records', async () => (seen.length >= expected.size ? true : undefined), 60_000);
    await new Promise((r) => setTimeout(r, 1000)); // anything extra (aborted, duplicates) would show up now
    await consumer.stop();
    await consumer.disconnect();
  });
  const dupes = seen.length - new Set(seen).size;
  check(
    seen.length === expected.size && dupes === 0 && seen.every((v) => expected.has(v)),
    `consumed ${seen.length} records on partition 0: exactly the ${expected.size} produced and committed, no duplicates, nothing aborted`,
  );
  const offsets = await admin.fetchOffsets({ groupId, topics: [topic] });
  const committed = offsets[0]?.partitions.find((p) => p.partition === 0)?.offset;
  check(committed !== undefined && Number(committed) > 0, `group offset committed for partition 0: ${committed}`);
  for (const internal of ['__consumer_offsets', '__transaction_state']) {
    const p = await partitionInfo(brokers, internal, 0);
    check(p.replicas.length === 3, `${internal}-0: replicas ${p.replicas}, isr ${p.isr}`);
  }
  const txnConfig = await admin.describeConfigs({
    resources: [{ type: ConfigResourceTypes.TOPIC, name: '__transaction_state', configNames: ['min.insync.replicas'] }],
    includeSynonyms: false,
  });
  const txnMinIsr = txnConfig.resources[0]?.configEntries.find((e) => e.configName === 'min.insync.replicas')?.configValue;
  check(txnMinIsr === '2', `__transaction_state min.insync.replicas ${txnMinIsr}`);

  // restart the killed node on its data dir, wait until it is back in every ISR of the topic
  await timed(`startBroker({ nodeId: ${victim} }) until it is a live broker`, () => startBroker({ nodeId: victim, log: (l) => say(`  [stack] ${l}`) }));
  await timed(`node ${victim} back in the ISR of all 3 partitions`, () =>
    until('the restarted node in the ISR', async () => {
      const all = await Promise.all([0, 1, 2].map((p) => partitionInfo(brokers, topic, p)));
      return all.every((p) => p.isr.length === 3) ? true : undefined;
    }),
  );
  const after = await partitionInfo(brokers, topic, 0);
  check(after.isr.includes(victim) && after.isr.length === 3, `partition 0: leader ${after.leader}, isr ${after.isr}; pids ${JSON.stringify(brokerPids())}`);

  // replication factor 1 under a cluster default of min.insync.replicas 2: Kafka bounds the effective
  // min ISR by the replica count, so acks=-1 is accepted (and the topic is simply not replicated)
  const rf1 = `check3.rf1.${id}`;
  await admin.createTopics({ topics: [{ topic: rf1, numPartitions: 1, replicationFactor: 1 }], waitForLeaders: true });
  const plain = kafka.producer({ allowAutoTopicCreation: false, retry: { retries: 1, initialRetryTime: 100 } });
  producers.push(plain);
  await plain.connect();
  const rf1Result = await plain.send({ topic: rf1, acks: -1, messages: [{ value: 'x' }] }).then(
    () => 'accepted',
    (err: unknown) => {
      const e = err as { type?: string; originalError?: { type?: string }; message?: string };
      return e.originalError?.type ?? e.type ?? String(e.message);
    },
  );
  check(rf1Result === 'accepted', `a replication-factor-1 topic accepts acks=-1 under min.insync.replicas 2 (effective min ISR = replica count): ${rf1Result}`);

  // SIGSTOP a follower: fenced and dropped from the ISR; acks=-1 still works; SIGCONT brings it back
  const lead = await leaderOf(brokers, topic, 0);
  const follower = [1, 2, 3].find((n) => n !== lead)!;
  paused = pauseBroker(follower);
  say(`paused node ${follower} (pid ${paused}), leader of partition 0 is ${lead}`);
  await timed(`paused node ${follower} dropped from the ISR`, () =>
    until('the paused node out of the ISR', async () => {
      const p = await partitionInfo(brokers, topic, 0);
      return !p.isr.includes(follower) ? true : undefined;
    }),
  );
  await timed('produce 20 (acks=-1) while a node is paused', () => send(producer, 'paused', 20));
  resumeBroker(follower);
  paused = undefined;
  await timed(`resumed node ${follower} back in the ISR`, () =>
    until('the resumed node in the ISR', async () => {
      const p = await partitionInfo(brokers, topic, 0);
      return p.isr.length === 3 ? true : undefined;
    }),
  );

  // SIGTERM (controlled shutdown) of the current leader; restart it
  const leader2 = await leaderOf(brokers, topic, 0);
  await timed(`stopBroker(${leader2}) (SIGTERM, controlled shutdown)`, () => stopBroker(leader2));
  const moved = await partitionInfo(brokers, topic, 0);
  check(moved.leader !== leader2 && moved.leader >= 0, `partition 0 led by ${moved.leader} after the clean stop of ${leader2}`);
  await timed('produce 20 (acks=-1) after a clean stop', () => send(producer, 'stopped', 20));
  await timed(`startBroker({ nodeId: ${leader2} }) after a clean stop`, () => startBroker({ nodeId: leader2 }));

  // registry: SIGKILL and start again on the same port (in-memory storage: empty afterwards)
  const registryPid = await killRegistry();
  say(`killed registry (pid ${registryPid})`);
  await timed('startRegistry() after killRegistry()', () => startRegistry({ log: (l) => say(`  [stack] ${l}`) }));
  const subjects = await fetch(`${LOCAL_REGISTRY_URL}/subjects`).then((r) => r.json());
  check(Array.isArray(subjects), `registry serves ${LOCAL_REGISTRY_URL}/subjects again: ${JSON.stringify(subjects)}`);
} catch (err) {
  failed = true;
  say(`FAILED: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
} finally {
  if (paused !== undefined) process.kill(paused, 'SIGCONT');
  for (const p of producers) await p.disconnect().catch(() => undefined);
  await admin.disconnect().catch(() => undefined);
  await timed('stop (3 brokers + registry)', () => stack.stop());
  const left = Object.values(brokerPids()).filter((p) => p !== undefined);
  if (left.length > 0) {
    failed = true;
    say(`FAILED: broker pids still running after stop: ${left.join(', ')}`);
  }
}
timings['total'] = Number(((Date.now() - t0) / 1000).toFixed(2));
say(failed ? 'three-node check FAILED' : 'three-node check passed');
console.log(JSON.stringify({ ok: !failed, timings }));
process.exit(failed ? 1 : 0);
