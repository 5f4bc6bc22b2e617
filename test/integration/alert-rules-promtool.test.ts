// deploy/prometheus/writ-alerts.yml run by Prometheus itself: promtool (the version of the monitoring profile's
// Prometheus image, built once by scripts/promtool.ts) checks the rule file and the profile's prometheus.yml,
// and runs the rules' unit tests,
// deploy/prometheus/writ-alerts.test.yml: each alert fires on series shaped as the owners export them, with its
// labels and annotations, and a healthy fleet fires none. test/unit/alert-rules.test.ts checks the same
// expressions against the owners' registry; this checks what Prometheus makes of them over time.
import { spawnSync } from "node:child_process";
import { copyFileSync, mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { ensurePromtool } from "../../scripts/promtool.ts";

const root = resolve(import.meta.dirname, "..", "..");
const DEPLOY = join(root, "deploy", "prometheus");

let promtool: string;
const scratch = mkdtempSync(join(tmpdir(), "writ-promtool-"));

function run(...args: string[]): { status: number | null; out: string } {
  const r = spawnSync(promtool, args, { encoding: "utf8", cwd: scratch, timeout: 120_000 });
  return { status: r.status, out: `${r.stdout}${r.stderr}` };
}

/** The rule file and its tests in `scratch`, the rules edited by `edit`. */
function rulesEdited(edit: (rules: string) => string): string {
  const rules = readFileSync(join(DEPLOY, "writ-alerts.yml"), "utf8");
  const edited = edit(rules);
  expect(edited).not.toBe(rules);
  writeFileSync(join(scratch, "writ-alerts.yml"), edited);
  copyFileSync(join(DEPLOY, "writ-alerts.test.yml"), join(scratch, "writ-alerts.test.yml"));
  return join(scratch, "writ-alerts.test.yml");
}

describe("the alert rules, run by promtool", () => {
  // `npm test` builds it in the background from its start (scripts/test.mjs): this waits for that build.
  beforeAll(async () => {
    promtool = await ensurePromtool();
  }, 1_500_000);
  afterAll(() => rmSync(scratch, { recursive: true, force: true }));

  it("promtool checks the rule file (16 rules) and the monitoring profile's Prometheus configuration that loads it", () => {
    let r = run("check", "rules", join(DEPLOY, "writ-alerts.yml"));
    expect(r.out).toContain("SUCCESS: 16 rules found");
    expect(r.status).toBe(0);
    r = run("check", "config", join(DEPLOY, "prometheus.yml"));
    expect(r.out).toContain("is valid prometheus config file syntax");
    expect(r.out).toContain("SUCCESS: 16 rules found");
    expect(r.status).toBe(0);
  });

  it("every alert fires on its failure, with its labels and annotations, and a healthy fleet fires none", () => {
    const r = run("test", "rules", join(DEPLOY, "writ-alerts.test.yml"));
    expect(r.out).toContain("SUCCESS");
    expect(r.status).toBe(0);
    // every alert of the file is tested, firing, somewhere
    const rules = readFileSync(join(DEPLOY, "writ-alerts.yml"), "utf8");
    const tests = readFileSync(join(DEPLOY, "writ-alerts.test.yml"), "utf8");
    const alerts = [...rules.matchAll(/^\s+- alert: (\w+)$/gm)].map((m) => m[1]!);
    expect(alerts).toHaveLength(16);
    const firing = new Set([...tests.matchAll(/alertname: (\w+)\n\s+exp_alerts:\n\s+- exp_labels/g)].map((m) => m[1]!));
    expect(alerts.filter((a) => !firing.has(a))).toEqual([]);
  });

  it("the unit tests fail when an alert is broken: no owner at all counted as none missing, a label dropped, a threshold moved, one firing on a healthy fleet", () => {
    // Without `or vector(0)`, no owner running at all is no result, and the alert for unowned partitions stays silent.
    let r = run("test", "rules", rulesEdited((s) => s.replace("(count(count by (partition) (writ_ledger_entries)) or vector(0)) < 12", "count(count by (partition) (writ_ledger_entries)) < 12")));
    expect(r.status).toBe(1);
    expect(r.out).toContain("WritPartitionUnowned");
    r = run("test", "rules", rulesEdited((s) => s.replace("max by (partition) (writ_consumer_lag_records) > 1000", "max(writ_consumer_lag_records) > 1000")));
    expect(r.status).toBe(1);
    expect(r.out).toContain("WritConsumerLag");
    r = run("test", "rules", rulesEdited((s) => s.replace("(writ_ledger_oldest_pending_age_seconds) > 120", "(writ_ledger_oldest_pending_age_seconds) > 1200")));
    expect(r.status).toBe(1);
    expect(r.out).toContain("WritPendingNotSettling");
    // and an alert that fires on a healthy fleet
    r = run("test", "rules", rulesEdited((s) => s.replace("sum by (reason) (increase(writ_dead_letters_total[10m])) > 0", "sum by (reason) (increase(writ_dead_letters_total[10m])) >= 0")));
    expect(r.status).toBe(1);
    expect(r.out).toContain("WritDeadLetters");
  });
});
