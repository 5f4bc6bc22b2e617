// docker-compose.yml is checked without Docker: it must be a valid Compose file
// (the Compose Specification's JSON schema, vendored in test/fixtures; see its
// README) and keep the promises its header makes: three Kafka brokers at the
// local stack's version, replication factor 3 / min ISR 2, a healthcheck and a
// restart policy on every long-running service, owners that run `writ owner`
// with a mounted tools module once the one-shot `writ topics ensure` has
// succeeded, the demo only in the `demo` profile, and in the `monitoring`
// profile a Prometheus that loads writ's alerting rules and scrapes every owner
// service's health server, and a Grafana provisioned with that Prometheus and
// writ's dashboard. The Dockerfile builds dist and ships no examples.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv } from "ajv";
import draft7MetaSchema from "ajv/dist/refs/json-schema-draft-07.json" with { type: "json" };
import { describe, expect, it } from "vitest";
import { parseDocument } from "yaml";
import { APICURIO_VERSION, KAFKA_VERSION } from "../../src/testing/local-stack.ts";

const root = join(import.meta.dirname, "..", "..");
const composeText = readFileSync(join(root, "docker-compose.yml"), "utf8");
const schema = JSON.parse(readFileSync(join(root, "test", "fixtures", "compose-spec.json"), "utf8")) as { $schema: string };

// The schema names its meta-schema "https://json-schema.org/draft-07/schema"; Ajv knows draft-07 as
// "http://json-schema.org/draft-07/schema#". Register it under the schema's spelling so the schema is checked too.
const ajv = new Ajv({ allErrors: true, strict: false });
ajv.addMetaSchema({ ...draft7MetaSchema, $id: schema.$schema });
const validateCompose = ajv.compile(schema);

type Service = {
  image?: string;
  command?: string[];
  profiles?: string[];
  volumes?: (string | { source?: string; target?: string })[];
  depends_on?: Record<string, { condition?: string }> | string[];
  restart?: string;
  deploy?: { restart_policy?: { condition?: string } };
  healthcheck?: { test?: string | string[]; disable?: boolean };
  environment?: Record<string, string | number | boolean | null> | string[];
};

function env(service: Service): Record<string, string> {
  const e = service.environment ?? {};
  if (Array.isArray(e)) return Object.fromEntries(e.map((kv) => [kv.slice(0, kv.indexOf("=")), kv.slice(kv.indexOf("=") + 1)]));
  return Object.fromEntries(Object.entries(e).map(([k, v]) => [k, String(v)]));
}

