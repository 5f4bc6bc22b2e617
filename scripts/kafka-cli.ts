// The Kafka distribution's own console producer and consumer, run from Node as
// child JVMs (`java -cp '<KAFKA_LIBS>/*' org.apache.kafka.tools...`): a client
// that is neither writ's nor kafkajs, for "foreign producer" tests. The jars
// are the ones src/testing/local-stack.ts fetches beside the broker.
//
// What the console producer can carry (it reads stdin as UTF-8 text lines,
// `LineMessageReader`):
// - keys and values are UTF-8 text without CR or LF; a Buffer value must be
//   valid UTF-8 (checked here, so nothing is silently mangled). Arbitrary
//   binary cannot be sent: there is no base64 or hex mode.
// - a key may be null (via `null.marker`); values are never null here.
// - the key separator and the null marker are tokens chosen per call that
//   occur in no key (a value may contain anything else, even the separator:
//   the reader splits at the first one).
// - partitions: the console producer has no per-record partition. A record
//   with `partition` is sent by a run with a one-class partitioner that pins
//   every record of that run to one partition (compiled with javac into
//   .cache/kafka-cli on first use); records are grouped into one run per
//   partition, so order holds within a partition, not across them. Records
//   without `partition` go through the Java producer's default partitioner
//   (murmur2 of the key, like kafkajs's DefaultPartitioner).
//
// Compression is set with `--compression-codec`: ConsoleProducer puts
// `compression.type` (default none) over whatever `--producer-property` /
// `--command-property compression.type=...` said, silently.
//
// Library module: importing it has no side effects.

import { spawn } from 'node:child_process';
import { createHash, randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, renameSync, rmSync, writeFileSync } from 'node:fs';
import { delimiter, join } from 'node:path';
import { CACHE_DIR, KAFKA_LIBS, KAFKA_VERSION } from '../src/testing/local-stack.ts';

export type ConsoleCompression = 'none' | 'gzip' | 'snappy' | 'lz4' | 'zstd';
const COMPRESSIONS: readonly ConsoleCompression[] = ['none', 'gzip', 'snappy', 'lz4', 'zstd'];

export interface ConsoleRecord {
  key: string | null;
  /** UTF-8 text without CR/LF (a Buffer must hold valid UTF-8). */
  value: string | Buffer;
  /** Pin the record to this partition (see the file comment: one producer run per partition). */
  partition?: number;
}

export interface ConsoleProduceOptions {
  brokers: string | string[];
  topic: string;
  records: ConsoleRecord[];
  /** The producer's `compression.type`, passed as `--compression-codec` (a `compression.type` producer property would be overwritten by it). */
  compression: ConsoleCompression;
  /** More producer configs, e.g. `{ 'compression.lz4.level': 9, 'linger.ms': 50 }`. */
  extraProducerProps?: Record<string, string | number | boolean>;
  /** Send one record at a time and fail on the first error (`--sync`); default false: records batch together, which is what compression works on. */
  sync?: boolean;
  /** Per JVM run, including its start-up (default 120 s). */
  timeoutMs?: number;
  /** Defaults: `KAFKA_LIBS`, `java` / `javac` on the PATH. */
  kafkaLibs?: string;
  java?: string;
  javac?: string;
}

export interface ConsoleRun {
  /** `null` = the producer's own partitioner. */
  partition: number | null;
  records: number;
  args: string[];
  stdout: string;
  stderr: string;
}

export interface ConsoleProduceResult {
  runs: ConsoleRun[];
}

export interface ConsoleConsumeOptions {
  brokers: string | string[];
  topic: string;
  /** Stop after this many records; fewer before the idle timeout is an error. */
  maxMessages: number;
  /** Read only this partition from its earliest offset (no consumer group: faster); default all partitions from the beginning, as a throwaway group. */
  partition?: number;
  /** Give up after this long without a new record (ConsoleConsumer's --timeout-ms, default 30 s). */
  idleTimeoutMs?: number;
  isolationLevel?: 'read_committed' | 'read_uncommitted';
  extraConsumerProps?: Record<string, string | number | boolean>;
  /** For the whole JVM run (default idleTimeoutMs + 90 s). */
  timeoutMs?: number;
  kafkaLibs?: string;
  java?: string;
}

