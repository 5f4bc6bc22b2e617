import type { Admin } from "kafkajs";
import { describe, expect, it } from "vitest";
import { serialAdmin, startOffset } from "../../../src/kafka/serial-admin.ts";

/** A stand-in for the few admin calls used here; each records how many calls overlap. */
function fakeAdmin(answers: { offsets: { partition: number; offset: string }[]; lows?: { partition: number; low: string }[] }) {
  let inFlight = 0;
  let maxInFlight = 0;
  const slow = async <T>(value: T): Promise<T> => {
    inFlight++;
    maxInFlight = Math.max(maxInFlight, inFlight);
    await new Promise((r) => setImmediate(r));
    await new Promise((r) => setImmediate(r));
    inFlight--;
    return value;
  };
  const admin = {
    fetchOffsets: async () => slow([{ topic: "writ.intents", partitions: answers.offsets.map((o) => ({ ...o, metadata: null })) }]),
    fetchTopicOffsets: async () => slow((answers.lows ?? []).map((l) => ({ ...l, high: l.low, offset: l.low }))),
    failing: async () => {
      await slow(null);
      throw new Error("boom");
    },
  };
  return { admin: admin as unknown as Admin & { failing(): Promise<void> }, maxInFlight: () => maxInFlight };
}

describe("serialAdmin", () => {
  it("runs one request at a time, in call order, and a failure does not stop the queue", async () => {
    const f = fakeAdmin({ offsets: [{ partition: 0, offset: "7" }] });
    const admin = serialAdmin(f.admin) as typeof f.admin;
    const calls = [
      admin.fetchOffsets({ groupId: "g", topics: ["writ.intents"] }),
      admin.failing().catch((e: Error) => e.message),
      admin.fetchOffsets({ groupId: "g", topics: ["writ.intents"] }),
    ];
    const [a, b, c] = await Promise.all(calls);
    expect(b).toBe("boom");
    expect(a).toEqual(c);
    expect(f.maxInFlight()).toBe(1);
  });

  it("without it the same calls overlap (the control)", async () => {
    const f = fakeAdmin({ offsets: [{ partition: 0, offset: "7" }] });
    await Promise.all([f.admin.fetchOffsets({ groupId: "g", topics: ["t"] }), f.admin.fetchOffsets({ groupId: "g", topics: ["t"] })]);
    expect(f.maxInFlight()).toBe(2);
  });
});

describe("startOffset", () => {
  it("resumes at the committed offset", async () => {
    const f = fakeAdmin({ offsets: [{ partition: 0, offset: "30" }, { partition: 1, offset: "-1" }] });
    expect(await startOffset(f.admin, "writ.owners", "writ.intents", 0)).toBe(30n);
  });

  it("starts at the partition's first offset when the group has no commit", async () => {
    const f = fakeAdmin({ offsets: [{ partition: 1, offset: "-1" }], lows: [{ partition: 1, low: "12" }] });
    expect(await startOffset(f.admin, "writ.owners", "writ.intents", 1)).toBe(12n);
  });

  it("refuses an answer without the partition instead of replaying from the start", async () => {
    const f = fakeAdmin({ offsets: [{ partition: 1, offset: "5" }], lows: [{ partition: 0, low: "0" }] });
    await expect(startOffset(f.admin, "writ.owners", "writ.intents", 0)).rejects.toMatchObject({ code: "kafka_failed", retriable: true });
    const g = fakeAdmin({ offsets: [{ partition: 0, offset: "-1" }], lows: [] });
    await expect(startOffset(g.admin, "writ.owners", "writ.intents", 0)).rejects.toMatchObject({ code: "kafka_failed" });
  });
});
