// The process-wide budget of system-of-record answer bytes (src/sor/response-budget.ts): never above its limit but
// for the oldest chain's bytes, never deadlocked, every waiter served; chains (an intent's run) keeping what they
// read until they end or let go; and the HTTP adapter under it, against a
// real HTTP server: answers wait with their bodies unread, and a write whose answer waits past its deadline is an
// unknown outcome (reconciled), never taken for not sent.
import type { ServerResponse } from "node:http";
import fc from "fast-check";
import { afterEach, describe, expect, it } from "vitest";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import { type Hold, ResponseBudget, defaultResponseBudgetBytes, sorResponseBudget } from "../../../src/sor/response-budget.ts";
import { startStub } from "../../helpers/http-stub.ts";

/** Bytes held by every open hold but the oldest: the part the limit bounds. */
function beyondOldest(holds: readonly Hold[]): number {
  return holds.slice(1).reduce((sum, h) => sum + h.bytes, 0);
}

/** A budget of `limit` bytes, `bytes` of them held by the oldest answer. */
async function spent(limit: number, bytes: number): Promise<{ budget: ResponseBudget; first: Hold }> {
  const budget = new ResponseBudget(limit);
  const first = budget.hold();
  await first.take(bytes);
  return { budget, first };
}

/**
 * Reads one answer's chunks into `hold` as readBody does, a scheduled step between chunks, `check`ed after each. An
 * abandoned answer's deadline passes after its first chunk: a take still waiting then is rejected, and the answer
 * keeps what it took until its caller releases it (as readBody's does).
 */
async function readAnswer(s: fc.Scheduler, hold: Hold, answer: { chunks: readonly number[]; abandoned: boolean }, what: string, check: (where: string) => void): Promise<void> {
  const deadline = new AbortController();
  try {
    for (const [n, bytes] of answer.chunks.entries()) {
      if (answer.abandoned && n === 1) deadline.abort(new Error("deadline"));
      await hold.take(bytes, deadline.signal);
      check(`${what} chunk ${n}`);
      await s.schedule(Promise.resolve(), `${what} reads on`);
    }
  } catch {
    // Its deadline passed while it waited.
  }
}

/**
 * Runs scheduled steps until none is left once every microtask has run (a take served by a release schedules its
 * next step only after its promise settles); then each of `what` must be done: one not done waits for bytes no one
 * will give back (a deadlock). At the end no check may have failed, and the budget holds nothing, has no waiter and
 * no chain open.
 */
async function everyStepRun(s: fc.Scheduler, done: readonly boolean[], what: string, work: readonly Promise<void>[], budget: ResponseBudget, violations: readonly string[]): Promise<void> {
  for (;;) {
    await new Promise<void>((resolve) => setImmediate(resolve));
    if (s.count() === 0) break;
    await s.waitOne();
  }
  expect(done.every(Boolean), `${what} not done: ${done.flatMap((d, i) => (d ? [] : [i])).join(", ")}`).toBe(true);
  await Promise.all(work);
  expect(violations).toEqual([]);
  expect({ held: budget.held, waiting: budget.waiting, open: budget.open }).toEqual({ held: 0, waiting: 0, open: 0 });
}

