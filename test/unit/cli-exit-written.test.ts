// A `writ` command's output reaches a reader that is slow to take it (src/cli/exit.ts): a child's stdio from
// Node's child_process is a socket, where a large write is queued, and process.exit dropped what the reader had not
// taken (a 146 KB `writ escalations resolve` answer cut mid-string in CI). The child here writes 4 MB, says so on
// stderr, and ends; the parent reads its stdout only after that.
import { spawn } from "node:child_process";
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";

const ROOT = resolve(import.meta.dirname, "..", "..");
const EXIT = join(ROOT, "src", "cli", "exit.ts");

/** A child that writes `bytes` then ends with `end` ("exitWhenWritten" or a bare "process.exit"): what its reader got. */
async function readSlowly(end: "exitWhenWritten" | "process.exit", bytes = 4 * 1024 * 1024): Promise<{ got: number; last: string; code: number | null }> {
  const script = `
    const { exitWhenWritten } = await import(${JSON.stringify(EXIT)});
    process.stdout.write("x".repeat(${bytes}) + "END\\n");
    process.stderr.write("written\\n");
    ${end === "exitWhenWritten" ? "await exitWhenWritten(3);" : "process.exit(3);"}
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
  child.stdout.pause();
  let got = 0;
  let last = "";
  child.stdout.on("data", (c: Buffer) => {
    got += c.length;
    last = (last + c.toString()).slice(-4);
  });
  // Only once the child has written everything (and, without the wait, already left) does the reader start.
  child.stderr.on("data", () => setImmediate(() => child.stdout.resume()));
  const code = await new Promise<number | null>((done) => child.on("close", (c) => done(c)));
  return { got, last, code };
}

describe("a command's exit waits for its output to be taken", () => {
  it("4 MB written to a socket a reader takes late all arrive, and the exit status is kept", async () => {
    const r = await readSlowly("exitWhenWritten");
    expect(r.got).toBe(4 * 1024 * 1024 + 4);
    expect(r.last).toBe("END\n");
    expect(r.code).toBe(3);
  });

  it("control: a bare process.exit after the same write loses what the reader had not taken", async () => {
    const r = await readSlowly("process.exit");
    expect(r.got).toBeLessThan(4 * 1024 * 1024);
    expect(r.code).toBe(3);
  });

  it("a reader gone while the output is queued: the command's own status, no unhandled EPIPE", async () => {
    // No 'error' listener of the child's own (the owner's and the MCP server's mains have none): before, the EPIPE
    // was an unhandled 'error' event (a stack trace, exit 1) instead of the command's status.
    const script = `
      const { exitWhenWritten } = await import(${JSON.stringify(EXIT)});
      process.stdout.write("x".repeat(4 * 1024 * 1024));
      process.stderr.write("written\\n");
      await exitWhenWritten(3);
    `;
    const child = spawn(process.execPath, ["--input-type=module", "-e", script], { stdio: ["ignore", "pipe", "pipe"] });
    child.stdout.pause();
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => {
      stderr += c.toString();
      // the reader goes away without reading
      if (stderr.includes("written")) child.stdout.destroy();
    });
    const code = await new Promise<number | null>((done) => child.on("close", (c) => done(c)));
    expect(stderr).not.toContain("EPIPE");
    expect(code).toBe(3);
  });

  it("the writ command ends through it", () => {
    const main = readFileSync(join(ROOT, "src", "cli", "main.ts"), "utf8");
    expect(main).toMatch(/await exitWhenWritten\(code\);\s*$/);
    expect(main).not.toMatch(/^process\.exit\(code\)/m);
  });
});
