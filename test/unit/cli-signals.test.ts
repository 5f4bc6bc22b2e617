// src/cli/signals.ts with real signals, in a child process: the first SIGINT or SIGTERM asks for the stop, a
// second of either kind ends the process at once as killed by it (a shell's 130 / 143), also while the stop still
// runs (here: forever).
import { spawn } from "node:child_process";
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { waitFor } from "../helpers/wait-for.ts";

const SIGNALS = pathToFileURL(join(import.meta.dirname, "..", "..", "src", "cli", "signals.ts")).href;

/**
 * A process whose stop never finishes. `setup`: code run after the handlers are in place (`signals` in scope).
 * Prints `ready`, then `first <signal>` and `second <signal>` as the handlers run.
 */
function child(setup = "") {
  const code = `
    import { onStopSignals } from ${JSON.stringify(SIGNALS)};
    const signals = onStopSignals((s) => console.log("first " + s), (s) => console.log("second " + s));
    setInterval(() => {}, 1000); // the stop that never finishes
    ${setup}
    console.log("ready");`;
  const proc = spawn(process.execPath, ["--input-type=module", "-e", code], { stdio: ["ignore", "pipe", "pipe"] });
  onTestFinished(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  });
  let out = "";
  proc.stdout.on("data", (d: Buffer) => (out += d.toString()));
  proc.stderr.on("data", (d: Buffer) => (out += d.toString()));
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal })));
  const seen = (line: string) => waitFor(() => out.split("\n").includes(line), { timeoutMs: 10_000, message: () => `no "${line}" in:\n${out}` });
  return { proc, exited, seen, output: () => out };
}

describe("onStopSignals", () => {
  for (const [first, second] of [
    ["SIGTERM", "SIGTERM"],
    ["SIGINT", "SIGINT"],
    ["SIGINT", "SIGTERM"],
    ["SIGTERM", "SIGINT"],
  ] as const) {
    it(`${first} asks for the stop; ${second} then ends the process at once, killed by ${second}`, async () => {
      const c = child();
      await c.seen("ready");
      c.proc.kill(first);
      await c.seen(`first ${first}`);
      c.proc.kill(second);
      expect(await c.exited, c.output()).toEqual({ code: null, signal: second });
      expect(c.output()).toContain(`second ${second}`);
    });
  }

  it("after stopping() (a stop begun without a signal) the first signal ends the process at once", async () => {
    const c = child("signals.stopping();");
    await c.seen("ready");
    c.proc.kill("SIGTERM");
    expect(await c.exited, c.output()).toEqual({ code: null, signal: "SIGTERM" });
    expect(c.output()).not.toContain("first");
    expect(c.output()).toContain("second SIGTERM");
  });

  it("after dispose() a signal takes Node's default action", async () => {
    const c = child("signals.dispose();");
    await c.seen("ready");
    c.proc.kill("SIGINT");
    expect(await c.exited, c.output()).toEqual({ code: null, signal: "SIGINT" });
    expect(c.output()).not.toMatch(/first|second/);
  });

  it("where something else listens to the signal too, the second exits with its status (143) instead", async () => {
    const c = child(`process.on("SIGTERM", () => {});`);
    await c.seen("ready");
    c.proc.kill("SIGTERM");
    await c.seen("first SIGTERM");
    c.proc.kill("SIGTERM");
    expect(await c.exited, c.output()).toEqual({ code: 143, signal: null });
  });

  it("first names the signal that asked for the stop", async () => {
    const c = child(`process.on("SIGINT", () => console.log("first is " + signals.first));`);
    await c.seen("ready");
    c.proc.kill("SIGINT");
    await c.seen("first is SIGINT");
  });
});
