// `node scripts/promtool.ts <promtool arguments…>`: Prometheus's own promtool, the version of the Prometheus
// image in docker-compose.yml's monitoring profile, built once from the Go module proxy into
// .cache/promtool/<version>/ and run with the arguments, e.g.
//
//   node scripts/promtool.ts test rules deploy/prometheus/writ-alerts.test.yml
//
// `node scripts/promtool.ts --build-in-background` only builds it, at the lowest CPU priority (nice 19): `npm test`
// starts that at its beginning (scripts/test.mjs), so the build (about 3.5 minutes of an idle machine's wall time,
// nine to ten beside the tests) runs on the cores they leave idle, and is done by the time
// test/integration/alert-rules-promtool.test.ts runs, after every other file (vitest.config.ts).
//
// Needs Go on the PATH. The first build downloads Prometheus's module graph (about 1.4 GB into Go's module
// cache) and compiles it: about 3 minutes on two cores; later builds from Go's caches take seconds. One build at a
// time: a process that needs promtool while another builds it waits for that build (a lock file beside the
// binary, taken over when its holder is gone).
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, readdirSync, readFileSync, renameSync, rmSync, writeFileSync } from "node:fs";
import { setPriority } from "node:os";
import { join, resolve } from "node:path";
import { isAlive, run, withLock } from "../src/testing/stack-process.ts";

/** Prometheus v3.5.0 (prom/prometheus:v3.5.0 in docker-compose.yml): Go modules of Prometheus 3.x are v0.3xx. */
export const PROMETHEUS_MODULE_VERSION = "v0.305.0";
const MODULE = "github.com/prometheus/prometheus";
/** How long a process that needs promtool waits for another's build: a clean machine's, on cores the tests share. */
const BUILD_WAIT_MS = 20 * 60_000;

const repoRoot = resolve(import.meta.dirname, "..");

/** Where the built promtool is kept (git-ignored). */
export function promtoolPath(root = repoRoot): string {
  return join(root, ".cache", "promtool", PROMETHEUS_MODULE_VERSION, "promtool");
}

/**
 * The path of promtool, built first when missing (or the build another process holds the lock for waited for).
 * Rejects with go's own output when it cannot be built.
 */
export async function ensurePromtool(root = repoRoot, log: (line: string) => void = (l) => process.stderr.write(`${l}\n`)): Promise<string> {
  const bin = promtoolPath(root);
  if (existsSync(bin)) return bin;
  const dir = join(root, ".cache", "promtool");
  const lock = join(dir, `${PROMETHEUS_MODULE_VERSION}.lock`);
  let waited = false;
  return withLock(
    (line) => {
      waited = true;
      log(`[promtool] ${line}`);
    },
    async () => {
      if (existsSync(bin)) {
        if (waited) log(`[promtool] built by the other process: ${bin}`);
        return bin;
      }
      await build(dir, bin, log);
      return bin;
    },
    lock,
    BUILD_WAIT_MS,
    "building promtool",
  );
}

/** Builds promtool into `bin`, in `dir` (.cache/promtool/), holding the lock. */
async function build(dir: string, bin: string, log: (line: string) => void): Promise<void> {
  const needsGo = (why: string) => new Error(`promtool: building it needs Go on the PATH (go version: ${why})`);
  const go = await run("go", ["version"], process.cwd()).catch((err: Error) => Promise.reject(needsGo(err.message)));
  if (go.code !== 0) throw needsGo(go.output.trim() || `exit ${go.code}`);
  // Built into a directory of its own, then moved: a build cut short leaves no half-written binary behind. The
  // staging directories of builds cut short (their pid gone) are removed; a live one's is left alone.
  mkdirSync(dir, { recursive: true });
  const prefix = `${PROMETHEUS_MODULE_VERSION}.building-`;
  for (const name of readdirSync(dir)) {
    if (name.startsWith(prefix) && !isAlive(Number(name.slice(prefix.length)))) rmSync(join(dir, name), { recursive: true, force: true });
  }
  const staging = join(dir, `${PROMETHEUS_MODULE_VERSION}.building-${process.pid}`);
  mkdirSync(staging, { recursive: true });
  const t0 = Date.now();
  log(`[promtool] building ${MODULE}/cmd/promtool@${PROMETHEUS_MODULE_VERSION} with ${go.stdout.trim()} (once; kept in ${bin})`);
  // GOFLAGS of a caller's own Go project (-mod=vendor…) have no business here.
  const env = { ...process.env, GOFLAGS: "", CGO_ENABLED: "0" };
  // Prometheus's go.mod has a replace directive, which `go install <pkg>@<version>` refuses: the module is
  // downloaded (checked against the Go checksum database) and built as the main module, its own go.mod and go.sum in force.
  const downloaded = await run("go", ["mod", "download", "-json", `${MODULE}@${PROMETHEUS_MODULE_VERSION}`], process.cwd(), env);
  const moduleDir = downloaded.code === 0 ? (JSON.parse(downloaded.stdout) as { Dir?: string }).Dir : undefined;
  if (moduleDir === undefined) throw new Error(`promtool: go mod download failed (exit ${downloaded.code}): ${downloaded.output.trim().slice(-4000)}`);
  const built = await run("go", ["build", "-trimpath", "-ldflags", "-s -w", "-o", join(staging, "promtool"), "./cmd/promtool"], moduleDir, env);
  if (built.code !== 0 || !existsSync(join(staging, "promtool"))) {
    rmSync(staging, { recursive: true, force: true });
    throw new Error(`promtool: go build failed (exit ${built.code}): ${built.output.trim().slice(-4000)}`);
  }
  mkdirSync(join(bin, ".."), { recursive: true });
  renameSync(join(staging, "promtool"), bin);
  rmSync(staging, { recursive: true, force: true });
  log(`[promtool] built in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
}

/**
 * The lowest CPU priority for this process and what it starts (go and its compilers inherit it), so the build takes
 * only what the tests leave idle. Nice alone is not enough where it leads a session of its own (npm test starts it
 * detached, to stop go's children with it): with the kernel's scheduler autogroups (Linux's default on desktops and
 * many VMs), each session is scheduled as one group against the others, and a nice-19 process alone in its group
 * got as much CPU as the tests' two busy processes together. So the session's autogroup is made nice 19 too, only
 * when this process leads that session (never a caller's terminal session).
 */
export function lowestPriority(): void {
  setPriority(19);
  try {
    const stat = readFileSync("/proc/self/stat", "utf8");
    // Fields after the command's parenthesised name: state, ppid, pgrp, session, …
    const session = Number(stat.slice(stat.lastIndexOf(")") + 2).split(" ")[3]);
    if (session !== process.pid) return;
    // The kernel refuses a user without CAP_SYS_ADMIN an autogroup write within 100 ms of any other (EAGAIN).
    for (let attempt = 1; ; attempt++) {
      try {
        writeFileSync("/proc/self/autogroup", "19");
        return;
      } catch (err) {
        if ((err as NodeJS.ErrnoException).code !== "EAGAIN" || attempt === 5) throw err;
        Atomics.wait(new Int32Array(new SharedArrayBuffer(4)), 0, 0, 110);
      }
    }
  } catch {
    // no autogroups (or no /proc, or not allowed): nice is what the scheduler goes by
  }
}

if (import.meta.filename === process.argv[1]) {
  const background = process.argv[2] === "--build-in-background";
  if (background) lowestPriority();
  let bin: string;
  try {
    bin = await ensurePromtool();
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(2);
  }
  if (background) process.exit(0);
  const ran = spawnSync(bin, process.argv.slice(2), { stdio: "inherit" });
  process.exit(ran.status ?? 1);
}
