// A real Kafka (KRaft) cluster and a real Apicurio schema registry, started as
// plain JVM processes (no Docker). Jars come from Maven Central via `mvn`;
// everything lives under `.cache/` at the package root (the repo, or
// node_modules/writ when installed; `WRIT_LOCAL_STACK_CACHE` moves it).
// Part of `writ/testing`: for tests and demos, never for production.
//
// Two shapes (`ensureStack({ brokers })`):
// - 1 (default, what the test suite uses): one combined broker+controller node,
//   replication factor 1.
// - 3: three combined broker+controller nodes forming a dynamic 3-voter KRaft
//   quorum (KIP-853, formatted with `--initial-controllers`), with production-like
//   defaults: replication factor 3, min.insync.replicas 2 (also for the offsets,
//   transaction-state and share-state topics). Any one node can be killed, stopped
//   or paused: the quorum keeps a majority and every partition keeps 2 in-sync
//   replicas. Node n listens on WRIT_LOCAL_KAFKA_PORT + 2(n-1) (broker) and one
//   above that (controller), and keeps its files in `<stack dir>/node-<n>/`.
// One stack dir holds one shape at a time; use WRIT_LOCAL_STACK_DIR and
// WRIT_LOCAL_KAFKA_PORT for a second stack (`npm run kafka:up -- --brokers 3`
// uses .cache/run-3 and port 19192).
//
// Every stack's ports (these, the secure stack's, the fault suite's, the test
// files' own) lie below the range the OS draws the local ports of outgoing
// connections from (32768-60999 on Linux; 49152+ on macOS and Windows). A port
// of that range can be given to a client's or a sibling node's connection as
// its local port and held while the JVM is binding it: seen for node 2 of a
// three-node stack on 49192+ (a sibling's long-lived connection held 49194 through
// five starts), and for secure.test.ts's broker on 39592-39594 beside the other
// integration tests' hundreds of client connections.
//
// Library module: importing it has no side effects.

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';
import { Kafka, logLevel } from 'kafkajs';
import type { SecureStackInfo, SecureStackOptions } from './secure-stack.ts';

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
  /** With `secure`: the CA, the SCRAM users and their passwords, the registry's credentials (src/testing/secure-stack.ts). */
  secure?: SecureStackInfo;
}

export interface StackOptions {
  log?: (line: string) => void;
}

/** Kafka nodes of a local stack: 1 (the default) or 3. */
export type BrokerCount = 1 | 3;

export interface EnsureStackOptions extends StackOptions {
  /**
   * 1 (default): the single-node stack. 3: three combined broker+controller
   * nodes (replication factor 3, min.insync.replicas 2). Ignored when
   * KAFKA_BROKERS is set. A stack dir runs one shape at a time.
   */
  brokers?: BrokerCount;
  /**
   * The secure single node instead (src/testing/secure-stack.ts): a SASL_SSL
   * listener (SCRAM-SHA-512/256), a CA made at start, SCRAM users for the
   * owners and two agents, ACLs; the registry over HTTPS with basic auth. Its
   * own stack dir and ports (default .cache/run-secure, 19492, registry
   * 18481). KAFKA_BROKERS does not apply to it.
   */
  secure?: boolean | SecureStackOptions;
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

/** The nearest folder above this module with a package.json: the repo (src/testing/) or the package (dist/src/testing/). */
function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}
const ROOT = packageRoot();
export const CACHE_DIR = process.env['WRIT_LOCAL_STACK_CACHE'] ? resolve(process.env['WRIT_LOCAL_STACK_CACHE']) : join(ROOT, '.cache');
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
/** Holds "3" while the stack dir is laid out for three nodes; absent for the single node. */
const SIZE_FILE = join(RUN_DIR, 'cluster-size');
const MARKER = '.complete';

function portFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n <= 0 || n > 65534) throw new Error(`${name} must be a TCP port, got ${raw}`);
  return n;
}

const HOST = '127.0.0.1';
export const BROKER_PORT = portFromEnv('WRIT_LOCAL_KAFKA_PORT', 19092);
const CONTROLLER_PORT = BROKER_PORT + 1;
export const REGISTRY_PORT = portFromEnv('WRIT_LOCAL_REGISTRY_PORT', 18081);
export const LOCAL_BROKER = `${HOST}:${BROKER_PORT}`;
export const LOCAL_REGISTRY_URL = `http://${HOST}:${REGISTRY_PORT}/apis/ccompat/v7`;

const JAVA = process.env['JAVA_HOME'] ? join(process.env['JAVA_HOME'], 'bin', 'java') : 'java';

type Component = 'broker' | 'registry';

interface ComponentSpec {
  /** For log lines: 'broker', 'broker node 2', 'registry'. */
  name: string;
  pidFile: string;
  outFile: string;
  /** Substrings that /proc/<pid>/cmdline must contain for the pid to be ours. */
  signature: () => string[];
}

const COMPONENTS: Record<Component, ComponentSpec> = {
  broker: {
    name: 'broker',
    pidFile: join(RUN_DIR, 'broker.pid'),
    outFile: join(RUN_DIR, 'broker.out'),
    signature: () => ['kafka.Kafka', SERVER_PROPERTIES],
  },
  registry: {
    name: 'registry',
    pidFile: join(RUN_DIR, 'registry.pid'),
    outFile: join(RUN_DIR, 'registry.out'),
    signature: () => [APICURIO_HOME],
  },
};
const BROKER_LOG = join(RUN_DIR, 'broker.log');

