// Who may write writ's trusted topics (src/doctor/acls.ts), as `writ doctor` and `writ console` report it,
// against real brokers: the shared plain broker (no authorizer: DescribeAcls answers SECURITY_DISABLED) and the
// secure single node (StandardAuthorizer with the README's ACLs; `ensureStack({ secure })`'s default dir and
// port, or WRIT_SECURE_STACK_DIR's, so a stack from `npm run kafka:up -- --secure` or the one `npm test` starts
// for the secure suites is reused, and one this file starts is stopped after). Its principals are the stack's
// own users, on the README's names: the other suites on a shared stack are tenants (test/helpers/secure-tenants.ts),
// whose users, topics and ACLs are named apart, so what this file checks is its own.
// On the secure node one extra ACL lets agent-a Write writ.human; it is removed after the test.
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import kafkajs, { Kafka, logLevel, type AclEntry, type Admin } from "kafkajs";
import { pino } from "pino";
import { afterAll, beforeAll, describe, expect, it, onTestFinished } from "vitest";
import { startConsole } from "../../src/console/server.ts";
import type { AclCheck } from "../../src/doctor/acls.ts";
import type { DoctorReport } from "../../src/doctor/doctor.ts";
import { ensureStack, type EnsureStackResult } from "../../src/testing/local-stack.ts";
import type { SecureStackInfo, SecureUserName } from "../../src/testing/secure-stack.ts";
import { ROOT } from "../helpers/build.ts";
import { brokers } from "../helpers/writ-harness.ts";

const { AclOperationTypes, AclPermissionTypes, AclResourceTypes, ResourcePatternTypes } = kafkajs;

/** The environment of a child process: nothing of the caller's Kafka or writ settings, then `extra`. */
function childEnv(extra: Record<string, string>): NodeJS.ProcessEnv {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(WRIT_|KAFKA_|SCHEMA_REGISTRY_|LOG_LEVEL$)/.test(k)));
  return { ...base, KAFKAJS_NO_PARTITIONER_WARNING: "1", ...extra };
}

function doctor(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string; report?: DoctorReport }> {
  return new Promise((resolve) => {
    execFile(process.execPath, ["src/cli/main.ts", "doctor", ...args], { cwd: ROOT, env: childEnv(env), timeout: 60_000 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1;
      let report: DoctorReport | undefined;
      try {
        report = JSON.parse(stdout) as DoctorReport;
      } catch {
        report = undefined;
      }
      resolve({ code, stdout, stderr, ...(report ? { report } : {}) });
    });
  });
}

const silent = () => pino({ level: "silent" });

describe("the ACL check on a cluster without an authorizer (the shared plain broker)", () => {
  it("writ doctor warns no_authorizer (any client can write the ledger, escalations and replies), in text and --json, and still exits 0", async () => {
    // a reply prefix of this test's own: the shared broker's reply topics are other tests'
    const prefix = `writ.replies.acl-${randomUUID().slice(0, 8)}-`;
    const env = { KAFKA_BROKERS: brokers().join(",") };
    const json = await doctor(["--prefix", prefix, "--json"], env);
    expect(json.code, json.stderr).toBe(0);
    expect(json.report?.ok).toBe(true);
    expect(json.report?.acls).toMatchObject({ status: "warning", reason: "no_authorizer", owners: ["User:writ-owner"], topics: [] });
    expect(json.report?.acls.message).toContain(`any client can write writ.ledger, writ.human, writ.dlq and the reply topics (${prefix}*)`);
    const text = await doctor(["--prefix", prefix], env);
    expect(text.code, text.stderr).toBe(0);
    expect(text.stdout.trimEnd().split("\n").at(-1)).toMatch(/^ACL WARNING \(no_authorizer\): the cluster has no authorizer .*"Running with SASL\/TLS and ACLs"/);
  });

  it("writ console logs the warning and exposes it in /api/session and the state's trust", async () => {
    const id = randomUUID().slice(0, 8);
    const token = `read-${randomUUID()}`;
    const logged: string[] = [];
    const server = await startConsole({
      brokers: brokers(),
      topics: { intents: `acl-${id}.intents`, human: `acl-${id}.human`, dlq: `acl-${id}.dlq` },
      ledgerTopic: `acl-${id}.ledger`,
      replyPrefix: `writ.replies.acl-${id}-`,
      token,
      discoverIntervalMs: 300,
      logger: pino({ level: "info" }, { write: (line: string) => void logged.push(line) }),
    });
    onTestFinished(() => server.close());
    await server.ready;
    const bearer = { authorization: `Bearer ${token}` };
    const session = (await (await fetch(`${server.url}/api/session`, { headers: bearer })).json()) as { trust: AclCheck | null };
    expect(session.trust).toMatchObject({ status: "warning", reason: "no_authorizer" });
    expect(session.trust?.message).toContain(`any client can write acl-${id}.ledger, acl-${id}.human, acl-${id}.dlq`);
    const state = (await (await fetch(`${server.url}/api/state`, { headers: bearer })).json()) as { trust: AclCheck | null };
    expect(state.trust?.reason).toBe("no_authorizer");
    const warning = logged.map((l) => JSON.parse(l) as { level: number; msg: string; reason?: string }).find((l) => l.reason === "no_authorizer");
    expect(warning).toMatchObject({ level: 40 });
    expect(warning?.msg).toMatch(/^ACL check: the cluster has no authorizer/);
  });
});

