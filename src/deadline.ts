/**
 * `work`'s outcome, or `onExpiry()`'s (what it returns, or throws) once `ms` pass first. The timer is cleared as
 * the race ends and never holds the process open, unless `holdOpen` (for work that may wait on nothing at all, as
 * a module's top-level await can: the event loop would empty and Node end the process before the deadline says
 * why); work that loses the race is left to finish on its own (the race's own handler takes a later failure of
 * it: no unhandled rejection).
 */
export function withDeadline<T, U = never>(work: Promise<T>, ms: number, onExpiry: () => U, opts: { holdOpen?: boolean } = {}): Promise<T | U> {
  let timer: NodeJS.Timeout | undefined;
  const expired = new Promise<U>((resolve, reject) => {
    timer = setTimeout(() => {
      try {
        resolve(onExpiry());
      } catch (err) {
        reject(err);
      }
    }, Math.min(Math.max(0, ms), 2 ** 31 - 1)); // a longer delay would fire at once (Node clamps it to 1 ms)
    if (!opts.holdOpen) timer.unref();
  });
  return Promise.race([work, expired]).finally(() => clearTimeout(timer));
}
