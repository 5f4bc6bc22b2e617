// The process-wide budget of system-of-record answer bytes held at once. maxResponseBytes bounds one answer; this
// bounds their sum, so that a system (or a proxy in front of it) answering every request with megabytes cannot take
// an owner's heap past its limit: 192 intents in flight × 8 MiB would be 1.5 GiB of bodies before any is parsed.
// An answer's body is not all: the record parsed from a read lives on in its intent until the intent's run ends
// (its PATCH, a conflict's reply), so answers read within one intent's run (a chain) stay charged after their
// release, as the largest of them, until the run ends.
import { AsyncLocalStorage } from "node:async_hooks";
import { getHeapStatistics } from "node:v8";

/** The default budget: a quarter of the heap limit (bodies become strings, then parsed objects), at most 256 MiB. */
export function defaultResponseBudgetBytes(): number {
  return Math.max(1024 * 1024, Math.min(256 * 1024 * 1024, Math.floor(getHeapStatistics().heap_size_limit / 4)));
}

interface Waiter {
  hold: HoldImpl;
  bytes: number;
  resolve: () => void;
  reject: (reason: unknown) => void;
  signal: AbortSignal | undefined;
  onAbort: () => void;
}

/** The bytes one answer holds, from its first chunk until the adapter is done with its body. */
export interface Hold {
  /** Takes `bytes` more; waits while the budget is spent, rejecting with the signal's reason if it aborts first. */
  take(bytes: number, signal?: AbortSignal): Promise<void>;
  /** Gives back everything the answer holds (and stops any wait of it); in a chain, its bytes stay kept. Idempotent. */
  release(): void;
  readonly bytes: number;
}

/**
 * The answers of one run (an intent's, from its first answer): what they hold open, and `kept`, the largest answer
 * released while the chain went on (what was parsed from it may still be referenced). A hold made outside any run
 * has a chain of its own that keeps nothing: it ends with its release.
 */
class Chain {
  kept = 0;
  /** Holds open. */
  open = 0;
  /** Keeps nothing more; leaves the order once its holds are released. */
  ended: boolean;
  constructor(ended: boolean) {
    this.ended = ended;
  }
}

/** One run's place in the async context: its current chain, made at its first answer. */
interface Scope {
  chain: Chain | undefined;
  done: boolean;
}

/**
 * Bytes held at once, at most `limit`, with one exception that keeps it from deadlocking: the oldest open chain
 * never waits (runs that each keep an answer, or hold part of one, all waiting for more, would otherwise wait for
 * each other forever). A chain's charge is its open answers' bytes plus the largest answer it kept; so held ≤ limit
 * + the oldest chain's charge, for an owner's intent (one answer open at a time) ≤ limit + 2 × maxResponseBytes.
 * Others wait first come, first served; the oldest chain's end makes the next oldest unstoppable, so every waiter is
 * served in the end (runs end: their requests have deadlines).
 */
export class ResponseBudget {
  /** Bytes held now: answers open, and those kept by chains. */
  held = 0;
  /** Most bytes held at once since the process started. */
  heldMax = 0;
  /** Takes that had to wait for bytes. */
  waits = 0;
  /** Ablation control for tests, never for production: counts, never waits (the unbounded sum it replaced). */
  enforce = true;
  /** Ablation control for tests, never for production: a released answer keeps nothing, runs or not (as before chains). */
  chaining = true;
  /** Chains in the order of their first answer: the first one never waits. */
  private readonly chains = new Set<Chain>();
  private readonly queue: Waiter[] = [];
  private readonly scopes = new AsyncLocalStorage<Scope>();

  limit: number;

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Answers waiting for bytes now. */
  get waiting(): number {
    return this.queue.length;
  }

  /** Chains open now (runs with answers kept or open, and answers open outside runs). */
  get open(): number {
    return this.chains.size;
  }

  /**
   * Runs `fn` as one run: the answers its calls hold are one chain, whose kept bytes are given back when `fn`
   * settles, however it ends (or at {@link letGo}).
   */
  async run<T>(fn: () => Promise<T>): Promise<T> {
    const scope: Scope = { chain: undefined, done: false };
    try {
      return await this.scopes.run(scope, fn);
    } finally {
      scope.done = true;
      if (scope.chain) this.end(scope.chain);
    }
  }

  /**
   * The current run keeps nothing of its answers any more (it drops what it parsed, before a pause): its chain
   * ends, and its next answer starts a new one, the youngest.
   */
  letGo(): void {
    const scope = this.scopes.getStore();
    if (scope?.chain === undefined) return;
    const chain = scope.chain;
    scope.chain = undefined;
    this.end(chain);
  }

