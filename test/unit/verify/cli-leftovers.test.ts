// `writ verify` where the run could not run and Kafka did not answer its cleanup either: with no report to carry
// them, what it left and the command that deletes it are said on their own (stderr, and a JSON line on stdout).
import { mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { WritError } from "../../../src/errors.ts";
import type { VerifyLeftovers } from "../../../src/verify/verify.ts";

const left: VerifyLeftovers = {
  runId: "wv-0a1b2c",
  reason: "could not delete verify run wv-0a1b2c's topics and groups (brokers 127.0.0.1:9): no answer within 15000 ms",
  topics: ["writ.verify.wv-0a1b2c.intents", "writ.replies.verify.wv-0a1b2c.agent"],
  groups: ["writ.verify.wv-0a1b2c"],
  groupPrefixes: ["writ.client.verify-wv-0a1b2c-"],
  cleanup: "writ verify --cleanup wv-0a1b2c --brokers 127.0.0.1:9",
};

vi.mock("../../../src/verify/verify.ts", async (importOriginal) => ({
  ...(await importOriginal<typeof import("../../../src/verify/verify.ts")>()),
  // Kafka lost mid-run and still gone at the cleanup.
  runVerify: async (opts: { onLeftovers?: (l: VerifyLeftovers) => void }) => {
    opts.onLeftovers?.(left);
    throw new WritError("kafka_failed", "writ verify could not run (tag_ticket race): Kafka was lost during the run", { retriable: true });
  },
}));

describe("writ verify lost Kafka and could not delete its topics", () => {
  it("exits 2, names what it left and the --cleanup command on stderr, and as a JSON line on stdout", async () => {
    const { verifyCommand } = await import("../../../src/cli/verify.ts");
    const dir = mkdtempSync(join(tmpdir(), "writ-verify-leftovers-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const out: string[] = [];
    const err: string[] = [];
    const stdout = vi.spyOn(process.stdout, "write").mockImplementation((c: string | Uint8Array) => (out.push(String(c)), true));
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((c: string | Uint8Array) => (err.push(String(c)), true));
    try {
      expect(await verifyCommand.main(["--tools", "./tools.ts", "--brokers", "127.0.0.1:9", "--json", "--log-file", join(dir, "verify.log")])).toBe(2);
    } finally {
      stdout.mockRestore();
      stderr.mockRestore();
    }
    expect(JSON.parse(out.join(""))).toEqual({
      ok: false,
      runId: "wv-0a1b2c",
      error: { code: "kafka_failed", message: "writ verify could not run (tag_ticket race): Kafka was lost during the run" },
      leftovers: left,
    });
    expect(err.join("")).toContain(
      "writ verify: left on the cluster (could not delete verify run wv-0a1b2c's topics and groups (brokers 127.0.0.1:9): no answer within 15000 ms): topics writ.verify.wv-0a1b2c.intents, writ.replies.verify.wv-0a1b2c.agent; " +
        "groups writ.verify.wv-0a1b2c; groups whose names start with writ.client.verify-wv-0a1b2c-; delete them with: writ verify --cleanup wv-0a1b2c --brokers 127.0.0.1:9",
    );
  });
});
