// The secure transport end to end, on a broker of its own: a SASL_SSL listener (SCRAM-SHA-512, TLS from
// a CA made at start) with ACLs enforced by the broker (StandardAuthorizer), and the Apicurio registry
// over HTTPS with basic auth (Quarkus's embedded users: Apicurio 3's own basic auth needs an OIDC server,
// Quarkus's does not). src/testing/secure-stack.ts starts both in beforeAll (its own dir and ports, beside
// the shared plain stack) and they are stopped afterwards; or, when WRIT_SECURE_STACK_DIR names one (`npm test`
// starts one for the secure suites: scripts/test.mjs), that stack is used and left running.
//
// The file acts as its own tenant of the stack (TENANT): SCRAM users, topics, groups and ACLs of its own, so
// no other suite on a shared stack sees or touches what it does. An owner (the CLI, as a process, the
// tenant's writ-owner), agent-a (an in-process client and `writ submit`, the tenant's agent-a), agent-b (the
// MCP server over HTTP with a bearer token, the tenant's agent-b), a client with a wrong password. Every log
// line they write is captured and searched for every secret at the end.
import { spawn, type ChildProcess } from "node:child_process";
import { generateKeyPairSync, randomUUID, type KeyObject } from "node:crypto";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { readRecord } from "../../examples/example-stack.ts";
import { refundPayment } from "../../examples/demo-tools.ts";
import { createWritClient, type WritClient } from "../../producers/writ-client.ts";
import { WireCodec } from "../../src/codec.ts";
import { REDACT_PATHS, type Logger } from "../../src/logger.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { ensureStack, type EnsureStackResult } from "../../src/testing/local-stack.ts";
import type { SecureAgentName, SecureTenant } from "../../src/testing/secure-stack.ts";
import { ROOT } from "../helpers/build.ts";
import { SECURE_TENANTS } from "../helpers/secure-tenants.ts";
import { waitFor } from "../helpers/wait-for.ts";

// The file's own stack, when no shared one is named. Below the ephemeral range, as every stack's
// (src/testing/local-stack.ts's header says why).
const OWN_STACK = { dir: join(ROOT, ".cache", "run-secure-test"), kafkaPort: 22592, registryPort: 22581 };
const SHARED = (process.env.WRIT_SECURE_STACK_DIR ?? "") !== "";
/** The ports ensureSecureStack takes: the shared stack's (its variables, else its defaults) or this file's. */
const PORTS = SHARED ? { kafka: Number(process.env.WRIT_SECURE_KAFKA_PORT || 19492), registry: Number(process.env.WRIT_SECURE_REGISTRY_PORT || 18481) } : { kafka: OWN_STACK.kafkaPort, registry: OWN_STACK.registryPort };
const TENANT = SECURE_TENANTS.secureTest;
const MCP_TOKEN = `mcp-token-${randomUUID()}`;
const WRONG_PASSWORD = `wrong-${randomUUID()}`;

let stack: EnsureStackResult | undefined;
let s: SecureTenant;
let records: DemoRecordsServer;
let owner: ChildProcess | undefined;
let ownerLog = "";
const logDir = mkdtempSync(join(tmpdir(), "writ-secure-logs-"));
/** Every log captured, by what wrote it: searched for secrets at the end. */
const logs = new Map<string, () => string>();
const keys: Record<SecureAgentName, { privateKey: KeyObject; pem: string; publicPem: string }> = {
  "agent-a": keyPair(),
  "agent-b": keyPair(),
};
const clients: WritClient[] = [];
let startSeconds = 0;

function keyPair() {
  const k = generateKeyPairSync("ed25519");
  return { privateKey: k.privateKey, pem: k.privateKey.export({ type: "pkcs8", format: "pem" }).toString(), publicPem: k.publicKey.export({ type: "spki", format: "pem" }).toString() };
}

