// A real single-node Kafka (KRaft) broker and a real Apicurio schema registry,
// started as plain JVM processes (no Docker). Jars come from Maven Central via
// `mvn`; everything lives under `.cache/` at the repo root.
//
// Library module: importing it has no side effects.

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';

export interface StackEndpoints {
  brokers: string[];
  registryUrl: string;
}

export interface EnsureStackResult {
  endpoints: StackEndpoints;
  /** true when this call started at least one process (broker and/or registry). */
  started: boolean;
  /** Stops exactly what this call started (no-op when nothing was started). */
  stop: () => Promise<void>;
}

export interface StackOptions {
  log?: (line: string) => void;
}

// ---------------------------------------------------------------------------
// Versions and layout

/**
 * Newest Kafka 4.x on Maven Central. kafkajs 2.2.4 negotiates API versions that
 * the 4.x broker still serves (KIP-896 removed only very old ones); see
 * test/integration/kafkajs-smoke.test.ts.
 */
export const KAFKA_VERSION = process.env['WRIT_KAFKA_VERSION'] ?? '4.4.0';
/** log4j2 BOM pinned to the version Kafka 4.4.0 itself depends on. */
const LOG4J_VERSION = '2.25.5';
/**
 * Apicurio 3.0.9: the newest 3.x whose `all` tarball runs on Java 17
 * (3.3.x is compiled for Java 21). 3.x serves the Confluent API at /apis/ccompat/v7.
 */
export const APICURIO_VERSION = process.env['WRIT_APICURIO_VERSION'] ?? '3.0.9';
const DEPENDENCY_PLUGIN = 'org.apache.maven.plugins:maven-dependency-plugin:3.8.1';
/**
 * dependency:copy of 3.x reads the artifact's descriptor, and the parent POM
 * io.apicurio:apicurio-registry:3.0.9 is not resolvable from Central here; 2.8's
 * copy fetches the tarball without reading descriptors.
 */
const DEPENDENCY_PLUGIN_COPY = 'org.apache.maven.plugins:maven-dependency-plugin:2.8';

const ROOT = resolve(dirname(fileURLToPath(import.meta.url)), '..');
export const CACHE_DIR = join(ROOT, '.cache');
const KAFKA_HOME = join(CACHE_DIR, `kafka-${KAFKA_VERSION}`);
/** The broker's jars, plus kafka-tools (console producer, kafka-transactions) for tests and operators. */
export const KAFKA_LIBS = join(KAFKA_HOME, 'libs');
const APICURIO_HOME = join(CACHE_DIR, `apicurio-${APICURIO_VERSION}`);
/** Runtime data, logs and pid files; `WRIT_LOCAL_STACK_DIR` gives a second, independent stack (the fault suite's). */
export const RUN_DIR = process.env['WRIT_LOCAL_STACK_DIR'] ? resolve(process.env['WRIT_LOCAL_STACK_DIR']) : join(CACHE_DIR, 'run');
const BROKER_DATA = join(RUN_DIR, 'kafka-data');
const SERVER_PROPERTIES = join(RUN_DIR, 'server.properties');
const LOG4J_CONFIG = join(RUN_DIR, 'log4j2.xml');
const LOCK_FILE = join(RUN_DIR, 'stack.lock');
const MARKER = '.complete';

function portFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n <= 0 || n > 65534) throw new Error(`${name} must be a TCP port, got ${raw}`);
  return n;
}

const HOST = '127.0.0.1';
export const BROKER_PORT = portFromEnv('WRIT_LOCAL_KAFKA_PORT', 39092);
const CONTROLLER_PORT = BROKER_PORT + 1;
export const REGISTRY_PORT = portFromEnv('WRIT_LOCAL_REGISTRY_PORT', 38081);
export const LOCAL_BROKER = `${HOST}:${BROKER_PORT}`;
export const LOCAL_REGISTRY_URL = `http://${HOST}:${REGISTRY_PORT}/apis/ccompat/v7`;

const JAVA = process.env['JAVA_HOME'] ? join(process.env['JAVA_HOME'], 'bin', 'java') : 'java';

type Component = 'broker' | 'registry';