/** Everything wrong with a compose file's text; [] when it keeps every promise. */
function composeProblems(text: string): string[] {
  // Compose resolves `<<` merge keys (the brokers share an x-kafka block)
  const doc = parseDocument(text, { merge: true, prettyErrors: true });
  if (doc.errors.length > 0) return doc.errors.map((e) => `YAML: ${e.message}`);
  const problems = doc.warnings.map((w) => `YAML warning: ${w.message}`);
  const file = doc.toJS({ maxAliasCount: 100 }) as { services?: Record<string, Service> };
  if (!validateCompose(file)) {
    problems.push(...(validateCompose.errors ?? []).map((e) => `schema: ${e.instancePath || "/"} ${e.message} ${JSON.stringify(e.params)}`));
  }
  const services = Object.entries(file?.services ?? {});
  if (services.length === 0) problems.push("no services");
  const dependsOn = (s: Service): Record<string, { condition?: string }> =>
    Array.isArray(s.depends_on) ? Object.fromEntries(s.depends_on.map((d) => [d, {}])) : (s.depends_on ?? {});
  // One-shot services: others wait for them to exit 0; they neither restart nor report health.
  const oneShot = new Set(services.flatMap(([, s]) => Object.entries(dependsOn(s)).filter(([, d]) => d.condition === "service_completed_successfully").map(([n]) => n)));
  for (const [name, s] of services) {
    if (oneShot.has(name)) {
      if (s.restart !== undefined && s.restart !== "no") problems.push(`${name}: a one-shot service (others wait for it to complete) with restart: ${s.restart}`);
      continue;
    }
    const test = s.healthcheck?.test;
    if (s.healthcheck === undefined || s.healthcheck.disable === true || test === undefined || test.length === 0 || (Array.isArray(test) && test[0] === "NONE")) {
      problems.push(`${name}: no healthcheck`);
    }
    // `restart` (docker compose) or deploy.restart_policy; the schema types both as any string
    const restarts = s.restart !== undefined ? /^(always|unless-stopped|on-failure(:\d+)?)$/.test(s.restart) : ["any", "on-failure"].includes(s.deploy?.restart_policy?.condition ?? "");
    if (!restarts) problems.push(`${name}: no restart policy (restart: ${s.restart ?? s.deploy?.restart_policy?.condition})`);
  }
  const kafka = services.filter(([, s]) => s.image?.startsWith("apache/kafka:"));
  if (kafka.length !== 3) problems.push(`${kafka.length} Kafka brokers (apache/kafka images), not 3`);
  const nodeIds = new Set<string>();
  for (const [name, s] of kafka) {
    if (s.image !== `apache/kafka:${KAFKA_VERSION}`) problems.push(`${name}: image ${s.image}, not apache/kafka:${KAFKA_VERSION} (scripts/local-stack.ts KAFKA_VERSION)`);
    const e = env(s);
    nodeIds.add(e["KAFKA_NODE_ID"] ?? "");
    const want: Record<string, string> = {
      KAFKA_PROCESS_ROLES: "broker,controller",
      KAFKA_DEFAULT_REPLICATION_FACTOR: "3",
      KAFKA_MIN_INSYNC_REPLICAS: "2",
      KAFKA_OFFSETS_TOPIC_REPLICATION_FACTOR: "3",
      KAFKA_TRANSACTION_STATE_LOG_REPLICATION_FACTOR: "3",
      KAFKA_TRANSACTION_STATE_LOG_MIN_ISR: "2",
    };
    for (const [k, v] of Object.entries(want)) if (e[k] !== v) problems.push(`${name}: ${k}=${e[k]}, want ${v}`);
    const voters = (e["KAFKA_CONTROLLER_QUORUM_VOTERS"] ?? "").split(",").filter((x) => x !== "");
    if (voters.length !== 3) problems.push(`${name}: ${voters.length} controller quorum voters, want 3`);
    if (!e["CLUSTER_ID"]) problems.push(`${name}: no CLUSTER_ID`);
  }
  if (kafka.length === 3 && nodeIds.size !== 3) problems.push(`broker node ids are not distinct: ${[...nodeIds].join(",")}`);
  const registry = services.find(([, s]) => s.image?.startsWith("apicurio/apicurio-registry:"));
  if (registry === undefined) problems.push("no apicurio/apicurio-registry service");
  else if (registry[1].image !== `apicurio/apicurio-registry:${APICURIO_VERSION}`) {
    problems.push(`${registry[0]}: image ${registry[1].image}, not apicurio/apicurio-registry:${APICURIO_VERSION} (scripts/local-stack.ts APICURIO_VERSION)`);
  }
  const owner = file?.services?.["owner"];
  if (owner === undefined) problems.push("no owner service");
  else if (env(owner)["WRIT_REPLICATION_FACTOR"] !== "3") problems.push(`owner: WRIT_REPLICATION_FACTOR=${env(owner)["WRIT_REPLICATION_FACTOR"]}, want 3`);

  // Topics: one `writ topics ensure`, which every owner waits for and agrees with on the topics' shape.
  const topics = services.filter(([, s]) => JSON.stringify(s.command) === JSON.stringify(["writ", "topics", "ensure"]));
  if (topics.length !== 1) problems.push(`${topics.length} services run writ topics ensure, not 1`);
  const owners = services.filter(([, s]) => s.command?.[0] === "writ" && s.command[1] === "owner");
  if (owner !== undefined && !owners.some(([n]) => n === "owner")) problems.push(`owner: command ${JSON.stringify(owner.command)}, not writ owner --tools …`);
  for (const [name, s] of owners) {
    if (JSON.stringify(s.command) !== JSON.stringify(["writ", "owner", "--tools", "/tools/tools.js"])) problems.push(`${name}: command ${JSON.stringify(s.command)}, want writ owner --tools /tools/tools.js`);
    // short syntax SOURCE:TARGET[:MODE], where SOURCE may be an ${VAR:-default} interpolation
    const mountsTools = (s.volumes ?? []).some((v) => (typeof v === "string" ? v.replace(/\$\{[^}]*\}/g, "src").split(":")[1] === "/tools" : v.target === "/tools"));
    if (!mountsTools) problems.push(`${name}: no volume mounted at /tools (the tools module)`);
    const [topicsName, topicsService] = topics[0] ?? [];
    if (topicsName === undefined || topicsService === undefined) continue;
    if (dependsOn(s)[topicsName]?.condition !== "service_completed_successfully") problems.push(`${name}: does not wait for ${topicsName} (depends_on condition service_completed_successfully)`);
    const mine = env(s);
    const theirs = env(topicsService);
    for (const k of new Set([...Object.keys(mine), ...Object.keys(theirs)])) {
      // the health server is each owner process's own (the one-shot serves none)
      if (k.startsWith("WRIT_HEALTH_")) continue;
      if ((k.startsWith("WRIT_") || k === "KAFKA_BROKERS") && mine[k] !== theirs[k]) problems.push(`${name}: ${k}=${mine[k]}, ${topicsName} has ${theirs[k]}`);
    }
  }
  problems.push(...monitoringProblems(services, owners));
  // The demo (its records server, its tools from examples/) only in the demo profile; the image has no examples/ or .ts.
  for (const [name, s] of services) {
    const demo = (s.command ?? []).some((c) => c.includes("demo-records-server")) || (s.volumes ?? []).some((v) => (typeof v === "string" ? v : (v.source ?? "")).includes("examples"));
    if (demo && !(s.profiles ?? []).includes("demo")) problems.push(`${name}: runs the demo outside the demo profile`);
    if ((s.command ?? []).some((c) => /(^|\/)examples\/|\.ts$/.test(c))) problems.push(`${name}: command ${JSON.stringify(s.command)} needs files the image does not have`);
  }
  return problems;
}