export interface ConsoleConsumedRecord {
  partition: number;
  offset: string;
  key: Buffer | null;
  value: Buffer | null;
}

// ---------------------------------------------------------------------------
// process plumbing

// A short-lived tool JVM: small heap, serial GC, C1 only (starts faster on 2 cores).
const JVM_FLAGS = ['-Xms32m', '-Xmx256m', '-XX:+UseSerialGC', '-XX:TieredStopAtLevel=1', '-Djava.awt.headless=true'];

interface Exit {
  code: number | null;
  signal: NodeJS.Signals | null;
  stdout: Buffer;
  stderr: string;
  timedOut: boolean;
}

function runProcess(cmd: string, args: string[], stdin: Buffer | null, timeoutMs: number): Promise<Exit> {
  return new Promise((resolve, reject) => {
    const child = spawn(cmd, args, { stdio: [stdin === null ? 'ignore' : 'pipe', 'pipe', 'pipe'] });
    const out: Buffer[] = [];
    let stderr = '';
    let timedOut = false;
    const timer = setTimeout(() => {
      timedOut = true;
      child.kill('SIGKILL');
    }, timeoutMs);
    child.stdout?.on('data', (d: Buffer) => out.push(d));
    child.stderr?.on('data', (d: Buffer) => (stderr += d.toString()));
    child.on('error', (err) => {
      clearTimeout(timer);
      reject(new Error(`could not run ${cmd}: ${err.message}`, { cause: err }));
    });
    child.on('close', (code, signal) => {
      clearTimeout(timer);
      resolve({ code, signal, stdout: Buffer.concat(out), stderr, timedOut });
    });
    if (stdin !== null && child.stdin) {
      child.stdin.on('error', () => {}); // EPIPE when the JVM dies early: its exit status tells
      child.stdin.end(stdin);
    }
  });
}

function tail(text: string, max = 4000): string {
  return text.length > max ? `…${text.slice(-max)}` : text;
}

function brokerList(brokers: string | string[]): string {
  const list = (Array.isArray(brokers) ? brokers : brokers.split(',')).map((b) => b.trim()).filter((b) => b !== '');
  if (list.length === 0) throw new Error('kafka-cli: no brokers given');
  return list.join(',');
}

/** KIP-1147 (Kafka 4.2) renamed the console tools' property flags; the old names warn, and go in 5.0. */
function modernFlags(version: string): boolean {
  const [major = 0, minor = 0] = version.split('.').map((n) => Number.parseInt(n, 10));
  return major > 4 || (major === 4 && minor >= 2);
}

const FLAGS = modernFlags(KAFKA_VERSION)
  ? { reader: '--reader-property', producer: '--command-property', formatter: '--formatter-property', consumer: '--command-property' }
  : { reader: '--property', producer: '--producer-property', formatter: '--property', consumer: '--consumer-property' };

function propArgs(flag: string, props: Record<string, string | number | boolean> | undefined): string[] {
  return Object.entries(props ?? {}).flatMap(([k, v]) => [flag, `${k}=${String(v)}`]);
}

/** A token that occurs in none of `texts` (printable, so trimming or logging cannot damage it). */
function uniqueToken(kind: string, texts: string[]): string {
  for (;;) {
    const token = `<writ-${kind}-${randomBytes(6).toString('hex')}>`;
    if (!texts.some((t) => t.includes(token))) return token;
  }
}

// ---------------------------------------------------------------------------
// fixed-partition support

