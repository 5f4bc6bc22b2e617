// Kafka's four compression codecs in kafkajs (src/kafka/compression.ts):
// - the codecs themselves, their size bounds and corrupt-input handling (no broker);
// - a foreign producer (the Kafka distribution's Java console producer) writes
//   gzip/snappy/lz4/zstd batches and a kafkajs consumer reads them;
// - kafkajs writes each codec it can and Java's console consumer reads it;
// - the ablation control: plain kafkajs (a child process, so this file's
//   registration is out of the picture) fails on an lz4 batch.
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { promisify } from 'node:util';
import zlib from 'node:zlib';
import { afterAll, afterEach, beforeAll, describe, expect, inject, it } from 'vitest';
import kafkajs, { CompressionTypes, Kafka, logLevel, Partitioners } from 'kafkajs';
import type { Admin, Consumer, KafkaMessage, Producer } from 'kafkajs';
import { consoleConsume, consoleProduce, type ConsoleCompression, type ConsoleRecord } from '../../scripts/kafka-cli.ts';
import {
  createGzipCodec,
  createLz4Codec,
  createSnappyCodec,
  createZstdCodec,
  DEFAULT_MAX_DECOMPRESSED_BYTES,
  KafkaCompressionError,
  registerCompressionCodecs,
  scanLz4Frame,
  xxhash32,
  zstdCompressionAvailable,
  type KafkaCodec,
} from '../../src/kafka/compression.ts';
import { unreadableBatchOf } from '../../src/kafka/unreadable-batches.ts';
import { waitFor } from '../helpers/wait-for.ts';

const brokers = (inject('kafkaBrokers') || process.env['KAFKA_BROKERS'] || '')
  .split(',')
  .map((b) => b.trim())
  .filter((b) => b !== '');

const levelName = (process.env['KAFKAJS_LOG_LEVEL'] ?? 'NOTHING').toUpperCase();
const level = levelName === 'ERROR' || levelName === 'WARN' || levelName === 'INFO' || levelName === 'DEBUG' ? logLevel[levelName] : logLevel.NOTHING;
const kafka = new Kafka({ clientId: 'writ-compression-test', brokers, logLevel: level });

type CodecTable = Record<number, (() => KafkaCodec) | undefined>;
const codecTable = kafkajs.CompressionCodecs as unknown as CodecTable;

const CODECS = ['gzip', 'snappy', 'lz4', 'zstd'] as const;
type Codec = (typeof CODECS)[number];
const TYPE: Record<Codec, CompressionTypes> = {
  gzip: CompressionTypes.GZIP,
  snappy: CompressionTypes.Snappy,
  lz4: CompressionTypes.LZ4,
  zstd: CompressionTypes.ZSTD,
};
const MiB = 1024 * 1024;

function uniqueName(kind: string): string {
  return `compression.${kind}.${Date.now().toString(36)}.${randomUUID().slice(0, 8)}`;
}

const cleanups: Array<() => Promise<unknown>> = [];
afterEach(async () => {
  for (const cleanup of cleanups.splice(0).reverse()) await cleanup().catch(() => {});
});

let admin: Admin;
beforeAll(async () => {
  registerCompressionCodecs();
  admin = kafka.admin();
  await admin.connect();
});
afterAll(async () => {
  await admin?.disconnect();
});

async function createTopic(numPartitions = 1): Promise<string> {
  const topic = uniqueName('topic');
  // not waitForLeaders: kafkajs retries only LEADER_NOT_AVAILABLE there, and a metadata request that reaches the
  // broker before it has applied the new topic answers UNKNOWN_TOPIC_OR_PARTITION, which fails the call
  expect(await admin.createTopics({ topics: [{ topic, numPartitions }], waitForLeaders: false })).toBe(true);
  cleanups.push(() => admin.deleteTopics({ topics: [topic] }));
  await waitFor(
    async () => {
      const partitions = (await admin.fetchTopicMetadata({ topics: [topic] })).topics[0]?.partitions ?? [];
      return partitions.length === numPartitions && partitions.every((p) => p.leader >= 0);
    },
    { timeoutMs: 30_000, intervalMs: 200, message: `topic ${topic} never got leaders for ${numPartitions} partitions` },
  );
  return topic;
}

