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
// Tenants (`tenants`, named at start): several test suites share one stack
// (one start instead of one each) without seeing each other's state. Tenant
// `t` has SCRAM users of its own (`t-writ-owner`, `t-agent-a`, `t-agent-b`;
// `admin` stays the one super user), topics, groups and transactional ids
// under `t.` (`t.writ.intents`, `t.writ.replies.`, `t.writ.owners`), and the
// same ACLs as the stack's own users on the README's names, for its names
// only: no ACL of one tenant names a topic or group of another, or the
// README's. A start and a reuse hold `<dir>/stack.lock`, so a user that comes
// while another is starting the stack waits, then reuses it.
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
  withLock,
  type ComponentSpec,
} from './local-stack.ts';

/** The SCRAM users of the secure stack. `admin` is a super user (with the broker); the others get the ACLs of {@link secureStackAcls}. */
export const SECURE_USERS = ['admin', 'writ-owner', 'agent-a', 'agent-b'] as const;
export type SecureUserName = (typeof SECURE_USERS)[number];
/** The two agents of the stack. */
export const SECURE_AGENTS = ['agent-a', 'agent-b'] as const;
export type SecureAgentName = (typeof SECURE_AGENTS)[number];
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
  /**
   * Tenants (see the header): made when this call starts the stack; a stack
   * that runs without one of them is not reused (an error says so).
   */
  tenants?: readonly string[];
  /** How long a registry of a reused stack that runs but does not answer is waited for before that is an error. Default 30 s. */
  registryWaitMs?: number;
  log?: (line: string) => void;
}

const TENANT_NAME = /^[a-z][a-z0-9-]{0,31}$/;

/** The names of a tenant's users (by role) and resources; tenant '' is the stack's own, with the README's names. */
export interface SecureTenantNames {
  users: Record<SecureUserName, string>;
  topics: { intents: string; ledger: string; human: string; dlq: string };
  replyPrefix: string;
  groupId: string;
}

function checkTenant(tenant: string): void {
  if (!TENANT_NAME.test(tenant)) throw new Error(`secure stack tenant ${JSON.stringify(tenant)}: lower case letters, digits and '-', starting with a letter, at most 32`);
}

export function secureTenantNames(tenant: string): SecureTenantNames {
  if (tenant !== '') checkTenant(tenant);
  const p = tenant === '' ? '' : `${tenant}.`;
  return {
    users: Object.fromEntries(SECURE_USERS.map((role) => [role, tenant === '' || role === 'admin' ? role : `${tenant}-${role}`])) as Record<SecureUserName, string>,
    topics: { intents: `${p}writ.intents`, ledger: `${p}writ.ledger`, human: `${p}writ.human`, dlq: `${p}writ.dlq` },
    replyPrefix: `${p}writ.replies.`,
    groupId: `${p}writ.owners`,
  };
}

export interface SecureUser {
  username: string;
  password: string;
  /** A file holding only the password (for KAFKA_SASL_PASSWORD_FILE). */
  passwordFile: string;
  mechanism: 'scram-sha-512';
}

/** What a client of one tenant of the secure stack needs: the CA, the users and their passwords, the names. */
export interface SecureTenant extends Omit<SecureTenantNames, 'users'> {
  /** '' for the stack's own users and the README's names. */
  name: string;
  dir: string;
  brokers: string[];
  /** `https://127.0.0.1:<port>/apis/ccompat/v7`, or '' without a registry. */
  registryUrl: string;
  /** The CA certificate (PEM) the broker's and the registry's certificates are signed by. */
  caFile: string;
  /** By role; `admin` is the stack's super user, the same for every tenant. */
  users: Record<SecureUserName, SecureUser>;
  registryAuth: { username: string; password: string; passwordFile: string };
  /** writ's `kafka` config (src/security/transport.ts) for `user`: TLS with the CA, SCRAM-SHA-512. */
  kafka(user: SecureUserName | SecureUser): { ssl: { ca: string }; sasl: { mechanism: 'scram-sha-512'; username: string; password: string } };
  /**
   * The environment variables of an owner, agent or CLI acting as `user` (passwords through their *_FILE
   * variables); a tenant's also name its topics, group and reply prefix (WRIT_INTENTS_TOPIC and the rest).
   */
  env(user: SecureUserName): Record<string, string>;
  /** An agent's reply topic: the reply prefix and its user name, which is its agent id. */
  replyTopic(agent: SecureAgentName): string;
}

