// The fault suite's one source of randomness for its schedule (which faults, when, on what; which intents are
// resubmitted), so `--seed N` replays a run's schedule. pure-rand: fast-check's generator, already a dependency.
import { uniformFloat64 } from "pure-rand/distribution/uniformFloat64";
import { uniformInt } from "pure-rand/distribution/uniformInt";
import { xoroshiro128plus } from "pure-rand/generator/xoroshiro128plus";

export interface Rng {
  /** In [0, 1). */
  next(): number;
  /** In [from, to], both included. */
  int(from: number, to: number): number;
  pick<T>(list: readonly T[]): T;
  /** A generator of its own, derived from this one: parts of the schedule stay stable when another part draws more. */
  fork(): Rng;
}

export function seededRng(seed: number): Rng {
  const gen = xoroshiro128plus(seed);
  const rng: Rng = {
    next: () => uniformFloat64(gen),
    int: (from, to) => uniformInt(gen, from, to),
    pick: (list) => list[uniformInt(gen, 0, list.length - 1)]!,
    fork: () => seededRng(uniformInt(gen, 0, 0x7fffffff)),
  };
  return rng;
}