interface ComponentSpec {
  pidFile: string;
  outFile: string;
  /** Substrings that /proc/<pid>/cmdline must contain for the pid to be ours. */
  signature: () => string[];
}

const COMPONENTS: Record<Component, ComponentSpec> = {
  broker: {
    pidFile: join(RUN_DIR, 'broker.pid'),
    outFile: join(RUN_DIR, 'broker.out'),
    signature: () => ['kafka.Kafka', SERVER_PROPERTIES],
  },
  registry: {
    pidFile: join(RUN_DIR, 'registry.pid'),
    outFile: join(RUN_DIR, 'registry.out'),
    signature: () => [APICURIO_HOME],
  },
};
const BROKER_LOG = join(RUN_DIR, 'broker.log');

const noop = (): void => {};
const defaultLog = (line: string): void => {
  process.stderr.write(`[local-stack] ${line}\n`);
};

// ---------------------------------------------------------------------------
// Small utilities

function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

function tail(file: string, lines = 40): string {
  try {
    const all = readFileSync(file, 'utf8').split('\n');
    return all.slice(-lines).join('\n');
  } catch {
    return `(no ${file})`;
  }
}

function run(cmd: string, args: string[], cwd: string): Promise<{ code: number; output: string }> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, { cwd, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    child.stdout.on('data', (d: Buffer) => (output += d.toString()));
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code: code ?? 1, output }));
  });
}

async function runOrThrow(cmd: string, args: string[], cwd: string, what: string): Promise<void> {
  const { code, output } = await run(cmd, args, cwd);
  if (code !== 0) throw new Error(`${what} failed (exit ${code}): ${cmd} ${args.join(' ')}\n${output.slice(-4000)}`);
}

function isAlive(pid: number): boolean {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // state is the field after the ")" that closes the command name
    const state = stat.slice(stat.lastIndexOf(')') + 2, stat.lastIndexOf(')') + 3);
    return state !== 'Z' && state !== 'X';
  } catch {
    if (process.platform === 'linux') return false;
    try {
      process.kill(pid, 0);
      return true;
    } catch {
      return false;
    }
  }
}

function cmdline(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return undefined;
  }
}

/** The live pid of a component we started (pid file + cmdline check), else undefined. */
function ownedPid(component: Component): number | undefined {
  const spec = COMPONENTS[component];
  let pid: number;
  try {
    pid = Number(readFileSync(spec.pidFile, 'utf8').trim());
  } catch {
    return undefined;
  }
  if (!Number.isInteger(pid) || pid <= 0 || !isAlive(pid)) return undefined;
  const cl = cmdline(pid);
  if (cl !== undefined && !spec.signature().every((s) => cl.includes(s))) return undefined; // pid reused
  return pid;
}

async function waitForExit(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!isAlive(pid)) return true;
    await sleep(100);
  }
  return !isAlive(pid);
}

function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** SIGTERM, then SIGKILL after the deadline; resolves once the process is gone. */
async function stopComponent(component: Component, log: (l: string) => void, termTimeoutMs = 30_000): Promise<number | undefined> {
  const pid = ownedPid(component);
  const spec = COMPONENTS[component];
  if (pid === undefined) {
    rmSync(spec.pidFile, { force: true });
    return undefined;
  }
  log(`stopping ${component} (pid ${pid})`);
  signal(pid, 'SIGTERM');
  if (!(await waitForExit(pid, termTimeoutMs))) {
    log(`${component} (pid ${pid}) ignored SIGTERM for ${termTimeoutMs} ms; sending SIGKILL`);
    signal(pid, 'SIGKILL');
    if (!(await waitForExit(pid, 10_000))) throw new Error(`${component} (pid ${pid}) did not exit after SIGKILL`);
  }
  rmSync(spec.pidFile, { force: true });
  return pid;
}

function spawnDetached(component: Component, cmd: string, args: string[], cwd: string): ChildProcess {
  const spec = COMPONENTS[component];
  mkdirSync(RUN_DIR, { recursive: true });
  const fd = openSync(spec.outFile, 'a');
  try {
    const child = spawn(cmd, args, { cwd, detached: true, stdio: ['ignore', fd, fd] });
    if (child.pid === undefined) throw new Error(`could not spawn ${cmd} for ${component}`);
    writeFileSync(spec.pidFile, `${child.pid}\n`);
    child.on('error', noop);
    child.unref();
    return child;
  } finally {
    closeSync(fd);
  }
}

