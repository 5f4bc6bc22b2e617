// `npm run build`: dist/ from scratch. tsc emits the JavaScript, .d.ts files and source maps; the operator
// console's page (HTML, CSS and plain JS, no build step of its own) is copied beside its server code.
import { execFileSync } from "node:child_process";
import { cpSync, rmSync } from "node:fs";
import { join } from "node:path";

const root = join(import.meta.dirname, "..");
rmSync(join(root, "dist"), { recursive: true, force: true });
execFileSync(process.execPath, [join(root, "node_modules", "typescript", "bin", "tsc"), "-p", join(root, "tsconfig.build.json")], { cwd: root, stdio: "inherit" });
cpSync(join(root, "src", "console", "assets"), join(root, "dist", "src", "console", "assets"), { recursive: true });
