// `writ dlq redrive`: puts dead-lettered records back on the intents topic once their cause is fixed.
//
// A dead letter keeps the original record (key, value whole unless `truncated`, headers as text), so nothing
// is lost; what was missing is the way back. The redriven record goes through admission again like any other
// (signature, registry, reply topic, key), and its intent key makes it safe to send more than once: an intent
// the owner already took is answered from the ledger as a repeat, never written twice.
import type { IHeaders } from "kafkajs";
import { WireCodec } from "../codec.ts";
import { notRedrivable, originalsOf, readDeadLetters, recordIdentity, redriveMessage, redriveProducer, valueRefusal, type DeadLetterRef, type Original, type OriginalRefusal, type Unread } from "../dlq-redrive.ts";
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
its source: the original record, read at its source offset, when its key and sha256 are the dead letter's
(only then is it the first of its record). It goes after the others, and its key's later dead letters with it,
read back from writ.dlq: one record's dead letters go back in their order.
Not sent (said per record): a truncated one whose source is gone (source_gone: retention) or is another
record (source_changed) or cannot be read (read_timeout, read_failed: the brokers unreachable, a refused
read), one whose value is not the bytes its sha256 names (value_changed: forged or damaged), one from another
topic than the intents topic (other_topic) or from no offset there (source_invalid), one that does not decode,
and one gone from writ.dlq before it was read back (dead_letter_gone: retention).

