// Secure transport: SASL and TLS for every Kafka client writ builds (owners,
// the agent client, the CLI, verify, the MCP server, and the ledger reader,
// offset probe and transaction admin an owner builds), and basic auth and TLS
// for every schema registry request. One validated shape (zod), used by
// RouterConfig and ClientConfig, plus the environment variables of the owner,
// the CLI and the MCP server. Error messages name the field or variable and
// never contain a secret.
import { readFileSync } from "node:fs";
import { Agent as HttpsAgent } from "node:https";
import type { KafkaConfig, SASLOptions } from "kafkajs";
import { z } from "zod";
import { WritError } from "../errors.ts";

const PEM_BLOCK = /-----BEGIN [A-Z0-9 ]+-----/;

/** What is wrong with a PEM source (PEM text or a file path), or undefined. `secret`: never repeat the value. */
function pemProblem(value: string, secret: boolean): string | undefined {
  if (PEM_BLOCK.test(value)) return undefined;
  const looksLikePath = !/[\r\n]/.test(value) && value.length <= 4096;
  if (!looksLikePath) return "neither PEM text (-----BEGIN …) nor a file path";
  let text: string;
  try {
    text = readFileSync(value, "utf8");
  } catch (err) {
    const code = (err as NodeJS.ErrnoException).code ?? "unreadable";
    return secret ? `not PEM text, and not a readable file (${code})` : `cannot read ${value} (${code})`;
  }
  if (!PEM_BLOCK.test(text)) return secret ? "the file holds no PEM block" : `${value} holds no PEM block`;
  return undefined;
}

/** PEM text, or the path of a file holding it (read when a client is built). */
const pem = (secret: boolean) =>
  z
    .string()
    .min(1)
    .superRefine((v, ctx) => {
      const problem = pemProblem(v, secret);
      if (problem !== undefined) ctx.addIssue({ code: "custom", message: problem });
    });

/** The text of a PEM source. */
export function readPem(value: string): string {
  return PEM_BLOCK.test(value) ? value : readFileSync(value, "utf8");
}

/**
 * node:tls options from writ's TLS settings (brokers, registry, an HTTP
 * system of record): the PEM fields through `pem` (read a file, wrap bytes),
 * and only the fields given, so that Node's defaults stand for the rest.
 */
export function tlsConnectOptions<V, P>(
  tls: { ca?: V | undefined; cert?: V | undefined; key?: V | undefined; passphrase?: string | undefined; rejectUnauthorized?: boolean | undefined },
  pem: (value: V) => P,
): { ca?: P; cert?: P; key?: P; passphrase?: string; rejectUnauthorized?: boolean } {
  return {
    ...(tls.ca === undefined ? {} : { ca: pem(tls.ca) }),
    ...(tls.cert === undefined ? {} : { cert: pem(tls.cert) }),
    ...(tls.key === undefined ? {} : { key: pem(tls.key) }),
    ...(tls.passphrase === undefined ? {} : { passphrase: tls.passphrase }),
    ...(tls.rejectUnauthorized === undefined ? {} : { rejectUnauthorized: tls.rejectUnauthorized }),
  };
}

const tlsFiles = {
  /** CA certificate(s) to trust instead of Node's built-in roots (PEM text or a file path). */
  ca: pem(false).optional(),
  /** Client certificate, for brokers or registries that require one (mutual TLS). */
  cert: pem(false).optional(),
  /** The client certificate's private key. */
  key: pem(true).optional(),
  /** Passphrase of an encrypted `key`. */
  passphrase: z.string().min(1).optional(),
  /** Default true. false turns off certificate verification: development only. */
  rejectUnauthorized: z.boolean().optional(),
};

const certAndKey = (c: { cert?: string | undefined; key?: string | undefined }, ctx: z.RefinementCtx) => {
  if ((c.cert === undefined) !== (c.key === undefined)) {
    ctx.addIssue({ code: "custom", path: [c.cert === undefined ? "cert" : "key"], message: "cert and key go together" });
  }
};

/** TLS to the brokers: `true` (Node's trusted roots) or the options. */
export const KafkaTls = z.union([
  z.boolean(),
  z
    .object({
      ...tlsFiles,
      /** TLS server name (SNI and the name checked), when it differs from the broker's host. */
      servername: z.string().min(1).optional(),
    })
    .strict()
    .superRefine(certAndKey),
]);
export type KafkaTls = z.infer<typeof KafkaTls>;

