/** The MCP server's settings (producers/mcp-main.ts), by the variable each comes from. */
export const MCP_ENV = {
  brokers: "KAFKA_BROKERS",
  schemaRegistryUrl: "SCHEMA_REGISTRY_URL",
  intentsTopic: "WRIT_INTENTS_TOPIC",
  agentId: "WRIT_MCP_AGENT_ID",
  replyTopic: "WRIT_MCP_REPLY_TOPIC",
  replyTopicPrefix: "WRIT_REPLY_TOPIC_PREFIX",
  submitTimeoutMs: "WRIT_SUBMIT_TIMEOUT_MS",
  maxIntentBytes: "WRIT_MAX_INTENT_BYTES",
  maxJsonDepth: "WRIT_MAX_JSON_DEPTH",
  replicationFactor: "WRIT_REPLICATION_FACTOR",
  specsModule: "WRIT_TOOL_SPECS_MODULE",
  runId: "WRIT_RUN_ID",
  port: "WRIT_MCP_PORT",
  token: "WRIT_MCP_TOKEN",
  maxSessions: "WRIT_MCP_MAX_SESSIONS",
  sessionIdleMs: "WRIT_MCP_SESSION_IDLE_MS",
} as const;
