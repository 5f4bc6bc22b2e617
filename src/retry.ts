import { WritError, isRetriable } from "./errors.ts";

export interface RetryOptions {
  /** Attempts in all, including the first. Default 5. */
  maxAttempts?: number;
  /** First backoff in ms. Default 100. */
  initialDelayMs?: number;
  /** Backoff ceiling in ms. Default 5000. */
  maxDelayMs?: number;
  /** Random spread, 0..1, applied to each delay. Default 0.2. */
  jitter?: number;
  /** Return true to stop retrying at once: the error is rethrown as is. */
  bail?: (err: unknown) => boolean;
  /** Defaults to {@link isRetriable}: retry only when every error in the chain is retriable. */
  shouldRetry?: (err: unknown) => boolean;
  signal?: AbortSignal;
}

/**
 * How long a process's start waits out a cluster that is not ready (about 30 s
 * in all): a topic just created, or a broker just restarted or killed, answers
 * NOT_LEADER_FOR_PARTITION or UNKNOWN_TOPIC_OR_PARTITION until its leaders are
 * elected, and kafkajs's admin does not retry every request that can meet it.
 */
export const START_PATIENCE: Readonly<RetryOptions> = { maxAttempts: 14, initialDelayMs: 250, maxDelayMs: 3000 };

/**
 * Runs `fn` with jittered exponential backoff. On exhaustion it throws a
 * `retries_exhausted` error carrying the attempts and elapsed time.
 */
export async function retry<T>(fn: (attempt: number) => Promise<T>, opts: RetryOptions = {}): Promise<T> {
  const maxAttempts = opts.maxAttempts ?? 5;
  const initial = opts.initialDelayMs ?? 100;
  const ceiling = opts.maxDelayMs ?? 5000;
  const jitter = opts.jitter ?? 0.2;
  const shouldRetry = opts.shouldRetry ?? isRetriable;
  const started = Date.now();
  let lastError: unknown;
  for (let attempt = 1; attempt <= maxAttempts; attempt++) {
    try {
      return await fn(attempt);
    } catch (err) {
      lastError = err;
      if (opts.bail?.(err) || !shouldRetry(err) || opts.signal?.aborted) throw err;
      if (attempt === maxAttempts) break;
      await new Promise((resolve) => setTimeout(resolve, backoffMs(attempt, { initialDelayMs: initial, maxDelayMs: ceiling, jitter })));
    }
  }
  throw new WritError("retries_exhausted", `gave up after ${maxAttempts} attempts`, {
    retriable: false,
    cause: lastError,
    context: { attempts: maxAttempts, elapsedMs: Date.now() - started },
  });
}

/** The wait after try `attempt` (1-based): `initialDelayMs` doubling up to `maxDelayMs`, ±`jitter`. Defaults as {@link retry}'s. */
export function backoffMs(attempt: number, opts: Pick<RetryOptions, "initialDelayMs" | "maxDelayMs" | "jitter"> = {}): number {
  const jitter = opts.jitter ?? 0.2;
  const base = Math.min(opts.maxDelayMs ?? 5000, (opts.initialDelayMs ?? 100) * 2 ** Math.min(attempt - 1, 30));
  return base * (1 - jitter + Math.random() * 2 * jitter);
}