/** A pino logger like createLogger's (same redaction), at debug, into a file. */
function fileLogger(name: string): Logger {
  const file = join(logDir, `${name}.log`);
  logs.set(name, () => readFileSync(file, "utf8"));
  return pino({ name: "writ", level: "debug", redact: REDACT_PATHS }, pino.destination({ dest: file, sync: true }));
}

/** The environment of a child process: nothing of the caller's Kafka, registry or writ settings. */
function childEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(WRIT_|KAFKA_|SCHEMA_REGISTRY_|LOG_LEVEL$)/.test(k)));
  return { ...base, LOG_LEVEL: "debug", KAFKAJS_NO_PARTITIONER_WARNING: "1", ...extra };
}

function run(args: string[], env: NodeJS.ProcessEnv, timeoutMs = 60_000): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolve, reject) => {
    const child = spawn(process.execPath, args, { cwd: ROOT, env, stdio: ["ignore", "pipe", "pipe"] });
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (d: Buffer) => (stdout += d.toString()));
    child.stderr.on("data", (d: Buffer) => (stderr += d.toString()));
    const timer = setTimeout(() => child.kill("SIGKILL"), timeoutMs);
    child.on("error", reject);
    child.on("close", (code) => {
      clearTimeout(timer);
      resolve({ code: code ?? 1, stdout, stderr });
    });
  });
}

/** An agent's id: its SCRAM user's name (the ACLs name its reply topics and groups after it). */
const agentId = (agent: SecureAgentName) => s.users[agent].username;

function agentClient(agent: SecureAgentName, name: string, overrides: { password?: string } = {}) {
  const user = s.users[agent];
  return createWritClient({
    brokers: s.brokers,
    kafka: s.kafka({ ...user, ...(overrides.password ? { password: overrides.password } : {}) }),
    agentId: agentId(agent),
    replyTopic: s.replyTopic(agent),
    replyTopicPrefix: s.replyPrefix,
    intentsTopic: s.topics.intents,
    schemaRegistryUrl: s.registryUrl,
    schemaRegistryAuth: { username: s.registryAuth.username, password: s.registryAuth.password },
    schemaRegistryTls: { ca: s.caFile },
    signer: { keyId: `${agent}-1`, privateKey: keys[agent].privateKey },
    submitTimeoutMs: 30_000,
    logger: fileLogger(name),
  });
}

const refund = (runId: string, version: string, amountCents: number) => ({
  tool: refundPayment,
  entity: { type: "payment", id: "pay_1" },
  runId,
  stepId: `refund-${amountCents}`,
  baseVersion: version,
  delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "late" as const } }],
  params: { amountCents, reason: "late" },
});

/** A kafkajs client as `user` (for what writ's own clients would not try). */
function rawKafka(user: SecureAgentName) {
  return new Kafka({ clientId: `secure-test-${user}`, brokers: s.brokers, ...sslSasl(user), logLevel: logLevel.NOTHING, retry: { retries: 1 } });
}
function sslSasl(user: SecureAgentName) {
  return { ssl: { ca: [readFileSync(s.caFile, "utf8")] }, sasl: { mechanism: "scram-sha-512" as const, username: s.users[user].username, password: s.users[user].password } };
}

