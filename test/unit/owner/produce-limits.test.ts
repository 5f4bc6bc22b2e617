// What each topic takes of an owner's records (src/owner/produce-limits.ts): Produce requests sized per topic and
// in all, a size refusal learned (one record per request until a commit, then the refused record's topic limited),
// and the real batch an owner sends for a record within what it measures. At the broker: oversize-records.test.ts.
import fc from "fast-check";
import type { TopicMessages } from "kafkajs";
import { describe, expect, it } from "vitest";
import { encodeRecordBatch } from "../../../src/kafka/record-batch.ts";
import { BATCH_OVERHEAD_BYTES, isSizeRefusal, LEARNED_LIMIT_TTL_MS, type OutRecord, ProduceLimits, recordBytes, roundsOf } from "../../../src/owner/produce-limits.ts";

const FIELDS = { producerId: 123_456_789n, producerEpoch: 7, firstSequence: 1_000_000, timestamp: Date.now(), transactional: true };

/** The batch the owner's producer sends for `r` alone, byte for byte (src/kafka/record-batch.ts). */
const batchBytes = (r: OutRecord) => encodeRecordBatch([{ key: r.key, value: r.value, headers: r.headers }], FIELDS).length;

const tooLarge = () => Object.assign(new Error("The request included a message larger than the max message size the server will accept"), { type: "MESSAGE_TOO_LARGE", code: 10 });

/** A transaction that refuses (MESSAGE_TOO_LARGE) a request holding a record of `topic` over `limit` bytes as a batch of its own. */
function refusingTxn(topic: string, limit: number) {
  const sent: TopicMessages[][] = [];
  return {
    sent,
    async send(round: readonly TopicMessages[]) {
      for (const t of round) for (const m of t.messages) if (t.topic === topic && batchBytes({ topic, key: m.key ?? null, value: (m.value as Buffer) ?? null }) > limit) throw tooLarge();
      sent.push([...round]);
    },
  };
}

