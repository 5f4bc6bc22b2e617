// deploy/prometheus/writ-alerts.yml against what the owners export. An alert rule that names a series nobody
// exports, a label it does not carry or a value it never takes is never true: it stays silent through the very
// outage it was written for. Each expression is parsed with Prometheus's own PromQL grammar (the Lezer grammar of
// Prometheus's UI, @prometheus-io/lezer-promql) and every metric, label and label value it names is checked
// against the owners' registry and the code's lists of values; `rate` and `increase` only of counters; and
// docs/operations.md §3 shows exactly the file's expressions.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { INTENT_OUTCOMES } from "../../src/metrics/outcome.ts";
import { anchors } from "../helpers/markdown.ts";
import { analyse, exported, problems } from "../helpers/promql.ts";

const root = resolve(import.meta.dirname, "..", "..");
const RULES_FILE = join(root, "deploy", "prometheus", "writ-alerts.yml");

const Rules = z
  .object({
    groups: z
      .array(
        z
          .object({
            name: z.string().min(1),
            rules: z
              .array(
                z
                  .object({
                    alert: z.string().regex(/^Writ[A-Za-z]+$/),
                    expr: z.string().min(1),
                    for: z
                      .string()
                      .regex(/^\d+[smh]$/)
                      .optional(),
                    labels: z.object({ severity: z.enum(["warning", "critical"]) }).strict(),
                    annotations: z.object({ summary: z.string().min(1), description: z.string().min(1).optional(), runbook: z.string().regex(/^docs\/[a-z-]+\.md#[a-z0-9-]+$/) }).strict(),
                  })
                  .strict(),
              )
              .min(1),
          })
          .strict(),
      )
      .min(1),
  })
  .strict();

/** The expressions of docs/operations.md §3's promql blocks: one per unindented line (indented lines go on), with its `# for:`. */
function documented(): { expr: string; for?: string }[] {
  const operations = readFileSync(join(root, "docs", "operations.md"), "utf8");
  const alerts = operations.slice(operations.indexOf("## 3. Alerts"), operations.indexOf("## 4. Sizing"));
  const out: { expr: string; for?: string }[] = [];
  for (const block of alerts.matchAll(/^```promql\n([\s\S]*?)^```$/gm)) {
    for (const line of block[1]!.split("\n")) {
      if (line.trim() === "") continue;
      const [code = "", comment] = line.split(/\s+#\s*/);
      if (/^\s/.test(line)) out[out.length - 1]!.expr += ` ${code.trim()}`;
      else out.push({ expr: code.trim(), ...(comment?.startsWith("for:") ? { for: comment.slice(4).trim() } : {}) });
    }
  }
  return out;
}

const normal = (expr: string) => expr.replace(/\s+/g, " ").trim();

describe("deploy/prometheus/writ-alerts.yml", () => {
  const rules = Rules.parse(parseYaml(readFileSync(RULES_FILE, "utf8"))).groups.flatMap((g) => g.rules);
  const series = exported();

  it("is a rule file Prometheus loads: groups of alerts with unique names, a severity, a summary and a runbook", () => {
    expect(rules.length).toBeGreaterThanOrEqual(10);
    expect(new Set(rules.map((r) => r.alert)).size).toBe(rules.length);
  });

  for (const rule of rules) {
    it(`${rule.alert}: parses, and watches series, labels and values the owners export`, () => {
      expect(problems(rule.expr, series)).toEqual([]);
      expect(analyse(rule.expr).uses.length).toBeGreaterThan(0);
    });
    it(`${rule.alert}: its runbook ${rule.annotations.runbook} exists`, () => {
      const [file = "", anchor = ""] = rule.annotations.runbook.split("#");
      expect([...anchors(readFileSync(join(root, file), "utf8"))]).toContain(anchor);
    });
  }

  it("docs/operations.md §3 shows exactly these expressions, each with the rule's `for`", () => {
    const docs = documented();
    expect(docs.map((d) => normal(d.expr)).sort()).toEqual(rules.map((r) => normal(r.expr)).sort());
    for (const d of docs) expect(rules.find((r) => normal(r.expr) === normal(d.expr))?.for, d.expr).toBe(d.for);
  });

  // The checker itself, on expressions that must fail: without these it could pass anything.
  it("finds what would keep a rule silent: a misspelt metric, a missing label, a value never taken, a gauge's rate, bad syntax", () => {
    expect(problems("max by (partition) (writ_ledger_oldest_pending_age_second) > 120", series)).toEqual([
      "writ_ledger_oldest_pending_age_second: no owner exports it",
      "by/on (partition): none of writ_ledger_oldest_pending_age_second carries it",
    ]);
    expect(problems('sum(rate(writ_intents_total{result="applied"}[5m]))', series)).toEqual(["writ_intents_total has no label result"]);
    expect(problems('sum(rate(writ_intents_total{outcome=~"rejected|deadlettered"}[5m]))', series)).toEqual([
      `writ_intents_total{outcome} is never "deadlettered" (it is one of ${INTENT_OUTCOMES.join(", ")})`,
    ]);
    expect(problems('sum(rate(writ_sor_request_duration_seconds_count{outcome="outcome_unknown"}[5m]))', series)[0]).toMatch(/is never "outcome_unknown"/);
    expect(problems("rate(writ_consumer_lag_records[5m])", series)).toEqual(["rate(writ_consumer_lag_records): writ_consumer_lag_records is a gauge, not a counter"]);
    expect(problems("sum by (tool) (writ_consumer_lag_records)", series)).toEqual(["by/on (tool): none of writ_consumer_lag_records carries it"]);
    expect(problems("max by (partition (writ_consumer_lag_records) >", series).some((p) => p.startsWith("PromQL syntax error"))).toBe(true);
  });
});
