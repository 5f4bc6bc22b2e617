// Processes of the local stack (src/testing/local-stack.ts): spawning and stopping the JVMs it owns, knowing a
// pid is ours, waiting for a broker or a registry to serve, the cross-process lock and the leases that let
// several processes share one stack.
// Library module: importing it has no side effects.

import { spawn } from 'node:child_process';
import type { ChildProcess } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { closeSync, existsSync, mkdirSync, openSync, readdirSync, readFileSync, renameSync, rmSync, statSync, writeFileSync } from 'node:fs';
import { connect } from 'node:net';
import { dirname, join } from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import { RUN_DIR, LOCK_FILE, HOST, LOCAL_BROKER, type Component, type ComponentSpec, COMPONENTS, type NodeLayout, nodeLayout, stackSize, noop } from './stack-layout.ts';

// ---------------------------------------------------------------------------
// Small utilities

export function sleep(ms: number): Promise<void> {
  return new Promise((r) => setTimeout(r, ms));
}

export function tail(file: string, lines = 40): string {
  try {
    const all = readFileSync(file, 'utf8').split('\n');
    return all.slice(-lines).join('\n');
  } catch {
    return `(no ${file})`;
  }
}

/** `cmd` run to its end: its exit code, stdout and stderr as they came (`output`), and stdout alone. */
export function run(cmd: string, args: string[], cwd: string, env?: NodeJS.ProcessEnv): Promise<{ code: number; output: string; stdout: string }> {
  return new Promise((resolvePromise, reject) => {
    const child = spawn(cmd, args, { cwd, env, stdio: ['ignore', 'pipe', 'pipe'] });
    let output = '';
    let stdout = '';
    child.stdout.on('data', (d: Buffer) => {
      stdout += d.toString();
      output += d.toString();
    });
    child.stderr.on('data', (d: Buffer) => (output += d.toString()));
    child.on('error', reject);
    child.on('close', (code) => resolvePromise({ code: code ?? 1, output, stdout }));
  });
}

export async function runOrThrow(cmd: string, args: string[], cwd: string, what: string): Promise<void> {
  const { code, output } = await run(cmd, args, cwd);
  if (code !== 0) throw new Error(`${what} failed (exit ${code}): ${cmd} ${args.join(' ')}\n${output.slice(-4000)}`);
}

export function isAlive(pid: number): boolean {
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

/**
 * When process `pid` started: field 22 of /proc/<pid>/stat (clock ticks after boot), or undefined where there is
 * no /proc or no such process. With the pid it names one process: a pid is handed out again once its process is
 * gone, a start time never.
 */
export function processStartTime(pid: number): string | undefined {
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, 'utf8');
    // fields 3 and on follow the ")" that closes the command name (which may hold spaces)
    const start = stat.slice(stat.lastIndexOf(')') + 2).split(' ')[19];
    return start !== undefined && /^\d+$/.test(start) ? start : undefined;
  } catch {
    return undefined;
  }
}

/** A process as a lock or lease file names it: its pid and, where known, its start time. */
export interface ProcessRecord {
  pid: number;
  startTime?: string;
}

/** This process's record: `<pid> <start time>` (the pid alone where the start time is not known). */
export function ownRecord(): string {
  const start = processStartTime(process.pid);
  return start === undefined ? `${process.pid}` : `${process.pid} ${start}`;
}

/** The record in a lock or lease file's text; undefined when it holds none (half-written). */
export function parseRecord(text: string): ProcessRecord | undefined {
  const m = /^(\d+)(?: (\d+))?\s*$/.exec(text);
  const pid = Number(m?.[1]);
  if (m === null || !Number.isSafeInteger(pid) || pid <= 0) return undefined;
  return m[2] === undefined ? { pid } : { pid, startTime: m[2] };
}

/**
 * Whether the process a record names still runs: its pid is alive and, when the record has a start time and the
 * pid's can be read, started then. A pid handed to another process since (a runner SIGKILLed, its pid reused)
 * holds nothing.
 */
