// The secure local stack: one Kafka node whose clients connect over SASL_SSL
// (SCRAM-SHA-512 or -256) with ACLs enforced by KRaft's StandardAuthorizer,
// and an Apicurio registry over HTTPS with basic auth. For tests and local
// development of writ's secure transport (`npm run kafka:up -- --secure`,
// `ensureStack({ secure: true })`); never for production: the CA's key is
// thrown away after start, passwords are random per start and kept in files
// under the stack dir (mode 0600).
//
// Listeners (all on 127.0.0.1):
//   SASL_SSL   <port>      clients (writ's owners, agents, the CLI)
//   CONTROLLER <port + 1>  SSL with client certificates (the broker's own)
//   INTERNAL   <port + 2>  SSL with client certificates: inter-broker
// A self-signed CA is made at start with openssl (a P-256 key; Java reads the
// PEM files directly: ssl.keystore.type=PEM), and signs the broker's and the
// registry's certificates (subjectAltName IP:127.0.0.1, DNS:localhost).
// The broker authenticates to its own controller and internal listeners with
// its certificate (principal User:writ-broker, a super user); nothing
// reaches the node without a certificate signed by the CA or a SCRAM password.
// SCRAM users are created when the storage is formatted (kafka-storage format
// --add-scram, KIP-900); ACLs once the node serves, by the admin user.
//
// Library module: importing it has no side effects.

