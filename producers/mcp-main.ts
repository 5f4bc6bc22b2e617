// `npm run mcp -- --stdio` or `npm run mcp -- --http [--port N]`: writ's write
// tools as an MCP server for any MCP-speaking agent. It is the agent side only
// (a writ client); owners run separately (`npm run owner`). Configuration comes
// from the environment (README, "Agent frameworks: OpenAI Agents JS and MCP")
// and is validated before anything connects. Logs go to stderr: under --stdio,
// stdout carries MCP messages only.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { pathToFileURL } from "node:url";
import { z } from "zod";
import { exitWhenWritten } from "../src/cli/exit.ts";
import { onStopSignals, SIGNAL_EXIT_STATUS } from "../src/cli/signals.ts";
import { envNumber, maxIntentBytes, maxJsonDepth, parseConfig, replicationFactor, replyTopicPrefix, timerMs, topicName } from "../src/config.ts";
import { WritError } from "../src/errors.ts";
import { DEFAULT_HEADERS_TIMEOUT_MS } from "../src/listen.ts";
import { createLogger, type Logger } from "../src/logger.ts";
import { unknownWritVariables } from "../src/known-variables.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { MAX_RUN_ID_LENGTH } from "../src/schemas/write-intent.ts";
import { audienceOf, type SigningRefusals, signerOf } from "../src/security/key-file.ts";
import type { IntentSigner } from "../src/security/signing.ts";
import { SchemaRegistryUrl, connectionSecurityFromEnv } from "../src/security/transport.ts";
import type { RecordReader } from "../src/sor/record-reader.ts";
import { DEFAULT_MAX_MCP_SESSIONS, DEFAULT_MCP_SESSION_IDLE_MS, recordsReader, serveWritMcpStdio, startWritMcpHttpServer } from "./adapters/mcp-server.ts";
import type { WritToolSpec } from "./adapters/tool-bridge.ts";
import { MCP_ENV } from "./mcp-env.ts";
import { createWritClient, type WritClient } from "./writ-client.ts";

/** The MCP server process. Every default lives here. */
const McpMainConfig = z
  .object({
    brokers: z.string().min(1, "required, e.g. 127.0.0.1:19092 (npm run kafka:up)"),
    /** No credentials in it: SCHEMA_REGISTRY_USERNAME / SCHEMA_REGISTRY_PASSWORD (with KAFKA_SASL_* and the TLS variables: connectionSecurityFromEnv). */
    schemaRegistryUrl: SchemaRegistryUrl.optional(),
    intentsTopic: topicName.default("writ.intents"),
    /** Names this agent in intents; also names its reply topic. */
    agentId: z.string().regex(/^[a-zA-Z0-9._-]{1,200}$/).default("mcp-agent"),
    replyTopic: topicName.optional(),
    /** The owners' reply prefix, under their variable name: the default reply topic is it plus the agent id. */
    replyTopicPrefix: replyTopicPrefix.default("writ.replies."),
    /** Deadline of one submission. ms. */
    submitTimeoutMs: timerMs(1).default(30_000),
    /**
     * The owners' admission bounds, under the owners' variable names, so one environment serves both: the
     * client refuses what the owners would dead-letter without a reply (defaults: the owners' defaults).
     */
    maxIntentBytes: maxIntentBytes.optional(),
    maxJsonDepth: maxJsonDepth.optional(),
    /** Replication factor of the reply topic when the server creates it, under the owners' variable name. */
    replicationFactor: replicationFactor.optional(),
    /** Module exporting `specs` (WritToolSpec[]) and `readers(env)` (read-only RecordReaders). */
    specsModule: z.string().min(1).default(resolve(import.meta.dirname, "../examples/demo-tool-specs.ts")),
    /** stdio only: the run id of every call that names none in `_meta`. */
    runId: z.string().min(1).max(MAX_RUN_ID_LENGTH).optional(),
    /** --http only. */
    port: z.number().int().min(0).max(65535).default(39100),
    /** --http only, required there: the bearer token every request must carry. Never logged (the logger redacts `token`). */
    token: z.string().min(16, "at least 16 characters").optional(),
    /** --http only: open sessions at most (past it an initialize is refused 503), and how long an idle one lives. */
    maxSessions: z.number().int().positive().default(DEFAULT_MAX_MCP_SESSIONS),
    sessionIdleMs: z.number().int().positive().default(DEFAULT_MCP_SESSION_IDLE_MS),
    /** --http only: how long a connection may take to send a request's headers before it is closed. ms. */
    headersTimeoutMs: z.number().int().min(1).max(3_600_000).default(DEFAULT_HEADERS_TIMEOUT_MS),
    /**
     * The agent's Ed25519 private key (a PEM file) and its id in the owners' agent registry, together: every intent
     * the server sends is signed with it. Owners with `WRIT_AGENT_REGISTRY` refuse unsigned intents. Never logged.
     */
    signingKeyFile: z.string().min(1).optional(),
    keyId: z.string().min(1).optional(),
    /** The deployment the server signs for, under the owners' variable name; read and checked only when it signs. */
    signingAudience: z.string().optional(),
  })
  .strict();