beforeAll(async () => {
  const t0 = Date.now();
  stack = await ensureStack({ secure: { ...(SHARED ? {} : OWN_STACK), tenants: [TENANT] }, log: (l) => console.log(`[secure-stack] ${l}`) });
  startSeconds = (Date.now() - t0) / 1000;
  console.log(`[secure-stack] ${stack.started ? "started" : "reused"} in ${startSeconds.toFixed(1)} s`);
  s = stack.secure!.tenant(TENANT);
  records = await startDemoRecordsServer({ port: 0 });
  records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });

  const registryFile = join(logDir, "agents.json");
  writeFileSync(
    registryFile,
    JSON.stringify({
      agents: Object.fromEntries(
        (["agent-a", "agent-b"] as const).map((a) => [agentId(a), { keys: [{ id: `${a}-1`, publicKey: keys[a].publicPem }], tools: ["refund_payment", "tag_ticket"], replyTopic: s.replyTopic(a) }]),
      ),
    }),
  );
  owner = spawn(process.execPath, ["src/cli/main.ts", "owner", "--tools", "examples/demo-tools.ts"], {
    cwd: ROOT,
    env: childEnv({
      ...s.env("writ-owner"),
      RECORDS_URL: records.url,
      WRIT_AGENT_REGISTRY: registryFile,
      WRIT_INTENT_PARTITIONS: "2",
      WRIT_SESSION_TIMEOUT_MS: "10000",
      WRIT_SOR_TIMEOUT_MS: "1500",
    }),
    stdio: ["ignore", "pipe", "pipe"],
  });
  owner.stdout!.on("data", (d: Buffer) => (ownerLog += d.toString()));
  owner.stderr!.on("data", (d: Buffer) => (ownerLog += d.toString()));
  logs.set("owner (writ owner, SCRAM writ-owner)", () => ownerLog);
  await waitFor(() => ownerLog.includes('"msg":"owner started"') || owner!.exitCode !== null, { timeoutMs: 90_000, message: () => `the owner did not start:\n${ownerLog.slice(-3000)}` });
  expect(owner.exitCode, ownerLog.slice(-3000)).toBeNull();
}, 240_000);

afterAll(async () => {
  await Promise.all(clients.map((c) => c.close().catch(() => undefined)));
  if (owner && owner.exitCode === null) {
    owner.kill("SIGTERM");
    await waitFor(() => owner!.exitCode !== null, { timeoutMs: 30_000 }).catch(() => owner!.kill("SIGKILL"));
  }
  await records?.close();
  await stack?.stop();
  rmSync(logDir, { recursive: true, force: true });
}, 120_000);

