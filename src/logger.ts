import { pino, type Logger } from "pino";
import { WritError } from "./errors.ts";
import { printable } from "./printable.ts";

export type { Logger };

/** What `LOG_LEVEL` takes: pino's levels, and `silent`. */
export const LOG_LEVELS: readonly string[] = [...Object.keys(pino.levels.values), "silent"];

/**
 * The level `LOG_LEVEL` names (in any case), or `fallback` when it is unset or empty. Any other value is a `config_invalid`
 * error naming the variable: pino would throw "default level:verbose must be included in custom levels" from the
 * first logger made, a stack trace (and from an owner exit 1, which a supervisor restarts) instead of exit 2.
 */
export function logLevelFromEnv(fallback: string, env: NodeJS.ProcessEnv = process.env): string {
  const raw = env.LOG_LEVEL;
  if (raw === undefined || raw.trim() === "") return fallback;
  // Any case, as pino takes it (`INFO`, a shared deployment's habit), and surrounding blanks.
  const level = raw.trim().toLowerCase();
  if (LOG_LEVELS.includes(level)) return level;
  throw new WritError("config_invalid", `invalid configuration: LOG_LEVEL: one of ${LOG_LEVELS.join(", ")}, got "${printable(raw.slice(0, 40))}"`, {
    retriable: false,
    context: { field: "LOG_LEVEL" },
  });
}

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
 * `sync`: each line is written before the call returns, for a process's last
 * words (a line logged just before it ends itself by a signal would otherwise
 * be lost); the default writes in the background.
 * Its level: `opts.level`, else `LOG_LEVEL`, else info.
 */
export function createLogger(opts: { level?: string; name?: string; sync?: boolean } = {}): Logger {
  return pino(
    { name: opts.name ?? "writ", level: opts.level ?? logLevelFromEnv("info"), redact: REDACT_PATHS },
    opts.sync ? pino.destination({ dest: 2, sync: true }) : pino.destination(2),
  );
}

/** On a logger made by {@link componentLogger}: the logger it was made from and its bindings, `component` aside. */
const MADE_FROM = Symbol("writ.componentLogger");
type Made = Logger & { [MADE_FROM]?: { base: Logger; bindings: Record<string, unknown> } };

/**
 * A child logger for `component`, with `bindings`, whose lines carry one `component`: this one, the most
 * specific. pino appends a child's bindings to its parent's, so `parent.child({ component })` under a logger
 * that has a component (the router's, under which partition owners, the hang watch and kafkajs log) writes the
 * key twice, which strict JSON parsers refuse. A component logger made here remembers what it was made from;
 * a component made under it, or under a plain child of it, is made from that again, with every binding in
 * between but the earlier `component`. (A `component` that a logger of the caller's binds itself stays.)
 */
export function componentLogger(parent: Logger, component: string, bindings: Record<string, unknown> = {}): Logger {
  let owner: Made | null = parent as Made;
  while (owner !== null && !Object.hasOwn(owner, MADE_FROM)) owner = Object.getPrototypeOf(owner) as Made | null;
  let base = parent;
  let carried: Record<string, unknown> = {};
  if (owner !== null) {
    const made = owner[MADE_FROM]!;
    base = made.base;
    carried = { ...made.bindings };
    if (owner !== parent) {
      // A plain child in between (parent.child({...})): its own bindings come along.
      const theirs = owner.bindings();
      for (const [k, v] of Object.entries(parent.bindings())) if (k !== "component" && JSON.stringify(theirs[k]) !== JSON.stringify(v)) carried[k] = v;
    }
  }
  const all = { ...carried, ...bindings };
  const log = base.child({ ...all, component }) as Made;
  Object.defineProperty(log, MADE_FROM, { value: { base, bindings: all }, enumerable: false });
  return log;
}
