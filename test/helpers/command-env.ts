// The environment of a `writ` command a test spawns: the caller's, less its WRIT_* variables and LOG_LEVEL, with
// the test's broker, registry and contract topics.

export interface ContractTopics {
  intents: string;
  ledger: string;
  human: string;
  dlq: string;
}

export function commandEnv(brokers: string, registry: string, topics: ContractTopics, extra: Record<string, string> = {}): NodeJS.ProcessEnv {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !k.startsWith("WRIT_") && k !== "LOG_LEVEL"));
  return {
    ...base,
    KAFKA_BROKERS: brokers,
    SCHEMA_REGISTRY_URL: registry,
    WRIT_INTENTS_TOPIC: topics.intents,
    WRIT_LEDGER_TOPIC: topics.ledger,
    WRIT_HUMAN_TOPIC: topics.human,
    WRIT_DLQ_TOPIC: topics.dlq,
    ...extra,
  };
}
