// deploy/prometheus/writ-alerts.yml against what the owners export. An alert rule that names a series nobody
// exports, a label it does not carry or a value it never takes is never true: it stays silent through the very
// outage it was written for. Each expression is parsed with Prometheus's own PromQL grammar (the Lezer grammar of
// Prometheus's UI, @prometheus-io/lezer-promql) and every metric, label and label value it names is checked
// against the owners' registry and the code's lists of values; `rate` and `increase` only of counters; and
// docs/operations.md §3 shows exactly the file's expressions.
import { readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { parser } from "@prometheus-io/lezer-promql";
import type { SyntaxNode } from "@lezer/common";
import { describe, expect, it } from "vitest";
import { parse as parseYaml } from "yaml";
import { z } from "zod";
import { DEAD_LETTER_REASONS, ESCALATION_REASONS } from "../../src/errors.ts";
import { SOR_CALL_OUTCOMES } from "../../src/metrics/observed-system.ts";
import { INTENT_OUTCOMES } from "../../src/metrics/outcome.ts";
import { RouterMetrics } from "../../src/metrics/router-metrics.ts";
import { anchors } from "../helpers/markdown.ts";

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

interface Series {
  type: "counter" | "gauge" | "histogram part" | "external";
  labels: ReadonlySet<string>;
  /** Label → the values it takes, where the code lists them. */
  values: ReadonlyMap<string, ReadonlySet<string>>;
}

/** Every series an owner exports, by name: the registry's metrics and a histogram's `_bucket`, `_count` and `_sum`. */
function exported(): Map<string, Series> {
  const out = new Map<string, Series>();
  const known: Record<string, Record<string, readonly string[]>> = {
    writ_intents_total: { outcome: INTENT_OUTCOMES },
    writ_escalations_total: { reason: ESCALATION_REASONS },
    writ_dead_letters_total: { reason: DEAD_LETTER_REASONS },
    writ_sor_request_duration_seconds: { method: Object.keys(SOR_CALL_OUTCOMES), outcome: [...new Set(Object.values(SOR_CALL_OUTCOMES).flat())] },
  };
  const metrics = new RouterMetrics().registry.getMetricsAsArray() as unknown as { name: string; type: unknown; labelNames?: string[] }[];
  for (const m of metrics) {
    const labels = new Set(m.labelNames ?? []);
    const values = new Map(Object.entries(known[m.name] ?? {}).map(([label, v]) => [label, new Set(v)]));
    const type = String(m.type);
    if (type === "histogram") {
      out.set(`${m.name}_bucket`, { type: "histogram part", labels: new Set([...labels, "le"]), values });
      out.set(`${m.name}_count`, { type: "histogram part", labels, values });
      out.set(`${m.name}_sum`, { type: "histogram part", labels, values });
    } else if (type === "counter" || type === "gauge") out.set(m.name, { type, labels, values });
  }
  // the blackbox exporter's probe of /healthz (docs/operations.md §3): the one series writ does not export
  out.set("probe_success", { type: "external", labels: new Set(["job", "instance"]), values: new Map() });
  return out;
}

/** The series a rule's expression names, and what it asks of them. */
interface Use {
  metric: string;
  /** label → the values matched (a regex's alternatives, when it is a plain `a|b`; null when it is not) */
  matchers: { label: string; op: string; value: string }[];
  /** the function the selector is the argument of (`rate`, `increase`, …), if any */
  fn: string | null;
}

/** The PromQL syntax errors of `expr` (Lezer's error nodes), and what it names. */
function analyse(expr: string): { errors: number[]; uses: Use[]; grouping: string[] } {
  const tree = parser.parse(expr);
  const errors: number[] = [];
  const uses: Use[] = [];
  const grouping: string[] = [];
  const text = (n: SyntaxNode) => expr.slice(n.from, n.to);
  tree.iterate({
    enter: (ref) => {
      if (ref.type.isError) errors.push(ref.from);
      const node = ref.node;
      if (ref.name === "GroupingLabels") for (const l of node.getChildren("LabelName")) grouping.push(text(l));
      if (ref.name !== "VectorSelector") return;
      const id = node.getChild("Identifier");
      const matchers: Use["matchers"] = [];
      for (const m of node.getChild("LabelMatchers")?.getChildren("UnquotedLabelMatcher") ?? []) {
        const value = m.getChild("StringLiteral");
        matchers.push({ label: text(m.getChild("LabelName")!), op: text(m.getChild("MatchOp")!), value: value ? (JSON.parse(text(value)) as string) : "" });
      }
      // the function whose argument this selector is (through a matrix selector, `metric[5m]`)
      let up: SyntaxNode | null = node.parent;
      if (up?.name === "MatrixSelector") up = up.parent;
      const call = up?.name === "FunctionCallBody" ? up.parent : null;
      const fn = call?.name === "FunctionCall" ? text(call.getChild("FunctionIdentifier")!) : null;
      uses.push({ metric: id ? text(id) : "", matchers, fn });
    },
  });
  return { errors, uses, grouping };
}

/** The problems of one expression against the exported series: empty when it watches series that exist. */
function problems(expr: string, series: ReadonlyMap<string, Series>): string[] {
  const { errors, uses, grouping } = analyse(expr);
  const out: string[] = errors.map((at) => `PromQL syntax error at ${at}: …${expr.slice(at, at + 30)}`);
  for (const use of uses) {
    const s = series.get(use.metric);
    if (s === undefined) {
      out.push(`${use.metric || "a selector without a metric name"}: no owner exports it`);
      continue;
    }
    for (const m of use.matchers) {
      if (!s.labels.has(m.label)) {
        out.push(`${use.metric} has no label ${m.label}`);
        continue;
      }
      const values = s.values.get(m.label);
      if (values === undefined) continue;
      // `=`, `!=`: the value; `=~`, `!~`: each alternative of a plain `a|b|c` (anything else is not checked)
      const wanted = m.op === "=" || m.op === "!=" ? [m.value] : /^[a-z0-9_|]+$/.test(m.value) ? m.value.split("|") : [];
      for (const v of wanted) if (!values.has(v)) out.push(`${use.metric}{${m.label}} is never "${v}" (it is one of ${[...values].join(", ")})`);
    }
    if ((use.fn === "rate" || use.fn === "increase" || use.fn === "irate") && s.type !== "counter" && !(s.type === "histogram part" && !use.metric.endsWith("_sum"))) {
      out.push(`${use.fn}(${use.metric}): ${use.metric} is a ${s.type}, not a counter`);
    }
  }
  const labels = new Set(uses.flatMap((u) => [...(series.get(u.metric)?.labels ?? [])]));
  for (const l of grouping) if (!labels.has(l)) out.push(`by/on (${l}): none of ${uses.map((u) => u.metric).join(", ")} carries it`);
  return out;
}

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
