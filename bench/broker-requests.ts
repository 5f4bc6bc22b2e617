// The requests the local broker handled during a closed loop, by API, per
// request of the loop: where the broker's CPU goes, at the level of what the
// clients (and the broker itself, for a transaction's add and markers) ask of
// it. Read from the broker's own metrics by bench/BrokerRequests.java, which a
// JDK runs as a single-file program; null (and the bench says why, once) with
// no pid, a process that is not a JVM, a JRE alone, or an attach the JVM
// refuses. The attach signals the process (SIGQUIT, which a JVM answers by
// opening its attach listener and which ends any other process), so the probe
// runs only against a process whose command line names java.
import { execFile } from "node:child_process";
import { readFileSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { promisify } from "node:util";
import { z } from "zod";

const run = promisify(execFile);
const PROBE = join(dirname(fileURLToPath(import.meta.url)), "BrokerRequests.java");
const Counts = z.record(z.string().max(100), z.number().int().nonnegative());
let unavailable: string | null = null;

export type RequestCounts = Record<string, number>;

/** The requests the broker (process `pid`) has handled so far, by API; null when they cannot be read. */
export async function brokerRequestCounts(pid: number | undefined, warn: (line: string) => void): Promise<RequestCounts | null> {
  if (pid === undefined || unavailable !== null) return null;
  if (!isJvm(pid)) {
    unavailable = `process ${pid} is not a JVM`;
    warn(`broker requests not counted: ${unavailable}`);
    return null;
  }
  try {
    const { stdout } = await run("java", [PROBE, String(pid)], { timeout: 60_000, maxBuffer: 1 << 20 });
    return Counts.parse(JSON.parse(stdout));
  } catch (err) {
    unavailable = err instanceof Error ? err.message.split("\n")[0] ?? String(err) : String(err);
    warn(`broker requests not counted (needs a JDK's java and an attachable broker): ${unavailable}`);
    return null;
  }
}

function isJvm(pid: number): boolean {
  try {
    const argv0 = readFileSync(`/proc/${pid}/cmdline`, "utf8").split("\0")[0] ?? "";
    return /(^|\/)java$/.test(argv0);
  } catch {
    return false;
  }
}

/**
 * Starts counting the broker's requests: reads the count now and returns a function that reads it again and gives
 * the requests handled in between, by API (null when either read fails). Each read is a JVM of its own, seconds of
 * CPU: call it before a measured clock starts, and the function it returns after the clock stops.
 */
export async function startRequestCount(pid: number | undefined, warn: (line: string) => void): Promise<() => Promise<RequestCounts | null>> {
  const before = await brokerRequestCounts(pid, warn);
  return async () => (before === null ? null : requestsBetween(before, await brokerRequestCounts(pid, warn)));
}

/** The requests handled between two counts, by API; null when either is. */
export function requestsBetween(before: RequestCounts | null, after: RequestCounts | null): RequestCounts | null {
  if (before === null || after === null) return null;
  return Object.fromEntries(Object.entries(after).map(([api, n]) => [api, n - (before[api] ?? 0)]));
}

/** The sum of two loops' requests, by API; null when either is. */
export function sumRequests(a: RequestCounts | null, b: RequestCounts | null): RequestCounts | null {
  if (a === null || b === null) return null;
  const out: RequestCounts = { ...a };
  for (const [api, n] of Object.entries(b)) out[api] = (out[api] ?? 0) + n;
  return out;
}

/** Requests per loop request, by API, largest first; APIs under 0.01 per request left out. */
export function perRequest(counts: RequestCounts | null, requests: number): Record<string, number> | null {
  if (counts === null || requests <= 0) return null;
  const per = Object.entries(counts)
    .map(([api, n]) => [api, Math.round((n / requests) * 100) / 100] as const)
    .filter(([, r]) => r >= 0.01)
    .sort((a, b) => b[1] - a[1]);
  return Object.fromEntries(per);
}
