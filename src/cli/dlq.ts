// `writ dlq redrive`: puts dead-lettered records back on the intents topic once their cause is fixed.
//
// A dead letter keeps the original record (key, value whole unless `truncated`, headers as text), so nothing
// is lost; what was missing is the way back. The redriven record goes through admission again like any other
// (signature, registry, reply topic, key), and its intent key makes it safe to send more than once: an intent
// the owner already took is answered from the ledger as a repeat, never written twice.
import type { IHeaders } from "kafkajs";
import { WireCodec } from "../codec.ts";
import { notRedrivable, originalsOf, redriveMessage, redriveProducer, valueRefusal } from "../dlq-redrive.ts";
import { DEAD_LETTER_REASONS } from "../errors.ts";
import { jsonLine, printable } from "../printable.ts";
import type { DeadLetter } from "../schemas/dead-letter.ts";
import { BATCH_OVERHEAD_BYTES, recordBytes } from "../owner/produce-limits.ts";
import { brokersFrom, commandLogger, connectionFor, intFlag, kafkaFor, maxMessageBytesFromEnv, parseCommandArgs, registryFrom, runCommand, topicFromEnv, UsageError, type Command } from "./common.ts";
import { decodeRecord } from "./tail.ts";
import { atOffset, readWholeTopic, topicsWithPrefix } from "./topic-reader.ts";

const USAGE = `usage: writ dlq redrive (--reason <reason> | --source <partition>:<offset> | --all)... [--dry-run] [--json]
                        [--max <n>] [--brokers <list>] [--registry <url>]

redrive   sends dead-lettered records back to the intents topic ($WRIT_INTENTS_TOPIC, writ.intents) once
          their cause is fixed: the agent's key registered, its reply topic created, a schema registered, an
          owner bug fixed. Each goes with its original key, value and headers (restored as text), plus a
          writ-redriven-from header naming the dead letter, and passes admission again like any record: one
          whose cause remains is dead-lettered again. Sending one twice is safe: its intent key makes a
          repeat an answer from the ledger, never a second write. Reads writ.dlq ($WRIT_DLQ_TOPIC) from its
          beginning to the end it had when the command started.

  --reason <reason>           dead letters with this reason (repeatable): ${DEAD_LETTER_REASONS.join(", ")}
  --source <partition>:<offset>  the dead letter of this intents record (repeatable; writ tail dlq shows it)
  --all                       every dead letter (with neither --reason nor --source)
  --dry-run                   list what would be sent, send nothing
  --max <n>                   send at most n (default 10000); the rest are listed as not sent (over_max)
  --json                      one JSON object per dead letter: its place, source, reason and what was done
  --brokers <list>            Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --registry <url>            Confluent-API schema registry to decode framed dead letters (default $SCHEMA_REGISTRY_URL)
  -h, --help                  this text

A dead letter of a record sent back that was dead-lettered again (the same key and value) is sent once per run,
with the first. Records go in produce requests of at most 500 records and $WRIT_MAX_MESSAGE_BYTES (the owners'
largest record, default 1000000, which writ's topics take as one record batch). A dead letter whose value was cut to fit the broker's message size (truncated) is sent from
its source: the original record, read at its source offset, when its key and sha256 are the dead letter's.
Not sent (said per record): a truncated one whose source is gone (source_gone: retention) or is another
record (source_changed) or cannot be read (read_timeout, read_failed: the brokers unreachable, a refused
read), one whose value is not the bytes its sha256 names (value_changed: forged or damaged), one from another
topic than the intents topic (other_topic) or from no offset there (source_invalid), and one that does not decode.

Exit status: 0 every selected dead letter was sent (or listed, with --dry-run; also when none matched),
1 some were not sent (the output says why), 2 bad usage or could not run.`;

type Outcome = "sent" | "would_send" | "same_record" | "other_topic" | "source_invalid" | "value_changed" | "undecodable" | "over_max" | "source_gone" | "source_changed" | "read_timeout" | "read_failed";

/** What the output says of one selected dead letter (its value is not kept: sent in batches as they are read). */
interface Selected {
  dlq: { topic: string; partition: number; offset: string };
  letter: Pick<DeadLetter, "reason" | "key" | "source"> | null;
  outcome: Outcome;
  detail?: string;
}