export const SASL_MECHANISMS = ["scram-sha-512", "scram-sha-256", "plain"] as const;

/** SASL to the brokers: SCRAM (recommended) or PLAIN (only over TLS). */
export const KafkaSasl = z
  .object({
    mechanism: z.preprocess((v) => (typeof v === "string" ? v.toLowerCase() : v), z.enum(SASL_MECHANISMS)).default("scram-sha-512"),
    username: z.string().min(1),
    password: z.string().min(1),
  })
  .strict();
export type KafkaSasl = z.infer<typeof KafkaSasl>;

/** How writ's Kafka clients connect: what kafkajs's `ssl` and `sasl` options get. */
export const KafkaSecurity = z
  .object({
    ssl: KafkaTls.optional(),
    sasl: KafkaSasl.optional(),
  })
  .strict();
export type KafkaSecurity = z.infer<typeof KafkaSecurity>;
export type KafkaSecurityInput = z.input<typeof KafkaSecurity>;

/** HTTP basic auth to the schema registry. */
export const RegistryAuth = z
  .object({
    username: z.string().min(1),
    password: z.string().min(1),
  })
  .strict();
export type RegistryAuth = z.infer<typeof RegistryAuth>;

/** TLS to the schema registry (an https URL): a CA to trust, a client certificate. */
export const RegistryTls = z.object(tlsFiles).strict().superRefine(certAndKey);
export type RegistryTls = z.infer<typeof RegistryTls>;

/** A registry URL: http(s), and no credentials in it (they would be logged and shown wherever the URL is). */
export const SchemaRegistryUrl = z.url().superRefine((v, ctx) => {
  let url: URL;
  try {
    url = new URL(v);
  } catch {
    return;
  }
  if (url.username !== "" || url.password !== "") {
    ctx.addIssue({ code: "custom", message: "must not carry credentials (user:password@): give them in schemaRegistryAuth (SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD)" });
  }
  if (url.protocol !== "http:" && url.protocol !== "https:") ctx.addIssue({ code: "custom", message: "must be an http or https URL" });
});

/** The registry fields of RouterConfig and ClientConfig. */
export const registryFields = {
  /** Confluent-API schema registry; unset means plain JSON values. No credentials in the URL: see schemaRegistryAuth. */
  schemaRegistryUrl: SchemaRegistryUrl.optional(),
  schemaRegistryAuth: RegistryAuth.optional(),
  schemaRegistryTls: RegistryTls.optional(),
};

/** Cross-field checks of the registry fields (for a config's superRefine). */
export function checkRegistryFields(
  c: { schemaRegistryUrl?: string | undefined; schemaRegistryAuth?: unknown; schemaRegistryTls?: unknown },
  ctx: z.RefinementCtx,
): void {
  if (c.schemaRegistryUrl === undefined) {
    if (c.schemaRegistryAuth !== undefined) ctx.addIssue({ code: "custom", path: ["schemaRegistryAuth"], message: "given without schemaRegistryUrl" });
    if (c.schemaRegistryTls !== undefined) ctx.addIssue({ code: "custom", path: ["schemaRegistryTls"], message: "given without schemaRegistryUrl" });
  } else if (c.schemaRegistryTls !== undefined && !c.schemaRegistryUrl.startsWith("https:")) {
    ctx.addIssue({ code: "custom", path: ["schemaRegistryTls"], message: "needs an https schemaRegistryUrl" });
  }
}

// ---------------------------------------------------------------------------
// kafkajs

/** kafkajs's `ssl` and `sasl` options for `security` (PEM files are read here). */
export function kafkaConnection(security: KafkaSecurity | undefined): Pick<KafkaConfig, "ssl" | "sasl"> {
  if (security === undefined) return {};
  const out: Pick<KafkaConfig, "ssl" | "sasl"> = {};
  const { ssl, sasl } = security;
  if (ssl === true) out.ssl = true;
  else if (ssl !== undefined && ssl !== false) {
    const { ca, ...rest } = tlsConnectOptions(ssl, readPem);
    out.ssl = {
      ...rest,
      ...(ca === undefined ? {} : { ca: [ca] }),
      ...(ssl.servername === undefined ? {} : { servername: ssl.servername }),
    };
  }
  if (sasl !== undefined) out.sasl = { mechanism: sasl.mechanism, username: sasl.username, password: sasl.password } as SASLOptions;
  return out;
}

