// The tests of the built package (the CLI, the packed tarball) need dist/ as
// `npm run build` makes it. `npm test` builds first (pretest); a test file run
// on its own (`vitest run test/integration/cli.test.ts`) builds here when dist
// is missing or older than a source.
import { execFileSync } from "node:child_process";
import { existsSync, readdirSync, statSync } from "node:fs";
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

/** Builds dist/ (`npm run build`'s steps) unless it is newer than every source it is built from. */
export function ensureBuilt(): void {
  const sources = Math.max(
    newest(join(ROOT, "src")),
    newest(join(ROOT, "producers")),
    ...["package.json", "tsconfig.json", "tsconfig.build.json"].map((f) => statSync(join(ROOT, f)).mtimeMs),
  );
  if (existsSync(BUILT_CLI) && statSync(BUILT_CLI).mtimeMs >= sources) return;
  try {
    execFileSync(process.execPath, [join(ROOT, "scripts", "build.mjs")], { cwd: ROOT, stdio: "pipe" });
  } catch (err) {
    const out = `${(err as { stdout?: Buffer }).stdout?.toString() ?? ""}${(err as { stderr?: Buffer }).stderr?.toString() ?? ""}`;
    throw new Error(`npm run build failed:\n${out.slice(0, 4000)}`);
  }
}
