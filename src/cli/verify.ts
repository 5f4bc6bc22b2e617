// `writ verify`: proves a module's write tools against a staging system of
// record before they get production credentials. Usage: `writ verify --help`.
// stdout: the table, then one JSON line (the report); progress on stderr;
// owner logs in a file. Exit 0 = pass, 1 = a scenario failed, 2 = could not run (or judge), 130/143 = stopped by a signal.
import { existsSync, mkdirSync } from "node:fs";
import { dirname, join, resolve } from "node:path";
import { fileURLToPath } from "node:url";
import { pino } from "pino";
import { WritError } from "../errors.ts";
import { logLevelFromEnv, REDACT_PATHS } from "../logger.ts";
import { connectionSecurityFromEnv } from "../security/transport.ts";
import type { DemoRecordsServer } from "../testing/demo-records-server.ts";
import { SCENARIOS, type ScenarioName } from "../verify/report.ts";
import { watchForStall, type StallWatch } from "./stall-watch.ts";
import { cleanupVerifyRun, DEFAULT_VERIFY_SOR_TIMEOUT_MS, defaultModuleTimeoutMs, formatReport, leftoversLine, runVerify, type VerifyLeftovers, type VerifyReport } from "../verify/verify.ts";
import { clientSettingsFromEnv, msFlag, parseOrExit, type Command } from "./common.ts";
import { onStopSignals, SIGNAL_EXIT_STATUS } from "./signals.ts";

const USAGE = `usage: writ verify --tools <module> [options]
       writ verify --cleanup <run-id> [--force] [--brokers <list>] [--json]
       npm run verify -- --tools <module> [options]

Runs your declared write tools against your staging system of record under duplicate submission,
commit-then-timeout, commit-then-drop and a race with an outside writer, and counts what happened there.

  --tools <module>      exports tools, systems(env) and verify (a fixture per tool; see src/verify/fixture.ts)
  --brokers <list>      Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>      Confluent-API schema registry (default $SCHEMA_REGISTRY_URL; unset = plain JSON)
  --tool <name>         only this tool (repeatable)
  --scenario <name>     only this scenario (repeatable): ${SCENARIOS.join(", ")}
  --sor-timeout-ms <n>  the owner's system-of-record deadline (default 2000)
  --module-timeout-ms <n>  hard deadline of each call into your module (its import, systems(env), a fixture's
                        prepare and effects, your adapters past their own timeoutMs); default the longer of 30000
                        and twice --sor-timeout-ms plus 5000; one under --sor-timeout-ms is refused. An import
                        still running then (a top-level await that never settles) ends verify, exit 2
  --json                print only the JSON report
  --keep-topics         leave the run's topics (writ.verify.<run>.*) and consumer groups on the cluster
  --log-file <path>     owner and client logs (default .writ/verify.log; level $LOG_LEVEL, default warn)
  --demo                start the demo records server in-process and set RECORDS_URL; --tools defaults to
                        examples/verify-fixture.ts; without brokers, start or reuse the local broker
  --demo-without-if-match  the same, with the records server's If-Match enforcement off (shows a lost update)
  --cleanup <run-id>    delete what an ended run left on the cluster (its topics writ.verify.<run>.* and
                        writ.replies.verify.<run>.*, its consumer groups) and nothing else; a run whose cleanup
                        Kafka did not answer names this command. Deletes nothing while a group of the run has
                        members (the run may still be going)
  --force               with --cleanup: delete the topics and the groups without members even so
  -h, --help            this text

HTTP systems of record are reached through a fault proxy: their base URL must come from an environment variable
that systems(env) reads. Systems that are not HTTP get faults simulated at the adapter.

A scenario that failed while Kafka, the registry or its system of record failed (a connection error seen
during it, even one over by then; a connection the broker closed, or a request kafkajs retried, only beside
one) is "incomplete", naming the outage, where that outage explains every problem it found: any outage a reply
or an effect that did not come, only its system of record's a rejection or an escalation. Never harm at the
system of record (a lost update, a duplicate, a stale write let through, a change rejected yet made), nor a
failure of the tool, its adapter or its fixture (an Idempotency-Key the fault could not match, an effects()
that does not count). A race whose stale PATCH did not come back 412 or 2xx (a 502, say) is "incomplete":
If-Match was not exercised.

Exit status: 0 every scenario passed, 1 a scenario failed, 2 bad usage or verify could not run (also
Kafka or the registry lost mid-run, or a scenario incomplete and none failed), 130 (143) stopped by Ctrl-C (SIGTERM) after deleting the run's topics
and groups; once the owner is starting, a stopped run prints its report: what ran, and what did not run
("interrupted"; status incomplete where nothing failed). A signal once every scenario was judged (while the
run deletes its topics) stops nothing: the exit status is the report's. Where Kafka did not answer the run's cleanup, a line on stderr and the JSON (its "leftovers") name
what was left and the --cleanup command. --cleanup: 0 deleted (or nothing left), 1 groups that still have
members (nothing deleted; run it again after their session timeout, 30 s at most, or with --force: the
rest deleted), 2 bad usage or Kafka unreachable.`;

