// The partition owner's bookkeeping of what it commits, over a producer that records each transaction
// (partition-owner-harness.ts): the retention sweep keeps up with any intake, and a result that cannot be
// encoded never holds the partition's offset.
import { afterEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, restoredWith, txns } from "./partition-owner-harness.ts";

const restored = vi.hoisted(() => ({ entries: [] as [string, unknown][] }));
vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith: withEntries } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => withEntries(restored.entries as [string, RestoredEntry][]) };
});

afterEach(() => {
  txns.length = 0;
  restored.entries = [];
});

/** A settled ledger entry last changed two days ago: past the default 24 h retention. */
function oldEntry(i: number): [string, RestoredEntry] {
  const at = new Date(Date.now() - 48 * 3_600_000).toISOString();
  const key = i.toString(16).padStart(64, "0");
  return [
    key,
    {
      kind: "intent", intentKey: key, intentId: `i-${i}`, status: "done", entity: { type: "ticket", id: `T-${i}` }, tool: "tag_ticket", agentId: "a",
      fingerprint: "f", attempts: [{ baseVersion: '"1"', deltaFingerprint: "d" }], cycles: 0, replyTo: "writ.replies.a", updatedAt: at,
      outcome: { status: "applied", version: '"2"', via: "patch", at },
    } as RestoredEntry,
  ];
}

const committed = () => txns.filter((t) => t.committed);

describe("the partition owner's commits", () => {
  it("a retention sweep goes on until nothing past retention is left, 1,000 tombstones a transaction", async () => {
    restored.entries = Array.from({ length: 3_500 }, (_, i) => oldEntry(i));
    const owner = ownerWith();
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
    // One sweep request (the router makes one a minute at the default retention): 1,000 a minute would fall
    // behind any partition taking more than about 17 intents a second, and its ledger would grow for good.
    owner.requestSweep();
    const tombstones = () => committed().flatMap((t) => t.records).filter((r) => r.value === null).length;
    await waitFor(() => tombstones() === 3_500, { timeoutMs: 10_000, message: () => `${tombstones()} of 3,500 entries tombstoned` });
    expect(committed().map((t) => t.records.filter((r) => r.value === null).length).filter((n) => n > 0)).toEqual([1000, 1000, 1000, 500]);
    expect(owner.stats()?.ledgerEntries).toBe(0);
    await owner.close();
  });

  it("a result that cannot be encoded, nor its dead letter, lets the offset pass (the error logged, the record left on the topic)", async () => {
    // Not an outage: a codec that refuses every dead letter and reply (a bug in a schema, say).
    const codec = new WireCodec({});
    const encode = codec.encode.bind(codec);
    codec.encode = async (topic, name, value) => {
      if (name === "DeadLetter" || name === "Reply") throw new TypeError(`this ${name} cannot be encoded`);
      return encode(topic, name, value);
    };
    const owner = ownerWith({ codec });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
    owner.accept([intentRecord(0, "not JSON")], "0");
    await waitFor(() => committed().some((t) => t.offset === "1"), { timeoutMs: 10_000, message: () => `offsets committed: ${JSON.stringify(committed().map((t) => t.offset))}` });
    expect(owner.load).toBe(0);
    await owner.close();
  });
});
