import type { Admin, Kafka } from "kafkajs";
import { describe, expect, it } from "vitest";
import type { WireCodec } from "../../src/codec.ts";
import { LedgerReader } from "../../src/ledger/ledger-reader.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createLogger } from "../../src/logger.ts";

/** What kafkajs's admin says of a partition whose leader is being elected: a retriable protocol error. */
function leaderElection(): Error {
  return Object.assign(new Error("This server does not host this topic-partition"), { retriable: true, type: "UNKNOWN_TOPIC_OR_PARTITION", code: 3 });
}

/** A kafkajs consumer as the reader uses it, recording its calls; `subscribe` fails while `failing` says so. */
function fakeKafka(failing: () => boolean, disconnected: () => Promise<void> = async () => undefined, subscribing: () => Promise<void> = async () => undefined) {
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
          await subscribing();
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
    for (const crash of crashes) crash({ payload: { error: new Error("gone"), restart: false } });
    await reader.stop();
    await expect(reader.restore(0, "nonce", 30_000)).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
    // Only the first consumer was ever made: none connected after the stop, to outlive it.
    expect(consumers).toHaveLength(1);
  });

  it("of two overlapping restores of a partition the newer wins: the older, whose offsets came last, is refused, and neither is left unsettled", async () => {
    const { kafka } = fakeKafka(() => false);
    let answerFirst = () => undefined as void;
    const firstAnswered = new Promise<void>((resolve) => (answerFirst = resolve));
    let looks = 0;
    const reader = readerOn(kafka, async () => {
      // The first look-up (the older restore's) is held until the newer restore is registered.
      if (++looks === 1) await firstAnswered;
      return [{ partition: 0, low: "0", high: "5" }];
    });
    await reader.start();
    const older = reader.restore(0, "older", 30_000);
    const newer = reader.restore(0, "newer", 30_000);
    const newerSettled = newer.then(
      () => "resolved",
      (err: Error) => err.message,
    );
    await waitFor(() => looks === 2, { timeoutMs: 10_000, message: "the newer restore never looked its offsets up" });
    answerFirst();
    await expect(older).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "superseded by a newer restore" });
    // The newer one is still the partition's restore: the stop ends it (before, it was displaced and never settled).
    await reader.stop();
    expect(await newerSettled).toBe("ledger reader stopped");
  });

  it("a stop while the consumer connects: it never joins the group, and is disconnected", async () => {
    let subscribed = () => undefined as void;
    const subscribing = new Promise<void>((resolve) => (subscribed = resolve));
    const { kafka, consumers } = fakeKafka(() => false, async () => undefined, () => subscribing);
    const reader = readerOn(kafka);
    const starting = reader.start();
    await waitFor(() => consumers[0]?.calls.includes("subscribe"), { timeoutMs: 10_000, message: "the consumer never subscribed" });
    await reader.stop();
    subscribed();
    await expect(starting).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader stopped" });
    expect(consumers.map((c) => c.calls)).toEqual([["connect", "subscribe", "disconnect"]]);
  });

  it("a consumer kafkajs gave up on during a restore's offsets look-up: the restore is refused at once, not registered on it", async () => {
    let answer = () => undefined as void;
    const answered = new Promise<void>((resolve) => (answer = resolve));
    let asked = false;
    const { kafka, crashes } = fakeKafka(() => false);
    const reader = readerOn(kafka, async () => {
      asked = true;
      await answered;
      return [{ partition: 0, low: "0", high: "5" }];
    });
    await reader.start();
    const restoring = reader.restore(0, "nonce", 30_000);
    await waitFor(() => asked, { timeoutMs: 10_000, message: "the restore never looked its offsets up" });
    for (const crash of crashes) crash({ payload: { error: new Error("gone"), restart: false } });
    answer();
    await expect(restoring).rejects.toMatchObject({ code: "ledger_restore_timeout", message: "ledger reader restarted during the restore" });
    await reader.stop();
  });
});
