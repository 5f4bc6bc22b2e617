// `npm test`: the type check (tsc --noEmit) and vitest, side by side. The type check is about 18 s of one core;
// run first, as before, it held back the whole run, while vitest's first minute (the broker starting, then the
// unit files, mostly waiting on timers and sockets) leaves a core idle. Either failing fails the run; a type
// error is reported as soon as tsc ends, and vitest still finishes (and stops the broker it started).
// Arguments go to `vitest run`, as they did with `tsc --noEmit && vitest run`.
import { spawn } from "node:child_process";
import { join } from "node:path";

const root = join(import.meta.dirname, "..");
const children = new Set();
// A signal to `npm test` (Ctrl-C, npm passing on a SIGTERM) goes to both: none is left running on its own.
for (const signal of ["SIGINT", "SIGTERM", "SIGHUP"]) {
  process.on(signal, () => {
    for (const child of children) child.kill(signal);
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
const tests = run([join(root, "node_modules", "vitest", "vitest.mjs"), "run", ...process.argv.slice(2)]);
const [tscCode, vitestCode] = await Promise.all([typecheck, tests]);
process.exit(tscCode !== 0 ? 1 : vitestCode);
