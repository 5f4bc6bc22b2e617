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