describe("SASL/SCRAM, TLS and ACLs on a secure broker", () => {
  it("the secure stack starts in reasonable time (CA, certificates, SCRAM users, ACLs, HTTPS registry)", () => {
    expect(s.brokers).toEqual([`127.0.0.1:${PORTS.kafka}`]);
    expect(s.registryUrl).toBe(`https://127.0.0.1:${PORTS.registry}/apis/ccompat/v7`);
    if (stack?.started) expect(startSeconds).toBeLessThan(90);
  });

  it("agent-a (its own SCRAM user, signed) submits through an owner on SASL_SSL and gets applied, written once at the records server", async () => {
    const agentA = await agentClient("agent-a", "client agent-a");
    clients.push(agentA);
    const { version } = await readRecord(records.url, "payment", "pay_1");
    const intent = agentA.buildIntent(refund(`run-${randomUUID()}`, version, 700));
    const reply = await agentA.submit(intent);
    expect(reply).toMatchObject({ status: "applied" });
    expect(records.patchRequests(intent.intentKey)).toHaveLength(1);
    expect((await readRecord<{ refunds: unknown[] }>(records.url, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("the registry over HTTPS with basic auth: writ registered its schemas there; without or with wrong credentials it answers 401", async () => {
    const undici = await import("undici");
    const dispatcher = new undici.Agent({ connect: { ca: readFileSync(s.caFile, "utf8") } });
    const get = (auth?: string) => undici.fetch(`${s.registryUrl}/subjects`, { dispatcher, ...(auth ? { headers: { authorization: `Basic ${Buffer.from(auth).toString("base64")}` } } : {}) });
    try {
      const ok = await get(`${s.registryAuth.username}:${s.registryAuth.password}`);
      expect(ok.status).toBe(200);
      expect(await ok.json()).toEqual(expect.arrayContaining([`${s.topics.intents}-value`, `${s.replyTopic("agent-a")}-value`]));
      expect((await get()).status).toBe(401);
      expect((await get(`${s.registryAuth.username}:${WRONG_PASSWORD}`)).status).toBe(401);
    } finally {
      await dispatcher.close();
    }
    // writ's codec: with the right credentials a framed value's schema id is looked up (its own fetch, over TLS);
    // with a wrong password the registry's 401 is a clear error, without the password
    const framed = (id: number) => Buffer.concat([Buffer.from([0, 0, 0, 0, id]), Buffer.from("{}")]);
    const good = new WireCodec({ schemaRegistryUrl: s.registryUrl, schemaRegistryAuth: { username: s.registryAuth.username, password: s.registryAuth.password }, schemaRegistryTls: { ca: s.caFile } });
    // (no throw: the registry answered; "{}" is no Reply, whether or not id 1 is known)
    expect(await good.decode("Reply", framed(1))).toMatchObject({ ok: false });
    const bad = new WireCodec({ schemaRegistryUrl: s.registryUrl, schemaRegistryAuth: { username: s.registryAuth.username, password: WRONG_PASSWORD }, schemaRegistryTls: { ca: s.caFile } });
    const err = await bad.decode("Reply", framed(1)).then(
      () => undefined,
      (e: unknown) => e as Error,
    );
    expect(err?.message ?? "").toMatch(/looking up schema id 1 answered 401/);
    expect(JSON.stringify(err, Object.getOwnPropertyNames(err ?? {}))).not.toContain(WRONG_PASSWORD);
  });

  it("the CLI: `writ submit` as agent-a over SASL_SSL (password and registry password in the environment, a signing key file) is applied", async () => {
    const keyFile = join(logDir, "agent-a.key.pem");
    writeFileSync(keyFile, keys["agent-a"].pem, { mode: 0o600 });
    const { version } = await readRecord(records.url, "payment", "pay_1");
    const env = childEnv({
      ...s.env("agent-a"),
      KAFKA_SASL_PASSWORD_FILE: "",
      KAFKA_SASL_PASSWORD: s.users["agent-a"].password,
      SCHEMA_REGISTRY_PASSWORD_FILE: "",
      SCHEMA_REGISTRY_PASSWORD: s.registryAuth.password,
    });
    const args = ["src/cli/main.ts", "submit", "--tools", "examples/demo-tools.ts", "--tool", "refund_payment", "--entity", "payment:pay_1", "--base-version", version];
    const more = ["--delta", JSON.stringify([{ op: "add", path: "/refunds/-", value: { amountCents: 800, reason: "late" } }]), "--params", JSON.stringify({ amountCents: 800, reason: "late" })];
    const who = ["--run-id", `cli-${randomUUID()}`, "--step-id", "s1", "--agent", agentId("agent-a"), "--signing-key", keyFile, "--key-id", "agent-a-1", "--timeout-ms", "30000"];
    const r = await run([...args, ...more, ...who], env);
    logs.set("writ submit (stdout and stderr)", () => r.stdout + r.stderr);
    expect(r.code, r.stderr).toBe(0);
    expect(JSON.parse(r.stdout.trim())).toMatchObject({ status: "applied" });
    // an operator (the admin user) reads agent-a's replies with `writ tail`, kafkajs's own debug logs on
    const tail = await run(
      ["src/cli/main.ts", "tail", "replies", "--topic", s.replyTopic("agent-a"), "-n", "5", "--json"],
      childEnv({ ...s.env("admin"), KAFKA_SASL_PASSWORD_FILE: "", KAFKA_SASL_PASSWORD: s.users.admin.password }),
    );
    logs.set("writ tail as admin, LOG_LEVEL=debug (stdout and stderr)", () => tail.stdout + tail.stderr);
    expect(tail.code, tail.stderr.slice(-2000)).toBe(0);
    const statuses = tail.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { value?: { status?: string } }).value?.status);
    expect(statuses).toEqual(["applied", "applied"]);
  });

  it("agent-b may not read agent-a's replies: the broker itself refuses the topic (TOPIC_AUTHORIZATION_FAILED) and agent-a's groups (GROUP_AUTHORIZATION_FAILED)", async () => {
    // agent-b's own reply topic and group work
    const agentB = await agentClient("agent-b", "client agent-b");
    clients.push(agentB);
    // consuming agent-a's reply topic in agent-b's own group
    const consumer = rawKafka("agent-b").consumer({ groupId: `writ.client.${agentId("agent-b")}.${randomUUID()}` });
    await consumer.connect();
    try {
      const err = await consumer.subscribe({ topic: s.replyTopic("agent-a"), fromBeginning: true }).then(
        () => undefined,
        (e: unknown) => e as { type?: string; message: string },
      );
      expect(err?.type, err?.message).toBe("TOPIC_AUTHORIZATION_FAILED");
    } finally {
      await consumer.disconnect();
    }
    // one of agent-a's consumer groups (the client's offsets live there). kafkajs reports the broker's
    // FindCoordinator answer only in its debug log ("Failed to find group coordinator" is what it throws).
    const answers: string[] = [];
    const admin = new Kafka({
      clientId: "secure-test-agent-b-groups",
      brokers: s.brokers,
      ...sslSasl("agent-b"),
      retry: { retries: 1 },
      logLevel: logLevel.DEBUG,
      logCreator: () => ({ log }) => {
        const type = (log as { error?: { type?: unknown } }).error?.type;
        if (typeof type === "string") answers.push(type);
      },
    }).admin();
    await admin.connect();
    try {
      const err = await admin.fetchOffsets({ groupId: `writ.client.${agentId("agent-a")}.${randomUUID()}`, topics: [s.replyTopic("agent-b")] }).then(
        () => undefined,
        (e: unknown) => e as Error,
      );
      expect(err?.message).toMatch(/group coordinator/);
      expect(answers).toContain("GROUP_AUTHORIZATION_FAILED");
      // its own groups are fine
      await expect(admin.fetchOffsets({ groupId: `writ.client.${agentId("agent-b")}.${randomUUID()}`, topics: [s.replyTopic("agent-b")] })).resolves.toBeDefined();
    } finally {
      await admin.disconnect();
    }
    // a writ client of agent-b pointed at agent-a's reply topic
    const stolen = await createWritClient({
      brokers: s.brokers,
      kafka: s.kafka("agent-b"),
      agentId: agentId("agent-b"),
      replyTopic: s.replyTopic("agent-a"),
      replyTopicPrefix: s.replyPrefix,
      intentsTopic: s.topics.intents,
      logger: fileLogger("client agent-b on agent-a's topic"),
    }).then(
      (c) => {
        clients.push(c);
        return undefined;
      },
      (e: unknown) => e as { type?: string; message: string },
    );
    expect(stolen?.message).toBe(`creating topics failed: ${s.replyTopic("agent-a")}: TOPIC_AUTHORIZATION_FAILED`);
  });

  it("a client with a wrong password fails to connect with a clear error that does not contain the password", async () => {
    const t0 = Date.now();
    const err = await agentClient("agent-a", "client wrong password", { password: WRONG_PASSWORD }).then(
      (c) => {
        clients.push(c);
        return undefined;
      },
      (e: unknown) => e as Error,
    );
    expect(err?.message).toMatch(/SASL SCRAM SHA512 authentication failed.*invalid credentials/);
    expect(JSON.stringify(err, Object.getOwnPropertyNames(err ?? {}))).not.toContain(WRONG_PASSWORD);
    expect(Date.now() - t0).toBeLessThan(30_000);
    // the CLI: one line naming the failure, exit 2
    const r = await run(["src/cli/main.ts", "topics", "check"], childEnv({ ...s.env("agent-a"), KAFKA_SASL_PASSWORD_FILE: "", KAFKA_SASL_PASSWORD: WRONG_PASSWORD }));
    logs.set("writ topics check, wrong password", () => r.stdout + r.stderr);
    expect(r.code).toBe(2);
    expect(r.stderr).toMatch(/writ topics: Kafka: SASL SCRAM SHA512 authentication failed/);
  });

  it("the MCP server over HTTP (agent-b, SASL_SSL) takes its bearer token from validated config: 401 without it, served with it", async () => {
    const mcp = spawn(process.execPath, ["producers/mcp-main.ts", "--http", "--port", "0"], {
      cwd: ROOT,
      env: childEnv({
        ...s.env("agent-b"),
        KAFKA_SASL_PASSWORD_FILE: "",
        KAFKA_SASL_PASSWORD: s.users["agent-b"].password,
        WRIT_MCP_AGENT_ID: agentId("agent-b"),
        WRIT_MCP_TOKEN: MCP_TOKEN,
        RECORDS_URL: records.url,
      }),
      stdio: ["ignore", "pipe", "pipe"],
    });
    let out = "";
    mcp.stdout!.on("data", (d: Buffer) => (out += d.toString()));
    mcp.stderr!.on("data", (d: Buffer) => (out += d.toString()));
    logs.set("MCP server (agent-b)", () => out);
    try {
      const url = await waitFor(() => /writ MCP server: (http:\S+)/.exec(out)?.[1] ?? (mcp.exitCode !== null ? "exited" : undefined), { timeoutMs: 60_000, message: () => out.slice(-3000) });
      expect(url, out.slice(-3000)).not.toBe("exited");
      const initialize = (token?: string) =>
        fetch(url, {
          method: "POST",
          headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...(token ? { authorization: `Bearer ${token}` } : {}) },
          body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "secure-test", version: "1" } } }),
        });
      expect((await initialize()).status).toBe(401);
      expect((await initialize(`${MCP_TOKEN}x`)).status).toBe(401);
      const ok = await initialize(MCP_TOKEN);
      expect(ok.status).toBe(200);
      await ok.body?.cancel();
    } finally {
      mcp.kill("SIGTERM");
      await waitFor(() => mcp.exitCode !== null || mcp.signalCode !== null, { timeoutMs: 20_000 }).catch(() => mcp.kill("SIGKILL"));
    }
  });

  it("no secret is ever logged: the owner's, the clients', the CLI's and the MCP server's logs hold none of the passwords, the token or the signing keys", async () => {
    // the owner's shutdown lines too
    owner!.kill("SIGTERM");
    await waitFor(() => owner!.exitCode !== null, { timeoutMs: 30_000, message: () => ownerLog.slice(-2000) });
    expect(owner!.exitCode, ownerLog.slice(-2000)).toBe(0);
    await Promise.all(clients.splice(0).map((c) => c.close()));

    const secrets: [string, string][] = [
      ...Object.values(s.users).map((u) => [`SCRAM password of ${u.username}`, u.password] as [string, string]),
      ["the wrong SCRAM password", WRONG_PASSWORD],
      ["the registry password", s.registryAuth.password],
      ["the registry's basic auth header", Buffer.from(`${s.registryAuth.username}:${s.registryAuth.password}`).toString("base64")],
      ["the MCP bearer token", MCP_TOKEN],
      ...(["agent-a", "agent-b"] as const).flatMap((a) =>
        keys[a].pem
          .split("\n")
          .filter((line) => line.length > 0 && !line.startsWith("-----"))
          .map((line) => [`${a}'s signing key`, line] as [string, string]),
      ),
    ];
    let lines = 0;
    for (const [writer, read] of logs) {
      const text = read();
      const count = text.split("\n").filter((l) => l.trim() !== "").length;
      lines += count;
      console.log(`[secure] ${writer}: ${count} log lines checked`);
      for (const [what, secret] of secrets) expect(text.includes(secret), `${what} appears in the log of ${writer}`).toBe(false);
    }
    // the check saw real logs: the owner at debug, the clients, the CLI and the MCP server
    expect(ownerLog.split("\n").length).toBeGreaterThan(5);
    expect(logs.size).toBeGreaterThanOrEqual(8);
    expect(lines).toBeGreaterThan(20);
  });
});