/** Where one Kafka node lives: ports, files, pid. */
interface NodeLayout {
  nodeId: number;
  brokerPort: number;
  controllerPort: number;
  /** host:port of its PLAINTEXT listener. */
  address: string;
  /** Its working dir (kafka.logs.dir); RUN_DIR for the single node. */
  dir: string;
  dataDir: string;
  propsFile: string;
  log4jFile: string;
  logFile: string;
  spec: ComponentSpec;
}

/** The single node keeps today's file names directly under RUN_DIR; node n of three lives in RUN_DIR/node-n. */
function nodeLayout(size: BrokerCount, nodeId: number): NodeLayout {
  if (size === 1) {
    if (nodeId !== 1) throw new Error(`the single-node stack has only node 1, not ${nodeId}`);
    return {
      nodeId: 1,
      brokerPort: BROKER_PORT,
      controllerPort: CONTROLLER_PORT,
      address: LOCAL_BROKER,
      dir: RUN_DIR,
      dataDir: BROKER_DATA,
      propsFile: SERVER_PROPERTIES,
      log4jFile: LOG4J_CONFIG,
      logFile: BROKER_LOG,
      spec: COMPONENTS.broker,
    };
  }
  if (!Number.isInteger(nodeId) || nodeId < 1 || nodeId > size) throw new Error(`node id must be 1..${size}, got ${nodeId}`);
  const dir = join(RUN_DIR, `node-${nodeId}`);
  const brokerPort = BROKER_PORT + 2 * (nodeId - 1);
  if (brokerPort + 1 > 65535) throw new Error(`WRIT_LOCAL_KAFKA_PORT ${BROKER_PORT} leaves no room for ${size} nodes (2 ports each)`);
  const propsFile = join(dir, 'server.properties');
  return {
    nodeId,
    brokerPort,
    controllerPort: brokerPort + 1,
    address: `${HOST}:${brokerPort}`,
    dir,
    dataDir: join(dir, 'kafka-data'),
    propsFile,
    log4jFile: join(dir, 'log4j2.xml'),
    logFile: join(dir, 'broker.log'),
    spec: {
      name: `broker node ${nodeId}`,
      pidFile: join(dir, 'broker.pid'),
      outFile: join(dir, 'broker.out'),
      signature: () => ['kafka.Kafka', propsFile],
    },
  };
}

function clusterLayout(size: BrokerCount): NodeLayout[] {
  return Array.from({ length: size }, (_, i) => nodeLayout(size, i + 1));
}

function brokerCount(n: number | undefined): BrokerCount {
  if (n === undefined || n === 1) return 1;
  if (n === 3) return 3;
  throw new Error(`brokers must be 1 or 3, got ${String(n)}`);
}

/** The shape the stack dir is laid out for (the size file; the single node when absent). */
function stackSize(): BrokerCount {
  try {
    return readFileSync(SIZE_FILE, 'utf8').trim() === '3' ? 3 : 1;
  } catch {
    return 1;
  }
}

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
function ownedPid(spec: ComponentSpec): number | undefined {
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
async function stopComponent(spec: ComponentSpec, log: (l: string) => void, termTimeoutMs = 30_000): Promise<number | undefined> {
  const pid = ownedPid(spec);
  if (pid === undefined) {
    rmSync(spec.pidFile, { force: true });
    return undefined;
  }
  log(`stopping ${spec.name} (pid ${pid})`);
  signal(pid, 'SIGCONT'); // a paused JVM would not act on SIGTERM
  signal(pid, 'SIGTERM');
  if (!(await waitForExit(pid, termTimeoutMs))) {
    log(`${spec.name} (pid ${pid}) ignored SIGTERM for ${termTimeoutMs} ms; sending SIGKILL`);
    signal(pid, 'SIGKILL');
    if (!(await waitForExit(pid, 10_000))) throw new Error(`${spec.name} (pid ${pid}) did not exit after SIGKILL`);
  }
  rmSync(spec.pidFile, { force: true });
  return pid;
}

/** What a JVM logs when a port it must listen on is taken (Kafka's acceptor; Quarkus's HTTP server). */
const PORT_CLASH = /java\.net\.BindException|Address already in use|seems to be in use by another process/;

/**
 * Runs `launch` (spawn a JVM, wait until it serves) again when it failed
 * because a port was taken, up to `attempts` times, 2 s apart. The stacks'
 * ports are fixed; the defaults lie below the ephemeral range (header), but a
 * port set by hand may not, and any process's outgoing connection can hold
 * such a port as its local port for a while; a JVM that meets that exits at
 * once, and a later start binds.
 * Each failed attempt's logs are kept beside, renamed `<file>.port-clash-<n>`.
 */
async function retryOnPortClash(what: string, logFiles: readonly string[], launch: () => Promise<void>, log: (l: string) => void, attempts = 5): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await launch();
    } catch (err) {
      const clash = logFiles.some((f) => existsSync(f) && PORT_CLASH.test(readFileSync(f, 'utf8').slice(-1_000_000)));
      if (!clash || attempt >= attempts) throw err;
      for (const f of logFiles) if (existsSync(f)) renameSync(f, `${f}.port-clash-${attempt}`);
      log(`${what}: a port it listens on was taken (an outgoing connection can hold one for a moment); starting it again in 2 s (attempt ${attempt + 1} of ${attempts})`);
      await sleep(2000);
    }
  }
}

function spawnDetached(spec: ComponentSpec, cmd: string, args: string[], cwd: string): ChildProcess {
  mkdirSync(dirname(spec.pidFile), { recursive: true });
  const fd = openSync(spec.outFile, 'a');
  try {
    const child = spawn(cmd, args, { cwd, detached: true, stdio: ['ignore', fd, fd] });
    if (child.pid === undefined) throw new Error(`could not spawn ${cmd} for ${spec.name}`);
    writeFileSync(spec.pidFile, `${child.pid}\n`);
    child.on('error', noop);
    child.unref();
    return child;
  } finally {
    closeSync(fd);
  }
}

