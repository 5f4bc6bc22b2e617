import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { KeyScheduler } from "../../../src/owner/key-scheduler.ts";

interface Item {
  readonly seq: number;
  readonly name: string;
}

function scheduler(maxInFlight = 16) {
  const s = new KeyScheduler<Item>(maxInFlight);
  let seq = 0;
  const add = (name: string, keys: string[]): Item => {
    const item = { seq: ++seq, name };
    s.add(item, keys);
    return item;
  };
  const take = () => s.take().map((i) => i.name);
  return { s, add, take };
}

describe("KeyScheduler (KEY ordering inside a partition)", () => {
  it("runs items that share a key one at a time, in add order", () => {
    const { s, add, take } = scheduler();
    const a = add("a", ["ticket:1"]);
    const b = add("b", ["ticket:1"]);
    add("c", ["ticket:1"]);
    expect(take()).toEqual(["a"]);
    expect(take()).toEqual([]);
    s.done(a);
    expect(take()).toEqual(["b"]);
    s.done(b);
    expect(take()).toEqual(["c"]);
    expect(s.inFlight).toBe(1);
    expect(s.size).toBe(1);
  });

  it("runs items with no key in common side by side, in add order", () => {
    const { s, add, take } = scheduler();
    add("a", ["ticket:1"]);
    add("b", ["ticket:2"]);
    add("c", ["ticket:3"]);
    expect(take()).toEqual(["a", "b", "c"]);
    expect(s.inFlight).toBe(3);
  });

  it("keeps at most maxInFlight running and starts the next when one is done", () => {
    const { s, add, take } = scheduler(2);
    const items = ["a", "b", "c", "d", "e"].map((n) => add(n, [`k:${n}`]));
    expect(take()).toEqual(["a", "b"]);
    expect(take()).toEqual([]);
    s.done(items[1]!);
    expect(take()).toEqual(["c"]);
    expect(s.inFlight).toBe(2);
    s.done(items[0]!);
    s.done(items[2]!);
    expect(take()).toEqual(["d", "e"]);
  });

  it("makes an item holding two keys wait for both", () => {
    const { s, add, take } = scheduler();
    const a = add("a", ["entity:1"]);
    const b = add("b", ["key:k"]);
    const c = add("c", ["entity:1", "key:k"]);
    expect(take()).toEqual(["a", "b"]);
    s.done(a);
    expect(take()).toEqual([]);
    s.done(b);
    expect(take()).toEqual(["c"]);
    s.done(c);
    expect(s.size).toBe(0);
  });

  it("keeps a later item of a key behind an earlier one that waits on another key", () => {
    const { s, add, take } = scheduler();
    const a = add("a", ["x"]);
    const b = add("b", ["x", "y"]);
    add("c", ["y"]);
    expect(take()).toEqual(["a"]);
    s.done(a);
    expect(take()).toEqual(["b"]);
    s.done(b);
    expect(take()).toEqual(["c"]);
  });

  it("treats a key given twice as one, and ignores done() of an item that is not running", () => {
    const { s, add, take } = scheduler();
    const a = add("a", ["x", "x"]);
    const b = add("b", ["x"]);
    s.done(b); // waiting, not running: no effect
    expect(take()).toEqual(["a"]);
    s.done(a);
    s.done(a);
    expect(take()).toEqual(["b"]);
    expect(s.size).toBe(1);
  });

  it("never runs two items that share a key, starts each key's items in add order, and runs everything", () => {
    const keys = ["k0", "k1", "k2", "k3", "k4"];
    // an op is: add an item holding these keys, or finish the running item at this index
    const op = fc.oneof(
      fc.record({ add: fc.uniqueArray(fc.constantFrom(...keys), { minLength: 1, maxLength: 3 }) }),
      fc.record({ finish: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 4 }), fc.array(op, { maxLength: 80 }), (maxInFlight, ops) => {
        const s = new KeyScheduler<Item>(maxInFlight);
        const keysOf = new Map<Item, string[]>();
        const added = new Map<string, Item[]>(); // per key, in add order
        const started = new Map<string, Item[]>(); // per key, in start order
        const running: Item[] = [];
        let seq = 0;
        const startReady = () => {
          const now = s.take();
          expect(now.map((i) => i.seq)).toEqual([...now.map((i) => i.seq)].sort((x, y) => x - y));
          for (const item of now) {
            for (const k of keysOf.get(item)!) {
              expect(running.some((r) => keysOf.get(r)!.includes(k))).toBe(false);
              started.set(k, [...(started.get(k) ?? []), item]);
            }
            running.push(item);
          }
          expect(running.length).toBeLessThanOrEqual(maxInFlight);
          expect(s.inFlight).toBe(running.length);
        };
        for (const o of ops) {
          if ("add" in o) {
            const item = { seq: ++seq, name: `i${seq}` };
            keysOf.set(item, o.add);
            for (const k of o.add) added.set(k, [...(added.get(k) ?? []), item]);
            s.add(item, o.add);
          } else if (running.length > 0) {
            const [item] = running.splice(o.finish % running.length, 1);
            s.done(item!);
          }
          startReady();
          // no stall: something waits only while something runs
          if (s.size > 0) expect(running.length).toBeGreaterThan(0);
        }
        while (running.length > 0) {
          s.done(running.shift()!);
          startReady();
        }
        expect(s.size).toBe(0);
        for (const k of keys) expect(started.get(k) ?? []).toEqual(added.get(k) ?? []);
      }),
      { numRuns: 500 },
    );
  });
});