/** The stack's own users and names (tenant ''), and its tenants. */
export interface SecureStackInfo extends SecureTenant {
  /** The tenants the stack was started with. */
  tenants: string[];
  /** Tenant `name`'s users and names; throws when the stack was started without it. */
  tenant(name: string): SecureTenant;
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
  /** The tenants of the running stack, one a line (written once it serves). */
  tenantsFile: string;
  lockFile: string;
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
    tenantsFile: join(dir, 'tenants'),
    lockFile: join(dir, 'stack.lock'),
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

/** Every SCRAM user of the stack's own and its tenants' (`admin` once). */
function scramUsers(tenants: readonly string[]): string[] {
  return [...new Set(['', ...tenants].flatMap((t) => Object.values(secureTenantNames(t).users)))];
}

/** New random passwords for every user and the registry, one file each (0600). */
function makePasswords(l: Layout, tenants: readonly string[]): void {
  rmSync(l.secretsDir, { recursive: true, force: true });
  mkdirSync(l.secretsDir, { recursive: true, mode: 0o700 });
  for (const user of [...scramUsers(tenants), `registry-${REGISTRY_USER}`]) writeSecret(passwordFile(l, user), `${newPassword()}\n`);
}

function readPassword(l: Layout, user: string): string {
  return readFileSync(passwordFile(l, user), 'utf8').trim();
}

function tenantInfo(l: Layout, withRegistry: boolean, name: string): SecureTenant {
  const names = secureTenantNames(name);
  const users = Object.fromEntries(
    SECURE_USERS.map((role) => {
      const username = names.users[role];
      return [role, { username, password: readPassword(l, username), passwordFile: passwordFile(l, username), mechanism: 'scram-sha-512' as const }];
    }),
  ) as Record<SecureUserName, SecureUser>;
  const registryAuth = { username: REGISTRY_USER, password: withRegistry ? readPassword(l, `registry-${REGISTRY_USER}`) : '', passwordFile: passwordFile(l, `registry-${REGISTRY_USER}`) };
  const registryUrl = withRegistry ? l.registryUrl : '';
  // The README's names are every writ program's defaults; a tenant's are said.
  const tenantEnv: Record<string, string> = name === '' ? {} : {
    WRIT_INTENTS_TOPIC: names.topics.intents,
    WRIT_LEDGER_TOPIC: names.topics.ledger,
    WRIT_HUMAN_TOPIC: names.topics.human,
    WRIT_DLQ_TOPIC: names.topics.dlq,
    WRIT_GROUP_ID: names.groupId,
    WRIT_REPLY_TOPIC_PREFIX: names.replyPrefix,
  };
  return {
    topics: names.topics,
    replyPrefix: names.replyPrefix,
    groupId: names.groupId,
    name,
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
        ...tenantEnv,
      };
    },
    replyTopic(agent) {
      return `${names.replyPrefix}${users[agent].username}`;
    },
  };
}

