// The `writ` command as installed: the BUILT cli (dist/src/cli/main.js, the
// package's "bin") run as a child process by plain node with type stripping
// off, against the shared broker. Each command once: --version and help,
// topics ensure/check, owner (with a plain-JS tools module), submit, tail,
// escalations, doctor and verify. The run's topics and group are its own.
import { execFile, spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { type Admin, type ConfigResourceTypes, Kafka, logLevel } from "kafkajs";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import * as demoTools from "../../examples/demo-tools.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { BUILT_CLI, ROOT, ensureBuilt } from "../helpers/build.ts";
import { commandEnv } from "../helpers/command-env.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const brokers = inject("kafkaBrokers") || process.env.KAFKA_BROKERS || "127.0.0.1:19092";
const registry = inject("schemaRegistryUrl") || process.env.SCHEMA_REGISTRY_URL || "";
const id = randomUUID().slice(0, 8);
const topics = { intents: `cli-${id}.intents`, ledger: `cli-${id}.ledger`, human: `cli-${id}.human`, dlq: `cli-${id}.dlq` };
const agent = `cli-${id}`;
const replyTopic = `writ.replies.${agent}`;
const COMPOSE_TOOLS = join(ROOT, "examples", "compose", "tools.js");
const VERSION = (await import("../../package.json", { with: { type: "json" } })).default.version;

let records: DemoRecordsServer;
let admin: Admin;
let owner: ChildProcess | undefined;
let ownerStderr = "";
const extraTopics: string[] = [];

/** The environment of every command: this run's topics and group, nothing from the caller's WRIT_* or LOG_LEVEL. */
function env(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  return commandEnv(brokers, registry, topics, {
    WRIT_GROUP_ID: `cli-${id}.owners`,
    WRIT_INTENT_PARTITIONS: "2",
    WRIT_SOR_TIMEOUT_MS: "1500",
    WRIT_SESSION_TIMEOUT_MS: "10000",
    RECORDS_URL: records.url,
    ...extra,
  });
}

interface Run {
  code: number;
  stdout: string;
  stderr: string;
}

/** `node --no-experimental-strip-types dist/src/cli/main.js …`: the built JavaScript only. */
function writ(args: string[], opts: { env?: NodeJS.ProcessEnv; input?: string; stripTypes?: boolean; timeoutMs?: number } = {}): Promise<Run> {
  const nodeArgs = opts.stripTypes ? [BUILT_CLI, ...args] : ["--no-experimental-strip-types", BUILT_CLI, ...args];
  return new Promise((resolveRun) => {
    const child = execFile(process.execPath, nodeArgs, { cwd: ROOT, env: opts.env ?? env(), timeout: opts.timeoutMs ?? 60_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      const code = error === null ? 0 : typeof error.code === "number" ? error.code : 1;
      resolveRun({ code, stdout, stderr });
    });
    if (opts.input !== undefined) child.stdin?.end(opts.input);
    else child.stdin?.end();
  });
}

/** Nothing at error level (kafkajs's retries, a coordinator still loading): the CLI's own lines or pino's levels 50/60. */
function expectQuiet(stderr: string): void {
  expect(stderr).not.toMatch(/: (error|fatal): |"level":(50|60)/);
}

const lines = (text: string) => text.split("\n").filter((l) => l.trim() !== "");
const jsonLines = (text: string) => lines(text).map((l) => JSON.parse(l) as Record<string, any>);

async function seed(type: string, recordId: string, state: unknown): Promise<string> {
  const res = await fetch(`${records.url}/_admin/records/${type}/${recordId}`, { method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify(state) });
  expect(res.ok).toBe(true);
  return (await fetch(`${records.url}/records/${type}/${recordId}`)).headers.get("etag")!;
}

/** A tag_ticket call: the tool's delta replaces /tags with the tags the agent read plus its own (examples/demo-tools.ts). */
const tagArgs = (tag: string, base: string, step: string, read: string[] = []) => [
  "submit",
  "--tool",
  "tag_ticket",
  "--entity",
  "ticket:T-cli",
  "--base-version",
  base,
  "--delta",
  JSON.stringify([{ op: "replace", path: "/tags", value: [...read, tag] }]),
  "--params",
  JSON.stringify({ tag }),
  "--run-id",
  `run-${id}`,
  "--step-id",
  step,
  "--agent",
  agent,
  "--timeout-ms",
  "30000",
];

beforeAll(async () => {
  await ensureBuilt();
  records = await startDemoRecordsServer({ port: 0 });
  const kafka = new Kafka({ clientId: `writ-cli-test-${id}`, brokers: brokers.split(","), logLevel: logLevel.NOTHING });
  admin = kafka.admin();
  await admin.connect();
}, 120_000);

afterAll(async () => {
  if (owner && owner.exitCode === null) {
    const exited = new Promise<number | null>((r) => owner!.once("exit", (code) => r(code)));
    owner.kill("SIGTERM");
    await exited;
  }
  await admin?.deleteTopics({ topics: [...Object.values(topics), replyTopic, ...extraTopics] }).catch(() => undefined);
  await admin?.disconnect();
  await records?.close();
}, 60_000);

describe("the built writ CLI (plain node, no type stripping)", () => {
  it("writ --version, writ help, and --help on every command", async () => {
    const version = await writ(["--version"]);
    expect(version).toEqual({ code: 0, stdout: `${VERSION}\n`, stderr: "" });
    const help = await writ(["help"]);
    expect(help.code).toBe(0);
    const commands = ["owner", "submit", "undo", "tail", "escalations", "topics", "verify", "doctor"];
    for (const c of commands) expect(help.stdout).toMatch(new RegExp(`^  ${c} `, "m"));
    for (const c of commands) {
      const own = await writ([c, "--help"]);
      expect(own.code, `${c} --help`).toBe(0);
      expect(own.stdout, `${c} --help`).toMatch(new RegExp(`^usage: writ ${c}`));
      expect(own.stdout, `${c} --help`).toMatch(/Exit status/);
      expect((await writ(["help", c])).stdout).toBe(own.stdout);
    }
    expect((await writ(["escalations", "--help"])).stdout).toMatch(/resolve\s+a person's decision on one escalation/);
    const none = await writ([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/^usage: writ <command>/);
    const unknown = await writ(["frobnicate"]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toMatch(/unknown command frobnicate/);
    const badFlag = await writ(["tail", "human", "--nope"]);
    expect(badFlag.code).toBe(2);
    expect(badFlag.stderr).toMatch(/--nope/);
  });

  it("writ topics: check fails while topics are missing, ensure creates them, then check passes", async () => {
    const before = await writ(["topics", "check"]);
    expect(before.code).toBe(1);
    expect(before.stdout).toContain(`problem: ${topics.intents} (intents) does not exist`);
    const ensured = await writ(["topics", "ensure", "--json"]);
    expectQuiet(ensured.stderr);
    expect(ensured.code, ensured.stdout + ensured.stderr).toBe(0);
    const report = JSON.parse(ensured.stdout);
    expect(report.ok).toBe(true);
    expect(report.created.sort()).toEqual(Object.values(topics).sort());
    const ledger = report.topics.find((t: { role: string }) => t.role === "ledger");
    expect(ledger).toMatchObject({ partitions: 2, configs: { "cleanup.policy": "compact", "min.compaction.lag.ms": "3600000" } });
    const after = await writ(["topics", "check"]);
    expect(after.code).toBe(0);
    expect(after.stdout).toMatch(/topics ok$/m);
    expectQuiet(after.stderr);
  });

  it("writ topics refuses intents and ledger partition counts that differ, and a ledger that is not compacted (and warns on its compaction lag)", async () => {
    const other = { intents: `cli-${id}.x.intents`, ledger: `cli-${id}.x.ledger`, human: topics.human, dlq: topics.dlq };
    extraTopics.push(other.intents, other.ledger);
    await createTopicsWithLeaders(admin, [
      { topic: other.intents, numPartitions: 2 },
      { topic: other.ledger, numPartitions: 3, configEntries: [{ name: "cleanup.policy", value: "delete" }] },
    ]);
    const xenv = env({ WRIT_INTENTS_TOPIC: other.intents, WRIT_LEDGER_TOPIC: other.ledger });
    const check = await writ(["topics", "check"], { env: xenv });
    expect(check.code).toBe(1);
    expect(check.stdout).toContain(`${other.intents} has 2 partitions and ${other.ledger} 3: they must be equal`);
    expect(check.stdout).toContain(`${other.ledger} is not compacted (cleanup.policy=delete)`);
    // Created without writ's min.compaction.lag.ms: a crashed owner's in-doubt entries are not kept long enough.
    expect(check.stdout).toContain(`${other.ledger} has min.compaction.lag.ms=0; writ creates it with 3600000`);
    const ensure = await writ(["topics", "ensure"], { env: xenv });
    expect(ensure.code).toBe(1);
    expect(ensure.stdout).toMatch(/topics NOT ok/);
    // one of the pair exists with another partition count: ensure creates nothing beside it
    const lone = `cli-${id}.y.ledger`;
    const refused = await writ(["topics", "ensure"], { env: env({ WRIT_INTENTS_TOPIC: other.intents, WRIT_LEDGER_TOPIC: lone, WRIT_INTENT_PARTITIONS: "4" }) });
    expect(refused.code).toBe(1);
    expect(refused.stdout).toContain(`refusing to create ${lone} with 4 partitions beside ${other.intents} with 2: set WRIT_INTENT_PARTITIONS=2`);
    expect(await admin.listTopics()).not.toContain(lone);
  });

  it("writ topics check fails on a ledger that Kafka deletes inside the dedupe window (compact,delete with a short retention.ms) and on unclean leader election", async () => {
    const u = { intents: `cli-${id}.u.intents`, ledger: `cli-${id}.u.ledger`, human: `cli-${id}.u.human`, dlq: `cli-${id}.u.dlq` };
    extraTopics.push(...Object.values(u));
    await createTopicsWithLeaders(admin, [
      { topic: u.intents, numPartitions: 2, configEntries: [{ name: "unclean.leader.election.enable", value: "true" }] },
      {
        topic: u.ledger,
        numPartitions: 2,
        configEntries: [
          { name: "cleanup.policy", value: "compact,delete" },
          { name: "retention.ms", value: "3600000" },
          { name: "delete.retention.ms", value: "86400000" },
          { name: "min.compaction.lag.ms", value: "3600000" },
        ],
      },
      { topic: u.human, numPartitions: 1 },
      { topic: u.dlq, numPartitions: 1 },
    ]);
    const uenv = env({ WRIT_INTENTS_TOPIC: u.intents, WRIT_LEDGER_TOPIC: u.ledger, WRIT_HUMAN_TOPIC: u.human, WRIT_DLQ_TOPIC: u.dlq });
    const check = await writ(["topics", "check", "--json"], { env: uenv });
    expect(check.code, check.stdout + check.stderr).toBe(1);
    const report = JSON.parse(check.stdout);
    expect(report.problems).toEqual([
      expect.stringMatching(new RegExp(`^${u.intents.replace(/\./g, "\\.")} has unclean\\.leader\\.election\\.enable=true: `)),
      expect.stringContaining(`${u.ledger} has cleanup.policy=compact,delete and retention.ms=3600000: Kafka deletes ledger entries inside the 24 h window`),
    ]);
  });

  it("writ topics check names a topic that takes less than writ writes there (a ledger under its largest entry; a topic under WRIT_MAX_MESSAGE_BYTES by the brokers' default), with the fix; sized right, it passes", async () => {
    const z = { intents: `cli-${id}.z.intents`, ledger: `cli-${id}.z.ledger`, human: `cli-${id}.z.human`, dlq: `cli-${id}.z.dlq` };
    extraTopics.push(...Object.values(z));
    const ledgerConfigs = [
      { name: "cleanup.policy", value: "compact" },
      { name: "min.compaction.lag.ms", value: "3600000" },
    ];
    await createTopicsWithLeaders(admin, [
      { topic: z.intents, numPartitions: 2 },
      { topic: z.ledger, numPartitions: 2, configEntries: [...ledgerConfigs, { name: "max.message.bytes", value: "100000" }] },
      { topic: z.human, numPartitions: 1 },
      { topic: z.dlq, numPartitions: 1 },
    ]);
    const zenv = (extra: Record<string, string> = {}) => env({ WRIT_INTENTS_TOPIC: z.intents, WRIT_LEDGER_TOPIC: z.ledger, WRIT_HUMAN_TOPIC: z.human, WRIT_DLQ_TOPIC: z.dlq, ...extra });
    // The largest ledger entry: WRIT_MAX_INTENT_BYTES (262144) of params and 65536 of fields.
    const fix = `kafka-configs --alter --entity-type topics --entity-name ${z.ledger} --add-config max.message.bytes=327680`;

    const check = await writ(["topics", "check"], { env: zenv() });
    expect(check.code, check.stdout + check.stderr).toBe(1);
    expect(check.stdout).toContain(`problem: ${z.ledger} (ledger) takes records of at most 100000 bytes (max.message.bytes=100000); writ needs 327680, its largest entry`);
    expect(check.stdout).toContain(`(${fix})`);
    const json = JSON.parse((await writ(["topics", "check", "--json"], { env: zenv() })).stdout);
    expect(json).toMatchObject({ ok: false, problems: [expect.stringContaining(fix)] });
    expect(json.topics.find((t: { role: string }) => t.role === "ledger").batchLimit).toEqual({ bytes: 100000, config: "max.message.bytes", overridden: true });

    // A topic without an override takes what the brokers' message.max.bytes says (1048588 by default): less than
    // owners configured to write 2,000,000 there.
    const large = await writ(["topics", "check", "--json"], { env: zenv({ WRIT_MAX_MESSAGE_BYTES: "2000000" }) });
    expect(large.code).toBe(1);
    expect(JSON.parse(large.stdout).problems).toContainEqual(
      expect.stringMatching(new RegExp(`^${z.human.replace(/\./g, "\\.")} \\(human\\) takes records of at most \\d+ bytes \\(max\\.message\\.bytes=\\d+, the brokers' default: the topic does not set it\\); writ needs 2000000`)),
    );

    // Sized as the fix says (alterConfigs replaces the topic's overrides: the compaction settings given again), it passes.
    await admin.alterConfigs({
      validateOnly: false,
      resources: [{ type: 2 as ConfigResourceTypes, name: z.ledger, configEntries: [...ledgerConfigs, { name: "max.message.bytes", value: "327680" }] }],
    });
    const after = await writ(["topics", "check"], { env: zenv() });
    expect(after.code, after.stdout).toBe(0);
    expect(after.stdout).toMatch(/topics ok$/m);
  });

  it("writ owner without a tools module is a configuration error naming --tools and WRIT_TOOLS_MODULE (no demo fallback)", async () => {
    const missing = await writ(["owner"]);
    expect(missing.code).toBe(2);
    expect(missing.stderr).toContain("give --tools <module> (or set WRIT_TOOLS_MODULE)");
    const absent = await writ(["owner"], { env: env({ WRIT_TOOLS_MODULE: "/nonexistent/tools.js" }) });
    expect(absent.code).toBe(2);
    expect(absent.stderr).toContain("tools module /nonexistent/tools.js (WRIT_TOOLS_MODULE) not found");
    const wrongShape = await writ(["owner", "--tools", join(ROOT, "package.json")]);
    expect(wrongShape.code).toBe(2);
    expect(wrongShape.stderr).toMatch(/tools module .*package\.json \(--tools\) (must export|failed to load)/);
    // a TypeScript module where Node strips no types (this CLI runs with --no-experimental-strip-types): said so
    const tsModule = join(mkdtempSync(join(tmpdir(), "writ-cli-ts-")), "tools.ts");
    writeFileSync(tsModule, "export const tools: unknown[] = [];\nexport function systems(): unknown[] {\n  return [];\n}\n");
    const typescript = await writ(["owner", "--tools", tsModule]);
    expect(typescript.code).toBe(2);
    expect(typescript.stderr).toContain("does not strip types from a TypeScript module: that needs Node >= 22.18");
  });

  it.each([
    ["a timer holds the process open", true],
    ["nothing holds the process open", false],
  ])("writ owner whose tools module's import never finishes ends with exit 2 naming the module and WRIT_TOOLS_IMPORT_TIMEOUT_MS, not a hang nor Node's unsettled top-level await (%s)", async (_, holding) => {
    // Before: with a timer, the owner waited for ever (killed here at 30 s); without, Node ended it with 13 and a warning.
    const module = join(mkdtempSync(join(tmpdir(), "writ-cli-hung-")), "hung-tools.mjs");
    writeFileSync(module, `${holding ? "setInterval(() => undefined, 1000);\n" : ""}await new Promise(() => undefined);\nexport const tools = [];\n`);
    const run = await writ(["owner", "--tools", module], { env: env({ WRIT_TOOLS_IMPORT_TIMEOUT_MS: "2000" }), timeoutMs: 30_000 });
    const plain = lines(run.stderr).filter((l) => !l.startsWith("{"));
    expect([run.code, plain.length], run.stderr).toEqual([2, 1]);
    expect(plain[0]).toMatch(/^writ owner: tools module \S+hung-tools\.mjs \(--tools\) did not finish loading within 2000 ms \(WRIT_TOOLS_IMPORT_TIMEOUT_MS; .*\): its top-level code has not settled/);
  });

  it("writ owner refuses an invalid WRIT_TOOLS_IMPORT_TIMEOUT_MS before importing the module, naming it", async () => {
    const run = await writ(["owner", "--tools", COMPOSE_TOOLS], { env: env({ WRIT_TOOLS_IMPORT_TIMEOUT_MS: "30s" }) });
    expect(run.code, run.stderr).toBe(2);
    expect(run.stderr).toMatch(/^writ owner: WRIT_TOOLS_IMPORT_TIMEOUT_MS: .*got "30s"/m);
  });

  it("writ owner: a tool declaration the owners do not admit, or systems(env) that throws or returns no array, is a configuration error: exit 2, one plain line naming the tool and the field", async () => {
    // Each module changes the demo's tag_ticket (examples/compose/tools.js) or its systems(env); a supervisor must not restart these.
    const dir = mkdtempSync(join(tmpdir(), "writ-cli-decl-"));
    const demo = JSON.stringify(pathToFileURL(COMPOSE_TOOLS).href);
    const cases: [string, string, string][] = [
      [
        "reconcile",
        `import { tagTicket, systems } from ${demo};\nexport { systems };\nexport const tools = [{ ...tagTicket, name: "tag_note", reconcile: "idempotency_key" }];\n`,
        'writ owner: tool "tag_note": reconcile: expected "idempotency-key" or a function, got "idempotency_key"',
      ],
      [
        "typo",
        `import { tagTicket, systems } from ${demo};\nexport { systems };\nconst { versionPolicy, ...rest } = tagTicket;\nexport const tools = [{ ...rest, versonPolicy: versionPolicy }];\n`,
        'writ owner: tool "tag_ticket": versonPolicy: not a field of a tool declaration (did you mean versionPolicy?)',
      ],
      [
        "key-scope",
        `import { tagTicket, systems } from ${demo};\nexport { systems };\nconst { keyScope, ...rest } = tagTicket;\nexport const tools = [rest];\n`,
        'writ owner: tool "tag_ticket": keyScope: missing key scope: expected "run" or "global"',
      ],
      [
        "system",
        `import { tagTicket, systems } from ${demo};\nexport { systems };\nexport const tools = [{ ...tagTicket, system: "crm" }];\n`,
        'writ owner: tool "tag_ticket": system: "crm" is not configured (have: "billing", "helpdesk")',
      ],
      ["throws", `import { tools } from ${demo};\nexport { tools };\nexport function systems() { throw new Error("CRM_URL is not set"); }\n`, "systems(env) threw: CRM_URL is not set"],
      [
        "not-array",
        `import { tools } from ${demo};\nexport { tools };\nexport function systems() { return { billing: {} }; }\n`,
        "systems(env) must return an array of systems of record, got an object",
      ],
    ];
    for (const [name, source, line] of cases) {
      const module = join(dir, `${name}.mjs`);
      writeFileSync(module, source);
      const run = await writ(["owner", "--tools", module]);
      // The structured log (JSON lines) aside, one plain line.
      const plain = lines(run.stderr).filter((l) => !l.startsWith("{"));
      expect([name, run.code, plain.length], run.stderr).toEqual([name, 2, 1]);
      expect(plain[0], name).toContain(line);
      expect(plain[0], name).toMatch(/^writ owner: /);
    }
  });

  it("writ owner runs the tools module; writ submit prints each reply as JSON with its exit status", async () => {
    const v1 = await seed("ticket", "T-cli", { subject: "cli", status: "open", tags: [] });
    // a misspelt setting among known ones: one warning, with the name it is close to
    owner = spawn(process.execPath, ["--no-experimental-strip-types", BUILT_CLI, "owner", "--tools", COMPOSE_TOOLS], { cwd: ROOT, env: env({ WRIT_HEALTH_PROT: "9464" }), stdio: ["ignore", "ignore", "pipe"] });
    owner.stderr!.on("data", (d: Buffer) => (ownerStderr += d.toString()));
    await waitFor(() => ownerStderr.includes('"msg":"owner started"'), { timeoutMs: 60_000, message: () => `owner did not start:\n${ownerStderr}` });
    expect(ownerStderr.match(/unknown setting [A-Z_]+/g)).toEqual(["unknown setting WRIT_HEALTH_PROT"]);
    expect(ownerStderr).toContain('"msg":"unknown setting WRIT_HEALTH_PROT (did you mean WRIT_HEALTH_PORT?)"');

    // applied: tool scope and intent fields from the tools module
    const applied = await writ([...tagArgs("vip", v1, "s1"), "--tools", COMPOSE_TOOLS]);
    expectQuiet(applied.stderr);
    expect(applied.code, applied.stdout + applied.stderr).toBe(0);
    const reply = JSON.parse(applied.stdout);
    expect(reply).toMatchObject({ status: "applied", duplicate: false, entity: { type: "ticket", id: "T-cli" }, via: "patch" });

    // the same intent again, from stdin, with the key scope and intent fields as flags: the stored reply
    const intent = { tool: "tag_ticket", entity: "ticket:T-cli", baseVersion: v1, delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" }, runId: `run-${id}`, stepId: "s1" };
    const again = await writ(["submit", "--intent", "-", "--key-scope", "run", "--intent-fields", "tag", "--agent", agent], { input: JSON.stringify(intent) });
    expect(again.code, again.stderr).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ status: "applied", duplicate: true, intentKey: reply.intentKey });

    // a stale base under a strict tool: conflict (exit 1), twice with new bases, then escalated (exit 1)
    const statuses: string[] = [];
    for (const base of [v1, '"v0"', '"v-stale"']) {
      const r = await writ([...tagArgs("late", base, "s2"), "--key-scope", "run", "--intent-fields", "tag"]);
      expect(r.code, r.stderr).toBe(1);
      expectQuiet(r.stderr);
      statuses.push(JSON.parse(r.stdout).status);
    }
    expect(statuses).toEqual(["conflict", "conflict", "escalated"]);
    expect(((await (await fetch(`${records.url}/records/ticket/T-cli`)).json()) as { tags: string[] }).tags).toEqual(["vip"]);

    // usage errors: exit 2, nothing sent
    const noKey = await writ(tagArgs("x", v1, "s3"));
    expect(noKey.code).toBe(2);
    expect(noKey.stderr).toContain("give --tools <module> (or WRIT_TOOLS_MODULE), or --key-scope and --intent-fields");
    const badDelta = await writ(["submit", "--tool", "tag_ticket", "--entity", "ticket:T-cli", "--base-version", v1, "--delta", "{", "--run-id", "r", "--step-id", "s"]);
    expect(badDelta.code).toBe(2);
    expect(badDelta.stderr).toContain("--delta is not JSON");
    // the reply topic a command creates gets the owners' WRIT_REPLICATION_FACTOR: 2 on this one broker is refused by Kafka
    const replicated = await writ([...tagArgs("x", v1, "s3"), "--tools", COMPOSE_TOOLS, "--agent", `${agent}-rf2`], { env: env({ WRIT_REPLICATION_FACTOR: "2" }) });
    expect(replicated.code, replicated.stdout).toBe(2);
    expect(replicated.stderr).toContain(`writ.replies.${agent}-rf2: INVALID_REPLICATION_FACTOR`);

    // a record that is not an intent, for the dead-letter topic
    const producer = new Kafka({ clientId: `writ-cli-test-${id}-raw`, brokers: brokers.split(","), logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    await producer.send({ topic: topics.intents, messages: [{ key: "ticket:T-cli", value: "not an intent" }] });
    // A timestamp no Date can hold: Kafka's defaults accept any past one (log.message.timestamp.before.max.ms).
    await producer.send({ topic: topics.intents, messages: [{ key: "ticket:T-cli", value: "from long ago", timestamp: "-9000000000000000" }] });
    await producer.disconnect();
  }, 180_000);

  it("writ tail prints replies, ledger entries, escalations and dead letters, decoded; --json; --follow", async () => {
    const replies = await writ(["tail", "replies", "--topic", replyTopic, "--from-beginning", "--json"]);
    expectQuiet(replies.stderr);
    expect(replies.code, replies.stderr).toBe(0);
    const decoded = jsonLines(replies.stdout);
    expect(decoded.map((r) => r.value?.status)).toEqual(["applied", "applied", "conflict", "conflict", "escalated"]);
    expect(decoded.every((r) => r.topic === replyTopic && typeof r.offset === "string" && r.error === undefined)).toBe(true);
    expect(decoded.some((r) => r.framed === (registry !== ""))).toBe(true);

    const text = await writ(["tail", "replies", "--topic", replyTopic, "--from-beginning"]);
    expect(lines(text.stdout)[0]).toMatch(new RegExp(`${replyTopic.replace(/\./g, "\\.")}\\[0\\]@\\d+ applied ticket:T-cli .* via=patch$`));

    const ledger = await writ(["tail", "ledger", "--from-beginning"]);
    expect(ledger.code).toBe(0);
    expect(ledger.stdout).toMatch(/ done applied ticket:T-cli tool=tag_ticket /);
    expect(ledger.stdout).toMatch(/ done escalated ticket:T-cli tool=tag_ticket .* cycles=3 /);
    expect(ledger.stdout).toMatch(/ marker partition=\d owner=/);
    expect(ledger.stdout).toMatch(/ progress partition=\d offset=\d+$/m);

    const human = await writ(["tail", "human", "--from-beginning", "--json"]);
    expect(jsonLines(human.stdout).map((r) => r.value.reason)).toEqual(["conflict_cycles_exhausted"]);

    const dlq = await waitFor(async () => {
      const r = await writ(["tail", "dlq", "--from-beginning"]);
      return r.stdout.includes(" undecodable ") ? r : undefined;
    });
    expect(dlq.stdout).toMatch(new RegExp(`undecodable from ${topics.intents.replace(/\./g, "\\.")}\\[\\d\\]@\\d+ key=ticket:T-cli 13 bytes`));

    // any record's timestamp is shown, as the number it is where no date can hold it; the read goes on past it
    const raw = await writ(["tail", "dlq", "--topic", topics.intents, "--from-beginning", "--json"]);
    expect(raw.code, raw.stderr).toBe(0);
    const rawLines = jsonLines(raw.stdout);
    expect(rawLines.filter((r) => r.timestamp === "-9000000000000000")).toHaveLength(1);
    expect(rawLines.filter((r) => /^\d{4}-\d\d-\d\dT/.test(r.timestamp)).length).toBeGreaterThan(1);

    // the last N offsets only (transaction markers count): fewer lines than from the beginning
    const last = await writ(["tail", "replies", "--topic", replyTopic, "-n", "2", "--json"]);
    expect(jsonLines(last.stdout).length).toBeLessThan(decoded.length);

    // --follow: what is there, then what comes, until interrupted
    const follow = spawn(process.execPath, ["--no-experimental-strip-types", BUILT_CLI, "tail", "replies", "--topic", replyTopic, "--from-beginning", "--follow", "--json"], { cwd: ROOT, env: env() });
    let out = "";
    let err = "";
    follow.stdout.on("data", (d: Buffer) => (out += d.toString()));
    follow.stderr.on("data", (d: Buffer) => (err += d.toString()));
    const exited = new Promise<number | null>((r) => follow.once("exit", (code) => r(code)));
    await waitFor(() => lines(out).length >= decoded.length, { message: () => `follow printed ${out}${err}` });
    const v = (await fetch(`${records.url}/records/ticket/T-cli`)).headers.get("etag")!;
    const more = await writ([...tagArgs("followed", v, "s4", ["vip"]), "--tools", COMPOSE_TOOLS]);
    expect(more.code, more.stderr).toBe(0);
    const key = JSON.parse(more.stdout).intentKey;
    await waitFor(() => jsonLines(out).some((r) => r.value?.intentKey === key && r.value?.status === "applied"), { message: () => `follow printed ${out}${err}` });
    follow.kill("SIGINT");
    expect(await exited).toBe(0);
    expectQuiet(err);

    // a reader that stops early (`writ tail … | head -1`): the command ends quietly, exit 0, no EPIPE trace
    const many = `cli-${id}-many`;
    extraTopics.push(many);
    await createTopicsWithLeaders(admin!, [{ topic: many, numPartitions: 1 }]);
    const junk = new Kafka({ clientId: `writ-cli-test-${id}-many`, brokers: brokers.split(","), logLevel: logLevel.NOTHING }).producer();
    await junk.connect();
    await junk.send({ topic: many, messages: Array.from({ length: 5000 }, (_, i) => ({ key: `k${i}`, value: `not a reply ${i}` })) });
    await junk.disconnect();
    const head = spawn(process.execPath, ["--no-experimental-strip-types", BUILT_CLI, "tail", "replies", "--topic", many, "--from-beginning", "--follow"], { cwd: ROOT, env: env() });
    let headErr = "";
    head.stderr.on("data", (d: Buffer) => (headErr += d.toString()));
    const headExited = new Promise<number | null>((r) => head.once("exit", (code) => r(code)));
    await new Promise<void>((r) => head.stdout.once("data", () => r()));
    head.stdout.destroy();
    expect(await headExited, headErr).toBe(0);
    expect(headErr).not.toMatch(/EPIPE|Unhandled|\n\s+at /);
  }, 120_000);

  it("writ escalations list shows each escalation (--open: those still open, by the ledger); resolve carries out a decision once", async () => {
    const list = await writ(["escalations", "list"]);
    expectQuiet(list.stderr);
    expect(list.code).toBe(0);
    const [header, row] = lines(list.stdout);
    expect(header).toMatch(/^REASON\s+ENTITY\s+TOOL\s+INTENT KEY\s+ESCALATION ID\s+AGE\s+MESSAGE$/);
    expect(row).toMatch(/^conflict_cycles_exhausted\s+ticket:T-cli\s+tag_ticket\s+[0-9a-f]{64}\s+[0-9a-f-]{36}\s+\d+ (s|min)\s+\S/);
    expect(list.stdout).toMatch(/1 escalation on cli-.*\.human/);
    const json = jsonLines((await writ(["escalations", "list", "--json"])).stdout);
    expect(json).toHaveLength(1);
    expect(json[0]).toMatchObject({ reason: "conflict_cycles_exhausted", intent: { tool: "tag_ticket", entity: { type: "ticket", id: "T-cli" } }, topic: topics.human });
    // Open by the owners' ledger: the intent's entry is escalated under this escalation id.
    const open = await writ(["escalations", "list", "--open"]);
    expect([open.code, open.stdout]).toEqual([0, expect.stringMatching(/1 open escalation on cli-.*\.human/)]);
    expect(jsonLines((await writ(["escalations", "list", "--open", "--json"])).stdout)).toEqual([{ ...json[0], open: true }]);
    expect((await writ(["escalations", "list", "--ledger-topic", topics.ledger])).code).toBe(2);
    expect((await writ(["escalations", "resolve", json[0]!.escalationId])).code).toBe(2);
    const both = await writ(["escalations", "resolve", json[0]!.escalationId, "--discard", "--timeout-ms", "5000", "--timeout", "5000"]);
    expect([both.code, both.stderr]).toEqual([2, expect.stringContaining("give --timeout-ms (or --timeout, its earlier name), not both")]);
    const discard = await writ(["escalations", "resolve", json[0]!.escalationId, "--discard", "--message", "not needed after all", "--operator", `ops-${id}`, "--timeout-ms", "30000"]);
    expect(discard.code, discard.stdout + discard.stderr).toBe(0);
    extraTopics.push(`writ.replies.ops-${id}`);
    expect(JSON.parse(discard.stdout)).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "not needed after all", resolvedBy: `ops-${id}` });
    // Carried out once: the escalation is closed.
    const again = await writ(["escalations", "resolve", json[0]!.escalationId, "--apply", "--operator", `ops-${id}`]);
    expect(again.code).toBe(1);
    expect(JSON.parse(again.stdout)).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    // Decided: still on writ.human, no longer open.
    expect(jsonLines((await writ(["escalations", "list", "--json"])).stdout)).toHaveLength(1);
    const none = await writ(["escalations", "list", "--open", "--ledger-topic", topics.ledger]);
    expect([none.code, none.stdout]).toEqual([0, expect.stringMatching(/^no open escalations on cli-.*\.human\n$/)]);
  });

  it("writ undo undoes an applied write once, its record and tool read from the ledger", async () => {
    const v = (await fetch(`${records.url}/records/ticket/T-cli`)).headers.get("etag")!;
    const read = ((await (await fetch(`${records.url}/records/ticket/T-cli`)).json()) as { tags: string[] }).tags;
    const tagged = await writ([...tagArgs("undo-me", v, "s5", read), "--tools", COMPOSE_TOOLS]);
    expect(tagged.code, tagged.stderr).toBe(0);
    const write = JSON.parse(tagged.stdout);
    expect(write).toMatchObject({ status: "applied", tool: "tag_ticket" });

    const undo = await writ(["undo", write.intentKey, "--agent", agent]);
    expectQuiet(undo.stderr);
    expect(undo.code, undo.stdout + undo.stderr).toBe(0);
    expect(JSON.parse(undo.stdout)).toMatchObject({ status: "applied", duplicate: false, undoOf: write.intentKey, entity: { type: "ticket", id: "T-cli" } });
    const again = await writ(["undo", write.intentKey, "--entity", "ticket:T-cli", "--tool", "tag_ticket", "--agent", agent]);
    expect(again.code, again.stderr).toBe(0);
    expect(JSON.parse(again.stdout)).toMatchObject({ status: "applied", duplicate: true, undoOf: write.intentKey });
    expect(((await (await fetch(`${records.url}/records/ticket/T-cli`)).json()) as { tags: string[] }).tags).toEqual(read);
    expect(records.patchRequests(JSON.parse(undo.stdout).intentKey)).toHaveLength(1);

    const bad = await writ(["undo", "not-a-key"]);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toContain("is not an intent key");
    const unknown = await writ(["undo", "0".repeat(64)]);
    expect(unknown.code).toBe(2);
    expect(unknown.stderr).toContain(`is not in ${topics.ledger}`);
  }, 120_000);

  it("writ doctor and writ verify run from the CLI", async () => {
    const doctor = await writ(["doctor", "--topics", Object.values(topics).join(","), "--json"]);
    expect(doctor.code, doctor.stderr).toBe(0);
    expect(JSON.parse(doctor.stdout).findings).toEqual([]);
    // verify loads the caller's tools module, here a .ts one: the built CLI on a Node that strips types
    const verify = await writ(
      ["verify", "--tools", join(ROOT, "examples", "verify-fixture.ts"), "--tool", "tag_ticket", "--scenario", "duplicate-submission", "--json", "--log-file", join(ROOT, ".writ", "cli-test-verify.log")],
      { stripTypes: true, timeoutMs: 120_000 },
    );
    expect(verify.code, verify.stderr).toBe(0);
    expect(JSON.parse(verify.stdout)).toMatchObject({ ok: true, tools: [{ tool: "tag_ticket", scenarios: [{ scenario: "duplicate-submission", ok: true }] }] });
  }, 150_000);

  it("the owner logged nothing at error level, and leaves cleanly on SIGTERM", async () => {
    expect(owner).toBeDefined();
    const exited = new Promise<number | null>((r) => owner!.once("exit", (code) => r(code)));
    owner!.kill("SIGTERM");
    expect(await exited).toBe(0);
    expectQuiet(ownerStderr);
    expect(ownerStderr).toContain('"msg":"router stopped"');
  }, 60_000);

  it("examples/compose/tools.js declares what examples/demo-tools.ts declares", async () => {
    // in a child: the module imports "writ" (the package's own name, resolved to dist by its exports) and "zod"
    const describeTools = (href: string) =>
      `const m = await import(${JSON.stringify(href)}); console.log(JSON.stringify({ tools: m.tools.map((t) => ({ ...t, params: Object.keys(t.params.shape) })), systems: m.systems({ RECORDS_URL: "http://x:1" }).map((s) => s.name) }));`;
    const js = await new Promise<string>((r, j) =>
      execFile(process.execPath, ["--no-experimental-strip-types", "--input-type=module", "-e", describeTools(pathToFileURL(COMPOSE_TOOLS).href)], { cwd: ROOT }, (e, out) => (e ? j(e) : r(out))),
    );
    const ts = {
      tools: demoTools.tools.map((t) => ({ ...t, params: Object.keys((t.params as unknown as { shape: object }).shape) })),
      systems: demoTools.systems({ RECORDS_URL: "http://x:1" }).map((s) => s.name),
    };
    expect(JSON.parse(js)).toEqual(JSON.parse(JSON.stringify(ts)));
  });
});
