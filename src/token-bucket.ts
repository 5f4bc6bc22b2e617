/**
 * A token bucket whose `take()` waits its turn instead of refusing (`tryTake()` refuses): `perSecond` tokens a second, at most
 * `burst` saved up. A take that finds no token reserves the next one (the balance goes below zero), so
 * takers are served in the order they came and none waits longer than the takers ahead of it need.
 *
 * Hand-written rather than a package's: the callers need an awaitable take whose clock a test turns
 * (`clock`), and the rate-limiter packages on npm either refuse when empty or sleep on real timers.
 */
export interface BucketClock {
  now(): number;
  sleep(ms: number): Promise<void>;
}

const realClock: BucketClock = {
  now: () => performance.now(),
  sleep: (ms) => new Promise((resolve) => setTimeout(resolve, ms)),
};

export class TokenBucket {
  private tokens: number;
  private last: number;
  private readonly perSecond: number;
  private readonly burst: number;
  private readonly clock: BucketClock;

  constructor(opts: { perSecond: number; burst?: number; clock?: BucketClock }) {
    if (!(opts.perSecond > 0) || !Number.isFinite(opts.perSecond)) throw new RangeError(`perSecond must be a positive number, got ${opts.perSecond}`);
    this.perSecond = opts.perSecond;
    this.burst = Math.max(1, opts.burst ?? opts.perSecond);
    this.clock = opts.clock ?? realClock;
    this.tokens = this.burst;
    this.last = this.clock.now();
  }

  /** Takes a token, waiting for it when none is saved up. Resolves to the ms waited (0: none). */
  async take(): Promise<number> {
    this.refill();
    this.tokens -= 1;
    if (this.tokens >= 0) return 0;
    const waitMs = Math.ceil((-this.tokens * 1000) / this.perSecond);
    await this.clock.sleep(waitMs);
    return waitMs;
  }

  /**
   * Takes a token only if one is saved up right now: true if taken, false (nothing taken, nothing reserved) if not.
   * For work that may as well be skipped: it never takes a token a waiting `take()` has reserved.
   */
  tryTake(): boolean {
    this.refill();
    if (this.tokens < 1) return false;
    this.tokens -= 1;
    return true;
  }

  private refill(): void {
    const now = this.clock.now();
    this.tokens = Math.min(this.burst, this.tokens + ((now - this.last) * this.perSecond) / 1000);
    this.last = now;
  }
}
