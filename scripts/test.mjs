// `npm test`: the type check (tsc --noEmit) and vitest, side by side. The type check is about 18 s of one core;
// run first, as before, it held back the whole run, while vitest's first minute (the broker starting, then the
// first files, mostly waiting on timers, sockets and the broker) leaves a core idle. Either failing fails the run; a type
// error is reported as soon as tsc ends, and vitest still finishes (and stops the broker it started).
// Arguments go to `vitest run`, as they did with `tsc --noEmit && vitest run`.
//
// A full run (no arguments) also starts the secure stack (src/testing/secure-stack.ts: SASL_SSL, ACLs, an HTTPS
// registry) once, in the background once the type check is done, for the suites that run over it: test/integration/secure.test.ts and
// doctor-acls.test.ts, each of which would otherwise start and stop its own (about 11 s each), and the Python suite
// when .ci/run keeps it (WRIT_KEEP_STACK=1). Each of those suites is a tenant of its own (test/helpers/secure-tenants.ts)
// or the stack's own users, so none sees another's users, topics or ACLs. WRIT_SECURE_STACK_DIR and its ports name
// it to them (inherited; the stack's lock makes one that comes while it starts wait); it is stopped at the end,
// whatever the outcome, unless WRIT_KEEP_STACK=1 (then by whoever set it: `npm run kafka:down -- --secure`). One
// left running by a run that was killed is reused where it serves: ensureSecureStack starts its registry again
// if that died, and the whole stack afresh if its broker does not serve or its start never finished.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { join } from "node:path";
import { SECURE_TENANTS } from "../test/helpers/secure-tenants.ts";

const root = join(import.meta.dirname, "..");
const children = new Set();
let stopping = false;
/** The background build of promtool (below), a process group of its own: go and its compilers stop with it. */
let promtoolBuild;
function stopPromtoolBuild() {
  if (promtoolBuild?.pid !== undefined && promtoolBuild.exitCode === null && promtoolBuild.signalCode === null) {
    try {
      process.kill(-promtoolBuild.pid, "SIGTERM");
    } catch {
      // already gone
    }
  }
}
// A signal to `npm test` (Ctrl-C, npm passing on a SIGTERM) goes to both: none is left running on its own.
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    stopping = true;
    for (const child of children) child.kill(signal);
    stopPromtoolBuild();
  });
}
const run = (args) =>
  new Promise((resolve) => {
    const child = spawn(process.execPath, args, { cwd: root, stdio: "inherit" });
    children.add(child);
    child.on("exit", () => children.delete(child));
    child.on("error", (err) => {
      console.error(`npm test: ${args[0]}: ${err.message}`);
      resolve(1);
    });
    child.on("exit", (code, signal) => resolve(code ?? (signal ? 1 : 0)));
  });

const typecheck = run([join(root, "node_modules", "typescript", "bin", "tsc"), "--noEmit"]).then((code) => {
  if (code !== 0) console.error(`npm test: the type check (tsc --noEmit) failed (exit ${code}); the tests go on, and the run fails`);
  return code;
});
const shareSecure = process.argv.length === 2;
if (shareSecure) {
  // Its own dir and ports, below the ephemeral range as every stack's (src/testing/local-stack.ts's header says
  // why), whatever a developer's shell names for a secure stack of their own (which has no tenants of these
  // suites); named before vitest starts, which passes them on to its files. .ci/run names the same ones.
  process.env.WRIT_SECURE_STACK_DIR = join(root, ".cache", "run-secure-shared");
  process.env.WRIT_SECURE_KAFKA_PORT = "22392";
  process.env.WRIT_SECURE_REGISTRY_PORT = "22381";
}
// A full run on a machine without promtool (a clean clone) builds it in the background from the start, at nice 19
// (scripts/promtool.ts): Go's download and compile (about ten minutes on cores the tests share), done by the time
// test/integration/alert-rules-promtool.test.ts runs, last of all (vitest project integration-last). That file waits
// for the build (a lock file), and starts it itself if this one failed or was not started. Stopped, with go's
// children, when `npm test` ends first.
if (shareSecure) {
  const { promtoolPath } = await import("./promtool.ts");
  if (!existsSync(promtoolPath(root))) {
    promtoolBuild = spawn(process.execPath, [join(root, "scripts", "promtool.ts"), "--build-in-background"], { cwd: root, stdio: "inherit", detached: true });
    promtoolBuild.on("error", (err) => console.error(`npm test: building promtool in the background: ${err.message}`));
  }
}
const tests = run([join(root, "node_modules", "vitest", "vitest.mjs"), "run", ...process.argv.slice(2)]).finally(() => {
  stopping = true;
});
// Started once the type check is done: the plain stack vitest's global setup starts, which every file waits
// for, is up by then, and the files that need it run last (vitest project integration-alone, after the unit and
// the other integration files: minutes).
const secure = !shareSecure
  ? Promise.resolve(undefined)
  : typecheck.then(async () => {
      if (stopping) return undefined;
      const { ensureSecureStack } = await import("../src/testing/secure-stack.ts");
      const { hideKafkajsTimeoutWarning } = await import("../src/node-warnings.ts");
      hideKafkajsTimeoutWarning();
      const log = (line) => console.log(`[secure-stack] ${line}`);
      // A start that fails is said here; the suites then start it themselves and fail with the reason if they cannot.
      return ensureSecureStack({ tenants: Object.values(SECURE_TENANTS), log }).catch((err) => {
        console.error(`npm test: the shared secure stack did not start: ${err instanceof Error ? err.message : String(err)}`);
        return undefined;
      });
    });
const [tscCode, vitestCode] = await Promise.all([typecheck, tests]);
stopPromtoolBuild();
const stack = await secure;
if (stack?.started && process.env.WRIT_KEEP_STACK !== "1") {
  await stack.stop().catch((err) => console.error(`npm test: stopping the shared secure stack failed: ${err instanceof Error ? err.message : String(err)}`));
}
process.exit(tscCode !== 0 ? 1 : vitestCode);
