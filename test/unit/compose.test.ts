// docker-compose.yml is checked without Docker: it must be a valid Compose file
// (the Compose Specification's JSON schema, vendored in test/fixtures; see its
// README) and keep the promises its header makes: three Kafka brokers at the
// local stack's version, replication factor 3 / min ISR 2, and a healthcheck
// and a restart policy on every service.
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { Ajv } from "ajv";
import draft7MetaSchema from "ajv/dist/refs/json-schema-draft-07.json" with { type: "json" };
import { describe, expect, it } from "vitest";
import { parseDocument } from "yaml";
import { APICURIO_VERSION, KAFKA_VERSION } from "../../scripts/local-stack.ts";

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
  for (const [name, s] of services) {
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
  return problems;
}

describe("docker-compose.yml", () => {
  it("is a valid Compose file and keeps its promises (3 brokers at KAFKA_VERSION, RF 3 / min ISR 2, healthchecks, restart policies)", () => {
    expect(composeProblems(composeText)).toEqual([]);
  });

  it("runs the writ services: two owners and the records server", () => {
    const file = parseDocument(composeText, { merge: true }).toJS() as { services: Record<string, { command?: string[]; deploy?: { replicas?: number } }> };
    expect(file.services["owner"]?.command).toEqual(["node", "consumers/owner-main.ts"]);
    expect(file.services["owner"]?.deploy?.replicas).toBe(2);
    expect(file.services["records"]?.command).toEqual(["node", "src/sor/demo-records-server-main.ts"]);
  });

  // The checks themselves: each breakage of the real file must be reported.
  const breakages: [string, (text: string) => string, RegExp][] = [
    ["an unknown service key", (t) => t.replace("  records:\n    build: .", "  records:\n    build: .\n    restart_policy: always"), /schema: \/services\/records .*additional properties/],
    ["a value outside its enum", (t) => t.replace("kafka-1: { condition: service_healthy }", "kafka-1: { condition: healthy }"), /schema: \/services\/owner\/depends_on\/kafka-1\/condition must be equal to one of the allowed values/],
    ["a wrongly typed field", (t) => t.replace("    build: .\n    command: [\"node\", \"consumers/owner-main.ts\"]", "    build: [.]\n    command: [\"node\", \"consumers/owner-main.ts\"]"), /schema: \/services\/owner\/build must be (string|object)/],
    ["a service without a healthcheck", (t) => t.replace(/    healthcheck:\n      test: \["CMD", "node", "-e", "fetch[^\n]*\n/, "    x-no-healthcheck:\n      test: 1\n"), /records: no healthcheck/],
    ["an unknown restart policy", (t) => t.replace("records:\n    build: .\n    command: [\"node\", \"src/sor/demo-records-server-main.ts\"]\n    restart: unless-stopped", "records:\n    build: .\n    command: [\"node\", \"src/sor/demo-records-server-main.ts\"]\n    restart: sometimes"), /records: no restart policy \(restart: sometimes\)/],
    ["a service without a restart policy", (t) => t.replace("    command: [\"node\", \"consumers/owner-main.ts\"]\n    restart: unless-stopped", "    command: [\"node\", \"consumers/owner-main.ts\"]"), /owner: no restart policy/],
    ["another Kafka version", (t) => t.replace(`apache/kafka:${KAFKA_VERSION}`, "apache/kafka:4.1.0"), /image apache\/kafka:4\.1\.0, not apache\/kafka:/],
    ["two brokers", (t) => t.replace(/\n  kafka-3:\n(?: {4}[^\n]*\n| {6}[^\n]*\n)+/, "\n"), /2 Kafka brokers/],
    ["min ISR 1", (t) => t.replace("KAFKA_MIN_INSYNC_REPLICAS: 2", "KAFKA_MIN_INSYNC_REPLICAS: 1"), /KAFKA_MIN_INSYNC_REPLICAS=1, want 2/],
    ["broken YAML", (t) => t.replace("services:\n", "services:\n  - [\n"), /YAML/],
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
