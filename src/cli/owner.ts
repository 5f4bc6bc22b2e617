// `writ owner`: the owner process. Configuration comes from the environment
// (routerConfigFromEnv: KAFKA_BROKERS, SCHEMA_REGISTRY_URL, WRIT_*), the tools
// from --tools or WRIT_TOOLS_MODULE; all of it is validated before anything
// connects. consumers/owner-main.ts (`npm run owner`) runs the same code.
import { routerConfigFromEnv } from "../config.ts";
import { WritError } from "../errors.ts";
import { unknownWritVariables } from "../known-variables.ts";
import { createLogger } from "../logger.ts";
import { startRouter } from "../owner/router.ts";
import { printable } from "../printable.ts";
import { parseCommandArgs, UsageError, type Command } from "./common.ts";
import { onStopSignals } from "./signals.ts";
import { loadToolsModule, systemsOf } from "./tools-module.ts";

const USAGE = `usage: writ owner --tools <module> [--brokers <list>] [--registry <url>]

Runs the owners of writ.intents for the write tools of <module>: a module exporting tools (declared write
tools) and systems(env) (their systems of record). Joins the owners' consumer group, creates the contract
topics that are missing, and runs until SIGTERM or SIGINT: then it stops cleanly (in-flight intents finish, the
producers close, it leaves the group), within WRIT_STOP_TIMEOUT_MS (default 25000). A second SIGTERM or SIGINT
while it stops ends it at once, without a clean stop; one within 1 s of the first is the same request (under
npm run or npx one Ctrl-C arrives twice: from the terminal and forwarded by npm).

  --tools <module>     the tools module (default $WRIT_TOOLS_MODULE; one of the two is required). A path,
                       resolved against the working directory: .js, or .ts on a Node that strips types.
                       Its import may take WRIT_TOOLS_IMPORT_TIMEOUT_MS (default 30000)
  --brokers <list>     Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>     Confluent-API schema registry (default $SCHEMA_REGISTRY_URL; unset = plain JSON)
  -h, --help           this text

Everything else comes from the environment, as in the README's configuration table: WRIT_GROUP_ID,
WRIT_INTENTS_TOPIC, WRIT_INTENT_PARTITIONS, WRIT_REPLICATION_FACTOR, WRIT_REPLY_TOPIC_PREFIX,
WRIT_HEALTH_PORT, WRIT_SOR_TIMEOUT_MS, … systems(env) receives the environment too. SASL/TLS: KAFKA_SSL,
KAFKA_SSL_CA_FILE, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD(_FILE); the registry's
SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD(_FILE), SCHEMA_REGISTRY_CA_FILE.
Logs: JSON lines on stderr (level $LOG_LEVEL, default info).

Exit status: 0 stopped cleanly after a signal, 1 the owner could not start or gave up (a supervisor restarts
it), or its stop failed or outlasted WRIT_STOP_TIMEOUT_MS, 2 bad usage or configuration (a missing tools
module or one whose import outlasts WRIT_TOOLS_IMPORT_TIMEOUT_MS, an invalid WRIT_* variable, a tool
declaration the owners do not admit, systems(env) that throws or does not return an array of systems of
record); these print one line on stderr naming what to fix, and a restart does not help. Ended by a second signal: 130 (SIGINT), 143 (SIGTERM), as killed by it.`;

const OPTIONS = { tools: { type: "string" }, brokers: { type: "string" }, registry: { type: "string" } } as const;

