// Sending dead letters back from the console, one or many per request: what `writ dlq redrive` does (the same
// code, src/dlq-redrive.ts), checked against what the console keeps of each dead letter, with an answer per dead
// letter in bounded time (its reason, never a 500).
import type { IHeaders, Kafka, Producer } from "kafkajs";
import { atOffset } from "../cli/topic-reader.ts";
import type { WireCodec } from "../codec.ts";
import { notRedrivable, originalsOf, readDeadLetters, recordIdentity, REDRIVEN_FROM_HEADER, redriveMessage, redriveProducer, redrivenFrom, valueRefusal, type DeadLetterRef, type Original } from "../dlq-redrive.ts";
import { partitionFor } from "../kafka/partition.ts";
import type { Logger } from "../logger.ts";
import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { ConsoleState } from "./state.ts";

// read back as `writ dlq redrive` reads back the dead letters it held
export { readDeadLetters } from "../dlq-redrive.ts";

/** At most this many dead letters per request (the console keeps 100 by default: `limits.recent`). */
export const MAX_SEND_BACK = 200;

/** What sending one dead letter back came to: `sent`, or why not (the same words `writ dlq redrive` uses where it has them). */
export type SendBackOutcome =
  | "sent"
  | "dead_letter_unknown"
  | "dead_letter_sent_back"
  | "dead_letter_sending"
  | "dead_letter_gone"
  | "other_topic"
  | "source_invalid"
  | "undecodable"
  | "read_timeout"
  | "read_failed"
  | "source_gone"
  | "source_changed"
  | "value_changed"
  | "same_record"
  | "send_failed";

export interface SendBackResult {
  partition: number;
  offset: string;
  outcome: SendBackOutcome;
  /** Why not, in words (absent when sent). */
  error?: string;
  /** Where it went on the intents topic (when sent). */
  sentTo?: DeadLetterRef;
}

/** The status of `POST /api/dead-letters/<partition>/<offset>/redrive` for each outcome. */
export const SEND_BACK_STATUS: Record<SendBackOutcome, number> = {
  sent: 200,
  dead_letter_unknown: 404,
  dead_letter_gone: 404,
  dead_letter_sent_back: 409,
  dead_letter_sending: 409,
  other_topic: 409,
  source_invalid: 409,
  undecodable: 409,
  source_gone: 409,
  source_changed: 409,
  value_changed: 409,
  same_record: 409,
  read_timeout: 504,
  read_failed: 502,
  send_failed: 502,
};

/** What a dead letter sent back from the console is reported as (`startConsole({onRedrive})`): an audit line. */
export interface RedriveReport {
  deadLetter: DeadLetterRef;
  source: DeadLetterRef;
  reason: string;
  operator: string;
  sentTo: DeadLetterRef;
}

export interface DeadLetterSenderOptions {
  kafka: Kafka;
  codec: WireCodec;
  state: ConsoleState;
  topics: { intents: string; dlq: string };
  /** How long reading a dead letter back (and a truncated one's original) may take, connecting included. */
  readTimeoutMs: number;
  operatorId: string;
  log: Logger;
  onRedrive?: (d: RedriveReport) => void;
}

/** Sends dead letters back: each dead letter at most once at a time; the producer is made at the first send. */
export class DeadLetterSender {
  private readonly redriving = new Set<string>();
  private redriver: Promise<Producer> | null = null;

  private readonly o: DeadLetterSenderOptions;

  constructor(options: DeadLetterSenderOptions) {
    this.o = options;
  }