describe("recordBytes", () => {
  it("is never less than the batch the owner sends for the record alone, less the batch's header (any key, value and headers)", () => {
    const bytes = fc.uint8Array({ maxLength: 70_000 }).map((a) => Buffer.from(a));
    const text = fc.string({ unit: "grapheme", maxLength: 2_000 });
    fc.assert(
      fc.property(
        fc.option(fc.oneof(text, bytes), { nil: null }),
        fc.option(bytes, { nil: null }),
        fc.dictionary(fc.string({ maxLength: 40 }), fc.oneof(text, bytes, fc.array(fc.oneof(text, bytes), { maxLength: 3 })), { maxKeys: 5 }),
        (key, value, headers) => {
          const r: OutRecord = { topic: "t", key, value, headers };
          expect(batchBytes(r)).toBeLessThanOrEqual(recordBytes(r) + BATCH_OVERHEAD_BYTES);
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("roundsOf", () => {
  const record = (topic: string, size: number, key = "k"): OutRecord => ({ topic, key, value: Buffer.alloc(size) });

  it("one record per round when isolating, in order", () => {
    const records = [record("a", 10, "1"), record("b", 10, "2"), record("a", 10, "3")];
    expect(roundsOf(records, 1_000_000, { isolate: true }).map((r) => r.map((x) => x.key))).toEqual([["1"], ["2"], ["3"]]);
  });

  it("property: each topic's records in a round fit its limit with a batch's header, a round's records fit maxRoundBytes, and every record is sent once, in its topic's order", () => {
    const spec = fc.record({ topic: fc.constantFrom("writ.ledger", "writ.replies.a", "writ.replies.b", "writ.dlq"), size: fc.nat({ max: 5_000 }) });
    fc.assert(
      fc.property(fc.array(spec, { maxLength: 80 }), fc.dictionary(fc.constantFrom("writ.replies.a", "writ.replies.b"), fc.integer({ min: 0, max: 8_000 })), fc.integer({ min: 200, max: 20_000 }), (specs, learned, maxRoundBytes) => {
        const records = specs.map((s, i) => record(s.topic, s.size, `r${i}`));
        const limitOf = (topic: string) => learned[topic] ?? 10_000;
        const rounds = roundsOf(records, limitOf, { maxRoundBytes });
        for (const round of rounds) {
          expect(round.length).toBeGreaterThan(0);
          // A batch's header per topic (a topic's partitions are batches of their own, each within the topic's bytes).
          const total = round.reduce((n, r) => n + recordBytes(r), 0) + BATCH_OVERHEAD_BYTES * new Set(round.map((r) => r.topic)).size;
          if (round.length > 1) expect(total).toBeLessThanOrEqual(maxRoundBytes);
          for (const topic of new Set(round.map((r) => r.topic))) {
            const mine = round.filter((r) => r.topic === topic);
            if (mine.length > 1) expect(mine.reduce((n, r) => n + recordBytes(r), BATCH_OVERHEAD_BYTES)).toBeLessThanOrEqual(limitOf(topic));
          }
        }
        const flat = rounds.flat();
        expect(flat).toHaveLength(records.length);
        for (const topic of new Set(records.map((r) => r.topic))) {
          expect(flat.filter((r) => r.topic === topic).map((r) => r.key)).toEqual(records.filter((r) => r.topic === topic).map((r) => r.key));
        }
      }),
      { numRuns: 300 },
    );
  });
});

describe("ProduceLimits", () => {
  it("tells a size refusal by its type anywhere in the cause chain, and nothing else", () => {
    expect(isSizeRefusal(tooLarge())).toBe(true);
    expect(isSizeRefusal(new Error("x", { cause: { type: "RECORD_LIST_TOO_LARGE" } }))).toBe(true);
    expect(isSizeRefusal({ originalError: tooLarge() })).toBe(true);
    expect(isSizeRefusal(Object.assign(new Error("x"), { type: "NOT_LEADER_OR_FOLLOWER" }))).toBe(false);
    expect(isSizeRefusal(null)).toBe(false);
  });

  it("a refusal in a request of several records: the partition isolates; the next one names its record and teaches its topic's limit; a commit ends the isolation", async () => {
    const limits = new ProduceLimits(1_000_000);
    const records: OutRecord[] = [
      { topic: "writ.ledger", partition: 0, key: "k", value: Buffer.alloc(300) },
      { topic: "writ.replies.small", key: "intent-1", value: Buffer.alloc(50_000) },
      { topic: "writ.replies.ok", key: "intent-2", value: Buffer.alloc(2_000) },
    ];
    const learned: unknown[] = [];
    const txn = refusingTxn("writ.replies.small", 4_000);

    await expect(limits.send(txn, records, 3, (l) => learned.push(l))).rejects.toMatchObject({ type: "MESSAGE_TOO_LARGE" });
    expect(learned).toEqual([null]);
    // The refused transaction carried intents up to offset 8 (the commit loop says so): isolated until progress passes it.
    limits.isolateUntil(3, 8n);
    expect(limits.isolates(3)).toBe(true);
    expect(limits.isolates(4)).toBe(false);
    expect(limits.of("writ.replies.small")).toBe(1_000_000);

    // The partition's next transaction: one record per request, and the refused one is named.
    const again = refusingTxn("writ.replies.small", 4_000);
    await expect(limits.send(again, records, 3, (l) => learned.push(l))).rejects.toMatchObject({ type: "MESSAGE_TOO_LARGE" });
    expect(again.sent.map((round) => round.map((t) => t.topic))).toEqual([["writ.ledger"]]);
    const bytes = recordBytes(records[1]!) + BATCH_OVERHEAD_BYTES;
    expect(learned[1]).toEqual({ topic: "writ.replies.small", bytes });
    expect(limits.of("writ.replies.small")).toBe(bytes - 1);
    expect(limits.of("writ.replies.ok")).toBe(1_000_000);
    expect(limits.fits(records[1]!)).toBe(false);

    // Commits landing before the refused intents run again do not end it: `pending` entries alone, or other intents'
    // results whose progress stays below the refused ones (ending it there sent the refused record in a request of
    // several again, refused unnamed on every reopening).
    limits.committed(3, null);
    limits.committed(3, 5n);
    expect(limits.isolates(3)).toBe(true);
    // A restore's marker and heal are sent as usual meanwhile.
    const heal = refusingTxn("writ.replies.small", 4_000);
    await limits.send(heal, [records[0]!, records[2]!], 3, undefined, { isolate: false });
    expect(heal.sent).toHaveLength(1);

    // What the encoder writes for that topic within what it took now goes through; progress past 8 ends the isolation.
    const trimmed = [records[0]!, { ...records[1]!, value: Buffer.alloc(500) }, records[2]!];
    const third = refusingTxn("writ.replies.small", 4_000);
    await limits.send(third, trimmed, 3);
    expect(third.sent).toHaveLength(3);
    limits.committed(3, 8n);
    expect(limits.isolates(3)).toBe(false);
    // A refusal that carried no intent's result (isolateUntil never called) ends at the next commit.
    const other: OutRecord[] = [records[0]!, { topic: "writ.replies.other", key: "intent-3", value: Buffer.alloc(2_000) }];
    await expect(limits.send(refusingTxn("writ.replies.other", 1_000), other, 4)).rejects.toMatchObject({ type: "MESSAGE_TOO_LARGE" });
    expect(limits.isolates(4)).toBe(true);
    limits.committed(4, null);
    expect(limits.isolates(4)).toBe(false);
  });

  it("a learned limit only ever goes down while it holds, and lapses after an hour; a topic's configs replace it", () => {
    let now = 1_000_000;
    const limits = new ProduceLimits(100_000, { now: () => now });
    const r = (size: number): OutRecord => ({ topic: "t", key: "k", value: Buffer.alloc(size) });
    limits.refused(0, [r(50_000)]);
    const first = limits.of("t");
    expect(first).toBeLessThan(50_200);
    limits.refused(0, [r(60_000)]);
    expect(limits.of("t")).toBe(first);
    now += LEARNED_LIMIT_TTL_MS;
    expect(limits.of("t")).toBe(100_000);
    limits.described("t", 4_000);
    expect(limits.of("t")).toBe(4_000);
    limits.described("t", 2_000_000);
    expect(limits.of("t")).toBe(100_000);
    limits.described("u", 0);
    expect(limits.fits({ topic: "u", key: null, value: null })).toBe(false);
  });
});
