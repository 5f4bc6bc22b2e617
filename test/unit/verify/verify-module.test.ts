import { execFile, spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { pathToFileURL } from "node:url";
import { describe, expect, it, onTestFinished } from "vitest";
import * as demoFixture from "../../../examples/verify-fixture.ts";
import { WritError } from "../../../src/errors.ts";
import { cleanupVerifyRun, defaultModuleTimeoutMs, outageNow, runVerify } from "../../../src/verify/verify.ts";
import { ROOT } from "../../helpers/build.ts";
import { waitFor } from "../../helpers/wait-for.ts";

// What runVerify refuses before it reaches Kafka (KAFKA_BROKERS=127.0.0.1:9 in the unit run: nothing listens).
const verify = (tools: Parameters<typeof runVerify>[0]["tools"]) => runVerify({ tools, brokers: "127.0.0.1:9", env: {} });

/** `writ verify <args> --brokers 127.0.0.1:9` from the sources: its exit code and stderr. */
const verifyCli = (args: string[]) =>
  new Promise<{ code: number; stderr: string }>((resolve) => {
    execFile(process.execPath, [join(ROOT, "src", "cli", "main.ts"), "verify", ...args, "--brokers", "127.0.0.1:9"], { timeout: 30_000 }, (err, _out, stderr) =>
      resolve({ code: err === null ? 0 : typeof err.code === "number" ? err.code : 1, stderr }),
    );
  });

describe("runVerify: the module as given", () => {
  it("refuses a tools export that holds something other than tool declarations, naming it", async () => {
    await expect(verify({ ...demoFixture, tools: [demoFixture.tools[0]!, null as never] })).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining("tools[1] is not a tool declaration"),
    });
  });

  it("refuses a systems(env) that does not give systems, and one that never answers, naming it", async () => {
    await expect(verify({ ...demoFixture, systems: () => "nope" as never })).rejects.toMatchObject({ code: "config_invalid", message: expect.stringContaining("systems(env) must return an array") });
    await expect(
      runVerify({ tools: { ...demoFixture, systems: () => new Promise<never>(() => undefined) }, brokers: "127.0.0.1:9", env: {}, moduleTimeoutMs: 200 }),
    ).rejects.toThrow("the module's systems(env) did not answer within 200 ms");
  });
});

/** A tools module whose top-level await never settles; `holding`: a timer keeps the process alive meanwhile. */
function neverLoading(holding: boolean): string {
  const dir = mkdtempSync(join(tmpdir(), "writ-verify-hung-"));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  const module = join(dir, "hung-tools.mjs");
  writeFileSync(module, `${holding ? "setInterval(() => undefined, 1000);\n" : ""}await new Promise(() => undefined);\nexport const tools = [];\n`);
  return module;
}

