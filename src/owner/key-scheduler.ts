/**
 * Key-ordered concurrency inside one partition, the ordering Confluent's
 * Parallel Consumer calls KEY: items that share a key run one at a time, in
 * the order they were added (offset order); items with no key in common run
 * side by side, at most `maxInFlight` at once.
 *
 * An item is ready when it is at the head of the queue of every key it holds.
 * An item paused by an outage gives its in-flight place back while it waits
 * ({@link pause}) and asks for one again before its next try ({@link resume});
 * it stays at the head of its keys' queues, so nothing of its record or intent
 * key passes it. At most `maxPaused` items wait without a place; one that
 * pauses beyond that keeps its place while it waits.
 *
 * Each item has a group (the intent's system of record), and each group has
 * `maxPaused` places of its own: an outage of one system never uses the places
 * another's outage needs, so two systems down at once still leave the in-flight
 * places to the rest. While items of a group are paused, its items not started
 * yet start only while, should every started item of the group pause too, each
 * would find one of its places: an outage's intents fill at most that bound,
 * and the other groups' items keep the in-flight places. Items started and not
 * done are at most `maxInFlight + groups × maxPaused`. Adding, finishing and pausing
 * are O(keys) plus an ordered insert; taking is O(groups) per item taken;
 * nothing scans the waiting items. See docs/architecture.md §4.2 and §7.1.
 */
export class KeyScheduler<T extends { readonly seq: number }> {
  private readonly queues = new Map<string, T[]>();
  private readonly entries = new Map<T, Entry<T>>();
  /** By name; as many as the systems of record (they are never removed). */
  private readonly groups = new Map<string, Group<T>>();
  /** Paused items that asked for their place back, in `seq` order. */
  private readonly resuming: T[] = [];
  private running = 0;
  private pausedNow = 0;
  private readonly maxInFlight: number;
  private readonly maxPaused: number;

  constructor(maxInFlight: number, maxPaused: number) {
    this.maxInFlight = maxInFlight;
    this.maxPaused = maxPaused;
  }

  /** Adds an item after every item added before it; `keys` may repeat (deduplicated). */
  add(item: T, keys: readonly string[], group = ""): void {
    const unique = [...new Set(keys)];
    let g = this.groups.get(group);
    if (!g) this.groups.set(group, (g = { ready: [], fresh: 0, outage: 0, reserved: 0 }));
    this.entries.set(item, { keys: unique, group: g, state: "waiting", outage: false, reserved: false });
    for (const key of unique) {
      const queue = this.queues.get(key);
      if (queue) queue.push(item);
      else this.queues.set(key, [item]);
    }
    if (this.isHead(item)) this.makeReady(item);
  }

  /**
   * Items that may start now, and paused items given their place back, in `seq` order, up to the in-flight
   * bound; they count as running until {@link done} or {@link pause}. `startNew` false: paused items only.
   */
  take(startNew = true): T[] {
    const out: T[] = [];
    while (this.running < this.maxInFlight) {
      let best = this.resuming[0];
      let from: Group<T> | undefined;
      if (startNew) {
        for (const g of this.groups.values()) {
          const head = g.ready[0];
          if (head && (g.outage === 0 || g.reserved + g.fresh < this.maxPaused) && (!best || head.seq < best.seq)) {
            best = head;
            from = g;
          }
        }
      }
      if (!best) break;
      const entry = this.entries.get(best)!;
      if (from) {
        from.ready.shift();
        from.fresh++;
      } else {
        this.resuming.shift();
        this.pausedNow--;
      }
      entry.state = "running";
      this.running++;
      out.push(best);
    }
    return out;
  }

  /**
   * The running item waits out an outage: it gives its in-flight place back if it holds one of its group's
   * `maxPaused` places or one is free (it keeps that one until done), and returns whether it did. Its keys stay held.
   */
  pause(item: T): boolean {
    const entry = this.entries.get(item);
    if (!entry || entry.state !== "running") return false;
    if (!entry.outage) {
      entry.outage = true;
      entry.group.fresh--;
      entry.group.outage++;
    }
    if (!entry.reserved && entry.group.reserved < this.maxPaused) {
      entry.reserved = true;
      entry.group.reserved++;
    }
    if (!entry.reserved) return false;
    entry.state = "paused";
    this.running--;
    this.pausedNow++;
    return true;
  }

  /** The paused item's wait is over: it asks for an in-flight place again ({@link take} hands it out). */
  resume(item: T): void {
    const entry = this.entries.get(item);
    if (!entry || entry.state !== "paused") return;
    entry.state = "resuming";
    insertBySeq(this.resuming, item);
  }

  /** The item finished (running or paused): the next item of each of its keys may become ready. */
  done(item: T): void {
    const entry = this.entries.get(item);
    if (!entry || entry.state === "waiting" || entry.state === "ready") return;
    if (entry.state === "running") {
      this.running--;
      if (!entry.outage) entry.group.fresh--;
    } else {
      this.pausedNow--;
      if (entry.state === "resuming") this.resuming.splice(this.resuming.indexOf(item), 1);
    }
    if (entry.outage) entry.group.outage--;
    if (entry.reserved) entry.group.reserved--;
    this.entries.delete(item);
    for (const key of entry.keys) {
      const queue = this.queues.get(key);
      if (!queue) continue;
      const at = queue.indexOf(item);
      if (at >= 0) queue.splice(at, 1);
      if (queue.length === 0) {
        this.queues.delete(key);
        continue;
      }
      const head = queue[0]!;
      if (this.entries.get(head)?.state === "waiting" && this.isHead(head)) this.makeReady(head);
    }
  }

  /** Items holding an in-flight place. */
  get inFlight(): number {
    return this.running;
  }

  /** Items paused by an outage without an in-flight place (waiting out the pause, or for a place). */
  get paused(): number {
    return this.pausedNow;
  }

  /** Items added and not yet done (waiting, running or paused). */
  get size(): number {
    return this.entries.size;
  }

  /** Whether an item added and not yet done holds `key`. */
  holds(key: string): boolean {
    return this.queues.has(key);
  }

  private isHead(item: T): boolean {
    return (this.entries.get(item)?.keys ?? []).every((key) => this.queues.get(key)?.[0] === item);
  }

  private makeReady(item: T): void {
    const entry = this.entries.get(item)!;
    entry.state = "ready";
    insertBySeq(entry.group.ready, item);
  }
}

interface Entry<T> {
  readonly keys: readonly string[];
  readonly group: Group<T>;
  /** `resuming`: paused, and asking for its in-flight place back. */
  state: "waiting" | "ready" | "running" | "paused" | "resuming";
  /** Paused at least once since it started. */
  outage: boolean;
  /** Holds one of its group's `maxPaused` places (from its first pause that gave its in-flight place back until done). */
  reserved: boolean;
}

interface Group<T> {
  /** Ready, not yet started, in `seq` order. */
  readonly ready: T[];
  /** Running items that never paused. */
  fresh: number;
  /** Items that paused and are not done. */
  outage: number;
  /** Its items holding one of its `maxPaused` places. */
  reserved: number;
}

function insertBySeq<T extends { readonly seq: number }>(list: T[], item: T): void {
  let lo = 0;
  let hi = list.length;
  while (lo < hi) {
    const mid = (lo + hi) >> 1;
    if (list[mid]!.seq < item.seq) lo = mid + 1;
    else hi = mid;
  }
  list.splice(lo, 0, item);
}