/**
 * After a SIGKILL the JVM's main thread can already show as a zombie while its
 * other threads still hold the listening sockets; waits until nothing accepts on
 * `ports` (at most `timeoutMs`), so a restart on the same ports cannot collide.
 */
async function waitForPortsClosed(ports: number[], timeoutMs = 10_000): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  for (const port of ports) {
    while ((await tcpOpen(HOST, port, 500)) && Date.now() < deadline) await sleep(100);
  }
}

/**
 * Whether something listens on host:port. A connection to itself does not
 * count: a port inside Linux's ephemeral range (the stacks' were, until
 * 2026-12-01; WRIT_LOCAL_KAFKA_PORT may still put one there), and a connect to
 * one that nobody listens on can be given that very port as its local port
 * (TCP simultaneous open), which succeeds and then holds the port the JVM is
 * about to bind (seen here: a broker start failing five times in a row with
 * "Address already in use" and a 39092 → 39092 connection in TIME-WAIT). The
 * socket is closed at once; the TIME-WAIT it leaves does not stop the JVM's
 * bind (its server sockets set SO_REUSEADDR).
 */
function tcpOpen(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
  return new Promise((resolvePromise) => {
    const socket = connect({ host, port });
    const done = (ok: boolean): void => {
      socket.destroy();
      resolvePromise(ok);
    };
    socket.setTimeout(timeoutMs, () => done(false));
    socket.once('connect', () => done(!isSelfConnection(socket)));
    socket.once('error', () => done(false));
  });
}

/** A TCP connection whose two ends are the same address and port. */
export function isSelfConnection(socket: { localAddress?: string; localPort?: number; remoteAddress?: string; remotePort?: number }): boolean {
  return socket.localPort === socket.remotePort && socket.localAddress === socket.remoteAddress;
}

/** Every `host:port` of `brokers` has a listener (not a connection to itself). */
async function listening(brokers: string[]): Promise<boolean> {
  for (const b of brokers) {
    const at = b.lastIndexOf(':');
    if (!(await tcpOpen(b.slice(0, at), Number(b.slice(at + 1))))) return false;
  }
  return true;
}

/** One describeCluster round trip: the live (unfenced) broker ids and the controller, or undefined. */
async function describe(brokers: string[], timeoutMs = 5000): Promise<{ brokerIds: number[]; controller: number } | undefined> {
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
    return { brokerIds: cluster.brokers.map((b) => b.nodeId).sort((a, b) => a - b), controller: cluster.controller ?? -1 };
  } catch {
    return undefined;
  } finally {
    await admin.disconnect().catch(noop);
  }
}

/**
 * True when `brokers` answer describeCluster with a controller and at least one
 * broker, and with every id in `expectIds` among the live brokers.
 */
async function brokerServes(brokers: string[], expectIds: number[] = [], timeoutMs = 5000): Promise<boolean> {
  // kafkajs would hold a connection to itself for its whole request timeout; check for a listener first.
  if (!(await listening(brokers))) return false;
  const cluster = await describe(brokers, timeoutMs);
  if (cluster === undefined) return false;
  return cluster.brokerIds.length > 0 && cluster.controller >= 0 && expectIds.every((id) => cluster.brokerIds.includes(id));
}

/**
 * Waits until the broker at `brokers` answers describeCluster. Throws after
 * `timeoutMs` (default 90 s) with the tail of the local broker log.
 */
export async function waitForBroker(brokers: string[] = [LOCAL_BROKER], timeoutMs = 90_000, pid?: number): Promise<void> {
  await waitForNode(nodeLayout(stackSize(), 1), timeoutMs, pid, [], brokers);
}

/**
 * Waits until node `node` (or `via`) answers describeCluster listing every id in
 * `expectIds` as a live (registered, unfenced) broker.
 */
async function waitForNode(node: NodeLayout, timeoutMs: number, pid: number | undefined, expectIds: number[], via: string[] = [node.address]): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const logs = (): string => `--- ${node.spec.outFile}\n${tail(node.spec.outFile)}\n--- ${node.logFile}\n${tail(node.logFile)}`;
  while (Date.now() < deadline) {
    if (await brokerServes(via, expectIds)) return;
    if (pid !== undefined && !isAlive(pid)) {
      throw new Error(`${node.spec.name} JVM (pid ${pid}) exited during startup.\n${logs()}`);
    }
    await sleep(500);
  }
  const what = expectIds.length > 0 ? ` listing brokers ${expectIds.join(',')}` : '';
  throw new Error(`${node.spec.name} ${via.join(',')} did not answer describeCluster${what} within ${timeoutMs} ms.\n${logs()}`);
}

