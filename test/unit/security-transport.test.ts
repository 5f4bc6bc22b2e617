// Secure transport configuration without a broker: the config shape (RouterConfig, ClientConfig), the
// environment variables of owners, the CLI and the MCP server, what kafkajs and the registry clients get,
// and error messages that name the variable and never contain a secret.
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterAll, describe, expect, it } from "vitest";
import { ClientConfig, RouterConfig, parseConfig, routerConfigFromEnv } from "../../src/config.ts";
import { REDACT_PATHS } from "../../src/logger.ts";
import { connectionSecurityFromEnv, kafkaConnection, registryTransport, transportWarnings } from "../../src/security/transport.ts";

const dir = mkdtempSync(join(tmpdir(), "writ-transport-"));
afterAll(() => rmSync(dir, { recursive: true, force: true }));
const CA = "-----BEGIN CERTIFICATE-----\nMIIBfake\n-----END CERTIFICATE-----\n";
const caFile = join(dir, "ca.pem");
writeFileSync(caFile, CA);
const SECRET = "s3cr3t-P4ssw0rd-never-shown";
const passwordFile = join(dir, "pw");
writeFileSync(passwordFile, `${SECRET}\n`);
const base = { KAFKA_BROKERS: "127.0.0.1:9093" };

/** The message of what `fn` throws. */
function thrown(fn: () => unknown): string {
  try {
    fn();
  } catch (err) {
    return err instanceof Error ? err.message : String(err);
  }
  throw new Error("did not throw");
}