describe("response budget", () => {
  it("makes a take wait while the budget is spent, and serves it when bytes come back", async () => {
    const { budget, first } = await spent(100, 80);
    const second = budget.hold();
    let served = false;
    const waiting = second.take(30).then(() => (served = true));
    await Promise.resolve();
    expect(served).toBe(false);
    expect(budget.waiting).toBe(1);
    first.release();
    await waiting;
    expect(budget.held).toBe(30);
    expect(budget.waits).toBe(1);
  });

  it("lets the oldest answer take past the limit: answers that each hold part of their body cannot wait for each other", async () => {
    const budget = new ResponseBudget(100);
    const a = budget.hold();
    const b = budget.hold();
    await a.take(60);
    await b.take(40);
    // b is not the oldest: it waits. a is: it goes on past the limit, finishes, and its release serves b.
    const bMore = b.take(50);
    await a.take(500);
    expect(budget.held).toBe(600);
    a.release();
    await bMore;
    expect(budget.held).toBe(90);
  });

  it("rejects a wait with the deadline's reason, holding nothing more, and serves the next waiter", async () => {
    const { budget, first } = await spent(100, 100);
    const [b, c] = [budget.hold(), budget.hold()];
    const deadline = new AbortController();
    const bWait = b.take(50, deadline.signal);
    const cWait = c.take(10);
    deadline.abort(new Error("no answer within 5 ms"));
    await expect(bWait).rejects.toThrow("no answer within 5 ms");
    expect(b.bytes).toBe(0);
    first.release();
    await cWait;
    expect(budget.held).toBe(10);
  });

  it("a higher limit serves waiters at once", async () => {
    const { budget } = await spent(10, 10);
    const wait = budget.hold().take(10);
    budget.setLimit(20);
    await wait;
    expect(budget.held).toBe(20);
  });

  it("defaults to a quarter of the heap limit, at most 256 MiB", () => {
    const bytes = defaultResponseBudgetBytes();
    expect(bytes).toBeGreaterThanOrEqual(1024 * 1024);
    expect(bytes).toBeLessThanOrEqual(256 * 1024 * 1024);
  });

  it("property: never above the limit but for the oldest answer's bytes, and every answer is read to its end", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        fc.integer({ min: 1, max: 200 }),
        // Each answer: its chunks, and whether it is abandoned (its deadline passes) after its first chunk.
        fc.array(fc.record({ chunks: fc.array(fc.integer({ min: 1, max: 120 }), { minLength: 1, maxLength: 6 }), abandoned: fc.boolean() }), { minLength: 1, maxLength: 12 }),
        async (s, limit, answers) => {
          const budget = new ResponseBudget(limit);
          const open: Hold[] = [];
          const violations: string[] = [];
          const check = (where: string) => {
            if (beyondOldest(open) > limit) violations.push(`${where}: ${beyondOldest(open)} held beyond the oldest answer, limit ${limit}`);
            if (budget.held !== open.reduce((sum, h) => sum + h.bytes, 0)) violations.push(`${where}: held ${budget.held} is not the holds' sum`);
          };
          const done: boolean[] = answers.map(() => false);
          const runs = answers.map(async (answer, i) => {
            await s.schedule(Promise.resolve(), `answer ${i} arrives`);
            const hold = budget.hold();
            open.push(hold);
            await readAnswer(s, hold, answer, `answer ${i}`, check);
            await s.schedule(Promise.resolve(), `answer ${i} parsed`);
            hold.release();
            open.splice(open.indexOf(hold), 1);
            check(`answer ${i} released`);
            done[i] = true;
          });
          await everyStepRun(s, done, "answers", runs, budget, violations);
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("chains: what an intent's run keeps of its answers", () => {
  it("keeps a released answer charged, as the largest kept, until the run ends or lets go", async () => {
    const budget = new ResponseBudget(1000);
    let inside = -1;
    await budget.run(async () => {
      for (const bytes of [300, 500, 200]) {
        const h = budget.hold();
        await h.take(bytes);
        h.release();
      }
      inside = budget.held;
      budget.letGo();
      expect(budget.held).toBe(0);
      const h = budget.hold();
      await h.take(50);
      h.release();
    });
    expect(inside).toBe(500);
    expect(budget.held).toBe(0);
    expect(budget.open).toBe(0);
  });

  it("gives a run's bytes back when it throws", async () => {
    const budget = new ResponseBudget(1000);
    await expect(
      budget.run(async () => {
        const h = budget.hold();
        await h.take(400);
        h.release();
        throw new Error("the run failed");
      }),
    ).rejects.toThrow("the run failed");
    expect(budget.held).toBe(0);
    expect(budget.open).toBe(0);
  });

  it("the oldest chain never waits: a run keeping its read gets its write's answer past the limit", async () => {
    const budget = new ResponseBudget(100);
    const younger = { read: false, write: false };
    let releaseOlder!: () => void;
    const olderDone = new Promise<void>((r) => (releaseOlder = r));
    const older = budget.run(async () => {
      const read = budget.hold();
      await read.take(60);
      read.release();
      await olderDone;
      // Its write's answer: past the limit, since the younger run keeps 40 and waits for more.
      const write = budget.hold();
      await write.take(100);
      write.release();
    });
    const young = budget.run(async () => {
      const read = budget.hold();
      await read.take(40);
      read.release();
      younger.read = true;
      const write = budget.hold();
      await write.take(50);
      write.release();
      younger.write = true;
    });
    await new Promise<void>((r) => setImmediate(r));
    expect(younger).toEqual({ read: true, write: false });
    expect(budget.waiting).toBe(1);
    releaseOlder();
    await older;
    await young;
    expect(younger.write).toBe(true);
    expect(budget.heldMax).toBe(200);
    expect(budget.held).toBe(0);
  });

  it("property: runs of several answers, letting go and ending at random: never above the limit plus two answers, what runs keep is counted, every run ends", async () => {
    await fc.assert(
      fc.asyncProperty(
        fc.scheduler(),
        fc.integer({ min: 1, max: 200 }),
        // Each run: its answers (chunks; abandoned after the first chunk; the run lets go of what it kept after it),
        // and whether it ends by a throw.
        fc.array(
          fc.record({
            answers: fc.array(
              fc.record({ chunks: fc.array(fc.integer({ min: 1, max: 120 }), { minLength: 1, maxLength: 4 }), abandoned: fc.boolean(), letGo: fc.boolean() }),
              { minLength: 1, maxLength: 4 },
            ),
            throws: fc.boolean(),
          }),
          { minLength: 1, maxLength: 10 },
        ),
        async (s, limit, runs) => {
          const budget = new ResponseBudget(limit);
          const largest = Math.max(...runs.flatMap((r) => r.answers.map((a) => a.chunks.reduce((x, y) => x + y, 0))));
          // What each run holds open, and keeps (the largest answer released since it last let go), as it sees it.
          const open = new Set<Hold>();
          const keeps = runs.map(() => 0);
          const violations: string[] = [];
          const check = (where: string) => {
            const counted = keeps.reduce((x, y) => x + y, 0) + [...open].reduce((x, h) => x + h.bytes, 0);
            if (budget.held < counted) violations.push(`${where}: held ${budget.held}, less than the ${counted} runs keep or hold`);
            if (budget.held > limit + 2 * largest) violations.push(`${where}: held ${budget.held}, over limit ${limit} + 2 × ${largest}`);
          };
          const done: boolean[] = runs.map(() => false);
          const work = runs.map(async (run, i) => {
            await s.schedule(Promise.resolve(), `run ${i} starts`);
            await budget
              .run(async () => {
                try {
                  for (const [j, answer] of run.answers.entries()) {
                    const hold = budget.hold();
                    open.add(hold);
                    await readAnswer(s, hold, answer, `run ${i} answer ${j}`, check);
                    await s.schedule(Promise.resolve(), `run ${i} answer ${j} parsed`);
                    const bytes = hold.bytes;
                    hold.release();
                    open.delete(hold);
                    keeps[i] = Math.max(keeps[i]!, bytes);
                    check(`run ${i} answer ${j} released`);
                    if (answer.letGo) {
                      keeps[i] = 0;
                      budget.letGo();
                    }
                    await s.schedule(Promise.resolve(), `run ${i} after answer ${j}`);
                  }
                  if (run.throws) throw new Error("the run failed");
                } finally {
                  // Before the budget ends the chain: what the run counts on stays at most what is charged.
                  keeps[i] = 0;
                }
              })
              .catch(() => undefined);
            check(`run ${i} ended`);
            done[i] = true;
          });
          await everyStepRun(s, done, "runs", work, budget, violations);
        },
      ),
      { numRuns: 300 },
    );
  });
});

describe("the HTTP adapter under the answer budget", () => {
  const saved = { limit: sorResponseBudget.limit };
  afterEach(() => sorResponseBudget.setLimit(saved.limit));

  const bigRecord = (bytes: number) => JSON.stringify({ state: { n: 1 }, attachment: "x".repeat(bytes) });

  it("reads many large answers at once within the budget plus one answer, and gives every byte back", async () => {
    const body = bigRecord(1024 * 1024);
    // Half the answers with a Content-Length (taken whole), half chunked (taken as they come); all answered once
    // every request has come, so that they arrive together.
    const answer = (path: string, res: ServerResponse) => {
      const chunked = path.endsWith("-c");
      res.writeHead(200, { "content-type": "application/json", etag: '"v1"', ...(chunked ? {} : { "content-length": String(Buffer.byteLength(body)) }) });
      if (chunked) {
        for (let i = 0; i < body.length; i += 100_000) res.write(body.slice(i, i + 100_000));
        res.end();
      } else res.end(body);
    };
    const waiting: [string, ServerResponse][] = [];
    const server = await startStub((req, res: ServerResponse) => {
      waiting.push([req.path, res]);
      if (waiting.length === 24) for (const [path, r] of waiting.splice(0)) answer(path, r);
    });
    const limit = 2 * 1024 * 1024;
    sorResponseBudget.setLimit(limit);
    const heldBefore = sorResponseBudget.held;
    sorResponseBudget.heldMax = heldBefore;
    const waitsBefore = sorResponseBudget.waits;
    const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: server.url, state: { pointer: "/state" }, maxResponseBytes: 2 * 1024 * 1024 });
    try {
      const reads = await Promise.all(Array.from({ length: 24 }, (_, i) => sor.read({ type: "t", id: `r${i}${i % 2 ? "-c" : ""}` }, { timeoutMs: 30_000 })));
      expect(reads.every((r) => r !== null && (r.state as { n: number }).n === 1)).toBe(true);
    } finally {
      await sor.close?.();
    }
    expect(server.seen.length).toBe(24);
    expect(sorResponseBudget.heldMax).toBeLessThanOrEqual(limit + Buffer.byteLength(body));
    expect(sorResponseBudget.waits).toBeGreaterThan(waitsBefore);
    expect(sorResponseBudget.held).toBe(heldBefore);
  });

  it("a write's answer gives its bytes back before the write's own re-read: a large answer cannot make its re-read wait for it", async () => {
    const big = JSON.stringify({ note: "x".repeat(2 * 1024 * 1024) });
    const server = await startStub((req, res) => {
      // The write's answer carries no record (no ETag): the adapter reads the record after it.
      if (req.method === "PATCH") res.writeHead(200, { "content-type": "application/json", "content-length": String(big.length) }).end(big);
      else res.writeHead(200, { "content-type": "application/json", etag: '"v2"' }).end(JSON.stringify({ state: { n: 2 } }));
    });
    sorResponseBudget.setLimit(1024 * 1024);
    const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: server.url, state: { pointer: "/state" }, idempotencyKeys: true, readTimeoutMs: 2_000 });
    try {
      const outcome = await sor.patch({ type: "t", id: "1" }, [{ op: "replace", path: "/n", value: 2 }], { ifMatch: '"v1"', idempotencyKey: "k1", timeoutMs: 10_000 });
      expect(outcome).toEqual({ kind: "applied", state: { n: 2 }, version: '"v2"' });
    } finally {
      await sor.close?.();
    }
    expect(sorResponseBudget.held).toBe(0);
  });

  it("a write whose answer waits for the budget past its deadline is an unknown outcome; the budget is whole again", async () => {
    const server = await startStub((req, res) => {
      res.writeHead(200, { "content-type": "application/json", etag: '"v2"' }).end(JSON.stringify({ state: { n: 2 } }));
    });
    sorResponseBudget.setLimit(1024 * 1024);
    // An older answer holds the whole budget (and never finishes while the write's answer waits).
    const older = sorResponseBudget.hold();
    await older.take(sorResponseBudget.limit);
    const sor = createHttpSystemOfRecord({ name: "crm", baseUrl: server.url, state: { pointer: "/state" }, idempotencyKeys: true });
    try {
      const outcome = await sor.patch({ type: "t", id: "1" }, [{ op: "replace", path: "/n", value: 2 }], { ifMatch: '"v1"', idempotencyKey: "k1", timeoutMs: 200 });
      expect(outcome).toMatchObject({ kind: "unknown", message: "no answer within 200 ms" });
      // The PATCH went out and was answered: what the owner reconciles, never sends blindly again.
      expect(server.seen.filter((r) => r.method === "PATCH").length).toBe(1);
      expect(sorResponseBudget.waiting).toBe(0);
    } finally {
      older.release();
      await sor.close?.();
    }
    expect(sorResponseBudget.held).toBe(0);
  });
});