const PARTITIONER_CLASS = 'writ.tools.FixedPartitioner';
const PARTITION_PROP = 'writ.fixed.partition';
const PARTITIONER_SOURCE = `package writ.tools;

import java.util.Map;
import org.apache.kafka.clients.producer.Partitioner;
import org.apache.kafka.common.Cluster;

/** Sends every record to the partition in "${PARTITION_PROP}" (scripts/kafka-cli.ts). */
public final class FixedPartitioner implements Partitioner {
    private int partition = -1;

    @Override
    public void configure(Map<String, ?> configs) {
        Object value = configs.get("${PARTITION_PROP}");
        if (value == null) throw new IllegalArgumentException("${PARTITION_PROP} is not set");
        partition = Integer.parseInt(value.toString().trim());
    }

    @Override
    public int partition(String topic, Object key, byte[] keyBytes, Object value, byte[] valueBytes, Cluster cluster) {
        Integer count = cluster.partitionCountForTopic(topic);
        if (count != null && partition >= count)
            throw new IllegalArgumentException("partition " + partition + " does not exist: " + topic + " has " + count);
        return partition;
    }

    @Override
    public void close() {}
}
`;

/** Compiles the partitioner once per source and Kafka version; returns the class directory for the classpath. */
async function fixedPartitionerClasses(libs: string, javac: string): Promise<string> {
  const hash = createHash('sha256').update(PARTITIONER_SOURCE).update(KAFKA_VERSION).digest('hex').slice(0, 12);
  const dir = join(CACHE_DIR, 'kafka-cli', `fixed-partitioner-${hash}`);
  if (existsSync(join(dir, 'writ', 'tools', 'FixedPartitioner.class'))) return dir;
  const work = `${dir}.tmp-${process.pid}-${randomBytes(4).toString('hex')}`;
  try {
    mkdirSync(join(work, 'classes'), { recursive: true });
    const source = join(work, 'FixedPartitioner.java');
    writeFileSync(source, PARTITIONER_SOURCE);
    const result = await runProcess(javac, ['--release', '11', '-nowarn', '-cp', join(libs, '*'), '-d', join(work, 'classes'), source], null, 120_000);
    if (result.code !== 0) {
      throw new Error(`kafka-cli: javac failed to build ${PARTITIONER_CLASS} (exit ${String(result.code)}):\n${tail(result.stderr + result.stdout.toString())}`);
    }
    try {
      renameSync(join(work, 'classes'), dir);
    } catch (err) {
      if (!existsSync(join(dir, 'writ', 'tools', 'FixedPartitioner.class'))) throw err; // else a concurrent run won the rename
    }
    return dir;
  } finally {
    rmSync(work, { recursive: true, force: true });
  }
}

// ---------------------------------------------------------------------------
// console producer

const utf8 = new TextDecoder('utf-8', { fatal: true });

function recordText(value: string | Buffer, what: string): string {
  let text: string;
  if (typeof value === 'string') {
    text = value;
    if (Buffer.from(text, 'utf8').toString('utf8') !== text) throw new Error(`kafka-cli: ${what} is not valid Unicode (lone surrogate)`);
  } else {
    try {
      text = utf8.decode(value);
    } catch {
      throw new Error(`kafka-cli: ${what} is not valid UTF-8; the console producer reads stdin as UTF-8 text and cannot carry binary`);
    }
  }
  if (/[\r\n]/.test(text)) throw new Error(`kafka-cli: ${what} contains CR or LF; the console producer reads one record per line`);
  return text;
}

/**
 * Produces `records` to `topic` with the Kafka distribution's own
 * `org.apache.kafka.tools.ConsoleProducer` (a Java child process) with
 * `--compression-codec <compression>`. Resolves when every run exited cleanly;
 * throws with the tool's output if a run exits non-zero, times out, or logs a
 * failed send (the console producer logs async send failures and still exits
 * 0, so its output is checked for them).
 */
