// `node scripts/promtool.ts <promtool arguments…>`: Prometheus's own promtool, the version of the Prometheus
// image in docker-compose.yml's monitoring profile, built once from the Go module proxy into
// .cache/promtool/<version>/ and run with the arguments, e.g.
//
//   node scripts/promtool.ts test rules deploy/prometheus/writ-alerts.test.yml
//
// Needs Go on the PATH. The first build downloads Prometheus's module graph (about 1.4 GB into Go's module
// cache) and compiles it: about 3 minutes on two cores; later builds from Go's caches take seconds.
import { spawnSync } from "node:child_process";
import { existsSync, mkdirSync, renameSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";

/** Prometheus v3.5.0 (prom/prometheus:v3.5.0 in docker-compose.yml): Go modules of Prometheus 3.x are v0.3xx. */
export const PROMETHEUS_MODULE_VERSION = "v0.305.0";
const MODULE = "github.com/prometheus/prometheus";

const repoRoot = resolve(import.meta.dirname, "..");

/** Where the built promtool is kept (git-ignored). */
export function promtoolPath(root = repoRoot): string {
  return join(root, ".cache", "promtool", PROMETHEUS_MODULE_VERSION, "promtool");
}

/** The path of promtool, built first when missing. Throws with go's own output when it cannot be built. */
export function ensurePromtool(root = repoRoot, log: (line: string) => void = (l) => process.stderr.write(`${l}\n`)): string {
  const bin = promtoolPath(root);
  if (existsSync(bin)) return bin;
  const go = spawnSync("go", ["version"], { encoding: "utf8" });
  if (go.status !== 0) throw new Error(`promtool: building it needs Go on the PATH (go version: ${go.error?.message ?? go.stderr.trim()})`);
  // Built into a directory of its own, then moved: a build cut short leaves no half-written binary behind.
  const staging = join(root, ".cache", "promtool", `${PROMETHEUS_MODULE_VERSION}.building-${process.pid}`);
  rmSync(staging, { recursive: true, force: true });
  mkdirSync(staging, { recursive: true });
  const t0 = Date.now();
  log(`[promtool] building ${MODULE}/cmd/promtool@${PROMETHEUS_MODULE_VERSION} with ${go.stdout.trim()} (once; kept in ${bin})`);
  // GOFLAGS of a caller's own Go project (-mod=vendor…) have no business here.
  const env = { ...process.env, GOFLAGS: "", CGO_ENABLED: "0" };
  // Prometheus's go.mod has a replace directive, which `go install <pkg>@<version>` refuses: the module is
  // downloaded (checked against the Go checksum database) and built as the main module, its own go.mod and go.sum in force.
  const downloaded = spawnSync("go", ["mod", "download", "-json", `${MODULE}@${PROMETHEUS_MODULE_VERSION}`], { encoding: "utf8", env, maxBuffer: 16 * 1024 * 1024 });
  const dir = downloaded.status === 0 ? (JSON.parse(downloaded.stdout) as { Dir?: string }).Dir : undefined;
  if (dir === undefined) throw new Error(`promtool: go mod download failed (exit ${downloaded.status ?? downloaded.signal}): ${(downloaded.stderr || downloaded.stdout).trim().slice(-4000)}`);
  const built = spawnSync("go", ["build", "-trimpath", "-ldflags", "-s -w", "-o", join(staging, "promtool"), "./cmd/promtool"], {
    cwd: dir,
    encoding: "utf8",
    env,
    maxBuffer: 64 * 1024 * 1024,
  });
  if (built.status !== 0 || !existsSync(join(staging, "promtool"))) {
    rmSync(staging, { recursive: true, force: true });
    throw new Error(`promtool: go build failed (exit ${built.status ?? built.signal}): ${(built.stderr || built.stdout).trim().slice(-4000)}`);
  }
  mkdirSync(join(bin, ".."), { recursive: true });
  renameSync(join(staging, "promtool"), bin);
  rmSync(staging, { recursive: true, force: true });
  log(`[promtool] built in ${((Date.now() - t0) / 1000).toFixed(0)} s`);
  return bin;
}

if (import.meta.filename === process.argv[1]) {
  let bin: string;
  try {
    bin = ensurePromtool();
  } catch (err) {
    process.stderr.write(`${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(2);
  }
  const run = spawnSync(bin, process.argv.slice(2), { stdio: "inherit" });
  process.exit(run.status ?? 1);
}