describe("owner configuration from the environment", () => {
  it("reads SASL and TLS: KAFKA_SASL_*, KAFKA_SSL_CA_FILE; the password from a file, its newline dropped", () => {
    const c = routerConfigFromEnv({ ...base, KAFKA_SASL_USERNAME: "writ-owner", KAFKA_SASL_PASSWORD_FILE: passwordFile, KAFKA_SSL_CA_FILE: caFile });
    expect(c.kafka).toEqual({ ssl: { ca: caFile }, sasl: { mechanism: "scram-sha-512", username: "writ-owner", password: SECRET } });
    expect(kafkaConnection(c.kafka)).toEqual({ ssl: { ca: [CA] }, sasl: { mechanism: "scram-sha-512", username: "writ-owner", password: SECRET } });
    expect(transportWarnings(c.kafka, c)).toEqual([]);
  });

  it("takes the mechanism in any case, KAFKA_SSL=true alone, and the registry's basic auth and CA", () => {
    const c = routerConfigFromEnv({
      ...base,
      KAFKA_SSL: "true",
      KAFKA_SASL_MECHANISM: "SCRAM-SHA-256",
      KAFKA_SASL_USERNAME: "u",
      KAFKA_SASL_PASSWORD: SECRET,
      SCHEMA_REGISTRY_URL: "https://registry.example:8081/apis/ccompat/v7",
      SCHEMA_REGISTRY_USERNAME: "reg",
      SCHEMA_REGISTRY_PASSWORD: SECRET,
      SCHEMA_REGISTRY_CA_FILE: caFile,
    });
    expect(c.kafka).toEqual({ ssl: true, sasl: { mechanism: "scram-sha-256", username: "u", password: SECRET } });
    expect(c.schemaRegistryAuth).toEqual({ username: "reg", password: SECRET });
    expect(c.schemaRegistryTls).toEqual({ ca: caFile });
  });

  it("names the variable, and never shows the secret", () => {
    const cases: [Record<string, string>, RegExp][] = [
      [{ KAFKA_SASL_USERNAME: "u" }, /KAFKA_SASL_PASSWORD: required with KAFKA_SASL_USERNAME/],
      [{ KAFKA_SASL_PASSWORD: SECRET }, /KAFKA_SASL_USERNAME: required/],
      [{ KAFKA_SASL_USERNAME: "u", KAFKA_SASL_PASSWORD: SECRET, KAFKA_SASL_PASSWORD_FILE: passwordFile }, /KAFKA_SASL_PASSWORD_FILE: set KAFKA_SASL_PASSWORD or KAFKA_SASL_PASSWORD_FILE, not both/],
      [{ KAFKA_SASL_USERNAME: "u", KAFKA_SASL_PASSWORD_FILE: join(dir, "missing") }, /KAFKA_SASL_PASSWORD_FILE: cannot read .*missing \(ENOENT\)/],
      [{ KAFKA_SASL_USERNAME: "u", KAFKA_SASL_PASSWORD: SECRET, KAFKA_SASL_MECHANISM: "gssapi" }, /KAFKA_SASL_MECHANISM \(kafka\.sasl\.mechanism\)/],
      [{ KAFKA_SSL: "maybe" }, /KAFKA_SSL: must be true or false/],
      [{ KAFKA_SSL: "false", KAFKA_SSL_CA_FILE: caFile }, /KAFKA_SSL: is false, but KAFKA_SSL_\* settings are given/],
      [{ KAFKA_SSL_CA_FILE: join(dir, "nope.pem") }, /KAFKA_SSL_CA_FILE \(kafka\.ssl\.ca\): cannot read .*nope\.pem \(ENOENT\)/],
      [{ KAFKA_SSL_CA_FILE: passwordFile }, /KAFKA_SSL_CA_FILE \(kafka\.ssl\.ca\): .* holds no PEM block/],
      [{ KAFKA_SSL_CERT_FILE: caFile }, /KAFKA_SSL_KEY_FILE \(kafka\.ssl\.key\): cert and key go together/],
      [{ SCHEMA_REGISTRY_URL: `https://writ:${SECRET}@registry.example/apis/ccompat/v7` }, /SCHEMA_REGISTRY_URL \(schemaRegistryUrl\): must not carry credentials/],
      [{ SCHEMA_REGISTRY_URL: "https://registry.example", SCHEMA_REGISTRY_PASSWORD: SECRET }, /SCHEMA_REGISTRY_USERNAME: required with SCHEMA_REGISTRY_PASSWORD/],
      [{ SCHEMA_REGISTRY_USERNAME: "reg", SCHEMA_REGISTRY_PASSWORD: SECRET }, /SCHEMA_REGISTRY_USERNAME \(schemaRegistryAuth\): given without schemaRegistryUrl/],
      [{ SCHEMA_REGISTRY_URL: "http://registry.example", SCHEMA_REGISTRY_CA_FILE: caFile }, /SCHEMA_REGISTRY_CA_FILE \(schemaRegistryTls\): needs an https schemaRegistryUrl/],
    ];
    for (const [env, expected] of cases) {
      const message = thrown(() => routerConfigFromEnv({ ...base, ...env }));
      expect(message, JSON.stringify(env)).toMatch(expected);
      expect(message).not.toContain(SECRET);
    }
  });

  it("the CLI's and MCP server's connection settings: the same variables, the same messages", () => {
    expect(connectionSecurityFromEnv({ KAFKA_SASL_USERNAME: "agent-a", KAFKA_SASL_PASSWORD: SECRET, KAFKA_SSL_CA_FILE: caFile }, "https://r.example")).toEqual({
      kafka: { ssl: { ca: caFile }, sasl: { mechanism: "scram-sha-512", username: "agent-a", password: SECRET } },
      schemaRegistryUrl: "https://r.example",
    });
    // the registry URL defaults to SCHEMA_REGISTRY_URL
    expect(connectionSecurityFromEnv({ SCHEMA_REGISTRY_URL: "https://r.example", SCHEMA_REGISTRY_USERNAME: "reg", SCHEMA_REGISTRY_PASSWORD: SECRET }).schemaRegistryAuth).toEqual({ username: "reg", password: SECRET });
    const message = thrown(() => connectionSecurityFromEnv({ SCHEMA_REGISTRY_USERNAME: "reg", SCHEMA_REGISTRY_PASSWORD: SECRET }, `http://reg:${SECRET}@r.example`));
    expect(message).toMatch(/SCHEMA_REGISTRY_URL \(schemaRegistryUrl\): must not carry credentials/);
    expect(message).not.toContain(SECRET);
  });
});

