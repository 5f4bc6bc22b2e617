import { logLevel, type logCreator } from "kafkajs";
import { componentLogger, type Logger } from "./logger.ts";

/**
 * A kafkajs log entry's message as text. kafkajs 2.2.4 passes an Error itself as the message where a broker's
 * connect fails for good (BrokerPool, `logger.error(e, …)`: an authentication error on a broker other than the
 * seed, say); a handler that took it for a string threw inside kafkajs's catch, so the client failed with that
 * TypeError instead of the broker's error.
 */
export function kafkaLogText(message: unknown): string {
  if (typeof message === "string") return message;
  if (message instanceof Error) return `${message.name}: ${message.message}`;
  return String(message);
}

/** Routes kafkajs's own logs into pino, as structured fields. */
export function kafkaLogCreator(root: Logger): logCreator {
  return () =>
    ({ namespace, level, log }) => {
      const { message: raw, ...extra } = log;
      const message = kafkaLogText(raw);
      const child = componentLogger(root, "kafkajs", { namespace });
      // kafkajs logs every retriable broker answer (coordinator loading, concurrent transactions) as an error
      // before it retries; those are not ours to alarm on.
      if (namespace === "Connection" && message.startsWith("Response ")) child.debug(extra, message);
      // Finite send retries: writ's exactly-once rests on the ledger and fencing, not on endless producer retries.
      else if (message.startsWith("Limiting retries for the idempotent producer")) child.debug(extra, message);
      // A failure kafkajs is about to retry (it says so with retryCount): CONCURRENT_TRANSACTIONS right after a
      // commit (kafkajs #304), a coordinator still loading, a leader election. What does not heal surfaces
      // through writ's own error handling.
      else if (typeof (extra as { retryCount?: unknown }).retryCount === "number") child.debug(extra, message);
      else if (level === logLevel.ERROR) child.error(extra, message);
      else if (level === logLevel.WARN) child.warn(extra, message);
      else if (level === logLevel.INFO) child.info(extra, message);
      else child.debug(extra, message);
    };
}

/** One kafkajs log entry as a tap sees it, of any level, before kafkaLogCreator demotes or drops it. */
export interface KafkaLogEntry {
  namespace: string;
  level: logLevel;
  message: string;
  /** The entry's fields: `broker`, `error`, `retryCount`, … */
  extra: Record<string, unknown>;
  /** Which of a router's kafkajs clients logged it, where it has more than one: `owner-groups-watch`. */
  client?: string;
}

export type KafkaLogTap = (entry: KafkaLogEntry) => void;

/**
 * The `client` of a router's entries from its minute's watch for other groups of owners (router.ts), a client of
 * its own with the router's clientId and `-owner-groups-watch`: its ListGroups asks every broker in the metadata.
 */
export const OWNER_GROUPS_WATCH = "owner-groups-watch";

/**
 * kafkajs's `logLevel` and `logCreator` for a client that logs to `root` at `level`. With a `tap`, every entry of
 * every level goes to it too (writ verify records connection errors with it, and kafkajs says a broker closed a
 * connection only at debug level), named `client` where given; only those within `level` go on to `root`.
 */
export function kafkaLogging(root: Logger, level: logLevel, tap?: KafkaLogTap, client?: string): { logLevel: logLevel; logCreator: logCreator } {
  if (tap === undefined) return { logLevel: level, logCreator: kafkaLogCreator(root) };
  const creator = kafkaLogCreator(root);
  return {
    logLevel: logLevel.DEBUG,
    logCreator: (given) => {
      const log = creator(given);
      return (entry) => {
        const { message: raw, ...extra } = entry.log;
        const message = kafkaLogText(raw);
        // A tap that throws must not reach kafkajs, which logs from its connection and retry paths.
        try {
          tap({ namespace: entry.namespace, level: entry.level, message, extra, ...(client === undefined ? {} : { client }) });
        } catch {
          // the entry is still logged below
        }
        if (entry.level <= level) log(entry);
      };
    },
  };
}