/** Warnings about a security setting that works but should not be used in production (no secrets in them). */
export function transportWarnings(security: KafkaSecurity | undefined, registry: { schemaRegistryUrl?: string | undefined; schemaRegistryAuth?: unknown; schemaRegistryTls?: RegistryTls | undefined } = {}): string[] {
  const out: string[] = [];
  const tls = security?.ssl !== undefined && security.ssl !== false;
  if (security?.sasl !== undefined && !tls) out.push(`Kafka SASL (${security.sasl.mechanism}) without TLS: credentials${security.sasl.mechanism === "plain" ? "" : " exchanges"} and records cross the network in clear (set KAFKA_SSL=true)`);
  if (typeof security?.ssl === "object" && security.ssl.rejectUnauthorized === false) out.push("Kafka TLS certificate verification is off (rejectUnauthorized false): development only");
  if (registry.schemaRegistryAuth !== undefined && registry.schemaRegistryUrl?.startsWith("http:")) out.push("schema registry basic auth over plain http: the password crosses the network in clear");
  if (registry.schemaRegistryTls?.rejectUnauthorized === false) out.push("schema registry TLS certificate verification is off (rejectUnauthorized false): development only");
  return out;
}

// ---------------------------------------------------------------------------
// The schema registry

/** What a registry request needs: the Authorization header, an https agent (for the Confluent client library) and a fetch (writ's own calls). */
export interface RegistryTransport {
  /** Headers every request carries (Authorization). */
  readonly headers: Readonly<Record<string, string>>;
  /** For @kafkajs/confluent-schema-registry's `auth` option (mappersmith's basic-auth middleware). */
  readonly auth: RegistryAuth | undefined;
  /** For its `agent` option: the TLS settings, when given. */
  readonly agent: HttpsAgent | undefined;
  /** fetch with the TLS settings (undici's fetch with an Agent dispatcher when TLS is configured, else the global fetch); headers are the caller's. */
  fetch(url: string, init: RequestInit): Promise<Response>;
}

/**
 * The registry transport for `auth` and `tls`. With TLS settings, writ's own
 * calls use an undici Agent paired with undici's own fetch (the fetch Node
 * bundles may be of another undici major and refuse a foreign dispatcher),
 * loaded on first use.
 */
export function registryTransport(opts: { auth?: RegistryAuth | undefined; tls?: RegistryTls | undefined }): RegistryTransport {
  const headers: Record<string, string> = {};
  if (opts.auth) headers.authorization = `Basic ${Buffer.from(`${opts.auth.username}:${opts.auth.password}`, "utf8").toString("base64")}`;
  const tls = opts.tls;
  if (tls === undefined) return { headers, auth: opts.auth, agent: undefined, fetch: (url, init) => fetch(url, init) };
  const connect = tlsConnectOptions(tls, readPem);
  let undiciFetch: Promise<(url: string, init: RequestInit) => Promise<Response>> | undefined;
  return {
    headers,
    auth: opts.auth,
    agent: new HttpsAgent({ ...connect, keepAlive: false }),
    async fetch(url, init) {
      undiciFetch ??= import("undici").then((undici) => {
        const dispatcher = new undici.Agent({ connect });
        return (u: string, i: RequestInit) => undici.fetch(u, { ...(i as object), dispatcher }) as unknown as Promise<Response>;
      });
      return (await undiciFetch)(url, init);
    },
  };
}

// ---------------------------------------------------------------------------
// Environment variables (owner, CLI, MCP server)

/** The variable of each security field, for error messages. */
export const SECURITY_ENV = {
  "kafka.ssl.ca": "KAFKA_SSL_CA_FILE",
  "kafka.ssl.cert": "KAFKA_SSL_CERT_FILE",
  "kafka.ssl.key": "KAFKA_SSL_KEY_FILE",
  "kafka.ssl.rejectUnauthorized": "KAFKA_SSL_REJECT_UNAUTHORIZED",
  "kafka.ssl": "KAFKA_SSL",
  "kafka.sasl.mechanism": "KAFKA_SASL_MECHANISM",
  "kafka.sasl.username": "KAFKA_SASL_USERNAME",
  "kafka.sasl.password": "KAFKA_SASL_PASSWORD",
  "kafka.sasl": "KAFKA_SASL_USERNAME",
  "schemaRegistryAuth.username": "SCHEMA_REGISTRY_USERNAME",
  "schemaRegistryAuth.password": "SCHEMA_REGISTRY_PASSWORD",
  "schemaRegistryAuth": "SCHEMA_REGISTRY_USERNAME",
  "schemaRegistryTls.ca": "SCHEMA_REGISTRY_CA_FILE",
  "schemaRegistryTls": "SCHEMA_REGISTRY_CA_FILE",
} as const;