describe("a tools module whose import never finishes", () => {
  it("is refused once the module deadline passes, naming it: runVerify rejects config_invalid, the import left pending", async () => {
    await expect(runVerify({ tools: neverLoading(false), brokers: "127.0.0.1:9", env: {}, moduleTimeoutMs: 200 })).rejects.toMatchObject({
      code: "config_invalid",
      context: { field: "moduleTimeoutMs" },
      message: expect.stringMatching(/did not finish loading within 200 ms \(--module-timeout-ms, moduleTimeoutMs in runVerify; .*\): its top-level code has not settled/),
    });
  });

  it.each([
    ["a timer holds the process open", true],
    ["nothing holds the process open", false],
  ])("ends the CLI with exit 2 and says why, not a hang nor Node's unsettled top-level await (%s)", async (_, holding) => {
    // Before: with a timer, verify waited for ever (killed here at 30 s); without, Node ended it with 13 and a warning.
    const run = await verifyCli(["--tools", neverLoading(holding), "--module-timeout-ms", "2000"]);
    expect(run.code, run.stderr).toBe(2);
    expect(run.stderr).toMatch(/^writ verify: the tools module \S+hung-tools\.mjs did not finish loading within 2000 ms \(--module-timeout-ms/m);
  });
});

/** A tools module that spins for ever (a synchronous loop) at `where`: its top level, or in systems(env). */
function spinning(where: "top level" | "systems(env)"): string {
  const dir = mkdtempSync(join(tmpdir(), "writ-verify-spin-"));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  const module = join(dir, "spinning-tools.mjs");
  // The demo's tools and fixtures, its systems(env) replaced: the module passes every check before that call.
  const demo = JSON.stringify(pathToFileURL(join(ROOT, "examples", "verify-fixture.ts")).href);
  writeFileSync(module, where === "top level" ? "for (;;) {}\nexport const tools = [];\n" : `export * from ${demo};\nexport function systems() { for (;;) {} }\n`);
  return module;
}

describe("a tools module whose code never yields", () => {
  // A deadline is a timer, and no timer fires while a synchronous loop runs: before, verify hung for good, deaf to
  // Ctrl-C (or SIGTERM). A worker thread watches the loop and ends the process, saying why.
  it.each(["top level", "systems(env)"] as const)("ends the CLI (SIGKILL) once the module deadline passes, saying why on stderr, and with --json on stdout (a loop at its %s)", async (where) => {
    const json = where === "systems(env)";
    const args = ["verify", "--tools", spinning(where), "--module-timeout-ms", "2000", "--brokers", "127.0.0.1:9", ...(json ? ["--json"] : [])];
    // Without a NODE_OPTIONS of the caller's (a debugger's --inspect would rightly keep the watch from killing).
    const { NODE_OPTIONS: _inherited, ...env } = process.env;
    const child = spawn(process.execPath, [join(ROOT, "src", "cli", "main.ts"), ...args], { stdio: ["ignore", "pipe", "pipe"], env });
    let stderr = "";
    let stdout = "";
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    child.on("exit", (code, signal) => (exit = { code, signal }));
    try {
      // Its own end, not this test's: a process still there at the deadline fails the test (and is killed below).
      await waitFor(() => exit, { timeoutMs: 30_000, message: () => `writ verify did not end; stderr: ${stderr}` });
    } finally {
      if (!exit) child.kill("SIGKILL");
    }
    const run = { ...exit!, stderr };
    expect({ code: run.code, signal: run.signal }, run.stderr).toEqual({ code: null, signal: "SIGKILL" });
    expect(run.stderr).toContain("writ verify: stopped: the process's JavaScript ran for 2000 ms without yielding (--module-timeout-ms)");
    if (json) {
      // The run had its id by then (systems(env) comes after it): the line names it, as other failures' lines do.
      const line = JSON.parse(stdout.trim().split("\n").at(-1)!);
      expect(line).toMatchObject({ ok: false, runId: expect.stringMatching(/^wv-[0-9a-f]{6}$/), error: { code: "stalled" } });
      expect(line.leftovers).toMatchObject({ runId: line.runId, cleanup: `writ verify --cleanup ${line.runId} --brokers 127.0.0.1:9` });
    } else expect(stdout).toBe("");
  });
});

describe("the module deadline", () => {
  it("is 30 s, or what an adapter within a longer --sor-timeout-ms takes (a read and a write, and 5 s)", () => {
    expect(defaultModuleTimeoutMs(2000)).toBe(30_000);
    expect(defaultModuleTimeoutMs(12_500)).toBe(30_000);
    expect(defaultModuleTimeoutMs(20_000)).toBe(45_000);
  });

  it("the CLI refuses --module-timeout-ms under --sor-timeout-ms (it would cut off a correct adapter), exit 2, before Kafka", async () => {
    const run = (args: string[]) => verifyCli(["--tools", "./none.ts", ...args]);
    const short = await run(["--sor-timeout-ms", "5000", "--module-timeout-ms", "1000"]);
    expect([short.code, short.stderr]).toEqual([2, expect.stringContaining("--module-timeout-ms 1000 is under the system-of-record deadline (--sor-timeout-ms 5000)")]);
    const underDefault = await run(["--module-timeout-ms", "1500"]);
    expect(underDefault.stderr).toContain("(--sor-timeout-ms 2000)");
  });
});

describe("the outage probe, when the owner has stopped", () => {
  const probe = (ownerStopped: Error) => outageNow({ brokers: ["127.0.0.1:9"], security: undefined, topics: [], registry: {}, ownerStopped });

  it("gives writ's own reason (another group of owners runs on the topic), not 'Kafka failed its consumer'", async () => {
    const other = new WritError("config_invalid", "another group of owners (writ.owners.b) runs on writ.intents", { retriable: false });
    const down = await probe(other);
    expect(down).toMatchObject({ code: "config_invalid", message: "the owner stopped", cause: other });
    expect(down?.message).not.toContain("Kafka");
  });

  it("says Kafka failed its consumer when a kafkajs error stopped it", async () => {
    expect(await probe(new Error("The group member needs to have a valid member id"))).toMatchObject({ code: "kafka_failed", message: "the owner stopped: Kafka failed its consumer" });
  });
});

describe("the cleanup of a verify run", () => {
  it("deletes only what a run id as verify makes names: any other is refused before Kafka (config_invalid, exit 2)", async () => {
    for (const runId of ["writ", "wv-", "wv-abc12", "wv-abc1234", "wv-ABC123", "wv-abc123.intents", ""]) {
      await expect(cleanupVerifyRun({ runId, brokers: ["127.0.0.1:9"] }), runId).rejects.toMatchObject({ code: "config_invalid", context: { field: "runId" } });
    }
    const cli = await verifyCli(["--cleanup", "writ"]);
    expect([cli.code, cli.stderr]).toEqual([2, expect.stringContaining('"writ" is not a verify run id')]);
    const force = await verifyCli(["--tools", "./none.ts", "--force"]);
    expect([force.code, force.stderr]).toEqual([2, expect.stringContaining("--force goes only with --cleanup")]);
  });
});
