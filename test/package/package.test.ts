// The package as a user gets it: `npm pack`, then `npm install --omit=dev
// <tarball>` in a new project (production dependencies only; the optional peer
// dependencies stay out), then a program run by plain node with type stripping
// off: it declares a tool, starts a router and a client, starts the demo
// records server from `writ/testing`, submits an intent against the test
// broker and prints the reply. `npx writ --version` runs there on the Node of
// the PATH without the project's node_modules/.bin (the system's node).
import { execFile } from "node:child_process";
import { randomUUID } from "node:crypto";
import { existsSync, mkdirSync, mkdtempSync, readdirSync, readFileSync, rmSync, statSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { delimiter, dirname, join, relative, resolve } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { afterAll, beforeAll, describe, expect, inject, it } from "vitest";
import pkg from "../../package.json" with { type: "json" };
import { ROOT, ensureBuilt } from "../helpers/build.ts";
import { anchors, prose } from "../helpers/markdown.ts";

const brokers = inject("kafkaBrokers") || process.env.KAFKA_BROKERS || "127.0.0.1:19092";
const registry = inject("schemaRegistryUrl") || process.env.SCHEMA_REGISTRY_URL || "";
const id = randomUUID().slice(0, 8);
const dir = mkdtempSync(join(tmpdir(), "writ-package-"));
const app = join(dir, "app");
let tarball = "";

function run(cmd: string, args: string[], opts: { cwd: string; env?: NodeJS.ProcessEnv; timeoutMs?: number }): Promise<{ code: number; stdout: string; stderr: string }> {
  return new Promise((resolveRun) => {
    execFile(cmd, args, { cwd: opts.cwd, env: opts.env ?? process.env, timeout: opts.timeoutMs ?? 120_000, maxBuffer: 16 << 20 }, (error, stdout, stderr) => {
      resolveRun({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr });
    });
  });
}

/** The environment without this repository's node_modules/.bin (its Node 24, tsc, vitest): what a user's shell has. */
function userEnv(extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const path = (process.env.PATH ?? "")
    .split(delimiter)
    .filter((p) => !p.includes("node_modules"))
    .join(delimiter);
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("npm_") && !k.startsWith("WRIT_") && k !== "NODE_OPTIONS"));
  return { ...base, PATH: path, ...extra };
}

const PROGRAM = `
import { createHttpSystemOfRecord, createWritClient, declareWriteTool, startRouter } from "writ";
import { startDemoRecordsServer } from "writ/testing";
import { z } from "zod";

const id = process.env.RUN_ID;
const brokers = process.env.KAFKA_BROKERS.split(",");
const schemaRegistryUrl = process.env.SCHEMA_REGISTRY_URL || undefined;
const records = await startDemoRecordsServer({ port: 0 });
await fetch(records.url + "/_admin/records/ticket/T-1", { method: "PUT", headers: { "content-type": "application/json" }, body: JSON.stringify({ tags: [] }) });
const baseVersion = (await fetch(records.url + "/records/ticket/T-1")).headers.get("etag");

const tagTicket = declareWriteTool({
  name: "tag_ticket", recordType: "ticket", params: z.object({ tag: z.string() }), intentFields: ["tag"],
  allowedPaths: ["/tags/-"], keyScope: "run", versionPolicy: "strict", system: "helpdesk", reconcile: "idempotency-key",
});
const topics = { intents: "pkg-" + id + ".intents", ledger: "pkg-" + id + ".ledger", human: "pkg-" + id + ".human", dlq: "pkg-" + id + ".dlq" };
const router = await startRouter({
  config: { brokers, schemaRegistryUrl, groupId: "pkg-" + id + ".owners", intentPartitions: 1, topics },
  tools: [tagTicket],
  systems: [createHttpSystemOfRecord({ name: "helpdesk", baseUrl: records.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" })],
});
const client = await createWritClient({ brokers, schemaRegistryUrl, agentId: "pkg-" + id, replyTopic: "writ.replies.pkg-" + id, intentsTopic: topics.intents });
const reply = await client.submit({
  tool: tagTicket, entity: { type: "ticket", id: "T-1" }, runId: id, stepId: "s1", baseVersion,
  delta: [{ op: "add", path: "/tags/-", value: "packaged" }], params: { tag: "packaged" },
}, { timeoutMs: 30000 });
const record = await (await fetch(records.url + "/records/ticket/T-1")).json();
await client.close();
await router.stop();
await records.close();
console.log(JSON.stringify({ reply, record }));
process.exit(reply.status === "applied" ? 0 : 1);
`;

