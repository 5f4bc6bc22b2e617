// PromQL against what writ's owners export: each expression parsed with Prometheus's own grammar (the Lezer
// grammar of Prometheus's UI, @prometheus-io/lezer-promql) and every metric, label and label value it names
// checked against the owners' registry and the code's lists of values. Used by the alert rules' and the
// dashboard's tests: a query naming a series nobody exports is silent, never wrong-looking.
import type { SyntaxNode } from "@lezer/common";
import { parser } from "@prometheus-io/lezer-promql";
import { DEAD_LETTER_REASONS, ESCALATION_REASONS } from "../../src/errors.ts";
import { SOR_CALL_OUTCOMES } from "../../src/metrics/observed-system.ts";
import { INTENT_OUTCOMES } from "../../src/metrics/outcome.ts";
import { RouterMetrics } from "../../src/metrics/router-metrics.ts";
import { SIZE_OUTCOMES, SIZE_TOPIC_KINDS } from "../../src/owner/records.ts";

export interface Series {
  type: "counter" | "gauge" | "histogram part" | "external";
  labels: ReadonlySet<string>;
  /** Label → the values it takes, where the code lists them. */
  values: ReadonlyMap<string, ReadonlySet<string>>;
}

/** Every series an owner exports, by name: the registry's metrics and a histogram's `_bucket`, `_count` and `_sum`. */
export function exported(): Map<string, Series> {
  const out = new Map<string, Series>();
  const known: Record<string, Record<string, readonly string[]>> = {
    writ_intents_total: { outcome: INTENT_OUTCOMES },
    writ_escalations_total: { reason: ESCALATION_REASONS },
    writ_dead_letters_total: { reason: DEAD_LETTER_REASONS },
    writ_records_refused_size_total: { topic_kind: SIZE_TOPIC_KINDS, outcome: SIZE_OUTCOMES },
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
export interface Use {
  metric: string;
  /** label → the values matched (a regex's alternatives, when it is a plain `a|b`; null when it is not) */
  matchers: { label: string; op: string; value: string }[];
  /** the function the selector is the argument of (`rate`, `increase`, …), if any */
  fn: string | null;
}

/** The PromQL syntax errors of `expr` (Lezer's error nodes), and what it names. */
export function analyse(expr: string): { errors: number[]; uses: Use[]; grouping: string[] } {
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
export function problems(expr: string, series: ReadonlyMap<string, Series>): string[] {
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