  /**
   * Sends the dead letters at `refs` (offsets of writ.dlq) back to the intents topic, as `writ dlq redrive` does:
   * each checked against what the console knows of it (kept, not sent back yet, from the intents topic, not being
   * sent), read back from writ.dlq in one read (a truncated one's original from its source, in one more), a record
   * named twice (the same key and value) sent once, and all of them in one produce request. Answers by index.
   */
  async sendBack(refs: readonly { partition: number; offset: string }[]): Promise<SendBackResult[]> {
    const results: SendBackResult[] = refs.map((r) => ({ partition: r.partition, offset: r.offset, outcome: "sent" }));
    const refuse = (i: number, outcome: SendBackOutcome, error: string) => Object.assign(results[i]!, { outcome, error });
    const taken: number[] = [];
    for (const [i, r] of refs.entries()) {
      const k = atOffset(r.partition, r.offset);
      const item = this.o.state.deadLetterAt(r.partition, r.offset);
      if (item === undefined) refuse(i, "dead_letter_unknown", "no such dead letter among the ones this console keeps");
      else if (item.sentBack !== null) refuse(i, "dead_letter_sent_back", `already sent back, to ${item.sentBack.topic}[${item.sentBack.partition}]@${item.sentBack.offset}: a dead letter it made again has an offset of its own`);
      else if (this.redriving.has(k)) refuse(i, "dead_letter_sending", "this dead letter is already being sent back");
      else {
        const refused = notRedrivable(item, this.o.topics.intents);
        if (refused !== null) refuse(i, refused.outcome, `cannot be sent back: ${refused.detail}`);
        else {
          this.redriving.add(k);
          taken.push(i);
        }
      }
    }
    // In their order on writ.dlq (a record's dead letters are on its key's partition), whatever the order asked (the
    // page lists the newest first): one record's intents reach its owner in the order they came, an acquire before
    // the steps of its lease; and of one record dead-lettered twice, the first goes.
    taken.sort((a, b) => refs[a]!.partition - refs[b]!.partition || Number(BigInt(refs[a]!.offset) - BigInt(refs[b]!.offset)));
    try {
      const letters = await readDeadLetters(this.o.kafka, this.o.codec, this.o.topics.dlq, taken.map((i) => refs[i]!), this.o.readTimeoutMs, this.o.log);
      // What goes: the dead letter, where it was read, and (a value cut to fit) the original read from its source.
      const going: { i: number; letter: DeadLetter; ref: DeadLetterRef; original?: Original }[] = [];
      for (const [j, i] of taken.entries()) {
        const ref: DeadLetterRef = { topic: this.o.topics.dlq, ...refs[i]! };
        const read = letters[j]!;
        if (read === null) refuse(i, "dead_letter_gone", `not found at ${ref.topic}[${ref.partition}]@${ref.offset} any more (retention?)`);
        else if (!("letter" in read)) refuse(i, read.unread, read.unread === "undecodable" ? `it does not read back: ${read.error}` : read.error);
        else {
          const changed = valueRefusal(read.letter);
          if (changed !== null) refuse(i, changed.outcome, `cannot be sent back: ${changed.detail}`);
          else going.push({ i, letter: read.letter, ref });
        }
      }
      // A record sent back whose cause remained was dead-lettered again: the same key and value, sent once, with the
      // first (in writ.dlq order) whose value is known to be those bytes. A whole one's is (valueRefusal above), so a
      // truncated copy after it is that record again, its original not read; a truncated one's only once its original
      // is read: a copy naming a real record's key and sha256 must not make the real one a repeat.
      const sameRecord = (i: number, first: DeadLetterRef) => refuse(i, "same_record", `the same key and value as ${first.topic}[${first.partition}]@${first.offset}, sent once`);
      const whole = new Map<string, DeadLetterRef>();
      const truncated: typeof going = [];
      for (const g of going) {
        const id = recordIdentity(g.letter);
        const first = whole.get(id);
        if (!g.letter.truncated) {
          if (first === undefined) whole.set(id, g.ref);
        } else if (first !== undefined) sameRecord(g.i, first);
        else truncated.push(g);
      }
      const originals = await originalsOf(this.o.kafka, truncated.map((g) => g.letter), { timeoutMs: this.o.readTimeoutMs, log: this.o.log });
      for (const [j, g] of truncated.entries()) {
        const got = originals[j]!;
        if ("outcome" in got) refuse(g.i, got.outcome, `cannot be sent back: ${got.detail}`);
        else g.original = got;
      }
      const records = new Map<string, DeadLetterRef>();
      for (const g of going) {
        if (results[g.i]!.outcome !== "sent") continue;
        const first = records.get(recordIdentity(g.letter));
        if (first !== undefined) sameRecord(g.i, first);
        else records.set(recordIdentity(g.letter), g.ref);
      }
      const sending = going.filter((g) => results[g.i]!.outcome === "sent");
      if (sending.length === 0) return results;
      const messages = sending.map((g) => redriveMessage(g.letter, g.ref, g.original));
      let sentTo: DeadLetterRef[];
      try {
        sentTo = await sendAll(this.o.kafka, await this.producer(), this.o.topics.intents, messages);
      } catch (err) {
        this.o.log.error({ err, deadLetters: sending.map((g) => g.ref) }, "could not send the dead letters back");
        for (const g of sending) refuse(g.i, "send_failed", `could not send it to ${this.o.topics.intents}: ${(err as Error).message}`);
        return results;
      }
      for (const [j, g] of sending.entries()) {
        const message = messages[j]!;
        results[g.i]!.sentTo = sentTo[j]!;
        // Shown at once; the feed reads the record a moment later and finds it already marked.
        // the record as the feed will read it: its header, key and value
        const from = redrivenFrom(message.headers[REDRIVEN_FROM_HEADER] as string, g.ref.topic, message.key === null ? null : Buffer.from(message.key), message.value);
        if (from !== null) this.o.state.redriven(sentTo[j]!, from);
        this.o.log.info({ deadLetter: g.ref, source: g.letter.source, reason: g.letter.reason, operator: this.o.operatorId, sentTo: sentTo[j] }, "dead letter sent back from the console");
        this.o.onRedrive?.({ deadLetter: g.ref, source: { ...g.letter.source }, reason: g.letter.reason, operator: this.o.operatorId, sentTo: sentTo[j]! });
      }
      return results;
    } finally {
      for (const i of taken) this.redriving.delete(atOffset(refs[i]!.partition, refs[i]!.offset));
    }
  }

