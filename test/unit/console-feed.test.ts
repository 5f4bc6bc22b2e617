// The console's feed (src/console/feed.ts) over a mocked kafkajs client: how many consumers it keeps for reply
// topics that come and go, what it subscribes them to, and where a restarted reader resumes.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { WireCodec } from "../../src/codec.ts";
import { startFeed } from "../../src/console/feed.ts";
import { ConsoleState } from "../../src/console/state.ts";
import { waitFor } from "../helpers/wait-for.ts";

const contract = ["writ.intents", "writ.human", "writ.dlq"];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function mockKafka() {
  const cluster = { topics: [...contract] };
  type EachMessage = (m: { topic: string; partition: number; message: { offset: string; timestamp: string; key: Buffer | null; value: Buffer | null; headers?: Record<string, Buffer> } }) => Promise<void>;
  const consumers: { topics: string[]; live: boolean; seeks: { topic: string; partition: number; offset: string }[]; eachMessage?: EachMessage }[] = [];
  const admin = () => ({
    connect: async () => {},
    disconnect: async () => {},
    listTopics: async () => [...cluster.topics],
    fetchTopicOffsets: async () => [{ partition: 0, low: "0", high: "10" }],
    deleteGroups: async () => {},
    fetchTopicMetadata: async () => ({ topics: [{ partitions: [] }] }),
    fetchOffsets: async () => [],
  });
  const kafka = {
    admin,
    consumer: () => {
      const c: (typeof consumers)[number] = { topics: [], live: false, seeks: [] };
      consumers.push(c);
      return {
        events: { END_BATCH_PROCESS: "e", CRASH: "c" },
        on: () => {},
        connect: async () => void (c.live = true),
        subscribe: async ({ topics }: { topics: string[] }) => void (c.topics = topics),
        run: async ({ eachMessage }: { eachMessage: EachMessage }) => void (c.eachMessage = eachMessage),
        seek: (s: { topic: string; partition: number; offset: string }) => void c.seeks.push(s),
        disconnect: async () => void (c.live = false),
      };
    },
  };
  return { cluster, consumers, kafka };
}

const feedOf = (kafka: ReturnType<typeof mockKafka>["kafka"], state: ConsoleState) =>
  startFeed({
    kafka: kafka as never,
    brokers: ["127.0.0.1:9"],
    codec: new WireCodec({}),
    state,
    topics: { intents: "writ.intents", human: "writ.human", dlq: "writ.dlq" },
    replyPrefix: "writ.replies.",
    groupId: "writ.owners",
    backlog: 10,
    discoverIntervalMs: 50,
    lagIntervalMs: 1_000_000,
    log: pino({ level: "silent" }),
  });

describe("console feed", () => {
  it("hands the state each writ.human record's Kafka key: one not keyed by its intent's entity is not kept", async () => {
    const { consumers, kafka } = mockKafka();
    const state = new ConsoleState({ intents: "writ.intents", human: "writ.human", dlq: "writ.dlq", replyPrefix: "writ.replies." });
    const feed = feedOf(kafka, state);
    try {
      await feed.started;
      const reader = await waitFor(() => consumers.find((c) => c.topics.includes("writ.human") && c.eachMessage)?.eachMessage, { timeoutMs: 5000 });
      const at = "2026-01-01T00:00:00.000Z";
      const escalation = {
        escalationId: "e-1",
        reason: "conflict_cycles_exhausted",
        message: "m",
        intent: { intentId: "i-1", intentKey: "0".repeat(64), entity: { type: "ticket", id: "T-1" }, tool: "tag_ticket", agent: { id: "a", runId: "r", stepId: "s" }, baseVersion: '"v1"', delta: [{ op: "add", path: "/tags/-", value: "x" }], params: {}, replyTo: "writ.replies.a", createdAt: at },
        cycles: 3,
        current: null,
        at,
      };
      const record = (offset: number, key: string) => ({ topic: "writ.human", partition: 0, message: { offset: String(offset), timestamp: "0", key: Buffer.from(key), value: Buffer.from(JSON.stringify(escalation)) } });
      await reader(record(0, "ticket:T-other"));
      expect(state.snapshot().escalations).toEqual([]);
      expect(state.snapshot().counts.escalationsMiskeyed).toBe(1);
      await reader(record(1, "ticket:T-1"));
      expect(state.snapshot().escalations.map((e) => e.escalationId)).toEqual(["e-1"]);
    } finally {
      await feed.close();
    }
  });

  it("reads the reply topics with one consumer, restarted with the topics there are, resuming where the state stopped", async () => {
    const { cluster, consumers, kafka } = mockKafka();
    const state = new ConsoleState({ intents: "writ.intents", human: "writ.human", dlq: "writ.dlq", replyPrefix: "writ.replies." });
    const feed = feedOf(kafka, state);
    try {
      await feed.started;
      const live = () => consumers.filter((c) => c.live && c.topics.some((t) => t.startsWith("writ.replies.")));
      for (let i = 0; i < 6; i++) {
        cluster.topics.push(`writ.replies.run-${i}`);
        await sleep(150);
        if (i === 2) state.accept({ topic: "writ.replies.run-0", partition: 0, offset: "5" });
      }
      expect(live()).toHaveLength(1);
      expect(live()[0]!.topics).toEqual([0, 1, 2, 3, 4, 5].map((i) => `writ.replies.run-${i}`));
      // Offset 5 was taken: the restarted reader starts run-0 at 6, not at its beginning again.
      expect(live()[0]!.seeks).toContainEqual({ topic: "writ.replies.run-0", partition: 0, offset: "6" });
      expect(state.snapshot().topics.replies).toHaveLength(6);

      // Every reply topic deleted: no reader left for them, and the state forgets them and their offsets.
      cluster.topics = [...contract];
      await sleep(200);
      expect(live()).toHaveLength(0);
      expect(state.snapshot().topics.replies).toEqual([]);
      expect(state.resumeAt("writ.replies.run-0", 0)).toBeUndefined();
      // The contract topics keep their one reader.
      expect(consumers.filter((c) => c.live).map((c) => c.topics)).toEqual([contract]);
    } finally {
      await feed.close();
    }
  });
});
