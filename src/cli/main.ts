#!/usr/bin/env node
// The `writ` command (package.json "bin": dist/src/cli/main.js, which plain
// Node >= 22 runs). From the repository, `node src/cli/main.ts` runs the same
// on Node 24. Each command lives in its own module, loaded only when asked
// for, and resolves with the process's exit status.
import { hideKafkajsTimeoutWarning } from "../node-warnings.ts";
import { COMMANDS } from "./commands.ts";
import { packageVersion } from "./common.ts";
import { exitWhenWritten } from "./exit.ts";

function usage(): string {
  const lines = Object.entries(COMMANDS).map(([name, c]) => `  ${name.padEnd(12)} ${c.summary}`);
  return `usage: writ <command> [options]

writ: a single-writer router for AI-agent write tools on Apache Kafka.

Commands:
${lines.join("\n")}
  help [cmd]   this text, or a command's usage (the same as writ <command> --help)

  writ --version    the version of writ

Kafka and the schema registry come from --brokers/--registry or $KAFKA_BROKERS/$SCHEMA_REGISTRY_URL;
SASL/TLS from $KAFKA_SSL, $KAFKA_SSL_CA_FILE, $KAFKA_SASL_MECHANISM, $KAFKA_SASL_USERNAME, $KAFKA_SASL_PASSWORD(_FILE),
the registry's basic auth and CA from $SCHEMA_REGISTRY_USERNAME, $SCHEMA_REGISTRY_PASSWORD(_FILE), $SCHEMA_REGISTRY_CA_FILE;
owner settings from the WRIT_* variables (see the README). $LOG_LEVEL=debug shows kafkajs's own logs.
Exit status: 0 success, 1 the command's negative outcome (see each command's --help), 2 bad usage or could not run.`;
}

async function main(argv: string[]): Promise<number> {
  const [first, ...rest] = argv;
  if (first === "--version" || first === "-v" || first === "version") {
    process.stdout.write(`${packageVersion()}\n`);
    return 0;
  }
  if (first === undefined) {
    process.stderr.write(`${usage()}\n`);
    return 2;
  }
  if (first === "help" || first === "--help" || first === "-h") {
    const topic = rest[0];
    if (topic === undefined) {
      process.stdout.write(`${usage()}\n`);
      return 0;
    }
    const command = Object.hasOwn(COMMANDS, topic) ? COMMANDS[topic] : undefined;
    if (command === undefined) {
      process.stderr.write(`writ help: unknown command ${topic}; commands: ${Object.keys(COMMANDS).join(", ")}\n`);
      return 2;
    }
    process.stdout.write(`${(await command.load()).usage}\n`);
    return 0;
  }
  const command = Object.hasOwn(COMMANDS, first) ? COMMANDS[first] : undefined;
  if (command === undefined) {
    process.stderr.write(`writ: unknown command ${first}; commands: ${Object.keys(COMMANDS).join(", ")} (writ help)\n`);
    return 2;
  }
  return (await command.load()).main(rest);
}

// A reader that stops early (`writ tail … | head`): the rest of the output has nowhere to go, so the command
// ends quietly, as Unix tools do, instead of with an unhandled EPIPE's stack trace.
// Once the command has its status, a reader gone while its last output is written keeps that status (a failure
// stays a failure).
let status: number | undefined;
process.stdout.on("error", (err: NodeJS.ErrnoException) => {
  if (err.code === "EPIPE") process.exit(status ?? 0);
  throw err;
});
hideKafkajsTimeoutWarning();
process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";
const code = await main(process.argv.slice(2));
status = code;
// kafkajs and pino leave timers behind; the command is done, so leave once its output is out (src/cli/exit.ts).
await exitWhenWritten(code);
