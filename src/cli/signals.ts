// How writ's long-running processes (writ owner, verify, tail, console, the MCP server, the demo records server)
// take SIGINT and SIGTERM: the first asks for a clean stop; a second, of either kind, ends the process at once,
// whatever the clean stop still waits on (a system of record that does not answer, brokers gone). That is what an
// operator's second Ctrl-C, or a supervisor's second SIGTERM, means; without it only SIGKILL would end a stop that hangs.
// A signal within SAME_REQUEST_MS of the first is that first request again, not a second: one Ctrl-C under `npm run`
// or `npx` reaches node twice, from the terminal (which signals the whole process group) and forwarded by npm.

export const STOP_SIGNALS = ["SIGINT", "SIGTERM"] as const;
export type StopSignal = (typeof STOP_SIGNALS)[number];

/**
 * How long after the first signal another, of either kind, is the same request. ms. npm's forwarded copy follows
 * the terminal's within a millisecond or two, later where npm's event loop is busy (a loaded machine, GC); an
 * operator who means a second one has seen the first taken ("stopping"), and one who pressed twice at once presses
 * again. Of either kind: a wrapper may answer the terminal's SIGINT with a SIGTERM to its child, and a second
 * taken for the first costs one more signal, where a first taken for a second costs the clean stop.
 */
export const SAME_REQUEST_MS = 1_000;

/** The exit status a shell, Kubernetes or Docker reports for a process ended by the signal (128 + its number). */
export const SIGNAL_EXIT_STATUS: Readonly<Record<StopSignal, number>> = { SIGINT: 130, SIGTERM: 143 };

export interface StopSignals {
  /** The signal that asked for the stop, once one did. */
  readonly first: StopSignal | null;
  /** A clean stop began without a signal (stdin closed, a fatal error): from now on a signal ends the process at once. */
  stopping(): void;
  /** The process is done with signals: a later one takes Node's default action (it ends the process). */
  dispose(): void;
}

/**
 * Calls `onFirst` on the first SIGINT or SIGTERM; on one within {@link SAME_REQUEST_MS} of it, `onRepeat` (at most
 * a debug line); on a second of either kind after that, `onSecond` (one line saying so), then {@link endBySignal}.
 */
export function onStopSignals(
  onFirst: (signal: StopSignal) => void,
  onSecond: (signal: StopSignal) => void = () => undefined,
  onRepeat: (signal: StopSignal) => void = () => undefined,
): StopSignals {
  let first: StopSignal | null = null;
  // When the first signal was taken (performance.now(): monotonic); null while none was.
  let firstAt: number | null = null;
  let stopping = false;
  const handler = (signal: StopSignal) => {
    if (!stopping) {
      stopping = true;
      first = signal;
      firstAt = performance.now();
      onFirst(signal);
      return;
    }
    if (firstAt !== null && performance.now() - firstAt < SAME_REQUEST_MS) {
      onRepeat(signal);
      return;
    }
    onSecond(signal);
    dispose();
    endBySignal(signal);
  };
  const dispose = () => {
    for (const signal of STOP_SIGNALS) process.off(signal, handler);
  };
  for (const signal of STOP_SIGNALS) process.on(signal, handler);
  return {
    get first() {
      return first;
    },
    stopping: () => {
      stopping = true;
    },
    dispose,
  };
}

/**
 * Ends the process at once, as killed by `signal`: with no listener left Node restores the signal's default
 * action, so the signal raised again ends the process the way a shell and a parent process expect (status 130 or
 * 143, the parent told the signal). Where something else still listens to it, exit with that status instead.
 */
export function endBySignal(signal: StopSignal): never {
  if (process.listenerCount(signal) === 0) process.kill(process.pid, signal);
  process.exit(SIGNAL_EXIT_STATUS[signal]);
}