Exit status: 0 every selected dead letter was sent (or listed, with --dry-run; also when none matched),
1 some were not sent (the output says why), 2 bad usage or could not run.`;

type Outcome = "sent" | "would_send" | "same_record" | "other_topic" | "source_invalid" | "value_changed" | "undecodable" | "over_max" | "source_gone" | "source_changed" | "read_timeout" | "read_failed" | "dead_letter_gone";

/** What the output says of one selected dead letter (its value is not kept: sent in batches as they are read). */
interface Selected {
  dlq: DeadLetterRef;
  letter: Pick<DeadLetter, "reason" | "key" | "source"> | null;
  outcome: Outcome;
  detail?: string;
}

type Message = { key: string | null; value: Buffer; headers: IHeaders };

/** What a run sends with and reads from (a redrive's producer and reads; a test's stand-ins). */
export interface RedriveIo {
  /** Sends a record after the ones before it; none with --dry-run. */
  send?: (m: Message) => Promise<void>;
  /** The originals of truncated dead letters, by index (`originalsOf`). */
  originals: (letters: readonly DeadLetter[]) => Promise<(Original | OriginalRefusal)[]>;
  /** Dead letters read back from writ.dlq, by index (`readDeadLetters`). */
  reread: (refs: readonly DeadLetterRef[]) => Promise<({ letter: DeadLetter } | Unread | null)[]>;
}

const where = (r: DeadLetterRef) => `${r.topic}[${r.partition}]@${r.offset}`;
const sameRecord = (first: string) => ({ outcome: "same_record" as const, detail: `the same key and value as ${first}, sent once` });

/** Held dead letters read back and sent per slice of at most this many (and HELD_SLICE_BYTES of values). */
const HELD_SLICE = 500;
/** The originals' bytes a slice reads at most (one letter larger than that goes alone): the run's memory bound. */
const HELD_SLICE_BYTES = 16 << 20;

/** A dead letter held until after the pass, its value dropped; `counted`: it took a --max place when read. */
interface Held {
  selected: Selected;
  letter: DeadLetter;
  counted: boolean;
}

/**
 * What a run does with the dead letters it selects, given in the order read (`take`), then `finish`. A whole one
 * goes as it is read. A truncated one waits for its original, read from its source after the pass; so do the later
 * dead letters of its key (read back from writ.dlq then, their values not kept meanwhile): one record's intents go
 * back in the order they came, an acquire before the steps of its lease. A record sent back whose cause remained
 * was dead-lettered again (the same key and value, a later dead letter): each is sent once per run, with the first
 * whose value is known to be its bytes, so that runs over --all add copies linearly, not doubling each time; a copy
 * of a record held is held behind it, taking a --max place only if the first is not sent.
 */
export class RedriveRun {
  readonly selected: Selected[] = [];
  /** Sent (or would be, with --dry-run), and held to be sent after the pass. */
  sent = 0;
  /** Records sent (or would be), by identity: where the first was read. */
  private readonly records = new Map<string, string>();
  /** Record keys with a truncated dead letter held: their later ones are held behind it. */
  private readonly waiting = new Set<string | null>();
  /** Identities of the records held, not yet known to be sent. */
  private readonly heldRecords = new Set<string>();
  /** Held after the pass, in the order read, without their values. */
  private held: Held[] = [];
  private readonly o: { intentsTopic: string; max: number; dryRun: boolean; io: RedriveIo };

  constructor(options: { intentsTopic: string; max: number; dryRun: boolean; io: RedriveIo }) {
    this.o = options;
  }

  private get chosen(): Outcome {
    return this.o.dryRun ? "would_send" : "sent";
  }

  async take(dlq: DeadLetterRef, full: DeadLetter): Promise<void> {
    const letter = { reason: full.reason, key: full.key, source: full.source };
    // checked before the identity: a copy with other bytes must not make the real one a same_record
    const refused = notRedrivable(full, this.o.intentsTopic) ?? valueRefusal(full);
    if (refused !== null) return void this.selected.push({ dlq, letter, ...refused });
    const id = recordIdentity(full);
    const first = this.records.get(id);
    if (first !== undefined) return void this.selected.push({ dlq, letter, ...sameRecord(first) });
    const hold = (counted: boolean) => {
      const selected: Selected = { dlq, letter, outcome: this.chosen };
      this.selected.push(selected);
      if (full.truncated) this.waiting.add(full.key);
      this.heldRecords.add(id);
      this.held.push({ selected, letter: { ...full, valueBase64: "" }, counted });
    };
    // A copy of a record held (its key is waiting): decided after the pass, once the first is or is not sent.
    if (this.heldRecords.has(id)) return hold(false);
    if (this.sent >= this.o.max) return void this.selected.push({ dlq, letter, outcome: "over_max", detail: `--max ${this.o.max} reached` });
    this.sent++;
    if (full.truncated || this.waiting.has(full.key)) return hold(true);
    this.selected.push({ dlq, letter, outcome: this.chosen });
    this.records.set(id, where(dlq));
    await this.o.io.send?.(redriveMessage(full, dlq));
  }

  /**
   * Sends what was held, in the order read: a truncated one once its original is read, the others read back, a slice
   * at a time (HELD_SLICE, HELD_SLICE_BYTES), so that no more than a slice's values are held at once.
   */
  async finish(): Promise<void> {
    const held = this.held;
    this.held = [];
    this.waiting.clear();
    this.heldRecords.clear();
    for (let from = 0; from < held.length; ) {
      let to = from;
      let bytes = 0;
      while (to < held.length && to - from < HELD_SLICE && (to === from || bytes + held[to]!.letter.originalBytes <= HELD_SLICE_BYTES)) {
        bytes += held[to]!.letter.originalBytes;
        to++;
      }
      await this.finishSlice(held.slice(from, to));
      from = to;
    }
  }

  private async finishSlice(held: Held[]): Promise<void> {
    const truncated = held.filter((h) => h.letter.truncated);
    const whole = held.filter((h) => !h.letter.truncated);
    const got = new Map<Held, { letter: DeadLetter; original?: Original } | { outcome: Outcome; detail: string }>();
    if (truncated.length > 0) {
      const originals = await this.o.io.originals(truncated.map((h) => h.letter));
      for (const [j, h] of truncated.entries()) {
        const original = originals[j]!;
        got.set(h, "outcome" in original ? original : { letter: h.letter, original });
      }
    }
    if (whole.length > 0) {
      const reread = await this.o.io.reread(whole.map((h) => h.selected.dlq));
      for (const [j, h] of whole.entries()) got.set(h, this.readBack(h.selected.dlq, reread[j]!));
    }
    for (const h of held) {
      const g = got.get(h)!;
      const refuse = (why: { outcome: Outcome; detail: string }) => {
        Object.assign(h.selected, why);
        if (h.counted) this.sent--;
      };
      if ("outcome" in g) {
        refuse(g);
        continue;
      }
      const first = this.records.get(recordIdentity(g.letter));
      if (first !== undefined) {
        refuse(sameRecord(first));
        continue;
      }
      // a copy of a record held whose first was not sent: it is the first now, and takes a --max place if one is left
      if (!h.counted) {
        if (this.sent >= this.o.max) {
          refuse({ outcome: "over_max", detail: `--max ${this.o.max} reached` });
          continue;
        }
        this.sent++;
      }
      this.records.set(recordIdentity(g.letter), where(h.selected.dlq));
      await this.o.io.send?.(redriveMessage(g.letter, h.selected.dlq, g.original));
    }
  }

  /** A held whole dead letter read back from writ.dlq, checked again, or why it cannot be sent. */
  private readBack(dlq: DeadLetterRef, read: { letter: DeadLetter } | Unread | null): { letter: DeadLetter; original?: Original } | { outcome: Outcome; detail: string } {
    if (read === null) return { outcome: "dead_letter_gone", detail: `not found at ${where(dlq)} any more (retention?)` };
    if (!("letter" in read)) return { outcome: read.unread, detail: read.error };
    return notRedrivable(read.letter, this.o.intentsTopic) ?? valueRefusal(read.letter) ?? { letter: read.letter };
  }
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

  const producer = a["dry-run"] ? null : redriveProducer(kafka);
  // Records waiting to go, in produce requests: all but the last are full. A request that fails stays, and goes
  // with the next flush; no record is dropped by a failed one.
  const batches: Message[][] = [];
  let lastBytes = 0;
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
  const run = new RedriveRun({
    intentsTopic,
    max,
    dryRun: producer === null,
    io: {
      ...(producer === null ? {} : { send: add }),
      originals: (letters) => originalsOf(kafka, letters, { timeoutMs: 60_000, log }),
      reread: (refs) => readDeadLetters(kafka, codec, dlqTopic, refs, 60_000, log),
    },
  });
  const selected = run.selected;
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
      const chosen = a.all || reasons.has(full.reason) || (full.source.topic === intentsTopic && sources.has(`${full.source.partition}:${full.source.offset}`));
      if (chosen) await run.take(dlq, full);
    });
    await flush();
    await run.finish();
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
  const done = a["dry-run"] ? `${run.sent} would be sent` : `${run.sent} sent to ${intentsTopic}`;
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