async function newProducer(): Promise<Producer> {
  const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner, idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  cleanups.push(() => producer.disconnect());
  return producer;
}

interface Seen {
  partition: number;
  key: string | null;
  value: string | null;
  headers: KafkaMessage['headers'];
}

/** A kafkajs consumer group on `topic` from the beginning; collects what it sees and the error it stopped on, if it did. */
async function collect(topic: string): Promise<{ consumer: Consumer; seen: Seen[]; crash: { error?: Error } }> {
  const consumer = kafka.consumer({ groupId: uniqueName('group'), maxWaitTimeInMs: 100, retry: { retries: 2 } });
  cleanups.push(() => consumer.disconnect());
  const seen: Seen[] = [];
  const crash: { error?: Error } = {};
  consumer.on(consumer.events.CRASH, (event) => {
    // `restart: true` is kafkajs rejoining after a retriable error, such as GROUP_LOAD_IN_PROGRESS from a broker
    // started seconds ago (its group coordinator still loading); only `restart: false` stops the consumer.
    if (!event.payload.restart) crash.error = event.payload.error;
  });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ partition, message }: { partition: number; message: KafkaMessage }) => {
      seen.push({ partition, key: message.key?.toString('utf8') ?? null, value: message.value?.toString('utf8') ?? null, headers: message.headers });
    },
  });
  return { consumer, seen, crash };
}

/** Counts decompress/compress calls through kafkajs's table entry for `type` (restored after the test). */
function spyOnCodec(type: number): { decompressed: () => number; compressed: () => number } {
  const original = codecTable[type];
  if (original === undefined) throw new Error(`no codec registered for type ${type}`);
  let decompressed = 0;
  let compressed = 0;
  codecTable[type] = () => {
    const codec = original();
    return {
      compress: async (encoder) => {
        compressed++;
        return codec.compress(encoder);
      },
      decompress: async (buffer) => {
        decompressed++;
        return codec.decompress(buffer);
      },
    };
  };
  cleanups.push(async () => {
    codecTable[type] = original;
  });
  return { decompressed: () => decompressed, compressed: () => compressed };
}

/** Foreign records: keyed, one without a key, non-ASCII, empty, and one long enough to be worth compressing. */
function foreignRecords(codec: string): ConsoleRecord[] {
  return [
    { key: 'k1', value: `${codec} one` },
    { key: 'k2', value: `${codec} `.repeat(2000) },
    { key: null, value: `${codec} without a key` },
    { key: 'k3', value: `${codec} ünïcödé ✓ \t tab` },
    { key: 'k4', value: '' },
  ];
}

function expectLimit(err: unknown, codec: string): void {
  expect(err).toBeInstanceOf(KafkaCompressionError);
  const e = err as KafkaCompressionError;
  expect(e.reason).toBe('limit_exceeded');
  expect(e.codec).toBe(codec);
  expect(e.retriable).toBe(false);
}

async function rejection(promise: Promise<unknown>): Promise<unknown> {
  try {
    await promise;
  } catch (err) {
    return err;
  }
  throw new Error('expected a rejection');
}

/** A valid zstd frame of `blocks` RLE blocks of 128 KiB of 'z' each (no content size): a bomb any zstd can read, hand-made so it exists without a zstd encoder. */
function zstdRleFrame(blocks: number): Buffer {
  const parts = [Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0x00, 7 << 3])]; // magic; FHD: no FCS, no single segment; window 2^17
  for (let i = 0; i < blocks; i++) {
    const header = ((128 * 1024) << 3) | (1 << 1) | (i === blocks - 1 ? 1 : 0); // size, RLE, last
    parts.push(Buffer.from([header & 0xff, (header >> 8) & 0xff, (header >> 16) & 0xff, 0x7a]));
  }
  return Buffer.concat(parts);
}

// ---------------------------------------------------------------------------

