// src/cli/signals.ts with real signals, in a child process: the first SIGINT or SIGTERM asks for the stop, one
// within SAME_REQUEST_MS of it is the same request (npm's forwarded copy of a Ctrl-C), a second of either kind after
// that ends the process at once as killed by it (a shell's 130 / 143), also while the stop still runs (here: until
// the test writes to its stdin).
import { spawn } from "node:child_process";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { pathToFileURL } from "node:url";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import { SAME_REQUEST_MS } from "../../src/cli/signals.ts";
import { waitFor } from "../helpers/wait-for.ts";

const SIGNALS = pathToFileURL(join(import.meta.dirname, "..", "..", "src", "cli", "signals.ts")).href;

/** The helper, its stop running until a line on stdin ends it cleanly (exit 0). Prints as in {@link child}. */
const CHILD = (setup: string) => `
  import { onStopSignals } from ${JSON.stringify(SIGNALS)};
  const signals = onStopSignals((s) => console.log("first " + s), (s) => console.log("second " + s), (s) => console.log("repeat " + s));
  process.stdin.on("data", () => (console.log("stopped cleanly"), process.exit(0)));
  ${setup}
  console.log("ready");`;

/**
 * A process whose stop runs until the test ends it (`stopCleanly`). `setup`: code run after the handlers are in
 * place (`signals` in scope). Prints `ready`, then `first <signal>`, `repeat <signal>`, `second <signal>` as the
 * handlers run. `on(line, then)`: `then` runs as soon as the line is read (a repeat sent at once, not after a poll).
 */
function child(setup = "") {
  const proc = spawn(process.execPath, ["--input-type=module", "-e", CHILD(setup)], { stdio: ["pipe", "pipe", "pipe"] });
  return watch(proc);
}

function watch(proc: ReturnType<typeof spawn>) {
  onTestFinished(() => {
    if (proc.exitCode === null && proc.signalCode === null) proc.kill("SIGKILL");
  });
  let out = "";
  const triggers: { line: string; then: () => void }[] = [];
  const read = (d: Buffer) => {
    out += d.toString();
    for (const t of triggers.splice(0)) {
      if (out.split("\n").includes(t.line)) t.then();
      else triggers.push(t);
    }
  };
  proc.stdin!.on("error", () => undefined); // a process already ended: its exit says why
  proc.stdout!.on("data", read);
  proc.stderr!.on("data", read);
  const exited = new Promise<{ code: number | null; signal: NodeJS.Signals | null }>((resolve) => proc.once("exit", (code, signal) => resolve({ code, signal })));
  const seen = (line: string) => waitFor(() => out.split("\n").includes(line), { timeoutMs: 10_000, message: () => `no "${line}" in:\n${out}` });
  return {
    proc,
    exited,
    seen,
    on: (line: string, then: () => void) => void triggers.push({ line, then }),
    stopCleanly: () => proc.stdin!.write("done\n"),
    output: () => out,
  };
}

describe("onStopSignals", () => {
  for (const [first, second] of [
    ["SIGTERM", "SIGTERM"],
    ["SIGINT", "SIGINT"],
    ["SIGINT", "SIGTERM"],
    ["SIGTERM", "SIGINT"],
  ] as const) {
    it(`${first} asks for the stop; ${second} past SAME_REQUEST_MS ends the process at once, killed by ${second}`, async () => {
      const c = child();
      await c.seen("ready");
      c.proc.kill(first);
      await c.seen(`first ${first}`);
      // The window is counted from when the helper took the first signal, before it printed that it did.
      await sleep(SAME_REQUEST_MS + 50);
      c.proc.kill(second);
      expect(await c.exited, c.output()).toEqual({ code: null, signal: second });
      expect(c.output()).toContain(`second ${second}`);
    });
  }

  for (const [first, repeat] of [
    ["SIGINT", "SIGINT"],
    ["SIGINT", "SIGTERM"],
  ] as const) {
    it(`${first}, then ${repeat} sent the moment the first is taken, is one request: the stop runs on and ends cleanly`, async () => {
      const c = child();
      await c.seen("ready");
      c.on(`first ${first}`, () => c.proc.kill(repeat));
      c.proc.kill(first);
      await waitFor(() => /^(repeat|second) /m.test(c.output()), { timeoutMs: 10_000, message: c.output });
      c.stopCleanly();
      expect(await c.exited, c.output()).toEqual({ code: 0, signal: null });
      expect(c.output()).not.toContain("second");
    });
  }

  it("one Ctrl-C to the process group of `npm run` (bash as script-shell, which execs node): npm forwards it too, and the stop is still clean", async () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-signals-npm-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    // The stop ends by itself: on the repeat where it came apart, else once the window has passed.
    writeFileSync(join(dir, "child.mjs"), CHILD(`process.on("SIGINT", () => setTimeout(() => (console.log("stopped cleanly"), process.exit(0)), ${SAME_REQUEST_MS}));`));
    writeFileSync(join(dir, "package.json"), JSON.stringify({ name: "signals", private: true, scripts: { owner: `${JSON.stringify(process.execPath)} child.mjs` } }));
    // detached: npm leads a process group of its own, as a shell's job does; the terminal's Ctrl-C signals all of it.
    const npm = spawn("npm", ["run", "--silent", "--script-shell=/bin/bash", "owner"], { cwd: dir, detached: true, stdio: ["pipe", "pipe", "pipe"] });
    const c = watch(npm);
    onTestFinished(() => {
      try {
        process.kill(-npm.pid!, "SIGKILL");
      } catch {
        // gone
      }
    });
    await c.seen("ready");
    process.kill(-npm.pid!, "SIGINT");
    expect(await c.exited, c.output()).toEqual({ code: 0, signal: null });
    expect(c.output()).toContain("stopped cleanly");
    expect(c.output()).not.toContain("second");
  });

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
    await sleep(SAME_REQUEST_MS + 50);
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
