// The owner's intake when admission itself throws: an outage pauses it, anything else is tried again a few times
// and then dead-lettered, so that one record can never stop its partition.
import { afterEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { WritError } from "../../../src/errors.ts";
import { TopicDirectory } from "../../../src/owner/topic-directory.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith() };
});

afterEach(() => {
  txns.length = 0;
});

/** A codec whose decode fails with `fault()` for the record "boom", counting the tries. */
function throwingCodec(fault: () => Promise<never>): WireCodec & { tries: number } {
  const codec = new WireCodec({}) as WireCodec & { tries: number };
  codec.tries = 0;
  const decode = codec.decode.bind(codec);
  codec.decode = (async (name, value, opts) => {
    if (Buffer.isBuffer(value) && value.toString() === "boom") {
      codec.tries++;
      return fault();
    }
    return decode(name, value, opts);
  }) as typeof codec.decode;
  return codec;
}

const config = { maxProcessingAttempts: 3, outageBackoffInitialMs: 1, outageBackoffMaxMs: 2 };
const committed = () => txns.filter((t) => t.committed);
const dlq = () => committed().flatMap((t) => t.records.filter((r) => r.topic === "writ.dlq").map((r) => JSON.parse(String(r.value)) as { reason: string; message: string; source: { offset: string } }));

describe("the owner's intake when admission throws", () => {
  // A throw out of admit() was taken for a registry outage whatever it was: the record was tried again forever and
  // nothing behind it on the partition was ever admitted.
  it("dead-letters a record whose admission keeps failing (not an outage) and goes on with the next", async () => {
    const codec = throwingCodec(async () => {
      throw new TypeError("a bug in admission");
    });
    const owner = ownerWith({ codec, config });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, intervalMs: 1, message: "the owner never opened its partition" });
    owner.accept([intentRecord(0, "boom"), intentRecord(1, "not JSON")], "0");
    await waitFor(() => committed().some((t) => t.offset === "2"), { timeoutMs: 10_000, intervalMs: 1, message: () => `offsets committed ${JSON.stringify(committed().map((t) => t.offset))}` });
    expect(codec.tries).toBe(3);
    const letters = dlq();
    expect(letters.map((d) => [d.source.offset, d.reason])).toEqual([
      ["0", "processing_failed"],
      ["1", "undecodable"],
    ]);
    expect(letters[0]!.message).toContain("a bug in admission");
    await owner.close();
  });

  /** The record "boom", whose admission keeps failing with `fault()`, is tried again and again: nothing dead-lettered, its offset held. */
  async function expectIntakePaused(fault: () => Promise<never>): Promise<void> {
    const codec = throwingCodec(fault);
    const owner = ownerWith({ codec, config });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, intervalMs: 1, message: "the owner never opened its partition" });
    owner.accept([intentRecord(0, "boom")], "0");
    await waitFor(() => codec.tries >= 10, { timeoutMs: 10_000, intervalMs: 1, message: () => `tried ${codec.tries} times` });
    expect(dlq()).toEqual([]);
    expect(committed().some((t) => t.offset === "1")).toBe(false);
    await owner.close();
  }

  // The control: an outage of the registry says nothing about the record, so it is never given up on.
  it("keeps pausing, and dead-letters nothing, while the registry is unreachable", async () => {
    await expectIntakePaused(async () => {
      throw new WritError("registry_unavailable", "could not look up schema id 7", { retriable: true });
    });
  });

  // kafkajs's admin fails a metadata request the brokers did not answer with a plain TypeError (its broker pool hands
  // `null` on: kafkajs #461, #549). Admission asks whether a reply topic exists: during a broker outage that error
  // must pause intake like any outage, not count as a fault of the record and dead-letter a valid intent.
  it("keeps pausing, and dead-letters nothing, while the cluster cannot list its topics", async () => {
    const admin = {
      listTopics: async () => {
        const { topicMetadata } = null as unknown as { topicMetadata: unknown };
        return topicMetadata;
      },
    };
    const directory = new TopicDirectory(admin as never);
    // The record's admission meets the directory's error, as admission's reply-topic check would.
    await expectIntakePaused(async () => {
      await directory.exists("writ.replies.agent");
      throw new Error("the directory answered");
    });
  });
});