export function recordAlive(record: ProcessRecord): boolean {
  if (!isAlive(record.pid)) return false;
  if (record.startTime === undefined) return true;
  const now = processStartTime(record.pid);
  return now === undefined || now === record.startTime;
}

export function cmdline(pid: number): string | undefined {
  try {
    return readFileSync(`/proc/${pid}/cmdline`, 'utf8').split('\0').join(' ');
  } catch {
    return undefined;
  }
}

/** The live pid of a component we started (pid file + cmdline check), else undefined. */
export function ownedPid(spec: ComponentSpec): number | undefined {
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

export async function waitForExit(pid: number, timeoutMs: number): Promise<boolean> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (!isAlive(pid)) return true;
    await sleep(100);
  }
  return !isAlive(pid);
}

export function signal(pid: number, sig: NodeJS.Signals): void {
  try {
    process.kill(pid, sig);
  } catch {
    // already gone
  }
}

/** SIGTERM, then SIGKILL after the deadline; resolves once the process is gone. */
export async function stopComponent(spec: ComponentSpec, log: (l: string) => void, termTimeoutMs = 30_000): Promise<number | undefined> {
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
export const PORT_CLASH = /java\.net\.BindException|Address already in use|seems to be in use by another process/;

/**
 * Runs `launch` (spawn a JVM, wait until it serves) again when it failed
 * because a port was taken, up to `attempts` times, 2 s apart. The stacks'
 * ports are fixed; the defaults lie below the ephemeral range (header), but a
 * port set by hand may not, and any process's outgoing connection can hold
 * such a port as its local port for a while; a JVM that meets that exits at
 * once, and a later start binds.
 * Each failed attempt's logs are kept beside, renamed `<file>.port-clash-<n>`.
 */
export async function retryOnPortClash(what: string, logFiles: readonly string[], launch: () => Promise<void>, log: (l: string) => void, attempts = 5): Promise<void> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await launch();
    } catch (err) {
      // another stack's broker serves there: its port stays taken, and a start again would bind no better
      if (err instanceof PortServedByAnotherCluster) throw err;
      const clash = logFiles.some((f) => existsSync(f) && PORT_CLASH.test(readFileSync(f, 'utf8').slice(-1_000_000)));
      if (!clash || attempt >= attempts) throw err;
      for (const f of logFiles) if (existsSync(f)) renameSync(f, `${f}.port-clash-${attempt}`);
      log(`${what}: a port it listens on was taken (an outgoing connection can hold one for a moment); starting it again in 2 s (attempt ${attempt + 1} of ${attempts})`);
      await sleep(2000);
    }
  }
}

