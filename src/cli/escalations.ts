// `writ escalations list|resolve`: the cases on writ.human, and a person's decision on one.
import { createWritClient } from "../../producers/writ-client.ts";
import { canonicalJson } from "../canonical-json.ts";
import { WireCodec } from "../codec.ts";
import { jsonLine, printable } from "../printable.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { clientSettingsFromEnv, brokersFrom, commandLogger, connectionFor, jsonPatchFlag, kafkaFor, msFlag, parseCommandArgs, registryFrom, replyPrefixFromEnv, runCommand, signingFromFlags, topicFromEnv, UsageError, type Command } from "./common.ts";
import { decodeRecord } from "./tail.ts";
import { latestLedgerEntries } from "./ledger-lookup.ts";
import { readWholeTopic, topicsWithPrefix } from "./topic-reader.ts";

const USAGE = `usage: writ escalations list [--open [--ledger-topic <topic>]] [--json] [--brokers <list>] [--registry <url>]
       writ escalations resolve <escalation id> --apply|--discard|--return [--message <text>] [--base-version <etag>]
                                [--delta <json patch> | --delta-file <file|->] [--operator <id>] [--reply-topic <topic>]
                                [--signing-key <pem file> --key-id <id> [--audience <a>]] [--timeout-ms <ms>]

list      every escalation on writ.human ($WRIT_HUMAN_TOPIC): reason, entity, tool, intent key, message,
          escalation id and age, oldest first. Reads committed records from the beginning of the topic to
          the end it had when the command started; control records are skipped, records that do not decode
          are reported on stderr. A case stays on the topic once decided: --open shows only the ones a
          decision can still be given on, by the owners' ledger ($WRIT_LEDGER_TOPIC, or --ledger-topic; read
          from its start to its end, so slower on a large ledger): the intent's entry escalated under that
          escalation id. --json then adds "open": true. Only what the table shows of each case is held
          (with --json, each case whole, to print them oldest first).
resolve   a person's decision on one escalation, carried out by the record's owner: --apply writes the
          escalated intent on the record as it is at --base-version (default: the version the escalation
          showed; a record that changed since is a conflict, nothing written), --discard writes nothing,
          --return hands it back to the agent; --message goes to the agent. The agent gets the outcome on
          its reply topic; the ledger keeps it. Prints the owner's answer as JSON. An escalation id that two
          records on writ.human carry with different contents (intent, record shown, reason, message: one
          is forged) is refused (exit 1), nothing sent.
          The change --apply writes is the tool's delta function's on the record as it is now (or the
          intent's own delta when it only appends). A tool without a delta function cannot rebuild it:
          give the change with --delta '<json patch>' (RFC 6902, an array of operations, e.g.
          '[{"op":"replace","path":"/tags","value":["vip"]}]') or --delta-file <file|-> (- for stdin);
          without it the owner refuses, resolution_delta_required. For a tool with a delta function a
          --delta must be the one it derives. The change is written only within the tool's allowedPaths
          and the operations allowed there, as an agent's delta: beyond them the owner refuses,
          patch_path_not_allowed / patch_op_not_allowed, nothing written.
          The operator (--operator, default writ-operator) must be allowed "writ.resolve" where owners run
          with an agent registry, and sign with its key (--signing-key, --key-id), for the owners' audience
          (--audience, default $WRIT_SIGNING_AUDIENCE, where they set one). --timeout-ms: how long
          to wait for the owner's answer (default 30000 ms; --timeout, its earlier name, is still taken).

  --json              one JSON object per escalation per line (the Escalation, plus topic, partition, offset)
  --brokers <list>    Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>    Confluent-API schema registry to decode framed values (default $SCHEMA_REGISTRY_URL)
  -h, --help          this text

Exit status: list: 0 listed (also when there are none); resolve: 0 carried out, 1 refused, contested or no answer
(the message says why); 2 bad usage, unknown escalation id, or could not run.`;

/** "3 s", "5 min", "2 h", "4 d". */
export function age(fromIso: string, now = Date.now()): string {
  const s = Math.max(0, Math.round((now - Date.parse(fromIso)) / 1000));
  if (s < 120) return `${s} s`;
  if (s < 7200) return `${Math.round(s / 60)} min`;
  if (s < 172_800) return `${Math.round(s / 3600)} h`;
  return `${Math.round(s / 86_400)} d`;
}

export function table(rows: string[][]): string {
  // A fold, not Math.max(...rows): spreading a large backlog's rows overflows the call stack.
  // Cells come from the records: escaped before they are measured, so the columns line up and no cell acts on the terminal.
  rows = rows.map((r) => r.map(printable));
  const widths = rows[0]!.map((_, i) => rows.reduce((w, r) => Math.max(w, r[i]!.length), 0));
  return rows.map((r) => r.map((c, i) => (i === r.length - 1 ? c : c.padEnd(widths[i]!))).join("  ").trimEnd()).join("\n");
}

const LIST_OPTIONS = { json: { type: "boolean" }, open: { type: "boolean" }, "ledger-topic": { type: "string" }, brokers: { type: "string" }, registry: { type: "string" } } as const;

