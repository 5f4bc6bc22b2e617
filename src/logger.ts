import { pino, type Logger } from "pino";

export type { Logger };

/**
 * Paths pino blanks out: credentials and anything a tool marks secret.
 * Intent params and deltas are never logged whole.
 */
export const REDACT_PATHS = [
  "headers.authorization",
  "headers.Authorization",
  "*.headers.authorization",
  "*.headers.Authorization",
  "*.password",
  "*.apiKey",
  "*.token",
  "*.secret",
  "sasl",
  "*.sasl",
  // secure transport (src/security/transport.ts) and the other secrets writ holds: SASL and registry
  // passwords, TLS keys and their passphrases, the MCP bearer token, an agent's signing key. Values that
  // name them at the top of a log call, one level down, or under a config object (`{ config: { kafka } }`).
  "password",
  "token",
  "secret",
  "apiKey",
  "passphrase",
  "*.passphrase",
  "privateKey",
  "*.privateKey",
  "signer",
  "*.signer",
  "authorization",
  "*.authorization",
  "kafka.sasl",
  "*.kafka.sasl",
  "kafka.ssl.key",
  "*.kafka.ssl.key",
  "schemaRegistryAuth",
  "*.schemaRegistryAuth",
  "schemaRegistryTls.key",
  "*.schemaRegistryTls.key",
];

/**
 * The root logger: JSON lines on stderr, so stdout stays free for a
 * program's own output (the demo's account and its closing JSON line).
 */
export function createLogger(opts: { level?: string; name?: string } = {}): Logger {
  return pino(
    { name: opts.name ?? "writ", level: opts.level ?? process.env.LOG_LEVEL ?? "info", redact: REDACT_PATHS },
    pino.destination(2),
  );
}