async function main(argv: string[]): Promise<number> {
  let args;
  try {
    args = parseCommandArgs(argv, OPTIONS, USAGE);
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`writ owner: ${err.message}\n${USAGE.split("\n")[0]}\n`);
      return 2;
    }
    throw err;
  }
  if (args === undefined) return 0;
  const env: NodeJS.ProcessEnv = { ...process.env };
  if (args.values.brokers !== undefined) env.KAFKA_BROKERS = args.values.brokers;
  if (args.values.registry !== undefined) env.SCHEMA_REGISTRY_URL = args.values.registry;

  let log;
  let lastWords;
  let config;
  let tools;
  let systems;
  try {
    // LOG_LEVEL is checked here, as every other setting (a bad one is config_invalid naming it)
    log = createLogger({ name: "writ-owner" });
    // Lines logged just before the process ends itself, written at once.
    lastWords = createLogger({ name: "writ-owner", sync: true });
    // As every command that talks to Kafka says it (brokersFrom); the checks of the value are the config's.
    if ((env.KAFKA_BROKERS ?? "").trim() === "") throw new UsageError("no Kafka: give --brokers host:port[,…] (or set KAFKA_BROKERS)");
    tools = await loadToolsModule(args.values.tools, env);
    config = routerConfigFromEnv(env);
    systems = systemsOf(tools, env);
  } catch (err) {
    // One plain line: the message names the flag or variable to fix.
    process.stderr.write(`writ owner: ${err instanceof Error ? err.message : String(err)}\n`);
    if (process.env.LOG_LEVEL?.trim().toLowerCase() === "debug" && err instanceof Error) process.stderr.write(`${err.stack}\n`);
    return 2;
  }

  // A misspelt setting (…_HEALTH_PROT) would otherwise be ignored without a word; others' own WRIT_ variables are fine.
  for (const unknown of unknownWritVariables(env)) log.warn({ variable: unknown.variable, suggestion: unknown.suggestion }, unknown.message);
  // The clean stop waits up to three WRIT_SOR_TIMEOUT_MS for writes in flight and one more for the transaction's
  // abort: a shorter WRIT_STOP_TIMEOUT_MS may end it first (safe: the next owner reconciles), which the operator
  // should know before a deploy, not from the stop's error line.
  const stopNeedsMs = 4 * config.sorTimeoutMs;
  if (config.stopTimeoutMs < stopNeedsMs) {
    log.warn(
      { stopTimeoutMs: config.stopTimeoutMs, sorTimeoutMs: config.sorTimeoutMs },
      `WRIT_STOP_TIMEOUT_MS (${config.stopTimeoutMs}) is below four WRIT_SOR_TIMEOUT_MS (${stopNeedsMs}): a stop may end before writes in flight finish (the next owner reconciles them); raise it to at least ${stopNeedsMs}, and the supervisor's grace period above it`,
    );
  }

  let router;
  try {
    router = await startRouter({
      config,
      tools: tools.module.tools,
      systems,
      logger: log,
      onFatal: (err) => {
        log.fatal({ err }, "owner cannot continue; exiting so a supervisor restarts it");
        // Configuration found wrong while running (another group of owners on the intents topic, found when a
        // partition was taken up): one plain line and exit 2, as when it is found at the start.
        const configInvalid = err instanceof WritError && err.code === "config_invalid";
        if (configInvalid) process.stderr.write(`writ owner: ${printable(err.message)}\n`);
        // leave the log line a moment to be written
        setTimeout(() => process.exit(configInvalid ? 2 : 1), 100).unref();
      },
    });
  } catch (err) {
    log.fatal({ err }, err instanceof WritError ? err.message : "owner failed to start");
    // A tool declaration the owners do not admit (an unknown field or system, a missing key scope, a bad
    // reconcile) is configuration like an invalid variable: one plain line naming each tool and field, exit 2.
    if (err instanceof WritError && (err.code === "config_invalid" || err.code === "tool_not_admitted")) {
      const problems = err.code === "tool_not_admitted" ? (err.context?.problems as string[] | undefined) : undefined;
      process.stderr.write(`writ owner: ${printable(problems?.join("; ") ?? err.message)}\n`);
      return 2;
    }
    return 1;
  }
  log.info({ tools: tools.module.tools.map((t) => t.name), module: tools.path, group: config.groupId, topic: config.topics.intents }, "owner started");

  const started = router;
  return new Promise<number>((resolveExit) => {
    onStopSignals(
      (signal) => {
        log.info({ signal }, "stopping");
        // A stop that hangs (a system of record that never answers an intent in flight, brokers gone) ends within
        // WRIT_STOP_TIMEOUT_MS: what was in flight is the next owner's to reconcile, as after a crash.
        const deadline = setTimeout(() => {
          lastWords.error({ signal, stopTimeoutMs: config.stopTimeoutMs }, "owner did not stop within WRIT_STOP_TIMEOUT_MS; exiting without a clean stop");
          resolveExit(1);
        }, config.stopTimeoutMs);
        started.stop().then(
          () => resolveExit(0),
          (err: unknown) => {
            log.error({ err }, "owner did not stop cleanly");
            resolveExit(1);
          },
        ).finally(() => clearTimeout(deadline));
      },
      (signal) => lastWords.warn({ signal }, "second signal: exiting without a clean stop"),
      (signal) => log.debug({ signal }, "signal within 1 s of the first: the same stop request"),
    );
  });
}

export const ownerCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main,
};
