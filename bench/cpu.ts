// CPU time spent by the processes of one closed loop, so that a scenario's
// line says where the machine's cores went (per request, and how many cores
// were busy). Linux: /proc/<pid>/stat (utime + stime); elsewhere, and for a
// broker that is not a local process, the figure is null.
import { execFileSync } from "node:child_process";
import { readFileSync } from "node:fs";

let ticksPerSecond: number | undefined;
function clockTicks(): number {
  if (ticksPerSecond === undefined) {
    try {
      ticksPerSecond = Number(execFileSync("getconf", ["CLK_TCK"], { encoding: "utf8" }).trim()) || 100;
    } catch {
      ticksPerSecond = 100;
    }
  }
  return ticksPerSecond;
}

/** CPU ms (user + system) a process has used so far, or null when it cannot be read. */
export function processCpuMs(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const stat = readFileSync(`/proc/${pid}/stat`, "utf8");
    // Fields after the command (which may hold spaces) start after the last ')'; utime and stime are fields 14 and 15.
    const fields = stat.slice(stat.lastIndexOf(")") + 2).split(" ");
    const ticks = Number(fields[11]) + Number(fields[12]);
    return Number.isFinite(ticks) ? (ticks * 1000) / clockTicks() : null;
  } catch {
    return null;
  }
}

/** Processes whose CPU a loop reports, by role; this process is always "harness". */
export type CpuPids = Record<string, number | undefined>;

/** Starts counting; the returned function gives each role's CPU ms since then (null where unreadable). */
export function startCpuCount(pids: CpuPids): () => Record<string, number | null> {
  const self = process.cpuUsage();
  const before = Object.fromEntries(Object.entries(pids).map(([role, pid]) => [role, processCpuMs(pid)]));
  return () => {
    const used = process.cpuUsage(self);
    const out: Record<string, number | null> = { harness: (used.user + used.system) / 1000 };
    for (const [role, pid] of Object.entries(pids)) {
      const a = before[role] ?? null;
      const b = processCpuMs(pid);
      out[role] = a === null || b === null ? null : b - a;
    }
    return out;
  };
}

/** CPU ms per request by role, and the cores busy on average (all roles that could be read), rounded. */
export function cpuSummary(cpuMs: Record<string, number | null>, requests: number, seconds: number): { per_request_ms: Record<string, number | null>; cores_busy: number } {
  const per: Record<string, number | null> = {};
  let total = 0;
  for (const [role, ms] of Object.entries(cpuMs)) {
    per[role] = ms === null ? null : Math.round((ms / requests) * 100) / 100;
    total += ms ?? 0;
  }
  return { per_request_ms: per, cores_busy: Math.round((total / 1000 / seconds) * 100) / 100 };
}

/**
 * The total time a JVM has spent compiling (JIT) so far, in ms, from `jstat -compiler` (a JDK tool): the
 * compilations' wall time, so a compiler thread waiting for a core counts too. Null when there is no pid, no
 * jstat (a JRE alone), or the process is gone. A broker just started compiles for tens of seconds, on the cores
 * the bench measures.
 */
export function jvmCompileMs(pid: number | undefined): number | null {
  if (pid === undefined) return null;
  try {
    const out = execFileSync("jstat", ["-compiler", String(pid)], { encoding: "utf8", timeout: 15_000, stdio: ["ignore", "pipe", "ignore"] });
    // Compiled Failed Invalid Time FailedType FailedMethod; Time in seconds.
    const [header, values] = out.trim().split("\n").map((l) => l.trim().split(/\s+/));
    const seconds = Number(values?.[header?.indexOf("Time") ?? -1]);
    return Number.isFinite(seconds) ? seconds * 1000 : null;
  } catch {
    return null;
  }
}
