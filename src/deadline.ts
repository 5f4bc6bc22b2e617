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

/**
 * Imports the ES module at `url` within `ms`, else throws `onExpiry(why)`'s error (`why`: what a person reads of the
 * cause, for the error's message, after what names the module and its deadline). An import cannot be cancelled: one
 * whose top-level code never settles (an await on a connection that never comes) is left pending, and the caller
 * should end the process, which that import may otherwise hold. The deadline holds the process open meanwhile: with
 * nothing else to wait on, Node would end it first (exit 13, "unsettled top-level await"), without saying which
 * module or setting.
 */
export function importWithin(url: string, ms: number, onExpiry: (why: string) => Error): Promise<unknown> {
  return withDeadline(
    import(url) as Promise<unknown>,
    ms,
    () => {
      throw onExpiry("its top-level code has not settled (an await that never resolves?), and an import cannot be cancelled");
    },
    { holdOpen: true },
  );
}
