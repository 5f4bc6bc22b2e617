import { randomBytes } from "node:crypto";
import fc from "fast-check";
import type { KafkaMessage } from "kafkajs";
import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { sha256Hex } from "../../../src/canonical-json.ts";
import { WireCodec } from "../../../src/codec.ts";
import { deadLetterOf, effects } from "../../../src/owner/effects.ts";
import { FORWARDED_HEADER } from "../../../src/owner/admission.ts";
import { encodeRecordBatch } from "../../../src/kafka/record-batch.ts";
import { ProduceLimits } from "../../../src/owner/produce-limits.ts";
import { FORWARDED_NULL_HEADERS, forwardOf, healRecord, HEAL_KEY, type OutRecord, RecordEncoder, sendRounds } from "../../../src/owner/records.ts";
import { CONTROL_HEADER } from "../../../src/schemas/control.ts";
import type { Escalation } from "../../../src/schemas/escalation.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import type { Reply } from "../../../src/schemas/reply.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";

const AT = "2025-06-01T12:00:00.000Z";
const LIMIT = 20_000;
const topics = { intents: "writ.intents", ledger: "writ.ledger", human: "writ.human", dlq: "writ.dlq" };
const encoder = (maxMessageBytes = LIMIT) => new RecordEncoder(new WireCodec({}), { maxMessageBytes, topics });
const REPLY_TO = "writ.replies.agent-1";
const entity = { type: "ticket", id: "T-1" };
const big = { body: "x".repeat(50_000) };
const base = { intentId: "intent-1", intentKey: "a".repeat(64), duplicate: false, at: AT };
const source = { topic: "writ.intents", partition: 2, offset: "99" };
const INTENT: WriteIntent = {
  intentId: "intent-1",
  intentKey: "a".repeat(64),
  entity,
  tool: "tag_ticket",
  agent: { id: "a", runId: "r", stepId: "s" },
  baseVersion: '"1"',
  delta: [{ op: "add", path: "/tags/-", value: "vip" }],
  params: { tag: "vip" },
  replyTo: REPLY_TO,
  createdAt: AT,
};

const BATCH_FIELDS = { producerId: 123_456_789n, producerEpoch: 7, firstSequence: 1_000_000, timestamp: Date.now(), transactional: true };
const parse = (r: OutRecord) => JSON.parse(r.value!.toString("utf8")) as Record<string, unknown>;

function kafkaMessage(value: Buffer, headers: Record<string, string> = {}): KafkaMessage {
  return { key: Buffer.from("ticket:T-1"), value, timestamp: "0", attributes: 0, offset: "99", headers } as KafkaMessage;
}

/** The intent record a result answers (what a reply that cannot be written is dead-lettered as). */
const ORIGIN = { message: kafkaMessage(Buffer.from("{}")), source };

// kafkajs's own record encoder: what a produce request does with a message's headers.
const encodeKafkaRecord = createRequire(import.meta.url)("kafkajs/src/protocol/recordBatch/record/v0") as (r: object) => { buffer: Buffer };