describe("RouterConfig and ClientConfig", () => {
  const client = { brokers: "127.0.0.1:9093", agentId: "agent-a", replyTopic: "writ.replies.agent-a" };

  it("accept kafka: { ssl, sasl } and registry auth (they were strict and refused sasl)", () => {
    const c = parseConfig(ClientConfig, { ...client, kafka: { ssl: { ca: CA, rejectUnauthorized: true }, sasl: { mechanism: "plain", username: "a", password: SECRET } } }, "client");
    expect(kafkaConnection(c.kafka)).toEqual({ ssl: { ca: [CA], rejectUnauthorized: true }, sasl: { mechanism: "plain", username: "a", password: SECRET } });
    const r = parseConfig(RouterConfig, { brokers: "a:1", kafka: { ssl: true }, schemaRegistryUrl: "https://r.example", schemaRegistryAuth: { username: "u", password: SECRET } }, "router");
    expect(r.kafka).toEqual({ ssl: true });
  });

  it("refuse unknown fields, a key that is neither PEM nor a file (without repeating it), credentials in the URL", () => {
    expect(thrown(() => parseConfig(ClientConfig, { ...client, kafka: { sasl: { username: "a", password: SECRET, extra: 1 } } }, "client"))).toMatch(/kafka\.sasl/);
    const keyMessage = thrown(() => parseConfig(ClientConfig, { ...client, kafka: { ssl: { cert: CA, key: SECRET } } }, "client"));
    expect(keyMessage).toMatch(/kafka\.ssl\.key: not PEM text, and not a readable file \(ENOENT\)/);
    expect(keyMessage).not.toContain(SECRET);
    const urlMessage = thrown(() => parseConfig(ClientConfig, { ...client, schemaRegistryUrl: `http://u:${SECRET}@r.example` }, "client"));
    expect(urlMessage).toMatch(/schemaRegistryUrl: must not carry credentials/);
    expect(urlMessage).not.toContain(SECRET);
  });

  it("warns about SASL without TLS and certificate checks turned off", () => {
    const c = parseConfig(ClientConfig, { ...client, kafka: { sasl: { mechanism: "plain", username: "a", password: SECRET } } }, "client");
    expect(transportWarnings(c.kafka).join("\n")).toMatch(/SASL \(plain\) without TLS/);
    expect(transportWarnings({ ssl: { rejectUnauthorized: false } }).join("\n")).toMatch(/verification is off/);
  });
});

describe("registry transport", () => {
  it("sends basic auth on writ's own requests and hands it to the client library", () => {
    const t = registryTransport({ auth: { username: "writ", password: SECRET } });
    expect(t.headers.authorization).toBe(`Basic ${Buffer.from(`writ:${SECRET}`).toString("base64")}`);
    expect(t.auth).toEqual({ username: "writ", password: SECRET });
    expect(t.agent).toBeUndefined();
    expect(registryTransport({ tls: { ca: CA } }).agent).toBeDefined();
  });
});

describe("log redaction", () => {
  it("blanks passwords, tokens, keys and auth wherever writ's objects put them", () => {
    let out = "";
    const log = pino({ redact: REDACT_PATHS }, new Writable({ write: (c, _e, cb) => ((out += String(c)), cb()) }));
    log.info({ password: SECRET, token: SECRET, headers: { authorization: SECRET } }, "top level");
    log.info({ config: { kafka: { sasl: { password: SECRET }, ssl: { key: SECRET } }, schemaRegistryAuth: { password: SECRET } } }, "a config");
    log.info({ kafka: { sasl: { username: "u", password: SECRET } }, signer: { keyId: "k", privateKey: SECRET }, opts: { token: SECRET, privateKey: SECRET } }, "options");
    expect(out.split("\n").filter(Boolean)).toHaveLength(3);
    expect(out).not.toContain(SECRET);
  });
});