/** Every variable read by {@link securityInputFromEnv}. */
export const SECURITY_VARIABLES = [
  "KAFKA_SSL",
  "KAFKA_SSL_CA_FILE",
  "KAFKA_SSL_CERT_FILE",
  "KAFKA_SSL_KEY_FILE",
  "KAFKA_SSL_REJECT_UNAUTHORIZED",
  "KAFKA_SASL_MECHANISM",
  "KAFKA_SASL_USERNAME",
  "KAFKA_SASL_PASSWORD",
  "KAFKA_SASL_PASSWORD_FILE",
  "SCHEMA_REGISTRY_USERNAME",
  "SCHEMA_REGISTRY_PASSWORD",
  "SCHEMA_REGISTRY_PASSWORD_FILE",
  "SCHEMA_REGISTRY_CA_FILE",
] as const;

function envProblem(variable: string, message: string): WritError {
  return new WritError("config_invalid", `invalid configuration: ${variable}: ${message}`, { retriable: false, context: { field: variable } });
}

function boolVar(env: NodeJS.ProcessEnv, name: string): boolean | undefined {
  const raw = env[name];
  if (raw === undefined || raw === "") return undefined;
  if (/^(true|1|yes)$/i.test(raw)) return true;
  if (/^(false|0|no)$/i.test(raw)) return false;
  throw envProblem(name, "must be true or false");
}

/** A password from `name` or `${name}_FILE` (the file's content, one trailing newline dropped); never both. */
function secretVar(env: NodeJS.ProcessEnv, name: string): string | undefined {
  const direct = env[name];
  const file = env[`${name}_FILE`];
  const hasDirect = direct !== undefined && direct !== "";
  const hasFile = file !== undefined && file !== "";
  if (hasDirect && hasFile) throw envProblem(`${name}_FILE`, `set ${name} or ${name}_FILE, not both`);
  if (hasDirect) return direct;
  if (!hasFile) return undefined;
  let text: string;
  try {
    text = readFileSync(file, "utf8");
  } catch (err) {
    throw envProblem(`${name}_FILE`, `cannot read ${file} (${(err as NodeJS.ErrnoException).code ?? "unreadable"})`);
  }
  const value = text.replace(/\r?\n$/, "");
  if (value === "") throw envProblem(`${name}_FILE`, `${file} is empty`);
  return value;
}

/**
 * The security fields (`kafka`, `schemaRegistryAuth`, `schemaRegistryTls`) as
 * unvalidated config input from the environment: KAFKA_SSL,
 * KAFKA_SSL_CA_FILE, KAFKA_SSL_CERT_FILE, KAFKA_SSL_KEY_FILE,
 * KAFKA_SSL_REJECT_UNAUTHORIZED, KAFKA_SASL_MECHANISM (default
 * scram-sha-512), KAFKA_SASL_USERNAME, KAFKA_SASL_PASSWORD or
 * KAFKA_SASL_PASSWORD_FILE, SCHEMA_REGISTRY_USERNAME,
 * SCHEMA_REGISTRY_PASSWORD or SCHEMA_REGISTRY_PASSWORD_FILE,
 * SCHEMA_REGISTRY_CA_FILE. Contradictions and unreadable password files
 * throw here (naming the variable); the rest is validated with the config.
 */