async function list(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, LIST_OPTIONS, USAGE);
  if (parsed === undefined) return 0;
  const a = parsed.values;
  const brokers = brokersFrom(a.brokers);
  const log = commandLogger("escalations");
  const kafka = kafkaFor(brokers, "writ-cli-escalations", log);
  const codec = new WireCodec(connectionFor(registryFrom(a.registry)));
  const topic = topicFromEnv("WRIT_HUMAN_TOPIC");
  if (!(await topicsWithPrefix(kafka, topic)).includes(topic)) {
    process.stderr.write(`writ escalations: no topic ${topic} on the cluster (writ topics ensure creates it)\n`);
    return 2;
  }
  if (a["ledger-topic"] !== undefined && !a.open) throw new UsageError("--ledger-topic goes with --open");
  // The table's cells only (a large backlog of escalations showing large records is not held whole); --json prints them whole.
  let found = await readEscalations(kafka, codec, topic, log, (e) => (a.json ? e : shown(e)));
  if (a.open) {
    const ledgerTopic = a["ledger-topic"] ?? topicFromEnv("WRIT_LEDGER_TOPIC");
    const { entries, unfinished } = await latestLedgerEntries(kafka, codec, ledgerTopic, new Set(found.map((f) => f.e.intent.intentKey)), log);
    if (unfinished.length > 0) {
      process.stderr.write(`writ escalations: could not read ${ledgerTopic} to its end (${unfinished.join(", ")}): which cases are open is not known\n`);
      return 2;
    }
    found = found.filter((f) => isOpen(f.e, entries.get(f.e.intent.intentKey) ?? null));
  }
  if (a.json) {
    for (const f of found) process.stdout.write(`${jsonLine({ ...f.e, topic: f.topic, partition: f.partition, offset: f.offset, ...(a.open ? { open: true } : {}) })}\n`);
    return 0;
  }
  if (found.length === 0) {
    process.stdout.write(`no ${a.open ? "open " : ""}escalations on ${topic}\n`);
    return 0;
  }
  const rows = [["REASON", "ENTITY", "TOOL", "INTENT KEY", "ESCALATION ID", "AGE", "MESSAGE"]];
  for (const { e } of found) {
    // A write that may already have happened says so first: the operator checks the record before deciding.
    const written = e.mayHaveWritten === true || e.reason === "outcome_unknown" ? "[may have written] " : "";
    rows.push([e.reason, `${e.intent.entity.type}:${e.intent.entity.id}`, e.intent.tool, e.intent.intentKey, e.escalationId, age(e.at), `${written}${e.message.replace(/\s+/g, " ")}`]);
  }
  process.stdout.write(`${table(rows)}\n${found.length} ${a.open ? "open " : ""}escalation${found.length === 1 ? "" : "s"} on ${topic}\n`);
  return 0;
}

/**
 * Whether an owner would still take a decision on `e`: the intent's latest ledger entry is done with an escalated
 * outcome of this escalation id (architecture §8). Decided, re-submitted and escalated again, settled, or past the
 * ledger's retention: not open.
 */
export function isOpen(e: Pick<Escalation, "escalationId">, entry: LedgerIntentEntry | null): boolean {
  return entry !== null && entry.status === "done" && entry.outcome?.status === "escalated" && entry.outcome.escalationId === e.escalationId;
}

/** What the table shows of an escalation, and what --open checks. */
type Shown = Pick<Escalation, "escalationId" | "reason" | "message" | "at" | "mayHaveWritten"> & { intent: Pick<Escalation["intent"], "intentKey" | "tool" | "entity"> };

function shown(e: Escalation): Shown {
  const { intentKey, tool, entity } = e.intent;
  return { escalationId: e.escalationId, reason: e.reason, message: e.message, at: e.at, mayHaveWritten: e.mayHaveWritten, intent: { intentKey, tool, entity: { type: entity.type, id: entity.id } } };
}

/**
 * What `keep` takes of each escalation on `topic` (none where it answers undefined), oldest first, read to the end
 * the topic had when asked. Only that is held: a topic's escalations carry records of up to a megabyte each.
 */
async function readEscalations<T extends Pick<Escalation, "at">>(
  kafka: ReturnType<typeof kafkaFor>,
  codec: WireCodec,
  topic: string,
  log: ReturnType<typeof commandLogger>,
  keep: (e: Escalation) => T | undefined,
) {
  const found: { e: T; topic: string; partition: number; offset: string }[] = [];
  const { unfinished } = await readWholeTopic(kafka, topic, log, async (r) => {
    const d = await decodeRecord(codec, "Escalation", r);
    if (d.tombstone) return;
    if (d.error !== undefined) {
      log.warn({ offset: d.offset }, `${topic}[${d.partition}]@${d.offset} skipped: ${d.error}`);
      return;
    }
    const kept = keep(d.value as Escalation);
    if (kept !== undefined) found.push({ e: kept, topic: d.topic, partition: d.partition, offset: d.offset });
  });
  if (unfinished.length > 0) log.warn({ partitions: unfinished }, `stopped before the end of ${unfinished.join(", ")}: nothing arrived for 15 s`);
  found.sort((x, y) => Date.parse(x.e.at) - Date.parse(y.e.at));
  return found;
}

