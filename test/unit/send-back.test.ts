// The console's send back (DeadLetterSender) over topics kept in memory: reads (readRecordsAt) answered from them,
// the producer a stand-in that keeps what it is given. Which dead letters of a request go, and in what order.
import type { Kafka } from "kafkajs";
import { describe, expect, it, vi } from "vitest";
import type { TopicRecord } from "../../src/cli/topic-reader.ts";
import { WireCodec } from "../../src/codec.ts";
import { DeadLetterSender } from "../../src/console/send-back.ts";
import type { ConsoleState } from "../../src/console/state.ts";
import { createLogger } from "../../src/logger.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import { acquire, INTENTS, letterOf, naming, other, step, type Original } from "./dlq-letters.ts";

/** The topics' records, by topic and `<partition>:<offset>`. */
const topics = vi.hoisted(() => new Map<string, Map<string, TopicRecord>>());

vi.mock("../../src/cli/topic-reader.ts", async (importOriginal) => {
  const real = await importOriginal<typeof import("../../src/cli/topic-reader.ts")>();
  return {
    ...real,
    readRecordsAt: async (_kafka: Kafka, topic: string, wanted: ReadonlyMap<number, ReadonlySet<bigint>>) => {
      const found = new Map<string, TopicRecord>();
      for (const [partition, offsets] of wanted) {
        for (const offset of offsets) {
          const r = topics.get(topic)?.get(real.atOffset(partition, offset));
          if (r !== undefined) found.set(real.atOffset(partition, offset), r);
        }
      }
      return { found, timedOut: false };
    },
  };
});

const DLQ = "writ.dlq";

function put(topic: string, partition: number, offset: string, key: string, value: Buffer): void {
  const records = topics.get(topic) ?? new Map<string, TopicRecord>();
  records.set(`${partition}:${offset}`, { topic, partition, offset, timestamp: "0", key: Buffer.from(key), value, headers: {} });
  topics.set(topic, records);
}

/**
 * A sender over `originals` (on the intents topic) and `letters` (at writ.dlq[0]@0…, as the console keeps them): what
 * it sends, in the order sent.
 */
function senderOver(originals: Original[], letters: DeadLetter[]) {
  topics.clear();
  for (const o of originals) put(INTENTS, o.partition, o.offset, o.key, o.value);
  for (const [i, l] of letters.entries()) put(DLQ, 0, String(i), l.key ?? "", Buffer.from(JSON.stringify(l)));
  const state = {
    deadLetterAt: (partition: number, offset: string) => (partition === 0 && letters[Number(offset)] ? { ...letters[Number(offset)]!, where: { topic: DLQ, partition, offset }, sentBack: null } : undefined),
    redriven: () => undefined,
  } as unknown as ConsoleState;
  const sent: string[] = [];
  const kafka = {
    admin: () => ({ connect: async () => undefined, disconnect: async () => undefined, fetchTopicMetadata: async () => ({ topics: [{ name: INTENTS, partitions: [{ partitionId: 0 }, { partitionId: 1 }] }] }) }),
    producer: () => ({
      connect: async () => undefined,
      disconnect: async () => undefined,
      send: async ({ messages }: { messages: { partition: number; value: Buffer }[] }) => {
        for (const m of messages) sent.push(m.value.toString());
        return [...new Set(messages.map((m) => m.partition))].map((partition) => ({ topicName: INTENTS, partition, errorCode: 0, baseOffset: "100" }));
      },
    }),
  } as unknown as Kafka;
  const sender = new DeadLetterSender({ kafka, codec: new WireCodec({}), state, topics: { intents: INTENTS, dlq: DLQ }, readTimeoutMs: 1_000, operatorId: "op", log: createLogger({ level: "silent" }) });
  return { sender, sent };
}

const at = (...offsets: number[]) => offsets.map((o) => ({ partition: 0, offset: String(o) }));

describe("the console's send back", () => {
  it("a forged truncated dead letter ahead of the real one (its key, sha256 and reason, another record's source) is refused source_changed; the real one is sent", async () => {
    const forged = letterOf(step, true, naming(other));
    for (const truncated of [false, true]) {
      const { sender, sent } = senderOver([other, step], [forged, letterOf(step, truncated)]);
      const results = await sender.sendBack(at(0, 1));
      expect([truncated, results.map((r) => r.outcome), sent]).toEqual([truncated, ["source_changed", "sent"], [step.value.toString()]]);
    }
  });

  it("sends a record's dead letters in their order on writ.dlq, whatever the order asked (the page lists the newest first)", async () => {
    const { sender, sent } = senderOver([acquire, step, other], [letterOf(acquire, true), letterOf(other, false), letterOf(step, false)]);
    const results = await sender.sendBack(at(2, 1, 0));
    expect(results.map((r) => [r.offset, r.outcome])).toEqual([
      ["2", "sent"],
      ["1", "sent"],
      ["0", "sent"],
    ]);
    expect(sent).toEqual([acquire.value.toString(), other.value.toString(), step.value.toString()]);
  });

  it("of a record dead-lettered twice, the first on writ.dlq goes, the other is same_record", async () => {
    const { sender, sent } = senderOver([step], [letterOf(step, false), letterOf(step, false)]);
    const results = await sender.sendBack(at(1, 0));
    expect(results.map((r) => [r.offset, r.outcome])).toEqual([
      ["1", "same_record"],
      ["0", "sent"],
    ]);
    expect(sent).toEqual([step.value.toString()]);
  });

  it("a truncated copy after a record's whole dead letter is same_record, its source not read (gone or not): the whole one goes", async () => {
    // the source offset of the copy is gone from the intents topic (retention): only the whole letter has the bytes
    const { sender, sent } = senderOver([], [letterOf(step, false), letterOf(step, true)]);
    const results = await sender.sendBack(at(0, 1));
    expect(results.map((r) => [r.offset, r.outcome])).toEqual([
      ["0", "sent"],
      ["1", "same_record"],
    ]);
    expect(sent).toEqual([step.value.toString()]);
  });
});