export async function consoleProduce(opts: ConsoleProduceOptions): Promise<ConsoleProduceResult> {
  if (!COMPRESSIONS.includes(opts.compression)) throw new Error(`kafka-cli: unknown compression ${String(opts.compression)}`);
  const brokers = brokerList(opts.brokers);
  const libs = opts.kafkaLibs ?? KAFKA_LIBS;
  const java = opts.java ?? 'java';
  const timeoutMs = opts.timeoutMs ?? 120_000;
  if (opts.extraProducerProps && 'compression.type' in opts.extraProducerProps) {
    throw new Error('kafka-cli: set compression with `compression`; ConsoleProducer overwrites a compression.type producer property');
  }
  if (opts.records.length === 0) return { runs: [] };

  const texts = opts.records.map((r, i) => ({
    key: r.key === null ? null : recordText(r.key, `record ${i}'s key`),
    value: recordText(r.value, `record ${i}'s value`),
    partition: r.partition ?? null,
  }));
  for (const [i, r] of opts.records.entries()) {
    if (r.partition !== undefined && (!Number.isInteger(r.partition) || r.partition < 0)) {
      throw new Error(`kafka-cli: record ${i}'s partition must be a non-negative integer, got ${String(r.partition)}`);
    }
  }
  const keys = texts.flatMap((t) => (t.key === null ? [] : [t.key]));
  const separator = uniqueToken('sep', keys);
  // compared with whole keys and values: it must equal none of them (and contain no separator)
  const nullMarker = uniqueToken('null', [...keys, ...texts.map((t) => t.value), separator]);

  const groups = new Map<number | null, string[]>();
  for (const t of texts) {
    const lines = groups.get(t.partition) ?? [];
    lines.push(`${t.key ?? nullMarker}${separator}${t.value}`);
    groups.set(t.partition, lines);
  }

  const needsPartitioner = [...groups.keys()].some((p) => p !== null);
  const extraClasses = needsPartitioner ? await fixedPartitionerClasses(libs, opts.javac ?? 'javac') : null;
  const classpath = [join(libs, '*'), ...(extraClasses === null ? [] : [extraClasses])].join(delimiter);

  const runs: ConsoleRun[] = [];
  for (const [partition, lines] of groups) {
    const args = [
      ...JVM_FLAGS,
      '-cp',
      classpath,
      'org.apache.kafka.tools.ConsoleProducer',
      '--bootstrap-server',
      brokers,
      '--topic',
      opts.topic,
      FLAGS.reader,
      'parse.key=true',
      FLAGS.reader,
      `key.separator=${separator}`,
      FLAGS.reader,
      `null.marker=${nullMarker}`,
      // not `compression.type` as a producer property: ConsoleProducer sets compression.type from
      // --compression-codec (default none) after applying the producer properties, so that one is lost
      '--compression-codec',
      opts.compression,
      ...(partition === null ? [] : [FLAGS.producer, `partitioner.class=${PARTITIONER_CLASS}`, FLAGS.producer, `${PARTITION_PROP}=${partition}`]),
      ...propArgs(FLAGS.producer, opts.extraProducerProps),
      ...(opts.sync ? ['--sync'] : []),
    ];
    const stdin = Buffer.from(`${lines.join('\n')}\n`, 'utf8');
    const result = await runProcess(java, args, stdin, timeoutMs);
    const stdout = result.stdout.toString('utf8');
    const output = `${result.stderr}\n${stdout}`;
    const describe = `ConsoleProducer (${lines.length} records to ${opts.topic}${partition === null ? '' : ` partition ${partition}`}, compression ${opts.compression})`;
    if (result.timedOut) throw new Error(`kafka-cli: ${describe} did not finish within ${timeoutMs} ms:\n${tail(output)}`);
    if (result.code !== 0) throw new Error(`kafka-cli: ${describe} exited ${String(result.code ?? result.signal)}:\n${tail(output)}`);
    if (/Error when sending message|ERROR|Exception/.test(output)) throw new Error(`kafka-cli: ${describe} reported a failed send:\n${tail(output)}`);
    runs.push({ partition, records: lines.length, args, stdout, stderr: result.stderr });
  }
  return { runs };
}

// ---------------------------------------------------------------------------
// console consumer