/**
 * The signer of `WRIT_MCP_SIGNING_KEY_FILE` and `WRIT_MCP_KEY_ID`, with the audience it signs for, read and checked
 * before anything connects; an error names the variable and never quotes the file.
 */
function signingOf(config: { signingKeyFile?: string | undefined; keyId?: string | undefined; signingAudience?: string | undefined }): { signer?: IntentSigner; audience?: string } {
  const variable = { keyFile: ENV.signingKeyFile, keyId: ENV.keyId, audience: ENV.signingAudience } as const;
  const refuse = (name: string, message: string) => new WritError("config_invalid", `${name}: ${message}`, { retriable: false, context: { field: name } });
  const refusals: SigningRefusals = {
    pair: (missing) => refuse(variable[missing], `${ENV.signingKeyFile} and ${ENV.keyId} go together (the agent's signing key and its id in the owners' agent registry)`),
    refused: (input, detail) => refuse(variable[input], detail),
  };
  const signer = signerOf(config.signingKeyFile, config.keyId, refusals);
  if (signer === undefined) return {};
  if (config.signingAudience === undefined) return { signer };
  return { signer, audience: audienceOf(config.signingAudience, refusals) };
}

const ENV = MCP_ENV;

interface SpecsModule {
  specs: WritToolSpec<any>[];
  /** Read-only record readers, built from read-only configuration: the agent side holds no writing adapter. */
  readers: (env: NodeJS.ProcessEnv) => RecordReader[];
}