describe("RecordEncoder", () => {
  // Regression (hostile suite): Kafka allows a null header value, kafkajs cannot produce one. A record on the wrong
  // partition with a null header (any foreign client can send it, unsigned) made every forwarding transaction throw,
  // and the partition retried it forever.
  it("forwards a record whose headers hold null values: nulls dropped and named, repeats kept, a forged forward mark replaced", async () => {
    const message = {
      ...kafkaMessage(Buffer.from("{}")),
      headers: { "x-trace": null, tags: [Buffer.from("a"), null, "b"], ok: Buffer.from("1"), [FORWARDED_HEADER]: "0@0" },
    } as unknown as KafkaMessage;
    const [out] = await encoder().encode(effects({ forwards: [{ partition: 3, message, from: source }] }), 0, ORIGIN);
    expect(out).toMatchObject({ topic: "writ.intents", partition: 3, key: message.key });
    expect({ ...out!.headers }).toEqual({
      tags: [Buffer.from("a"), "b"],
      ok: Buffer.from("1"),
      [FORWARDED_NULL_HEADERS]: JSON.stringify(["x-trace", "tags"]),
      [FORWARDED_HEADER]: "2@99",
    });
    const m = sendRounds([out!], LIMIT)[0]![0]!.messages[0]!;
    expect(() => encodeKafkaRecord({ key: m.key, value: m.value, headers: m.headers })).not.toThrow();
  });

  it("sends an applied reply larger than maxMessageBytes without state, marked truncated, and it fits", async () => {
    const reply: Reply = { ...base, status: "applied", entity, state: big, version: '"7"', via: "patch" };
    const [out] = await encoder().encode(effects({ replies: [{ topic: REPLY_TO, value: reply }] }), 0, ORIGIN);
    expect(out).toMatchObject({ topic: REPLY_TO, key: "intent-1" });
    expect(out!.value!.length).toBeLessThanOrEqual(LIMIT);
    expect(parse(out!)).toMatchObject({ status: "applied", state: null, truncated: true, version: '"7"' });
  });

  it("sends a conflict reply too large for the broker with current.state left out, version and your_change kept", async () => {
    const reply: Reply = {
      ...base,
      status: "conflict",
      entity,
      cycle: 1,
      message: "changed",
      current: { state: big, version: '"8"' },
      your_change: [{ op: "add", path: "/tags/-", value: "vip" }],
    };
    const [out] = await encoder().encode(effects({ replies: [{ topic: REPLY_TO, value: reply }] }), 0, ORIGIN);
    expect(out!.value!.length).toBeLessThanOrEqual(LIMIT);
    expect(parse(out!)).toMatchObject({ current: { state: null, version: '"8"' }, truncated: true, your_change: reply.your_change });
  });

  it("leaves a reply that fits as it is", async () => {
    const reply: Reply = { ...base, status: "applied", entity, state: { tags: ["vip"] }, version: '"2"', via: "patch" };
    const [out] = await encoder().encode(effects({ replies: [{ topic: REPLY_TO, value: reply }] }), 0, ORIGIN);
    expect(parse(out!)).toEqual(reply);
  });

  it("sends an escalation too large for the broker with the record's state left out", async () => {
    const escalation: Escalation = {
      escalationId: "e-1",
      reason: "outcome_unknown",
      message: "check",
      intent: INTENT,
      cycles: 0,
      current: { state: big, version: '"3"' },
      at: AT,
    };
    const [out] = await encoder().encode(effects({ escalations: [{ key: "ticket:T-1", value: escalation }] }), 0, ORIGIN);
    expect(out).toMatchObject({ topic: "writ.human", key: "ticket:T-1" });
    expect(out!.value!.length).toBeLessThanOrEqual(LIMIT);
    expect(parse(out!)).toMatchObject({ current: { state: null, version: '"3"' }, escalationId: "e-1" });
  });

  it("keeps a prefix of a dead letter over the limit, with truncated, originalBytes and the sha256 of the whole original", async () => {
    const original = randomBytes(40_000);
    const d = deadLetterOf(kafkaMessage(original, { trace: "t" }), source, "too_large", "too big", AT);
    const [out] = await encoder().encode(effects({ deadLetters: [d] }), 0, ORIGIN);
    expect(out).toMatchObject({ topic: "writ.dlq", key: "ticket:T-1" });
    expect(out!.value!.length).toBeLessThanOrEqual(LIMIT);
    const v = parse(out!) as { valueBase64: string; truncated: boolean; originalBytes: number; sha256: string };
    const kept = Buffer.from(v.valueBase64, "base64");
    expect(kept.length).toBeGreaterThan(0);
    expect(kept.length).toBeLessThan(original.length);
    expect(kept.equals(original.subarray(0, kept.length))).toBe(true);
    expect(v).toMatchObject({ truncated: true, originalBytes: 40_000, sha256: sha256Hex(original) });
  });

  it("keeps a dead letter that fits whole", async () => {
    const original = Buffer.from("{not json");
    const [out] = await encoder().encode(effects({ deadLetters: [deadLetterOf(kafkaMessage(original), source, "undecodable", "x", AT)] }), 0, ORIGIN);
    expect(parse(out!)).toMatchObject({ truncated: false, valueBase64: original.toString("base64"), originalBytes: original.length });
  });

  // Regression: a dead letter was trimmed to (limit - 16,384) * 3/4 bytes of payload,
  // a margin that assumes the envelope's other fields stay under 16 KiB. deadLetterOf bounds the copied headers
  // by 16,384 UTF-16 code units, not bytes: non-ASCII header text takes 2–3 bytes per unit in UTF-8 (control
  // characters 6, as JSON escapes), so the trimmed dead letter still exceeds maxMessageBytes. The broker refuses
  // the record, the transaction fails, and the same intent record fails it again after every restart.
  it("a trimmed dead letter fits maxMessageBytes even when the original record carried large non-ASCII headers", async () => {
    const headers: Record<string, string> = {};
    for (let i = 0; i < 16; i++) headers[`h${i}`] = "€".repeat(1_000);
    const original = randomBytes(200_000);
    const d = deadLetterOf(kafkaMessage(original, headers), source, "too_large", "too big", AT);
    const [out] = await encoder(100_000).encode(effects({ deadLetters: [d] }), 0, ORIGIN);
    expect(out!.value!.length).toBeLessThanOrEqual(100_000);
  });

  it("puts the ledger entry first, on the ledger partition it is given, keyed by intent key", async () => {
    const entry: LedgerIntentEntry = {
      kind: "intent",
      intentKey: "a".repeat(64),
      intentId: "intent-1",
      status: "done",
      entity,
      tool: "tag_ticket",
      fingerprint: "f",
      attempts: [{ baseVersion: '"1"', deltaFingerprint: "d" }],
      cycles: 0,
      outcome: { status: "applied", version: '"2"', via: "patch", at: AT },
      replyTo: REPLY_TO,
      updatedAt: AT,
    };
    const reply: Reply = { ...base, status: "applied", entity, state: null, version: '"2"', via: "patch" };
    const out = await encoder().encode(effects({ ledger: entry, replies: [{ topic: REPLY_TO, value: reply }] }), 5, ORIGIN);
    expect(out.map((r) => [r.topic, r.partition, r.key])).toEqual([
      ["writ.ledger", 5, "a".repeat(64)],
      [REPLY_TO, undefined, "intent-1"],
    ]);
    expect(encoder().tombstone("k", 5)).toEqual({ topic: "writ.ledger", partition: 5, key: "k", value: null });
  });

  it("refuses to encode a value that is not a valid wire value", async () => {
    const bad = { ...base, status: "applied", entity, state: null, version: "", via: "patch" } as Reply;
    await expect(encoder().encode(effects({ replies: [{ topic: REPLY_TO, value: bad }] }), 0, ORIGIN)).rejects.toMatchObject({ code: "codec_failed" });
  });
});