describe('compression codecs (no broker)', () => {
  const data = Buffer.from(Array.from({ length: 30_000 }, (_, i) => `record-${i % 113};`).join(''));
  const codecs: Record<Codec, () => KafkaCodec> = {
    gzip: () => createGzipCodec(),
    snappy: () => createSnappyCodec(),
    lz4: () => createLz4Codec(),
    zstd: () => createZstdCodec(),
  };

  it('xxhash32 matches the reference vectors', () => {
    expect(xxhash32(Buffer.from(''))).toBe(0x02cc5d05);
    expect(xxhash32(Buffer.from('a'))).toBe(0x550d7456);
    expect(xxhash32(Buffer.from('abc'))).toBe(0x32d153ff);
    expect(xxhash32(Buffer.from('Nobody inspects the spammish repetition'))).toBe(0xe2293b2f);
  });

  it.for(CODECS)('%s round-trips', async (name, { skip }) => {
    if (name === 'zstd' && !zstdCompressionAvailable()) skip('this Node has no zstd encoder (node:zlib zstd needs >= 22.15); reading is covered below');
    const codec = codecs[name]();
    const compressed = await codec.compress({ buffer: data });
    expect(compressed.length).toBeLessThan(data.length);
    expect((await codec.decompress(compressed)).equals(data)).toBe(true);
  });

  it('writes what Kafka\'s Java producer writes: xerial-framed snappy, LZ4 frames of independent 64 KiB blocks', async () => {
    const snappy = await createSnappyCodec().compress({ buffer: data });
    expect(snappy.subarray(0, 16).toString('hex')).toBe('82534e415050590000000001' + '00000001');
    const lz4 = await createLz4Codec().compress({ buffer: data });
    // magic, FLG 0x60 (v1, block independence), BD 0x40 (64 KiB), HC 0x82: byte for byte Lz4BlockOutputStream's header
    expect(lz4.subarray(0, 7).toString('hex')).toBe('04224d18604082');
    const scan = scanLz4Frame(lz4, DEFAULT_MAX_DECOMPRESSED_BYTES);
    expect(scan).toMatchObject({ headerChecksum: 'standard', blockMaxSize: 64 * 1024, blockIndependent: true, frameEnd: lz4.length });
    // incompressible input is stored, not expanded
    const noise = Buffer.from(Array.from({ length: 70_000 }, (_, i) => (i * 2654435761) >>> 24));
    const stored = await createLz4Codec().compress({ buffer: noise });
    expect((await createLz4Codec().decompress(stored)).equals(noise)).toBe(true);
  });

  it('zstd reads with node:zlib and with the pure-JS fallback, frame by frame', async () => {
    const frame = zstdRleFrame(3);
    const expected = Buffer.alloc(3 * 128 * 1024, 'z');
    for (const implementation of ['auto', 'fzstd'] as const) {
      const codec = createZstdCodec({ implementation });
      expect((await codec.decompress(frame)).equals(expected)).toBe(true);
      // two frames back to back (libzstd's one-shot API would silently stop after the first)
      expect((await codec.decompress(Buffer.concat([frame, frame]))).equals(Buffer.concat([expected, expected]))).toBe(true);
    }
    if (zstdCompressionAvailable()) {
      const compressed = await createZstdCodec().compress({ buffer: data });
      expect((await createZstdCodec({ implementation: 'fzstd' }).decompress(compressed)).equals(data)).toBe(true);
    }
  });

  it('refuses a batch that would decompress beyond maxDecompressedBytes', async () => {
    const limit = { maxDecompressedBytes: MiB };
    const zeros = { buffer: Buffer.alloc(2 * MiB) };
    expectLimit(await rejection(createGzipCodec(limit).decompress(zlib.gzipSync(zeros.buffer))), 'gzip');
    expectLimit(await rejection(createSnappyCodec(limit).decompress(await createSnappyCodec().compress(zeros))), 'snappy');
    expectLimit(await rejection(createLz4Codec(limit).decompress(await createLz4Codec().compress(zeros))), 'lz4');
    const bomb = zstdRleFrame(16); // 2 MiB
    expectLimit(await rejection(createZstdCodec(limit).decompress(bomb)), 'zstd');
    expectLimit(await rejection(createZstdCodec({ ...limit, implementation: 'fzstd' }).decompress(bomb)), 'zstd');
    // and the default limit is there without options
    expect(registerCompressionCodecs().maxDecompressedBytes).toBe(64 * MiB);
  });

  it('refuses declared sizes over the limit before inflating anything', async () => {
    // raw snappy whose length preamble says 4 GiB - 1
    expectLimit(await rejection(createSnappyCodec().decompress(Buffer.from([0xff, 0xff, 0xff, 0xff, 0x0f, 0x00]))), 'snappy');
    // an LZ4 frame declaring a 1 TiB content size
    const lz4Header = Buffer.from([0x04, 0x22, 0x4d, 0x18, 0x68, 0x40, 0, 0, 0, 0, 0, 1, 0, 0, 0]);
    lz4Header[14] = (xxhash32(lz4Header.subarray(4, 14)) >>> 8) & 0xff;
    expectLimit(await rejection(createLz4Codec().decompress(Buffer.concat([lz4Header, Buffer.alloc(4)]))), 'lz4');
    // a zstd frame declaring a 1 TiB content size (fcs flag 3: 8 bytes)
    const zstd = Buffer.concat([Buffer.from([0x28, 0xb5, 0x2f, 0xfd, 0xc0, 7 << 3, 0, 0, 0, 0, 0, 1, 0, 0]), Buffer.from([0x01 | (1 << 1) | (1 << 3), 0, 0, 0x7a])]);
    expectLimit(await rejection(createZstdCodec().decompress(zstd)), 'zstd');
    expectLimit(await rejection(createZstdCodec({ implementation: 'fzstd' }).decompress(zstd)), 'zstd');
  });

  it('turns corrupt input into a non-retriable corrupt error (and does not hang)', async () => {
    // a 7-byte snappy block with a negative literal length: snappyjs (under kafkajs-snappy) loops on it forever
    const inputs = [Buffer.from([0x10, 0xfc, 0xfa, 0xff, 0xff, 0xff, 0x00]), Buffer.from('definitely not compressed')];
    for (const name of CODECS) {
      for (const input of inputs) {
        const err = await rejection(codecs[name]().decompress(input));
        expect(err).toBeInstanceOf(KafkaCompressionError);
        expect(err).toMatchObject({ reason: 'corrupt', codec: name, retriable: false });
      }
    }
    // a truncated LZ4 frame
    const lz4 = await createLz4Codec().compress({ buffer: data });
    expect(await rejection(createLz4Codec().decompress(lz4.subarray(0, lz4.length - 10)))).toMatchObject({ reason: 'corrupt' });
  });

  it('accepts the LZ4 header checksum of KAFKA-3160 (message format v0), still rejects a wrong one', async () => {
    const frame = await createLz4Codec().compress({ buffer: Buffer.from('written by a Kafka 0.8 client') });
    const legacy = Buffer.from(frame);
    legacy[6] = (xxhash32(legacy.subarray(0, 6)) >>> 8) & 0xff; // the old bug: the magic bytes hashed too
    expect(legacy[6]).not.toBe(frame[6]);
    expect(scanLz4Frame(legacy, MiB).headerChecksum).toBe('kafka-legacy');
    expect((await createLz4Codec().decompress(legacy)).toString()).toBe('written by a Kafka 0.8 client');
    const wrong = Buffer.from(frame);
    wrong[6] = (frame[6]! ^ 0x5a) === legacy[6] ? frame[6]! ^ 0x33 : frame[6]! ^ 0x5a;
    expect(await rejection(createLz4Codec().decompress(wrong))).toMatchObject({ reason: 'corrupt' });
  });

  it('registerCompressionCodecs is idempotent and repairs a replaced entry', () => {
    const first = registerCompressionCodecs();
    const entries = [CompressionTypes.GZIP, CompressionTypes.Snappy, CompressionTypes.LZ4, CompressionTypes.ZSTD].map((t) => codecTable[t]);
    expect(registerCompressionCodecs()).toBe(first);
    expect([CompressionTypes.GZIP, CompressionTypes.Snappy, CompressionTypes.LZ4, CompressionTypes.ZSTD].map((t) => codecTable[t])).toEqual(entries);
    expect(first.unavailable).toEqual({});
    const lz4 = codecTable[CompressionTypes.LZ4];
    codecTable[CompressionTypes.LZ4] = () => {
      throw new Error('replaced');
    };
    registerCompressionCodecs();
    expect(codecTable[CompressionTypes.LZ4]).toBe(lz4);
  });
});