import { randomBytes } from 'node:crypto';
import { chmodSync, existsSync, mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { join, resolve } from 'node:path';
import kafkajs, { Kafka, logLevel, type AclEntry } from 'kafkajs';
import type { EnsureStackResult } from './local-stack.ts';
import {
  retryOnPortClash,
  registryJvmArgs,
  CACHE_DIR,
  javaBrokerArgs,
  writeBrokerFiles,
  HOST,
  JAVA,
  KAFKA_LIBS,
  clusterId,
  ensureApicurio,
  ensureKafkaJars,
  isAlive,
  ownedPid,
  runOrThrow,
  singleNodeProperties,
  sleep,
  spawnDetached,
  stopComponent,
  tailOf,
  tcpOpen,
  waitForPortsClosed,
  type ComponentSpec,
} from './local-stack.ts';

/** The SCRAM users of the secure stack. `admin` is a super user (with the broker); the others get the ACLs of {@link secureStackAcls}. */
export const SECURE_USERS = ['admin', 'writ-owner', 'agent-a', 'agent-b'] as const;
export type SecureUserName = (typeof SECURE_USERS)[number];
/** The two agents of the stack. */
export const SECURE_AGENTS = ['agent-a', 'agent-b'] as const;
/** The registry's basic-auth user. */
export const REGISTRY_USER = 'writ';

export interface SecureStackOptions {
  /** Stack dir. Default `$WRIT_SECURE_STACK_DIR` or `.cache/run-secure`. */
  dir?: string;
  /** The SASL_SSL listener; the controller listens one above, the internal listener two above. Default `$WRIT_SECURE_KAFKA_PORT` or 19492. */
  kafkaPort?: number;
  /** The registry's HTTPS port. Default `$WRIT_SECURE_REGISTRY_PORT` or 18481. */
  registryPort?: number;
  /** Start the registry too. Default true. */
  registry?: boolean;
  log?: (line: string) => void;
}

export interface SecureUser {
  username: string;
  password: string;
  /** A file holding only the password (for KAFKA_SASL_PASSWORD_FILE). */
  passwordFile: string;
  mechanism: 'scram-sha-512';
}

/** What a client of the secure stack needs: the CA, the users and their passwords. */
export interface SecureStackInfo {
  dir: string;
  brokers: string[];
  /** `https://127.0.0.1:<port>/apis/ccompat/v7`, or '' without a registry. */
  registryUrl: string;
  /** The CA certificate (PEM) the broker's and the registry's certificates are signed by. */
  caFile: string;
  users: Record<SecureUserName, SecureUser>;
  registryAuth: { username: string; password: string; passwordFile: string };
  /** writ's `kafka` config (src/security/transport.ts) for `user`: TLS with the CA, SCRAM-SHA-512. */
  kafka(user: SecureUserName | SecureUser): { ssl: { ca: string }; sasl: { mechanism: 'scram-sha-512'; username: string; password: string } };
  /** The environment variables of an owner, agent or CLI acting as `user` (passwords through their *_FILE variables). */
  env(user: SecureUserName): Record<string, string>;
}

function portOption(value: number | undefined, variable: string, fallback: number): number {
  const raw = value ?? (process.env[variable] ? Number(process.env[variable]) : fallback);
  if (!Number.isInteger(raw) || raw <= 0 || raw > 65533) throw new Error(`${variable}: not a TCP port: ${String(raw)}`);
  return raw;
}

interface Layout {
  dir: string;
  kafkaPort: number;
  controllerPort: number;
  internalPort: number;
  registryPort: number;
  address: string;
  registryUrl: string;
  tlsDir: string;
  secretsDir: string;
  dataDir: string;
  propsFile: string;
  log4jFile: string;
  logFile: string;
  caFile: string;
  broker: ComponentSpec;
  registry: ComponentSpec;
}

function layout(opts: SecureStackOptions): Layout {
  const dir = resolve(opts.dir ?? process.env['WRIT_SECURE_STACK_DIR'] ?? join(CACHE_DIR, 'run-secure'));
  const kafkaPort = portOption(opts.kafkaPort, 'WRIT_SECURE_KAFKA_PORT', 19492);
  const registryPort = portOption(opts.registryPort, 'WRIT_SECURE_REGISTRY_PORT', 18481);
  const propsFile = join(dir, 'server.properties');
  const tlsDir = join(dir, 'tls');
  return {
    dir,
    kafkaPort,
    controllerPort: kafkaPort + 1,
    internalPort: kafkaPort + 2,
    registryPort,
    address: `${HOST}:${kafkaPort}`,
    registryUrl: `https://${HOST}:${registryPort}/apis/ccompat/v7`,
    tlsDir,
    secretsDir: join(dir, 'secrets'),
    dataDir: join(dir, 'kafka-data'),
    propsFile,
    log4jFile: join(dir, 'log4j2.xml'),
    logFile: join(dir, 'broker.log'),
    caFile: join(tlsDir, 'ca.pem'),
    broker: { name: 'secure broker', pidFile: join(dir, 'broker.pid'), outFile: join(dir, 'broker.out'), signature: () => ['kafka.Kafka', propsFile] },
    registry: {
      name: 'secure registry',
      pidFile: join(dir, 'registry.pid'),
      outFile: join(dir, 'registry.out'),
      signature: () => ['apicurio-registry', 'jdbc:h2:mem:writ-secure-'],
    },
  };
}

// ---------------------------------------------------------------------------
// Certificates and secrets

function writeSecret(file: string, text: string): void {
  writeFileSync(file, text, { mode: 0o600 });
  chmodSync(file, 0o600);
}

async function openssl(args: string[], cwd: string, what: string): Promise<void> {
  try {
    await runOrThrow('openssl', args, cwd, what);
  } catch (err) {
    if ((err as NodeJS.ErrnoException).code === 'ENOENT') throw new Error('the secure stack needs openssl on the PATH (it makes the local CA and certificates)');
    throw err;
  }
}

/** A fresh CA, and certificates for the broker (CN writ-broker, server and client use) and the registry. The CA's key is deleted afterwards. */
async function makeCertificates(l: Layout): Promise<void> {
  rmSync(l.tlsDir, { recursive: true, force: true });
  mkdirSync(l.tlsDir, { recursive: true, mode: 0o700 });
  const ec = ['-newkey', 'ec', '-pkeyopt', 'ec_paramgen_curve:prime256v1', '-nodes'];
  await openssl(
    ['req', '-x509', ...ec, '-keyout', 'ca.key', '-out', 'ca.pem', '-days', '825', '-subj', '/CN=writ local secure stack CA', '-addext', 'basicConstraints=critical,CA:TRUE', '-addext', 'keyUsage=critical,keyCertSign,cRLSign'],
    l.tlsDir,
    'openssl (CA)',
  );
  writeFileSync(join(l.tlsDir, 'leaf.ext'), 'subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature,keyEncipherment,keyAgreement\nextendedKeyUsage=serverAuth,clientAuth\n');
  for (const name of ['broker', 'registry']) {
    await openssl(['req', ...ec, '-keyout', `${name}.key`, '-out', `${name}.csr`, '-subj', `/CN=writ-${name}`], l.tlsDir, `openssl (${name} key)`);
    await openssl(['x509', '-req', '-in', `${name}.csr`, '-CA', 'ca.pem', '-CAkey', 'ca.key', '-CAcreateserial', '-out', `${name}.pem`, '-days', '825', '-extfile', 'leaf.ext'], l.tlsDir, `openssl (${name} certificate)`);
    chmodSync(join(l.tlsDir, `${name}.key`), 0o600);
    rmSync(join(l.tlsDir, `${name}.csr`), { force: true });
  }
  // Kafka's PEM key store: the (unencrypted PKCS#8) key, then the certificate chain
  const keystore = [readFileSync(join(l.tlsDir, 'broker.key'), 'utf8'), readFileSync(join(l.tlsDir, 'broker.pem'), 'utf8'), readFileSync(l.caFile, 'utf8')].join('');
  writeSecret(join(l.tlsDir, 'broker-keystore.pem'), keystore);
  for (const f of ['ca.key', 'ca.srl', 'leaf.ext']) rmSync(join(l.tlsDir, f), { force: true });
}

function newPassword(): string {
  return randomBytes(18).toString('base64url');
}

function passwordFile(l: Layout, user: string): string {
  return join(l.secretsDir, `${user}.password`);
}

/** New random passwords for every user and the registry, one file each (0600). */
function makePasswords(l: Layout): void {
  rmSync(l.secretsDir, { recursive: true, force: true });
  mkdirSync(l.secretsDir, { recursive: true, mode: 0o700 });
  for (const user of [...SECURE_USERS, `registry-${REGISTRY_USER}`]) writeSecret(passwordFile(l, user), `${newPassword()}\n`);
}

function readPassword(l: Layout, user: string): string {
  return readFileSync(passwordFile(l, user), 'utf8').trim();
}

function info(l: Layout, withRegistry: boolean): SecureStackInfo {
  const users = Object.fromEntries(
    SECURE_USERS.map((u) => [u, { username: u, password: readPassword(l, u), passwordFile: passwordFile(l, u), mechanism: 'scram-sha-512' as const }]),
  ) as Record<SecureUserName, SecureUser>;
  const registryAuth = { username: REGISTRY_USER, password: withRegistry ? readPassword(l, `registry-${REGISTRY_USER}`) : '', passwordFile: passwordFile(l, `registry-${REGISTRY_USER}`) };
  const registryUrl = withRegistry ? l.registryUrl : '';
  return {
    dir: l.dir,
    brokers: [l.address],
    registryUrl,
    caFile: l.caFile,
    users,
    registryAuth,
    kafka(user) {
      const u = typeof user === 'string' ? users[user] : user;
      return { ssl: { ca: l.caFile }, sasl: { mechanism: 'scram-sha-512', username: u.username, password: u.password } };
    },
    env(user) {
      const u = users[user];
      return {
        KAFKA_BROKERS: l.address,
        KAFKA_SSL_CA_FILE: l.caFile,
        KAFKA_SASL_MECHANISM: 'scram-sha-512',
        KAFKA_SASL_USERNAME: u.username,
        KAFKA_SASL_PASSWORD_FILE: u.passwordFile,
        ...(withRegistry
          ? { SCHEMA_REGISTRY_URL: registryUrl, SCHEMA_REGISTRY_USERNAME: registryAuth.username, SCHEMA_REGISTRY_PASSWORD_FILE: registryAuth.passwordFile, SCHEMA_REGISTRY_CA_FILE: l.caFile }
          : {}),
      };
    },
  };
}

// ---------------------------------------------------------------------------
// ACLs

// kafkajs's ACL enums are not found by Node's named-export detection for CommonJS: take them off the module object.
const { AclOperationTypes, AclPermissionTypes, AclResourceTypes, ResourcePatternTypes } = kafkajs;

/** One ACL rule set: `operations` allowed to `principal` on a resource. */
export interface AclRule {
  principal: string;
  resourceType: 'TOPIC' | 'GROUP' | 'TRANSACTIONAL_ID' | 'CLUSTER';
  patternType: 'LITERAL' | 'PREFIXED';
  resourceName: string;
  operations: ('READ' | 'WRITE' | 'CREATE' | 'DESCRIBE' | 'DESCRIBE_CONFIGS' | 'DELETE')[];
}

/**
 * The ACLs writ's owners and agents need (the README's "Running with SASL/TLS
 * and ACLs" table), for the default topic names and group:
 * - owners (`owner`): read and write intents and ledger, write escalations,
 *   dead letters and every reply topic, create the contract topics, their
 *   consumer group and transactional ids (both prefixed by the group id);
 * - each agent: write intents; create, read and describe only its own reply
 *   topic (prefixed `writ.replies.<agent>`), and use only its own consumer
 *   groups (prefixed `writ.client.<agent>.`).
 * Idempotent producers need no cluster permission (Kafka >= 2.8: WRITE on a topic suffices).
 */
export function secureStackAcls(opts: { owner?: string; agents?: readonly string[]; groupId?: string; replyPrefix?: string } = {}): AclRule[] {
  const owner = `User:${opts.owner ?? 'writ-owner'}`;
  const group = opts.groupId ?? 'writ.owners';
  const replies = opts.replyPrefix ?? 'writ.replies.';
  const rules: AclRule[] = [
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: 'writ.intents', operations: ['READ', 'WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: 'writ.ledger', operations: ['READ', 'WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: 'writ.human', operations: ['WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: 'writ.dlq', operations: ['WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'PREFIXED', resourceName: replies, operations: ['WRITE', 'DESCRIBE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'GROUP', patternType: 'PREFIXED', resourceName: group, operations: ['READ', 'DESCRIBE'] },
    { principal: owner, resourceType: 'TRANSACTIONAL_ID', patternType: 'PREFIXED', resourceName: group, operations: ['WRITE', 'DESCRIBE'] },
  ];
  for (const agent of opts.agents ?? SECURE_AGENTS) {
    const p = `User:${agent}`;
    rules.push(
      { principal: p, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: 'writ.intents', operations: ['WRITE', 'DESCRIBE'] },
      { principal: p, resourceType: 'TOPIC', patternType: 'PREFIXED', resourceName: `${replies}${agent}`, operations: ['CREATE', 'READ', 'DESCRIBE'] },
      { principal: p, resourceType: 'GROUP', patternType: 'PREFIXED', resourceName: `writ.client.${agent}.`, operations: ['READ', 'DESCRIBE', 'DELETE'] },
    );
  }
  return rules;
}

function aclEntries(rules: AclRule[]): AclEntry[] {
  return rules.flatMap((r) =>
    r.operations.map((op) => ({
      principal: r.principal,
      host: '*',
      resourceType: AclResourceTypes[r.resourceType],
      resourceName: r.resourceName,
      resourcePatternType: ResourcePatternTypes[r.patternType],
      operation: AclOperationTypes[op],
      permissionType: AclPermissionTypes.ALLOW,
    })),
  );
}

// ---------------------------------------------------------------------------
// Broker

function brokerProps(l: Layout): Record<string, string | number | boolean> {
  return {
    ...singleNodeProperties(),
    listeners: `SASL_SSL://${HOST}:${l.kafkaPort},CONTROLLER://${HOST}:${l.controllerPort},INTERNAL://${HOST}:${l.internalPort}`,
    'advertised.listeners': `SASL_SSL://${HOST}:${l.kafkaPort},INTERNAL://${HOST}:${l.internalPort}`,
    'listener.security.protocol.map': 'SASL_SSL:SASL_SSL,CONTROLLER:SSL,INTERNAL:SSL',
    'inter.broker.listener.name': 'INTERNAL',
    'controller.listener.names': 'CONTROLLER',
    'controller.quorum.bootstrap.servers': `${HOST}:${l.controllerPort}`,
    'log.dirs': l.dataDir,
    // clients: SCRAM over TLS
    'sasl.enabled.mechanisms': 'SCRAM-SHA-512,SCRAM-SHA-256',
    'listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config': 'org.apache.kafka.common.security.scram.ScramLoginModule required;',
    'listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config': 'org.apache.kafka.common.security.scram.ScramLoginModule required;',
    // one key store (PEM: key and chain) and trust store (the CA) for every listener and the broker's own client side
    'ssl.keystore.type': 'PEM',
    'ssl.keystore.location': join(l.tlsDir, 'broker-keystore.pem'),
    'ssl.truststore.type': 'PEM',
    'ssl.truststore.location': l.caFile,
    // the controller and internal listeners take only certificates signed by the CA: the broker's own
    'listener.name.controller.ssl.client.auth': 'required',
    'listener.name.internal.ssl.client.auth': 'required',
    'ssl.principal.mapping.rules': 'RULE:^CN=([a-zA-Z0-9._-]+)$/$1/,DEFAULT',
    'authorizer.class.name': 'org.apache.kafka.metadata.authorizer.StandardAuthorizer',
    'super.users': 'User:admin;User:writ-broker',
    'allow.everyone.if.no.acl.found': false,
  };
}

/** Formats the storage with the SCRAM users (SCRAM-SHA-512 and -256 for each). */
async function formatStorage(l: Layout, log: (line: string) => void): Promise<void> {
  const id = clusterId();
  const scram = SECURE_USERS.flatMap((u) => {
    const pw = readPassword(l, u);
    return ['--add-scram', `SCRAM-SHA-512=[name=${u},password=${pw}]`, '--add-scram', `SCRAM-SHA-256=[name=${u},password=${pw}]`];
  });
  log(`formatting KRaft storage in ${l.dataDir} with SCRAM users ${SECURE_USERS.join(', ')}`);
  try {
    await runOrThrow(JAVA, [...javaBrokerArgs(l), '-XX:TieredStopAtLevel=1', 'kafka.tools.StorageTool', 'format', '-t', id, '-c', l.propsFile, '--standalone', ...scram], l.dir, 'kafka-storage format');
  } catch (err) {
    // the command line holds the passwords: report the tool's output only
    const text = err instanceof Error ? err.message : String(err);
    throw new Error(`kafka-storage format failed: ${text.slice(text.indexOf('\n') + 1)}`);
  }
}

function adminKafka(l: Layout, timeoutMs: number): Kafka {
  return new Kafka({
    clientId: 'writ-secure-stack',
    brokers: [l.address],
    ssl: { ca: [readFileSync(l.caFile, 'utf8')] },
    sasl: { mechanism: 'scram-sha-512', username: 'admin', password: readPassword(l, 'admin') },
    logLevel: logLevel.NOTHING,
    connectionTimeout: Math.min(timeoutMs, 3000),
    requestTimeout: timeoutMs,
    retry: { retries: 0 },
  });
}

async function brokerServes(l: Layout, timeoutMs = 5000): Promise<boolean> {
  if (!existsSync(l.caFile) || !existsSync(passwordFile(l, 'admin'))) return false;
  const admin = adminKafka(l, timeoutMs).admin();
  try {
    await admin.connect();
    const cluster = await admin.describeCluster();
    return cluster.brokers.length > 0 && (cluster.controller ?? -1) >= 0;
  } catch {
    return false;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

async function waitForBroker(l: Layout, pid: number | undefined, timeoutMs: number): Promise<void> {
  const deadline = Date.now() + timeoutMs;
  while (Date.now() < deadline) {
    if (await brokerServes(l)) return;
    if (pid !== undefined && !isAlive(pid)) throw new Error(`secure broker JVM (pid ${pid}) exited during startup.\n--- ${l.broker.outFile}\n${tailOf(l.broker.outFile)}\n--- ${l.logFile}\n${tailOf(l.logFile)}`);
    await sleep(300);
  }
  throw new Error(`secure broker ${l.address} did not answer describeCluster within ${timeoutMs} ms.\n--- ${l.logFile}\n${tailOf(l.logFile)}`);
}

async function createAcls(l: Layout): Promise<number> {
  const admin = adminKafka(l, 10_000).admin();
  try {
    await admin.connect();
    const entries = aclEntries(secureStackAcls());
    await admin.createAcls({ acl: entries });
    return entries.length;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

async function startBroker(l: Layout, log: (line: string) => void): Promise<void> {
  await ensureKafkaJars(log);
  await stopComponent(l.broker, log);
  rmSync(l.dataDir, { recursive: true, force: true });
  for (const f of [l.logFile, l.broker.outFile]) rmSync(f, { force: true });
  for (const port of [l.kafkaPort, l.controllerPort, l.internalPort]) {
    if (await tcpOpen(HOST, port)) throw new Error(`port ${port} is in use (the secure stack needs ${l.kafkaPort}-${l.internalPort}; set WRIT_SECURE_KAFKA_PORT)`);
  }
  writeBrokerFiles(l, brokerProps(l), 'src/testing/secure-stack.ts');
  const t0 = Date.now();
  await formatStorage(l, log);
  await retryOnPortClash('secure broker', [l.logFile, l.broker.outFile], async () => {
    const child = spawnDetached(l.broker, JAVA, [...javaBrokerArgs(l), 'kafka.Kafka', l.propsFile], l.dir);
    log(`secure broker starting (pid ${child.pid}), log: ${l.logFile}`);
    await waitForBroker(l, child.pid, 90_000);
  }, log);
  const acls = await createAcls(l);
  log(`secure broker serves SASL_SSL on ${l.address} with ${acls} ACL entries (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// ---------------------------------------------------------------------------
// Registry: Apicurio over HTTPS, basic auth from Quarkus's embedded users

async function registryServes(l: Layout, timeoutMs = 2000): Promise<boolean> {
  if (!existsSync(l.caFile)) return false;
  try {
    const undici = await import('undici');
    const dispatcher = new undici.Agent({ connect: { ca: readFileSync(l.caFile, 'utf8') } });
    try {
      const auth = Buffer.from(`${REGISTRY_USER}:${readPassword(l, `registry-${REGISTRY_USER}`)}`).toString('base64');
      const res = await undici.fetch(`${l.registryUrl}/subjects`, { headers: { authorization: `Basic ${auth}` }, dispatcher, signal: AbortSignal.timeout(timeoutMs) });
      await res.arrayBuffer().catch(() => undefined);
      return res.status === 200;
    } finally {
      await dispatcher.close().catch(() => undefined);
    }
  } catch {
    return false;
  }
}

async function startRegistry(l: Layout, log: (line: string) => void): Promise<void> {
  const jar = await ensureApicurio(log);
  await stopComponent(l.registry, log);
  rmSync(l.registry.outFile, { force: true });
  if (await tcpOpen(HOST, l.registryPort)) throw new Error(`port ${l.registryPort} is in use (set WRIT_SECURE_REGISTRY_PORT)`);
  // Quarkus reads ./config/application.properties from its working directory: the password stays off the command line.
  const configDir = join(l.dir, 'config');
  mkdirSync(configDir, { recursive: true, mode: 0o700 });
  writeSecret(
    join(configDir, 'application.properties'),
    [
      '# generated by src/testing/secure-stack.ts',
      'quarkus.http.auth.basic=true',
      'quarkus.security.users.embedded.enabled=true',
      'quarkus.security.users.embedded.plain-text=true',
      `quarkus.security.users.embedded.users.${REGISTRY_USER}=${readPassword(l, `registry-${REGISTRY_USER}`)}`,
      `quarkus.security.users.embedded.roles.${REGISTRY_USER}=sr-admin`,
      'quarkus.http.auth.permission.everything.paths=/*',
      'quarkus.http.auth.permission.everything.policy=authenticated',
      '',
    ].join('\n'),
  );
  const t0 = Date.now();
  await retryOnPortClash('secure registry', [l.registry.outFile], async () => {
    const child = spawnDetached(
      l.registry,
      JAVA,
      registryJvmArgs(jar, `jdbc:h2:mem:writ-secure-${l.registryPort}`, [
        // HTTPS only: the plain port is not served
        `-Dquarkus.http.port=${l.registryPort + 1}`,
        `-Dquarkus.http.ssl-port=${l.registryPort}`,
        '-Dquarkus.http.insecure-requests=disabled',
        `-Dquarkus.http.ssl.certificate.files=${join(l.tlsDir, 'registry.pem')}`,
        `-Dquarkus.http.ssl.certificate.key-files=${join(l.tlsDir, 'registry.key')}`,
      ]),
      l.dir,
    );
    log(`secure registry starting (pid ${child.pid}), log: ${l.registry.outFile}`);
    const deadline = Date.now() + 120_000;
    while (!(await registryServes(l))) {
      if (child.pid !== undefined && !isAlive(child.pid)) throw new Error(`secure registry JVM (pid ${child.pid}) exited during startup.\n--- ${l.registry.outFile}\n${tailOf(l.registry.outFile)}`);
      if (Date.now() > deadline) throw new Error(`secure registry ${l.registryUrl} did not answer within 120 s.\n--- ${l.registry.outFile}\n${tailOf(l.registry.outFile)}`);
      await sleep(300);
    }
  }, log);
  log(`secure registry serves ${l.registryUrl} (HTTPS, basic auth; ${((Date.now() - t0) / 1000).toFixed(1)} s)`);
}

// ---------------------------------------------------------------------------
// Public API

/**
 * Starts (or reuses, when ours already serves in `dir`) the secure stack.
 * A fresh start makes a new CA, certificates and passwords; `stop()` stops
 * what this call started. One user at a time per stack dir: unlike the plain
 * stack, there is no lease between processes.
 */
export async function ensureSecureStack(opts: SecureStackOptions = {}): Promise<EnsureStackResult> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[secure-stack] ${line}\n`));
  const l = layout(opts);
  const withRegistry = opts.registry !== false;
  mkdirSync(l.dir, { recursive: true });
  const brokerUp = ownedPid(l.broker) !== undefined && (await brokerServes(l));
  const registryUp = !withRegistry || (brokerUp && ownedPid(l.registry) !== undefined && (await registryServes(l)));
  const started: ('broker' | 'registry')[] = [];
  if (brokerUp) log(`reusing the secure broker at ${l.address}`);
  if (brokerUp && withRegistry && registryUp) log(`reusing the secure registry at ${l.registryUrl}`);
  if (!brokerUp || !registryUp) {
    // certificates and passwords are new for each start: whatever of ours still runs goes first
    await Promise.all([stopComponent(l.broker, log), stopComponent(l.registry, log)]);
    await waitForPortsClosed([l.kafkaPort, l.controllerPort, l.internalPort, l.registryPort], 5000);
    const t0 = Date.now();
    await makeCertificates(l);
    makePasswords(l);
    log(`made a CA (${l.caFile}), broker and registry certificates and passwords (${Date.now() - t0} ms)`);
    const tasks: Promise<void>[] = [startBroker(l, log).then(() => void started.push('broker'))];
    if (withRegistry) tasks.push(startRegistry(l, log).then(() => void started.push('registry')));
    const results = await Promise.allSettled(tasks);
    const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
    if (failure !== undefined) {
      await Promise.all([stopComponent(l.broker, log), stopComponent(l.registry, log)]).catch(() => undefined);
      throw failure.reason;
    }
  }
  const secure = info(l, withRegistry);
  let stopped = false;
  return {
    endpoints: { brokers: secure.brokers, registryUrl: secure.registryUrl },
    started: started.length > 0,
    secure,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await Promise.all(started.map((c) => stopComponent(c === 'broker' ? l.broker : l.registry, log)));
    },
  };
}

/** Stops the secure stack in `dir` (broker and registry), whoever started it. Returns their pids. */
export async function stopSecureStack(opts: Pick<SecureStackOptions, 'dir' | 'kafkaPort' | 'registryPort' | 'log'> = {}): Promise<{ broker?: number; registry?: number }> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[secure-stack] ${line}\n`));
  const l = layout(opts);
  const [broker, registry] = await Promise.all([stopComponent(l.broker, log), stopComponent(l.registry, log)]);
  return { ...(broker === undefined ? {} : { broker }), ...(registry === undefined ? {} : { registry }) };
}
