// A watch, from a worker thread, on the main thread's event loop, for a command that runs code it does not own.
// `writ verify` calls into the user's tools module (its import, systems(env), adapters, fixtures) under deadlines,
// but a deadline is a timer, and a timer never fires while that code runs a synchronous loop: the process would hang
// for good, deaf to Ctrl-C (a signal handler is JavaScript too, on the same thread). The worker's own loop still
// turns: when the main thread has not turned its loop for the deadline, the worker says why on stderr and ends the
// process with SIGKILL, the one way out of a thread that never yields.
import { url as inspectorUrl } from "node:inspector";
import { Worker } from "node:worker_threads";

/** How often the main thread marks that its loop turned. ms. */
const BEAT_MS = 200;

// Plain JavaScript (an eval worker is CommonJS, and must run from the built package too, where no .ts is loaded).
// The deadline counts the worker's own ticks, not the wall clock: a machine suspended and resumed (a laptop's lid)
// wakes both threads, and the main one beats within BEAT_MS, before the worker has ticked enough to act.
const WORKER = `
const { parentPort, workerData } = require("node:worker_threads");
const { writeSync } = require("node:fs");
const beat = new Int32Array(workerData.beat);
let seen = Atomics.load(beat, 0);
let still = 0;
let leftover = "";
let leftovers = null;
let answered = false;
parentPort.on("message", (m) => {
  if (m && typeof m.text === "string") leftover = m.text;
  if (m && typeof m.leftovers === "object") leftovers = m.leftovers;
  if (m && m.answered === true) answered = true;
});
setInterval(() => {
  const now = Atomics.load(beat, 0);
  if (now !== seen) { seen = now; still = 0; return; }
  still++;
  if (still * workerData.tickMs < workerData.limitMs) return;
  // A debugger attached (at start, or later through SIGUSR1 or inspector.open()): a breakpoint holds the loop too.
  if (Atomics.load(beat, 1) === 1) return;
  try { writeSync(2, workerData.message + leftover + "\\n"); } catch {}
  // The line a program reading stdout gets from every other failure (the command's --json).
  if (workerData.jsonLine && !answered) {
    const run = leftovers === null ? {} : { runId: leftovers.runId, leftovers };
    try { writeSync(1, JSON.stringify({ ok: false, ...run, error: { code: "stalled", message: workerData.message } }) + "\\n"); } catch {}
  }
  process.kill(process.pid, "SIGKILL");
}, workerData.tickMs);
`;

export interface StallWatch {
  /** What the run may leave behind, once known: the text added to the message, and what the JSON line says of it. */
  leaves(text: string, leftovers: { runId: string } & Record<string, unknown>): void;
  /** The command has written its answer on stdout (a report, or its failure's line): a stall after says it on stderr only. */
  answered(): void;
  stop(): void;
}

/** No watch: where none can run (a worker refused), the command runs as it would without one. */
const UNWATCHED: StallWatch = { leaves: () => undefined, answered: () => undefined, stop: () => undefined };

/**
 * Starts the watch: a main thread whose loop does not turn for `limitMs` ends the process (SIGKILL) once `message`
 * (and what {@link StallWatch.leaves} gave last) is written to stderr, and with `jsonLine` a JSON line
 * `{ok: false, runId?, leftovers?, error: {code: "stalled", message}}` to stdout. Neither the beat nor the worker
 * keeps the process alive. Not while a debugger is attached (the inspector open, as the last beat saw it): a
 * developer paused at a breakpoint in the module holds the loop as a synchronous loop does, and must not be killed.
 */
export function watchForStall(limitMs: number, message: string, opts: { jsonLine?: boolean } = {}): StallWatch {
  // [0]: the beat; [1]: 1 while the inspector is open.
  const shared = new SharedArrayBuffer(8);
  const beat = new Int32Array(shared);
  let worker: Worker;
  try {
    worker = new Worker(WORKER, {
      eval: true,
      workerData: { beat: shared, limitMs, tickMs: Math.min(1_000, Math.max(BEAT_MS * 2, Math.floor(limitMs / 10))), message, jsonLine: opts.jsonLine === true },
    });
  } catch {
    // A worker refused (Node's permission model without --allow-worker): the command runs unwatched, as before.
    return UNWATCHED;
  }
  const mark = () => {
    Atomics.store(beat, 1, inspectorUrl() === undefined ? 0 : 1);
    Atomics.add(beat, 0, 1);
  };
  mark();
  const timer = setInterval(mark, BEAT_MS);
  timer.unref();
  worker.unref();
  // A worker that fails to start or dies leaves the command as it was without the watch.
  worker.on("error", () => undefined);
  return {
    leaves: (text, leftovers) => worker.postMessage({ text, leftovers }),
    answered: () => worker.postMessage({ answered: true }),
    stop: () => {
      clearInterval(timer);
      void worker.terminate();
    },
  };
}