/**
 * Reads `maxMessages` records from `topic` with the distribution's
 * `org.apache.kafka.tools.consumer.ConsoleConsumer`, which decompresses with
 * Kafka's own Java codecs: the check that what kafkajs wrote is readable by a
 * Java client. Keys and values come back byte-exact (field and record
 * separators are random tokens, so only a value containing such a token could
 * confuse the parse).
 */
export async function consoleConsume(opts: ConsoleConsumeOptions): Promise<ConsoleConsumedRecord[]> {
  const brokers = brokerList(opts.brokers);
  const libs = opts.kafkaLibs ?? KAFKA_LIBS;
  const idleTimeoutMs = opts.idleTimeoutMs ?? 30_000;
  const fieldSep = uniqueToken('field', []);
  const recordSep = uniqueToken('record', [fieldSep]);
  const nullLiteral = uniqueToken('null', [fieldSep, recordSep]);
  const args = [
    ...JVM_FLAGS,
    '-cp',
    join(libs, '*'),
    'org.apache.kafka.tools.consumer.ConsoleConsumer',
    '--bootstrap-server',
    brokers,
    '--topic',
    opts.topic,
    ...(opts.partition === undefined ? ['--from-beginning'] : ['--partition', String(opts.partition), '--offset', 'earliest']),
    '--max-messages',
    String(opts.maxMessages),
    '--timeout-ms',
    String(idleTimeoutMs),
    '--isolation-level',
    opts.isolationLevel ?? 'read_uncommitted',
    FLAGS.formatter,
    'print.partition=true',
    FLAGS.formatter,
    'print.offset=true',
    FLAGS.formatter,
    'print.key=true',
    FLAGS.formatter,
    `key.separator=${fieldSep}`,
    FLAGS.formatter,
    `line.separator=${recordSep}`,
    FLAGS.formatter,
    `null.literal=${nullLiteral}`,
    ...propArgs(FLAGS.consumer, opts.extraConsumerProps),
  ];
  const timeoutMs = opts.timeoutMs ?? idleTimeoutMs + 90_000;
  const result = await runProcess(opts.java ?? 'java', args, null, timeoutMs);
  const describe = `ConsoleConsumer (${opts.topic})`;
  if (result.timedOut) throw new Error(`kafka-cli: ${describe} did not finish within ${timeoutMs} ms:\n${tail(result.stderr)}`);

  const records: ConsoleConsumedRecord[] = [];
  const field = Buffer.from(fieldSep);
  const record = Buffer.from(recordSep);
  const nul = Buffer.from(nullLiteral);
  let pos = 0;
  const out = result.stdout;
  for (let end = out.indexOf(record, pos); end >= 0; end = out.indexOf(record, pos)) {
    const line = out.subarray(pos, end);
    pos = end + record.length;
    const parts: Buffer[] = [];
    let from = 0;
    for (let i = 0; i < 3; i++) {
      const at = line.indexOf(field, from);
      if (at < 0) throw new Error(`kafka-cli: ${describe} printed an unparsable record: ${line.toString()}`);
      parts.push(line.subarray(from, at));
      from = at + field.length;
    }
    parts.push(line.subarray(from));
    const [partitionText, offsetText, key, value] = parts as [Buffer, Buffer, Buffer, Buffer];
    const partition = /^Partition:(\d+)$/.exec(partitionText.toString());
    const offset = /^Offset:(\d+)$/.exec(offsetText.toString());
    if (!partition || !offset) throw new Error(`kafka-cli: ${describe} printed an unparsable record: ${line.toString()}`);
    records.push({
      partition: Number(partition[1]),
      offset: offset[1] ?? '',
      key: key.equals(nul) ? null : Buffer.from(key),
      value: value.equals(nul) ? null : Buffer.from(value),
    });
  }
  if (result.code !== 0 || records.length < opts.maxMessages) {
    throw new Error(
      `kafka-cli: ${describe} read ${records.length}/${opts.maxMessages} records (exit ${String(result.code ?? result.signal)}):\n${tail(result.stderr)}`,
    );
  }
  return records;
}
