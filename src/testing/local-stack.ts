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
// Every stack's ports (these, the secure stack's, the fault suite's and its
// records server's, the test files' own) lie below the range the OS draws the
// local ports of outgoing connections from (32768-60999 on Linux; 49152+ on
// macOS and Windows). A port of that range can be given to a client's or a
// sibling node's connection as its local port and held while the JVM is
// binding it: seen for node 2 of a three-node stack on 49192+ (a sibling's
// long-lived connection held 49194 through five starts), and for secure.test.ts's broker on 39592-39594 beside the other
// integration tests' hundreds of client connections.
//
// Library module: importing it has no side effects.

import { randomBytes } from 'node:crypto';
import { existsSync, mkdirSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { Kafka, logLevel } from 'kafkajs';
import type { SecureStackInfo, SecureStackOptions } from './secure-stack.ts';
import { type BrokerCount, APICURIO_HOME, RUN_DIR, BROKER_DATA, SERVER_PROPERTIES, SIZE_FILE, HOST, BROKER_PORT, REGISTRY_PORT, LOCAL_BROKER, LOCAL_REGISTRY_URL, JAVA, type Component, type ComponentSpec, COMPONENTS, BROKER_LOG, type NodeLayout, nodeLayout, clusterLayout, brokerCount, stackSize, noop, defaultLog } from './stack-layout.ts';
import { sleep, tail, runOrThrow, isAlive, ownedPid, waitForExit, signal, stopComponent, retryOnPortClash, spawnDetached, waitForPortsClosed, tcpOpen, brokerServes, waitForBroker, waitForNode, formattedClusterId, registryServes, waitForRegistry, withLock, autostopFile, takeLease, otherLiveLeases } from './stack-process.ts';
import { ensureKafkaJars, ensureApicurio } from './stack-downloads.ts';
import { javaBrokerArgs, singleNodeProperties, writeBrokerConfig } from './stack-broker-config.ts';

// Split out of this module (layout, processes, downloads, broker files); exported from here as before, for
// writ/testing, the scripts and the tests.
export { KAFKA_VERSION, APICURIO_VERSION, CACHE_DIR, KAFKA_LIBS, RUN_DIR, BROKER_PORT, REGISTRY_PORT, LOCAL_BROKER, LOCAL_REGISTRY_URL, type BrokerCount } from './stack-layout.ts';
export { isSelfConnection, waitForBroker, PortServedByAnotherCluster } from './stack-process.ts';
export { brokerProperties, writeBrokerFiles, javaBrokerArgs } from './stack-broker-config.ts';

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
  /** What this call started. A reused broker whose registry it started again gives `['registry']`. */
  startedParts?: readonly ('broker' | 'registry')[];
  /** With `secure`: the CA, the SCRAM users and their passwords, the registry's credentials (src/testing/secure-stack.ts). */
  secure?: SecureStackInfo;
}

export interface StackOptions {
  log?: (line: string) => void;
}

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
    // only a broker of this dir's cluster is ours: another stack's may answer on the port this JVM failed to bind
    await waitForNode(nodeLayout(1, 1), timeoutMs, child.pid, [], [LOCAL_BROKER], formattedClusterId(BROKER_DATA));
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
    await waitForNode(node, timeoutMs, child.pid, expectIds, [node.address], formattedClusterId(node.dataDir));
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
    startedParts: mine,
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
export async function stopStack(opts: StackOptions & { registryOnly?: boolean } = {}): Promise<{ broker?: number; nodes?: Record<number, number>; registry?: number }> {
  const log = opts.log ?? defaultLog;
  if (opts.registryOnly) {
    // The registry a `kafka:up` started again beside a broker others use: that alone.
    const registry = await stopComponent(COMPONENTS.registry, log);
    rmSync(autostopFile('registry'), { force: true });
    return registry === undefined ? {} : { registry };
  }
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
 * is a live (unfenced) broker again. No-op if it already serves. Only the JVM it
 * started, answering as the cluster formatted into its data dir, counts: when
 * another stack's broker holds the port, it fails (PortServedByAnotherCluster,
 * naming both cluster ids) instead of taking that broker for its own.
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
  withLock,
  JAVA,
  HOST,
};
export type { ComponentSpec };