// ---------------------------------------------------------------------------

describe('a foreign producer (Kafka\'s Java console producer) and kafkajs', () => {
  it.each(CODECS)('kafkajs reads a %s batch the Java producer wrote', async (codec) => {
    const topic = await createTopic(1);
    const records = foreignRecords(codec);
    await consoleProduce({ brokers, topic, records, compression: codec as ConsoleCompression });
    const spy = spyOnCodec(TYPE[codec]);
    const { seen, crash } = await collect(topic);
    await waitFor(() => seen.length >= records.length || crash.error, {
      timeoutMs: 30_000,
      message: () => `kafkajs saw ${seen.length}/${records.length}`,
    });
    expect(crash.error).toBeUndefined();
    expect(seen.map(({ key, value }) => ({ key, value }))).toEqual(records.map(({ key, value }) => ({ key, value: value.toString() })));
    expect(spy.decompressed()).toBeGreaterThan(0); // the batch really was compressed with this codec
  });

  it('the Java producer can pin records to partitions; kafkajs sees them there', async () => {
    const topic = await createTopic(3);
    const records: ConsoleRecord[] = [
      { key: 'a', value: 'to p2', partition: 2 },
      { key: 'b', value: 'to p0', partition: 0 },
      { key: 'c', value: 'also p2', partition: 2 },
    ];
    await consoleProduce({ brokers, topic, records, compression: 'lz4' });
    const { seen } = await collect(topic);
    await waitFor(() => seen.length >= records.length, { timeoutMs: 30_000, message: () => `kafkajs saw ${seen.length}/3` });
    expect(seen.filter((s) => s.partition === 2).map((s) => s.value)).toEqual(['to p2', 'also p2']);
    expect(seen.filter((s) => s.partition === 0).map((s) => s.value)).toEqual(['to p0']);
  });

  it.for(CODECS)('Java\'s console consumer reads a %s batch kafkajs wrote', async (codec, { skip }) => {
    if (codec === 'zstd' && !zstdCompressionAvailable()) skip('this Node has no zstd encoder (node:zlib zstd needs >= 22.15)');
    const topic = await createTopic(1);
    const producer = await newProducer();
    const spy = spyOnCodec(TYPE[codec]);
    const messages = foreignRecords(codec).map(({ key, value }) => ({ key, value: value.toString() }));
    await producer.send({ topic, acks: -1, compression: TYPE[codec], messages });
    expect(spy.compressed()).toBe(1);
    const read = await consoleConsume({ brokers, topic, partition: 0, maxMessages: messages.length });
    expect(read.map((r) => ({ key: r.key?.toString('utf8') ?? null, value: r.value?.toString('utf8') ?? null }))).toEqual(messages);
  });

  it('a batch over the limit is one stand-in record: the consumer moves on to the next batch', async () => {
    const topic = await createTopic(1);
    // ~1.5 MiB of text compresses to a few KiB; the limit below is 1 MiB
    await consoleProduce({
      brokers,
      topic,
      records: [{ key: 'big', value: 'a'.repeat(1.5 * MiB) }],
      compression: 'lz4',
      extraProducerProps: { 'max.request.size': 4 * MiB },
    });
    await consoleProduce({ brokers, topic, records: [{ key: 'after', value: 'the next batch' }], compression: 'lz4' });
    registerCompressionCodecs({ maxDecompressedBytes: MiB });
    cleanups.push(async () => registerCompressionCodecs());
    const { seen, crash } = await collect(topic);
    await waitFor(() => seen.length >= 2 || crash.error, { timeoutMs: 30_000, message: 'the consumer saw neither record' });
    expect(crash.error).toBeUndefined();
    expect(seen.map((s) => ({ key: s.key, value: s.value }))).toEqual([
      { key: null, value: null },
      { key: 'after', value: 'the next batch' },
    ]);
    const standIn = unreadableBatchOf(seen[0]!.headers);
    expect(standIn).toMatchObject({ firstOffset: '0', lastOffset: '0' });
    expect(standIn!.reason).toMatch(/^KafkaCompressionError: lz4: refusing to decompress: .*maxDecompressedBytes=1048576$/);
  });

  it('batches each within the limit but more than it in one Fetch reach the consumer over several Fetches, none lost', async () => {
    const topic = await createTopic(1);
    const producer = await newProducer();
    // Six gzip batches of about 700 bytes each inflating to 600 KB (60 % of the 1 MiB limit below), then a small one.
    for (let i = 0; i < 6; i++) {
      await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages: [{ key: `big${i}`, value: Buffer.alloc(600_000) }] });
    }
    await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages: [{ key: 'after', value: 'the last batch' }] });
    registerCompressionCodecs({ maxDecompressedBytes: MiB });
    cleanups.push(async () => registerCompressionCodecs());
    const consumer = kafka.consumer({ groupId: uniqueName('group'), maxWaitTimeInMs: 500 });
    cleanups.push(() => consumer.disconnect());
    const keys: string[] = [];
    const heldPerFetch: number[] = [];
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachBatch: async ({ batch }) => {
        heldPerFetch.push(batch.messages.reduce((n, m) => n + (m.value?.length ?? 0), 0));
        for (const m of batch.messages) keys.push(m.key?.toString('utf8') ?? '');
      },
    });
    await waitFor(() => keys.includes('after'), { timeoutMs: 30_000, message: () => `the consumer saw ${keys.join(',')}` });
    expect(keys).toEqual(['big0', 'big1', 'big2', 'big3', 'big4', 'big5', 'after']);
    // All seven were on the topic before the first Fetch, which would otherwise hold all 3.6 MB at once.
    expect(Math.max(...heldPerFetch)).toBeLessThanOrEqual(2 * MiB);
  });

  it('first batches of many partitions past twice the limit wait for later Fetches: a real consumer still gets every record once, in order', async () => {
    const partitions = 6;
    const topic = await createTopic(partitions);
    const producer = await newProducer();
    // Per partition three gzip batches inflating to 700 KB (70 % of the 1 MiB limit below): one Fetch holds every
    // partition's first batch, 4.2 MB, past twice the limit, so some first batches wait for later Fetches.
    // (Checked: 11 first batches left for a later Fetch in one run.)
    const expected: string[][] = [];
    for (let p = 0; p < partitions; p++) {
      expected.push([]);
      for (let i = 0; i < 3; i++) {
        const key = `p${p}-${i}`;
        expected[p]!.push(key);
        await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages: [{ key, value: Buffer.alloc(700_000), partition: p }] });
      }
    }
    registerCompressionCodecs({ maxDecompressedBytes: MiB });
    cleanups.push(async () => registerCompressionCodecs());
    const consumer = kafka.consumer({ groupId: uniqueName('group'), maxWaitTimeInMs: 500 });
    cleanups.push(() => consumer.disconnect());
    const seen: string[][] = Array.from({ length: partitions }, () => []);
    await consumer.connect();
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachBatch: async ({ batch }) => {
        for (const m of batch.messages) seen[batch.partition]!.push(m.key?.toString('utf8') ?? '');
      },
    });
    await waitFor(() => seen.every((s, p) => s.length >= expected[p]!.length), {
      timeoutMs: 60_000,
      message: () => `the consumer saw ${JSON.stringify(seen)}`,
    });
    expect(seen).toEqual(expected);
  });

  it('ablation: the same codecs without the batch guard crash the kafkajs consumer for good', async () => {
    const topic = await createTopic(1);
    await consoleProduce({ brokers, topic, records: [{ key: 'big', value: 'a'.repeat(1.5 * MiB) }], compression: 'lz4', extraProducerProps: { 'max.request.size': 4 * MiB } });
    // A child process: this one's kafkajs has the guard installed. The codec alone, as registerCompressionCodecs installs it.
    const child = `
import kafkajs from 'kafkajs';
import { createLz4Codec } from ${JSON.stringify(new URL('../../src/kafka/compression.ts', import.meta.url).href)};
const [brokers, topic] = process.argv.slice(1);
const codec = createLz4Codec({ maxDecompressedBytes: ${MiB} });
kafkajs.CompressionCodecs[kafkajs.CompressionTypes.LZ4] = () => codec;
const kafka = new kafkajs.Kafka({ clientId: 'writ-ablation', brokers: brokers.split(','), logLevel: kafkajs.logLevel.NOTHING });
const consumer = kafka.consumer({ groupId: 'writ-ablation-' + Date.now(), maxWaitTimeInMs: 500 });
const report = (r) => { process.stdout.write(JSON.stringify(r) + '\\n'); process.exit(0); };
setTimeout(() => report({ outcome: 'timeout' }), 40000).unref();
// a retriable crash (a join the coordinator is not ready for) is followed by kafkajs's own restart: not the outcome
consumer.on(consumer.events.CRASH, (e) => { if (!e.payload.restart) report({ outcome: 'crash', restart: e.payload.restart, name: e.payload.error.name, message: e.payload.error.message }); });
await consumer.connect();
await consumer.subscribe({ topic, fromBeginning: true });
await consumer.run({ eachMessage: async ({ message }) => report({ outcome: 'read', value: String(message.value) }) });
`;
    const { stdout } = await promisify(execFile)(process.execPath, ['--input-type=module', '-e', child, brokers.join(','), topic], { cwd: process.cwd(), timeout: 55_000 });
    const result = JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as { outcome: string; restart?: boolean; message?: string };
    expect(result).toMatchObject({ outcome: 'crash', restart: false });
    expect(result.message).toMatch(/maxDecompressedBytes=1048576/);
  });
});

