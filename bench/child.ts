// The bench's service processes: an owner (bench/owner-process.ts) and the
// echo's service (bench/echo-service.ts) run in processes of their own, as
// they do in production, so that they have an event loop of their own beside
// the submitters' (and the machine's second core). They talk over IPC:
// `{type: "started"}` once serving, `{type: "stop"}` → exit 0.
import { fork, type ChildProcess } from "node:child_process";
import { mkdirSync, openSync } from "node:fs";
import { dirname, join } from "node:path";

const ROOT = join(import.meta.dirname, "..");

/** Forks `bench/<script>` with `env`, its output in `.writ/<log>`, and waits for its "started". */
export async function startChild(script: string, env: Record<string, string>, log: string, opts: { execArgv?: string[]; timeoutMs?: number } = {}): Promise<ChildProcess> {
  const logFile = join(ROOT, ".writ", log);
  mkdirSync(dirname(logFile), { recursive: true });
  const out = openSync(logFile, "w");
  const child = fork(join(ROOT, "bench", script), [], { execArgv: opts.execArgv ?? [], env: { ...process.env, ...env }, stdio: ["ignore", out, out, "ipc"] });
  await nextMessage(child, "started", opts.timeoutMs ?? 120_000, logFile);
  return child;
}

/** Asks the child to stop, and SIGKILLs it after 30 s. */
export async function stopChild(child: ChildProcess): Promise<void> {
  if (child.exitCode !== null || child.signalCode !== null) return;
  const exited = new Promise<void>((r) => child.once("exit", () => r()));
  child.send({ type: "stop" });
  const timer = setTimeout(() => child.kill("SIGKILL"), 30_000);
  await exited;
  clearTimeout(timer);
}

/** The child's next message of `type`; rejects when it exits first or at the deadline. */
export function nextMessage(child: ChildProcess, type: string, timeoutMs: number, logFile = ".writ/"): Promise<unknown> {
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => done(new Error(`bench: ${child.spawnargs.at(-1)} sent no "${type}" within ${timeoutMs} ms; see ${logFile}`)), timeoutMs);
    const onMessage = (m: { type?: string }) => m.type === type && done(null, m);
    const onExit = (code: number | null) => done(new Error(`bench: a service process exited (${code}) before "${type}"; see ${logFile}`));
    const done = (err: Error | null, m?: unknown) => {
      clearTimeout(timer);
      child.off("message", onMessage);
      child.off("exit", onExit);
      if (err) reject(err);
      else resolvePromise(m);
    };
    child.on("message", onMessage);
    child.on("exit", onExit);
  });
}
