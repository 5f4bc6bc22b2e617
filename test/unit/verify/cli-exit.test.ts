// `writ verify`'s exit status follows the report's status: a run with a scenario not judged (an outage during it)
// and nothing failed is "could not run" (2), not a pass and not the tool failing (1).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import type { VerifyReport } from "../../../src/verify/verify.ts";

let status: VerifyReport["status"] = "pass";

vi.mock("../../../src/verify/verify.ts", async (importOriginal) => ({
  ...(await importOriginal<typeof import("../../../src/verify/verify.ts")>()),
  runVerify: async (): Promise<VerifyReport> => ({
    ok: status === "pass",
    status,
    runId: "wv-0a1b2c",
    startedAt: "2026-01-01T00:00:00.000Z",
    durationMs: 1,
    brokers: ["127.0.0.1:9"],
    systems: [],
    tools: [],
    summary: { pass: 0, fail: 0, incomplete: 0, notRun: 0 },
  }),
}));

describe("writ verify's exit status", () => {
  it.each([
    ["pass", 0],
    ["fail", 1],
    ["incomplete", 2],
  ] as const)("%s: %i, with the report printed", async (given, code) => {
    status = given;
    const { verifyCommand } = await import("../../../src/cli/verify.ts");
    const dir = mkdtempSync(join(tmpdir(), "writ-verify-exit-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const out: string[] = [];
    const stdout = vi.spyOn(process.stdout, "write").mockImplementation((c: string | Uint8Array) => (out.push(String(c)), true));
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation(() => true);
    try {
      expect(await verifyCommand.main(["--tools", "./tools.ts", "--brokers", "127.0.0.1:9", "--json", "--log-file", join(dir, "verify.log")])).toBe(code);
    } finally {
      stdout.mockRestore();
      stderr.mockRestore();
    }
    expect(JSON.parse(out.join(""))).toMatchObject({ status: given });
  });
});
