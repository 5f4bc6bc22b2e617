// The tests of the built package (the CLI, the packed tarball) need dist/ as
// `npm run build` makes it. `npm test` builds first (pretest); a test file run
// on its own (`vitest run test/integration/cli.test.ts`) builds here when dist
// is missing or older than a source.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
import { join, resolve } from "node:path";
import { withLock } from "../../src/testing/stack-process.ts";

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

/**
 * Builds dist/ (`npm run build`'s steps) unless it is newer than every source it is built from. One file builds at
 * a time, under a lock naming its process (src/testing/stack-process.ts withLock: a lock whose process is gone, as
 * after a Ctrl-C mid-build, is taken over); while one is held dist/ may be half built, so it is waited for, and the
 * file that waited finds dist fresh and builds nothing.
 */
export async function ensureBuilt(): Promise<void> {
  if (!existsSync(BUILD_LOCK) && fresh()) return;
  await withLock(
    (line) => console.log(`[build] ${line}`),
    async () => {
      if (fresh()) return;
      try {
        execFileSync(process.execPath, [join(ROOT, "scripts", "build.mjs")], { cwd: ROOT, stdio: "pipe" });
      } catch (err) {
        const out = `${(err as { stdout?: Buffer }).stdout?.toString() ?? ""}${(err as { stderr?: Buffer }).stderr?.toString() ?? ""}`;
        throw new Error(`npm run build failed:\n${out.slice(0, 4000)}`);
      }
    },
    BUILD_LOCK,
    10 * 60_000,
    "building dist/",
  );
}