/**
 * The monitoring profile: a Prometheus that loads writ's alerting rules from the repository's deploy/prometheus
 * and scrapes every owner service (its replicas by DNS) on the port its health server listens on, reachable from
 * another container. Only in its profile.
 */
function monitoringProblems(services: [string, Service][], owners: [string, Service][]): string[] {
  const problems: string[] = [];
  const prometheus = services.filter(([, s]) => s.image?.startsWith("prom/prometheus:"));
  if (prometheus.length !== 1) return [`${prometheus.length} prom/prometheus services, not 1`];
  const [name, p] = prometheus[0]!;
  if (JSON.stringify(p.profiles) !== JSON.stringify(["monitoring"])) problems.push(`${name}: profiles ${JSON.stringify(p.profiles)}, want ["monitoring"]`);
  const mount = (p.volumes ?? []).find((v) => typeof v === "string" && v.split(":")[1] === "/etc/prometheus");
  if (typeof mount !== "string" || !existsSync(join(root, mount.split(":")[0]!, "prometheus.yml"))) {
    problems.push(`${name}: no prometheus.yml of the repository mounted at /etc/prometheus`);
    return problems;
  }
  const dir = join(root, mount.split(":")[0]!);
  const config = parseDocument(readFileSync(join(dir, "prometheus.yml"), "utf8")).toJS() as {
    rule_files?: string[];
    scrape_configs?: { job_name: string; dns_sd_configs?: { names: string[]; type?: string; port: number }[] }[];
  };
  if (!(config.rule_files ?? []).includes("writ-alerts.yml") || !existsSync(join(dir, "writ-alerts.yml"))) problems.push(`${name}: does not load writ-alerts.yml`);
  const scraped = new Map((config.scrape_configs ?? []).flatMap((c) => (c.dns_sd_configs ?? []).flatMap((d) => d.names.map((n) => [n, d.port] as const))));
  for (const [owner, s] of owners) {
    const e = env(s);
    if (e["WRIT_HEALTH_HOST"] !== "0.0.0.0") problems.push(`${owner}: WRIT_HEALTH_HOST=${e["WRIT_HEALTH_HOST"]}: its /metrics is not reachable from ${name}`);
    if (!scraped.has(owner)) problems.push(`${name}: does not scrape ${owner}`);
    else if (String(scraped.get(owner)) !== e["WRIT_HEALTH_PORT"]) problems.push(`${name}: scrapes ${owner} on port ${scraped.get(owner)}, its WRIT_HEALTH_PORT is ${e["WRIT_HEALTH_PORT"]}`);
  }
  problems.push(...grafanaProblems(services, name));
  return problems;
}

