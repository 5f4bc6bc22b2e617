// The local stack's versions, files, ports and node layout (src/testing/local-stack.ts). Everything here is read
// from the environment once, at import: WRIT_LOCAL_STACK_DIR, WRIT_LOCAL_KAFKA_PORT and the rest must be set first.
// Library module: importing it has no side effects.

import { existsSync, readFileSync } from 'node:fs';
import { dirname, join, resolve } from 'node:path';
import { fileURLToPath } from 'node:url';

/** Kafka nodes of a local stack: 1 (the default) or 3. */
export type BrokerCount = 1 | 3;

// ---------------------------------------------------------------------------
// Versions and layout

/**
 * Newest Kafka 4.x on Maven Central. kafkajs 2.2.4 negotiates API versions that
 * the 4.x broker still serves (KIP-896 removed only very old ones); see
 * test/integration/kafkajs-smoke.test.ts.
 */
export const KAFKA_VERSION = process.env['WRIT_KAFKA_VERSION'] ?? '4.4.0';
/** log4j2 BOM pinned to the version Kafka 4.4.0 itself depends on. */
export const LOG4J_VERSION = '2.25.5';
/**
 * Apicurio 3.0.9: the newest 3.x whose `all` tarball runs on Java 17
 * (3.3.x is compiled for Java 21). 3.x serves the Confluent API at /apis/ccompat/v7.
 */
export const APICURIO_VERSION = process.env['WRIT_APICURIO_VERSION'] ?? '3.0.9';
export const DEPENDENCY_PLUGIN = 'org.apache.maven.plugins:maven-dependency-plugin:3.8.1';
/**
 * dependency:copy of 3.x reads the artifact's descriptor, and the parent POM
 * io.apicurio:apicurio-registry:3.0.9 is not resolvable from Central here; 2.8's
 * copy fetches the tarball without reading descriptors.
 */
export const DEPENDENCY_PLUGIN_COPY = 'org.apache.maven.plugins:maven-dependency-plugin:2.8';

/** The nearest folder above this module with a package.json: the repo (src/testing/) or the package (dist/src/testing/). */
export function packageRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, 'package.json')) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}
export const ROOT = packageRoot();
export const CACHE_DIR = process.env['WRIT_LOCAL_STACK_CACHE'] ? resolve(process.env['WRIT_LOCAL_STACK_CACHE']) : join(ROOT, '.cache');
export const KAFKA_HOME = join(CACHE_DIR, `kafka-${KAFKA_VERSION}`);
/** The broker's jars, plus kafka-tools (console producer, kafka-transactions) for tests and operators. */
export const KAFKA_LIBS = join(KAFKA_HOME, 'libs');
export const APICURIO_HOME = join(CACHE_DIR, `apicurio-${APICURIO_VERSION}`);
/** Runtime data, logs and pid files; `WRIT_LOCAL_STACK_DIR` gives a second, independent stack (the fault suite's). */
export const RUN_DIR = process.env['WRIT_LOCAL_STACK_DIR'] ? resolve(process.env['WRIT_LOCAL_STACK_DIR']) : join(CACHE_DIR, 'run');
export const BROKER_DATA = join(RUN_DIR, 'kafka-data');
export const SERVER_PROPERTIES = join(RUN_DIR, 'server.properties');
export const LOG4J_CONFIG = join(RUN_DIR, 'log4j2.xml');
export const LOCK_FILE = join(RUN_DIR, 'stack.lock');
/** Holds "3" while the stack dir is laid out for three nodes; absent for the single node. */
export const SIZE_FILE = join(RUN_DIR, 'cluster-size');
export const MARKER = '.complete';

export function portFromEnv(name: string, fallback: number): number {
  const raw = process.env[name];
  if (raw === undefined || raw === '') return fallback;
  const n = Number(raw);
  if (!Number.isInteger(n) || n <= 0 || n > 65534) throw new Error(`${name} must be a TCP port, got ${raw}`);
  return n;
}

export const HOST = '127.0.0.1';
export const BROKER_PORT = portFromEnv('WRIT_LOCAL_KAFKA_PORT', 19092);
export const CONTROLLER_PORT = BROKER_PORT + 1;
export const REGISTRY_PORT = portFromEnv('WRIT_LOCAL_REGISTRY_PORT', 18081);
export const LOCAL_BROKER = `${HOST}:${BROKER_PORT}`;
export const LOCAL_REGISTRY_URL = `http://${HOST}:${REGISTRY_PORT}/apis/ccompat/v7`;

export const JAVA = process.env['JAVA_HOME'] ? join(process.env['JAVA_HOME'], 'bin', 'java') : 'java';

export type Component = 'broker' | 'registry';

export interface ComponentSpec {
  /** For log lines: 'broker', 'broker node 2', 'registry'. */
  name: string;
  pidFile: string;
  outFile: string;
  /** Substrings that /proc/<pid>/cmdline must contain for the pid to be ours. */
  signature: () => string[];
}

export const COMPONENTS: Record<Component, ComponentSpec> = {
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
export const BROKER_LOG = join(RUN_DIR, 'broker.log');

/** Where one Kafka node lives: ports, files, pid. */
export interface NodeLayout {
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
export function nodeLayout(size: BrokerCount, nodeId: number): NodeLayout {
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

export function clusterLayout(size: BrokerCount): NodeLayout[] {
  return Array.from({ length: size }, (_, i) => nodeLayout(size, i + 1));
}

export function brokerCount(n: number | undefined): BrokerCount {
  if (n === undefined || n === 1) return 1;
  if (n === 3) return 3;
  throw new Error(`brokers must be 1 or 3, got ${String(n)}`);
}

/** The shape the stack dir is laid out for (the size file; the single node when absent). */
export function stackSize(): BrokerCount {
  try {
    return readFileSync(SIZE_FILE, 'utf8').trim() === '3' ? 3 : 1;
  } catch {
    return 1;
  }
}

export const noop = (): void => {};
export const defaultLog = (line: string): void => {
  process.stderr.write(`[local-stack] ${line}\n`);
};
