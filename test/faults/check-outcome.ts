import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { WireCodec } from "../../src/codec.ts";
import { TxnAdmin } from "../../src/kafka/txn-admin.ts";
import { isControlRecord } from "../../src/schemas/control.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import type { DemoRecordsStore } from "../../src/testing/demo-records-store.ts";
import type { PlannedIntent } from "./agent-load.ts";
import type { Zombie } from "./owner-fleet.ts";
import type { PoisonRound } from "./poison.ts";

/** What the suite measured, at the records server and on the reply and dead-letter topics, never in the owner. */
export interface Outcome {
  intents: number;
  applied: number;
  /** Intent keys written more than once at the records server (its Idempotency-Key dedupe is off). */
  duplicates: number;
  /** Changes reported applied that the final record lacks, or version chains with a gap. */
  lost_updates: number;
  /** Intents with no applied/rejected/escalated answer: `never_submitted` + `submitted_unanswered`. */
  unanswered: number;
  /** The load's deadline came before the intent was ever submitted. */
  never_submitted: number;
  /** Submitted, and no final reply visible to a read_committed reader. */
  submitted_unanswered: number;
  /** Answers that disagree with the records server (applied without a write, a write without applied). */
  mismatches: number;
  /** PATCH requests after that intent's write committed that the server did not refuse by If-Match: a retry layer that replayed. */
  patches_after_commit: number;
  /** Late PATCHes of an already-written intent that If-Match refused (412): harmless, reported for the record. */
  late_patches_refused: number;
  max_patches_per_intent: number;
  conflicts_answered: number;
  escalated: number;
  /** Escalations for an unsettled outcome of an intent whose PATCH never reached the records server. */
  escalated_unsent: number;
  /** PATCHes sent by a zombie's pre-pause sessions after it was resumed (it must be fenced first). */
  zombie_writes: number;
  /** Poison records injected, and how many got their dead letter with the expected reason. */
  poison: number;
  poison_dead_lettered: number;
  /** Valid intents sent right after poison on the same partition, and how many were applied. */
  poison_follow_ups: number;
  poison_follow_ups_applied: number;
  /** Reply partitions whose last stable offset is stuck behind the high watermark at the end. */
  hanging_partitions: number;
}

interface TopicRead<T> {
  values: T[];
  /** Per partition: last stable offset and high watermark after the read. */
  ends: { partition: number; lastStable: bigint; highWatermark: bigint }[];
}

