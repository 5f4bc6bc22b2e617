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

// The operator console's test drives a real, headless browser: Debian's Chromium (WRIT_CHROMIUM names another).
// On a fresh Debian machine where we may install packages (root, apt-get), install it; elsewhere say what is missing.
const chromium = process.env.WRIT_CHROMIUM || "/usr/bin/chromium";
if (!existsSync(chromium)) {
  const canApt = process.platform === "linux" && typeof process.getuid === "function" && process.getuid() === 0 && existsSync("/usr/bin/apt-get");
  if (canApt && !process.env.WRIT_CHROMIUM) {
    console.log("writ: Chromium missing (the console's browser test needs it); running apt-get install chromium");
    execSync("apt-get update && apt-get install -y --no-install-recommends chromium", { stdio: "inherit", env: { ...process.env, DEBIAN_FRONTEND: "noninteractive" } });
  } else {
    console.log(`writ: no browser at ${chromium}: install Chromium (Debian: apt-get install chromium) or set WRIT_CHROMIUM; the console's browser test will fail without it`);
  }
}