function tcpOpen(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolvePromise) => {
    const socket = connect({ host, port });
    const done = (ok: boolean): void => {
      socket.destroy();
      resolvePromise(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(true));
    socket.once('error', () => done(false));
  });
}

/** One describeCluster round trip; true when the broker answers with at least one broker. */
async function brokerServes(brokers: string[], timeoutMs = 5000): Promise<boolean> {
  const kafka = new Kafka({
    clientId: 'writ-local-stack',
    brokers,
    logLevel: logLevel.NOTHING,
    connectionTimeout: Math.min(timeoutMs, 2000),
    requestTimeout: timeoutMs,
    retry: { retries: 0 },
  });
  const admin = kafka.admin();
  try {
    await admin.connect();
    const cluster = await admin.describeCluster();
    return cluster.brokers.length > 0 && cluster.controller !== null && cluster.controller >= 0;
  } catch {
    return false;
  } finally {
    await admin.disconnect().catch(noop);
  }
}

/**
 * Waits until the broker at `brokers` answers describeCluster. Throws after
 * `timeoutMs` (default 90 s) with the tail of the local broker log.
 */
export async function waitForBroker(brokers: string[] = [LOCAL_BROKER], timeoutMs = 90_000, pid?: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await brokerServes(brokers)) return;
    if (pid !== undefined && !isAlive(pid)) {
      throw new Error(`broker JVM (pid ${pid}) exited during startup.\n--- ${COMPONENTS.broker.outFile}\n${tail(COMPONENTS.broker.outFile)}\n--- ${BROKER_LOG}\n${tail(BROKER_LOG)}`);
    }
    await sleep(500);
  }
  throw new Error(`broker ${brokers.join(',')} did not answer describeCluster within ${timeoutMs} ms.\n--- ${COMPONENTS.broker.outFile}\n${tail(COMPONENTS.broker.outFile)}\n--- ${BROKER_LOG}\n${tail(BROKER_LOG)}`);
}

async function registryServes(url: string, timeoutMs = 2000): Promise<boolean> {
  try {
    const res = await fetch(`${url}/subjects`, { signal: AbortSignal.timeout(timeoutMs) });
    await res.arrayBuffer().catch(noop);
    return res.status === 200;
  } catch {
    return false;
  }
}

async function waitForRegistry(url: string, timeoutMs: number, pid?: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await registryServes(url)) return;
    if (pid !== undefined && !isAlive(pid)) {
      throw new Error(`registry JVM (pid ${pid}) exited during startup.\n--- ${COMPONENTS.registry.outFile}\n${tail(COMPONENTS.registry.outFile)}`);
    }
    await sleep(300);
  }
  throw new Error(`registry ${url} did not answer GET /subjects with 200 within ${timeoutMs} ms.\n--- ${COMPONENTS.registry.outFile}\n${tail(COMPONENTS.registry.outFile)}`);
}

// ---------------------------------------------------------------------------
// Cross-process lock (kafka:up and a vitest run may race)