/** Grafana in the monitoring profile: provisioned with that Prometheus as its data source and writ's dashboards. */
function grafanaProblems(services: [string, Service][], prometheus: string): string[] {
  const grafana = services.filter(([, s]) => s.image?.startsWith("grafana/grafana:"));
  if (grafana.length !== 1) return [`${grafana.length} grafana/grafana services, not 1`];
  const [name, g] = grafana[0]!;
  const problems: string[] = [];
  if (JSON.stringify(g.profiles) !== JSON.stringify(["monitoring"])) problems.push(`${name}: profiles ${JSON.stringify(g.profiles)}, want ["monitoring"]`);
  const mounts = new Map((g.volumes ?? []).filter((v): v is string => typeof v === "string").map((v) => [v.split(":")[1]!, join(root, v.split(":")[0]!)] as const));
  const provisioning = mounts.get("/etc/grafana/provisioning");
  if (provisioning === undefined || !existsSync(join(provisioning, "datasources"))) return [...problems, `${name}: no provisioning of the repository mounted at /etc/grafana/provisioning`];
  const yaml = (path: string) => parseDocument(readFileSync(path, "utf8")).toJS() as Record<string, unknown>;
  const sources = (yaml(join(provisioning, "datasources", "prometheus.yml")).datasources ?? []) as { type?: string; url?: string }[];
  if (!sources.some((d) => d.type === "prometheus" && d.url === `http://${prometheus}:9090`)) problems.push(`${name}: no data source at http://${prometheus}:9090`);
  const providers = (yaml(join(provisioning, "dashboards", "writ.yml")).providers ?? []) as { options?: { path?: string } }[];
  for (const p of providers) {
    const dir = mounts.get(p.options?.path ?? "");
    if (dir === undefined || !existsSync(join(dir, "writ-owners.json"))) problems.push(`${name}: its dashboards path ${p.options?.path} does not hold writ-owners.json`);
  }
  if (providers.length === 0) problems.push(`${name}: provisions no dashboards`);
  return problems;
}

