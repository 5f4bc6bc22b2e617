// The console's feed (src/console/feed.ts) over a mocked kafkajs client: how many consumers it keeps for reply
// topics that come and go, what it subscribes them to, and where a restarted reader resumes.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { WireCodec } from "../../src/codec.ts";
import { startFeed } from "../../src/console/feed.ts";
import { ConsoleState } from "../../src/console/state.ts";

const contract = ["writ.intents", "writ.human", "writ.dlq"];
const sleep = (ms: number) => new Promise((r) => setTimeout(r, ms));

function mockKafka() {
  const cluster = { topics: [...contract] };
  const consumers: { topics: string[]; live: boolean; seeks: { topic: string; partition: number; offset: string }[] }[] = [];
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
      const c = { topics: [] as string[], live: false, seeks: [] as { topic: string; partition: number; offset: string }[] };
      consumers.push(c);
      return {
        events: { END_BATCH_PROCESS: "e", CRASH: "c" },
        on: () => {},
        connect: async () => void (c.live = true),
        subscribe: async ({ topics }: { topics: string[] }) => void (c.topics = topics),
        run: async () => {},
        seek: (s: { topic: string; partition: number; offset: string }) => void c.seeks.push(s),
        disconnect: async () => void (c.live = false),
      };
    },
  };
  return { cluster, consumers, kafka };
}

describe("console feed", () => {
  it("reads the reply topics with one consumer, restarted with the topics there are, resuming where the state stopped", async () => {
    const { cluster, consumers, kafka } = mockKafka();
    const state = new ConsoleState({ intents: "writ.intents", human: "writ.human", dlq: "writ.dlq", replyPrefix: "writ.replies." });
    const feed = startFeed({
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