  /** A new answer's hold, holding nothing yet: in the current run's chain, else in one of its own. */
  hold(): Hold {
    const scope = this.chaining ? this.scopes.getStore() : undefined;
    let chain: Chain;
    if (scope === undefined || scope.done) chain = new Chain(true);
    else chain = scope.chain ??= new Chain(false);
    this.chains.add(chain);
    chain.open++;
    return new HoldImpl(this, chain);
  }

  /** @internal */
  take(hold: HoldImpl, bytes: number, signal: AbortSignal | undefined): Promise<void> {
    if (hold.closed) return Promise.reject(new Error("the answer's hold was released"));
    if (signal?.aborted) return Promise.reject(signal.reason);
    if (this.grantable(hold, bytes, this.queue.length === 0)) {
      this.grant(hold, bytes);
      return Promise.resolve();
    }
    this.waits++;
    return new Promise<void>((resolve, reject) => {
      const waiter: Waiter = {
        hold,
        bytes,
        resolve,
        reject,
        signal,
        onAbort: () => {
          this.drop(waiter);
          reject(signal?.reason);
        },
      };
      signal?.addEventListener("abort", waiter.onAbort, { once: true });
      this.queue.push(waiter);
    });
  }

  /** @internal */
  release(hold: HoldImpl): void {
    if (hold.closed) return;
    hold.closed = true;
    const chain = hold.chain;
    chain.open--;
    // Kept by a chain that goes on: only what the largest answer adds to what it keeps already.
    if (!chain.ended && hold.bytes > chain.kept) {
      this.held -= chain.kept;
      chain.kept = hold.bytes;
    } else {
      this.held -= hold.bytes;
    }
    hold.bytes = 0;
    if (chain.ended && chain.open === 0) this.chains.delete(chain);
    if (this.queue.length > 0) {
      for (const w of this.queue.filter((w) => w.hold === hold)) {
        this.drop(w);
        w.reject(new Error("the answer's hold was released"));
      }
      this.pump();
    }
  }

  /** Gives back what `chain` keeps; its open holds give theirs back on their release. Idempotent. */
  private end(chain: Chain): void {
    if (chain.ended) return;
    chain.ended = true;
    this.held -= chain.kept;
    chain.kept = 0;
    if (chain.open === 0) this.chains.delete(chain);
    if (this.queue.length > 0) this.pump();
  }

  private oldest(): Chain | undefined {
    for (const c of this.chains) return c;
    return undefined;
  }

  private grantable(hold: HoldImpl, bytes: number, first: boolean): boolean {
    if (!this.enforce || hold.chain === this.oldest()) return true;
    return first && this.held + bytes <= this.limit;
  }

  private grant(hold: HoldImpl, bytes: number): void {
    hold.bytes += bytes;
    this.held += bytes;
    if (this.held > this.heldMax) this.heldMax = this.held;
  }

  private drop(w: Waiter): void {
    const i = this.queue.indexOf(w);
    if (i >= 0) this.queue.splice(i, 1);
    w.signal?.removeEventListener("abort", w.onAbort);
  }

  /** Serves waiters in order while they fit, and the oldest chain's waiters wherever they stand. */
  private pump(): void {
    let inOrder = true;
    for (const w of [...this.queue]) {
      if (this.grantable(w.hold, w.bytes, inOrder)) {
        this.drop(w);
        this.grant(w.hold, w.bytes);
        w.resolve();
      } else {
        inOrder = false;
      }
    }
  }

  /** Sets the limit (the owner's sorResponseBytesInFlight at its start); a higher one serves waiters at once. */
  setLimit(limit: number): void {
    this.limit = limit;
    this.pump();
  }
}

class HoldImpl implements Hold {
  bytes = 0;
  closed = false;
  readonly chain: Chain;
  private readonly budget: ResponseBudget;
  constructor(budget: ResponseBudget, chain: Chain) {
    this.budget = budget;
    this.chain = chain;
  }
  take(bytes: number, signal?: AbortSignal): Promise<void> {
    return this.budget.take(this, bytes, signal);
  }
  release(): void {
    this.budget.release(this);
  }
}

/**
 * The process's budget, shared by every HTTP system of record in it. An owner sets its limit at start
 * (sorResponseBytesInFlight, WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT); until then, and in other processes, the default.
 * An owner runs each intent (and each escalation's resolution) as one of its runs.
 */
export const sorResponseBudget = new ResponseBudget(defaultResponseBudgetBytes());
