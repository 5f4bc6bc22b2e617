// Reading records back when the brokers cannot be reached: an answer per record in bounded time, never a throw
// that becomes a 500 (the console's send back) or stops a run (`writ dlq redrive`'s originals).
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { readRecordsAt, offsetsWanted } from "../../src/cli/topic-reader.ts";
import { WireCodec } from "../../src/codec.ts";
import { readDeadLetters } from "../../src/console/send-back.ts";
import { originalsOf } from "../../src/dlq-redrive.ts";
import { createLogger } from "../../src/logger.ts";

const log = createLogger({ level: "silent" });

/**
 * A client of a port nothing listens on: every connection refused; `retries` as kafkajs counts them. Port 9 (discard),
 * as the unit tests' "no broker" everywhere: below 1024, so no test process takes it, where a port found free a moment
 * ago could have been taken by another worker's server since.
 */
function unreachable(retries: number): Kafka {
  return new Kafka({ clientId: "read-back-test", brokers: ["127.0.0.1:9"], connectionTimeout: 500, retry: { retries, initialRetryTime: 200, maxRetryTime: 2000 }, logLevel: logLevel.NOTHING });
}

describe("reading records back from unreachable brokers", () => {
  it("readRecordsAt answers timedOut at its deadline while kafkajs still retries the connection (8 retries: tens of seconds)", async () => {
    const kafka = unreachable(8);
    const got = await readRecordsAt(kafka, "writ.dlq", offsetsWanted([{ partition: 0, offset: "5" }]), { timeoutMs: 300, log });
    expect([got.timedOut, got.found.size]).toEqual([true, 0]);
  });

  it("readRecordsAt rejects when the connection fails before its deadline (no retries)", async () => {
    const kafka = unreachable(0);
    await expect(readRecordsAt(kafka, "writ.dlq", offsetsWanted([{ partition: 0, offset: "5" }]), { timeoutMs: 30_000, log })).rejects.toThrow();
  });

  it("the console's read back answers read_failed for each dead letter, naming the topic, when the read fails", async () => {
    const kafka = unreachable(0);
    const refs = [
      { partition: 0, offset: "5" },
      { partition: 1, offset: "7" },
    ];
    const got = await readDeadLetters(kafka, new WireCodec({}), "writ.dlq", refs, 30_000, log);
    expect(got.map((g) => (g !== null && "unread" in g ? g.unread : g))).toEqual(["read_failed", "read_failed"]);
    expect(got[0]).toMatchObject({ error: expect.stringMatching(/^could not read it back from writ\.dlq: /) });
  });

  it("and read_timeout for each when the deadline comes first", async () => {
    const kafka = unreachable(8);
    const got = await readDeadLetters(kafka, new WireCodec({}), "writ.dlq", [{ partition: 0, offset: "5" }], 300, log);
    expect(got).toEqual([{ unread: "read_timeout", error: "not read back from writ.dlq[0]@5 within 300 ms" }]);
  });

  it("originalsOf answers read_failed for each truncated dead letter whose source cannot be read, and read_timeout past its deadline", async () => {
    const letters = [
      { source: { topic: "writ.intents", partition: 3, offset: "11" }, key: "ticket:T-1", sha256: "0".repeat(64) },
      { source: { topic: "writ.intents", partition: 4, offset: "12" }, key: "ticket:T-2", sha256: "1".repeat(64) },
    ];
    const failed = await originalsOf(unreachable(0), letters, { timeoutMs: 30_000, log });
    expect(failed.map((o) => ("outcome" in o ? o.outcome : "read"))).toEqual(["read_failed", "read_failed"]);
    expect(failed[0]).toMatchObject({ detail: expect.stringMatching(/^writ\.intents\[3\]@11 could not be read: /) });
    const late = await originalsOf(unreachable(8), letters, { timeoutMs: 300, log });
    expect(late.map((o) => ("outcome" in o ? o.outcome : "read"))).toEqual(["read_timeout", "read_timeout"]);
  });
});
