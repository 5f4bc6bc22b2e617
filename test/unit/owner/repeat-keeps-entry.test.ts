// A repeat answered from the ledger keeps its entry for as long as the repeat's own bytes may come again: a later
// submission of a settled intent key (a new intent id, dated later: an agent's run resumed) is answered `duplicate`,
// and its bytes stay fresh for most of a retention from their `createdAt`. Swept a retention after the first
// submission, the entry would be gone while they are fresh, and a redelivery of them would be written again.
import { afterEach, describe, expect, it, vi } from "vitest";
import { admitTools } from "../../../src/tools.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTagIntentJson, committedLedger, intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";
import { addTag } from "./pipeline-fixtures.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith() };
});

afterEach(() => {
  txns.length = 0;
  vi.useRealTimers();
});

const HOUR = 3_600_000;
const T1 = { type: "ticket", id: "T-1" };

/** add_tag of step `stepId` as submission `intentId`, created at `createdAt` (ms). */
function submission(stepId: string, intentId: string, createdAt: number): string {
  return JSON.stringify({ ...(JSON.parse(addTagIntentJson(stepId)) as object), intentId, createdAt: new Date(createdAt).toISOString() });
}

describe("a repeat answered from the ledger", () => {
  it("keeps the entry past the sweep its first submission would meet: a redelivery of the repeat's bytes is answered, not written", async () => {
    const t0 = Date.parse("2025-06-01T12:00:00.000Z");
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(t0);
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    const owner = ownerWith({ tools: admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }) });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
    const committedOffset = (offset: number) => txns.some((t) => t.committed && t.offset === String(offset));
    const settle = async (offset: number, value: string) => {
      owner.accept([intentRecord(offset, value)], String(offset));
      await waitFor(() => committedOffset(offset + 1), { timeoutMs: 10_000, message: `offset ${offset} never settled` });
    };

    const first = submission("s1", "first", t0);
    await settle(0, first);
    expect(sor.patchCount(T1)).toBe(1);
    const key = (JSON.parse(first) as { intentKey: string }).intentKey;
    // The very submission again (a redelivery after a restart): answered, and the entry left as it is.
    await settle(1, first);
    expect(committedLedger().filter((r) => r.startsWith(key))).toEqual([`${key}:pending`, `${key}:done`]);
    // 20 h later the agent's resumed run submits the step again: answered from the ledger.
    const again = submission("s1", "resumed", t0 + 20 * HOUR);
    vi.setSystemTime(t0 + 20 * HOUR);
    await settle(2, again);
    expect(sor.patchCount(T1)).toBe(1);
    expect(committedLedger().filter((r) => r.startsWith(key))).toEqual([`${key}:pending`, `${key}:done`, `${key}:done`]);

    // A retention (24 h) after the first submission, a sweep; another intent's transaction carries its tombstones.
    vi.setSystemTime(t0 + 24 * HOUR + 60_000);
    owner.requestSweep();
    await settle(3, submission("s2", "other", t0 + 24 * HOUR));
    expect(sor.patchCount(T1)).toBe(2);

    // The resumed submission's bytes again (a redelivery, a copy on a topic): 4 h old, well within their 23 h.
    await settle(4, again);
    expect(sor.patchCount(T1)).toBe(2);
    expect(committedLedger().filter((r) => r.startsWith(key)).at(-1)).toBe(`${key}:done`);
    await owner.close();
  });
});