async function registryServes(url: string, timeoutMs = 2000): Promise<boolean> {
  const { hostname, port } = new URL(url);
  if (!(await listening([`${hostname}:${port || '80'}`]))) return false;
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
<!-- generated by src/testing/local-stack.ts -->
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

/** The broker's log4j2 configuration: logs go to a rolling file, not the console; chatty loggers at warn. */
function brokerLog4jConfig(logFile: string, generator: string): string {
  return `<?xml version="1.0" encoding="UTF-8"?>
<!-- generated by ${generator}: broker logs go to a file, not the console -->
<Configuration status="warn">
  <Appenders>
    <RollingFile name="file" fileName="${logFile}" filePattern="${logFile}.%i">
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
`;
}

/**
 * The exact broker settings (combined broker+controller, KRaft). Without
 * arguments: the single node. `{ brokers: 3, nodeId }`: node `nodeId` of the
 * three-node cluster (the single node's settings with its own ports and data
 * dir, all three controllers as quorum bootstrap servers, and replication
 * factor 3 / min.insync.replicas 2 everywhere).
 */
export function brokerProperties(opts: { brokers?: BrokerCount; nodeId?: number } = {}): Record<string, string | number | boolean> {
  const size = brokerCount(opts.brokers);
  const single = singleNodeProperties();
  if (size === 1) return single;
  const node = nodeLayout(size, opts.nodeId ?? 1);
  const voters = clusterLayout(size).map((n) => `${HOST}:${n.controllerPort}`);
  return {
    ...single,
    'node.id': node.nodeId,
    'listeners': `PLAINTEXT://${HOST}:${node.brokerPort},CONTROLLER://${HOST}:${node.controllerPort}`,
    'advertised.listeners': `PLAINTEXT://${HOST}:${node.brokerPort}`,
    // dynamic quorum (KIP-853) of all three; storage is formatted with --initial-controllers
    'controller.quorum.bootstrap.servers': voters.join(','),
    'log.dirs': node.dataDir,
    'default.replication.factor': 3,
    'min.insync.replicas': 2,
    'offsets.topic.replication.factor': 3,
    'transaction.state.log.replication.factor': 3,
    'transaction.state.log.min.isr': 2,
    'share.coordinator.state.topic.replication.factor': 3,
    'share.coordinator.state.topic.min.isr': 2,
  };
}

function singleNodeProperties(): Record<string, string | number | boolean> {
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

function writeBrokerConfig(node: NodeLayout = nodeLayout(1, 1), size: BrokerCount = 1): void {
  mkdirSync(node.dir, { recursive: true });
  writeBrokerFiles(node, brokerProperties({ brokers: size, nodeId: node.nodeId }), 'src/testing/local-stack.ts');
}

/** A broker's server.properties and log4j2 configuration, marked as generated by `generator`. */
export function writeBrokerFiles(
  files: { propsFile: string; log4jFile: string; logFile: string },
  properties: Record<string, string | number | boolean>,
  generator: string,
): void {
  const props = Object.entries(properties)
    .map(([k, v]) => `${k}=${String(v)}`)
    .join('\n');
  writeFileSync(files.propsFile, `# generated by ${generator}\n${props}\n`);
  writeFileSync(files.log4jFile, brokerLog4jConfig(files.logFile, generator));
}

/** The JVM arguments of a broker (heap, GC, its log4j2 file and log directory, Kafka's jars). */
export function javaBrokerArgs(node: { log4jFile: string; dir: string } = nodeLayout(1, 1)): string[] {
  return [
    '-Xms256m',
    '-Xmx512m',
    '-XX:+UseG1GC',
    '-XX:MaxGCPauseMillis=20',
    '-XX:+ExitOnOutOfMemoryError',
    '-Djava.awt.headless=true',
    `-Dlog4j2.configurationFile=${node.log4jFile}`,
    `-Dkafka.logs.dir=${node.dir}`,
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
  await retryOnPortClash('broker', [BROKER_LOG, COMPONENTS.broker.outFile], async () => {
    const child = spawnDetached(COMPONENTS.broker, JAVA, [...javaBrokerArgs(), 'kafka.Kafka', SERVER_PROPERTIES], RUN_DIR);
    log(`broker starting (pid ${child.pid}), log: ${BROKER_LOG}`);
    await waitForBroker([LOCAL_BROKER], timeoutMs, child.pid);
  }, log);
  log(`broker serves ${LOCAL_BROKER} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

async function startFreshBroker(log: (l: string) => void): Promise<void> {
  await ensureKafkaJars(log);
  await stopComponent(COMPONENTS.broker, log); // a stale/hung broker of ours
  rmSync(BROKER_DATA, { recursive: true, force: true });
  rmSync(BROKER_LOG, { force: true });
  rmSync(autostopFile('broker'), { force: true });
  rmSync(COMPONENTS.broker.outFile, { force: true });
  rmSync(SIZE_FILE, { force: true });
  writeBrokerConfig();
  await launchBroker(log, 90_000);
}

/** Starts node `node` of the three-node cluster on its (formatted) data dir; waits until it serves as a live broker. */
async function launchClusterNode(node: NodeLayout, log: (l: string) => void, timeoutMs: number, expectIds: number[] = [node.nodeId]): Promise<void> {
  if (!existsSync(join(node.dataDir, 'meta.properties'))) {
    throw new Error(`${node.spec.name}: ${node.dataDir} is not formatted; start the cluster with ensureStack({ brokers: 3 })`);
  }
  const t0 = Date.now();
  await retryOnPortClash(node.spec.name, [node.logFile, node.spec.outFile], async () => {
    const child = spawnDetached(node.spec, JAVA, [...javaBrokerArgs(node), 'kafka.Kafka', node.propsFile], node.dir);
    log(`${node.spec.name} starting (pid ${child.pid}), log: ${node.logFile}`);
    await waitForNode(node, timeoutMs, child.pid, expectIds);
  }, log);
  log(`${node.spec.name} serves ${node.address} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

/**
 * A new three-node cluster: wipes the nodes' data, formats all three with the
 * same cluster id and `--initial-controllers` (a dynamic 3-voter quorum),
 * starts them together and waits until every node sees all three as live brokers.
 */
async function startFreshCluster(nodes: NodeLayout[], log: (l: string) => void): Promise<void> {
  const size = brokerCount(nodes.length);
  await ensureKafkaJars(log);
  await stopCluster(nodes, log); // stale/hung nodes of ours
  for (const n of nodes) {
    rmSync(n.dataDir, { recursive: true, force: true });
    rmSync(n.logFile, { force: true });
    rmSync(n.spec.outFile, { force: true });
  }
  rmSync(autostopFile('broker'), { force: true });
  mkdirSync(RUN_DIR, { recursive: true });
  writeFileSync(SIZE_FILE, `${size}\n`);
  for (const n of nodes) writeBrokerConfig(n, size);
  const id = clusterId();
  // id@host:port:directory-id, identical for every node (the directory id is that voter's metadata log dir)
  const initialControllers = nodes.map((n) => `${n.nodeId}@${HOST}:${n.controllerPort}:${clusterId()}`).join(',');
  const t0 = Date.now();
  log(`formatting KRaft storage of ${size} nodes (cluster id ${id}, initial controllers ${initialControllers})`);
  await Promise.all(
    nodes.map((n) =>
      runOrThrow(
        JAVA,
        // C1 only: the short-lived tool starts about twice as fast
        [...javaBrokerArgs(n), '-XX:TieredStopAtLevel=1', 'kafka.tools.StorageTool', 'format', '-t', id, '-c', n.propsFile, '--initial-controllers', initialControllers],
        n.dir,
        `kafka-storage format (${n.spec.name})`,
      ),
    ),
  );
  log(`formatted (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
  const ids = nodes.map((n) => n.nodeId);
  const t1 = Date.now();
  await Promise.all(nodes.map((n) => launchClusterNode(n, log, 120_000, ids)));
  log(`${size} brokers serve ${nodes.map((n) => n.address).join(',')} (${((Date.now() - t1) / 1000).toFixed(1)} s)`);
}

/** Our broker JVMs in this stack dir that belong to the other shape (1 vs 3 nodes). */
function otherShapeRunning(size: BrokerCount): NodeLayout[] {
  const other: BrokerCount = size === 1 ? 3 : 1;
  return clusterLayout(other).filter((n) => ownedPid(n.spec) !== undefined);
}

function shapeMismatch(size: BrokerCount, running: NodeLayout[]): Error {
  const other = size === 1 ? 3 : 1;
  return new Error(
    `${RUN_DIR} runs a ${other}-node Kafka stack (${running.map((n) => `${n.spec.name} on ${n.address}`).join(', ')}), ` +
      `not the ${size}-node one asked for; stop it (npm run kafka:down${other === 3 ? ' -- --brokers 3' : ''}) ` +
      'or use another WRIT_LOCAL_STACK_DIR and WRIT_LOCAL_KAFKA_PORT',
  );
}

/**
 * Stops all nodes of the three-node cluster: SIGTERM to all, SIGKILL to those
 * left after 5 s. Once a majority of the voters is gone, a combined node cannot
 * finish its controlled shutdown (its broker waits for a controller quorum that
 * no longer exists, for minutes), so the last one or two always need the kill;
 * the data dirs are wiped on the next fresh start anyway. Returns pid by node id.
 */
async function stopCluster(nodes: NodeLayout[], log: (l: string) => void): Promise<Record<number, number>> {
  const pids = await Promise.all(nodes.map((n) => stopComponent(n.spec, log, 5000)));
  const out: Record<number, number> = {};
  nodes.forEach((n, i) => {
    const pid = pids[i];
    if (pid !== undefined) out[n.nodeId] = pid;
  });
  return out;
}

// ---------------------------------------------------------------------------
// Registry

/** The registry's H2 database: a file, so a registry restart keeps its schemas and ids, as a real deployment's would. */
const REGISTRY_DB = join(RUN_DIR, 'registry-db', 'registry');

/**
 * The JVM arguments of an Apicurio 3.x registry: heap, SQL storage on the H2
 * database at `datasourceUrl` (a file survives a restart of the registry),
 * no access log; `http` sets its listeners, `extra` adds properties.
 */
export function registryJvmArgs(jar: string, datasourceUrl: string, http: string[], extra: string[] = []): string[] {
  return [
    '-Xms64m',
    '-Xmx384m',
    '-XX:+ExitOnOutOfMemoryError',
    '-Djava.awt.headless=true',
    `-Dquarkus.http.host=${HOST}`,
    ...http,
    '-Dapicurio.storage.kind=sql',
    '-Dapicurio.storage.sql.kind=h2',
    `-Dapicurio.datasource.url=${datasourceUrl}`,
    ...extra,
    '-Dquarkus.http.access-log.enabled=false',
    '-jar',
    jar,
  ];
}

/**
 * Starts our registry JVM (stopping a stale one of ours first). Storage is an
 * H2 database in a file under the stack dir: `fresh` (a new stack) starts
 * with no schemas; a restart (`startRegistry`) keeps them, with their ids.
 */
async function launchRegistry(log: (l: string) => void, timeoutMs = 120_000, fresh = true): Promise<void> {
  const jar = await ensureApicurio(log);
  if (fresh) rmSync(dirname(REGISTRY_DB), { recursive: true, force: true });
  mkdirSync(dirname(REGISTRY_DB), { recursive: true });
  await stopComponent(COMPONENTS.registry, log);
  rmSync(COMPONENTS.registry.outFile, { force: true });
  rmSync(autostopFile('registry'), { force: true });
  const t0 = Date.now();
  await retryOnPortClash('registry', [COMPONENTS.registry.outFile], async () => {
    const child = spawnDetached(
      COMPONENTS.registry,
      JAVA,
      registryJvmArgs(jar, `jdbc:h2:file:${REGISTRY_DB}`, [`-Dquarkus.http.port=${REGISTRY_PORT}`], [
        // allow DELETE through the ccompat API (off by default in 3.x)
        '-Dapicurio.rest.deletion.artifact.enabled=true',
        '-Dapicurio.rest.deletion.artifact-version.enabled=true',
        '-Dapicurio.rest.deletion.group.enabled=true',
      ]),
      APICURIO_HOME,
    );
    log(`registry starting (pid ${child.pid}), log: ${COMPONENTS.registry.outFile}`);
    await waitForRegistry(LOCAL_REGISTRY_URL, timeoutMs, child.pid);
  }, log);
  log(`registry serves ${LOCAL_REGISTRY_URL} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// ---------------------------------------------------------------------------
// Public API

/**
 * Returns brokers and a registry to talk to, starting them when needed:
 * 1. `KAFKA_BROKERS` set → use it (and `SCHEMA_REGISTRY_URL` as-is, '' when unset); started=false.
 * 2. Something already serves on the local ports → reuse it; started=false for that part.
 * 3. Otherwise download (if not cached) and start broker(s) and/or registry; stop() stops exactly those
 *    (deferred to the last live user when other processes still use the same stack).
 *
 * `brokers: 3` starts three combined broker+controller nodes (see the top of this
 * file) and returns all three addresses. A stack dir runs one shape at a time:
 * asking for the other shape while one runs there throws.
 */
export async function ensureStack(opts: EnsureStackOptions = {}): Promise<EnsureStackResult> {
  const log = opts.log ?? defaultLog;
  if (opts.secure !== undefined && opts.secure !== false) {
    if (opts.brokers !== undefined && opts.brokers !== 1) throw new Error('the secure stack has one node (brokers: 1)');
    const { ensureSecureStack } = await import('./secure-stack.ts');
    return ensureSecureStack({ log, ...(opts.secure === true ? {} : opts.secure) });
  }
  const size = brokerCount(opts.brokers);
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

  const nodes = clusterLayout(size);
  const startedNow: Component[] = [];
  let lease = '';
  const endpoints: StackEndpoints = { brokers: nodes.map((n) => n.address), registryUrl: LOCAL_REGISTRY_URL };
  await withLock(log, async () => {
    const otherShape = otherShapeRunning(size);
    if (otherShape.length > 0) throw shapeMismatch(size, otherShape);
    const brokerUp = size === 1 ? await singleBrokerUp(log) : await clusterUp(nodes, log);
    const registryUp = await registryServes(LOCAL_REGISTRY_URL);
    if (!registryUp && ownedPid(COMPONENTS.registry) === undefined && (await tcpOpen(HOST, REGISTRY_PORT))) {
      throw new Error(`port ${REGISTRY_PORT} is in use by something that does not answer ${LOCAL_REGISTRY_URL}/subjects (set WRIT_LOCAL_REGISTRY_PORT)`);
    }
    if (brokerUp) log(`reusing ${size === 1 ? 'broker' : `${size} brokers`} at ${endpoints.brokers.join(',')}`);
    if (registryUp) log(`reusing registry at ${LOCAL_REGISTRY_URL}`);

    const tasks: Promise<void>[] = [];
    if (!brokerUp) {
      tasks.push(
        (size === 1 ? startFreshBroker(log) : startFreshCluster(nodes, log)).then(() => {
          startedNow.push('broker');
        }),
      );
    }
    if (!registryUp) {
      tasks.push(
        launchRegistry(log).then(() => {
          startedNow.push('registry');
        }),
      );
    }
    const results = await Promise.allSettled(tasks);
    const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure !== undefined) {
      // leave nothing half-started behind
      if (!brokerUp) await (size === 1 ? stopComponent(COMPONENTS.broker, log) : stopCluster(nodes, log)).catch(noop);
      if (!registryUp) await stopComponent(COMPONENTS.registry, log).catch(noop);
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
            if (c === 'broker') await (size === 1 ? stopComponent(COMPONENTS.broker, log) : stopCluster(nodes, log));
            else await stopComponent(COMPONENTS.registry, log);
            rmSync(autostopFile(c), { force: true });
          }),
        );
      });
    },
  };
}

/** The single node: does it serve (reused), or must it be started? (today's rules, unchanged) */
async function singleBrokerUp(log: (l: string) => void): Promise<boolean> {
  let brokerUp = await brokerServes([LOCAL_BROKER]);
  if (!brokerUp && ownedPid(COMPONENTS.broker) === undefined && (await tcpOpen(HOST, BROKER_PORT))) {
    // someone else's process holds the port; give it a chance to finish starting
    log(`${LOCAL_BROKER} accepts connections but is not serving yet; waiting`);
    await waitForBroker([LOCAL_BROKER], 30_000).catch(() => {
      throw new Error(`port ${BROKER_PORT} is in use by something that does not answer as a Kafka broker (set WRIT_LOCAL_KAFKA_PORT)`);
    });
    brokerUp = true;
  }
  return brokerUp;
}

/**
 * Three nodes: reused when every node serves and sees all of them as live
 * brokers. A port held by a process that is not one of our nodes is an error
 * (a foreign process or another stack). When some of our nodes run but not all
 * serve while other processes hold leases on this stack (one of them may be
 * restarting a node it killed), waits up to 60 s; otherwise the cluster is
 * started afresh.
 */
async function clusterUp(nodes: NodeLayout[], log: (l: string) => void): Promise<boolean> {
  const ids = nodes.map((n) => n.nodeId);
  const allServe = async (): Promise<boolean> => (await Promise.all(nodes.map((n) => brokerServes([n.address], ids)))).every(Boolean);
  if (await allServe()) return true;
  for (const n of nodes) {
    if (ownedPid(n.spec) !== undefined) continue;
    for (const port of [n.brokerPort, n.controllerPort]) {
      if (await tcpOpen(HOST, port)) {
        throw new Error(`port ${port} (${n.spec.name}) is in use by a process that is not that node of the stack in ${RUN_DIR} (set WRIT_LOCAL_STACK_DIR and WRIT_LOCAL_KAFKA_PORT)`);
      }
    }
  }
  const oursAlive = nodes.filter((n) => ownedPid(n.spec) !== undefined);
  if (oursAlive.length > 0 && otherLiveLeases('').length > 0) {
    log(`${oursAlive.length} of ${nodes.length} nodes run but the cluster is not whole, and other processes use it; waiting up to 60 s`);
    const deadline = Date.now() + 60_000;
    while (Date.now() < deadline) {
      if (await allServe()) return true;
      await sleep(1000);
    }
    throw new Error(`the ${nodes.length}-node cluster in ${RUN_DIR} is in use by other processes but not all nodes serve; not restarting it under them`);
  }
  return false;
}

/**
 * Stops a stack started earlier by ensureStack (in this or another process),
 * found through the pid files in the stack dir (either shape). SIGTERM, SIGKILL
 * after 30 s (5 s for the three nodes, see stopCluster); waits until the JVMs
 * are gone. Returns the pids it stopped:
 * `broker` for the single node, `nodes` (pid by node id) for the three nodes.
 */
export async function stopStack(opts: StackOptions = {}): Promise<{ broker?: number; nodes?: Record<number, number>; registry?: number }> {
  const log = opts.log ?? defaultLog;
  const single = nodeLayout(1, 1);
  const [broker, nodes, registry] = await Promise.all([
    stopComponent(single.spec, log),
    stopCluster(clusterLayout(3), log),
    stopComponent(COMPONENTS.registry, log),
  ]);
  for (const c of ['broker', 'registry'] as const) rmSync(autostopFile(c), { force: true });
  const out: { broker?: number; nodes?: Record<number, number>; registry?: number } = {};
  if (broker !== undefined) out.broker = broker;
  if (Object.keys(nodes).length > 0) out.nodes = nodes;
  if (registry !== undefined) out.registry = registry;
  return out;
}

/** Node `nodeId` (default: the only/first node) of the shape this stack dir runs. */
function currentNode(nodeId: number | undefined, what: string): NodeLayout {
  const size = stackSize();
  try {
    return nodeLayout(size, nodeId ?? 1);
  } catch (err) {
    throw new Error(`${what}: ${(err as Error).message} (stack dir ${RUN_DIR} runs ${size} node${size === 1 ? '' : 's'})`);
  }
}

function runningNode(nodeId: number | undefined, what: string): { node: NodeLayout; pid: number } {
  const node = currentNode(nodeId, what);
  const pid = ownedPid(node.spec);
  if (pid === undefined) throw new Error(`${what}: no local ${node.spec.name} started by src/testing/local-stack.ts is running`);
  return { node, pid };
}

/**
 * Hard kill (SIGKILL) of a local broker JVM (`nodeId`, default the only/first
 * node); resolves once it is gone. Returns its pid.
 */
export async function killBroker(nodeId?: number): Promise<number> {
  const { node, pid } = runningNode(nodeId, 'killBroker');
  signal(pid, 'SIGKILL');
  if (!(await waitForExit(pid, 10_000))) throw new Error(`killBroker: pid ${pid} still alive after SIGKILL`);
  rmSync(node.spec.pidFile, { force: true });
  await waitForPortsClosed([node.brokerPort, node.controllerPort]);
  return pid;
}

/**
 * Clean stop (SIGTERM: controlled shutdown, leaders move away first) of one
 * node; SIGKILL if it has not exited after `timeoutMs` (default 30 s). Returns
 * its pid.
 */
export async function stopBroker(nodeId: number, opts: StackOptions & { timeoutMs?: number } = {}): Promise<number> {
  const { node } = runningNode(nodeId, 'stopBroker');
  const pid = await stopComponent(node.spec, opts.log ?? noop, opts.timeoutMs ?? 30_000);
  if (pid === undefined) throw new Error(`stopBroker: node ${nodeId} exited before it was stopped`);
  await waitForPortsClosed([node.brokerPort, node.controllerPort]);
  return pid;
}

/**
 * Freezes one node (SIGSTOP): its sockets stay open but it answers nothing and
 * stops heartbeating, so the controller fences it after broker.session.timeout.ms
 * (5 s). Returns its pid. Undo with resumeBroker.
 */
export function pauseBroker(nodeId: number): number {
  const { pid } = runningNode(nodeId, 'pauseBroker');
  signal(pid, 'SIGSTOP');
  return pid;
}

/** SIGCONT to a node paused with pauseBroker. Returns its pid. */
export function resumeBroker(nodeId: number): number {
  const { pid } = runningNode(nodeId, 'resumeBroker');
  signal(pid, 'SIGCONT');
  return pid;
}

/**
 * (Re)starts a local broker (`nodeId`, default the only/first node) on the same
 * data dir and ports (no wipe; the single node is formatted only if its data dir
 * never was) and waits until it serves; a node of the three-node cluster until it
 * is a live (unfenced) broker again. No-op if it already serves.
 */
export async function startBroker(opts: StackOptions & { timeoutMs?: number; nodeId?: number } = {}): Promise<void> {
  const log = opts.log ?? noop;
  const size = stackSize();
  const node = currentNode(opts.nodeId, 'startBroker');
  if (size === 1) {
    if (ownedPid(COMPONENTS.broker) !== undefined && (await brokerServes([LOCAL_BROKER]))) return;
    await ensureKafkaJars(log);
    await stopComponent(COMPONENTS.broker, log);
    if (!existsSync(SERVER_PROPERTIES)) writeBrokerConfig();
    await launchBroker(log, opts.timeoutMs ?? 90_000);
    return;
  }
  if (ownedPid(node.spec) !== undefined && (await brokerServes([node.address], [node.nodeId]))) return;
  await ensureKafkaJars(log);
  await stopComponent(node.spec, log);
  if (!existsSync(node.propsFile)) writeBrokerConfig(node, size);
  await launchClusterNode(node, log, opts.timeoutMs ?? 90_000);
}

/** Pid of a local broker JVM (`nodeId`, default the only/first node) if one started by this module is running. */
export function brokerPid(nodeId?: number): number | undefined {
  return ownedPid(currentNode(nodeId, 'brokerPid').spec);
}

/** Pid (undefined when not running) of every node of the shape this stack dir runs, by node id. */
export function brokerPids(): Record<number, number | undefined> {
  const out: Record<number, number | undefined> = {};
  for (const n of clusterLayout(stackSize())) out[n.nodeId] = ownedPid(n.spec);
  return out;
}

/**
 * Leader, replicas and in-sync replicas of one partition, from a fresh metadata
 * request. Asks every broker in `brokers` at once and takes the first answer: a
 * kafkajs client keeps retrying one seed broker on request timeouts, so a single
 * client would hang on a paused (SIGSTOP) node whose kernel still accepts
 * connections.
 */
export async function partitionInfo(
  brokers: string[],
  topic: string,
  partition: number,
): Promise<{ leader: number; replicas: number[]; isr: number[]; offlineReplicas: number[] }> {
  const via = async (broker: string) => {
    const kafka = new Kafka({
      clientId: 'writ-local-stack',
      brokers: [broker],
      logLevel: logLevel.NOTHING,
      connectionTimeout: 1000,
      requestTimeout: 3000,
      retry: { retries: 2, initialRetryTime: 200 },
    });
    const admin = kafka.admin();
    try {
      await admin.connect();
      const { topics } = await admin.fetchTopicMetadata({ topics: [topic] });
      const p = topics.find((t) => t.name === topic)?.partitions.find((x) => x.partitionId === partition);
      if (p === undefined) throw new Error(`no partition ${topic}/${partition} in the metadata of ${broker}`);
      return { leader: p.leader, replicas: [...p.replicas], isr: [...p.isr], offlineReplicas: [...(p.offlineReplicas ?? [])] };
    } finally {
      await admin.disconnect().catch(noop);
    }
  };
  try {
    return await Promise.any(brokers.map(via));
  } catch (err) {
    const reasons = err instanceof AggregateError ? err.errors.map((e: unknown) => (e instanceof Error ? e.message : String(e))) : [String(err)];
    throw new Error(`no broker of ${brokers.join(',')} answered a metadata request for ${topic}/${partition}: ${reasons.join('; ')}`);
  }
}

/** Node id of the leader of `topic`/`partition` (-1 while it has none), from a fresh metadata request. */
export async function leaderOf(brokers: string[], topic: string, partition: number): Promise<number> {
  return (await partitionInfo(brokers, topic, partition)).leader;
}

/**
 * (Re)starts the local registry on the same port and waits until it serves;
 * no-op if ours already serves. Its H2 database file survives the restart, so
 * the schemas and their ids are still there, as with a real registry (whose
 * storage is Kafka or a database): running writ processes keep using the ids
 * they cached, and records framed before the restart still decode.
 */
export async function startRegistry(opts: StackOptions & { timeoutMs?: number } = {}): Promise<void> {
  const log = opts.log ?? noop;
  if (ownedPid(COMPONENTS.registry) !== undefined && (await registryServes(LOCAL_REGISTRY_URL))) return;
  if (ownedPid(COMPONENTS.registry) === undefined) {
    await waitForPortsClosed([REGISTRY_PORT], 5000); // a registry of ours that is still going away
    if (await tcpOpen(HOST, REGISTRY_PORT)) throw new Error(`startRegistry: port ${REGISTRY_PORT} is in use by a process that is not our registry`);
  }
  await launchRegistry(log, opts.timeoutMs ?? 120_000, false);
}

/**
 * Hard kill (SIGKILL) of the local registry JVM; resolves once it is gone.
 * Returns its pid. Its database file stays (see startRegistry).
 */
export async function killRegistry(): Promise<number> {
  const pid = ownedPid(COMPONENTS.registry);
  if (pid === undefined) throw new Error('killRegistry: no local registry started by src/testing/local-stack.ts is running');
  signal(pid, 'SIGKILL');
  if (!(await waitForExit(pid, 10_000))) throw new Error(`killRegistry: pid ${pid} still alive after SIGKILL`);
  rmSync(COMPONENTS.registry.pidFile, { force: true });
  await waitForPortsClosed([REGISTRY_PORT]);
  return pid;
}

// ---------------------------------------------------------------------------
// Shared with src/testing/secure-stack.ts (the SASL_SSL stack); not part of writ/testing's API.

export {
  retryOnPortClash,
  ensureKafkaJars,
  ensureApicurio,
  spawnDetached,
  stopComponent,
  ownedPid,
  tcpOpen,
  tail as tailOf,
  sleep,
  runOrThrow,
  isAlive,
  singleNodeProperties,
  waitForPortsClosed,
  clusterId,
  JAVA,
  HOST,
};
export type { ComponentSpec };
