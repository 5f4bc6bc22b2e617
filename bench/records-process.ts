// The bench's system of record in a process of its own: the demo records
// server (no Idempotency-Key dedupe, so dedupe measured is writ's), as a
// system of record runs apart from the agents and from writ in production.
// Its CPU is then counted apart from the submitters' (bench/cpu.ts), and its
// event loop is not theirs. Options in BENCH_RECORDS (JSON: latencyMs).
// IPC (bench/child.ts): → {type: "started", url}; ← {type: "call", id, method, args}
// → {type: "result", id, value} or {type: "result", id, error}; ← {type: "stop"}.
import { startDemoRecordsServer } from "../src/testing/demo-records-server.ts";

const cfg = JSON.parse(process.env.BENCH_RECORDS ?? "{}") as { latencyMs?: number };
const records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false, latencyMs: cfg.latencyMs ?? 0 });

/** What the bench may ask for: seeding before the run, the server's own accounts after it. */
const methods: Record<string, (...args: never[]) => unknown> = {
  seedMany: (type: string, items: { id: string; state: unknown }[]) => items.map(({ id, state }) => records.seed(type, id, state)).length,
  patchRequests: () => records.patchRequests(),
  stats: () => records.stats(),
  histories: (type: string, ids: string[]) => ids.map((id) => records.history(type, id)),
};

process.send?.({ type: "started", url: records.url });
process.on("message", (m: { type?: string; id?: number; method?: string; args?: unknown[] }) => {
  if (m.type === "call") {
    const fn = methods[m.method ?? ""];
    try {
      if (!fn) throw new Error(`no method ${m.method}`);
      process.send?.({ type: "result", id: m.id, value: fn(...((m.args ?? []) as never[])) });
    } catch (err) {
      process.send?.({ type: "result", id: m.id, error: err instanceof Error ? err.message : String(err) });
    }
  }
  if (m.type === "stop") void records.close().finally(() => process.exit(0));
});