describe("the ACL check on the secure node (StandardAuthorizer, the README's ACLs)", () => {
  let stack: EnsureStackResult | undefined;
  let s: SecureStackInfo;
  const extra: AclEntry = {
    principal: "User:agent-a",
    host: "*",
    resourceType: AclResourceTypes.TOPIC,
    resourceName: "writ.human",
    resourcePatternType: ResourcePatternTypes.LITERAL,
    operation: AclOperationTypes.WRITE,
    permissionType: AclPermissionTypes.ALLOW,
  };
  const adminKafka = () =>
    new Kafka({ clientId: "doctor-acls-test", brokers: s.brokers, ssl: { ca: [readFileSync(s.caFile, "utf8")] }, sasl: s.kafka("admin").sasl, logLevel: logLevel.NOTHING, retry: { retries: 2 } });
  /** Runs `fn` with an admin client of the super user `admin`. */
  const asAdmin = async (fn: (admin: Admin) => Promise<unknown>) => {
    const admin = adminKafka().admin();
    await admin.connect();
    try {
      await fn(admin);
    } finally {
      await admin.disconnect();
    }
  };
  const removeExtra = () => asAdmin((admin) => admin.deleteAcls({ filters: [extra] }));
  const env = (user: SecureUserName) => s.env(user);

  beforeAll(async () => {
    stack = await ensureStack({ secure: { registry: false }, log: (l) => console.log(`[secure-stack] ${l}`) });
    s = stack.secure!;
  }, 180_000);
  afterAll(async () => {
    if (stack === undefined) return;
    await removeExtra().catch(() => undefined);
    await stack.stop();
  });

  it("the README's ACLs: owners_only; one more ACL letting agent-a Write writ.human: foreign_writers naming User:agent-a (doctor and console); removed: owners_only again", async () => {
    const clean = await doctor(["--json"], env("admin"));
    expect(clean.code, clean.stderr).toBe(0);
    expect(clean.report?.acls).toMatchObject({ status: "ok", reason: "owners_only", owners: ["User:writ-owner"] });
    const writersOf = (r: DoctorReport | undefined) => Object.fromEntries((r?.acls.topics ?? []).map((t) => [t.topic, t.writers.map((w) => w.principal)]));
    expect(writersOf(clean.report)).toEqual({
      "writ.intents": ["User:writ-owner", "User:agent-a", "User:agent-b"],
      "writ.ledger": ["User:writ-owner"],
      "writ.human": ["User:writ-owner"],
      "writ.dlq": ["User:writ-owner"],
      "writ.replies.*": ["User:writ-owner"],
    });

    await asAdmin((admin) => admin.createAcls({ acl: [extra] }));
    try {
      const forged = await doctor(["--json"], env("admin"));
      expect(forged.code, forged.stderr).toBe(0);
      expect(forged.report?.acls).toMatchObject({ status: "warning", reason: "foreign_writers" });
      expect(forged.report?.acls.topics.find((t) => t.topic === "writ.human")).toMatchObject({
        foreign: ["User:agent-a"],
        writers: [
          { principal: "User:writ-owner", owner: true },
          { principal: "User:agent-a", host: "*", patternType: "literal", resourceName: "writ.human", owner: false },
        ],
      });
      expect(forged.report?.acls.message).toContain("User:agent-a may write writ.human (escalations)");
      const text = await doctor([], env("admin"));
      expect(text.stdout).toContain("ACL writ.human: Write allowed to User:writ-owner (literal writ.human), User:agent-a (literal writ.human) NOT AN OWNER");
      expect(text.stdout).toMatch(/ACL WARNING \(foreign_writers\): principals other than the owners \(User:writ-owner\) may write trusted topics: User:agent-a may write writ.human/);
      // agent-a named as an owner (--owner-principal, a bare SASL user name) is no longer foreign
      const owned = await doctor(["--json", "--owner-principal", "writ-owner,agent-a"], env("admin"));
      expect(owned.report?.acls).toMatchObject({ reason: "owners_only", owners: ["User:writ-owner", "User:agent-a"] });

      // the console, as admin, says so too
      const token = `read-${randomUUID()}`;
      const id = randomUUID().slice(0, 8);
      const server = await startConsole({
        brokers: s.brokers,
        connection: { kafka: s.kafka("admin") },
        topics: { intents: "writ.intents", human: "writ.human", dlq: "writ.dlq" },
        replyPrefix: `writ.replies.acl-${id}-`,
        token,
        logger: silent(),
      });
      onTestFinished(() => server.close());
      await server.ready;
      const session = (await (await fetch(`${server.url}/api/session`, { headers: { authorization: `Bearer ${token}` } })).json()) as { trust: AclCheck };
      expect(session.trust).toMatchObject({ status: "warning", reason: "foreign_writers" });
      expect(session.trust.topics.find((t) => t.topic === "writ.human")?.foreign).toEqual(["User:agent-a"]);
    } finally {
      await removeExtra();
    }
    const again = await doctor(["--json"], env("admin"));
    expect(again.report?.acls.reason).toBe("owners_only");
  });

  it("a topic of writ's that no ACL names (owners running with another dead-letter topic): owners_cannot_write, in --json and text", async () => {
    const dlq = `writ.dlq.unnamed-${randomUUID().slice(0, 8)}`;
    const json = await doctor(["--json"], { ...env("admin"), WRIT_DLQ_TOPIC: dlq });
    expect(json.code, json.stderr).toBe(0);
    expect(json.report?.acls).toMatchObject({ status: "warning", reason: "owners_cannot_write" });
    expect(json.report?.acls.topics.filter((t) => !t.ownersMayWrite).map((t) => [t.topic, t.noAcl, t.writers])).toEqual([[dlq, true, []]]);
    expect(json.report?.acls.message).toContain(`no ACL names ${dlq} at all, so on brokers with allow.everyone.if.no.acl.found=true`);
    const text = await doctor([], { ...env("admin"), WRIT_DLQ_TOPIC: dlq });
    expect(text.stdout).toContain(`ACL ${dlq}: no ACL names it (super users only; anyone if allow.everyone.if.no.acl.found=true) OWNERS MAY NOT WRITE`);
    expect(text.stdout).toMatch(/ACL WARNING \(owners_cannot_write\): no ACL lets the owners \(User:writ-owner\) write writ\.dlq\.unnamed-/);
  });

  it("what the check cannot see: Kafka hides super.users and allow.everyone.if.no.acl.found from DescribeConfigs, even to a super user", async () => {
    // Pinned so that the day a Kafka version shows them, the check (src/doctor/acls.ts) is taught to read them:
    // until then, a topic no ACL names is reported as `noAcl` with both readings, never as safe.
    await asAdmin(async (admin) => {
      const described = await admin.describeConfigs({
        includeSynonyms: false,
        resources: [{ type: kafkajs.ConfigResourceTypes.BROKER, name: "1", configNames: ["super.users", "allow.everyone.if.no.acl.found"] }],
      });
      const entries = Object.fromEntries(described.resources[0]!.configEntries.map((e) => [e.configName, { value: e.configValue, sensitive: e.isSensitive }]));
      expect(entries).toEqual({
        "super.users": { value: null, sensitive: true },
        "allow.everyone.if.no.acl.found": { value: null, sensitive: true },
      });
    });
  });

  it("a principal that may not describe ACLs (the owner: no Describe on the cluster) is told so, and the run goes on", async () => {
    const owner = await doctor(["--json"], env("writ-owner"));
    expect(owner.code, owner.stderr).toBe(0);
    expect(owner.report?.acls).toMatchObject({ status: "unknown", reason: "acls_not_visible", error: "CLUSTER_AUTHORIZATION_FAILED" });
    expect(owner.report?.acls.message).toContain("may not describe ACLs");
  });
});
