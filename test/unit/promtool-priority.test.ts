// The background build of promtool (scripts/promtool.ts --build-in-background, started detached by npm test) runs at
// the lowest priority: nice 19, and, where it leads a session of its own under the kernel's scheduler autogroups,
// its autogroup nice 19 too (nice alone ranks a process only within its autogroup: a detached nice-19 build got as
// much CPU as the tests' two busy processes together). Never the autogroup of a session it does not lead.
import { spawn } from "node:child_process";
import { existsSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";

const PROMTOOL = join(resolve(import.meta.dirname, "..", ".."), "scripts", "promtool.ts");
const HAS_AUTOGROUPS = existsSync("/proc/self/autogroup");

async function priorityOf(detached: boolean): Promise<{ nice: number; autogroup: string }> {
  const script = `
    const { getPriority } = await import("node:os");
    const { readFileSync, existsSync } = await import("node:fs");
    const { lowestPriority } = await import(${JSON.stringify(PROMTOOL)});
    lowestPriority();
    const autogroup = existsSync("/proc/self/autogroup") ? readFileSync("/proc/self/autogroup", "utf8").trim() : "";
    process.stdout.write(JSON.stringify({ nice: getPriority(), autogroup }));
  `;
  const child = spawn(process.execPath, ["--input-type=module", "-e", script], { detached, stdio: ["ignore", "pipe", "inherit"] });
  let out = "";
  child.stdout.on("data", (c: Buffer) => (out += c.toString()));
  await new Promise((done) => child.on("close", done));
  return JSON.parse(out) as { nice: number; autogroup: string };
}

describe("the background promtool build's priority", () => {
  it("detached (a session of its own): nice 19, and its autogroup nice 19 where the kernel has autogroups", async () => {
    const p = await priorityOf(true);
    expect(p.nice).toBe(19);
    if (HAS_AUTOGROUPS) expect(p.autogroup).toMatch(/ nice 19$/);
  });

  it("in its caller's session: nice 19, the caller's autogroup left as it was", async () => {
    const before = HAS_AUTOGROUPS ? readFileSync("/proc/self/autogroup", "utf8").trim() : "";
    const p = await priorityOf(false);
    expect(p.nice).toBe(19);
    expect(p.autogroup).toBe(before);
  });
});
