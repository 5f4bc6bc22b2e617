// `writ undo <intentKey>`: submits the undo of an applied write once, waits
// for the owner's reply and prints it as one JSON line. Exit 0 applied (the
// write is undone), 1 any other outcome, 2 bad usage or could not run.
import { buildUndoIntent } from "../../producers/writ-client.ts";
import { WireCodec } from "../codec.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { brokersFrom, commandLogger, connectionFor, kafkaFor, msFlag, parseCommandArgs, registryFrom, replyPrefixFromEnv, runCommand, signingFromFlags, topicFromEnv, UsageError, type Command } from "./common.ts";
import { send, SEND_OPTIONS } from "./submit.ts";
import { latestLedgerEntries } from "./ledger-lookup.ts";

const USAGE = `usage: writ undo <intentKey> [--entity <type:id> --tool <name>] [options]

Submits the undo of an applied write, once: the compensating change its tool declares (a reversal for a
refund, the tag removed again), which the record's owner applies only on the version the write produced.
Prints the owner's reply as one JSON line: "applied" (undone), "conflict" (the record changed since the
write; nothing was undone; "current" shows it), or "rejected" with a reason (undo_target_unknown,
undo_target_not_applied, undo_target_mismatch, undo_not_declared, undo_failed). Running it again is safe:
the undo's intent key is derived from the undone key, so a repeat is answered from the ledger.

The write to undo:
  <intentKey>            the intent key of the applied write (in its reply, or writ tail ledger)
  --entity <type:id>     its record, and
  --tool <name>          its tool: with both, nothing is looked up; otherwise both are read from the
                         intent's entry in the ledger topic (read from its start: give them on a large one)
  --ledger-topic <t>     default $WRIT_LEDGER_TOPIC or writ.ledger

Where it goes:
  --agent <id>           the agent id (default writ-cli)
  --reply-topic <topic>  the reply topic (default $WRIT_REPLY_TOPIC_PREFIX<agent>, i.e. writ.replies.<agent>)
  --run-id <id>          carried for correlation only (default writ-cli-undo); not part of the undo's key
  --brokers <list>       Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>       Confluent-API schema registry (default $SCHEMA_REGISTRY_URL; unset = plain JSON)
  --intents-topic <t>    default $WRIT_INTENTS_TOPIC or writ.intents
  --timeout-ms <n>       how long to wait for the reply (default 30000)
  --signing-key <file>   sign the undo with this Ed25519 private key (PEM), with --key-id <id>
  --audience <a>         the deployment it is signed for (default $WRIT_SIGNING_AUDIENCE when signing)
  -h, --help             this text

SASL/TLS to Kafka and the registry's basic auth and TLS come from the environment, as for writ submit.

Exit status: 0 applied, 1 rejected, escalated, conflict, unknown or blocked, 2 bad usage or could not run.`;

const OPTIONS = {
  entity: { type: "string" },
  tool: { type: "string" },
  "ledger-topic": { type: "string" },
  "run-id": { type: "string" },
  ...SEND_OPTIONS,
} as const;

async function main(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, OPTIONS, USAGE, true);
  if (parsed === undefined) return 0;
  const [key, ...extra] = parsed.positionals;
  if (key === undefined) throw new UsageError("which write? give its intent key");
  if (extra.length > 0) throw new UsageError(`unexpected argument ${extra[0]}`);
  if (!/^[0-9a-f]{64}$/.test(key)) throw new UsageError(`${key.slice(0, 80)} is not an intent key (64 lower-case hex characters)`);
  const a = parsed.values;
  if ((a.entity === undefined) !== (a.tool === undefined)) throw new UsageError("--entity and --tool go together (without both, they are read from the ledger)");
  const signing = signingFromFlags(a);
  const brokers = brokersFrom(a.brokers);
  const registry = registryFrom(a.registry);
  const timeoutMs = msFlag("timeout-ms", a["timeout-ms"], 30_000, 1);

  let undone: { intentKey: string; entity: { type: string; id: string }; tool: string };
  if (a.entity !== undefined && a.tool !== undefined) {
    const at = a.entity.indexOf(":");
    if (at <= 0 || at === a.entity.length - 1) throw new UsageError(`--entity: ${a.entity} is not type:id (e.g. ticket:T-42)`);
    undone = { intentKey: key, entity: { type: a.entity.slice(0, at), id: a.entity.slice(at + 1) }, tool: a.tool };
  } else {
    const topic = a["ledger-topic"] ?? topicFromEnv("WRIT_LEDGER_TOPIC");
    const entry = await findInLedger(brokers, registry, topic, key);
    if (entry === null) {
      process.stderr.write(`writ undo: intent key ${key} is not in ${topic} (never submitted, or past the ledger's retention); nothing was sent\n`);
      return 2;
    }
    undone = { intentKey: key, entity: { type: entry.entity.type, id: entry.entity.id }, tool: entry.tool };
  }
  const agent = a.agent ?? "writ-cli";
  const replyTopic = a["reply-topic"] ?? `${replyPrefixFromEnv()}${agent}`;
  const intent = buildUndoIntent({ undone, agentId: agent, runId: a["run-id"] ?? "writ-cli-undo", stepId: `undo-${key.slice(0, 16)}`, replyTo: replyTopic });
  return send(agent, replyTopic, intent, { brokers, registry, timeoutMs, intentsTopic: a["intents-topic"], ...signing });
}

/** The intent's latest entry in the ledger topic; null when it is not there or its last record is a tombstone. */
async function findInLedger(brokers: string[], registry: string | undefined, topic: string, key: string): Promise<LedgerIntentEntry | null> {
  const log = commandLogger("undo");
  const { entries, unfinished } = await latestLedgerEntries(kafkaFor(brokers, "writ-cli-undo", log), new WireCodec(connectionFor(registry)), topic, new Set([key]), log);
  if (unfinished.length > 0) throw new Error(`could not read ${topic} to its end (${unfinished.join(", ")}); give --entity and --tool instead`);
  return entries.get(key) ?? null;
}

export const undoCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main: (argv) => runCommand("undo", USAGE, () => main(argv)),
};