describe("RecordEncoder: every record fits what its topic takes", () => {
  const MAX_INTENT = 4_096;
  const intent: WriteIntent = { ...INTENT, delta: [{ op: "replace", path: "/tags", value: ["x".repeat(MAX_INTENT - 600)] }] };
  const origin = { message: kafkaMessage(Buffer.from(JSON.stringify(intent))), source };
  /** The batch the owner's producer sends for `r` alone (src/kafka/record-batch.ts). */
  const batchBytes = (r: OutRecord) => encodeRecordBatch([{ key: r.key, value: r.value, headers: r.headers }], BATCH_FIELDS);
  /** A record state of about `bytes` bytes of JSON, of ASCII, of two-byte or of escaped characters. */
  const stateOf = (bytes: number, char: string) => ({ body: char.repeat(Math.ceil(bytes / Buffer.byteLength(JSON.stringify(char).slice(1, -1)))) });

  const replyOf = (kind: "applied" | "conflict" | "rejected" | "escalated", state: unknown, i: number): Reply => {
    const ids = { ...base, intentId: `intent-${i}` };
    switch (kind) {
      case "applied":
        return { ...ids, status: "applied", entity, state, version: '"7"', via: "patch" };
      case "conflict":
        return { ...ids, status: "conflict", entity, cycle: 1, message: "changed", current: { state, version: '"8"' }, your_change: intent.delta };
      case "rejected":
        return { ...ids, status: "rejected", reason: "undo_failed", message: "m".repeat(2_000), details: { current: { state, version: '"8"' } } };
      case "escalated":
        return { ...ids, status: "escalated", entity, reason: "outcome_unknown", message: "m".repeat(2_000), escalationId: "e-1" };
    }
  };

  it("property: replies, escalations, forwards and dead letters of any size, under any limit learned of the reply topics, fit as the batch the owner sends; each is written, trimmed and marked, or dead-lettered with what it could not carry", async () => {
    const reply = fc.record({
      kind: fc.constantFrom("applied" as const, "conflict" as const, "rejected" as const, "escalated" as const),
      topic: fc.constantFrom("writ.replies.a", "writ.replies.b"),
      stateBytes: fc.integer({ min: 0, max: 120_000 }),
      char: fc.constantFrom("x", "é", "\u0001", "€"),
    });
    await fc.assert(
      fc.asyncProperty(
        fc.integer({ min: 2 * MAX_INTENT + 20_480, max: 150_000 }),
        fc.dictionary(fc.constantFrom("writ.replies.a", "writ.replies.b", "writ.human", "writ.intents"), fc.integer({ min: 0, max: 60_000 })),
        fc.array(reply, { maxLength: 4 }),
        fc.option(fc.integer({ min: 0, max: 120_000 }), { nil: undefined }),
        fc.array(fc.record({ headerBytes: fc.integer({ min: 0, max: 200_000 }), partition: fc.nat({ max: 5 }) }), { maxLength: 2 }),
        fc.array(fc.record({ valueBytes: fc.integer({ min: 0, max: 200_000 }), headerChars: fc.integer({ min: 0, max: 2_000 }) }), { maxLength: 2 }),
        async (maxMessageBytes, learned, replies, escalationState, forwards, deadLetters) => {
          const limits = new ProduceLimits(maxMessageBytes);
          for (const [topic, bytes] of Object.entries(learned)) limits.described(topic, bytes);
          const enc = new RecordEncoder(new WireCodec({}), { maxMessageBytes, topics }, { limits });
          const fx = effects({
            replies: replies.map((r, i) => ({ topic: r.topic, value: replyOf(r.kind, stateOf(r.stateBytes, r.char), i) })),
            escalations:
              escalationState === undefined
                ? []
                : [{ key: "ticket:T-1", value: { escalationId: "e-1", reason: "outcome_unknown", message: "check", intent, cycles: 0, current: { state: stateOf(escalationState, "x"), version: '"3"' }, at: AT } }],
            forwards: forwards.map((f) => ({ partition: f.partition, message: { ...origin.message, headers: { pad: "h".repeat(f.headerBytes) } } as KafkaMessage, from: source })),
            deadLetters: deadLetters.map((d) => {
              const headers: Record<string, string> = {};
              for (let i = 0; i < 16; i++) headers[`h${i}`] = "\u0001".repeat(d.headerChars);
              return deadLetterOf(kafkaMessage(randomBytes(d.valueBytes), headers), source, "too_large", "big", AT);
            }),
          });

          const out = await enc.encode(fx, 0, origin);

          // What each topic takes, as the test set it: the encoder's limits are not asked.
          const takes = (topic: string) => Math.min(maxMessageBytes, learned[topic] ?? Number.POSITIVE_INFINITY);
          for (const r of out) expect(batchBytes(r).length, `${r.topic} ${String(r.key)}`).toBeLessThanOrEqual(takes(r.topic));
          const dead = out.filter((r) => r.topic === topics.dlq).map(parse);
          const undeliverable = dead.filter((d) => d.reason === "undeliverable") as { undelivered: { topic: string; value: Record<string, unknown> | null } }[];
          fx.replies.forEach((r) => {
            const written = out.find((o) => o.topic === r.topic && o.key === r.value.intentId);
            const parked = undeliverable.filter((d) => d.undelivered.topic === r.topic && (d.undelivered.value === null || d.undelivered.value.intentId === r.value.intentId));
            expect(Number(written !== undefined) + Math.min(parked.length, 1), `reply ${r.value.intentId} written or dead-lettered`).toBe(1);
            if (written) {
              const sent = parse(written);
              if (sent.truncated !== true) expect(sent).toEqual(JSON.parse(JSON.stringify(r.value)));
              else if (r.value.status === "applied") expect(sent).toMatchObject({ intentId: r.value.intentId, state: null, version: r.value.version });
              else if (r.value.status === "conflict") expect(sent).toMatchObject({ current: { state: null, version: r.value.current.version }, your_change: r.value.your_change });
              else expect(sent).toMatchObject({ status: "rejected", reason: "undo_failed", message: "m".repeat(2_000) });
              if (sent.truncated === true) expect(sent).not.toHaveProperty("details");
            }
          });
          if (escalationState !== undefined) {
            const written = out.filter((o) => o.topic === topics.human).map(parse);
            const parked = undeliverable.filter((d) => d.undelivered.topic === topics.human);
            expect(written.length + parked.length).toBe(1);
            if (written[0]?.truncated === true) expect(written[0]).toMatchObject({ current: { state: null, version: '"3"' }, intent });
          }
          const forwarded = out.filter((o) => o.topic === topics.intents);
          const notForwarded = dead.filter((d) => d.reason === "too_large" && String(d.message).startsWith("forwarded to partition"));
          expect(forwarded.length + notForwarded.length).toBe(forwards.length);
          expect(dead.filter((d) => d.message === "big")).toHaveLength(deadLetters.length);
        },
      ),
      { numRuns: 60 },
    );
  });

  it("a reply whose state cannot be written at all (nested past what JSON.stringify can recurse, from an adapter other than writ's) goes out without it, marked truncated", async () => {
    let deep: unknown = {};
    for (let i = 0; i < 200_000; i++) deep = { a: deep };
    const reply: Reply = { ...base, status: "applied", entity, state: deep, version: '"7"', via: "patch" };
    const [out] = await encoder().encode(effects({ replies: [{ topic: REPLY_TO, value: reply }] }), 0, ORIGIN);
    expect(parse(out!)).toMatchObject({ status: "applied", state: null, truncated: true, version: '"7"' });
  });

  it("a reply that does not fit its topic even without the state is not written: the intent's record is dead-lettered undeliverable, with the reply", async () => {
    const limits = new ProduceLimits(LIMIT);
    limits.described(REPLY_TO, 200);
    const reply: Reply = { ...base, status: "applied", entity, state: big, version: '"7"', via: "patch" };
    const out = await new RecordEncoder(new WireCodec({}), { maxMessageBytes: LIMIT, topics }, { limits }).encode(
      effects({ replies: [{ topic: REPLY_TO, value: reply }] }),
      0,
      { message: kafkaMessage(Buffer.from('{"intent":1}')), source },
    );
    expect(out.map((r) => r.topic)).toEqual(["writ.dlq"]);
    expect(parse(out[0]!)).toMatchObject({
      reason: "undeliverable",
      source,
      key: "ticket:T-1",
      valueBase64: Buffer.from('{"intent":1}').toString("base64"),
      undelivered: { topic: REPLY_TO, value: { status: "applied", intentId: "intent-1", state: null, truncated: true } },
    });
    expect(String(parse(out[0]!).message)).toMatch(/over the 200 writ\.replies\.agent-1 takes/);
  });

  it("a record to forward whose headers make it larger than the intents topic takes is dead-lettered too_large instead", async () => {
    const message = { ...kafkaMessage(Buffer.from("{}")), headers: { pad: "h".repeat(30_000) } } as KafkaMessage;
    const out = await encoder().encode(effects({ forwards: [{ partition: 4, message, from: source }] }), 0, ORIGIN);
    expect(out.map((r) => r.topic)).toEqual(["writ.dlq"]);
    expect(parse(out[0]!)).toMatchObject({ reason: "too_large", source, key: "ticket:T-1", valueBase64: Buffer.from("{}").toString("base64") });
    expect(String(parse(out[0]!).message)).toMatch(/^forwarded to partition 4 \(its key's\) it would take \d+ bytes with its headers, over the 20000 writ\.intents takes/);
  });
});

describe("a forward's record", () => {
  /** A message whose headers count how often they are walked (each walk builds the forwarded headers once). */
  function countedMessage(pad: number): { message: KafkaMessage; walks: () => number } {
    let walks = 0;
    const headers = new Proxy({ pad: "h".repeat(pad), "x-trace": "t" } as Record<string, string>, {
      ownKeys(target) {
        walks++;
        return Reflect.ownKeys(target);
      },
    });
    return { message: { ...kafkaMessage(Buffer.from("{}")), headers } as KafkaMessage, walks: () => walks };
  }

  // The owner's hot path: admission measures a forward (to refuse one too large), and its encoding wrote it. Each
  // built the forwarded headers again (three walks of them, megabytes where a compressed batch inflates).
  it("is built and measured once: the owner's size check and the encoding share it, for a forward that fits and one refused too_large", async () => {
    // A forward refused is dead-lettered, and its dead letter keeps the headers it can (one walk of its own).
    for (const [pad, topic, expected] of [
      [100, "writ.intents", 1],
      [30_000, "writ.dlq", 2],
    ] as const) {
      const { message, walks } = countedMessage(pad);
      const e = encoder();
      const forward = forwardOf({ partition: 4, message, from: source });
      const refused = e.unforwardable(forward);
      const out = await e.encode(effects(refused ? { deadLetters: [refused] } : { forwards: [forward] }), 0, ORIGIN);
      expect(out.map((r) => r.topic)).toEqual([topic]);
      expect(walks()).toBe(expected);
      // Without the owner's check first (as encode alone does): the same records.
      const again = countedMessage(pad);
      const alone = await e.encode(effects({ forwards: [{ partition: 4, message: again.message, from: source }] }), 0, ORIGIN);
      expect(alone.map((r) => r.topic)).toEqual([topic]);
      expect(again.walks()).toBe(expected);
      if (!refused) expect(alone[0]).toEqual(out[0]);
    }
  });
});

describe("sendRounds", () => {
  /** A lower bound of what the record adds to a produce request: its key, value and headers. */
  const payload = (m: { key?: unknown; value?: unknown; headers?: unknown }) => {
    let n = String(m.key ?? "").length + ((m.value as Buffer | null)?.length ?? 0);
    for (const [k, v] of Object.entries((m.headers as Record<string, string>) ?? {})) n += k.length + v.length;
    return n;
  };

  it("sends a record larger than maxBytes in a round of its own for its topic", () => {
    const records: OutRecord[] = [
      { topic: "a", key: "1", value: Buffer.alloc(100) },
      { topic: "a", key: "2", value: Buffer.alloc(5_000) },
      { topic: "a", key: "3", value: Buffer.alloc(100) },
    ];
    const rounds = sendRounds(records, 1_000);
    expect(rounds.map((r) => r.map((t) => t.messages.map((m) => m.key)))).toEqual([[["1"]], [["2"]], [["3"]]]);
  });

  it("keeps small records of several topics in one round", () => {
    const records: OutRecord[] = [
      { topic: "writ.ledger", partition: 3, key: "k", value: Buffer.from("{}") },
      { topic: REPLY_TO, key: "i", value: Buffer.from("{}") },
      healRecord("writ.dlq", 1),
    ];
    const rounds = sendRounds(records, 1_000_000);
    expect(rounds).toHaveLength(1);
    expect(rounds[0]).toEqual([
      { topic: "writ.ledger", messages: [{ key: "k", value: Buffer.from("{}"), partition: 3 }] },
      { topic: REPLY_TO, messages: [{ key: "i", value: Buffer.from("{}") }] },
      // Keyed: the compacted ledger refuses a record without a key, and heal records go there too.
      { topic: "writ.dlq", messages: [{ key: HEAL_KEY, value: null, partition: 1, headers: { [CONTROL_HEADER]: "heal" } }] },
    ]);
  });

  it("never puts more than maxBytes of one topic in one round, and keeps every record, its order per topic, partition and headers", () => {
    const record = fc.record(
      {
        topic: fc.constantFrom("writ.ledger", "writ.replies.a", "writ.dlq"),
        size: fc.nat({ max: 3_000 }),
        partition: fc.option(fc.nat({ max: 11 }), { nil: undefined }),
        headers: fc.option(fc.dictionary(fc.string({ maxLength: 8 }), fc.string({ maxLength: 40 }), { maxKeys: 3 }), { nil: undefined }),
      },
      { requiredKeys: ["topic", "size"] },
    );
    fc.assert(
      fc.property(fc.array(record, { maxLength: 60 }), fc.integer({ min: 200, max: 10_000 }), (specs, maxBytes) => {
        const records: OutRecord[] = specs.map((s, i) => ({
          topic: s.topic,
          key: `r${i}`,
          value: Buffer.alloc(s.size, i % 256),
          ...(s.partition === undefined ? {} : { partition: s.partition }),
          ...(s.headers === undefined ? {} : { headers: s.headers }),
        }));
        const rounds = sendRounds(records, maxBytes);
        const sent = new Map<string, unknown[]>();
        for (const round of rounds) {
          expect(new Set(round.map((t) => t.topic)).size).toBe(round.length);
          for (const { topic, messages } of round) {
            expect(messages.length).toBeGreaterThan(0);
            if (messages.length > 1) expect(messages.reduce((n, m) => n + payload(m), 0)).toBeLessThanOrEqual(maxBytes);
            sent.set(topic, [...(sent.get(topic) ?? []), ...messages]);
          }
        }
        for (const t of new Set(records.map((r) => r.topic))) {
          const expected = records
            .filter((r) => r.topic === t)
            .map((r) => ({
              key: r.key,
              value: r.value,
              ...(r.partition === undefined ? {} : { partition: r.partition }),
              ...(r.headers === undefined ? {} : { headers: r.headers }),
            }));
          expect(sent.get(t)).toEqual(expected);
        }
        expect([...sent.values()].reduce((n, m) => n + m.length, 0)).toBe(records.length);
      }),
      { numRuns: 300 },
    );
  });
});
