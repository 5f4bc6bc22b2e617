// The environment of the fault suite's owner processes (test/faults/fault-owner.ts):
// its own topics and group, the suite's short timeouts, and the ablation control.
import type { Ablation } from "./options.ts";

/** Owners' session timeout: short, so that a killed owner's partitions move on within seconds. */
export const SESSION_TIMEOUT_MS = 6000;

export function faultOwnerEnv(opts: {
  brokers: string[];
  registryUrl: string | undefined;
  recordsUrl: string;
  /** Suffix of the group and topics. */
  id: string;
  topics: { intents: string; ledger: string; human: string; dlq: string };
  replicationFactor: number;
  ablate: Ablation | null;
  /** Probability of the PATCH→commit crash point (default: WRIT_FAULT_CRASH_AFTER_PATCH, else 0.004). */
  crashAfterPatch?: string;
}): NodeJS.ProcessEnv {
  const { topics } = opts;
  return {
    ...process.env,
    KAFKA_BROKERS: opts.brokers.join(","),
    ...(opts.registryUrl ? { SCHEMA_REGISTRY_URL: opts.registryUrl } : {}),
    RECORDS_URL: opts.recordsUrl,
    WRIT_GROUP_ID: `writ.owners.${opts.id}`,
    WRIT_INTENTS_TOPIC: topics.intents,
    WRIT_LEDGER_TOPIC: topics.ledger,
    WRIT_HUMAN_TOPIC: topics.human,
    WRIT_DLQ_TOPIC: topics.dlq,
    WRIT_INTENT_PARTITIONS: "6",
    WRIT_REPLICATION_FACTOR: String(opts.replicationFactor),
    WRIT_SOR_TIMEOUT_MS: "1000",
    WRIT_SESSION_TIMEOUT_MS: String(SESSION_TIMEOUT_MS),
    WRIT_RESTORE_TIMEOUT_MS: "60000",
    WRIT_TRANSACTION_TIMEOUT_MS: "30000",
    WRIT_HANG_HEAL_AFTER_MS: "5000",
    WRIT_LSO_CHECK_INTERVAL_MS: "1000",
    WRIT_OUTAGE_BACKOFF_MAX_MS: "2000",
    WRIT_FAULT_CRASH_AFTER_PATCH: opts.crashAfterPatch ?? process.env.WRIT_FAULT_CRASH_AFTER_PATCH ?? "0.004",
    ...(opts.ablate ? { WRIT_FAULT_ABLATE: opts.ablate } : {}),
    LOG_LEVEL: "info",
  };
}

/** The fault suite's topics for a run id. */
export function faultTopics(id: string): { intents: string; ledger: string; human: string; dlq: string } {
  return { intents: `writ.intents.${id}`, ledger: `writ.ledger.${id}`, human: `writ.human.${id}`, dlq: `writ.dlq.${id}` };
}