function info(l: Layout, withRegistry: boolean, tenants: readonly string[]): SecureStackInfo {
  return {
    ...tenantInfo(l, withRegistry, ''),
    tenants: [...tenants],
    tenant(name) {
      if (!tenants.includes(name)) throw new Error(`the secure stack in ${l.dir} was started without tenant ${JSON.stringify(name)} (its tenants: ${tenants.join(', ') || 'none'})`);
      return tenantInfo(l, withRegistry, name);
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
 * `topics` and the rest: another tenant's names (secureTenantNames).
 */
export function secureStackAcls(
  opts: { owner?: string; agents?: readonly string[]; groupId?: string; replyPrefix?: string; topics?: SecureTenantNames['topics'] } = {},
): AclRule[] {
  const owner = `User:${opts.owner ?? 'writ-owner'}`;
  const group = opts.groupId ?? 'writ.owners';
  const replies = opts.replyPrefix ?? 'writ.replies.';
  const topics = opts.topics ?? secureTenantNames('').topics;
  const rules: AclRule[] = [
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: topics.intents, operations: ['READ', 'WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: topics.ledger, operations: ['READ', 'WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: topics.human, operations: ['WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: topics.dlq, operations: ['WRITE', 'DESCRIBE', 'CREATE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'TOPIC', patternType: 'PREFIXED', resourceName: replies, operations: ['WRITE', 'DESCRIBE', 'DESCRIBE_CONFIGS'] },
    { principal: owner, resourceType: 'GROUP', patternType: 'PREFIXED', resourceName: group, operations: ['READ', 'DESCRIBE'] },
    { principal: owner, resourceType: 'TRANSACTIONAL_ID', patternType: 'PREFIXED', resourceName: group, operations: ['WRITE', 'DESCRIBE'] },
  ];
  for (const agent of opts.agents ?? SECURE_AGENTS) {
    const p = `User:${agent}`;
    rules.push(
      { principal: p, resourceType: 'TOPIC', patternType: 'LITERAL', resourceName: topics.intents, operations: ['WRITE', 'DESCRIBE'] },
      { principal: p, resourceType: 'TOPIC', patternType: 'PREFIXED', resourceName: `${replies}${agent}`, operations: ['CREATE', 'READ', 'DESCRIBE'] },
      { principal: p, resourceType: 'GROUP', patternType: 'PREFIXED', resourceName: `writ.client.${agent}.`, operations: ['READ', 'DESCRIBE', 'DELETE'] },
    );
  }
  return rules;
}

/** Every ACL rule the stack makes at start: its own users' on the README's names, and each tenant's on its names. */
export function secureStackAclRules(tenants: readonly string[]): AclRule[] {
  return ['', ...tenants].flatMap((t) => {
    const n = secureTenantNames(t);
    return secureStackAcls({ owner: n.users['writ-owner'], agents: SECURE_AGENTS.map((a) => n.users[a]), groupId: n.groupId, replyPrefix: n.replyPrefix, topics: n.topics });
  });
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
async function formatStorage(l: Layout, log: (line: string) => void, tenants: readonly string[]): Promise<void> {
  const id = clusterId();
  const users = scramUsers(tenants);
  const scram = users.flatMap((u) => {
    const pw = readPassword(l, u);
    return ['--add-scram', `SCRAM-SHA-512=[name=${u},password=${pw}]`, '--add-scram', `SCRAM-SHA-256=[name=${u},password=${pw}]`];
  });
  log(`formatting KRaft storage in ${l.dataDir} with SCRAM users ${users.join(', ')}`);
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

async function createAcls(l: Layout, tenants: readonly string[]): Promise<number> {
  const admin = adminKafka(l, 10_000).admin();
  try {
    await admin.connect();
    const entries = aclEntries(secureStackAclRules(tenants));
    await admin.createAcls({ acl: entries });
    return entries.length;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

async function startBroker(l: Layout, log: (line: string) => void, tenants: readonly string[]): Promise<void> {
  await ensureKafkaJars(log);
  await stopComponent(l.broker, log);
  rmSync(l.dataDir, { recursive: true, force: true });
  for (const f of [l.logFile, l.broker.outFile]) rmSync(f, { force: true });
  for (const port of [l.kafkaPort, l.controllerPort, l.internalPort]) {
    if (await tcpOpen(HOST, port)) throw new Error(`port ${port} is in use (the secure stack needs ${l.kafkaPort}-${l.internalPort}; set WRIT_SECURE_KAFKA_PORT)`);
  }
  writeBrokerFiles(l, brokerProps(l), 'src/testing/secure-stack.ts');
  const t0 = Date.now();
  await formatStorage(l, log, tenants);
  await retryOnPortClash('secure broker', [l.logFile, l.broker.outFile], async () => {
    const child = spawnDetached(l.broker, JAVA, [...javaBrokerArgs(l), 'kafka.Kafka', l.propsFile], l.dir);
    log(`secure broker starting (pid ${child.pid}), log: ${l.logFile}`);
    await waitForBroker(l, child.pid, 90_000);
  }, log);
  const acls = await createAcls(l, tenants);
  log(`secure broker serves SASL_SSL on ${l.address} with ${acls} ACL entries${tenants.length > 0 ? ` (tenants ${tenants.join(', ')})` : ''} (${((Date.now() - t0) / 1000).toFixed(1)} s)`);
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
  await waitForPortsClosed([l.registryPort, l.registryPort + 1], 5000); // a registry of ours that was killed a moment ago
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

/**
 * A registry of ours that does not answer: 'gone' when its process is not there (or goes while waited for), 'serves'
 * once it answers within `waitMs`; an error when it runs and still does not answer then.
 */
async function registryStillRuns(l: Layout, waitMs: number, log: (line: string) => void): Promise<'gone' | 'serves'> {
  const pid = ownedPid(l.registry);
  if (pid === undefined) return 'gone';
  log(`the secure registry (pid ${pid}) runs but does not answer ${l.registryUrl}/subjects; waiting up to ${Math.round(waitMs / 1000)} s`);
  const deadline = Date.now() + waitMs;
  for (;;) {
    if (ownedPid(l.registry) === undefined) return 'gone';
    if (await registryServes(l)) return 'serves';
    if (Date.now() > deadline) {
      throw new Error(
        `the secure registry of ${l.dir} (pid ${pid}) runs but did not answer ${l.registryUrl}/subjects within ${Math.round(waitMs / 1000)} s; ` +
          `it is not replaced under whoever uses it: stop the stack (WRIT_SECURE_STACK_DIR=${l.dir} npm run kafka:down -- --secure) or see ${l.registry.outFile}`,
      );
    }
    await sleep(300);
  }
}

// ---------------------------------------------------------------------------
// Public API

/**
 * Starts (or reuses, when ours already serves in `dir`) the secure stack. A
 * broker that serves, of a stack whose start finished (its tenants file is
 * written last), is reused, or is an error when it lacks a tenant asked for:
 * it is never restarted under whoever uses it. Its registry, when asked for
 * and not running (it died, or the stack was started without it), is started
 * again with the stack's certificate and password (and no schemas: its
 * database is in memory); one that runs but does not answer is waited for
 * (`registryWaitMs`), then an error, never replaced. A broker that does not serve, or whose start never
 * finished (its starter was killed meanwhile), means a fresh start: a new CA,
 * certificates and passwords. `stop()` stops what this call started, so the
 * process that started a stack others reuse stops it (unlike the plain stack,
 * there are no leases between processes). Holds the stack dir's lock meanwhile.
 */
export async function ensureSecureStack(opts: SecureStackOptions = {}): Promise<EnsureStackResult> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[secure-stack] ${line}\n`));
  const l = layout(opts);
  const withRegistry = opts.registry !== false;
  const asked = [...new Set(opts.tenants ?? [])];
  for (const t of asked) checkTenant(t); // before anything starts
  const registryWaitMs = opts.registryWaitMs ?? 30_000;
  const started: ('broker' | 'registry')[] = [];
  const tenants = await withLock(
    log,
    async () => {
      const brokerRuns = ownedPid(l.broker) !== undefined && (await brokerServes(l));
      // The tenants file is written once the start is done (ACLs made): a broker without it is a start whose
      // process was killed before the end (the start holds this lock, so none is under way), and is started afresh.
      const finished = existsSync(l.tenantsFile);
      if (brokerRuns && !finished) log(`the secure broker at ${l.address} serves, but its start never finished (no ${l.tenantsFile}); starting the stack afresh`);
      if (brokerRuns && finished) {
        // A stack that serves may be someone else's to use (its starter stops it): its broker is reused as it is,
        // or not at all. Its certificates, users and tenants are made at start, so it is never restarted for what
        // it lacks.
        const running = readFileSync(l.tenantsFile, 'utf8').split('\n').filter((t) => t !== '');
        const missing = asked.filter((t) => !running.includes(t));
        if (missing.length > 0) {
          throw new Error(
            `the secure stack in ${l.dir} runs without ${missing.map((t) => `tenant ${t}`).join(', ')} (its tenants: ${running.join(', ') || 'none'}); ` +
              `stop it (WRIT_SECURE_STACK_DIR=${l.dir} npm run kafka:down -- --secure) or use another dir (WRIT_SECURE_STACK_DIR, WRIT_SECURE_KAFKA_PORT, WRIT_SECURE_REGISTRY_PORT)`,
          );
        }
        // Its registry is another matter: one that died (a SIGKILLed run, an OOM) is no one's to use any more, and
        // is started again with the stack's certificate and password. One that runs but is slow to answer (GC, a
        // loaded machine) is waited for, never replaced: its in-memory database holds its users' schemas.
        if (withRegistry && !(await registryServes(l)) && (await registryStillRuns(l, registryWaitMs, log)) === 'gone') {
          log(`the secure broker at ${l.address} serves, its registry does not; starting the registry again`);
          await startRegistry(l, log).catch(async (err: unknown) => {
            await stopComponent(l.registry, log).catch(() => undefined);
            throw err;
          });
          started.push('registry');
        }
        log(`reusing the secure broker at ${l.address}${withRegistry ? ` and ${started.includes('registry') ? 'restarted ' : ''}registry at ${l.registryUrl}` : ''}`);
        return running;
      }
      // certificates and passwords are new for each start: whatever of ours still runs (not serving) goes first
      await Promise.all([stopComponent(l.broker, log), stopComponent(l.registry, log)]);
      await waitForPortsClosed([l.kafkaPort, l.controllerPort, l.internalPort, l.registryPort], 5000);
      rmSync(l.tenantsFile, { force: true });
      const t0 = Date.now();
      await makeCertificates(l);
      makePasswords(l, asked);
      log(`made a CA (${l.caFile}), broker and registry certificates and passwords (${Date.now() - t0} ms)`);
      const tasks: Promise<void>[] = [startBroker(l, log, asked).then(() => void started.push('broker'))];
      if (withRegistry) tasks.push(startRegistry(l, log).then(() => void started.push('registry')));
      const results = await Promise.allSettled(tasks);
      const failure = results.find((r): r is PromiseRejectedResult => r.status === 'rejected');
      if (failure !== undefined) {
        await Promise.all([stopComponent(l.broker, log), stopComponent(l.registry, log)]).catch(() => undefined);
        throw failure.reason;
      }
      writeFileSync(l.tenantsFile, asked.map((t) => `${t}\n`).join(''));
      return asked;
    },
    l.lockFile,
  );
  const secure = info(l, withRegistry, tenants);
  let stopped = false;
  return {
    endpoints: { brokers: secure.brokers, registryUrl: secure.registryUrl },
    started: started.length > 0,
    startedParts: [...started],
    secure,
    stop: async () => {
      if (stopped) return;
      stopped = true;
      await Promise.all(started.map((c) => stopComponent(c === 'broker' ? l.broker : l.registry, log)));
    },
  };
}

/**
 * Stops the secure stack in `dir` (broker and registry), whoever started it. Returns their pids. `registryOnly`: its
 * registry alone (one a reuse started again: the broker is others').
 */
export async function stopSecureStack(opts: Pick<SecureStackOptions, 'dir' | 'kafkaPort' | 'registryPort' | 'log'> & { registryOnly?: boolean } = {}): Promise<{ broker?: number; registry?: number }> {
  const log = opts.log ?? ((line: string) => process.stderr.write(`[secure-stack] ${line}\n`));
  const l = layout(opts);
  const [broker, registry] = await Promise.all([opts.registryOnly === true ? undefined : stopComponent(l.broker, log), stopComponent(l.registry, log)]);
  return { ...(broker === undefined ? {} : { broker }), ...(registry === undefined ? {} : { registry }) };
}
