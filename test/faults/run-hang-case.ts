// node test/faults/run-hang-case.ts — the deterministic hanging-transaction
// case (test/faults/hang-case.ts) on a three-broker stack of its own: stack
// dir .cache/run-hang, brokers on 22992-22997, registry on 22981, since it
// kills and restarts brokers. Its ports lie below Linux's ephemeral range
// (32768-60999), as every stack's do (src/testing/local-stack.ts). Starts the stack (or reuses one already running
// there), runs the case, stops what it started, and prints the result as the
// last line (one JSON object). Exit 1 when the case failed.
// HANG_CASE_WATCH_HELD_TRANSACTION=1: see HangCaseOptions.watchHeldTransaction.
import { join, resolve } from "node:path";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";

hideKafkajsTimeoutWarning();
const root = resolve(import.meta.dirname, "..", "..");
// Set before local-stack.ts is first imported: it reads them at import time.
process.env.WRIT_LOCAL_STACK_DIR ??= join(root, ".cache", "run-hang");
process.env.WRIT_LOCAL_KAFKA_PORT ??= "22992";
process.env.WRIT_LOCAL_REGISTRY_PORT ??= "22981";
if (process.env.KAFKA_BROKERS) {
  console.error("run-hang-case kills and restarts its own local brokers; unset KAFKA_BROKERS");
  process.exit(2);
}

const { ensureStack } = await import("../../src/testing/local-stack.ts");
const { runHangCase, hangCasePassed } = await import("./hang-case.ts");
type HangCaseResult = import("./hang-case.ts").HangCaseResult;

const t0 = Date.now();
const say = (line: string): void => console.log(`[${((Date.now() - t0) / 1000).toFixed(1).padStart(6)} s] ${line}`);

let result: HangCaseResult | null = null;
let failure: string | null = null;
let stackMs = 0;
let caseMs = 0;
const stack = await ensureStack({ brokers: 3, log: (l) => say(`  [stack] ${l}`) });
stackMs = Date.now() - t0;
say(`three brokers at ${stack.endpoints.brokers.join(",")} (${stack.started ? "started" : "reused"}, ${(stackMs / 1000).toFixed(1)} s)`);
try {
  const started = Date.now();
  result = await runHangCase({
    brokers: stack.endpoints.brokers,
    registryUrl: stack.endpoints.registryUrl || undefined,
    say,
    id: Date.now().toString(36),
    logDir: resolve(import.meta.dirname, "..", "..", ".writ"),
    // HANG_CASE_WATCH_HELD_TRANSACTION=1 lets the watch see the ledger while the transaction is held (see hang-case.ts).
    watchHeldTransaction: process.env.HANG_CASE_WATCH_HELD_TRANSACTION === "1",
  });
  caseMs = Date.now() - started;
} catch (err) {
  failure = (err as Error).stack ?? String(err);
} finally {
  await stack.stop().catch((err: unknown) => say(`stopping the stack failed: ${(err as Error).message}`));
}
const passed = failure === null && result !== null && hangCasePassed(result);
for (const p of result?.problems ?? []) say(`PROBLEM: ${p}`);
if (failure !== null) say(`FAILED: ${failure}`);
say(passed ? "hanging-transaction case passed" : "hanging-transaction case FAILED");
console.log(JSON.stringify({ passed, ...(result ?? {}), ...(failure === null ? {} : { failure }), stackMs, caseMs, totalMs: Date.now() - t0 }));
process.exit(passed ? 0 : 1);
