// `writ submit`: sends one write intent, waits for the owner's reply and
// prints it as one JSON line. Exit 0 applied, 1 any other outcome, 2 bad usage
// or could not run.
import { readFileSync } from "node:fs";
import { createWritClient, type IntentInput, type SubmitResult } from "../../producers/writ-client.ts";
import { didYouMean } from "../closest.ts";
import type { KeyScope, KeyedTool } from "../keys.ts";
import { jsonLine, printable } from "../printable.ts";
import type { IntentSigner } from "../security/signing.ts";
import { WriteIntent } from "../schemas/write-intent.ts";
import { clientSettingsFromEnv, brokersFrom, commandLogger, connectionFor, jsonFlag, jsonPatchOf, msFlag, parseCommandArgs, registryFrom, replyPrefixFromEnv, runCommand, signingFromFlags, topicFromEnv, UsageError, type Command } from "./common.ts";
import { loadToolsModule } from "./tools-module.ts";

const USAGE = `usage: writ submit --intent <file|-|json> [options]
       writ submit --tool <name> --entity <type:id> --base-version <etag> --delta '<json>' --run-id <id> --step-id <id> [options]

Sends one write intent to writ.intents, waits for the owner's reply on the agent's reply topic (created if
missing) and prints the reply as one JSON line on stdout. Never re-sends on its own: at the deadline it prints
{"status":"unknown",…} (or "blocked"); running the same command again asks the owner again, and is safe.

The intent:
  --intent <file|-|json> a JSON file (- for stdin), or the JSON itself when it starts with { (e.g.
                         --intent '{"tool":"tag_ticket",…}'; a file named so: ./{…}), with the fields below
                         in camelCase (tool, entity as {"type","id"} or "type:id", baseVersion, delta,
                         params, runId, stepId, toolCallId), or a whole WriteIntent (then sent as it is,
                         with --audience's added when it has none; one naming another is refused);
                         flags override its fields
  --tool <name>          the write tool
  --entity <type:id>     the record, e.g. ticket:T-42
  --base-version <etag>  the version the change was made against, quotes included, e.g. '"v1"'
  --delta '<json>'       the RFC 6902 JSON Patch, e.g. '[{"op":"add","path":"/tags/-","value":"vip"}]'
  --params '<json>'      the tool's params (default {})
  --run-id <id>          the run (conversation) id
  --step-id <id>         the step id, stable across retries
  --tool-call-id <id>    carried for correlation only

The intent key is built (as owners recompute it) from the tool's key scope and intent fields, taken from
  --tools <module>       a tools module exporting tools[] (default $WRIT_TOOLS_MODULE); its import may take
                         WRIT_TOOLS_IMPORT_TIMEOUT_MS (default 30000). Or from
  --key-scope run|global and --intent-fields <a,b> (names of params; empty for none)

Where it goes:
  --agent <id>           the agent id (default writ-cli)
  --reply-topic <topic>  the reply topic (default $WRIT_REPLY_TOPIC_PREFIX<agent>, i.e. writ.replies.<agent>)
  --brokers <list>       Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>       Confluent-API schema registry (default $SCHEMA_REGISTRY_URL; unset = plain JSON)
  --intents-topic <t>    default $WRIT_INTENTS_TOPIC or writ.intents
  --timeout-ms <n>       how long to wait for the reply (default 30000)
  --signing-key <file>   sign the intent with this Ed25519 private key (PEM), for owners with an agent
                         registry; with --key-id <id>, the key's id in the registry
  --audience <a>         the deployment the signed intent is for: the owners' WRIT_SIGNING_AUDIENCE
                         (default $WRIT_SIGNING_AUDIENCE when signing)
  -h, --help             this text

SASL/TLS to Kafka and the registry's basic auth and TLS come from the environment: KAFKA_SSL,
KAFKA_SSL_CA_FILE, KAFKA_SASL_MECHANISM, KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD(_FILE),
SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD(_FILE), SCHEMA_REGISTRY_CA_FILE (see the README).

Exit status: 0 applied, 1 rejected, escalated, conflict, unknown or blocked, 2 bad usage or could not run.`;

/** Where an intent goes and how the command waits: the options of every command that sends one (`send`). */
export const SEND_OPTIONS = {
  agent: { type: "string" },
  "reply-topic": { type: "string" },
  brokers: { type: "string" },
  registry: { type: "string" },
  "intents-topic": { type: "string" },
  "timeout-ms": { type: "string" },
  "signing-key": { type: "string" },
  "key-id": { type: "string" },
  audience: { type: "string" },
} as const;

const OPTIONS = {
  intent: { type: "string" },
  tool: { type: "string" },
  entity: { type: "string" },
  "base-version": { type: "string" },
  delta: { type: "string" },
  params: { type: "string" },
  "run-id": { type: "string" },
  "step-id": { type: "string" },
  "tool-call-id": { type: "string" },
  tools: { type: "string" },
  "key-scope": { type: "string" },
  "intent-fields": { type: "string" },
  ...SEND_OPTIONS,
} as const;