beforeAll(async () => {
  await ensureBuilt();
  mkdirSync(app);
}, 120_000);

afterAll(async () => {
  const admin = new Kafka({ clientId: `writ-package-test-${id}`, brokers: brokers.split(","), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  await admin.deleteTopics({ topics: ["intents", "ledger", "human", "dlq"].map((t) => `pkg-${id}.${t}`).concat(`writ.replies.pkg-${id}`) }).catch(() => undefined);
  await admin.disconnect();
  rmSync(dir, { recursive: true, force: true });
}, 60_000);

describe("the packed tarball, installed in another project", () => {
  it("npm pack ships dist, schemas, deploy (the alert rules and the dashboard), docs/*.md, the console screenshot, python/README.md, the test vectors (intent keys, signatures, resolution bounds), README.md, LICENSE and package.json, nothing else", async () => {
    // dist is fresh (ensureBuilt); `npm pack` alone would build it again through the prepare script
    const packed = await run("npm", ["pack", "--ignore-scripts", "--json", "--pack-destination", dir], { cwd: ROOT, env: userEnv() });
    expect(packed.code, packed.stderr).toBe(0);
    const [info] = JSON.parse(packed.stdout) as { filename: string; files: { path: string }[] }[];
    tarball = join(dir, info!.filename);
    const paths = info!.files.map((f) => f.path);
    expect(paths.filter((p) => !/^(dist\/|schemas\/[A-Za-z]+\.json$|deploy\/(prometheus\/[a-z-]+(\.test)?\.yml|grafana\/(dashboards\/[a-z-]+\.json|provisioning\/[a-z]+\/[a-z-]+\.yml))$|docs\/[a-z-]+\.md$|docs\/console\.png$|python\/README\.md$|test\/fixtures\/(intent-key|signature|resolution-bounds)-vectors\.json$|README\.md$|LICENSE$|package\.json$)/.test(p))).toEqual([]);
    for (const p of ["deploy/prometheus/writ-alerts.yml", "deploy/prometheus/writ-alerts.test.yml", "deploy/grafana/dashboards/writ-owners.json", "dist/src/cli/main.js", "dist/src/index.js", "dist/src/index.d.ts", "dist/src/testing/index.js", "dist/producers/adapters/mcp-server.js", "dist/src/console/assets/index.html", "dist/src/console/assets/console.js", "LICENSE", "docs/architecture.md", "docs/wire-contract.md", "docs/operations.md", "docs/console.png", "python/README.md", "test/fixtures/intent-key-vectors.json", "test/fixtures/signature-vectors.json", "test/fixtures/resolution-bounds-vectors.json", "dist/src/console/assets/drafts.js"]) expect(paths).toContain(p);
    // what the README and the API's comments link to ships with them
    const linked = new Set([...readFileSync(join(ROOT, "README.md"), "utf8").matchAll(/\]\((docs\/[a-z-]+\.md)[#)]/g)].map((m) => m[1]!));
    for (const file of paths.filter((p) => p.endsWith(".d.ts") || p.endsWith(".js"))) for (const m of readFileSync(join(ROOT, file), "utf8").matchAll(/\bdocs\/[a-z-]+\.md\b/g)) linked.add(m[0]);
    expect(linked.size).toBeGreaterThan(2);
    expect([...linked].filter((doc) => !paths.includes(doc))).toEqual([]);
    expect(paths.filter((p) => p.endsWith(".ts") && !p.endsWith(".d.ts"))).toEqual([]);
  });

  it("installs with production dependencies only; a plain-node program gets an applied reply through writ and writ/testing", async () => {
    expect(tarball).not.toBe("");
    writeFileSync(join(app, "package.json"), JSON.stringify({ name: "writ-package-check", private: true, type: "module" }));
    const installed = await run("npm", ["install", "--omit=dev", "--no-audit", "--no-fund", "--prefer-offline", tarball, `zod@${pkg.dependencies.zod}`], { cwd: app, env: userEnv(), timeoutMs: 300_000 });
    expect(installed.code, installed.stderr).toBe(0);
    expect(existsSync(join(app, "node_modules", "writ", "dist", "src", "index.js"))).toBe(true);
    // optional peers and dev dependencies stay out
    for (const absent of ["ai", "@langchain/core", "@openai/agents", "@modelcontextprotocol/sdk", "typescript", "vitest"]) expect(existsSync(join(app, "node_modules", absent)), absent).toBe(false);

    writeFileSync(join(app, "program.mjs"), PROGRAM);
    // Node 24 (the demo records server needs node:sqlite) with type stripping off: only the built JavaScript runs
    const result = await run(process.execPath, ["--no-experimental-strip-types", "program.mjs"], {
      cwd: app,
      env: userEnv({ KAFKA_BROKERS: brokers, SCHEMA_REGISTRY_URL: registry, RUN_ID: id, LOG_LEVEL: "warn" }),
    });
    expect(result.code, `${result.stdout}\n${result.stderr}`).toBe(0);
    const { reply, record } = JSON.parse(result.stdout.trim().split("\n").at(-1)!);
    expect(reply).toMatchObject({ status: "applied", duplicate: false, entity: { type: "ticket", id: "T-1" }, via: "patch" });
    expect(record.tags).toEqual(["packaged"]);
  }, 360_000);

  it("every relative link in the installed package's markdown (README.md, docs/*.md, python/README.md) resolves to a file it ships, and every #anchor to a heading there", () => {
    const pkgDir = join(app, "node_modules", "writ");
    expect(existsSync(join(pkgDir, "README.md")), "the tarball is installed (the test before)").toBe(true);
    const walk = (d: string): string[] => readdirSync(d).flatMap((n) => (n === "node_modules" ? [] : statSync(join(d, n)).isDirectory() ? walk(join(d, n)) : [join(d, n)]));
    const docs = walk(pkgDir).filter((f) => f.endsWith(".md"));
    expect(docs.map((f) => relative(pkgDir, f)).sort()).toEqual(expect.arrayContaining(["README.md", "docs/architecture.md", "docs/wire-contract.md", "python/README.md"]));
    const broken: string[] = [];
    let checked = 0;
    for (const doc of docs) {
      const text = readFileSync(doc, "utf8");
      // [text](target), ![alt](target) and [text](target "title"); reference definitions `[x]: target`
      const targets = [...prose(text).matchAll(/\]\(<?([^)\s>]+)>?(?:\s+"[^"]*")?\)|^\s*\[[^\]]+\]:\s*(\S+)/gm)].map((m) => (m[1] ?? m[2])!);
      for (const target of new Set(targets.filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t) && !t.startsWith("//")))) {
        checked++;
        const [path = "", anchor] = target.split("#");
        const file = path === "" ? doc : resolve(dirname(doc), decodeURIComponent(path));
        const where = `${relative(pkgDir, doc)}: ${target}`;
        if (!file.startsWith(pkgDir + "/") && file !== pkgDir) broken.push(`${where} (outside the package)`);
        else if (!existsSync(file)) broken.push(`${where} (not shipped)`);
        else if (anchor !== undefined && anchor !== "" && file.endsWith(".md") && !anchors(readFileSync(file, "utf8")).has(anchor)) broken.push(`${where} (no such heading)`);
      }
    }
    expect(checked).toBeGreaterThan(20);
    expect(broken).toEqual([]);
  });

  it("npx writ --version and writ help run on the system's node; the core imports there without type stripping", async () => {
    const env = userEnv();
    const version = await run("npx", ["--no-install", "writ", "--version"], { cwd: app, env });
    expect(version.code, version.stderr).toBe(0);
    expect(version.stdout.trim()).toBe(pkg.version);
    const help = await run("npx", ["--no-install", "writ", "help"], { cwd: app, env });
    expect(help.code, help.stderr).toBe(0);
    expect(help.stdout).toMatch(/^usage: writ <command>/);
    const node = await run("node", ["-e", "import('writ').then((m) => console.log(process.versions.node, typeof m.createWritClient, typeof m.startRouter, typeof m.declareWriteTool, typeof m.AgentRegistry?.from))"], { cwd: app, env });
    expect(node.code, node.stderr).toBe(0);
    expect(node.stdout.trim()).toMatch(/^\d+\.\d+\.\d+ function function function function$/);
    expect(Number(node.stdout.split(".")[0])).toBeGreaterThanOrEqual(20);
  }, 60_000);
});
