// `writ tail`: prints the records of one of writ's topics, decoded (plain JSON
// or the Confluent wire format, as WireCodec reads them), skipping control
// records; follows the topic with --follow.
import { RECORD_MAX_DEPTH, WireCodec } from "../codec.ts";
import { unreadableBatchOf } from "../kafka/unreadable-batches.ts";
import { jsonLine, printable } from "../printable.ts";
import type { WireSchemaName } from "../schemas/index.ts";
import { brokersFrom, commandLogger, connectionFor, intFlag, kafkaFor, parseCommandArgs, registryFrom, replyPrefixFromEnv, runCommand, topicFromEnv, UsageError, type Command } from "./common.ts";
import { onStopSignals } from "./signals.ts";
import { readTopics, topicsWithPrefix, type TopicRecord } from "./topic-reader.ts";

const KINDS = {
  replies: { schema: "Reply", configured: replyPrefixFromEnv },
  human: { schema: "Escalation", configured: () => topicFromEnv("WRIT_HUMAN_TOPIC") },
  dlq: { schema: "DeadLetter", configured: () => topicFromEnv("WRIT_DLQ_TOPIC") },
  ledger: { schema: "LedgerEntry", configured: () => topicFromEnv("WRIT_LEDGER_TOPIC") },
} as const satisfies Record<string, { schema: WireSchemaName; configured: () => string }>;
type Kind = keyof typeof KINDS;

const USAGE = `usage: writ tail replies|human|dlq|ledger [--topic <topic>] [--from-beginning] [--follow] [--json]

Prints the records of a writ topic, one per line, decoded (plain JSON or the Confluent wire format) and
validated against its schema; control records (header writ-control) are skipped, values that do not decode
are shown with the reason. Reads committed records only (read_committed), as writ's clients do.

  replies               every reply topic (prefix $WRIT_REPLY_TOPIC_PREFIX or writ.replies.), or --topic
  human                 escalations ($WRIT_HUMAN_TOPIC or writ.human)
  dlq                   dead letters ($WRIT_DLQ_TOPIC or writ.dlq)
  ledger                ledger entries ($WRIT_LEDGER_TOPIC or writ.ledger); tombstones are shown as such

  --topic <topic>       read this topic instead (repeatable)
  --from-beginning      start at the earliest offset of each partition (default: the last --lines offsets)
  -n, --lines <n>       without --from-beginning, start this many offsets before each partition's end
                        (default 10; transaction markers take offsets too)
  -f, --follow          keep printing new records until interrupted (default: stop at the end the topic
                        had when the command started)
  --json                one JSON object per line: topic, partition, offset, timestamp, key, value
                        (decoded), framed, or error
  --brokers <list>      Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>      Confluent-API schema registry to decode framed values (default $SCHEMA_REGISTRY_URL)
  -h, --help            this text

Exit status: 0 done (or interrupted while following), 2 bad usage or could not run; a second SIGINT or SIGTERM
while it stops, 1 s or more after the first (one sooner is the same request), ends it at once (130, 143).`;

export interface DecodedRecord {
  topic: string;
  partition: number;
  offset: string;
  timestamp: string;
  key: string | null;
  value?: unknown;
  framed?: boolean;
  tombstone?: true;
  error?: string;
}

/**
 * A record's timestamp (ms since the epoch, as the producer set it: any int64) as ISO 8601, or the
 * number as given where no Date can hold it (beyond ±8.64e15 ms), which would make toISOString throw.
 */
export function isoTimestamp(ms: string): string {
  const n = Number(ms);
  return Number.isFinite(n) && Math.abs(n) <= 8.64e15 ? new Date(n).toISOString() : ms;
}

/** Decodes a record of `schema`; never throws for bad bytes (an unreachable registry does). */
export async function decodeRecord(codec: WireCodec, schema: WireSchemaName, r: TopicRecord): Promise<DecodedRecord> {
  const base = { topic: r.topic, partition: r.partition, offset: r.offset, timestamp: isoTimestamp(r.timestamp), key: r.key?.toString("utf8") ?? null };
  if (r.value === null) {
    // The stand-in for a record batch that could not be read (src/kafka/unreadable-batches.ts): records skipped, not a tombstone.
    const unreadable = unreadableBatchOf(r.headers);
    if (unreadable !== null) return { ...base, error: `unreadable_batch: the record batch of offsets ${unreadable.firstOffset}-${unreadable.lastOffset} could not be read (${unreadable.reason}); its records are skipped` };
    return { ...base, tombstone: true };
  }
  if (!codec.framed && r.value.length > 5 && r.value[0] === 0) {
    return { ...base, error: `framed in the Confluent wire format (schema id ${r.value.readInt32BE(1)}): give --registry <url> (or set SCHEMA_REGISTRY_URL) to decode it` };
  }
  const decoded = await codec.decode(schema, r.value, { maxDepth: RECORD_MAX_DEPTH });
  if (!decoded.ok) return { ...base, error: `${decoded.reason}: ${decoded.message}` };
  return { ...base, value: decoded.value, framed: decoded.framed };
}

const short = (key: unknown) => (typeof key === "string" && key.length > 16 ? `${key.slice(0, 12)}…` : String(key));
const ent = (e: unknown) => (e && typeof e === "object" ? `${(e as { type?: string }).type}:${(e as { id?: string }).id}` : "?");

/** One readable line per record; every value in it comes from the record, so the line is made printable whole. */
export function formatRecord(schema: WireSchemaName, d: DecodedRecord): string {
  return printable(describeRecord(schema, d));
}

