// `writ verify`: proves a module's write tools against a staging system of
// record before they get production credentials. Usage: `writ verify --help`.
// stdout: the table, then one JSON line (the report); progress on stderr;
// owner logs in a file. Exit 0 = pass, 1 = a scenario failed, 2 = could not run.
import { mkdirSync } from "node:fs";
import { dirname, resolve } from "node:path";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { WritError } from "../errors.ts";
import { REDACT_PATHS } from "../logger.ts";
import { hideKafkajsTimeoutWarning } from "../node-warnings.ts";
import type { DemoRecordsServer } from "../sor/demo-records-server.ts";
import { SCENARIOS, type ScenarioName } from "./report.ts";
import { formatReport, runVerify } from "./verify.ts";

hideKafkajsTimeoutWarning();

const USAGE = `usage: writ verify --tools <module> [options]
       npm run verify -- --tools <module> [options]

  --tools <module>      exports tools, systems(env) and verify (a fixture per tool; see src/verify/fixture.ts)
  --brokers <list>      Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>      Confluent-API schema registry (default $SCHEMA_REGISTRY_URL; unset = plain JSON)
  --tool <name>         only this tool (repeatable)
  --scenario <name>     only this scenario (repeatable): ${SCENARIOS.join(", ")}
  --sor-timeout-ms <n>  the owner's system-of-record deadline (default 2000)
  --json                print only the JSON report
  --keep-topics         leave the run's topics (writ.verify.<run>.*) on the cluster
  --log-file <path>     owner and client logs (default .writ/verify.log; level $LOG_LEVEL, default warn)
  --demo                start the demo records server in-process and set RECORDS_URL; --tools defaults to
                        examples/verify-fixture.ts; without brokers, start or reuse the local broker
  --demo-without-if-match  the same, with the records server's If-Match enforcement off (shows a lost update)

HTTP systems of record are reached through a fault proxy: their base URL must come from an environment variable
that systems(env) reads. Systems that are not HTTP get faults simulated at the adapter.`;

function fail(message: string, code = 2): never {
  process.stderr.write(`writ verify: ${message}\n`);
  process.exit(code);
}

const argv = process.argv.slice(2);
if (argv[0] === "verify") argv.shift();
let args: ReturnType<typeof parse>;
function parse(list: string[]) {
  return parseArgs({
    args: list,
    strict: true,
    options: {
      tools: { type: "string" },
      brokers: { type: "string" },
      registry: { type: "string" },
      tool: { type: "string", multiple: true },
      scenario: { type: "string", multiple: true },
      "sor-timeout-ms": { type: "string" },
      json: { type: "boolean", default: false },
      "keep-topics": { type: "boolean", default: false },
      "log-file": { type: "string" },
      demo: { type: "boolean", default: false },
      "demo-without-if-match": { type: "boolean", default: false },
      help: { type: "boolean", short: "h", default: false },
    },
  }).values;
}
try {
  args = parse(argv);
} catch (err) {
  fail(`${err instanceof Error ? err.message : String(err)}\n\n${USAGE}`);
}
if (args.help) {
  process.stdout.write(`${USAGE}\n`);
  process.exit(0);
}

const demo = args.demo || args["demo-without-if-match"];
const tools = args.tools ?? (demo ? resolve(import.meta.dirname, "../../examples/verify-fixture.ts") : undefined);
if (tools === undefined) fail(`--tools is required\n\n${USAGE}`);
const scenarios = args.scenario ?? [...SCENARIOS];
const badScenario = scenarios.find((s) => !(SCENARIOS as readonly string[]).includes(s));
if (badScenario !== undefined) fail(`unknown scenario ${badScenario}; one of ${SCENARIOS.join(", ")}`);
const sorTimeoutMs = args["sor-timeout-ms"] === undefined ? undefined : Number(args["sor-timeout-ms"]);
if (sorTimeoutMs !== undefined && !(Number.isInteger(sorTimeoutMs) && sorTimeoutMs > 0)) fail("--sor-timeout-ms must be a positive integer (ms)");

const progress = (line: string) => {
  if (!args.json) process.stderr.write(`  ${line}\n`);
};
const cleanups: (() => Promise<void>)[] = [];
const env: NodeJS.ProcessEnv = { ...process.env };
let brokers = args.brokers ?? process.env.KAFKA_BROKERS;
let registry = args.registry ?? (process.env.SCHEMA_REGISTRY_URL || undefined);
let exitCode = 2;
try {
  if (demo) {
    const { startDemoRecordsServer } = await import("../sor/demo-records-server.ts");
    const records: DemoRecordsServer = await startDemoRecordsServer({ port: 0, enforceIfMatch: !args["demo-without-if-match"] });
    cleanups.push(() => records.close());
    env.RECORDS_URL = records.url;
    progress(`demo records server at ${records.url} (If-Match ${args["demo-without-if-match"] ? "NOT enforced" : "enforced"})`);
    if (brokers === undefined) {
      // Dev convenience only: the local broker and registry that `npm run demo` uses.
      const { ensureStack } = await import("../../scripts/local-stack.ts");
      const stack = await ensureStack({ log: (l) => progress(`[stack] ${l}`) });
      cleanups.push(() => stack.stop());
      brokers = stack.endpoints.brokers.join(",");
      registry ??= stack.endpoints.registryUrl || undefined;
    }
  }
  if (brokers === undefined || brokers === "") {
    throw new WritError("config_invalid", "writ verify: no Kafka: give --brokers host:port (or set KAFKA_BROKERS)", { retriable: false, context: { field: "brokers" } });
  }
  const logFile = resolve(args["log-file"] ?? ".writ/verify.log");
  mkdirSync(dirname(logFile), { recursive: true });
  const logger = pino(
    { name: "writ-verify", level: process.env.LOG_LEVEL ?? "warn", redact: REDACT_PATHS },
    pino.destination({ dest: logFile, sync: true }),
  );
  process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";
  progress(`tools ${tools}; Kafka ${brokers}; registry ${registry ?? "none (plain JSON)"}; logs ${logFile}`);
  const report = await runVerify({
    tools,
    brokers,
    ...(registry === undefined ? {} : { schemaRegistryUrl: registry }),
    env,
    ...(args.tool === undefined ? {} : { only: args.tool }),
    scenarios: scenarios as ScenarioName[],
    ...(sorTimeoutMs === undefined ? {} : { sorTimeoutMs }),
    keepTopics: args["keep-topics"],
    logger,
    onProgress: progress,
  });
  if (!args.json) process.stdout.write(`\n${formatReport(report)}\n\n`);
  process.stdout.write(`${JSON.stringify(report)}\n`);
  exitCode = report.ok ? 0 : 1;
} catch (err) {
  process.stderr.write(err instanceof WritError ? `${err.message}\n` : `writ verify: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
  exitCode = 2;
} finally {
  for (const c of cleanups.reverse()) await c().catch(() => undefined);
}
// kafkajs and pino leave timers behind; the report is out, so leave now.
process.exit(exitCode);