// ---------------------------------------------------------------------------

describe('ablation: kafkajs without registerCompressionCodecs', () => {
  // A child process with plain kafkajs: this file's registration does not reach it.
  const PLAIN_KAFKAJS_CONSUMER = `
const { Kafka, logLevel } = require('kafkajs');
const [brokers, topic] = process.argv.slice(1);
const kafka = new Kafka({ clientId: 'writ-ablation', brokers: brokers.split(','), logLevel: logLevel.NOTHING });
const consumer = kafka.consumer({ groupId: 'writ-ablation-' + Date.now(), maxWaitTimeInMs: 500 });
const report = (r) => { process.stdout.write(JSON.stringify(r) + '\\n'); process.exit(0); };
setTimeout(() => report({ outcome: 'timeout' }), 40000).unref();
// a retriable crash (a join the coordinator is not ready for) is followed by kafkajs's own restart: not the outcome
consumer.on(consumer.events.CRASH, (e) => { if (!e.payload.restart) report({ outcome: 'crash', name: e.payload.error.name, message: e.payload.error.message }); });
(async () => {
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({ eachMessage: async ({ message }) => report({ outcome: 'read', value: String(message.value) }) });
})().catch((e) => report({ outcome: 'error', name: e.name, message: e.message }));
`;

  it('plain kafkajs 2.2.4 fails on the lz4 batch that the registered codecs read', async () => {
    const topic = await createTopic(1);
    await consoleProduce({ brokers, topic, records: [{ key: 'k', value: 'lz4 from Java' }], compression: 'lz4' });
    const { stdout } = await promisify(execFile)(process.execPath, ['-e', PLAIN_KAFKAJS_CONSUMER, brokers.join(','), topic], {
      cwd: process.cwd(),
      timeout: 55_000,
    });
    const result = JSON.parse(stdout.trim().split('\n').pop() ?? '{}') as { outcome: string; name?: string; message?: string };
    expect(result).toMatchObject({ outcome: 'crash', name: 'KafkaJSNotImplemented', message: 'LZ4 compression not implemented' });

    // the same batch, in this process with the codecs registered
    const { seen, crash } = await collect(topic);
    await waitFor(() => seen.length >= 1 || crash.error, { timeoutMs: 30_000, message: 'kafkajs with codecs saw nothing' });
    expect(crash.error).toBeUndefined();
    expect(seen[0]).toMatchObject({ key: 'k', value: 'lz4 from Java' });
  });
});
