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
  const crashes: ((event: unknown) => void)[] = [];
  const kafka = {
    consumer: () => {
      const calls: string[] = [];
      consumers.push({ calls });
      return {
        events: { CRASH: "consumer.crash", GROUP_JOIN: "consumer.group_join" },
        on: (event: string, handler: (event: unknown) => void) => {
          if (event === "consumer.crash") crashes.push(handler);
          return () => undefined;
        },
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
  return { kafka: kafka as unknown as Kafka, consumers, crashes };
}

/** A reader of one-partition ledger "writ.ledger" on the fakes; `offsets` is the admin's fetchTopicOffsets. */
function readerOn(kafka: Kafka, offsets: () => Promise<{ partition: number; low: string; high: string }[]> = async () => [{ partition: 0, low: "0", high: "5" }]) {
  return new LedgerReader({
    kafka,
    admin: { fetchTopicOffsets: offsets } as unknown as Admin,
    topic: "writ.ledger",
    partitions: 1,
    codec: {} as WireCodec,
    log: createLogger({ level: "silent", name: "test" }),
    groupId: "writ.ledger-reader.test",
  });
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
    const reader = readerOn(kafka);
    await reader.start();
    const stopping = reader.stop();
    // An owner opened while the router stops: its restore must not wait 30 s on a consumer going away.
    await expect(reader.restore(0, "nonce", 30_000)).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
    endDisconnect();
    await stopping;
  });

  it("a stop while a restore asks for the topic's offsets refuses that restore at once, not at its deadline", async () => {
    let asked = () => undefined as void;
    const asking = new Promise<void>((resolve) => (asked = resolve));
    let answer = () => undefined as void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    const { kafka } = fakeKafka(() => false);
    const reader = readerOn(kafka, async () => {
      asked();
      await answered;
      return [{ partition: 0, low: "0", high: "5" }];
    });
    await reader.start();
    const restoring = reader.restore(0, "nonce", 30_000);
    await asking;
    await reader.stop();
    answer();
    await expect(restoring).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
  });

  it("a restore after kafkajs gave up on the consumer and the reader stopped starts no consumer of its own", async () => {
    const { kafka, consumers, crashes } = fakeKafka(() => false);
    const reader = readerOn(kafka);
    await reader.start();
    crashes[0]!({ payload: { error: new Error("gone"), restart: false } });
    await reader.stop();
    await expect(reader.restore(0, "nonce", 30_000)).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
    // Only the first consumer was ever made: none connected after the stop, to outlive it.
    expect(consumers).toHaveLength(1);
  });
});
