// Poll a predicate until it yields a truthy value or a deadline passes. No fixed
// sleeps in tests: wait for the condition itself, with a bound.

export interface WaitForOptions {
  /** Give up after this long (default 30 s). */
  timeoutMs?: number;
  /** Pause between attempts (default 100 ms). */
  intervalMs?: number;
  /** Text for the timeout error (a function is evaluated at timeout, e.g. to show current state). */
  message?: string | (() => string);
}

type Falsy = false | 0 | '' | null | undefined;

/**
 * Resolves with the first truthy value `predicate` returns. A predicate that
 * throws counts as "not yet"; its last error is attached to the timeout error.
 */
export async function waitFor<T>(
  predicate: () => T | Falsy | Promise<T | Falsy>,
  { timeoutMs = 30_000, intervalMs = 100, message }: WaitForOptions = {},
): Promise<T> {
  const deadline = Date.now() + timeoutMs;
  let lastError: unknown;
  for (;;) {
    try {
      const value = await predicate();
      if (value) return value as T;
    } catch (err) {
      lastError = err;
    }
    if (Date.now() >= deadline) break;
    await new Promise((r) => setTimeout(r, Math.max(0, Math.min(intervalMs, deadline - Date.now()))));
  }
  const text = typeof message === 'function' ? message() : (message ?? 'condition not met');
  const suffix = lastError === undefined ? '' : ` (last error: ${lastError instanceof Error ? lastError.message : String(lastError)})`;
  throw new Error(`waitFor timed out after ${timeoutMs} ms: ${text}${suffix}`, { cause: lastError });
}