/** The fields an `--intent` file may give (a whole WriteIntent, with its intentId, is checked by its schema). */
const INTENT_FIELDS = ["tool", "entity", "baseVersion", "delta", "params", "runId", "stepId", "toolCallId"] as const;

type Fields = {
  tool?: string;
  entity?: { type: string; id: string };
  baseVersion?: string;
  delta?: unknown;
  params?: unknown;
  runId?: string;
  stepId?: string;
  toolCallId?: string;
};

function entityOf(raw: unknown, where: string): { type: string; id: string } {
  if (typeof raw === "string") {
    const at = raw.indexOf(":");
    if (at <= 0 || at === raw.length - 1) throw new UsageError(`${where}: ${raw} is not type:id (e.g. ticket:T-42)`);
    return { type: raw.slice(0, at), id: raw.slice(at + 1) };
  }
  if (raw !== null && typeof raw === "object" && typeof (raw as { type?: unknown }).type === "string" && typeof (raw as { id?: unknown }).id === "string") {
    return { type: (raw as { type: string }).type, id: (raw as { id: string }).id };
  }
  throw new UsageError(`${where}: the entity must be "type:id" or {"type","id"}`);
}

/** `--intent`'s value: a JSON object given inline (it starts with `{`), stdin (`-`), or a file's path. */
function readIntentFile(path: string): Record<string, unknown> {
  const inline = path.trimStart().startsWith("{");
  const where = inline ? "(inline JSON)" : path === "-" ? "(stdin)" : path;
  let text: string;
  if (inline) text = path;
  else {
    try {
      text = readFileSync(path === "-" ? 0 : path, "utf8");
    } catch (err) {
      throw new UsageError(`--intent ${path}: ${err instanceof Error ? err.message : String(err)}`);
    }
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch (err) {
    throw new UsageError(`--intent ${where} is not JSON: ${err instanceof Error ? err.message : String(err)}`);
  }
  if (parsed === null || typeof parsed !== "object" || Array.isArray(parsed)) throw new UsageError(`--intent ${where}: not a JSON object`);
  return parsed as Record<string, unknown>;
}

const str = (v: unknown, name: string): string | undefined => {
  if (v === undefined) return undefined;
  if (typeof v !== "string" || v === "") throw new UsageError(`${name} must be a non-empty string`);
  return v;
};

async function main(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, OPTIONS, USAGE);
  if (parsed === undefined) return 0;
  const a = parsed.values;
  const brokers = brokersFrom(a.brokers);
  const registry = registryFrom(a.registry);
  const timeoutMs = msFlag("timeout-ms", a["timeout-ms"], 30_000, 1);
  const signing = signingFromFlags(a);
  const file = a.intent === undefined ? {} : readIntentFile(a.intent);

  // A whole WriteIntent is sent as it is (flags may not change it: its key and ids are what make it a repeat), but for
  // the signing audience, which the client adds to one that names none.
  const whole = WriteIntent.safeParse(file);
  if (a.intent !== undefined && "intentId" in file) {
    if (!whole.success) throw new UsageError(`--intent: not a valid WriteIntent: ${whole.error.issues.slice(0, 3).map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`).join("; ")}`);
    const intent = whole.data;
    return send(intent.agent.id, intent.replyTo, intent, { brokers, registry, timeoutMs, intentsTopic: a["intents-topic"], ...signing });
  }

  // A misspelt field (baseVerison) would otherwise be dropped, and the intent refused for the field it was meant to be.
  const unknown = Object.keys(file).filter((k) => !(INTENT_FIELDS as readonly string[]).includes(k));
  if (unknown.length > 0) {
    const named = unknown.slice(0, 5).map((k) => `${printable(k.slice(0, 64))}${didYouMean(k, INTENT_FIELDS)}`);
    throw new UsageError(
      `--intent: unknown field${unknown.length > 1 ? "s" : ""} ${named.join(", ")}${unknown.length > 5 ? `, and ${unknown.length - 5} more` : ""}; an intent gives ${INTENT_FIELDS.join(", ")} (or is a whole WriteIntent, with its intentId)`,
    );
  }
  const f: Fields = {
    tool: str(a.tool ?? file.tool, "tool"),
    ...(a.entity !== undefined ? { entity: entityOf(a.entity, "--entity") } : file.entity !== undefined ? { entity: entityOf(file.entity, "--intent entity") } : {}),
    baseVersion: str(a["base-version"] ?? file.baseVersion, "baseVersion"),
    delta: a.delta !== undefined ? jsonFlag("delta", a.delta) : file.delta,
    params: a.params !== undefined ? jsonFlag("params", a.params) : (file.params ?? {}),
    runId: str(a["run-id"] ?? file.runId, "runId"),
    stepId: str(a["step-id"] ?? file.stepId, "stepId"),
    toolCallId: str(a["tool-call-id"] ?? file.toolCallId, "toolCallId"),
  };
  const missing = (
    [
      ["tool", "--tool"],
      ["entity", "--entity"],
      ["baseVersion", "--base-version"],
      ["delta", "--delta"],
      ["runId", "--run-id"],
      ["stepId", "--step-id"],
    ] as const
  ).filter(([k]) => f[k] === undefined);
  if (missing.length > 0) throw new UsageError(`missing ${missing.map(([, flag]) => flag).join(", ")} (or the same fields in --intent)`);
  const delta = jsonPatchOf("--delta", f.delta);
  if (f.params === null || typeof f.params !== "object" || Array.isArray(f.params)) throw new UsageError("--params must be a JSON object");

  const tool = await keyedTool(f.tool!, a);
  const input: IntentInput = {
    tool,
    entity: f.entity!,
    runId: f.runId!,
    stepId: f.stepId!,
    baseVersion: f.baseVersion!,
    delta,
    params: f.params as Record<string, unknown>,
    ...(f.toolCallId !== undefined ? { toolCallId: f.toolCallId } : {}),
  };
  for (const field of tool.intentFields) {
    if (!(field in input.params)) throw new UsageError(`intent field "${field}" of tool ${tool.name} is missing from --params`);
  }
  const agent = a.agent ?? "writ-cli";
  const replyTopic = a["reply-topic"] ?? `${replyPrefixFromEnv()}${agent}`;
  return send(agent, replyTopic, input, { brokers, registry, timeoutMs, intentsTopic: a["intents-topic"], ...signing });
}

/** The key-relevant part of the tool: from the tools module, else from --key-scope/--intent-fields. */
async function keyedTool(name: string, a: { tools?: string; "key-scope"?: string; "intent-fields"?: string }): Promise<KeyedTool> {
  const scopeFlag = a["key-scope"];
  const fieldsFlag = a["intent-fields"];
  if (scopeFlag !== undefined || fieldsFlag !== undefined) {
    if (scopeFlag !== "run" && scopeFlag !== "global") throw new UsageError(`--key-scope must be run or global${scopeFlag === undefined ? " (it goes with --intent-fields)" : `, got ${scopeFlag}`}`);
    if (fieldsFlag === undefined) throw new UsageError("--intent-fields is required with --key-scope (use --intent-fields '' for none)");
    const intentFields = fieldsFlag
      .split(",")
      .map((s) => s.trim())
      .filter((s) => s !== "");
    return { name, keyScope: scopeFlag as KeyScope, intentFields };
  }
  if (a.tools !== undefined || (process.env.WRIT_TOOLS_MODULE ?? "") !== "") {
    const { module, source } = await loadToolsModule(a.tools);
    const tool = module.tools.find((t) => t.name === name);
    if (tool === undefined) throw new UsageError(`tool ${name} is not in the tools module (${source}); it has ${module.tools.map((t) => t.name).join(", ") || "no tools"}`);
    return tool;
  }
  throw new UsageError("the intent key needs the tool's key scope and intent fields: give --tools <module> (or WRIT_TOOLS_MODULE), or --key-scope and --intent-fields");
}

/** Sends one intent with a client of `agentId` on `replyTopic`, prints the reply as one JSON line; the exit status. */
export async function send(
  agentId: string,
  replyTopic: string,
  intent: IntentInput | WriteIntent,
  opts: { brokers: string[]; registry: string | undefined; timeoutMs: number; intentsTopic: string | undefined; signer?: IntentSigner | undefined; audience?: string | undefined },
): Promise<number> {
  const log = commandLogger("submit");
  const client = await createWritClient({
    brokers: opts.brokers,
    agentId,
    replyTopic,
    intentsTopic: opts.intentsTopic ?? topicFromEnv("WRIT_INTENTS_TOPIC"),
    ...clientSettingsFromEnv(),
    clientId: `writ-cli-${agentId}`,
    // SASL/TLS and the registry's URL, basic auth and TLS, validated (from the environment and --registry)
    ...connectionFor(opts.registry),
    ...(opts.signer !== undefined ? { signer: opts.signer } : {}),
    ...(opts.audience !== undefined ? { audience: opts.audience } : {}),
    logger: log,
  });
  let result: SubmitResult;
  try {
    result = await client.submit(intent, { timeoutMs: opts.timeoutMs });
  } finally {
    await client.close();
  }
  process.stdout.write(`${jsonLine(result)}\n`);
  return result.status === "applied" ? 0 : 1;
}

export const submitCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main: (argv) => runCommand("submit", USAGE, () => main(argv)),
};
