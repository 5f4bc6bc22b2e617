// The tests of the built package (the CLI, the packed tarball) need dist/ as
// `npm run build` makes it. `npm test` builds first (pretest); a test file run
// on its own (`vitest run test/integration/cli.test.ts`) builds here when dist
// is missing or older than a source.
import { execFileSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, rmSync, statSync } from "node:fs";
import { join, resolve } from "node:path";

export const ROOT = resolve(import.meta.dirname, "../..");
/** The built CLI: package.json "bin". */
export const BUILT_CLI = join(ROOT, "dist", "src", "cli", "main.js");

function newest(dir: string): number {
  let latest = 0;
  for (const entry of readdirSync(dir, { withFileTypes: true })) {
    const path = join(dir, entry.name);
    if (entry.isDirectory()) latest = Math.max(latest, newest(path));
    else if (entry.name.endsWith(".ts")) latest = Math.max(latest, statSync(path).mtimeMs);
  }
  return latest;
}

/** Whether dist/ is newer than every source it is built from. */
function fresh(): boolean {
  const sources = Math.max(
    newest(join(ROOT, "src")),
    newest(join(ROOT, "producers")),
    ...["package.json", "tsconfig.json", "tsconfig.build.json"].map((f) => statSync(join(ROOT, f)).mtimeMs),
  );
  return existsSync(BUILT_CLI) && statSync(BUILT_CLI).mtimeMs >= sources;
}

/** Held while one test file builds: integration files run two at a time, and a build deletes dist/ first. */
const BUILD_LOCK = join(ROOT, ".cache", "dist-build.lock");
/** A lock older than this was left by a killed build: taken over. */
const STALE_LOCK_MS = 10 * 60_000;

/**
 * Builds dist/ (`npm run build`'s steps) unless it is newer than every source it is built from. One file builds at a
 * time (a lock directory); one that waited for another's build finds dist fresh and builds nothing.
 */
export function ensureBuilt(): void {
  if (fresh()) return;
  mkdirSync(join(ROOT, ".cache"), { recursive: true });
  const pause = new Int32Array(new SharedArrayBuffer(4));
  for (;;) {
    try {
      mkdirSync(BUILD_LOCK);
      break;
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EEXIST") throw err;
      try {
        if (Date.now() - statSync(BUILD_LOCK).mtimeMs > STALE_LOCK_MS) rmSync(BUILD_LOCK, { recursive: true, force: true });
      } catch {
        // released meanwhile
      }
      Atomics.wait(pause, 0, 0, 250);
    }
  }
  try {
    if (fresh()) return;
    execFileSync(process.execPath, [join(ROOT, "scripts", "build.mjs")], { cwd: ROOT, stdio: "pipe" });
  } catch (err) {
    const out = `${(err as { stdout?: Buffer }).stdout?.toString() ?? ""}${(err as { stderr?: Buffer }).stderr?.toString() ?? ""}`;
    throw new Error(`npm run build failed:\n${out.slice(0, 4000)}`);
  } finally {
    rmSync(BUILD_LOCK, { recursive: true, force: true });
  }
}
