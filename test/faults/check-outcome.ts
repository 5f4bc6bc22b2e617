import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { WireCodec } from "../../src/codec.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import type { DemoRecordsServer } from "../../src/sor/demo-records-server.ts";
import type { PlannedIntent } from "./agent-load.ts";

export interface Outcome {
  intents: number;
  applied: number;
  /** Intent keys written more than once at the records server. */
  duplicates: number;
  /** Changes reported applied that the final record lacks, or version chains with a gap. */
  lost_updates: number;
  /** Intents with no applied/rejected/escalated reply on their reply topic. */
  unanswered: number;
  /** Answers that disagree with the records server (applied without a write, or a write without applied). */
  mismatches: number;
  /** PATCH requests that reached the server after that intent's write had committed: a retry layer that replayed. */
  patches_after_commit: number;
  max_patches_per_intent: number;
  conflicts_answered: number;
  escalated: number;
}

/** Reads every reply on the agents' reply topics (read_committed) and groups them by intent key. */
async function repliesByKey(brokers: string[], registryUrl: string | undefined, topics: string[]): Promise<Map<string, Reply[]>> {
  const kafka = new Kafka({ clientId: "fault-check", brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  let expected = 0;
  for (const t of topics) for (const p of await admin.fetchTopicOffsets(t)) expected += Number(p.high) - Number(p.low);
  await admin.disconnect();
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl });
  const out = new Map<string, Reply[]>();
  const consumer = kafka.consumer({ groupId: `fault-check-${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 500 });
  await consumer.connect();
  await consumer.subscribe({ topics, fromBeginning: true });
  let seen = 0;
  let lastProgress = Date.now();
  await consumer.run({
    eachMessage: async ({ message }) => {
      seen++;
      lastProgress = Date.now();
      const d = await codec.decode("Reply", message.value);
      if (!d.ok) return;
      const list = out.get(d.value.intentKey) ?? [];
      list.push(d.value);
      out.set(d.value.intentKey, list);
    },
  });
  // read_committed skips aborted records, so the count read may stay below the offsets' span: stop when reading stalls.
  while (seen < expected && Date.now() - lastProgress < 10_000) await new Promise((r) => setTimeout(r, 200));
  await consumer.disconnect();
  return out;
}

export async function checkOutcome(opts: {
  intents: PlannedIntent[];
  records: DemoRecordsServer;
  brokers: string[];
  registryUrl: string | undefined;
  replyTopics: string[];
  entities: { type: string; id: string }[];
}): Promise<{ outcome: Outcome; problems: string[] }> {
  const { intents, records } = opts;
  const problems: string[] = [];
  const writesByKey = records.stats().writesByKey;
  const finalState = new Map<string, any>();
  let lost = 0;
  for (const e of opts.entities) {
    const history = records.history(e.type, e.id);
    for (let i = 1; i < history.length; i++) {
      if (history[i]!.fromVersion !== history[i - 1]!.toVersion) {
        lost++;
        problems.push(`${e.type}:${e.id}: version chain broken at v${history[i]!.fromVersion}`);
      }
    }
    finalState.set(`${e.type}:${e.id}`, history.at(-1)?.state);
  }
  const replies = await repliesByKey(opts.brokers, opts.registryUrl, opts.replyTopics);
  const o: Outcome = {
    intents: intents.length,
    applied: 0,
    duplicates: 0,
    lost_updates: 0,
    unanswered: 0,
    mismatches: 0,
    patches_after_commit: 0,
    max_patches_per_intent: 0,
    conflicts_answered: 0,
    escalated: 0,
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
    if (definitive.length === 0 || !p.final) {
      o.unanswered++;
      problems.push(`${p.agent} ${p.mark}: no final reply (${onTopic.length} replies on the topic)`);
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
    } else if (final.status === "rejected" && writes !== 0) {
      o.mismatches++;
      problems.push(`${key}: rejected, but written ${writes} times`);
    }
    const patches = records.patchRequests(key);
    o.max_patches_per_intent = Math.max(o.max_patches_per_intent, patches.length);
    const committedAt = patches.findIndex((r) => r.outcome === "applied");
    if (committedAt >= 0 && committedAt < patches.length - 1) {
      const after = patches.length - 1 - committedAt;
      o.patches_after_commit += after;
      problems.push(`${key}: ${after} PATCH request(s) after its write committed (${patches.map((r) => r.outcome).join(" → ")})`);
    }
  }
  return { outcome: o, problems };
}
