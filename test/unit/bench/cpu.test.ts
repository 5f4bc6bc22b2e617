import { execFileSync, spawn } from "node:child_process";
import { existsSync, mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { cpuSummary, jvmCompileMs, processCpuMs, startCpuCount } from "../../../bench/cpu.ts";
import { waitFor } from "../../helpers/wait-for.ts";

/** Whether `tool args` runs here (jstat comes with a JDK; a JRE alone has java and no jstat). */
function runs(tool: string, args: string[]): boolean {
  try {
    execFileSync(tool, args, { stdio: "ignore", timeout: 30_000 });
    return true;
  } catch {
    return false;
  }
}

/** Spins until this process has used `ms` more CPU (by its own count). */
function burn(ms: number): void {
  const start = process.cpuUsage();
  let x = 0;
  while (true) {
    for (let i = 0; i < 100_000; i++) x += Math.sqrt(i);
    const used = process.cpuUsage(start);
    if ((used.user + used.system) / 1000 >= ms) break;
  }
  expect(x).toBeGreaterThan(0);
}

describe("bench CPU accounting", () => {
  it.runIf(existsSync("/proc/self/stat"))("reads a process's CPU from /proc as the process itself counts it", () => {
    const before = processCpuMs(process.pid)!;
    burn(300);
    const after = processCpuMs(process.pid)!;
    // /proc counts in clock ticks (10 ms): the same 300 ms, give or take the ticks and the test's own work.
    expect(after - before).toBeGreaterThanOrEqual(250);
    expect(after - before).toBeLessThan(1_000);
  });

  it("says null for a process it cannot read, and per role since the start", () => {
    expect(processCpuMs(undefined)).toBeNull();
    expect(processCpuMs(2 ** 30)).toBeNull();
    const stop = startCpuCount({ gone: 2 ** 30, none: undefined });
    burn(50);
    const used = stop();
    expect(used.gone).toBeNull();
    expect(used.none).toBeNull();
    expect(used.harness).toBeGreaterThanOrEqual(50);
  });

  it("sums per request and cores busy over the roles it could read", () => {
    expect(cpuSummary({ owner: 2000, broker: 1000, records: null }, 1000, 2)).toEqual({
      per_request_ms: { owner: 2, broker: 1, records: null },
      cores_busy: 1.5,
    });
  });

  it("says null for the JIT compile time of no process or one that is gone", () => {
    expect(jvmCompileMs(undefined)).toBeNull();
    expect(jvmCompileMs(2 ** 30)).toBeNull();
  });

  it.runIf(runs("java", ["-version"]) && runs("jstat", ["-help"]))("reads a running JVM's JIT compile time with jstat, as the JVM itself counts it", async () => {
    // The JVM prints the time and its own total compile time (CompilationMXBean, ms) every 100 ms while it keeps its
    // JIT busy: a jstat reading lies between the last line printed before jstat started and the first printed after
    // it returned (jstat gives seconds to two decimals). By the clock, not by arrival: execFileSync holds this
    // process's event loop, so the lines printed meanwhile arrive after it.
    const dir = mkdtempSync(join(tmpdir(), "writ-jit-"));
    writeFileSync(
      join(dir, "Busy.java"),
      "import java.lang.management.ManagementFactory;\n" +
        "class Busy { public static void main(String[] a) throws Exception { long x = 0, next = 0; var jit = ManagementFactory.getCompilationMXBean();\n" +
        "  for (long i = 0; ; i++) { x += Long.toString(i ^ x).hashCode(); if (System.currentTimeMillis() >= next) { System.out.println(System.currentTimeMillis() + \" \" + jit.getTotalCompilationTime()); next = System.currentTimeMillis() + 100; } } } }\n",
    );
    const jvm = spawn("java", [join(dir, "Busy.java")], { stdio: ["ignore", "pipe", "ignore"] });
    const printed: { at: number; ms: number }[] = [];
    let rest = "";
    jvm.stdout.on("data", (chunk: Buffer) => {
      const lines = (rest + chunk.toString("utf8")).split("\n");
      rest = lines.pop() ?? "";
      for (const line of lines) {
        const [at, ms] = line.split(" ").map(Number);
        printed.push({ at: at!, ms: ms! });
      }
    });
    try {
      await waitFor(() => printed.length > 0 && jvmCompileMs(jvm.pid) !== null, { timeoutMs: 60_000, intervalMs: 250 });
      for (let i = 0; i < 3; i++) {
        const started = Date.now();
        const read = jvmCompileMs(jvm.pid)!;
        const returned = Date.now();
        const after = await waitFor(() => printed.find((p) => p.at >= returned), { timeoutMs: 30_000, intervalMs: 20 });
        const before = printed.filter((p) => p.at <= started).at(-1)!;
        expect(read).toBeGreaterThanOrEqual(before.ms - 10);
        expect(read).toBeLessThanOrEqual(after.ms + 10);
      }
      expect(printed.at(-1)!.ms).toBeGreaterThan(0);
    } finally {
      jvm.kill("SIGKILL");
      rmSync(dir, { recursive: true, force: true });
    }
  }, 150_000);
});