export function securityInputFromEnv(env: NodeJS.ProcessEnv = process.env): {
  kafka?: Record<string, unknown>;
  schemaRegistryAuth?: Record<string, unknown>;
  schemaRegistryTls?: Record<string, unknown>;
} {
  const out: { kafka?: Record<string, unknown>; schemaRegistryAuth?: Record<string, unknown>; schemaRegistryTls?: Record<string, unknown> } = {};
  const set = (name: string): string | undefined => (env[name] === undefined || env[name] === "" ? undefined : env[name]);

  const sslOn = boolVar(env, "KAFKA_SSL");
  const reject = boolVar(env, "KAFKA_SSL_REJECT_UNAUTHORIZED");
  const files = { ca: set("KAFKA_SSL_CA_FILE"), cert: set("KAFKA_SSL_CERT_FILE"), key: set("KAFKA_SSL_KEY_FILE") };
  const tlsDetails = Object.values(files).some((v) => v !== undefined) || reject !== undefined;
  const kafka: Record<string, unknown> = {};
  if (tlsDetails) {
    if (sslOn === false) throw envProblem("KAFKA_SSL", "is false, but KAFKA_SSL_* settings are given");
    kafka.ssl = {
      ...(files.ca === undefined ? {} : { ca: files.ca }),
      ...(files.cert === undefined ? {} : { cert: files.cert }),
      ...(files.key === undefined ? {} : { key: files.key }),
      ...(reject === undefined ? {} : { rejectUnauthorized: reject }),
    };
  } else if (sslOn !== undefined) kafka.ssl = sslOn;

  const mechanism = set("KAFKA_SASL_MECHANISM");
  const username = set("KAFKA_SASL_USERNAME");
  const password = secretVar(env, "KAFKA_SASL_PASSWORD");
  if (mechanism !== undefined || username !== undefined || password !== undefined) {
    if (username === undefined) throw envProblem("KAFKA_SASL_USERNAME", "required with KAFKA_SASL_MECHANISM or KAFKA_SASL_PASSWORD");
    if (password === undefined) throw envProblem("KAFKA_SASL_PASSWORD", "required with KAFKA_SASL_USERNAME (or KAFKA_SASL_PASSWORD_FILE)");
    kafka.sasl = { ...(mechanism === undefined ? {} : { mechanism }), username, password };
  }
  if (Object.keys(kafka).length > 0) out.kafka = kafka;

  const registryUser = set("SCHEMA_REGISTRY_USERNAME");
  const registryPassword = secretVar(env, "SCHEMA_REGISTRY_PASSWORD");
  if (registryUser !== undefined || registryPassword !== undefined) {
    if (registryUser === undefined) throw envProblem("SCHEMA_REGISTRY_USERNAME", "required with SCHEMA_REGISTRY_PASSWORD");
    if (registryPassword === undefined) throw envProblem("SCHEMA_REGISTRY_PASSWORD", "required with SCHEMA_REGISTRY_USERNAME (or SCHEMA_REGISTRY_PASSWORD_FILE)");
    out.schemaRegistryAuth = { username: registryUser, password: registryPassword };
  }
  const registryCa = set("SCHEMA_REGISTRY_CA_FILE");
  if (registryCa !== undefined) out.schemaRegistryTls = { ca: registryCa };
  return out;
}

/** A config field path as its variable, for error messages: `KAFKA_SASL_PASSWORD (kafka.sasl.password)`. */
export function securityVariableOf(dotted: string): string | undefined {
  const key = Object.keys(SECURITY_ENV)
    .sort((a, b) => b.length - a.length)
    .find((f) => dotted === f || dotted.startsWith(`${f}.`));
  return key === undefined ? undefined : SECURITY_ENV[key as keyof typeof SECURITY_ENV];
}

/** The connection settings of a process that is not an owner (the CLI, the MCP server), validated. */
export const ConnectionSecurity = z
  .object({
    kafka: KafkaSecurity.optional(),
    ...registryFields,
  })
  .strict()
  .superRefine(checkRegistryFields);
export type ConnectionSecurity = z.infer<typeof ConnectionSecurity>;

/**
 * {@link ConnectionSecurity} from the environment and the registry URL given
 * (a flag's; default SCHEMA_REGISTRY_URL): throws a config_invalid WritError
 * naming the variable, never a secret.
 */
export function connectionSecurityFromEnv(env: NodeJS.ProcessEnv = process.env, schemaRegistryUrl: string | undefined = env.SCHEMA_REGISTRY_URL): ConnectionSecurity {
  const input = { ...securityInputFromEnv(env), ...(schemaRegistryUrl === undefined || schemaRegistryUrl === "" ? {} : { schemaRegistryUrl }) };
  const result = ConnectionSecurity.safeParse(input);
  if (result.success) return result.data;
  const problems = result.error.issues.map((i) => {
    const dotted = i.path.map(String).join(".");
    const variable = dotted === "schemaRegistryUrl" ? "SCHEMA_REGISTRY_URL" : securityVariableOf(dotted);
    return `${variable ? `${variable} (${dotted})` : dotted || "(root)"}: ${i.message}`;
  });
  throw new WritError("config_invalid", `invalid connection configuration: ${problems.join("; ")}`, { retriable: false, context: { field: problems[0]?.split(" ")[0] ?? "" } });
}