export function spawnDetached(spec: ComponentSpec, cmd: string, args: string[], cwd: string): ChildProcess {
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
export async function waitForPortsClosed(ports: number[], timeoutMs = 10_000): Promise<void> {
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
export function tcpOpen(host: string, port: number, timeoutMs = 1000): Promise<boolean> {
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
export async function listening(brokers: string[]): Promise<boolean> {
  for (const b of brokers) {
    const at = b.lastIndexOf(':');
    if (!(await tcpOpen(b.slice(0, at), Number(b.slice(at + 1))))) return false;
  }
  return true;
}

/** What a broker says of its cluster in a describeCluster answer. */
export interface ClusterAnswer {
  clusterId: string;
  /** The live (registered, unfenced) brokers. */
  brokerIds: number[];
  /** -1 while there is none. */
  controller: number;
}

/** One describeCluster round trip: the cluster id, the live (unfenced) broker ids and the controller, or undefined. */
export async function describe(brokers: string[], timeoutMs = 5000): Promise<ClusterAnswer | undefined> {
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
    return { clusterId: cluster.clusterId, brokerIds: cluster.brokers.map((b) => b.nodeId).sort((a, b) => a - b), controller: cluster.controller ?? -1 };
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
export async function brokerServes(brokers: string[], expectIds: number[] = [], timeoutMs = 5000): Promise<boolean> {
  return (await askNode(brokers, expectIds, undefined, timeoutMs)) === 'serves';
}

/**
 * What a start waiting for a node makes of one describeCluster answer (undefined: none yet). `serves`: a controller
 * and every id of `expectIds` among the live brokers, and, when `clusterId` is given (the one formatted into the
 * node's data dir), that cluster. A broker of another cluster is another stack's that holds the port: its JVM,
 * which failed to bind, must not be taken to serve through it.
 */
export function judgeNodeAnswer(answer: ClusterAnswer | undefined, expectIds: readonly number[], clusterId: string | undefined): 'serves' | 'not yet' | { otherCluster: string } {
  if (answer === undefined) return 'not yet';
  if (clusterId !== undefined && answer.clusterId !== clusterId) return { otherCluster: answer.clusterId };
  const serves = answer.brokerIds.length > 0 && answer.controller >= 0 && expectIds.every((id) => answer.brokerIds.includes(id));
  return serves ? 'serves' : 'not yet';
}

async function askNode(brokers: string[], expectIds: readonly number[], clusterId: string | undefined, timeoutMs = 5000): Promise<ReturnType<typeof judgeNodeAnswer>> {
  // kafkajs would hold a connection to itself for its whole request timeout; check for a listener first.
  if (!(await listening(brokers))) return 'not yet';
  return judgeNodeAnswer(await describe(brokers, timeoutMs), expectIds, clusterId);
}

/** The cluster id `kafka-storage format` wrote into a node's data dir (its meta.properties), or undefined. */
export function formattedClusterId(dataDir: string): string | undefined {
  try {
    return /^cluster\.id=(.+)$/m.exec(readFileSync(join(dataDir, 'meta.properties'), 'utf8'))?.[1]?.trim();
  } catch {
    return undefined;
  }
}

/** A node's port answers as a broker of another cluster than the one in the node's data dir. */
export class PortServedByAnotherCluster extends Error {
  override name = 'PortServedByAnotherCluster';
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
 * `expectIds` as a live (registered, unfenced) broker, and, with `clusterId`
 * (a start: the id in the node's data dir), as a broker of that cluster while
 * its JVM `pid` lives. Another cluster's answer there fails the start with
 * PortServedByAnotherCluster once the JVM has exited (or at the deadline).
 */
export async function waitForNode(node: NodeLayout, timeoutMs: number, pid: number | undefined, expectIds: number[], via: string[] = [node.address], clusterId?: string): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  const logs = (): string => `--- ${node.spec.outFile}\n${tail(node.spec.outFile)}\n--- ${node.logFile}\n${tail(node.logFile)}`;
  let other: string | undefined;
  const taken = (why: string): Error =>
    new PortServedByAnotherCluster(
      `${node.spec.name}: ${via.join(',')} answers as a broker of cluster ${other}, not of this stack's cluster ${clusterId} (${node.dataDir}): ` +
        `another stack's broker holds the port, and ${why} (give this stack a dir and ports of its own: WRIT_LOCAL_STACK_DIR, WRIT_LOCAL_KAFKA_PORT).\n${logs()}`,
    );
  while (Date.now() < deadline) {
    const answer = await askNode(via, expectIds, clusterId);
    // ours only while the JVM started lives: a JVM of this dir that did not die yet when this one failed answers too
    if (answer === 'serves' && (pid === undefined || isAlive(pid))) return;
    if (typeof answer === 'object') other = answer.otherCluster;
    if (pid !== undefined && !isAlive(pid)) {
      if (other !== undefined) throw taken(`this JVM (pid ${pid}) exited`);
      throw new Error(`${node.spec.name} JVM (pid ${pid}) exited during startup.\n${logs()}`);
    }
    await sleep(500);
  }
  if (other !== undefined) throw taken(`this JVM did not serve within ${timeoutMs} ms`);
  const what = expectIds.length > 0 ? ` listing brokers ${expectIds.join(',')}` : '';
  throw new Error(`${node.spec.name} ${via.join(',')} did not answer describeCluster${what} within ${timeoutMs} ms.\n${logs()}`);
}

export async function registryServes(url: string, timeoutMs = 2000): Promise<boolean> {
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

export async function waitForRegistry(url: string, timeoutMs: number, pid?: number): Promise<void> {
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
// Cross-process lock (kafka:up and a vitest run may race); `lockFile` is another stack's (the secure stack's)

/**
 * Runs `fn` holding `lockFile` (created exclusively, holding this process's pid and start time). A lock whose
 * holder is gone (its pid dead, or now another process's) is taken over; a live holder is waited for, up to
 * `waitMs` (10 minutes: a start that downloads the jars); `doing` says what the holder is doing, for the wait's line.
 */
export async function withLock<T>(
  log: (l: string) => void,
  fn: () => Promise<T>,
  lockFile = LOCK_FILE,
  waitMs = 10 * 60_000,
  doing = 'starting the stack',
): Promise<T> {
  mkdirSync(dirname(lockFile), { recursive: true });
  const deadline = Date.now() + waitMs;
  let announced = false;
  for (;;) {
    try {
      const fd = openSync(lockFile, 'wx');
      writeFileSync(fd, `${ownRecord()}\n`);
      closeSync(fd);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== 'EEXIST') throw err;
      let holder: ProcessRecord | undefined;
      try {
        holder = parseRecord(readFileSync(lockFile, 'utf8'));
      } catch {
        // vanished; retry
      }
      const deadHolder = holder !== undefined && !recordAlive(holder);
      // a lock file without a pid for 10 s: its writer died between create and write
      const orphaned = holder === undefined && Date.now() - (statSync(lockFile, { throwIfNoEntry: false })?.mtimeMs ?? Date.now()) > 10_000;
      if (deadHolder || orphaned) {
        rmSync(lockFile, { force: true });
        continue;
      }
      if (Date.now() > deadline) throw new Error(`timed out waiting for ${lockFile} (held by pid ${holder?.pid ?? '?'})`);
      if (!announced) {
        log(`waiting for another process (pid ${holder?.pid ?? '?'}) that is ${doing}`);
        announced = true;
      }
      await sleep(250);
    }
  }
  try {
    return await fn();
  } finally {
    rmSync(lockFile, { force: true });
  }
}

// ---------------------------------------------------------------------------
// Leases: several processes (two vitest runs, a bench) may share one stack. The
// caller that started a component stops it in stop() only if no other live
// process still uses the stack; otherwise it leaves a `<component>.autostop`
// marker and the last live user stops it. A stack started by `kafka:up` is never
// stopped by a test run (kafka:up never calls stop(); only kafka:down stops it).

export const LEASE_DIR = join(RUN_DIR, 'leases');

export function autostopFile(component: Component): string {
  return join(RUN_DIR, `${component}.autostop`);
}

export function takeLease(): string {
  mkdirSync(LEASE_DIR, { recursive: true });
  const file = join(LEASE_DIR, `${process.pid}.${randomBytes(4).toString('hex')}`);
  writeFileSync(file, `${ownRecord()}\n`);
  return file;
}

/**
 * Lease files of other processes (or other ensureStack calls) that are still alive; those of processes gone (a
 * dead pid, or one reused since: the start time in the file differs) are pruned.
 */
export function otherLiveLeases(mine: string): string[] {
  if (!existsSync(LEASE_DIR)) return [];
  const live: string[] = [];
  for (const name of readdirSync(LEASE_DIR)) {
    const file = join(LEASE_DIR, name);
    if (file === mine) continue;
    let text = '';
    try {
      text = readFileSync(file, 'utf8');
    } catch {
      // vanished, or pruned by another process meanwhile
    }
    // the file's name has the pid too: a file still empty is read by it, without a start time
    const pid = Number(name.split('.')[0]);
    const record = parseRecord(text) ?? (Number.isSafeInteger(pid) && pid > 0 ? { pid } : undefined);
    if (record !== undefined && recordAlive(record)) live.push(file);
    else rmSync(file, { force: true });
  }
  return live;
}