async function withLock<T>(log: (l: string) => void, fn: () => Promise<T>): Promise<T> {
  mkdirSync(RUN_DIR, { recursive: true });
  const deadline = Date.now() + 10 * 60_000;
  let announced = false;
  for (;;) {
    try {
      const fd = openSync(LOCK_FILE, 'wx');
      writeFileSync(fd, `${process.pid}\n`);
      closeSync(fd);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      let holder = NaN;
      try {
        holder = Number(readFileSync(LOCK_FILE, 'utf8').trim());
      } catch {
        // vanished or half-written; retry
      }
      const deadHolder = Number.isInteger(holder) && holder > 0 && !isAlive(holder);
      // a lock file without a pid for 10 s: its writer died between create and write
      const orphaned = !(holder > 0) && Date.now() - (statSync(LOCK_FILE, { throwIfNoEntry: false })?.mtimeMs ?? Date.now()) > 10_000;
      if (deadHolder || orphaned) {
        rmSync(LOCK_FILE, { force: true });
        continue;
      }
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${LOCK_FILE} (held by pid ${holder})`);
      if (!announced) {
        log(`waiting for another process (pid ${holder}) that is starting the stack`);
        announced = true;
      }
      await sleep(250);
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(LOCK_FILE, { force: true });
  }
}

// ---------------------------------------------------------------------------
// Leases: several processes (two vitest runs, a bench) may share one stack. The
// caller that started a component stops it in stop() only if no other live
// process still uses the stack; otherwise it leaves a `<component>.autostop`
// marker and the last live user stops it. A stack started by `kafka:up` is never
// stopped by a test run (kafka:up never calls stop(); only kafka:down stops it).

const LEASE_DIR = join(RUN_DIR, 'leases');

function autostopFile(component: Component): string {
  return join(RUN_DIR, `${component}.autostop`);
}

function takeLease(): string {
  mkdirSync(LEASE_DIR, { recursive: true });
  const file = join(LEASE_DIR, `${process.pid}.${randomBytes(4).toString('hex')}`);
  writeFileSync(file, `${process.pid}\n`);
  return file;
}

/** Lease files of other processes (or other ensureStack calls) that are still alive; dead ones are pruned. */
function otherLiveLeases(mine: string): string[] {
  if (!existsSync(LEASE_DIR)) return [];
  const live: string[] = [];
  for (const name of readdirSync(LEASE_DIR)) {
    const file = join(LEASE_DIR, name);
    if (file === mine) continue;
    const pid = Number(name.split('.')[0]);
    if (Number.isInteger(pid) && pid > 0 && isAlive(pid)) live.push(file);
    else rmSync(file, { force: true });
  }
  return live;
}

// ---------------------------------------------------------------------------
// Downloads (Maven only; idempotent, a marker file is written last)

function kafkaPom(): string {
  return `<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by scripts/local-stack.ts -->
<project xmlns="http://maven.apache.org/POM/4.0.0">
  <modelVersion>4.0.0</modelVersion>
  <groupId>local.writ</groupId>
  <artifactId>kafka-runtime</artifactId>
  <version>1</version>
  <packaging>pom</packaging>
  <dependencyManagement>
    <dependencies>
      <dependency>
        <groupId>org.apache.logging.log4j</groupId>
        <artifactId>log4j-bom</artifactId>
        <version>${LOG4J_VERSION}</version>
        <type>pom</type>
        <scope>import</scope>
      </dependency>
    </dependencies>
  </dependencyManagement>
  <dependencies>
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka_2.13</artifactId>
      <version>${KAFKA_VERSION}</version>
    </dependency>
    <!-- the distribution's own tools: ConsoleProducer (foreign-producer tests), TransactionsCommand -->
    <dependency>
      <groupId>org.apache.kafka</groupId>
      <artifactId>kafka-tools</artifactId>
      <version>${KAFKA_VERSION}</version>
    </dependency>
    <!-- Kafka 4 logs through slf4j 1.7 to log4j2; the binding is not a dependency of kafka_2.13 -->
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-core</artifactId>
    </dependency>
    <dependency>
      <groupId>org.apache.logging.log4j</groupId>
      <artifactId>log4j-slf4j-impl</artifactId>
    </dependency>
  </dependencies>
</project>
`;
}

async function ensureKafkaJars(log: (l: string) => void): Promise<void> {
  if (existsSync(join(KAFKA_HOME, MARKER)) && existsSync(join(KAFKA_LIBS, `kafka-tools-${KAFKA_VERSION}.jar`))) return;
  const t0 = Date.now();
  log(`downloading Kafka ${KAFKA_VERSION} jars with mvn into ${KAFKA_LIBS}`);
  rmSync(KAFKA_LIBS, { recursive: true, force: true });
  mkdirSync(KAFKA_HOME, { recursive: true });
  writeFileSync(join(KAFKA_HOME, 'pom.xml'), kafkaPom());
  await runOrThrow(
    'mvn',
    ['-q', '-B', `${DEPENDENCY_PLUGIN}:copy-dependencies`, `-DoutputDirectory=${KAFKA_LIBS}`, '-DincludeScope=runtime'],
    KAFKA_HOME,
    'mvn copy-dependencies (Kafka)',
  );
  const jars = readdirSync(KAFKA_LIBS);
  const wanted = [`kafka_2.13-${KAFKA_VERSION}.jar`, `kafka-tools-${KAFKA_VERSION}.jar`];
  if (!wanted.every((j) => jars.includes(j)) || !jars.some((j) => j.startsWith('log4j-slf4j-impl'))) {
    throw new Error(`Kafka download incomplete in ${KAFKA_LIBS}: ${jars.join(', ')}`);
  }
  writeFileSync(join(KAFKA_HOME, MARKER), `${new Date().toISOString()}\n`);
  log(`Kafka jars ready (${jars.length} jars, ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

function findRegistryJar(): string | undefined {
  for (const candidate of [join(APICURIO_HOME, 'quarkus-app', 'quarkus-run.jar'), join(APICURIO_HOME, 'quarkus-run.jar')]) {
    if (existsSync(candidate)) return candidate;
  }
  if (!existsSync(APICURIO_HOME)) return undefined;
  const runner = readdirSync(APICURIO_HOME).find((f) => f.endsWith('-runner.jar'));
  return runner === undefined ? undefined : join(APICURIO_HOME, runner);
}

async function ensureApicurio(log: (l: string) => void): Promise<string> {
  if (existsSync(join(APICURIO_HOME, MARKER))) {
    const jar = findRegistryJar();
    if (jar !== undefined) return jar;
  }
  const t0 = Date.now();
  log(`downloading Apicurio Registry ${APICURIO_VERSION} with mvn into ${APICURIO_HOME}`);
  rmSync(APICURIO_HOME, { recursive: true, force: true });
  const dl = join(APICURIO_HOME, 'download');
  mkdirSync(dl, { recursive: true });
  await runOrThrow(
    'mvn',
    ['-q', '-B', `${DEPENDENCY_PLUGIN_COPY}:copy`, `-Dartifact=io.apicurio:apicurio-registry-app:${APICURIO_VERSION}:tar.gz:all`, `-DoutputDirectory=${dl}`],
    APICURIO_HOME,
    'mvn dependency:copy (Apicurio)',
  );
  const tarball = readdirSync(dl).find((f) => f.endsWith('.tar.gz'));
  if (tarball === undefined) throw new Error(`Apicurio tarball missing in ${dl}`);
  await runOrThrow('tar', ['-xzf', join(dl, tarball), '-C', APICURIO_HOME], APICURIO_HOME, 'tar (Apicurio)');
  rmSync(dl, { recursive: true, force: true });
  const jar = findRegistryJar();
  if (jar === undefined) throw new Error(`no quarkus-run.jar or *-runner.jar in ${APICURIO_HOME}`);
  writeFileSync(join(APICURIO_HOME, MARKER), `${new Date().toISOString()}\n`);
  log(`Apicurio ready (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  return jar;
}

// ---------------------------------------------------------------------------
// Broker

/** The exact broker settings (single node, combined broker+controller, KRaft). */
export function brokerProperties(): Record<string, string | number | boolean> {
  return {
    'process.roles': 'broker,controller',
    'node.id': 1,
    'listeners': `PLAINTEXT://${HOST}:${BROKER_PORT},CONTROLLER://${HOST}:${CONTROLLER_PORT}`,
    'advertised.listeners': `PLAINTEXT://${HOST}:${BROKER_PORT}`,
    'listener.security.protocol.map': 'PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT',
    'inter.broker.listener.name': 'PLAINTEXT',
    'controller.listener.names': 'CONTROLLER',
    // dynamic quorum (KIP-853); storage is formatted with --standalone
    'controller.quorum.bootstrap.servers': `${HOST}:${CONTROLLER_PORT}`,
    'log.dirs': BROKER_DATA,
    'num.partitions': 1,
    'default.replication.factor': 1,
    'min.insync.replicas': 1,
    'auto.create.topics.enable': false,
    'delete.topic.enable': true,
    'group.initial.rebalance.delay.ms': 0,
    'offsets.topic.replication.factor': 1,
    'offsets.topic.num.partitions': 10,
    'transaction.state.log.replication.factor': 1,
    'transaction.state.log.min.isr': 1,
    'transaction.state.log.num.partitions': 10,
    'share.coordinator.state.topic.replication.factor': 1,
    'share.coordinator.state.topic.min.isr': 1,
    // after a SIGKILL the restarted broker cannot register until the old incarnation's
    // session expires (DUPLICATE_BROKER_REGISTRATION); 9 s by default, 5 s here
    'broker.heartbeat.interval.ms': 1000,
    'broker.session.timeout.ms': 5000,
    // keep it light on a 2-core box
    'num.network.threads': 2,
    'num.io.threads': 4,
    'background.threads': 4,
    'num.recovery.threads.per.data.dir': 1,
    'log.segment.bytes': 16 * 1024 * 1024,
    'log.index.size.max.bytes': 1024 * 1024,
    'log.retention.hours': 24,
    'log.retention.check.interval.ms': 60_000,
    'log.cleaner.threads': 1,
    'log.cleaner.dedupe.buffer.size': 8 * 1024 * 1024,
    'log.cleaner.backoff.ms': 5000,
    'offsets.topic.segment.bytes': 16 * 1024 * 1024,
    'transaction.state.log.segment.bytes': 16 * 1024 * 1024,
    'metadata.log.segment.bytes': 8 * 1024 * 1024,
  };
}

function writeBrokerConfig(): void {
  mkdirSync(RUN_DIR, { recursive: true });
  const props = Object.entries(brokerProperties())
    .map(([k, v]) => `${k}=${String(v)}`)
    .join('\n');
  writeFileSync(SERVER_PROPERTIES, `# generated by scripts/local-stack.ts\n${props}\n`);
  writeFileSync(
    LOG4J_CONFIG,
    `<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by scripts/local-stack.ts: broker logs go to a file, not the console -->
<Configuration status="warn">
  <Appenders>
    <RollingFile name="file" fileName="${BROKER_LOG}" filePattern="${BROKER_LOG}.%i">
      <PatternLayout pattern="[%d] %p %m (%c)%n"/>
      <Policies><SizeBasedTriggeringPolicy size="20 MB"/></Policies>
      <DefaultRolloverStrategy max="2"/>
    </RollingFile>
  </Appenders>
  <Loggers>
    <Root level="info"><AppenderRef ref="file"/></Root>
    <Logger name="kafka.request.logger" level="warn"/>
    <Logger name="state.change.logger" level="warn"/>
    <Logger name="kafka.log.LogCleaner" level="warn"/>
    <Logger name="org.apache.kafka.clients" level="warn"/>
  </Loggers>
</Configuration>
`,
  );
}

function javaBrokerArgs(): string[] {
  return [
    '-Xms256m',
    '-Xmx512m',
    '-XX:+UseG1GC',
    '-XX:MaxGCPauseMillis=20',
    '-XX:+ExitOnOutOfMemoryError',
    '-Djava.awt.headless=true',
    `-Dlog4j2.configurationFile=${LOG4J_CONFIG}`,
    `-Dkafka.logs.dir=${RUN_DIR}`,
    '-cp',
    `${KAFKA_LIBS}/*`,
  ];
}

function clusterId(): string {
  // Kafka Uuid: 16 random bytes, base64url without padding; a leading '-' would look like a CLI flag
  for (;;) {
    const id = randomBytes(16).toString('base64url');
    if (!id.startsWith('-')) return id;
  }
}

async function formatStorage(log: (l: string) => void): Promise<void> {
  const id = clusterId();
  log(`formatting KRaft storage in ${BROKER_DATA} (cluster id ${id})`);
  await runOrThrow(
    JAVA,
    [...javaBrokerArgs(), 'kafka.tools.StorageTool', 'format', '-t', id, '-c', SERVER_PROPERTIES, '--standalone'],
    RUN_DIR,
    'kafka-storage format',
  );
}

async function launchBroker(log: (l: string) => void, timeoutMs: number): Promise<void> {
  if (!existsSync(join(BROKER_DATA, 'meta.properties'))) await formatStorage(log);
  const t0 = Date.now();
  const child = spawnDetached('broker', JAVA, [...javaBrokerArgs(), 'kafka.Kafka', SERVER_PROPERTIES], RUN_DIR);
  log(`broker starting (pid ${child.pid}), log: ${BROKER_LOG}`);
  await waitForBroker([LOCAL_BROKER], timeoutMs, child.pid);
  log(`broker serves ${LOCAL_BROKER} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

async function startFreshBroker(log: (l: string) => void): Promise<void> {
  await ensureKafkaJars(log);
  await stopComponent('broker', log); // a stale/hung broker of ours
  rmSync(BROKER_DATA, { recursive: true, force: true });
  rmSync(BROKER_LOG, { force: true });
  rmSync(autostopFile('broker'), { force: true });
  rmSync(COMPONENTS.broker.outFile, { force: true });
  writeBrokerConfig();
  await launchBroker(log, 90_000);
}

// ---------------------------------------------------------------------------
// Registry

async function startRegistry(log: (l: string) => void): Promise<void> {
  const jar = await ensureApicurio(log);
  await stopComponent('registry', log);
  rmSync(COMPONENTS.registry.outFile, { force: true });
  rmSync(autostopFile('registry'), { force: true });
  const t0 = Date.now();
  const child = spawnDetached(
    'registry',
    JAVA,
    [
      '-Xms64m',
      '-Xmx384m',
      '-XX:+ExitOnOutOfMemoryError',
      '-Djava.awt.headless=true',
      `-Dquarkus.http.host=${HOST}`,
      `-Dquarkus.http.port=${REGISTRY_PORT}`,
      // in-memory storage: Apicurio 3.x SQL storage on an in-memory H2 database
      '-Dapicurio.storage.kind=sql',
      '-Dapicurio.storage.sql.kind=h2',
      '-Dapicurio.datasource.url=jdbc:h2:mem:registry_db',
      // allow DELETE through the ccompat API (off by default in 3.x)
      '-Dapicurio.rest.deletion.artifact.enabled=true',
      '-Dapicurio.rest.deletion.artifact-version.enabled=true',
      '-Dapicurio.rest.deletion.group.enabled=true',
      '-Dquarkus.http.access-log.enabled=false',
      '-jar',
      jar,
    ],
    APICURIO_HOME,
  );
  log(`registry starting (pid ${child.pid}), log: ${COMPONENTS.registry.outFile}`);
  await waitForRegistry(LOCAL_REGISTRY_URL, 120_000, child.pid);
  log(`registry serves ${LOCAL_REGISTRY_URL} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// ---------------------------------------------------------------------------
// Public API

/**
 * Returns brokers and a registry to talk to, starting them when needed:
 * 1. `KAFKA_BROKERS` set → use it (and `SCHEMA_REGISTRY_URL` as-is, '' when unset); started=false.
 * 2. Something already serves on the local ports → reuse it; started=false for that part.
 * 3. Otherwise download (if not cached) and start broker and/or registry; stop() stops exactly those
 *    (deferred to the last live user when other processes still use the same stack).
 */
export async function ensureStack(opts: StackOptions = {}): Promise<EnsureStackResult> {
  const log = opts.log ?? defaultLog;
  const envBrokers = process.env['KAFKA_BROKERS'];
  if (envBrokers !== undefined && envBrokers.trim() !== '') {
    return {
      endpoints: {
        brokers: envBrokers.split(',').map((b) => b.trim()).filter((b) => b !== ''),
        registryUrl: process.env['SCHEMA_REGISTRY_URL'] ?? '',
      },
      started: false,
      stop: async () => {},
    };
  }

  const startedNow: Component[] = [];
  let lease = '';
  const endpoints: StackEndpoints = { brokers: [LOCAL_BROKER], registryUrl: LOCAL_REGISTRY_URL };
  await withLock(log, async () => {
    let brokerUp = await brokerServes([LOCAL_BROKER]);
    if (!brokerUp && ownedPid('broker') === undefined && (await tcpOpen(HOST, BROKER_PORT))) {
      // someone else's process holds the port; give it a chance to finish starting
      log(`${LOCAL_BROKER} accepts connections but is not serving yet; waiting`);
      await waitForBroker([LOCAL_BROKER], 30_000).catch(() => {
        throw new Error(`port ${BROKER_PORT} is in use by something that does not answer as a Kafka broker (set WRIT_LOCAL_KAFKA_PORT)`);
      });
      brokerUp = true;
    }
    const registryUp = await registryServes(LOCAL_REGISTRY_URL);
    if (!registryUp && ownedPid('registry') === undefined && (await tcpOpen(HOST, REGISTRY_PORT))) {
      throw new Error(`port ${REGISTRY_PORT} is in use by something that does not answer ${LOCAL_REGISTRY_URL}/subjects (set WRIT_LOCAL_REGISTRY_PORT)`);
    }
    if (brokerUp) log(`reusing broker at ${LOCAL_BROKER}`);
    if (registryUp) log(`reusing registry at ${LOCAL_REGISTRY_URL}`);

    const tasks: Promise<void>[] = [];
    if (!brokerUp) {
      tasks.push(
        startFreshBroker(log).then(() => {
          startedNow.push('broker');
        }),
      );
    }
    if (!registryUp) {
      tasks.push(
        startRegistry(log).then(() => {
          startedNow.push('registry');
        }),
      );
    }
    const results = await Promise.allSettled(tasks);
    const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure !== undefined) {
      // leave nothing half-started behind
      if (!brokerUp) await stopComponent('broker', log).catch(noop);
      if (!registryUp) await stopComponent('registry', log).catch(noop);
      throw failure.reason;
    }
    lease = takeLease();
  });

  const mine = [...startedNow];
  let stopped = false;
  return {
    endpoints,
    started: mine.length > 0,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await withLock(log, async () => {
        const others = otherLiveLeases(lease);
        rmSync(lease, { force: true });
        const responsible = (['broker', 'registry'] as const).filter((c) => mine.includes(c) || existsSync(autostopFile(c)));
        if (others.length > 0) {
          for (const c of responsible) writeFileSync(autostopFile(c), `${process.pid}\n`);
          if (responsible.length > 0) log(`leaving ${responsible.join(' and ')} running for ${others.length} other user(s); the last one stops it`);
          return;
        }
        await Promise.all(
          responsible.map(async (c) => {
            await stopComponent(c, log);
            rmSync(autostopFile(c), { force: true });
          }),
        );
      });
    },
  };
}

/**
 * Stops a stack started earlier by ensureStack (in this or another process),
 * found through the pid files in .cache/run. SIGTERM, SIGKILL after 30 s; waits
 * until the JVMs are gone. Returns the pids it stopped.
 */
export async function stopStack(opts: StackOptions = {}): Promise<{ broker?: number; registry?: number }> {
  const log = opts.log ?? defaultLog;
  const [broker, registry] = await Promise.all([stopComponent('broker', log), stopComponent('registry', log)]);
  for (const c of ['broker', 'registry'] as const) rmSync(autostopFile(c), { force: true });
  const out: { broker?: number; registry?: number } = {};
  if (broker !== undefined) out.broker = broker;
  if (registry !== undefined) out.registry = registry;
  return out;
}

/** Hard kill (SIGKILL) of the local broker JVM; resolves once it is gone. Returns its pid. */
export async function killBroker(): Promise<number> {
  const pid = ownedPid('broker');
  if (pid === undefined) throw new Error('killBroker: no local broker started by scripts/local-stack.ts is running');
  signal(pid, 'SIGKILL');
  if (!(await waitForExit(pid, 10_000))) throw new Error(`killBroker: pid ${pid} still alive after SIGKILL`);
  rmSync(COMPONENTS.broker.pidFile, { force: true });
  return pid;
}

/**
 * (Re)starts the local broker on the same data dir and ports (no wipe, no
 * format unless the data dir was never formatted) and waits until it serves.
 * No-op if it already serves.
 */
export async function startBroker(opts: StackOptions & { timeoutMs?: number } = {}): Promise<void> {
  const log = opts.log ?? noop;
  if (ownedPid('broker') !== undefined && (await brokerServes([LOCAL_BROKER]))) return;
  await ensureKafkaJars(log);
  await stopComponent('broker', log);
  if (!existsSync(SERVER_PROPERTIES)) writeBrokerConfig();
  await launchBroker(log, opts.timeoutMs ?? 90_000);
}

/** Pid of the local broker JVM if one started by this module is running. */
export function brokerPid(): number | undefined {
  return ownedPid('broker');
}
