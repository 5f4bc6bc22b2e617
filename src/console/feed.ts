// The console's reading of writ's topics into a ConsoleState: the intents
// topic (intents and resolutions), every reply topic with the reply prefix
// (discovered periodically), writ.human and writ.dlq, read_committed, control
// records skipped, both framings decoded, through the CLI's readers
// (src/cli/topic-reader.ts, src/cli/tail.ts). And the owners' lag per intents
// partition: the group's committed offset (admin.fetchOffsets) against the
// partition's end (TxnAdmin.listOffsets).
import type { Admin, Kafka } from "kafkajs";
import type { Logger } from "pino";
import { decodeRecord } from "../cli/tail.ts";
import { readTopics, type ReadStart, type TopicRecord } from "../cli/topic-reader.ts";
import type { WireCodec } from "../codec.ts";
import { TxnAdmin } from "../kafka/txn-admin.ts";
import { kafkaLogCreator } from "../kafka-log.ts";
import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { Reply } from "../schemas/reply.ts";
import { KIND_HEADER, type Resolution } from "../schemas/resolution.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import { kafkaConnection, type KafkaSecurity } from "../security/transport.ts";
import { headerText } from "../tracing/trace-context.ts";
import { REDRIVEN_FROM_HEADER, redrivenFrom } from "../dlq-redrive.ts";
import type { ConsoleState, LagPartition } from "./state.ts";

export interface FeedOptions {
  kafka: Kafka;
  brokers: string[];
  /** SASL and TLS, for the offsets admin (the kafkajs client has its own). */
  security?: KafkaSecurity | undefined;
  codec: WireCodec;
  state: ConsoleState;
  topics: { intents: string; human: string; dlq: string };
  replyPrefix: string;
  /** The owners' consumer group (its committed offsets give the lag). */
  groupId: string;
  /** Topics there at the start: the last `backlog` offsets of each partition, or all ("all"). Topics found later: from their beginning. */
  backlog: number | "all";
  discoverIntervalMs: number;
  lagIntervalMs: number;
  log: Logger;
}

export interface Feed {
  /** Resolves once the first discovery ran and the first readers started. */
  readonly started: Promise<void>;
  close(): Promise<void>;
}