/** Reads every value of `topics` (read_committed), skipping control records, until it has read up to each partition's last stable offset. */
async function readTopics<T>(brokers: string[], registryUrl: string | undefined, topics: string[], decode: (codec: WireCodec, value: Buffer) => Promise<T | null>): Promise<Map<string, TopicRead<T>>> {
  const kafka = new Kafka({ clientId: "fault-check", brokers, logLevel: logLevel.NOTHING });
  const txn = new TxnAdmin({ brokers, clientId: "fault-check-offsets", maxAttempts: 4 });
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl });
  const admin = kafka.admin();
  await admin.connect();
  const out = new Map<string, TopicRead<T>>();
  const targets = new Map<string, bigint>();
  try {
    for (const t of topics) {
      const meta = await admin.fetchTopicMetadata({ topics: [t] });
      const tps = meta.topics[0]!.partitions.map((p) => ({ topic: t, partition: p.partitionId }));
      const ends = await txn.listOffsets(tps);
      out.set(t, { values: [], ends: ends.map((e) => ({ partition: e.partition, lastStable: e.lastStable, highWatermark: e.highWatermark })) });
      for (const e of ends) targets.set(`${t}:${e.partition}`, e.lastStable);
    }
  } finally {
    await admin.disconnect();
    await txn.close();
  }
  const consumer = kafka.consumer({ groupId: `fault-check-${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 250 });
  const reached = new Map<string, bigint>();
  await consumer.connect();
  await consumer.subscribe({ topics, fromBeginning: true });
  let lastProgress = Date.now();
  await consumer.run({
    eachBatch: async ({ batch, resolveOffset }) => {
      for (const m of batch.messages) {
        lastProgress = Date.now();
        resolveOffset(m.offset);
        if (isControlRecord(m.headers) || m.value === null) continue;
        const v = await decode(codec, m.value);
        if (v !== null) out.get(batch.topic)!.values.push(v);
      }
      reached.set(`${batch.topic}:${batch.partition}`, BigInt(batch.lastOffset()) + 1n);
    },
  });
  const done = () => [...targets].every(([k, lso]) => lso === 0n || (reached.get(k) ?? 0n) >= lso);
  while (!done() && Date.now() - lastProgress < 15_000) await new Promise((r) => setTimeout(r, 100));
  await consumer.disconnect();
  return out;
}

/**
 * Each record's history at the records server, checked for lost updates: a
 * write whose base version is not the version the write before it produced
 * means a write landed on a stale version. Returns each record's final state.
 */
export function versionChains(store: DemoRecordsStore, entities: readonly { type: string; id: string }[]): { lost: number; problems: string[]; finalState: Map<string, any> } {
  const finalState = new Map<string, any>();
  const problems: string[] = [];
  let lost = 0;
  for (const e of entities) {
    const history = store.history(e.type, e.id);
    for (let i = 1; i < history.length; i++) {
      if (history[i]!.fromVersion !== history[i - 1]!.toVersion) {
        lost++;
        problems.push(`${e.type}:${e.id}: version chain broken at v${history[i]!.fromVersion}`);
      }
    }
    finalState.set(`${e.type}:${e.id}`, history.at(-1)?.state);
  }
  return { lost, problems, finalState };
}

/** One reply in a line: status, cycle, duplicate flag and message, for a diagnosis. */
function describeReply(r: Reply): string {
  const cycle = r.status === "conflict" ? ` cycle ${r.cycle}` : "";
  const message = "message" in r && typeof r.message === "string" ? `: ${r.message.slice(0, 200)}` : "";
  return `${r.status}${cycle}${r.duplicate ? " (duplicate)" : ""} at ${r.at}${message}`;
}

export async function checkOutcome(opts: {
  intents: PlannedIntent[];
  store: DemoRecordsStore;
  brokers: string[];
  registryUrl: string | undefined;
  replyTopics: string[];
  dlqTopic: string;
  entities: { type: string; id: string }[];
  zombies: Zombie[];
  poison: PoisonRound[];
}): Promise<{ outcome: Outcome; problems: string[] }> {
  const { intents, store } = opts;
  const problems: string[] = [];
  const writesByKey = store.stats().writesByKey;
  const chains = versionChains(store, opts.entities);
  const finalState = chains.finalState;
  const lost = chains.lost;
  problems.push(...chains.problems);
  const topics = await readTopics<Reply>(opts.brokers, opts.registryUrl, opts.replyTopics, async (codec, v) => {
    const d = await codec.decode("Reply", v);
    return d.ok ? d.value : null;
  });
  const replies = new Map<string, Reply[]>();
  for (const read of topics.values()) {
    for (const r of read.values) replies.set(r.intentKey, [...(replies.get(r.intentKey) ?? []), r]);
  }
  const hanging = [...topics].flatMap(([t, read]) => read.ends.filter((e) => e.lastStable < e.highWatermark).map((e) => ({ topic: t, ...e })));
  for (const h of hanging) {
    problems.push(`reply partition ${h.topic}-${h.partition}: last stable offset ${h.lastStable} behind high watermark ${h.highWatermark} (an open or hanging transaction; writ doctor names it)`);
  }
  const o: Outcome = {
    intents: intents.length,
    applied: 0,
    duplicates: 0,
    lost_updates: lost,
    unanswered: 0,
    never_submitted: 0,
    submitted_unanswered: 0,
    mismatches: 0,
    patches_after_commit: 0,
    late_patches_refused: 0,
    max_patches_per_intent: 0,
    conflicts_answered: 0,
    escalated: 0,
    escalated_unsent: 0,
    zombie_writes: 0,
    poison: 0,
    poison_dead_lettered: 0,
    poison_follow_ups: 0,
    poison_follow_ups_applied: 0,
    hanging_partitions: hanging.length,
  };
  for (const p of intents) {
    const key = p.intentKey ?? "";
    const writes = writesByKey[key] ?? 0;
    const onTopic = replies.get(key) ?? [];
    const definitive = onTopic.filter((r) => r.status !== "conflict");
    o.conflicts_answered += onTopic.filter((r) => r.status === "conflict" && !r.duplicate).length;
    if (writes > 1) {
      o.duplicates++;
      problems.push(`${key}: written ${writes} times`);
    }
    const patches = key === "" ? [] : store.patchRequests(key);
    o.max_patches_per_intent = Math.max(o.max_patches_per_intent, patches.length);
    const committedAt = patches.findIndex((r) => r.outcome === "applied");
    if (committedAt >= 0) {
      const later = patches.slice(committedAt + 1);
      const refused = later.filter((r) => r.outcome === "precondition_failed").length;
      o.late_patches_refused += refused;
      if (later.length > refused) {
        o.patches_after_commit += later.length - refused;
        problems.push(`${key}: ${later.length - refused} PATCH request(s) after its write committed (${patches.map((r) => `${r.outcome}@${r.owner ?? "?"}`).join(" → ")})`);
      }
    }
    if (p.submissions === 0) {
      o.unanswered++;
      o.never_submitted++;
      problems.push(`${p.agent} ${p.mark}: never submitted (the load's deadline came first)`);
      continue;
    }
    if (definitive.length === 0 || !p.final) {
      o.unanswered++;
      o.submitted_unanswered++;
      problems.push(
        `${p.agent} ${p.mark}: submitted ${p.submissions}×, no final reply visible (${onTopic.length} replies read; last answer ${p.lastStatus ?? "none"}; ${patches.length} PATCH requests at the server)`,
      );
      // What the owners answered, first and last: enough to tell a loop from a silence without the owners' logs.
      const shown = onTopic.length <= 6 ? onTopic : [...onTopic.slice(0, 3), ...onTopic.slice(-3)];
      for (const r of shown) problems.push(`  ${p.mark} reply: ${describeReply(r)}`);
      if (key !== "") problems.push(`  ${p.mark} ledger key ${key}; record ${p.entity.type}:${p.entity.id} at v${store.get(p.entity.type, p.entity.id)?.version ?? "?"}`);
      continue;
    }
    const statuses = new Set(definitive.map((r) => r.status));
    if (statuses.size > 1) problems.push(`${key}: contradictory replies ${[...statuses].join(", ")}`);
    const final = p.final;
    if (final.status === "applied") {
      o.applied++;
      if (writes !== 1) {
        o.mismatches++;
        problems.push(`${key}: answered applied, written ${writes} times`);
      }
      const state = finalState.get(`${p.entity.type}:${p.entity.id}`);
      const present =
        p.kind === "refund"
          ? (state?.refunds ?? []).filter((r: { ref?: string }) => r.ref === p.mark).length === 1
          : p.kind === "note"
            ? (state?.notes ?? []).filter((n: { ref?: string }) => n.ref === p.mark).length === 1
            : (state?.tags ?? []).includes(p.mark);
      if (!present) {
        o.lost_updates++;
        problems.push(`${p.entity.type}:${p.entity.id}: applied change ${p.mark} is missing`);
      }
    } else if (final.status === "escalated") {
      o.escalated++;
      if (final.reason === "conflict_cycles_exhausted" && writes !== 0) {
        o.mismatches++;
        problems.push(`${key}: escalated after conflicts, but written ${writes} times`);
      }
      if (final.reason !== "conflict_cycles_exhausted" && patches.length === 0) {
        o.escalated_unsent++;
        problems.push(`${key}: escalated ${final.reason}, but no PATCH of it ever reached the records server`);
      }
    } else if (final.status === "rejected" && writes !== 0) {
      o.mismatches++;
      problems.push(`${key}: rejected, but written ${writes} times`);
    }
  }
  for (const z of opts.zombies) {
    const late = store
      .patchRequests()
      .filter((r) => r.owner !== null && z.sessions.some((s) => r.owner === `${z.name} ${s}`) && Date.parse(r.at) > z.resumedAt);
    o.zombie_writes += late.length;
    for (const r of late) problems.push(`zombie ${r.owner} sent a PATCH (${r.outcome}) after it was resumed`);
  }
  await checkPoison(opts, o, problems, replies);
  return { outcome: o, problems };
}

