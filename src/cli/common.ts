// What the `writ` commands share: argument parsing with usage errors (exit 2),
// the quiet logger of the short-lived commands, Kafka clients that log
// kafkajs at debug, and the package version.
import { existsSync, readFileSync, statSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { parseArgs, type ParseArgsConfig } from "node:util";
import { Kafka, logLevel } from "kafkajs";
import { pino, type Logger } from "pino";
import type { z } from "zod";
import { ownersIntentBounds } from "../../producers/writ-client.ts";
import { jsonDepth } from "../canonical-json.ts";
import { MAX_TIMER_MS, TopicsConfig, envNumber, kafkaId, maxIntentBytes, maxJsonDepth, maxMessageBytes, readableIssue, replicationFactor, replyTopicPrefix, topicName } from "../config.ts";
import { DEFAULT_OWNER_PRINCIPAL, ownerPrincipals } from "../doctor/acls.ts";
import { WritError } from "../errors.ts";
import { registerCompressionCodecs } from "../kafka/compression.ts";
import { kafkaLogCreator } from "../kafka-log.ts";
import { logLevelFromEnv, REDACT_PATHS } from "../logger.ts";
import { printable } from "../printable.ts";
import { Audience, JSON_PATCH_EXAMPLE, parseJsonPatch, type JsonPatchOp } from "../schemas/common.ts";
import { resolutionBounds } from "../schemas/resolution.ts";
import { audienceOf, type SigningRefusals, signerOf } from "../security/key-file.ts";
import type { IntentSigner } from "../security/signing.ts";
import { connectionSecurityFromEnv, kafkaConnection, type ConnectionSecurity, type KafkaSecurity } from "../security/transport.ts";

/** A command: `main` resolves with the process's exit status. */
export interface Command {
  usage: string;
  /** The flags `main` parses (besides -h/--help), for the test that keeps them and `usage` (and the README) in step. */
  options: Options;
  main(argv: string[]): Promise<number>;
}

/** Bad usage: the command prints the message and its usage hint, and exits 2. */
export class UsageError extends Error {
  override readonly name = "UsageError";
}

export type Options = NonNullable<ParseArgsConfig["options"]>;

/**
 * `parseArgs`, strict, with `-h/--help` added; unknown or malformed options
 * become a {@link UsageError}. Returns undefined when help was asked for (the
 * usage is printed on stdout then).
 */
export function parseCommandArgs<O extends Options>(argv: string[], options: O, usage: string, allowPositionals = false) {
  const config = {
    args: argv,
    options: { ...options, help: { type: "boolean", short: "h" } } as O & { help: { type: "boolean"; short: "h" } },
    strict: true as const,
    allowPositionals,
  };
  let parsed: ReturnType<typeof parseArgs<typeof config>>;
  try {
    parsed = parseArgs(config);
  } catch (err) {
    throw new UsageError(err instanceof Error ? err.message : String(err));
  }
  if ((parsed.values as { help?: boolean }).help === true) {
    process.stdout.write(`${usage}\n`);
    return undefined;
  }
  return parsed;
}

/**
 * {@link parseCommandArgs} for a command that prints its whole usage after bad
 * usage (doctor and verify, whose flags are many): the parsed arguments, or the
 * exit status to return at once (0 after --help; 2 after bad usage, said on stderr).
 */
export function parseOrExit<O extends Options>(name: string, argv: string[], options: O, usage: string) {
  try {
    return parseCommandArgs(argv, options, usage) ?? 0;
  } catch (err) {
    if (!(err instanceof UsageError)) throw err;
    process.stderr.write(`writ ${name}: ${err.message}\n\n${usage}\n`);
    return 2;
  }
}

/**
 * Runs a command's body: usage errors and configuration errors print one line
 * and exit 2, anything else that stops it prints one line and exits `failCode`.
 */
export async function runCommand(name: string, usage: string, body: () => Promise<number>, failCode = 2): Promise<number> {
  try {
    return await body();
  } catch (err) {
    if (err instanceof UsageError) {
      process.stderr.write(`writ ${name}: ${err.message}\n${hintOf(name, usage)}`);
      return 2;
    }
    if (err instanceof WritError && err.code === "config_invalid") {
      process.stderr.write(`writ ${name}: ${err.message}\n`);
      return 2;
    }
    const kafka = err instanceof Error && err.name.startsWith("KafkaJS") ? "Kafka: " : "";
    process.stderr.write(`writ ${name}: ${kafka}${describeError(err)}\n`);
    if (process.env.LOG_LEVEL?.trim().toLowerCase() === "debug" && err instanceof Error && err.stack) process.stderr.write(`${err.stack}\n`);
    return failCode;
  }
}

function hintOf(name: string, usage: string): string {
  const first = usage.split("\n")[0] ?? "";
  return `${first}\n(writ ${name} --help for more)\n`;
}

/** One line for an error: the message, and the cause kafkajs wrapped it around. */
export function describeError(err: unknown): string {
  if (!(err instanceof Error)) return String(err);
  const cause = (err as { cause?: unknown }).cause ?? (err as { originalError?: unknown }).originalError;
  const causeText = cause instanceof Error && !err.message.includes(cause.message) ? ` (${cause.message})` : "";
  return `${err.message}${causeText}`;
}

/**
 * The logger of the short-lived commands: plain lines on stderr
 * (`writ <command>: warn: …`), warnings and errors only unless `$LOG_LEVEL`
 * says otherwise. kafkajs's own logs (component `kafkajs`, from
 * kafkaLogCreator) are shown only at debug: what kafkajs retries (a group
 * coordinator still loading, a leader election, a broker that refuses
 * connections for a moment) heals or surfaces as the command's error, which is
 * reported in one line. Only when kafkajs keeps failing for
 * {@link PERSISTING_MS} does one warning say so (again at most once a minute).
 */
export function commandLogger(name: string): Logger {
  const level = logLevelFromEnv("warn");
  const verbose = level === "debug" || level === "trace";
  let streakStart = 0;
  let lastKafkaError = 0;
  let lastReported = 0;
  return pino(
    { name: `writ-${name}`, level, redact: REDACT_PATHS },
    {
      write(line: string) {
        let o: Record<string, unknown>;
        try {
          o = JSON.parse(line) as Record<string, unknown>;
        } catch {
          process.stderr.write(line);
          return;
        }
        const { level: lvl, msg, time: _t, pid: _p, hostname: _h, name: _n, err, ...rest } = o;
        const label = pino.levels.labels[Number(lvl)] ?? String(lvl);
        if (rest.component === "kafkajs" && !verbose) {
          if (Number(lvl) < 50) return;
          const now = Date.now();
          if (now - lastKafkaError > PERSISTING_MS) streakStart = now;
          lastKafkaError = now;
          if (now - streakStart < PERSISTING_MS || now - lastReported < 60_000) return;
          lastReported = now;
          process.stderr.write(`writ ${name}: warn: Kafka keeps failing for ${Math.round((now - streakStart) / 1000)} s, still retrying: ${printable(String(msg ?? ""))} (LOG_LEVEL=debug shows every attempt)\n`);
          return;
        }
        const errText = err && typeof err === "object" && "message" in err ? `: ${String((err as { message: unknown }).message)}` : "";
        const extra = verbose ? ` ${JSON.stringify(rest)}` : "";
        // Messages and errors quote records and brokers (keys, ids, zod messages naming a record's fields).
        process.stderr.write(`writ ${name}: ${label}: ${printable(`${String(msg ?? "")}${errText}${extra}`)}\n`);
      },
    },
  );
}

/** How long kafkajs must keep failing before a command says so. ms. */
export const PERSISTING_MS = 10_000;

/** Brokers from a flag or `$KAFKA_BROKERS`; a usage error when neither gives host:port pairs. */
export function brokersFrom(flag: string | undefined): string[] {
  const raw = flag ?? process.env.KAFKA_BROKERS ?? "";
  const brokers = raw
    .split(",")
    .map((b) => b.trim())
    .filter((b) => b !== "");
  if (brokers.length === 0) throw new UsageError("no Kafka: give --brokers host:port[,…] (or set KAFKA_BROKERS)");
  const bad = brokers.find((b) => !/^[^\s:]+:\d{1,5}$/.test(b));
  if (bad !== undefined) throw new UsageError(`--brokers: ${bad} is not host:port`);
  return brokers;
}

/** The topics of the contract, by the owners' variables; their defaults are the owners' (src/config.ts). */
const CONTRACT_TOPIC_ENV = {
  WRIT_INTENTS_TOPIC: "intents",
  WRIT_LEDGER_TOPIC: "ledger",
  WRIT_HUMAN_TOPIC: "human",
  WRIT_DLQ_TOPIC: "dlq",
} as const satisfies Record<string, keyof TopicsConfig>;
const CONTRACT_TOPIC_DEFAULTS = TopicsConfig.parse({});

/** A setting from the owners' environment variable, checked as owners check it: a configuration error (exit 2) naming the variable. */
export function fromEnv<T>(variable: string, schema: z.ZodType<T>, fallback: T, numeric = false, env: NodeJS.ProcessEnv = process.env): T {
  const raw = env[variable];
  if (raw === undefined || raw === "") return fallback;
  const checked = schema.safeParse(numeric ? envNumber(raw) : raw, { reportInput: true });
  if (!checked.success) {
    // Worded as the owner words it (readableIssue: "at most 128, got 200", not zod's "Too big: expected number to be <=128").
    const issue = checked.error.issues[0];
    const problem = issue ? readableIssue(issue) : "invalid";
    throw new WritError("config_invalid", `${variable}: ${problem}${/, got /.test(problem) ? "" : `, got "${printable(raw.slice(0, 300))}"`}`, {
      retriable: false,
      context: { field: variable },
    });
  }
  return checked.data;
}

/** A contract topic's name from its variable (`WRIT_INTENTS_TOPIC`, …) or its default. */
export function topicFromEnv(variable: keyof typeof CONTRACT_TOPIC_ENV): string {
  return fromEnv(variable, topicName, CONTRACT_TOPIC_DEFAULTS[CONTRACT_TOPIC_ENV[variable]]);
}

/** The four contract topics' names from their variables, or their defaults. */
export function contractTopicsFromEnv(): { intents: string; ledger: string; human: string; dlq: string } {
  return {
    intents: topicFromEnv("WRIT_INTENTS_TOPIC"),
    ledger: topicFromEnv("WRIT_LEDGER_TOPIC"),
    human: topicFromEnv("WRIT_HUMAN_TOPIC"),
    dlq: topicFromEnv("WRIT_DLQ_TOPIC"),
  };
}

/**
 * The owners' Kafka principals, for the ACL check: `--owner-principal` (repeatable, comma-separated), else
 * `$WRIT_OWNER_PRINCIPALS`, else `User:writ-owner`. A bare name is a SASL user (`User:<name>`).
 */
export function ownerPrincipalsFrom(flag: readonly string[] | undefined): string[] {
  if (flag !== undefined && flag.length > 0) return ownerPrincipals(flag, "--owner-principal");
  const env = process.env.WRIT_OWNER_PRINCIPALS;
  if (env !== undefined && env !== "") return ownerPrincipals([env], "WRIT_OWNER_PRINCIPALS");
  return [DEFAULT_OWNER_PRINCIPAL];
}

/** The start of reply topics' names: `$WRIT_REPLY_TOPIC_PREFIX` or `writ.replies.`. */
export function replyPrefixFromEnv(): string {
  return fromEnv("WRIT_REPLY_TOPIC_PREFIX", replyTopicPrefix, "writ.replies.");
}

/** The owners' consumer group: `$WRIT_GROUP_ID` or `writ.owners`. */
export function groupIdFromEnv(): string {
  return fromEnv("WRIT_GROUP_ID", kafkaId, "writ.owners");
}

/**
 * What a client takes from the owners' variables: their admission bounds (`WRIT_MAX_INTENT_BYTES`,
 * `WRIT_MAX_JSON_DEPTH`), so it refuses before sending what owners would dead-letter without a reply, and the
 * replication factor of topics writ creates (`WRIT_REPLICATION_FACTOR`), for the reply topic it creates: a
 * reply topic with one replica on a cluster whose `min.insync.replicas` is 2 refuses every reply (only those set);
 * and their reply prefix (`WRIT_REPLY_TOPIC_PREFIX`), which the client's reply topic must start with.
 */
export function clientSettingsFromEnv(): { maxIntentBytes?: number; maxJsonDepth?: number; replicationFactor?: number; replyTopicPrefix: string } {
  const bytes = fromEnv<number | undefined>("WRIT_MAX_INTENT_BYTES", maxIntentBytes, undefined, true);
  const depth = fromEnv<number | undefined>("WRIT_MAX_JSON_DEPTH", maxJsonDepth, undefined, true);
  const rf = fromEnv<number | undefined>("WRIT_REPLICATION_FACTOR", replicationFactor, undefined, true);
  return {
    ...(bytes !== undefined ? { maxIntentBytes: bytes } : {}),
    ...(depth !== undefined ? { maxJsonDepth: depth } : {}),
    ...(rf !== undefined ? { replicationFactor: rf } : {}),
    replyTopicPrefix: replyPrefixFromEnv(),
  };
}

/** The owners' largest record, `$WRIT_MAX_MESSAGE_BYTES` (default 1,000,000): writ's topics take a record batch at least this large. */
export function maxMessageBytesFromEnv(): number {
  return fromEnv("WRIT_MAX_MESSAGE_BYTES", maxMessageBytes, 1_000_000, true);
}

/** The schema registry from a flag or `$SCHEMA_REGISTRY_URL`; undefined for plain JSON. */
export function registryFrom(flag: string | undefined): string | undefined {
  const url = flag ?? process.env.SCHEMA_REGISTRY_URL;
  return url === undefined || url === "" ? undefined : url;
}

/**
 * How a command connects, from the environment: SASL and TLS to Kafka
 * (KAFKA_SSL, KAFKA_SSL_CA_FILE, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME,
 * KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, …) and the registry
 * (`registryUrl`, from --registry or SCHEMA_REGISTRY_URL, with
 * SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD, SCHEMA_REGISTRY_CA_FILE).
 * Validated: a bad value is a configuration error (exit 2) naming the
 * variable, never showing a secret. Only the keys that are set are present,
 * so the result spreads into a client's config.
 */
export function connectionFor(registryUrl: string | undefined): ConnectionSecurity {
  const c = connectionSecurityFromEnv(process.env, registryUrl);
  return Object.fromEntries(Object.entries(c).filter(([, v]) => v !== undefined)) as ConnectionSecurity;
}

/**
 * A kafkajs client for a command. kafkajs logs through `log` (kafkaLogCreator
 * demotes what it retries to debug); a failure that persists reaches the
 * command as an error, which it reports in one line. SASL and TLS: `security`,
 * by default from the environment ({@link connectionFor}).
 */
export function kafkaFor(brokers: string[], clientId: string, log: Logger, security: KafkaSecurity | undefined = connectionFor(undefined).kafka): Kafka {
  registerCompressionCodecs();
  process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";
  return new Kafka({
    clientId,
    brokers,
    ...kafkaConnection(security),
    logLevel: ["debug", "trace"].includes(process.env.LOG_LEVEL?.trim().toLowerCase() ?? "") ? logLevel.DEBUG : logLevel.WARN,
    logCreator: kafkaLogCreator(log),
    connectionTimeout: 3000,
    retry: { retries: 5, initialRetryTime: 300, maxRetryTime: 3000 },
  });
}

/** writ's package.json: the nearest one above this module (src/cli in the repo, dist/src/cli in the package). */
export function packageVersion(): string {
  let dir = dirname(fileURLToPath(import.meta.url));
  for (;;) {
    const file = join(dir, "package.json");
    if (existsSync(file)) {
      const pkg = JSON.parse(readFileSync(file, "utf8")) as { name?: string; version?: string };
      if (pkg.name === "writ" && typeof pkg.version === "string") return pkg.version;
    }
    const up = dirname(dir);
    if (up === dir) return "unknown";
    dir = up;
  }
}

/** Parses an integer flag from `min` to `max`; a usage error otherwise. */
export function intFlag(name: string, raw: string | undefined, fallback: number, min = 0, max = Number.MAX_SAFE_INTEGER): number {
  if (raw === undefined) return fallback;
  if (!/^\d+$/.test(raw) || !Number.isSafeInteger(Number(raw)) || Number(raw) < min || Number(raw) > max) {
    throw new UsageError(`--${name} must be an integer from ${min} to ${max}, got ${raw}`);
  }
  return Number(raw);
}

/** A flag in ms that becomes a timer: past {@link MAX_TIMER_MS} Node would fire it after 1 ms. */
export function msFlag(name: string, raw: string | undefined, fallback: number, min = 0): number {
  return intFlag(name, raw, fallback, min, MAX_TIMER_MS);
}

/** Parses a JSON flag; a usage error naming the flag otherwise. */
export function jsonFlag(name: string, raw: string): unknown {
  try {
    return JSON.parse(raw);
  } catch (err) {
    throw new UsageError(`--${name} is not JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
}

/** `value` as a JSON Patch (RFC 6902): a usage error naming `where` (the flag) and the first problem otherwise. */
export function jsonPatchOf(where: string, value: unknown): JsonPatchOp[] {
  const parsed = parseJsonPatch(value);
  if (parsed.ok) return parsed.patch;
  throw new UsageError(`${where} is not a JSON Patch (RFC 6902), an array of operations such as ${JSON_PATCH_EXAMPLE}: ${parsed.problem}`);
}

/**
 * A resolution's `delta` given on the command line (`--<name> '<json>'`) or in a file (`--<name>-file <path|->`),
 * within what owners admit of it (resolutionBounds, from `WRIT_MAX_INTENT_BYTES` and `WRIT_MAX_JSON_DEPTH` as
 * {@link clientSettingsFromEnv} reads them): what they would dead-letter is a usage error naming the flag, before
 * anything is read whole or sent.
 */
export function jsonPatchFlag(name: string, text: string | undefined, file: string | undefined): JsonPatchOp[] | undefined {
  if (text !== undefined && file !== undefined) throw new UsageError(`give --${name} or --${name}-file, not both`);
  if (text === undefined && file === undefined) return undefined;
  const { maxBytes, maxDepth } = resolutionBounds(ownersIntentBounds(clientSettingsFromEnv())).delta;
  const flag = text !== undefined ? `--${name}` : `--${name}-file ${file}`;
  let raw = text;
  if (raw === undefined) {
    try {
      // A regular file is measured before it is read; stdin (-) is read, then measured.
      if (file !== "-" && statSync(file!).size > maxBytes) throw new UsageError(`${flag}: larger than ${maxBytes} bytes, which owners refuse (WRIT_MAX_INTENT_BYTES)`);
      raw = readFileSync(file === "-" ? 0 : file!, "utf8");
    } catch (err) {
      if (err instanceof UsageError) throw err;
      throw new UsageError(`${flag}: ${(err as NodeJS.ErrnoException).code ?? (err as Error).message}`);
    }
  }
  if (Buffer.byteLength(raw) > maxBytes) throw new UsageError(`${flag}: larger than ${maxBytes} bytes, which owners refuse (WRIT_MAX_INTENT_BYTES)`);
  let value: unknown;
  try {
    value = JSON.parse(raw);
  } catch (err) {
    throw new UsageError(`${flag} is not JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (jsonDepth(value, maxDepth) > maxDepth) throw new UsageError(`${flag}: nested deeper than ${maxDepth} levels, which owners refuse inside the record it is sent in (WRIT_MAX_JSON_DEPTH)`);
  return jsonPatchOf(flag, value);
}

/**
 * The signer of `--signing-key <pem file> --key-id <id>`, read and checked before anything connects: a file that
 * cannot be read or holds no Ed25519 private key, or a bad key id, is a usage error naming the flag (and never
 * quoting the file), not a decoder error after the command has read Kafka.
 */
export function signerFromFlags(keyFile: string | undefined, keyId: string | undefined): IntentSigner | undefined {
  // A regular file, bounded: --signing-key /dev/stdin or /dev/zero is refused unread.
  return signerOf(keyFile, keyId, FLAG_REFUSALS);
}

/** The writ commands' wording of a refused signing input: the flag, then why. */
const FLAG_REFUSALS: SigningRefusals = {
  pair: () => new UsageError("--signing-key and --key-id go together"),
  refused: (input, detail) => new UsageError(input === "keyFile" ? `--signing-key ${detail}` : `--${input === "keyId" ? "key-id" : "audience"}: ${detail}`),
};

/**
 * What a command that signs gives its client: the signer of `--signing-key` and `--key-id`, and the audience it signs
 * for, `--audience` or else `$WRIT_SIGNING_AUDIENCE` (the owners' variable: a command run beside them signs for their
 * deployment). `--audience` without a signer is a usage error (an audience nobody signs protects nothing); the
 * variable is used only when the command signs. Checked before anything connects.
 */
export function signingFromFlags(a: { "signing-key"?: string | undefined; "key-id"?: string | undefined; audience?: string | undefined }): { signer?: IntentSigner; audience?: string } {
  const signer = signerFromFlags(a["signing-key"], a["key-id"]);
  if (a.audience !== undefined) {
    if (signer === undefined) throw new UsageError("--audience goes with --signing-key and --key-id: owners check the audience of signed records only");
    return { signer, audience: audienceOf(a.audience, FLAG_REFUSALS) };
  }
  if (signer === undefined) return {};
  const audience = fromEnv("WRIT_SIGNING_AUDIENCE", Audience.optional(), undefined);
  return audience === undefined ? { signer } : { signer, audience };
}
