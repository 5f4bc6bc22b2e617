// The bench's service processes: an owner (bench/owner-process.ts), the
// echo's service (bench/echo-service.ts) and the records server
// (bench/records-process.ts) run in processes of their own, as they do in
// production, so that they have an event loop of their own beside the
// submitters' (and their CPU is counted apart). They talk over IPC:
// `{type: "started"}` once serving, `{type: "stop"}` → exit 0.
import { fork, type ChildProcess } from "node:child_process";
import { mkdirSync, openSync } from "node:fs";
import { dirname, join } from "node:path";

const ROOT = join(import.meta.dirname, "..");

/** Forks `bench/<script>` with `env`, its output in `.writ/<log>`, and waits for its "started". */
export async function startChild(script: string, env: Record<string, string>, log: string, opts: { execArgv?: string[]; timeoutMs?: number } = {}): Promise<ChildProcess> {
  return (await startService(script, env, log, opts)).child;
}

/** As startChild, with the "started" message itself (a service may say where it listens). */
export async function startService(
  script: string,
  env: Record<string, string>,
  log: string,
  opts: { execArgv?: string[]; timeoutMs?: number } = {},
): Promise<{ child: ChildProcess; started: unknown }> {
  const logFile = join(ROOT, ".writ", log);
  mkdirSync(dirname(logFile), { recursive: true });
  const out = openSync(logFile, "w");
  const child = fork(join(ROOT, "bench", script), [], { execArgv: opts.execArgv ?? [], env: { ...process.env, ...env }, stdio: ["ignore", out, out, "ipc"] });
  try {
    return { child, started: await nextMessage(child, "started", opts.timeoutMs ?? 120_000, logFile) };
  } catch (err) {
    child.kill("SIGKILL");
    throw err;
  }
}

let calls = 0;
/** Asks a service process to run `method` (bench/records-process.ts) and resolves what it returned. */
export async function callChild<T>(child: ChildProcess, method: string, args: unknown[], timeoutMs = 120_000): Promise<T> {
  const id = ++calls;
  const answer = waitForMessage(
    child,
    (m) => m.type === "result" && m.id === id,
    timeoutMs,
    () => `${method} got no answer within ${timeoutMs} ms`,
    (code) => `a service process exited (${code}) during ${method}`,
  ) as Promise<{ value?: T; error?: string }>;
  child.send({ type: "call", id, method, args });
  const m = await answer;
  if (m.error !== undefined) throw new Error(`bench: ${method}: ${m.error}`);
  return m.value as T;
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
  return waitForMessage(
    child,
    (m) => m.type === type,
    timeoutMs,
    () => `${child.spawnargs.at(-1)} sent no "${type}" within ${timeoutMs} ms; see ${logFile}`,
    (code) => `a service process exited (${code}) before "${type}"; see ${logFile}`,
  );
}

/** The child's first message that `match`es; rejects (with the reason given) at the deadline or when it exits first. */
function waitForMessage(
  child: ChildProcess,
  match: (m: { type?: string; id?: number }) => boolean,
  timeoutMs: number,
  late: () => string,
  exited: (code: number | null) => string,
): Promise<unknown> {
  return new Promise((resolvePromise, reject) => {
    const timer = setTimeout(() => done(new Error(`bench: ${late()}`)), timeoutMs);
    const onMessage = (m: { type?: string; id?: number }) => match(m) && done(null, m);
    const onExit = (code: number | null) => done(new Error(`bench: ${exited(code)}`));
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