  /** The idempotent producer sends go through, connected at the first; a failed connect is tried again next time. */
  private producer(): Promise<Producer> {
    this.redriver ??= (async () => {
      const p = redriveProducer(this.o.kafka);
      await p.connect();
      return p;
    })().catch((err: unknown) => {
      this.redriver = null;
      throw err;
    });
    return this.redriver;
  }

  async close(): Promise<void> {
    await (await this.redriver?.catch(() => null))?.disconnect().catch(() => undefined);
  }
}

/**
 * Sends `messages` to `topic` in one produce request and answers where each went, by index. Each goes to its
 * key's murmur2 partition, computed here (`partitionFor`, as writ's client and the owners compute it) so that the
 * answer per partition (its base offset) says each record's offset: a partition's records are one batch, in the
 * order given. A record without a key (it is dead-lettered again) goes round the partitions.
 */
async function sendAll(kafka: Kafka, producer: Producer, topic: string, messages: readonly { key: string | null; value: Buffer; headers: IHeaders }[]): Promise<DeadLetterRef[]> {
  const admin = kafka.admin();
  let partitions: number;
  try {
    await admin.connect();
    const meta = await admin.fetchTopicMetadata({ topics: [topic] });
    partitions = meta.topics[0]?.partitions.length ?? 0;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
  if (partitions === 0) throw new Error(`the topic ${topic} has no partitions`);
  const placed = messages.map((m, i) => ({ ...m, partition: m.key === null ? i % partitions : partitionFor(m.key, partitions) }));
  const answers = await producer.send({ topic, acks: -1, messages: placed });
  const base = new Map(answers.map((a) => [a.partition, BigInt(a.baseOffset ?? a.offset ?? "-1")]));
  const next = new Map<number, number>();
  return placed.map((m) => {
    const at = next.get(m.partition) ?? 0;
    next.set(m.partition, at + 1);
    const first = base.get(m.partition);
    if (first === undefined || first < 0n) throw new Error(`the broker answered no offset for ${topic}[${m.partition}]`);
    return { topic, partition: m.partition, offset: String(first + BigInt(at)) };
  });
}