async function checkPoison(
  opts: { brokers: string[]; registryUrl: string | undefined; dlqTopic: string; poison: PoisonRound[]; store: DemoRecordsStore },
  o: Outcome,
  problems: string[],
  replies: Map<string, Reply[]>,
): Promise<void> {
  if (opts.poison.length === 0) return;
  const dlq = await readTopics<DeadLetter>(opts.brokers, opts.registryUrl, [opts.dlqTopic], async (codec, v) => {
    const d = await codec.decode("DeadLetter", v);
    return d.ok ? d.value : null;
  });
  const letters = dlq.get(opts.dlqTopic)?.values ?? [];
  const unmatched = [...letters];
  for (const round of opts.poison) {
    for (const p of round.poisons) {
      o.poison++;
      const at = unmatched.findIndex((d) => d.key === p.key && d.reason === p.expect);
      if (at >= 0) {
        o.poison_dead_lettered++;
        unmatched.splice(at, 1);
      } else {
        problems.push(`poison ${p.kind} on ${p.key}: no dead letter with reason ${p.expect}`);
      }
    }
    for (const f of round.followUps) {
      o.poison_follow_ups++;
      const applied = (replies.get(f.intentKey) ?? []).some((r) => r.status === "applied");
      const writes = opts.store.stats().writesByKey[f.intentKey] ?? 0;
      if (applied && writes === 1) o.poison_follow_ups_applied++;
      else problems.push(`intent after poison (${f.via}) ${f.intentKey}: ${applied ? "applied" : "not applied"}, written ${writes} times`);
    }
  }
}