describe("docker-compose.yml", () => {
  it("is a valid Compose file and keeps its promises (3 brokers at KAFKA_VERSION, RF 3 / min ISR 2, healthchecks, restart policies)", () => {
    expect(composeProblems(composeText)).toEqual([]);
  });

  it("runs the writ services: topics once, two owners with a mounted tools module, the demo in its profile", () => {
    const file = parseDocument(composeText, { merge: true }).toJS({ maxAliasCount: 100 }) as { services: Record<string, Service & { deploy?: { replicas?: number } }> };
    expect(file.services["topics"]?.command).toEqual(["writ", "topics", "ensure"]);
    expect(file.services["owner"]?.command).toEqual(["writ", "owner", "--tools", "/tools/tools.js"]);
    expect(file.services["owner"]?.deploy?.replicas).toBe(2);
    expect(file.services["owner"]?.depends_on).toMatchObject({ topics: { condition: "service_completed_successfully" } });
    expect(file.services["owner"]?.profiles).toBeUndefined();
    expect(file.services["demo-owner"]?.profiles).toEqual(["demo"]);
    expect(file.services["demo-owner"]?.volumes).toEqual(["./examples/compose:/tools:ro"]);
    expect(file.services["records"]?.profiles).toEqual(["demo"]);
    expect(file.services["records"]?.command).toEqual(["node", "dist/src/testing/demo-records-server-main.js"]);
    expect(existsSync(join(root, "examples", "compose", "tools.js"))).toBe(true);
    expect(file.services["prometheus"]?.profiles).toEqual(["monitoring"]);
    expect(file.services["grafana"]?.profiles).toEqual(["monitoring"]);
  });

  // The checks themselves: each breakage of the real file must be reported.
  const breakages: [string, (text: string) => string, RegExp][] = [
    ["an unknown service key", (t) => t.replace("  records:\n    <<: *writ", "  records:\n    <<: *writ\n    restart_policy: always"), /schema: \/services\/records .*additional properties/],
    ["a value outside its enum", (t) => t.replace("kafka-1: { condition: service_healthy }", "kafka-1: { condition: healthy }"), /schema: \/services\/topics\/depends_on\/kafka-1\/condition must be equal to one of the allowed values/],
    ["a wrongly typed field", (t) => t.replace("  owner:\n    <<: *owner\n", "  owner:\n    <<: *owner\n    build: [.]\n"), /schema: \/services\/owner\/build must be (string|object)/],
    ["a service without a healthcheck", (t) => t.replace(/    healthcheck:\n      test: \["CMD", "node", "-e", "fetch[^\n]*\n/, "    x-no-healthcheck:\n      test: 1\n"), /records: no healthcheck/],
    ["an unknown restart policy", (t) => t.replace("demo-records-server-main.js\"]\n    restart: unless-stopped", "demo-records-server-main.js\"]\n    restart: sometimes"), /records: no restart policy \(restart: sometimes\)/],
    ["a service without a restart policy", (t) => t.replace("  command: [\"writ\", \"owner\", \"--tools\", \"/tools/tools.js\"]\n  restart: unless-stopped\n", "  command: [\"writ\", \"owner\", \"--tools\", \"/tools/tools.js\"]\n"), /owner: no restart policy/],
    ["a restarting one-shot", (t) => t.replace("    command: [\"writ\", \"topics\", \"ensure\"]\n    restart: \"no\"", "    command: [\"writ\", \"topics\", \"ensure\"]\n    restart: unless-stopped"), /topics: a one-shot service .* with restart: unless-stopped/],
    ["owners that do not wait for the topics", (t) => t.replace("  owner:\n    <<: *owner\n    volumes:\n      - ${WRIT_TOOLS_DIR:-./tools}:/tools:ro\n    depends_on:\n      topics: { condition: service_completed_successfully }", "  owner:\n    <<: *owner\n    volumes:\n      - ${WRIT_TOOLS_DIR:-./tools}:/tools:ro\n    depends_on:\n      topics: { condition: service_started }"), /owner: does not wait for topics/],
    ["owners without a tools module", (t) => t.replace("    volumes:\n      - ${WRIT_TOOLS_DIR:-./tools}:/tools:ro\n", ""), /owner: no volume mounted at \/tools/],
    ["owners and topics that disagree on the partition count", (t) => t.replace("      WRIT_HEALTH_PORT: 9464\n      RECORDS_URL", "      WRIT_HEALTH_PORT: 9464\n      WRIT_INTENT_PARTITIONS: 6\n      RECORDS_URL"), /demo-owner: WRIT_INTENT_PARTITIONS=6, topics has 12/],
    ["the demo outside its profile", (t) => t.replace("  demo-owner:\n    <<: *owner\n    profiles: [demo]\n", "  demo-owner:\n    <<: *owner\n"), /demo-owner: runs the demo outside the demo profile/],
    ["a command from the sources", (t) => t.replace("dist/src/testing/demo-records-server-main.js", "src/testing/demo-records-server-main.ts"), /records: command .* needs files the image does not have/],
    ["another Kafka version", (t) => t.replace(`apache/kafka:${KAFKA_VERSION}`, "apache/kafka:4.1.0"), /image apache\/kafka:4\.1\.0, not apache\/kafka:/],
    ["two brokers", (t) => t.replace(/\n  kafka-3:\n(?: {4}[^\n]*\n| {6}[^\n]*\n)+/, "\n"), /2 Kafka brokers/],
    ["min ISR 1", (t) => t.replace("KAFKA_MIN_INSYNC_REPLICAS: 2", "KAFKA_MIN_INSYNC_REPLICAS: 1"), /KAFKA_MIN_INSYNC_REPLICAS=1, want 2/],
    ["broken YAML", (t) => t.replace("services:\n", "services:\n  - [\n"), /YAML/],
    ["an owner whose health server Prometheus scrapes on another port", (t) => t.replace("      WRIT_HEALTH_PORT: 9464\n      RECORDS_URL", "      WRIT_HEALTH_PORT: 9465\n      RECORDS_URL"), /prometheus: scrapes demo-owner on port 9464, its WRIT_HEALTH_PORT is 9465/],
    ["an owner's health server on its loopback only", (t) => t.replace("      WRIT_HEALTH_HOST: 0.0.0.0\n      WRIT_HEALTH_PORT: 9464\n\n", "      WRIT_HEALTH_PORT: 9464\n\n"), /owner: WRIT_HEALTH_HOST=undefined: its \/metrics is not reachable from prometheus/],
    ["Prometheus outside its profile", (t) => t.replace("    profiles: [monitoring]\n", ""), /prometheus: profiles undefined, want \["monitoring"\]/],
    ["Grafana's dashboards mounted elsewhere than its provider reads", (t) => t.replace("./deploy/grafana/dashboards:/var/lib/grafana/dashboards:ro", "./deploy/grafana/dashboards:/var/lib/grafana/writ:ro"), /grafana: its dashboards path \/var\/lib\/grafana\/dashboards does not hold writ-owners.json/],
    ["Grafana outside its profile", (t) => t.replace("    image: grafana/grafana:12.1.0\n    profiles: [monitoring]\n", "    image: grafana/grafana:12.1.0\n"), /grafana: profiles undefined, want \["monitoring"\]/],
    ["Prometheus without the rules mounted", (t) => t.replace("      - ./deploy/prometheus:/etc/prometheus:ro\n", "      - ./deploy:/etc/prometheus:ro\n"), /prometheus: no prometheus.yml of the repository mounted/],
  ];
  for (const [what, breakIt, expected] of breakages) {
    it(`reports ${what}`, () => {
      const broken = breakIt(composeText);
      expect(broken, "the breakage applies to the current file").not.toBe(composeText);
      const problems = composeProblems(broken);
      expect(problems.join("\n")).toMatch(expected);
    });
  }
});

describe("Dockerfile", () => {
  const dockerfile = readFileSync(join(root, "Dockerfile"), "utf8");
  const instructions = dockerfile.split("\n").filter((l) => /^[A-Z]+\s/.test(l));

  it("builds dist with `npm run build`'s script in a build stage and ships it with production dependencies only", () => {
    expect(instructions.filter((l) => l.startsWith("FROM"))).toEqual(["FROM node:24-slim AS build", "FROM node:24-slim"]);
    // The script npm run build runs (tsc with tsconfig.build.json, then the console's page copied into dist):
    // tsc alone leaves dist without src/console/assets, and `writ console` in the image fails at its start.
    const build = instructions.slice(0, instructions.indexOf("FROM node:24-slim"));
    expect(JSON.parse(readFileSync(join(root, "package.json"), "utf8")).scripts.build).toBe("node scripts/build.mjs");
    expect(build).toContain("RUN node scripts/build.mjs");
    expect(build).toContain("COPY scripts/build.mjs ./scripts/build.mjs");
    expect(build).toContain("COPY src ./src");
    const script = readFileSync(join(root, "scripts", "build.mjs"), "utf8");
    expect(script).toMatch(/tsconfig\.build\.json/);
    expect(script).toMatch(/cpSync\(join\(root, "src", "console", "assets"\), join\(root, "dist", "src", "console", "assets"\)/);
    expect(instructions).toContain("COPY --from=build /app/dist ./dist");
    expect(dockerfile).toMatch(/npm install --omit=dev/);
    expect(instructions.at(-1)).toBe('CMD ["writ", "owner", "--tools", "/tools/tools.js"]');
  });

  it("does not ship examples/ (nor the test, CI or bench folders)", () => {
    const copies = instructions.filter((l) => l.startsWith("COPY"));
    expect(copies.filter((l) => /\b(examples|test|\.ci|bench|consumers)\b/.test(l))).toEqual([]);
  });
});
