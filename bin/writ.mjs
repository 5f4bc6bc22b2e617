#!/usr/bin/env node
// The `writ` command. Its code is TypeScript, which Node runs directly from
// 22.18 / 23.6 on (type stripping). An older node hands over to the project's
// Node 24 (the `node` devDependency) with the same arguments.
import { spawn } from "node:child_process";
import { existsSync } from "node:fs";
import { dirname, join } from "node:path";
import { fileURLToPath, pathToFileURL } from "node:url";

const root = join(dirname(fileURLToPath(import.meta.url)), "..");
// each command's .ts entry; no command (or only options) is `verify`, as before `doctor` existed
const COMMANDS = {
  verify: join(root, "src", "verify", "cli.ts"),
  doctor: join(root, "src", "doctor", "cli.ts"),
};
const [command] = process.argv.slice(2);

if (command !== undefined && !command.startsWith("-") && !Object.hasOwn(COMMANDS, command)) {
  process.stderr.write(`writ: unknown command ${command}; try: writ verify --help, writ doctor --help\n`);
  process.exit(2);
}
const cli = command === "doctor" ? COMMANDS.doctor : COMMANDS.verify;

if (process.features?.typescript) {
  await import(pathToFileURL(cli).href);
} else {
  const node = join(root, "node_modules", "node", "bin", "node");
  if (!existsSync(node)) {
    process.stderr.write(
      `writ: Node ${process.versions.node} cannot run TypeScript; use Node >= 22.18 (or 23.6), or install writ's dev dependencies (npm install) for its Node 24\n`,
    );
    process.exit(2);
  }
  const child = spawn(node, [cli, ...process.argv.slice(2)], { stdio: "inherit" });
  for (const signal of ["SIGINT", "SIGTERM"]) process.on(signal, () => child.kill(signal));
  child.on("exit", (code, signal) => process.exit(code ?? (signal ? 128 : 1)));
}
