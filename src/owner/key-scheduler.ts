/**
 * Key-ordered concurrency inside one partition, the ordering Confluent's
 * Parallel Consumer calls KEY: items that share a key run one at a time, in
 * the order they were added (offset order); items with no key in common run
 * side by side, at most `maxInFlight` at once.
 *
 * An item is ready when it is at the head of the queue of every key it holds.
 * Adding, finishing and taking are O(keys) plus the ready list's ordered
 * insert; nothing scans the waiting items. See docs/architecture.md §4.2.
 */
export class KeyScheduler<T extends { readonly seq: number }> {
  private readonly queues = new Map<string, T[]>();
  private readonly keysOf = new Map<T, readonly string[]>();
  /** Ready, not yet started, in `seq` order. */
  private readonly ready: T[] = [];
  /** The same items as `ready`, for an O(1) "already ready?" (an item freed on two keys by one `done`). */
  private readonly readySet = new Set<T>();
  private readonly running = new Set<T>();
  private readonly maxInFlight: number;

  constructor(maxInFlight: number) {
    this.maxInFlight = maxInFlight;
  }

  /** Adds an item after every item added before it; `keys` may repeat (deduplicated). */
  add(item: T, keys: readonly string[]): void {
    const unique = [...new Set(keys)];
    this.keysOf.set(item, unique);
    for (const key of unique) {
      const queue = this.queues.get(key);
      if (queue) queue.push(item);
      else this.queues.set(key, [item]);
    }
    if (this.isHead(item)) this.insertReady(item);
  }

  /** Items that may start now, in order, up to the in-flight bound; they count as running until {@link done}. */
  take(): T[] {
    const out: T[] = [];
    while (this.ready.length > 0 && this.running.size < this.maxInFlight) {
      const item = this.ready.shift()!;
      this.readySet.delete(item);
      this.running.add(item);
      out.push(item);
    }
    return out;
  }

  /** The item finished: the next item of each of its keys may become ready. */
  done(item: T): void {
    if (!this.running.delete(item)) return;
    const keys = this.keysOf.get(item) ?? [];
    this.keysOf.delete(item);
    for (const key of keys) {
      const queue = this.queues.get(key);
      if (!queue) continue;
      const at = queue.indexOf(item);
      if (at >= 0) queue.splice(at, 1);
      if (queue.length === 0) {
        this.queues.delete(key);
        continue;
      }
      const head = queue[0]!;
      if (!this.running.has(head) && !this.readySet.has(head) && this.isHead(head)) this.insertReady(head);
    }
  }

  get inFlight(): number {
    return this.running.size;
  }

  /** Items added and not yet done (waiting or running). */
  get size(): number {
    return this.keysOf.size;
  }

  private isHead(item: T): boolean {
    return (this.keysOf.get(item) ?? []).every((key) => this.queues.get(key)?.[0] === item);
  }

  private insertReady(item: T): void {
    let lo = 0;
    let hi = this.ready.length;
    while (lo < hi) {
      const mid = (lo + hi) >> 1;
      if (this.ready[mid]!.seq < item.seq) lo = mid + 1;
      else hi = mid;
    }
    this.ready.splice(lo, 0, item);
    this.readySet.add(item);
  }
}
