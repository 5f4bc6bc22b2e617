// The owner's intake: a record fetched while the admission loop is finishing is admitted all the same.
import { afterEach, describe, expect, it, vi } from "vitest";
import { waitFor } from "../../helpers/wait-for.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith() };
});

afterEach(() => {
  txns.length = 0;
});

/** Resolves after `n` turns of the microtask queue. */
async function microtasks(n: number): Promise<void> {
  for (let i = 0; i < n; i++) await Promise.resolve();
}

describe("the partition owner's intake", () => {
  // accept() starts the admission loop only when none runs. The loop ended (its inbox empty) a few microtasks before
  // it said so: a record accepted in between was left in the inbox, and nothing admitted it until the next fetch or
  // commit, on a quiet partition never (no reply, its offset and every later one's uncommitted).
  it("admits a record accepted at any moment while the loop admits the one before", async () => {
    for (let turns = 0; turns <= 60; turns++) {
      txns.length = 0;
      const owner = ownerWith();
      owner.start();
      await waitFor(() => owner.state === "running", { timeoutMs: 5_000, intervalMs: 1, message: "the owner never opened its partition" });
      owner.accept([intentRecord(0, "not JSON")], "0");
      await microtasks(turns);
      owner.accept([intentRecord(1, "not JSON either")], "1");
      const offsets = () => txns.filter((t) => t.committed).map((t) => t.offset);
      await waitFor(() => offsets().includes("2"), { timeoutMs: 5_000, intervalMs: 1, message: () => `${turns} microtasks after the first record: offsets committed ${JSON.stringify(offsets())}` });
      expect(owner.load).toBe(0);
      await owner.close();
    }
  });
});
