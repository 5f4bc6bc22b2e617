// Any producer with write access to writ.ledger can write a record the restore cannot read, under any key: Kafka
// keys run up to the topic's max.message.bytes. The `ledger_unreadable` error quoted the key whole, and its message
// is what /healthz lists for the partition (`ledger-<p>`) and what the owner logs every 30 s it tries again: a
// 512 KiB key made a 512 KiB health answer and log line, newlines and terminal escapes in it as sent.
import type { Admin, EachBatchPayload, Kafka } from "kafkajs";
import { describe, expect, it } from "vitest";
import { WireCodec } from "../../src/codec.ts";
import type { WritError } from "../../src/errors.ts";
import { LedgerReader } from "../../src/ledger/ledger-reader.ts";
import { createLogger } from "../../src/logger.ts";
import { waitFor } from "../helpers/wait-for.ts";

/** A kafkajs consumer that hands the reader's `eachBatch` to the test. */
function fakeKafka() {
  const run: { eachBatch?: (p: EachBatchPayload) => Promise<void> } = {};
  const kafka = {
    consumer: () => ({
      events: { CRASH: "consumer.crash", GROUP_JOIN: "consumer.group_join" },
      on: () => () => undefined,
      connect: async () => undefined,
      subscribe: async () => undefined,
      run: async (opts: { eachBatch: (p: EachBatchPayload) => Promise<void> }) => void (run.eachBatch = opts.eachBatch),
      disconnect: async () => undefined,
      pause: () => undefined,
      resume: () => undefined,
      seek: () => undefined,
    }),
  };
  const admin = { fetchTopicOffsets: async () => [{ partition: 0, low: "0", high: "1", offset: "1" }] };
  return { kafka: kafka as unknown as Kafka, admin: admin as unknown as Admin, run };
}

describe("an unreadable ledger record under a hostile key", () => {
  it("fails the restore closed with an error that quotes a bounded, printable part of the key", async () => {
    const { kafka, admin, run } = fakeKafka();
    const reader = new LedgerReader({ kafka, admin, topic: "writ.ledger", partitions: 1, codec: new WireCodec({}), log: createLogger({ level: "silent", name: "test" }), groupId: "g" });
    const restored = reader.restore(0, "nonce", 10_000);
    const failed = restored.then(
      () => null,
      (err: unknown) => err as WritError,
    );
    const key = `\u001b]52;c;${"A".repeat(100)}\u0007\nfake log line\n${"k".repeat(512 * 1024)}`;
    await waitFor(() => run.eachBatch !== undefined, { timeoutMs: 5_000, message: "the reader never ran its consumer" });
    await run.eachBatch!({
      batch: { topic: "writ.ledger", partition: 0, messages: [{ key: Buffer.from(key), value: Buffer.from("{ not a ledger entry"), offset: "0", headers: {}, timestamp: "0", attributes: 0 }], lastOffset: () => "0" },
      resolveOffset: () => undefined,
      heartbeat: async () => undefined,
      isStale: () => false,
    } as unknown as EachBatchPayload);
    const err = await failed;
    expect(err?.code).toBe("ledger_unreadable");
    expect(err!.message).toMatch(/cannot be read/);
    // What /healthz and the log carry: the start of the key, enough to find the record, never the key whole.
    expect(err!.message.length).toBeLessThan(2_000);
    expect(JSON.stringify(err!.context).length).toBeLessThan(2_000);
    expect(err!.message).not.toMatch(/[\u0000-\u001f]/);
    await reader.stop();
  });
});

