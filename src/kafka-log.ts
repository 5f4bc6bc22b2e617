import { logLevel, type logCreator } from "kafkajs";
import { componentLogger, type Logger } from "./logger.ts";

/** Routes kafkajs's own logs into pino, as structured fields. */
export function kafkaLogCreator(root: Logger): logCreator {
  return () =>
    ({ namespace, level, log }) => {
      const { message, ...extra } = log;
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
