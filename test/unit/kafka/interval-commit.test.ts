import type { Consumer } from "kafkajs";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { startIntervalCommit } from "../../../src/kafka/interval-commit.ts";

type Offsets = { topic: string; partition: number; offset: string }[];

/** A consumer that records the commits it is asked for; `fail` makes the next ones fail. */
function fakeConsumer() {
  const commits: Offsets[] = [];
  const state = { fail: false };
  const consumer = {
    commitOffsets: async (offsets: Offsets) => {
      if (state.fail) throw new Error("rebalance in progress");
      commits.push(offsets);
    },
  } as unknown as Consumer;
  return { consumer, commits, state };
}

describe("interval commit", () => {
  beforeEach(() => vi.useFakeTimers());
  afterEach(() => vi.useRealTimers());

  it("commits, once per interval, the position after the last handled message of each partition that moved", async () => {
    const { consumer, commits } = fakeConsumer();
    const c = startIntervalCommit(consumer, "replies", 1000);
    for (let offset = 0; offset < 50; offset++) c.handled(offset % 2, String(offset));
    expect(commits).toEqual([]);
    await vi.advanceTimersByTimeAsync(1000);
    expect(commits).toEqual([
      [
        { topic: "replies", partition: 0, offset: "49" },
        { topic: "replies", partition: 1, offset: "50" },
      ],
    ]);
    // Nothing moved: no commit.
    await vi.advanceTimersByTimeAsync(5000);
    expect(commits).toHaveLength(1);
    c.handled(1, "50");
    await vi.advanceTimersByTimeAsync(1000);
    expect(commits[1]).toEqual([{ topic: "replies", partition: 1, offset: "51" }]);
    c.stop();
  });

  it("keeps a failed commit's positions for the next one, unless a later message moved them", async () => {
    const { consumer, commits, state } = fakeConsumer();
    const c = startIntervalCommit(consumer, "replies", 1000);
    c.handled(0, "9");
    c.handled(1, "4");
    state.fail = true;
    await vi.advanceTimersByTimeAsync(1000);
    expect(commits).toEqual([]);
    c.handled(1, "7");
    state.fail = false;
    await c.flush();
    expect(commits).toEqual([
      [
        { topic: "replies", partition: 0, offset: "10" },
        { topic: "replies", partition: 1, offset: "8" },
      ],
    ]);
    c.stop();
  });

  it("stops: nothing is committed after stop", async () => {
    const { consumer, commits } = fakeConsumer();
    const c = startIntervalCommit(consumer, "replies", 1000);
    c.handled(0, "1");
    c.stop();
    await vi.advanceTimersByTimeAsync(10_000);
    expect(commits).toEqual([]);
  });
});