/**
 * What a decision is taken on: two records of one escalation id that differ here are not the same case. All but the
 * time: beside the intent, the record it showed gives --apply its default base version (a forged copy showing the
 * record's latest version would have a change made since written over), and the rest is what the operator read.
 */
function caseOf(e: Escalation): string {
  const { at: _at, ...decided } = e;
  try {
    return canonicalJson(decided);
  } catch {
    return JSON.stringify(decided);
  }
}

function where(f: { topic: string; partition: number; offset: string }): string {
  return `${f.topic}[${f.partition}]@${f.offset}`;
}

const RESOLVE_OPTIONS = {
  apply: { type: "boolean" },
  discard: { type: "boolean" },
  return: { type: "boolean" },
  message: { type: "string" },
  "base-version": { type: "string" },
  delta: { type: "string" },
  "delta-file": { type: "string" },
  operator: { type: "string" },
  "reply-topic": { type: "string" },
  "signing-key": { type: "string" },
  "key-id": { type: "string" },
  audience: { type: "string" },
  "timeout-ms": { type: "string" },
  timeout: { type: "string" },
  brokers: { type: "string" },
  registry: { type: "string" },
} as const;

async function resolve(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, RESOLVE_OPTIONS, USAGE, true);
  if (parsed === undefined) return 0;
  const a = parsed.values;
  const [escalationId, ...extra] = parsed.positionals;
  if (escalationId === undefined || extra.length > 0) throw new UsageError("resolve takes one escalation id");
  const decisions = (["apply", "discard", "return"] as const).filter((d) => a[d] === true);
  if (decisions.length !== 1) throw new UsageError("give exactly one of --apply, --discard, --return");
  const signing = signingFromFlags(a);
  if (!a.apply && (a.delta !== undefined || a["delta-file"] !== undefined)) throw new UsageError(`--${a.delta !== undefined ? "delta" : "delta-file"} goes with --apply`);
  const delta = jsonPatchFlag("delta", a.delta, a["delta-file"]);
  if (a["timeout-ms"] !== undefined && a.timeout !== undefined) throw new UsageError("give --timeout-ms (or --timeout, its earlier name), not both");
  const timeoutMs = a.timeout !== undefined ? msFlag("timeout", a.timeout, 30_000, 1) : msFlag("timeout-ms", a["timeout-ms"], 30_000, 1);
  const brokers = brokersFrom(a.brokers);
  const connection = connectionFor(registryFrom(a.registry));
  const log = commandLogger("escalations");
  const kafka = kafkaFor(brokers, "writ-cli-escalations", log, connection.kafka);
  const codec = new WireCodec(connection);
  const topic = topicFromEnv("WRIT_HUMAN_TOPIC");
  const records = await readEscalations(kafka, codec, topic, log, (e) => (e.escalationId === escalationId ? e : undefined));
  const found = records[0];
  if (!found) throw new UsageError(`no escalation ${escalationId} on ${topic}`);
  // Anyone who may produce to writ.human can write a record under a real escalation id: with two that differ, which
  // one the owner escalated is not known here (its ledger tells, and refuses the other), so none is sent.
  const other = records.find((f) => caseOf(f.e) !== caseOf(found.e));
  if (other) {
    process.stderr.write(
      `writ escalations: escalation ${printable(escalationId)} is contested: ${where(found)} and ${where(other)} differ under it (one is forged); nothing was sent\n`,
    );
    return 1;
  }
  const operator = a.operator ?? "writ-operator";
  const client = await createWritClient({
    brokers,
    agentId: operator,
    replyTopic: a["reply-topic"] ?? `${replyPrefixFromEnv()}${operator}`,
    intentsTopic: topicFromEnv("WRIT_INTENTS_TOPIC"),
    ...clientSettingsFromEnv(),
    ...connection,
    logger: log,
    ...signing,
  });
  try {
    const reply = await client.resolve(
      found.e,
      {
        decision: decisions[0]!,
        ...(a.message ? { message: a.message } : {}),
        ...(a["base-version"] ? { baseVersion: a["base-version"] } : {}),
        ...(delta !== undefined ? { delta } : {}),
      },
      { timeoutMs },
    );
    process.stdout.write(`${jsonLine(reply)}\n`);
    return reply.status === "applied" || (reply.status === "rejected" && (reply.reason === "escalation_discarded" || reply.reason === "returned_by_operator")) ? 0 : 1;
  } finally {
    await client.close();
  }
}

async function main(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === undefined || sub === "-h" || sub === "--help") {
    if (sub === undefined) throw new UsageError("which? list or resolve");
    process.stdout.write(`${USAGE}\n`);
    return 0;
  }
  if (sub === "list") return list(rest);
  if (sub === "resolve") return resolve(rest);
  throw new UsageError(`unknown subcommand ${sub}; list or resolve`);
}

export const escalationsCommand: Command = {
  usage: USAGE,
  options: { ...LIST_OPTIONS, ...RESOLVE_OPTIONS },
  main: (argv) => runCommand("escalations", USAGE, () => main(argv)),
};
