// deploy/grafana/dashboards/writ-owners.json: a Grafana dashboard of Grafana's own model (typed by
// @grafana/schema, Grafana's published schema types), whose every query names series, labels and values the
// owners export (the PromQL checker of the alert rules' test, Grafana's interval variables put in), that shows
// every metric the owners register, and whose panels neither overlap nor leave the 24-column grid.
import type { Dashboard } from "@grafana/schema";
import { describe, expect, it } from "vitest";
import dashboardJson from "../../deploy/grafana/dashboards/writ-owners.json" with { type: "json" };
import { exported, problems } from "../helpers/promql.ts";

interface Target {
  refId: string;
  expr: string;
  datasource?: { type?: string; uid?: string };
}
interface PanelJson {
  id: number;
  type: string;
  title: string;
  gridPos: { h: number; w: number; x: number; y: number };
  datasource?: { type?: string; uid?: string };
  targets?: Target[];
}

/**
 * Grafana's model with its string and number literal types widened, as a JSON import's are: the compiler checks
 * the file's shape against it (no cast), so a required field missing or a field of the wrong type fails
 * `tsc --noEmit`; the literal values that matter are checked below.
 */
type Loose<T> = T extends string ? string : T extends number ? number : T extends boolean ? boolean : T extends readonly (infer U)[] ? Loose<U>[] : T extends object ? { [K in keyof T]: Loose<T[K]> } : T;
const dashboard: Loose<Dashboard> = dashboardJson;
const panels = (dashboard.panels ?? []) as unknown as PanelJson[];
const queries = panels.filter((p) => p.type !== "row");

/** A Grafana query as Prometheus gets it: Grafana's interval variables put in. */
function asPromql(expr: string): string {
  return expr.replace(/\$__rate_interval|\$__interval|\$__range/g, "5m");
}

describe("deploy/grafana/dashboards/writ-owners.json", () => {
  const series = exported();

  it("is a dashboard of Grafana's model with a uid, a schema version and a Prometheus data source variable", () => {
    expect(dashboard.uid).toBe("writ-owners");
    expect(dashboard.schemaVersion).toBeGreaterThanOrEqual(39);
    const variable = dashboard.templating?.list?.find((v) => v.name === "datasource");
    expect([variable?.type, variable?.query]).toEqual(["datasource", "prometheus"]);
    expect(queries.length).toBeGreaterThanOrEqual(12);
    // the types the model leaves open strings: Grafana's built-in panels only (no plugin to install)
    for (const p of panels) expect(["row", "timeseries", "stat"], p.title).toContain(p.type);
  });

  for (const panel of queries) {
    it(`${panel.title}: every query parses and names series, labels and values the owners export, from the data source variable`, () => {
      expect(panel.targets?.length ?? 0).toBeGreaterThan(0);
      for (const t of panel.targets ?? []) {
        expect(problems(asPromql(t.expr), series), `${t.refId}: ${t.expr}`).toEqual([]);
        expect([t.datasource?.type, t.datasource?.uid], t.refId).toEqual(["prometheus", "${datasource}"]);
      }
      expect(new Set(panel.targets!.map((t) => t.refId)).size).toBe(panel.targets!.length);
    });
  }

  it("shows every metric the owners register", () => {
    const shown = queries.flatMap((p) => (p.targets ?? []).map((t) => t.expr)).join("\n");
    const registered = [...new Set([...series.keys()].filter((n) => n.startsWith("writ_")).map((n) => n.replace(/_(bucket|count|sum)$/, "")))];
    // a histogram is shown by any of its series
    expect(registered.filter((m) => !new RegExp(`\\b${m}(_bucket|_count|_sum)?\\b`).test(shown))).toEqual([]);
  });

  it("lays its panels on the 24-column grid without overlaps, with unique ids", () => {
    expect(new Set(panels.map((p) => p.id)).size).toBe(panels.length);
    for (const p of panels) expect(p.gridPos.x + p.gridPos.w, p.title).toBeLessThanOrEqual(24);
    const cells = new Map<string, string>();
    for (const p of panels) {
      for (let x = p.gridPos.x; x < p.gridPos.x + p.gridPos.w; x++) {
        for (let y = p.gridPos.y; y < p.gridPos.y + p.gridPos.h; y++) {
          const k = `${x},${y}`;
          expect(cells.get(k), `${p.title} overlaps ${cells.get(k)} at ${k}`).toBeUndefined();
          cells.set(k, p.title);
        }
      }
    }
  });
});