hideKafkajsTimeoutWarning();
let log: Logger;
// Lines logged just before the process ends itself, written at once.
let lastWords: Logger;
try {
  log = createLogger({ name: "writ-mcp" });
  lastWords = createLogger({ name: "writ-mcp", sync: true });
} catch (err) {
  // A bad LOG_LEVEL: no logger to say it with, so one line on stderr naming the variable.
  process.stderr.write(`writ-mcp: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
let client: WritClient | undefined;
let close: (() => Promise<void>) | undefined;

let stopping = false;
// SIGINT or SIGTERM: a clean stop, exit 0 once the server served, else (still starting) the signal's status, as
// killed by it; a second signal, of either kind, or one during a stop begun otherwise (stdin closed, the reply
// consumer gone), ends the process at once.
const signals = onStopSignals(
  (signal) => void stop(signal, close === undefined ? SIGNAL_EXIT_STATUS[signal] : 0),
  (signal) => lastWords.warn({ signal }, "second signal: exiting without a clean stop"),
  (signal) => log.debug({ signal }, "signal within 1 s of the first: the same stop request"),
);
async function stop(reason: string, code: number): Promise<void> {
  if (stopping) return;
  stopping = true;
  signals.stopping();
  log.info({ reason }, "stopping");
  await close?.().catch(() => undefined);
  await client?.close().catch(() => undefined);
  // Never below a status already set: a stop that met a failure stays a failure. The last answers on stdout (the
  // MCP client's) are written out first (src/cli/exit.ts).
  await exitWhenWritten(Math.max(code, Number(process.exitCode ?? 0)));
}

try {
  const { values: args } = parseArgs({
    options: { stdio: { type: "boolean" }, http: { type: "boolean" }, port: { type: "string" }, "run-id": { type: "string" } },
    strict: true,
  });
  if (args.stdio === args.http) {
    throw new WritError("config_invalid", "usage: npm run mcp -- --stdio [--run-id ID] | --http [--port N]", { retriable: false, context: { field: "argv" } });
  }
  // Before the configuration is checked, so a refusal of the pair it belongs to comes with its hint: a misspelt
  // variable (the key file's name without its _FILE, the key id's without its last _) is otherwise ignored in
  // silence. The names are all writ's: the owners' variables in a shared environment are not warned of.
  for (const unknown of unknownWritVariables(process.env)) log.warn({ variable: unknown.variable, suggestion: unknown.suggestion }, unknown.message);
  // Set but empty (a templating slip) is unset, as every variable here; for the signing key, said: the server would
  // not sign.
  for (const name of [ENV.signingKeyFile, ENV.keyId]) {
    if (process.env[name] === "") log.warn({ variable: name }, `${name} is set but empty, so not set: the server signs nothing unless both ${ENV.signingKeyFile} and ${ENV.keyId} are given`);
  }
  const input: Record<string, unknown> = {};
  // Numbers are decimal only (envNumber): Number() would take "  " as 0 and "0x50" as 80.
  const numeric = new Set(["submitTimeoutMs", "port", "maxSessions", "sessionIdleMs", "headersTimeoutMs", "maxIntentBytes", "maxJsonDepth", "replicationFactor"]);
  const value = (field: string, raw: string) => (numeric.has(field) ? envNumber(raw) : raw);
  for (const [field, name] of Object.entries(ENV)) if (process.env[name]) input[field] = value(field, process.env[name]);
  if (args.port !== undefined) input.port = value("port", args.port);
  if (args["run-id"] !== undefined) input.runId = args["run-id"];
  const config = parseConfig(McpMainConfig, input, "MCP server", (path) => {
    const field = String(path[0] ?? "");
    return field in ENV ? `${ENV[field as keyof typeof ENV]} (${field})` : field;
  });

  const signing = signingOf(config);
  // Said at start, before anything connects (the key id and audience, never the key). Unsigned where the owners'
  // audience is set (they then require signatures), every write would be dead-lettered unauthenticated, each call
  // answered only at its deadline: warned.
  const signs = signing.signer ? { keyId: signing.signer.keyId, audience: signing.audience ?? null } : false;
  log.info({ signs }, signs ? "signing intents" : "not signing intents: owners with an agent registry dead-letter them");
  if (!signs && config.signingAudience !== undefined) {
    log.warn(
      { variable: ENV.signingAudience },
      `${ENV.signingAudience} is set but the server has no signing key (${ENV.signingKeyFile}, ${ENV.keyId}): owners that check an audience require signatures and dead-letter every intent it sends as unauthenticated`,
    );
  }
  // --http's token, before anything connects (the client below creates the reply topic).
  if (args.http && config.token === undefined) {
    throw new WritError("config_invalid", "WRIT_MCP_TOKEN (token): --http needs a bearer token (at least 16 characters)", { retriable: false, context: { field: "WRIT_MCP_TOKEN" } });
  }

  const mod = (await import(pathToFileURL(resolve(config.specsModule)).href)) as Partial<SpecsModule>;
  if (!Array.isArray(mod.specs) || typeof mod.readers !== "function") {
    throw new WritError("config_invalid", `WRIT_TOOL_SPECS_MODULE (${config.specsModule}) must export specs[] and readers(env)`, {
      retriable: false,
      context: { field: "WRIT_TOOL_SPECS_MODULE" },
    });
  }
  // The record readers, checked against the tools before anything connects (a tool without one is config_invalid).
  const read = recordsReader(mod.specs, mod.readers(process.env));
  // SASL/TLS to Kafka and the registry's basic auth and TLS (KAFKA_SSL*, KAFKA_SASL_*, SCHEMA_REGISTRY_*), validated
  const connection = connectionSecurityFromEnv(process.env, config.schemaRegistryUrl);
  client = await createWritClient({
    ...Object.fromEntries(Object.entries(connection).filter(([, v]) => v !== undefined)),
    brokers: config.brokers,
    agentId: config.agentId,
    replyTopic: config.replyTopic ?? `${config.replyTopicPrefix}${config.agentId}`,
    replyTopicPrefix: config.replyTopicPrefix,
    intentsTopic: config.intentsTopic,
    submitTimeoutMs: config.submitTimeoutMs,
    ...(config.maxIntentBytes !== undefined ? { maxIntentBytes: config.maxIntentBytes } : {}),
    ...(config.maxJsonDepth !== undefined ? { maxJsonDepth: config.maxJsonDepth } : {}),
    ...(config.replicationFactor !== undefined ? { replicationFactor: config.replicationFactor } : {}),
    ...(config.schemaRegistryUrl ? { schemaRegistryUrl: config.schemaRegistryUrl } : {}),
    ...signing,
    logger: log,
    // No reply can be read any more, so every tool call would fail: exit (status 1) for the host or a supervisor
    // to start the server again, rather than serve failures.
    onStopped: (err) => {
      log.fatal({ err }, "the writ client's reply consumer stopped for good; exiting");
      void stop("reply consumer stopped", 1);
    },
  });
  const options = { client, tools: mod.specs, read, logger: log };
  if (args.stdio) {
    // The client gone (its end of our stdout closed) while an answer is written: the session is over, as when it
    // closes our stdin, and the stop is as clean; any other failure to write is one (exit 1). Without this, EPIPE
    // was an unhandled 'error' event: a stack trace and exit 1, the client's consumer left to its session timeout.
    process.stdout.on("error", (err: NodeJS.ErrnoException) => {
      if (err.code === "EPIPE") return void stop("stdout closed", 0);
      log.error({ err }, "writing to stdout failed; stopping");
      void stop("stdout failed", 1);
    });
    const stdio = await serveWritMcpStdio({ ...options, ...(config.runId ? { runId: config.runId } : {}) });
    close = stdio.close;
    log.info({ runId: stdio.runId, tools: mod.specs.map((s) => s.tool.name), signs }, "writ MCP server on stdio");
    // The client closing our stdin is the end of the session.
    process.stdin.once("end", () => void stop("stdin closed", 0));
  } else {
    // The token is checked at start, before anything connects.
    const http = await startWritMcpHttpServer({ ...options, port: config.port, token: config.token!, maxSessions: config.maxSessions, sessionIdleMs: config.sessionIdleMs, headersTimeoutMs: config.headersTimeoutMs });
    close = http.close;
    log.info({ url: http.url, tools: mod.specs.map((s) => s.tool.name), signs }, "writ MCP server on streamable HTTP (run id: the MCP session id)");
    process.stderr.write(`writ MCP server: ${http.url}\n`);
  }
} catch (err) {
  // The process ends with 1 now: a signal meanwhile starts no stop of its own (which would exit 0).
  process.exitCode = 1;
  stopping = true;
  log.fatal({ err }, err instanceof WritError ? err.message : "MCP server failed to start");
  await client?.close().catch(() => undefined);
  setTimeout(() => process.exit(1), 100).unref();
}