/** Records per produce request. */
const BATCH = 500;

/** `p:o`, both whole numbers. */
function sourceArg(raw: string): string {
  const m = /^(\d{1,9}):(\d{1,19})$/.exec(raw);
  if (!m) throw new UsageError(`--source must be <partition>:<offset>, got ${printable(raw.slice(0, 80))}`);
  return atOffset(Number(m[1]), m[2]!);
}

const REDRIVE_OPTIONS = {
  reason: { type: "string", multiple: true },
  source: { type: "string", multiple: true },
  all: { type: "boolean" },
  "dry-run": { type: "boolean" },
  max: { type: "string" },
  json: { type: "boolean" },
  brokers: { type: "string" },
  registry: { type: "string" },
} as const;

async function redrive(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, REDRIVE_OPTIONS, USAGE);
  if (parsed === undefined) return 0;
  const a = parsed.values;
  const reasons = new Set(a.reason ?? []);
  for (const r of reasons) if (!(DEAD_LETTER_REASONS as readonly string[]).includes(r)) throw new UsageError(`--reason ${printable(r.slice(0, 80))} is not a dead-letter reason (${DEAD_LETTER_REASONS.join(", ")})`);
  const sources = new Set((a.source ?? []).map(sourceArg));
  if (a.all && (reasons.size > 0 || sources.size > 0)) throw new UsageError("--all takes every dead letter: give it without --reason and --source");
  if (!a.all && reasons.size === 0 && sources.size === 0) throw new UsageError("which dead letters? give --reason, --source or --all");

  const max = intFlag("max", a.max, 10_000, 1);
  const brokers = brokersFrom(a.brokers);
  const log = commandLogger("dlq");
  const connection = connectionFor(registryFrom(a.registry));
  const kafka = kafkaFor(brokers, "writ-cli-dlq", log, connection.kafka);
  const codec = new WireCodec(connection);
  const dlqTopic = topicFromEnv("WRIT_DLQ_TOPIC");
  const intentsTopic = topicFromEnv("WRIT_INTENTS_TOPIC");
  const batchBytes = maxMessageBytesFromEnv();
  if (!(await topicsWithPrefix(kafka, dlqTopic)).includes(dlqTopic)) {
    process.stderr.write(`writ dlq: no topic ${dlqTopic} on the cluster (writ topics ensure creates it)\n`);
    return 2;
  }

  const selected: Selected[] = [];
  const producer = a["dry-run"] ? null : redriveProducer(kafka);
  type Message = { key: string | null; value: Buffer; headers: IHeaders };
  // Records waiting to go, in produce requests: all but the last are full. A request that fails stays, and goes
  // with the next flush; no record is dropped by a failed one.
  const batches: Message[][] = [];
  let lastBytes = 0;
  let sent = 0;
  // A record sent back whose cause remained was dead-lettered again: the same key and value, a later dead letter.
  // Each is sent once per run (the first), so that runs over --all add copies linearly, not doubling each time.
  const records = new Map<string, string>();
  const truncated: { selected: Selected; letter: DeadLetter }[] = [];
  const flush = async (keepLast = false) => {
    if (producer === null) return;
    while (batches.length > (keepLast ? 1 : 0)) {
      await producer.send({ topic: intentsTopic, acks: -1, messages: batches[0]! });
      batches.shift();
    }
  };
  // A produce request carries a partition's records as one record batch, which the intents topic refuses
  // (MESSAGE_TOO_LARGE) past its max.message.bytes, at least WRIT_MAX_MESSAGE_BYTES: a request is closed before
  // it would pass that (a record alone goes alone; it was on the topic).
  const add = async (m: Message) => {
    const size = recordBytes({ topic: intentsTopic, ...m, headers: m.headers as Record<string, string> });
    const last = batches.at(-1);
    if (last === undefined || last.length >= BATCH || (last.length > 0 && lastBytes + size + BATCH_OVERHEAD_BYTES > batchBytes)) {
      batches.push([m]);
      lastBytes = size;
    } else {
      last.push(m);
      lastBytes += size;
    }
    await flush(true);
  };
  await producer?.connect();
  try {
    const { unfinished } = await readWholeTopic(kafka, dlqTopic, log, async (r) => {
      const d = await decodeRecord(codec, "DeadLetter", r);
      if (d.tombstone) return;
      const dlq = { topic: d.topic, partition: d.partition, offset: d.offset };
      if (d.error !== undefined) {
        if (a.all) selected.push({ dlq, letter: null, outcome: "undecodable", detail: d.error });
        return;
      }
      const full = d.value as DeadLetter;
      const letter = { reason: full.reason, key: full.key, source: full.source };
      const identity = `${full.key}\u0000${full.sha256}`;
      const chosen = a.all || reasons.has(full.reason) || (full.source.topic === intentsTopic && sources.has(`${full.source.partition}:${full.source.offset}`));
      if (!chosen) return;
      // before the identity is taken: a copy with other bytes must not make the real one a "same_record"
      const refused = notRedrivable(full, intentsTopic) ?? valueRefusal(full);
      if (refused !== null) {
        selected.push({ dlq, letter, ...refused });
      } else if (records.has(identity)) {
        selected.push({ dlq, letter, outcome: "same_record", detail: `the same key and value as ${records.get(identity)}, sent once` });
      } else if (sent >= max) {
        selected.push({ dlq, letter, outcome: "over_max", detail: `--max ${max} reached` });
      } else {
        sent++;
        records.set(identity, `${dlq.topic}[${dlq.partition}]@${dlq.offset}`);
        const chosenOne: Selected = { dlq, letter, outcome: a["dry-run"] ? "would_send" : "sent" };
        selected.push(chosenOne);
        // A value cut to fit is read from its source after this pass, all of them in one read.
        if (full.truncated) return void truncated.push({ selected: chosenOne, letter: { ...full, valueBase64: "" } });
        if (producer === null) return;
        await add(redriveMessage(full, dlq));
      }
    });
    await flush();
    const originals = await originalsOf(kafka, truncated.map((t) => t.letter), { timeoutMs: 60_000, log });
    for (const [i, t] of truncated.entries()) {
      const original = originals[i]!;
      if ("outcome" in original) {
        Object.assign(t.selected, original);
        sent--;
        continue;
      }
      if (producer === null) continue;
      await add(redriveMessage(t.letter, t.selected.dlq, original));
    }
    await flush();
    if (unfinished.length > 0) log.warn({ partitions: unfinished }, `stopped before the end of ${unfinished.join(", ")}: nothing arrived for 15 s`);
  } finally {
    await producer?.disconnect();
  }

  for (const s of selected) {
    const l = s.letter;
    const source = l ? `${l.source.topic}[${l.source.partition}]@${l.source.offset}` : "?";
    if (a.json) {
      process.stdout.write(`${jsonLine({ dlq: s.dlq, source: l?.source ?? null, reason: l?.reason ?? null, key: l?.key ?? null, outcome: s.outcome, ...(s.detail ? { detail: s.detail } : {}) })}\n`);
    } else {
      const what = s.outcome === "sent" ? "sent" : s.outcome === "would_send" ? "would send" : `not sent (${s.outcome}: ${s.detail})`;
      process.stdout.write(`${printable(`${s.dlq.topic}[${s.dlq.partition}]@${s.dlq.offset} ${l?.reason ?? "?"} source=${source} key=${l?.key ?? "null"}: ${what}`)}\n`);
    }
  }
  const notSent = selected.filter((s) => s.outcome !== "sent" && s.outcome !== "would_send" && s.outcome !== "same_record").length;
  const done = a["dry-run"] ? `${sent} would be sent` : `${sent} sent to ${intentsTopic}`;
  process.stderr.write(`writ dlq: ${selected.length} dead letter${selected.length === 1 ? "" : "s"} selected, ${done}, ${notSent} not sent\n`);
  return notSent > 0 ? 1 : 0;
}

async function main(argv: string[]): Promise<number> {
  const [sub, ...rest] = argv;
  if (sub === "redrive") return redrive(rest);
  if (sub === undefined || sub === "--help" || sub === "-h" || sub === "help") {
    process.stdout.write(`${USAGE}\n`);
    return sub === undefined ? 2 : 0;
  }
  throw new UsageError(`unknown subcommand ${printable(sub.slice(0, 80))}: redrive`);
}

export const dlqCommand: Command = {
  usage: USAGE,
  options: REDRIVE_OPTIONS,
  main: (argv) => runCommand("dlq", USAGE, () => main(argv)),
};
