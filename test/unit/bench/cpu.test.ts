import { existsSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { cpuSummary, processCpuMs, startCpuCount } from "../../../bench/cpu.ts";

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
});