export function startFeed(opts: FeedOptions): Feed {
  const { kafka, codec, state, topics, log } = opts;
  const stop = new AbortController();
  const admin: Admin = kafka.admin();
  const txnAdmin = new TxnAdmin({ brokers: opts.brokers, clientId: "writ-console-lag", ...kafkaConnection(opts.security), logCreator: kafkaLogCreator(log), maxAttempts: 3 });
  const reading = new Set<string>();
  const readers = new Set<Promise<void>>();
  const contract = [topics.intents, topics.human, topics.dlq];
  let firstRound = true;
  let restartBacklog = new Set<string>();

  const onRecord = async (r: TopicRecord): Promise<void> => {
    const where = { topic: r.topic, partition: r.partition, offset: r.offset };
    let schema: "WriteIntent" | "Resolution" | "Escalation" | "DeadLetter" | "Reply";
    if (r.topic === topics.intents) schema = headerText(r.headers?.[KIND_HEADER]) === "resolution" ? "Resolution" : "WriteIntent";
    else if (r.topic === topics.human) schema = "Escalation";
    else if (r.topic === topics.dlq) schema = "DeadLetter";
    else schema = "Reply";
    if (r.topic === topics.intents) {
      const from = redrivenFrom(headerText(r.headers?.[REDRIVEN_FROM_HEADER]), topics.dlq, r.key, r.value);
      if (from !== null) state.redriven(where, from);
    }
    const d = await decodeRecord(codec, schema, r);
    if (d.tombstone) return;
    if (d.error !== undefined) {
      if (state.accept(where)) state.undecodable();
      log.debug({ topic: r.topic, partition: r.partition, offset: r.offset }, `record skipped: ${d.error}`);
      return;
    }
    switch (schema) {
      case "WriteIntent":
        return state.intent(where, d.value as WriteIntent);
      case "Resolution":
        return state.resolution(where, d.value as Resolution);
      case "Escalation":
        // The Kafka key too: an owner keys an escalation by its intent's entity; the state drops one keyed otherwise.
        return state.escalation(where, d.value as Escalation, d.key);
      case "DeadLetter":
        return state.deadLetter(where, d.value as DeadLetter);
      case "Reply":
        return state.reply(where, d.value as Reply);
    }
  };

  /**
   * Reads the contract topics in `list` until the console stops; a reader that fails gives its topics back to
   * the next discovery.
   */
  const startReader = (list: string[], start: "backlog" | "beginning"): void => {
    for (const t of list) reading.add(t);
    const from = start === "beginning" || opts.backlog === "all" ? ({ from: "beginning" } as const) : ({ from: "end", last: opts.backlog } as const);
    const reader = (async () => {
      try {
        await readTopics({ kafka, topics: list, start: from, follow: true, signal: stop.signal, onRecord, log });
        // Returned without being stopped: its topics were gone when it began; the discovery finds them if they come back.
        if (!stop.signal.aborted) for (const t of list) reading.delete(t);
      } catch (err) {
        if (stop.signal.aborted) return;
        log.warn({ err, topics: list }, "a topic reader stopped; its topics are read again at the next discovery");
        for (const t of list) {
          reading.delete(t);
          restartBacklog.add(t);
        }
      }
    })();
    readers.add(reader);
    void reader.finally(() => readers.delete(reader));
  };

  /**
   * The reply topics are read by one reader (one consumer, one group), restarted with the topics there are
   * whenever they change: reply topics come and go with agents and runs, and a reader per discovery round would
   * pile up consumers. The restarted reader resumes each partition where the state stopped accepting; a topic
   * not read before starts at its recent past in the first round, at its beginning when created since.
   */
  const replyStart = new Map<string, "backlog" | "beginning">();
  let replyReader: { topics: string[]; stop: AbortController; done: Promise<void> } | null = null;
  const startOfReply = (topic: string, partition: number): ReadStart => {
    const at = state.resumeAt(topic, partition);
    if (at !== undefined) return { from: "offset", offset: at };
    return replyStart.get(topic) === "backlog" && opts.backlog !== "all" ? { from: "end", last: opts.backlog } : { from: "beginning" };
  };
  const readReplies = async (replies: string[]): Promise<void> => {
    const current = replyReader;
    if (current && !current.stop.signal.aborted && current.topics.length === replies.length && current.topics.every((t, i) => t === replies[i])) return;
    if (current) {
      current.stop.abort();
      await current.done;
    }
    replyReader = null;
    if (replies.length === 0 || stop.signal.aborted) return;
    const own = new AbortController();
    const signal = AbortSignal.any([stop.signal, own.signal]);
    const done = (async () => {
      try {
        await readTopics({ kafka, topics: replies, start: startOfReply, follow: true, signal, onRecord, log });
      } catch (err) {
        if (!signal.aborted) log.warn({ err, topics: replies.length }, "the reply topics' reader stopped; started again at the next discovery");
      }
      // Returned or failed without being stopped: the next discovery starts another (own.abort marks this one done).
      own.abort();
    })();
    replyReader = { topics: replies, stop: own, done };
    readers.add(done);
    void done.finally(() => readers.delete(done));
  };

  const discover = async (): Promise<void> => {
    const existing = await admin.listTopics();
    const replies = existing.filter((t) => t.startsWith(opts.replyPrefix) && !contract.includes(t)).sort();
    state.setReplyTopics(replies);
    for (const t of replies) if (!replyStart.has(t)) replyStart.set(t, firstRound ? "backlog" : "beginning");
    const listed = new Set(replies);
    for (const t of replyStart.keys()) if (!listed.has(t)) replyStart.delete(t);
    await readReplies(replies);
    const wanted = contract.filter((t) => existing.includes(t));
    const fresh = wanted.filter((t) => !reading.has(t));
    if (fresh.length === 0) return;
    const again = fresh.filter((t) => restartBacklog.has(t));
    const created = fresh.filter((t) => !restartBacklog.has(t));
    restartBacklog = new Set([...restartBacklog].filter((t) => !fresh.includes(t)));
    // At the start, what is there is read from its recent past; a topic created since, from its beginning.
    if (created.length > 0) startReader(created, firstRound ? "backlog" : "beginning");
    if (again.length > 0) startReader(again, "backlog");
    const missing = contract.filter((t) => !existing.includes(t));
    if (firstRound && missing.length > 0) log.warn({ topics: missing }, `not on the cluster (yet): ${missing.join(", ")}; looked for again every ${opts.discoverIntervalMs} ms`);
  };

  let lastLagWarning = 0;
  const pollLag = async (): Promise<void> => {
    try {
      const meta = await admin.fetchTopicMetadata({ topics: [topics.intents] });
      const partitions = (meta.topics[0]?.partitions ?? []).map((p) => p.partitionId).sort((a, b) => a - b);
      const [committed, ends] = await Promise.all([
        admin.fetchOffsets({ groupId: opts.groupId, topics: [topics.intents] }),
        txnAdmin.listOffsets(partitions.map((partition) => ({ topic: topics.intents, partition }))),
      ]);
      const byPartition = new Map((committed[0]?.partitions ?? []).map((p) => [p.partition, p.offset]));
      const rows: LagPartition[] = partitions.map((partition) => {
        const end = ends.find((e) => e.partition === partition)!;
        const raw = byPartition.get(partition);
        const c = raw === undefined || BigInt(raw) < 0n ? null : BigInt(raw);
        const lag = end.highWatermark - (c ?? end.logStart);
        return {
          partition,
          committed: c === null ? null : c.toString(),
          end: end.highWatermark.toString(),
          lastStable: end.lastStable.toString(),
          logStart: end.logStart.toString(),
          lag: Number(lag > 0n ? lag : 0n),
        };
      });
      state.setLag({ group: opts.groupId, topic: topics.intents, at: new Date().toISOString(), partitions: rows, total: rows.reduce((s, r) => s + r.lag, 0) });
    } catch (err) {
      const message = err instanceof Error ? err.message : String(err);
      state.setLag({ group: opts.groupId, topic: topics.intents, at: new Date().toISOString(), partitions: [], total: 0, error: message });
      if (Date.now() - lastLagWarning > 60_000) {
        lastLagWarning = Date.now();
        log.warn({ err }, `lag of ${opts.groupId} on ${topics.intents}: ${message}`);
      }
    }
  };

  const loops: NodeJS.Timeout[] = [];
  const every = (ms: number, fn: () => Promise<void>) => {
    let busy = false;
    const timer = setInterval(() => {
      if (busy || stop.signal.aborted) return;
      busy = true;
      fn()
        .catch((err: unknown) => log.warn({ err }, "console feed: a periodic task failed; tried again"))
        .finally(() => (busy = false));
    }, ms);
    timer.unref();
    loops.push(timer);
  };

  const started = (async () => {
    await admin.connect();
    await discover();
    firstRound = false;
    every(opts.discoverIntervalMs, discover);
    await pollLag();
    every(opts.lagIntervalMs, pollLag);
  })();
  started.catch(() => undefined);

  return {
    started,
    async close() {
      stop.abort();
      for (const t of loops) clearInterval(t);
      await started.catch(() => undefined);
      await Promise.allSettled([...readers]);
      await admin.disconnect().catch(() => undefined);
      await txnAdmin.close().catch(() => undefined);
    },
  };
}