/** A run's status as its exit status: `incomplete` (nothing failed, something not judged) is "could not run". */
const EXIT_STATUS: Readonly<Record<VerifyReport["status"], number>> = { pass: 0, fail: 1, incomplete: 2 };

/** writ's repository root (examples/ lives there; the package does not ship it). */
function repoRoot(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  while (!existsSync(join(dir, "package.json")) && dirname(dir) !== dir) dir = dirname(dir);
  return dir;
}

const OPTIONS = {
  tools: { type: "string" },
  brokers: { type: "string" },
  registry: { type: "string" },
  tool: { type: "string", multiple: true },
  scenario: { type: "string", multiple: true },
  "sor-timeout-ms": { type: "string" },
  "module-timeout-ms": { type: "string" },
  json: { type: "boolean", default: false },
  "keep-topics": { type: "boolean", default: false },
  "log-file": { type: "string" },
  demo: { type: "boolean", default: false },
  "demo-without-if-match": { type: "boolean", default: false },
  cleanup: { type: "string" },
  force: { type: "boolean", default: false },
} as const;

async function main(argv: string[]): Promise<number> {
  const fail = (message: string): number => {
    process.stderr.write(`writ verify: ${message}\n`);
    return 2;
  };
  const parsed = parseOrExit("verify", argv, OPTIONS, USAGE);
  if (typeof parsed === "number") return parsed;
  const args = parsed.values;
  if (args.cleanup !== undefined) return cleanup(args.cleanup, args.brokers ?? process.env.KAFKA_BROKERS, args.json, args.force);
  if (args.force) return fail("--force goes only with --cleanup");

  const demo = args.demo || args["demo-without-if-match"];
  let tools = args.tools;
  if (tools === undefined && demo) {
    tools = join(repoRoot(), "examples", "verify-fixture.ts");
    if (!existsSync(tools)) return fail(`--demo without --tools needs writ's repository (${tools} is not in the package); give --tools`);
  }
  if (tools === undefined) return fail(`--tools is required\n\n${USAGE}`);
  const scenarios = args.scenario ?? [...SCENARIOS];
  const badScenario = scenarios.find((s) => !(SCENARIOS as readonly string[]).includes(s));
  if (badScenario !== undefined) return fail(`unknown scenario ${badScenario}; one of ${SCENARIOS.join(", ")}`);
  let sorTimeoutMs: number | undefined;
  let moduleTimeoutMs: number | undefined;
  try {
    sorTimeoutMs = args["sor-timeout-ms"] === undefined ? undefined : msFlag("sor-timeout-ms", args["sor-timeout-ms"], 0, 1);
    moduleTimeoutMs = args["module-timeout-ms"] === undefined ? undefined : msFlag("module-timeout-ms", args["module-timeout-ms"], 0, 1);
    if (moduleTimeoutMs !== undefined && moduleTimeoutMs < (sorTimeoutMs ?? DEFAULT_VERIFY_SOR_TIMEOUT_MS)) {
      throw new Error(`--module-timeout-ms ${moduleTimeoutMs} is under the system-of-record deadline (--sor-timeout-ms ${sorTimeoutMs ?? DEFAULT_VERIFY_SOR_TIMEOUT_MS}): it would cut off a correct adapter within its own`);
    }
  } catch (err) {
    return fail((err as Error).message);
  }

  const progress = (line: string) => {
    if (!args.json) process.stderr.write(`  ${line}\n`);
  };
  const cleanups: (() => Promise<void>)[] = [];
  const env: NodeJS.ProcessEnv = { ...process.env };
  let brokers = args.brokers ?? process.env.KAFKA_BROKERS;
  let registry = args.registry ?? (process.env.SCHEMA_REGISTRY_URL || undefined);
  let exitCode = 2;
  // What the run left on the cluster, where Kafka did not answer its cleanup.
  let leftovers: VerifyLeftovers | undefined;
  // Ctrl-C or SIGTERM: the run stops, deletes its topics and groups and reports what ran (a second signal ends the
  // process at once).
  const stop = new AbortController();
  let stall: StallWatch | undefined;
  const signals = onStopSignals((name) => {
    process.stderr.write(`writ verify: stopped by ${name}; deleting the run's topics and groups (again, 1 s on, to quit at once)\n`);
    stop.abort(new Error(`stopped by ${name}`));
  });
  try {
    if (demo) {
      const { startDemoRecordsServer } = await import("../testing/demo-records-server.ts");
      const records: DemoRecordsServer = await startDemoRecordsServer({ port: 0, enforceIfMatch: !args["demo-without-if-match"] });
      cleanups.push(() => records.close());
      env.RECORDS_URL = records.url;
      progress(`demo records server at ${records.url} (If-Match ${args["demo-without-if-match"] ? "NOT enforced" : "enforced"})`);
      if (brokers === undefined) {
        // Dev convenience only: the local broker and registry that `npm run demo` uses.
        const { ensureStack } = await import("../testing/local-stack.ts");
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
      { name: "writ-verify", level: logLevelFromEnv("warn"), redact: REDACT_PATHS },
      pino.destination({ dest: logFile, sync: true }),
    );
    process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";
    // SASL/TLS (KAFKA_SSL*, KAFKA_SASL_*) and the registry's URL, basic auth and TLS, validated before the URL is shown
    const connection = connectionSecurityFromEnv(process.env, registry);
    // The owners' WRIT_REPLICATION_FACTOR for verify's topics: one replica is refused where min.insync.replicas is 2.
    const { replicationFactor } = clientSettingsFromEnv();
    progress(`tools ${tools}; Kafka ${brokers}${connection.kafka?.sasl ? ` (SASL ${connection.kafka.sasl.mechanism} as ${connection.kafka.sasl.username})` : ""}; registry ${registry === undefined ? "none (plain JSON)" : shownUrl(registry)}; logs ${logFile}`);
    // The module's code runs on this thread: a synchronous loop there would hold the process past every deadline.
    const limitMs = moduleTimeoutMs ?? defaultModuleTimeoutMs(sorTimeoutMs ?? DEFAULT_VERIFY_SOR_TIMEOUT_MS);
    stall = watchForStall(
      limitMs,
      `writ verify: stopped: the process's JavaScript ran for ${limitMs} ms without yielding (--module-timeout-ms): most likely a synchronous loop in the tools module's code (its top level, systems(env), an adapter or a fixture). A deadline cannot cut off a synchronous call, so verify ends itself (SIGKILL, exit 137)`,
      { jsonLine: args.json },
    );
    const report = await runVerify({
      tools,
      brokers,
      ...Object.fromEntries(Object.entries(connection).filter(([, v]) => v !== undefined)),
      env,
      ...(replicationFactor === undefined ? {} : { replicationFactor }),
      ...(args.tool === undefined ? {} : { only: args.tool }),
      scenarios: scenarios as ScenarioName[],
      ...(sorTimeoutMs === undefined ? {} : { sorTimeoutMs }),
      ...(moduleTimeoutMs === undefined ? {} : { moduleTimeoutMs }),
      keepTopics: args["keep-topics"],
      logger,
      onProgress: progress,
      signal: stop.signal,
      // Stopped while systems(env) runs: the systems it makes are closed before the process ends (bounded by the
      // module deadline; a second signal quits at once).
      onStopClosing: (closing) => {
        process.stderr.write("writ verify: closing the systems systems(env) is still making, once made (again, 1 s on, to quit at once)\n");
        cleanups.push(() => closing);
      },
      onLeftovers: (left) => void (leftovers = left),
      onRunId: (runId) => {
        const cleanup = `writ verify --cleanup ${runId} --brokers ${brokers}`;
        stall?.leaves(`. Run ${runId} may have left topics and groups on the cluster: ${cleanup} deletes them`, {
          runId,
          reason: "verify was stopped (stalled) before it could delete what the run made; which topics and groups exist is not known: the cleanup finds them all by the run id",
          topics: [],
          groups: [],
          groupPrefixes: [],
          cleanup,
        } satisfies VerifyLeftovers);
      },
    });
    // A stopped run's report too: what ran until the signal, and what did not (`interrupted`).
    if (!args.json) process.stdout.write(`\n${formatReport(report)}\n\n`);
    process.stdout.write(`${JSON.stringify(report)}\n`);
    stall?.answered();
    // The signal's status where it cut the run short (the report says so); one that came once every scenario was
    // judged (the run deleting its topics) stopped nothing, and the status is the report's, as its JSON says.
    exitCode = signals.first !== null && report.interrupted?.stopped === true ? SIGNAL_EXIT_STATUS[signals.first] : EXIT_STATUS[report.status];
  } catch (err) {
    // The signal's status only where it is why the run ended: Kafka lost with nothing failed, a Ctrl-C coming during
    // the cleanup that follows, is still said, and could not run (2).
    if (signals.first !== null && stop.signal.aborted && err === stop.signal.reason) exitCode = SIGNAL_EXIT_STATUS[signals.first];
    else {
      process.stderr.write(err instanceof WritError ? `${err.message}\n` : `writ verify: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`);
      exitCode = 2;
    }
    // No report: what the run left is said on its own, on stderr and as a JSON line.
    if (leftovers) {
      process.stderr.write(`writ verify: ${leftoversLine(leftovers)}\n`);
      const error = err instanceof WritError ? { code: err.code, message: err.message } : { message: err instanceof Error ? err.message : String(err) };
      process.stdout.write(`${JSON.stringify({ ok: false, runId: leftovers.runId, error, leftovers })}\n`);
      stall?.answered();
    }
  } finally {
    // The cleanups close what systems(env) made (module code too): still watched (once stdout has the command's
    // answer, a stall there is said on stderr only; before, the watch's own line is the answer).
    for (const c of cleanups.reverse()) await c().catch(() => undefined);
    stall?.stop();
    signals.dispose();
  }
  return exitCode;
}

/** `writ verify --cleanup <run-id> [--force]`: deletes an ended run's topics and groups, nothing else. */
async function cleanup(runId: string, brokers: string | undefined, json: boolean, force: boolean): Promise<number> {
  if (brokers === undefined || brokers.trim() === "") {
    process.stderr.write("writ verify: no Kafka: give --brokers host:port (or set KAFKA_BROKERS)\n");
    return 2;
  }
  try {
    const list = brokers.split(",").map((b) => b.trim()).filter(Boolean);
    // SASL/TLS from the environment, as for a run.
    const { kafka } = connectionSecurityFromEnv(process.env, undefined);
    const done = await cleanupVerifyRun({ runId, brokers: list, force, ...(kafka === undefined ? {} : { kafka }) });
    if (json) process.stdout.write(`${JSON.stringify(done)}\n`);
    else if (done.topics.length + done.groups.length + done.busy.length === 0) process.stdout.write(`nothing of verify run ${runId} is left on the cluster\n`);
    else if (done.topics.length + done.groups.length > 0) process.stdout.write(`deleted verify run ${runId}'s topics ${done.topics.join(", ") || "(none)"}; groups ${done.groups.join(", ") || "(none)"}\n`);
    if (done.busy.length === 0) return 0;
    const groups = `groups ${done.busy.join(", ")} still have members`;
    process.stderr.write(
      force
        ? `writ verify: ${groups} (left; the rest deleted): the broker drops consumers that could not leave after their session timeout (30 s at most): run this again then\n`
        : `writ verify: ${groups}: deleted nothing, as the run may still be going. If it has ended, they are consumers that could not leave (Kafka was lost), ` +
            "which the broker drops after their session timeout (30 s at most): run this again then, or with --force to delete the rest now\n",
    );
    return 1;
  } catch (err) {
    process.stderr.write(`writ verify: ${err instanceof Error ? err.message : String(err)}\n`);
    return 2;
  }
}

export const verifyCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main,
};

/** A URL as progress lines show it: a query or fragment (where a gateway's token may sit) is not printed. */
export function shownUrl(raw: string): string {
  try {
    const url = new URL(raw);
    return `${url.origin}${url.pathname}${url.search || url.hash ? " (query not shown)" : ""}`;
  } catch {
    return "(not a URL)";
  }
}
