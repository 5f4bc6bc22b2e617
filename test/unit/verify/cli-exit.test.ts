// `writ verify`'s exit status follows the report's status: a run with a scenario not judged (an outage during it)
// and nothing failed is "could not run" (2), not a pass and not the tool failing (1). A signal gives 130 (143) only
// where it cut the run short: one that comes once every scenario was judged stops nothing.
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { WritError } from "../../../src/errors.ts";
import type { VerifyReport } from "../../../src/verify/verify.ts";

let status: VerifyReport["status"] = "pass";
let interrupted: VerifyReport["interrupted"];
/** A signal the run gets while it runs (its cleanup, say), if any. */
let signal: "SIGINT" | "SIGTERM" | null = null;
/** How the run ends without a report, if it does: Kafka lost with nothing failed, or stopped (the signal's reason). */
let throws: "kafka-lost" | "stopped" | null = null;

vi.mock("../../../src/verify/verify.ts", async (importOriginal) => ({
  ...(await importOriginal<typeof import("../../../src/verify/verify.ts")>()),
  runVerify: async (opts: { signal?: AbortSignal }): Promise<VerifyReport> => {
    // As Node delivers one: the listener gets its name.
    if (signal !== null) process.emit(signal, signal);
    if (throws === "stopped") throw opts.signal?.reason;
    if (throws === "kafka-lost") throw new WritError("kafka_failed", "Kafka was lost during the run (brokers 127.0.0.1:9)", { retriable: true });
    return {
      ok: status === "pass",
      status,
      ...(interrupted === undefined ? {} : { interrupted }),
      runId: "wv-0a1b2c",
      startedAt: "2026-01-01T00:00:00.000Z",
      durationMs: 1,
      brokers: ["127.0.0.1:9"],
      systems: [],
      tools: [],
      summary: { pass: 0, fail: 0, incomplete: 0, notRun: 0 },
    };
  },
}));

/** `writ verify --json`: its exit status, the report it printed, and what it said on stderr. */
async function verify(): Promise<{ code: number; report: VerifyReport; said: string }> {
  const { verifyCommand } = await import("../../../src/cli/verify.ts");
  const dir = mkdtempSync(join(tmpdir(), "writ-verify-exit-"));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  const out: string[] = [];
  const stdout = vi.spyOn(process.stdout, "write").mockImplementation((c: string | Uint8Array) => (out.push(String(c)), true));
  const err: string[] = [];
  const stderr = vi.spyOn(process.stderr, "write").mockImplementation((c: string | Uint8Array) => (err.push(String(c)), true));
  try {
    const code = await verifyCommand.main(["--tools", "./tools.ts", "--brokers", "127.0.0.1:9", "--json", "--log-file", join(dir, "verify.log")]);
    return { code, report: (out.length === 0 ? undefined : JSON.parse(out.join(""))) as VerifyReport, said: err.join("") };
  } finally {
    stdout.mockRestore();
    stderr.mockRestore();
  }
}

describe("writ verify's exit status", () => {
  it.each([
    ["pass", 0],
    ["fail", 1],
    ["incomplete", 2],
  ] as const)("%s: %i, with the report printed", async (given, code) => {
    status = given;
    interrupted = undefined;
    signal = null;
    throws = null;
    const run = await verify();
    expect(run.code).toBe(code);
    expect(run.report).toMatchObject({ status: given });
  });

  it.each([
    ["pass", 0],
    ["fail", 1],
  ] as const)("a signal once every scenario was judged (the run deleting its topics) stops nothing: the report's %s, %i", async (given, code) => {
    status = given;
    interrupted = undefined;
    signal = "SIGINT";
    throws = null;
    // Before: 130, while the JSON said pass.
    const run = await verify();
    expect([run.code, run.report.status]).toEqual([code, given]);
  });

  it("a signal that cut the run short: 130 (SIGINT), 143 (SIGTERM), the report saying what did not run", async () => {
    for (const [sig, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
      status = "incomplete";
      interrupted = { reason: `stopped by ${sig}`, notRun: ["tag_ticket race"], stopped: true };
      signal = sig;
      throws = null;
      const run = await verify();
      expect([run.code, run.report.interrupted]).toEqual([code, interrupted]);
    }
  });

  it("Kafka lost with nothing failed, a signal coming during the run's cleanup: the error is said and the status is 2, not the signal's", async () => {
    for (const sig of ["SIGINT", "SIGTERM"] as const) {
      signal = sig;
      throws = "kafka-lost";
      const run = await verify();
      // Before: 130 (143), and the error was never said.
      expect(run.code).toBe(2);
      expect(run.said).toContain("Kafka was lost during the run (brokers 127.0.0.1:9)");
    }
  });

  it("stopped before a report (it rejects with the signal's reason): the signal's status, 130 (SIGINT), 143 (SIGTERM)", async () => {
    for (const [sig, code] of [["SIGINT", 130], ["SIGTERM", 143]] as const) {
      signal = sig;
      throws = "stopped";
      expect((await verify()).code).toBe(code);
    }
  });
});
