// Keeps docs/ true to the code where that is cheap to check: every metric the
// code registers is documented with its type and labels; every section a code
// comment cites ("docs/architecture.md §3.2") exists; every reply status and
// reason, dead-letter reason and header is in the wire contract; every variable
// writ reads is documented, with the owners' defaults; every relative link (and
// its anchor) and every § reference in the READMEs and docs/ resolves.
import { existsSync, readdirSync, readFileSync } from "node:fs";
import { dirname, join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { MCP_ENV } from "../../producers/mcp-env.ts";
import { MAX_TIMER_MS, ROUTER_ENV, RouterConfig } from "../../src/config.ts";
import { DEAD_LETTER_REASONS, ESCALATION_REASONS, REJECT_REASONS } from "../../src/errors.ts";
import { INTENT_OUTCOMES } from "../../src/metrics/outcome.ts";
import { RouterMetrics } from "../../src/metrics/router-metrics.ts";
import { KNOWN_WRIT_VARIABLES } from "../../src/known-variables.ts";
import { FORWARDED_HEADER } from "../../src/owner/admission.ts";
import { FORWARDED_NULL_HEADERS, HEAL_KEY } from "../../src/owner/records.ts";
import { CONTROL_HEADER } from "../../src/schemas/control.ts";
import { KIND_HEADER } from "../../src/schemas/resolution.ts";
import { SIGNATURE_HEADER } from "../../src/security/signing.ts";
import { SECURITY_VARIABLES } from "../../src/security/transport.ts";
import { TRACEPARENT_HEADER, TRACESTATE_HEADER } from "../../src/tracing/trace-context.ts";
import { anchors, prose, sections } from "../helpers/markdown.ts";

const root = resolve(import.meta.dirname, "..", "..");
const docsDir = join(root, "docs");
const read = (path: string) => readFileSync(path, "utf8");
const docs = readdirSync(docsDir)
  .filter((f) => f.endsWith(".md"))
  .map((f) => join(docsDir, f));

/** `.ts` files under `dir`, recursively. */
function sources(dir: string): string[] {
  if (!existsSync(dir)) return [];
  return readdirSync(dir, { withFileTypes: true }).flatMap((e) => {
    const path = join(dir, e.name);
    if (e.isDirectory()) return e.name === "node_modules" ? [] : sources(path);
    return e.name.endsWith(".ts") ? [path] : [];
  });
}
const codeFiles = ["src", "producers", "consumers"].flatMap((d) => sources(join(root, d)));

describe("docs/operations.md documents every metric", () => {
  const operations = read(join(docsDir, "operations.md"));
  const registered = new RouterMetrics().registry.getMetricsAsArray() as unknown as { name: string; type: unknown; labelNames?: string[] }[];
  // Metrics registered anywhere else in the code (by name: prom-client's `name: "writ_…"`).
  const elsewhere = codeFiles
    .filter((f) => read(f).includes("prom-client"))
    .flatMap((f) => [...read(f).matchAll(/\bname:\s*["'](writ_[a-z0-9_]+)["']/g)].map((m) => m[1]!));

  it("finds the metrics", () => {
    expect(registered.length).toBeGreaterThan(5);
  });
  for (const name of new Set([...registered.map((m) => m.name), ...elsewhere])) {
    it(`${name}: a row of the metrics table, with its type and labels`, () => {
      const row = operations.split("\n").find((line) => line.startsWith(`| \`${name}\` |`));
      expect(row, `no table row for ${name} in docs/operations.md §2`).toBeDefined();
      const metric = registered.find((m) => m.name === name);
      if (!metric) return;
      expect(row).toContain(`| ${String(metric.type)} |`);
      // the labels column names exactly the metric's labels
      const labels = [...row!.split("|")[3]!.matchAll(/`([a-z_]+)`/g)].map((m) => m[1]);
      expect(labels.sort(), `labels of ${name}`).toEqual([...(metric.labelNames ?? [])].sort());
    });
  }
  it("names no metric the code does not register, here or in README.md's table", () => {
    const known = new Set([...registered.map((m) => m.name), ...elsewhere]);
    const rows = [operations, read(join(root, "README.md"))].flatMap((doc) => [...doc.matchAll(/^\| `(writ_[a-z0-9_]+)` \|/gm)].map((m) => m[1]!));
    expect(rows.length).toBeGreaterThan(2 * 20);
    expect(rows.filter((name) => !known.has(name))).toEqual([]);
  });
});

describe("README's metrics table has every metric and every outcome", () => {
  const readme = read(join(root, "README.md"));
  const operations = read(join(docsDir, "operations.md"));
  const registered = new RouterMetrics().registry.getMetricsAsArray() as unknown as { name: string; type: unknown; labelNames?: string[] }[];
  for (const metric of registered) {
    it(`${metric.name}: a row with its type and labels`, () => {
      const row = readme.split("\n").find((line) => line.startsWith(`| \`${metric.name}\` |`));
      expect(row, `no table row for ${metric.name} in README.md's Metrics`).toBeDefined();
      expect(row).toContain(`| ${String(metric.type)}: `);
      for (const label of metric.labelNames ?? []) expect(row, `label ${label} of ${metric.name}`).toContain(`\`${label}\``);
    });
  }
  it("writ_intents_total's rows, here and in docs/operations.md, name every outcome", () => {
    for (const doc of [readme, operations]) {
      const row = doc.split("\n").find((line) => line.startsWith("| `writ_intents_total` |"))!;
      expect(INTENT_OUTCOMES.filter((o) => !row.includes(`\`${o}\``))).toEqual([]);
    }
  });
});

describe("README's settings table states every owner variable's bounds", () => {
  const readme = read(join(root, "README.md"));
  const configuration = readme.slice(readme.indexOf("\n## Configuration\n"), readme.indexOf("\n## ", readme.indexOf("\n## Configuration\n") + 1));
  const rows = configuration.split("\n").filter((line) => line.startsWith("| `"));
  const shape = RouterConfig.shape as Record<string, z.ZodType>;
  /** The number schema under defaults and optionals. */
  const numberSchema = (schema: z.ZodType | undefined): z.ZodNumber | null => {
    let s: unknown = schema;
    while (s instanceof z.ZodDefault || s instanceof z.ZodOptional) s = s.unwrap();
    return s instanceof z.ZodNumber ? s : null;
  };
  const numeric = Object.entries(ROUTER_ENV).flatMap(([field, variable]) => {
    const schema = numberSchema(shape[field]);
    return schema ? [{ variable, min: schema.minValue!, max: schema.maxValue! }] : [];
  });

  it("finds the numeric variables", () => {
    expect(numeric.length).toBeGreaterThan(20);
  });
  for (const { variable, min, max } of numeric) {
    // A duration's ceiling (Node's longest timer) is said once above the table; an unbounded count needs no "to".
    const bounded = max !== MAX_TIMER_MS && max !== Number.MAX_SAFE_INTEGER;
    if (!bounded && min <= 1) continue;
    it(`${variable}: ${bounded ? `${min} to ${max}` : `at least ${min}`}`, () => {
      const row = rows.find((line) => line.split(" | ")[0]!.includes(`\`${variable}\``));
      expect(row, `no row for ${variable}`).toBeDefined();
      const said = bounded ? new RegExp(`\\b${min}(?: \\([^)]*\\))? to ${max}\\b`) : new RegExp(`at least ${min}\\b`);
      expect(row).toMatch(said);
    });
  }
});

describe("README documents every variable writ reads, and names none it does not", () => {
  const readme = read(join(root, "README.md"));
  /** Table rows of README.md by the variables their first cell names. */
  const rowsOf = (variable: string) => readme.split("\n").filter((line) => line.startsWith("| ") && line.split(" | ")[0]!.includes(`\`${variable}\``));
  const tabled = [...new Set([...Object.values(ROUTER_ENV), ...Object.values(MCP_ENV), ...SECURITY_VARIABLES])];

  it("finds the variables", () => {
    expect(tabled.length).toBeGreaterThan(50);
  });
  it("every setting of the owners, the MCP server and their SASL/TLS has a row in a README table", () => {
    expect(tabled.filter((v) => rowsOf(v).length === 0)).toEqual([]);
  });

  it("every other WRIT_ variable writ reads is named in README.md, docs/*.md or python/README.md", () => {
    const documented = [readme, read(join(root, "python", "README.md")), ...docs.map(read)].join("\n");
    expect([...KNOWN_WRIT_VARIABLES].filter((v) => !new RegExp(`\\b${v}\\b`).test(documented))).toEqual([]);
  });

  it("every WRIT_ variable the docs name is one writ, its tests or its bench read", () => {
    const named = new Set([readme, read(join(root, "python", "README.md")), ...docs.map(read)].flatMap((text) => [...text.matchAll(/\bWRIT_[A-Z0-9]+(?:_[A-Z0-9]+)*\b/g)].map((m) => m[0])));
    // harness variables (the fault suite's crash point, the console test's screenshot) are read under test/ and bench/
    const harness = ["test", "bench"].flatMap((d) => sources(join(root, d))).map(read).join("\n");
    expect([...named].filter((v) => !KNOWN_WRIT_VARIABLES.has(v) && !new RegExp(`\\b${v}\\b`).test(harness))).toEqual([]);
  });

  // The default column, where it gives values only (`5000`, or `5000`, `10000` for a row of two variables).
  const defaults = RouterConfig.parse({ brokers: "127.0.0.1:9092" }) as Record<string, unknown>;
  const again = RouterConfig.parse({ brokers: "127.0.0.1:9092" }) as Record<string, unknown>;
  const valueOf = (config: Record<string, unknown>, field: string): unknown => field.split(".").reduce<unknown>((o, k) => (o as Record<string, unknown> | undefined)?.[k], config);
  for (const [field, variable] of Object.entries(ROUTER_ENV)) {
    const code = valueOf(defaults, field);
    // no default, or one made afresh each time (the instance id's random part)
    if (code === undefined || JSON.stringify(code) !== JSON.stringify(valueOf(again, field))) continue;
    it(`${variable}: the README's default is the code's, ${JSON.stringify(code)}`, () => {
      const row = rowsOf(variable)[0];
      expect(row, `no row for ${variable}`).toBeDefined();
      const [names = "", given = ""] = row!.split(" | ");
      if (!/^(`[^`]*`)(, `[^`]*`)*$/.test(given.trim())) return;
      const variables = [...names.matchAll(/`([A-Z0-9_]+)`/g)].map((m) => m[1]);
      const values = [...given.matchAll(/`([^`]*)`/g)].map((m) => m[1]);
      const said = values.length === variables.length ? values[variables.indexOf(variable)] : values.join(", ");
      expect(said).toBe(Array.isArray(code) ? code.join(",") : String(code));
    });
  }
});

describe("code comments cite sections that exist", () => {
  const cited: { file: string; line: number; doc: string; section: string | null }[] = [];
  for (const file of codeFiles) {
    read(file)
      .split("\n")
      .forEach((text, i) => {
        for (const m of text.matchAll(/docs\/([a-z0-9-]+\.md)/g)) {
          const sectionRefs = [...text.matchAll(/§(\d+(?:\.\d+)*)/g)].map((s) => s[1]!);
          if (sectionRefs.length === 0) cited.push({ file: relative(root, file), line: i + 1, doc: m[1]!, section: null });
          for (const section of sectionRefs) cited.push({ file: relative(root, file), line: i + 1, doc: m[1]!, section });
        }
      });
  }

  it("finds the citations of docs/architecture.md", () => {
    expect(cited.filter((c) => c.doc === "architecture.md" && c.section !== null).length).toBeGreaterThan(4);
  });
  for (const c of cited) {
    it(`${c.file}:${c.line} → docs/${c.doc}${c.section ? ` §${c.section}` : ""}`, () => {
      const path = join(docsDir, c.doc);
      expect(existsSync(path), `docs/${c.doc} does not exist`).toBe(true);
      if (c.section !== null) expect([...sections(read(path))], `no heading numbered ${c.section} in docs/${c.doc}`).toContain(c.section);
    });
  }
});

describe("docs/wire-contract.md names every status, reason and header", () => {
  const contract = read(join(docsDir, "wire-contract.md"));
  const reply = JSON.parse(read(join(root, "schemas", "Reply.json"))) as { oneOf: { properties: Record<string, { const?: string; enum?: string[] }> }[] };
  const fromSchema = reply.oneOf.flatMap((branch) => [branch.properties.status?.const, ...(branch.properties.reason?.enum ?? [])]).filter((v): v is string => v !== undefined);

  it("reads the statuses from schemas/Reply.json", () => {
    expect(fromSchema).toEqual(expect.arrayContaining(["applied", "conflict", "rejected", "escalated"]));
  });
  const values = new Set([...fromSchema, ...REJECT_REASONS, ...ESCALATION_REASONS, ...DEAD_LETTER_REASONS]);
  for (const value of values) {
    it(`\`${value}\``, () => {
      expect(contract.includes(`\`${value}\``), `\`${value}\` is not in docs/wire-contract.md`).toBe(true);
    });
  }
  const headers = [SIGNATURE_HEADER, KIND_HEADER, CONTROL_HEADER, FORWARDED_HEADER, FORWARDED_NULL_HEADERS, TRACEPARENT_HEADER, TRACESTATE_HEADER, HEAL_KEY];
  for (const header of headers) {
    it(`header or key \`${header}\``, () => {
      expect(contract.includes(`\`${header}\``), `\`${header}\` is not in docs/wire-contract.md`).toBe(true);
    });
  }
});

describe("README's TypeScript snippets import as a package user does", () => {
  const readme = read(join(root, "README.md"));
  const exportsMap = (JSON.parse(read(join(root, "package.json"))) as { exports: Record<string, { default: string }> }).exports;
  const snippets = [...readme.matchAll(/```ts\n([\s\S]*?)```/g)].map((m) => m[1]!);
  const imports = snippets.flatMap((code) =>
    [...code.matchAll(/import\s*\{([^}]*)\}\s*from\s*"([^"]+)"/g)].map((m) => ({
      from: m[2]!,
      names: m[1]!
        .split(",")
        .map((n) => n.trim().split(/\s+as\s+/)[0]!)
        .filter((n) => n !== ""),
    })),
  );

  it("finds the snippets' imports of writ", () => {
    expect(imports.filter((i) => i.from === "writ" || i.from.startsWith("writ/")).length).toBeGreaterThanOrEqual(4);
  });

  it("none imports from the repository's files (./src, ./producers): a package user has none", () => {
    expect(imports.filter((i) => i.from.startsWith(".")).map((i) => i.from)).toEqual([]);
  });

  for (const { from, names } of imports.filter((i) => i.from === "writ" || i.from.startsWith("writ/"))) {
    it(`${from} exports ${names.join(", ")}`, async () => {
      // the package's export of that subpath, as its source: "./dist/producers/adapters/ai-sdk.js" → producers/adapters/ai-sdk.ts
      const target = exportsMap[from === "writ" ? "." : `./${from.slice("writ/".length)}`]?.default;
      expect(target, `package.json exports no ${from}`).toBeDefined();
      const source = join(root, target!.replace(/^\.\/dist\//, "").replace(/\.js$/, ".ts"));
      const module = (await import(source)) as Record<string, unknown>;
      // `type X` names no value: the module's source exports it as a type (export type/interface X, or a re-export's `type X`)
      const types = names.filter((n) => n.startsWith("type ")).map((n) => n.slice("type ".length).trim());
      const exportedType = (n: string) => new RegExp(`export\\s+(?:declare\\s+)?(?:type|interface)\\s+${n}\\b|\\btype\\s+${n}\\b[^;]*\\}\\s*from`).test(read(source));
      expect(names.filter((n) => !n.startsWith("type ") && !(n in module))).toEqual([]);
      expect(types.filter((n) => !exportedType(n))).toEqual([]);
    });
  }
});

describe("README.md's, python/README.md's and docs/*.md's links and § references resolve", () => {
  for (const doc of [join(root, "README.md"), join(root, "python", "README.md"), ...docs]) {
    const name = relative(root, doc);
    const text = prose(read(doc));
    const links = [...text.matchAll(/\]\(([^)\s]+)(?:\s+"[^"]*")?\)/g)].map((m) => m[1]!).filter((t) => !/^[a-z][a-z0-9+.-]*:/i.test(t));
    for (const target of new Set(links)) {
      it(`${name}: ${target}`, () => {
        const [path = "", anchor] = target.split("#");
        const file = path === "" ? doc : resolve(dirname(doc), decodeURIComponent(path));
        expect(existsSync(file), `${target} does not exist`).toBe(true);
        if (anchor !== undefined && file.endsWith(".md")) expect([...anchors(read(file))], `no heading #${anchor} in ${relative(root, file)}`).toContain(anchor);
      });
    }
    // python/README.md says "wire contract §5.7" (it is also the distribution's page, where links to docs/ break).
    if (doc.endsWith(join("python", "README.md"))) continue;
    // "§3.2" is a section of this file (README.md has none: it names the file); "architecture.md §3.2" (also
    // "[docs/benchmarks.md](docs/benchmarks.md) §4.1") one of that file, as is "[wire contract §3](wire-contract.md#3-values)"
    // of the file linked to; "RFC 9110 §13.1.2" is not ours.
    const mdLink = /\[([^\]]*)\]\(([^)#\s]*\.md)(?:#[^)\s]*)?\)/g;
    const linked = [...text.matchAll(mdLink)].flatMap((m) =>
      [...m[1]!.matchAll(/§(\d+(?:\.\d+)*)/g)].map((r) => ({ doc: resolve(dirname(doc), decodeURIComponent(m[2]!)), section: r[1]! })),
    );
    const rest = text.replace(mdLink, (_, linkText: string) => (linkText.includes("§") ? "" : linkText));
    const refs = [
      ...linked,
      ...[...rest.matchAll(/(?:(RFC\s+\d+|[a-z0-9-]+\.md)\s+)?§(\d+(?:\.\d+)*)/g)]
        .filter((m) => !m[1]?.startsWith("RFC"))
        .map((m) => ({ doc: m[1] === undefined ? doc : join(docsDir, m[1]), section: m[2]! })),
    ];
    if (refs.length === 0) continue;
    it(`${name}: every § reference names an existing section`, () => {
      const missing = refs.filter((r) => !existsSync(r.doc) || !sections(read(r.doc)).has(r.section));
      expect(missing.map((r) => `${relative(root, r.doc)} §${r.section}`)).toEqual([]);
    });
  }
});
