import type { Admin, Kafka } from "kafkajs";
import { describe, expect, it } from "vitest";
import type { WireCodec } from "../../src/codec.ts";
import { LedgerReader } from "../../src/ledger/ledger-reader.ts";
import { createLogger } from "../../src/logger.ts";

/** What kafkajs's admin says of a partition whose leader is being elected: a retriable protocol error. */
function leaderElection(): Error {
  return Object.assign(new Error("This server does not host this topic-partition"), { retriable: true, type: "UNKNOWN_TOPIC_OR_PARTITION", code: 3 });
}

/** A kafkajs consumer as the reader uses it, recording its calls; `subscribe` fails while `failing` says so. */
function fakeKafka(failing: () => boolean, disconnected: () => Promise<void> = async () => undefined) {
  const consumers: { calls: string[] }[] = [];
  const kafka = {
    consumer: () => {
      const calls: string[] = [];
      consumers.push({ calls });
      return {
        events: { CRASH: "consumer.crash", GROUP_JOIN: "consumer.group_join" },
        on: () => () => undefined,
        connect: async () => void calls.push("connect"),
        subscribe: async () => {
          calls.push("subscribe");
          if (failing()) throw leaderElection();
        },
        run: async () => void calls.push("run"),
        disconnect: async () => {
          calls.push("disconnect");
          await disconnected();
        },
        pause: () => void calls.push("pause"),
        resume: () => undefined,
        seek: () => undefined,
      };
    },
  };
  return { kafka: kafka as unknown as Kafka, consumers };
}

describe("the ledger reader's start", () => {
  it("a start that fails (a leader being elected) leaves no consumer connected, and the next start reads", async () => {
    let fail = true;
    const { kafka, consumers } = fakeKafka(() => fail);
    const reader = new LedgerReader({
      kafka,
      admin: {} as Admin,
      topic: "writ.ledger",
      partitions: 3,
      codec: {} as WireCodec,
      log: createLogger({ level: "silent", name: "test" }),
      groupId: "writ.ledger-reader.test",
    });
    await expect(reader.start()).rejects.toMatchObject({ retriable: true });
    // The consumer that could not subscribe was disconnected, not left holding its connections.
    expect(consumers.map((c) => c.calls)).toEqual([["connect", "subscribe", "disconnect"]]);

    fail = false;
    await reader.start();
    // A consumer of its own, subscribed and running, every partition paused until a restore asks for one.
    expect(consumers.map((c) => c.calls)).toEqual([
      ["connect", "subscribe", "disconnect"],
      ["connect", "subscribe", "run", "pause"],
    ]);
    // Started once: a later start is the same one.
    await reader.start();
    expect(consumers).toHaveLength(2);
  });

  it("a restore asked while a stop waits for the consumer's disconnect is refused at once, not left to its deadline", async () => {
    let endDisconnect = () => undefined as void;
    const disconnected = new Promise<void>((resolve) => (endDisconnect = resolve));
    const { kafka } = fakeKafka(() => false, () => disconnected);
    const reader = new LedgerReader({
      kafka,
      admin: { fetchTopicOffsets: async () => [{ partition: 0, low: "0", high: "5" }] } as unknown as Admin,
      topic: "writ.ledger",
      partitions: 1,
      codec: {} as WireCodec,
      log: createLogger({ level: "silent", name: "test" }),
      groupId: "writ.ledger-reader.test",
    });
    await reader.start();
    const stopping = reader.stop();
    // An owner opened while the router stops: its restore must not wait 30 s on a consumer going away.
    await expect(reader.restore(0, "nonce", 30_000)).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
    endDisconnect();
    await stopping;
  });
});
