// The process-wide budget of system-of-record answer bytes held at once. maxResponseBytes bounds one answer; this
// bounds their sum, so that a system (or a proxy in front of it) answering every request with megabytes cannot take
// an owner's heap past its limit: 192 intents in flight × 8 MiB would be 1.5 GiB of bodies before any is parsed.
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
  /** Gives back everything the answer holds (and stops any wait of it). Idempotent. */
  release(): void;
  readonly bytes: number;
}

/**
 * Bytes held at once, at most `limit`, with one exception that keeps it from deadlocking: the oldest open answer
 * never waits (answers that each hold part of their body, all waiting for more, would otherwise wait for each other
 * forever). So held ≤ limit + the oldest answer's bytes ≤ limit + maxResponseBytes. Others wait first come, first
 * served; the oldest one's release makes the next oldest unstoppable, so every waiter is served in the end.
 */
export class ResponseBudget {
  /** Bytes held now. */
  held = 0;
  /** Most bytes held at once since the process started. */
  heldMax = 0;
  /** Takes that had to wait for bytes. */
  waits = 0;
  /** Ablation control for tests, never for production: counts, never waits (the unbounded sum it replaced). */
  enforce = true;
  private readonly open = new Set<HoldImpl>();
  private readonly queue: Waiter[] = [];

  limit: number;

  constructor(limit: number) {
    this.limit = limit;
  }

  /** Answers waiting for bytes now. */
  get waiting(): number {
    return this.queue.length;
  }

  /** A new answer's hold, holding nothing yet. */
  hold(): Hold {
    const h = new HoldImpl(this);
    this.open.add(h);
    return h;
  }

  /** @internal */
  take(hold: HoldImpl, bytes: number, signal: AbortSignal | undefined): Promise<void> {
    if (!this.open.has(hold)) return Promise.reject(new Error("the answer's hold was released"));
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
    if (!this.open.delete(hold)) return;
    this.held -= hold.bytes;
    hold.bytes = 0;
    for (const w of this.queue.filter((w) => w.hold === hold)) {
      this.drop(w);
      w.reject(new Error("the answer's hold was released"));
    }
    this.pump();
  }

  private oldest(): HoldImpl | undefined {
    for (const h of this.open) return h;
    return undefined;
  }

  private grantable(hold: HoldImpl, bytes: number, first: boolean): boolean {
    if (!this.enforce || hold === this.oldest()) return true;
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

  /** Serves waiters in order while they fit, and the oldest answer's waiter wherever it stands. */
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
  private readonly budget: ResponseBudget;
  constructor(budget: ResponseBudget) {
    this.budget = budget;
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
 */
export const sorResponseBudget = new ResponseBudget(defaultResponseBudgetBytes());
