import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { KeyScheduler } from "../../../src/owner/key-scheduler.ts";

interface Item {
  readonly seq: number;
  readonly name: string;
}

function scheduler(maxInFlight = 16, maxPaused = 16) {
  const s = new KeyScheduler<Item>(maxInFlight, maxPaused);
  let seq = 0;
  const add = (name: string, keys: string[], group?: string): Item => {
    const item = { seq: ++seq, name };
    s.add(item, keys, group);
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

  it("gives a paused item's place to another record while its keys stay held, and its place back in seq order", () => {
    const { s, add, take } = scheduler(2, 4);
    const a = add("a", ["ticket:1"], "helpdesk");
    add("b", ["ticket:2"], "helpdesk");
    add("c", ["ticket:1"], "billing"); // behind a on its record
    const d = add("d", ["invoice:1"], "billing");
    expect(take()).toEqual(["a", "b"]);
    expect(s.pause(a)).toBe(true);
    expect(s.inFlight).toBe(1);
    expect(s.paused).toBe(1);
    expect(take()).toEqual(["d"]); // not c: a still holds ticket:1
    s.resume(a);
    expect(take()).toEqual([]); // no place free
    s.done(a); // done while it waits for its place (its session ended): its keys go, c may start
    expect(s.paused).toBe(0);
    expect(take()).toEqual([]); // still no place free
    s.done(d);
    expect(take()).toEqual(["c"]);
  });

  it("hands a resumed item its place before later ready items, and within the in-flight bound", () => {
    const { s, add, take } = scheduler(1, 4);
    const a = add("a", ["k:a"]);
    expect(take()).toEqual(["a"]);
    expect(s.pause(a)).toBe(true);
    const b = add("b", ["k:b"]);
    expect(take()).toEqual(["b"]);
    add("c", ["k:c"]);
    s.resume(a);
    expect(take()).toEqual([]);
    expect(s.inFlight).toBe(1);
    s.done(b);
    expect(take()).toEqual(["a"]); // a (seq 1) before c (seq 3)
    expect(s.paused).toBe(0);
    expect(s.take(false)).toEqual([]);
  });

  it("lets at most maxPaused items of a group give their place back; a later one keeps its place", () => {
    const { s, add, take } = scheduler(3, 1);
    const a = add("a", ["k:a"], "x");
    const b = add("b", ["k:b"], "x");
    expect(take()).toEqual(["a", "b"]);
    expect(s.pause(a)).toBe(true);
    expect(s.pause(b)).toBe(false);
    expect(s.inFlight).toBe(1);
    expect(s.paused).toBe(1);
    s.resume(a);
    expect(take()).toEqual(["a"]);
    expect(s.pause(a)).toBe(true); // its paused place stays its own
    s.done(a);
    expect(s.pause(b)).toBe(true); // now free
  });

  it("gives each group places of its own: a second system going down while the first's fill their bound still gives its in-flight places back", () => {
    const { s, add, take } = scheduler(2, 2);
    const x = ["x1", "x2"].map((n) => add(n, [`k:${n}`], "x"));
    expect(take()).toEqual(["x1", "x2"]);
    for (const item of x) expect(s.pause(item)).toBe(true); // x's outage fills its bound
    const y = ["y1", "y2"].map((n) => add(n, [`k:${n}`], "y"));
    expect(take()).toEqual(["y1", "y2"]); // y, still up, takes every in-flight place
    for (const item of y) expect(s.pause(item)).toBe(true); // then y goes down too: its places come back
    expect(s.inFlight).toBe(0);
    expect(s.paused).toBe(4);
    add("z1", ["k:z1"], "z");
    add("y3", ["k:y3"], "y");
    expect(take()).toEqual(["z1"]); // the third system runs; y's later intents wait unstarted
  });

  it("starts no more of a group whose paused items fill the bound; other groups run", () => {
    const { s, add, take } = scheduler(2, 2);
    const down = ["d1", "d2", "d3", "d4"].map((n) => add(n, [`k:${n}`], "down"));
    add("h1", ["k:h1"], "healthy");
    expect(take()).toEqual(["d1", "d2"]);
    expect(s.pause(down[0]!)).toBe(true);
    // One paused and d2 running (it may pause too): together they fill the bound, so d3 waits; h1 starts.
    expect(take()).toEqual(["h1"]);
    expect(s.pause(down[1]!)).toBe(true);
    expect(take()).toEqual([]);
    expect(s.inFlight).toBe(1);
    s.resume(down[0]!);
    expect(take()).toEqual(["d1"]);
    s.done(down[0]!); // the system answers: one of its paused items done, room for one more
    expect(take()).toEqual(["d3"]);
  });

  it("with no room for a paused place, starts nothing more of that group while a place is free", () => {
    const { s, add, take } = scheduler(4, 1);
    const a = add("a", ["k:a"], "down");
    const b = add("b", ["k:b"], "down");
    expect(take()).toEqual(["a", "b"]);
    expect(s.pause(a)).toBe(true);
    expect(s.pause(b)).toBe(false); // keeps its place
    add("c", ["k:c"], "down");
    add("e", ["k:e"], "up");
    expect(take()).toEqual(["e"]);
    expect(s.inFlight).toBe(2);
  });

  it("never runs two items that share a key, starts each key's items in add order, bounds what is paused, and runs everything", () => {
    const keys = ["k0", "k1", "k2", "k3", "k4"];
    const groups = ["g0", "g1", "g2"];
    // an op is: add an item holding these keys, finish / pause the running item at this index, resume the paused one at this index
    const op = fc.oneof(
      fc.record({ add: fc.uniqueArray(fc.constantFrom(...keys), { minLength: 1, maxLength: 3 }), group: fc.constantFrom(...groups) }),
      fc.record({ finish: fc.nat() }),
      fc.record({ pause: fc.nat() }),
      fc.record({ resume: fc.nat() }),
    );
    fc.assert(
      fc.property(fc.integer({ min: 1, max: 4 }), fc.integer({ min: 1, max: 3 }), fc.array(op, { maxLength: 80 }), (maxInFlight, maxPaused, ops) => {
        const s = new KeyScheduler<Item>(maxInFlight, maxPaused);
        const keysOf = new Map<Item, string[]>();
        const groupOf = new Map<Item, string>();
        const added = new Map<string, Item[]>(); // per key, in add order
        const started = new Map<string, Item[]>(); // per key, in first-start order
        const live: Item[] = []; // added and not done, in add order
        const running: Item[] = []; // holding an in-flight place
        const paused: Item[] = []; // paused without a place, not resumed
        const resuming: Item[] = []; // paused, waiting for their place back
        const pausedOnce = new Set<Item>();
        let seq = 0;
        const startReady = () => {
          const now = s.take();
          expect(now.map((i) => i.seq)).toEqual([...now.map((i) => i.seq)].sort((x, y) => x - y));
          for (const item of now) {
            const back = resuming.indexOf(item);
            if (back >= 0) resuming.splice(back, 1);
            else {
              for (const k of keysOf.get(item)!) {
                // nothing that holds the key (running or paused) beside it
                expect([...running, ...paused, ...resuming].some((r) => keysOf.get(r)!.includes(k))).toBe(false);
                started.set(k, [...(started.get(k) ?? []), item]);
              }
            }
            running.push(item);
          }
          expect(running.length).toBeLessThanOrEqual(maxInFlight);
          expect(s.inFlight).toBe(running.length);
          expect(s.paused).toBe(paused.length + resuming.length);
          for (const g of groups) {
            expect([...paused, ...resuming].filter((i) => groupOf.get(i) === g).length).toBeLessThanOrEqual(maxPaused);
          }
          if (running.length < maxInFlight) {
            // a free place: no paused item waits for one, and no ready item of a group without paused items waits
            expect(resuming).toEqual([]);
            const holding = new Set([...running, ...paused, ...resuming]);
            for (const item of live) {
              if (holding.has(item) || [...pausedOnce].some((p) => groupOf.get(p) === groupOf.get(item))) continue;
              const ready = keysOf.get(item)!.every((k) => live.find((x) => keysOf.get(x)!.includes(k)) === item);
              expect(ready).toBe(false);
            }
          }
        };
        const finish = (item: Item) => {
          for (const list of [running, paused, resuming, live]) {
            const at = list.indexOf(item);
            if (at >= 0) list.splice(at, 1);
          }
          pausedOnce.delete(item);
          s.done(item);
        };
        for (const o of ops) {
          if ("add" in o) {
            const item = { seq: ++seq, name: `i${seq}` };
            keysOf.set(item, o.add);
            groupOf.set(item, o.group);
            live.push(item);
            for (const k of o.add) added.set(k, [...(added.get(k) ?? []), item]);
            s.add(item, o.add, o.group);
          } else if ("finish" in o && running.length > 0) {
            finish(running[o.finish % running.length]!);
          } else if ("pause" in o && running.length > 0) {
            const item = running[o.pause % running.length]!;
            pausedOnce.add(item);
            if (s.pause(item)) {
              running.splice(running.indexOf(item), 1);
              paused.push(item);
            }
          } else if ("resume" in o && paused.length > 0) {
            const [item] = paused.splice(o.resume % paused.length, 1);
            resuming.push(item!);
            s.resume(item!);
          }
          startReady();
          // no stall: something waits only while something runs or is paused
          if (s.size > 0) expect(running.length + paused.length + resuming.length).toBeGreaterThan(0);
        }
        while (s.size > 0) {
          const item = running[0];
          if (item) finish(item);
          else {
            const back = paused.shift();
            if (back) {
              resuming.push(back);
              s.resume(back);
            }
          }
          startReady();
        }
        for (const k of keys) expect(started.get(k) ?? []).toEqual(added.get(k) ?? []);
      }),
      { numRuns: 500 },
    );
  });
});
