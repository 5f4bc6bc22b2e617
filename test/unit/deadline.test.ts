import { afterEach, describe, expect, it, vi } from "vitest";
import { withDeadline } from "../../src/deadline.ts";

describe("withDeadline", () => {
  afterEach(() => void vi.useRealTimers());

  it("gives the work's value, or its failure, when it ends first", async () => {
    await expect(withDeadline(Promise.resolve(7), 1000, () => 0)).resolves.toBe(7);
    await expect(withDeadline(Promise.reject(new Error("work failed")), 1000, () => 0)).rejects.toThrow("work failed");
  });

  it("gives what onExpiry returns or throws once the time passes, and leaves no timer behind either way", async () => {
    vi.useFakeTimers();
    const never = new Promise<number>(() => undefined);
    const value = withDeadline(never, 50, () => -1);
    const thrown = withDeadline(never, 50, () => {
      throw new Error("too late");
    });
    const check = expect(thrown).rejects.toThrow("too late");
    await vi.advanceTimersByTimeAsync(50);
    await expect(value).resolves.toBe(-1);
    await check;
    await withDeadline(Promise.resolve(1), 60_000, () => 0);
    expect(vi.getTimerCount()).toBe(0);
  });

  it("hears nobody's failure when the work loses the race (no unhandled rejection)", async () => {
    vi.useFakeTimers();
    let fail!: (e: Error) => void;
    const late = new Promise<number>((_, reject) => (fail = reject));
    const raced = withDeadline(late, 10, () => 0);
    await vi.advanceTimersByTimeAsync(10);
    await expect(raced).resolves.toBe(0);
    vi.useRealTimers();
    const unhandled = vi.fn();
    process.on("unhandledRejection", unhandled);
    fail(new Error("after the deadline"));
    // Node reports an unhandled rejection once the microtasks of the tick have run: two macrotasks later is past it.
    for (let i = 0; i < 2; i++) await new Promise((r) => setImmediate(r));
    process.off("unhandledRejection", unhandled);
    expect(unhandled).not.toHaveBeenCalled();
  });
});
