import { describe, expect, it } from "vitest";
import { TokenBucket } from "../../src/token-bucket.ts";

/** A clock the test turns; sleeps resolve at once and are recorded. */
function turnedClock() {
  const clock = { t: 0, slept: [] as number[], now: () => clock.t, sleep: async (ms: number) => void clock.slept.push(ms) };
  return clock;
}

describe("TokenBucket", () => {
  it("gives its burst at once, then one token per 1/rate, each taker waiting behind the ones before it", async () => {
    const clock = turnedClock();
    const bucket = new TokenBucket({ perSecond: 4, burst: 2, clock });
    expect(await bucket.take()).toBe(0);
    expect(await bucket.take()).toBe(0);
    // Empty: the next waits a quarter second, the one after it half a second (its token comes after the first's).
    expect(await Promise.all([bucket.take(), bucket.take()])).toEqual([250, 500]);
    expect(clock.slept).toEqual([250, 500]);
  });

  it("refills with time, never beyond its burst", async () => {
    const clock = turnedClock();
    const bucket = new TokenBucket({ perSecond: 10, burst: 3, clock });
    for (let i = 0; i < 3; i++) expect(await bucket.take()).toBe(0);
    clock.t += 100; // one token back
    expect(await bucket.take()).toBe(0);
    expect(await bucket.take()).toBe(100);
    clock.t += 60_000; // a minute idle saves up three, not 600
    for (let i = 0; i < 3; i++) expect(await bucket.take()).toBe(0);
    expect(await bucket.take()).toBe(100);
  });

  it("saves up one second's worth unless told otherwise, at least one", async () => {
    const clock = turnedClock();
    const bucket = new TokenBucket({ perSecond: 3, clock });
    for (let i = 0; i < 3; i++) expect(await bucket.take()).toBe(0);
    expect(await bucket.take()).toBe(334);
    const slow = new TokenBucket({ perSecond: 0.5, clock });
    expect(await slow.take()).toBe(0);
    expect(await slow.take()).toBe(2000);
  });

  it("tryTake takes a token only if one is saved up, never one a waiting take() reserved, and never waits", async () => {
    const clock = turnedClock();
    const bucket = new TokenBucket({ perSecond: 10, burst: 2, clock });
    expect(bucket.tryTake()).toBe(true);
    expect(bucket.tryTake()).toBe(true);
    expect(bucket.tryTake()).toBe(false);
    clock.t += 50; // half a token back: still none whole
    expect(bucket.tryTake()).toBe(false);
    clock.t += 50;
    expect(bucket.tryTake()).toBe(true);
    // A refused tryTake reserves nothing: the next take() waits no longer for it.
    expect(bucket.tryTake()).toBe(false);
    expect(await bucket.take()).toBe(100);
    // The token that take() waits for is its own: it comes, tryTake finds none.
    clock.t += 100;
    expect(bucket.tryTake()).toBe(false);
    clock.t += 100;
    expect(bucket.tryTake()).toBe(true);
    expect(clock.slept).toEqual([100]);
  });

  it("refuses a rate that is not a positive number", () => {
    for (const bad of [0, -1, Number.NaN, Number.POSITIVE_INFINITY]) expect(() => new TokenBucket({ perSecond: bad }), String(bad)).toThrow(RangeError);
  });
});