function describeRecord(schema: WireSchemaName, d: DecodedRecord): string {
  const where = `${d.timestamp} ${d.topic}[${d.partition}]@${d.offset}`;
  if (d.tombstone) return `${where} tombstone key=${short(d.key)}`;
  if (d.error !== undefined) return `${where} undecodable (${d.error}) key=${d.key ?? "null"}`;
  const v = d.value as Record<string, any>;
  switch (schema) {
    case "Reply": {
      const head = `${where} ${v.status} ${v.entity ? ent(v.entity) : ""} intent=${v.intentId} key=${short(v.intentKey)}${v.duplicate ? " duplicate" : ""}`;
      if (v.status === "applied") return `${head} version=${v.version} via=${v.via}`;
      if (v.status === "conflict") return `${head} cycle=${v.cycle} current=${v.current?.version} ${JSON.stringify(v.message)}`;
      if (v.status === "rejected") return `${head} reason=${v.reason} ${JSON.stringify(v.message)}`;
      return `${head} reason=${v.reason} escalation=${v.escalationId} ${JSON.stringify(v.message)}`;
    }
    case "Escalation":
      return `${where} ${v.reason} ${ent(v.intent?.entity)} tool=${v.intent?.tool} key=${short(v.intent?.intentKey)} escalation=${v.escalationId} cycles=${v.cycles} ${JSON.stringify(v.message)}`;
    case "DeadLetter":
      return `${where} ${v.reason} from ${v.source?.topic}[${v.source?.partition}]@${v.source?.offset} key=${v.key ?? "null"} ${v.originalBytes} bytes${v.truncated ? " (truncated)" : ""} ${JSON.stringify(v.message)}`;
    case "LedgerEntry":
      if (v.kind === "marker") return `${where} marker partition=${v.partition} owner=${v.owner}`;
      if (v.kind === "progress") return `${where} progress partition=${v.partition} offset=${v.offset}`;
      if (v.kind === "lease") {
        // A released (or lapsed) lease stays as marks of the acquires it refuses as replays (lease_replayed) until they are past.
        const held = v.releasedAt === undefined ? `expires=${v.expiresAt}` : `released=${v.releasedAt} replay-marks=${v.released?.length ?? 0}`;
        return `${where} lease ${ent(v.entity)} change=${short(v.change)} agent=${v.agentId} ${held}`;
      }
      // A refusal remembered for the signed bytes it refused (src/owner/refusals.ts): its key is their digest.
      if (typeof v.refusedIntentKey === "string") return `${where} refused ${v.outcome?.reason} ${ent(v.entity)} tool=${v.tool} key=${short(v.refusedIntentKey)} intent=${v.intentId}`;
      return `${where} ${v.status}${v.outcome ? ` ${v.outcome.status}` : ""} ${ent(v.entity)} tool=${v.tool} key=${short(v.intentKey)} cycles=${v.cycles} attempts=${v.attempts?.length}`;
    default:
      return `${where} ${JSON.stringify(v)}`;
  }
}

const OPTIONS = {
  topic: { type: "string", multiple: true },
  "from-beginning": { type: "boolean" },
  lines: { type: "string", short: "n" },
  follow: { type: "boolean", short: "f" },
  json: { type: "boolean" },
  brokers: { type: "string" },
  registry: { type: "string" },
} as const;

async function main(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, OPTIONS, USAGE, true);
  if (parsed === undefined) return 0;
  const [kindArg, ...extra] = parsed.positionals;
  if (kindArg === undefined) throw new UsageError("which topic? replies, human, dlq or ledger");
  if (!Object.hasOwn(KINDS, kindArg)) throw new UsageError(`unknown topic kind ${kindArg}; one of ${Object.keys(KINDS).join(", ")}`);
  if (extra.length > 0) throw new UsageError(`unexpected argument ${extra[0]}`);
  const kind = KINDS[kindArg as Kind];
  const a = parsed.values;
  const lines = intFlag("lines", a.lines, 10);
  const brokers = brokersFrom(a.brokers);
  const log = commandLogger("tail");
  const kafka = kafkaFor(brokers, "writ-cli-tail", log);
  const codec = new WireCodec(connectionFor(registryFrom(a.registry)));

  const configured = kind.configured();
  let topics: string[];
  if (a.topic !== undefined) topics = a.topic;
  else if (kindArg === "replies") {
    topics = await topicsWithPrefix(kafka, configured);
    if (topics.length === 0) throw new UsageError(`no reply topics (prefix ${configured}) on the cluster; name one with --topic`);
  } else topics = [configured];
  const existing = new Set(await topicsWithPrefix(kafka, ""));
  const absent = topics.filter((t) => !existing.has(t));
  if (absent.length > 0) {
    process.stderr.write(`writ tail: no topic ${absent.join(", ")} on the cluster (writ topics ensure creates the contract topics)\n`);
    return 2;
  }

  // The first SIGINT or SIGTERM ends the read (exit 0); a second, of either kind, 1 s or more later, ends the process at once.
  const controller = new AbortController();
  const signals = onStopSignals(() => controller.abort());
  try {
    const { unfinished } = await readTopics({
      kafka,
      topics,
      start: a["from-beginning"] ? { from: "beginning" } : { from: "end", last: lines },
      follow: a.follow === true,
      signal: controller.signal,
      log,
      onRecord: async (r) => {
        const d = await decodeRecord(codec, kind.schema, r);
        process.stdout.write(`${a.json ? jsonLine(d) : formatRecord(kind.schema, d)}\n`);
      },
    });
    if (unfinished.length > 0) log.warn({ partitions: unfinished }, `stopped before the end of ${unfinished.join(", ")}: nothing arrived for 15 s`);
  } finally {
    signals.dispose();
  }
  return 0;
}

export const tailCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main: (argv) => runCommand("tail", USAGE, () => main(argv)),
};
