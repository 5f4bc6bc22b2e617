// `npm test` on a fresh clone: install the locked dependencies first when they
// are missing. CommonJS and plain Node, because it runs before node_modules
// (and with it the project's own Node 24) exists.
const { existsSync } = require("node:fs");
const { join } = require("node:path");
const { execSync } = require("node:child_process");

const root = join(__dirname, "..");
const needed = ["vitest", "typescript", "kafkajs", "node/bin/node"];
if (!needed.every((p) => existsSync(join(root, "node_modules", p)))) {
  console.log("writ: dependencies missing; running npm install");
  execSync("npm install --no-audit --no-fund", {
    cwd: root,
    stdio: "inherit",
  });
}
