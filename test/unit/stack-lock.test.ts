// The local stacks' start lock and leases name their process by pid and start time (src/testing/stack-process.ts):
// a lock left by a process that was killed, whose pid another process got since, held every start for its
// 10 minutes' wait, and such a lease kept its stack from ever being stopped by its last user.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, describe, expect, it } from "vitest";

/** Every dir this file makes, removed at its end. */
const dirs: string[] = [];
function tempDir(): string {
  const dir = mkdtempSync(join(tmpdir(), "writ-stack-lock-"));
  dirs.push(dir);
  return dir;
}
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

// The leases' dir is read from the environment at import.
process.env["WRIT_LOCAL_STACK_DIR"] = tempDir();
const { LEASE_DIR, otherLiveLeases, ownRecord, parseRecord, processStartTime, recordAlive, takeLease, withLock } = await import("../../src/testing/stack-process.ts");

const linux = process.platform === "linux";
const ownStart = processStartTime(process.pid);
/** A start time this process's pid never had: the pid as another process would hold it after a reuse. */
const otherStart = String(Number(ownStart ?? 0) + 1);
/** The pid of a process that has exited. */
const deadPid = spawnSync(process.execPath, ["-e", ""]).pid;

function lockFile(content: string): string {
  const file = join(tempDir(), "stack.lock");
  writeFileSync(file, content);
  return file;
}

describe.runIf(linux)("a process's record: pid and start time", () => {
  it("this process's, as /proc/<pid>/stat field 22 says; another start time under its pid is another process", () => {
    expect(ownStart).toMatch(/^\d+$/);
    expect(ownRecord()).toBe(`${process.pid} ${ownStart}`);
    expect(parseRecord(`${ownRecord()}\n`)).toEqual({ pid: process.pid, startTime: ownStart });
    expect(recordAlive({ pid: process.pid, startTime: ownStart })).toBe(true);
    expect(recordAlive({ pid: process.pid, startTime: otherStart })).toBe(false);
    // a file written before start times were kept: the pid alone
    expect(recordAlive({ pid: process.pid })).toBe(true);
    expect(recordAlive({ pid: deadPid })).toBe(false);
    expect(parseRecord("")).toBeUndefined();
    expect(parseRecord("12ab")).toBeUndefined();
  });
});

describe.runIf(linux)("withLock", () => {
  it("takes over at once a lock whose pid is now another process's (another start time)", async () => {
    const file = lockFile(`${process.pid} ${otherStart}\n`);
    const said: string[] = [];
    // a wait of one minute would end the test first: the take-over must not wait at all
    const ran = await withLock((l) => said.push(l), async () => readFileSync(file, "utf8"), file, 60_000);
    expect(ran).toBe(`${ownRecord()}\n`);
    expect(said).toEqual([]);
    expect(existsSync(file)).toBe(false);
  });

  it("takes over a dead pid's lock, and waits for a live holder's, with or without its start time", async () => {
    const dead = lockFile(`${deadPid}\n`);
    await expect(withLock(() => undefined, async () => "ran", dead, 60_000)).resolves.toBe("ran");
    for (const holder of [`${process.pid} ${ownStart}`, `${process.pid}`]) {
      const file = lockFile(`${holder}\n`);
      const said: string[] = [];
      await expect(withLock((l) => said.push(l), async () => "ran", file, 500)).rejects.toThrow(`timed out waiting for ${file} (held by pid ${process.pid})`);
      expect(said).toEqual([`waiting for another process (pid ${process.pid}) that is starting the stack`]);
      expect(readFileSync(file, "utf8")).toBe(`${holder}\n`);
    }
  });
});

describe.runIf(linux)("leases", () => {
  it("a lease whose pid is now another process's is pruned; a live one is kept", () => {
    mkdirSync(LEASE_DIR, { recursive: true });
    const reused = join(LEASE_DIR, `${process.pid}.0badbeef`);
    writeFileSync(reused, `${process.pid} ${otherStart}\n`);
    const dead = join(LEASE_DIR, `${deadPid}.0deadbee`);
    writeFileSync(dead, `${deadPid}\n`);
    const live = takeLease();
    expect(readFileSync(live, "utf8")).toBe(`${ownRecord()}\n`);
    expect(otherLiveLeases("")).toEqual([live]);
    expect(existsSync(reused)).toBe(false);
    expect(existsSync(dead)).toBe(false);
  });
});
