import { describe, expect, it } from "vitest";
import { ClientConfig, parseConfig, routerConfigFromEnv } from "../../src/config.ts";

describe("routerConfigFromEnv", () => {
  it("applies defaults from the schema", () => {
    const c = routerConfigFromEnv({ KAFKA_BROKERS: "127.0.0.1:9092" });
    expect(c.topics).toEqual({ intents: "writ.intents", ledger: "writ.ledger", human: "writ.human", dlq: "writ.dlq" });
    expect(c.intentPartitions).toBe(12);
    expect(c.ledgerRetentionHours).toBe(24);
    expect(c.replyTopicPrefix).toBe("writ.replies.");
  });

  it("names the environment variable that is wrong", () => {
    expect(() => routerConfigFromEnv({})).toThrow(/KAFKA_BROKERS/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "localhost" })).toThrow(/KAFKA_BROKERS \(brokers\.0\): host:port/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_INTENT_PARTITIONS: "many" })).toThrow(/WRIT_INTENT_PARTITIONS/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", SCHEMA_REGISTRY_URL: "not a url" })).toThrow(/SCHEMA_REGISTRY_URL/);
  });

  it("bounds how long pending entries alone hold a transaction open by the hang watch's patience", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).openPendingMaxMs).toBe(250);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_OPEN_PENDING_MAX_MS: "1500" }).openPendingMaxMs).toBe(1500);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_OPEN_PENDING_MAX_MS: "10000" })).toThrow(/WRIT_OPEN_PENDING_MAX_MS \(openPendingMaxMs\): must be below hangHealAfterMs/);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_OPEN_PENDING_MAX_MS: "10000", WRIT_HANG_HEAL_AFTER_MS: "20000" }).openPendingMaxMs).toBe(10_000);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_OPEN_PENDING_MAX_MS: "-1" })).toThrow(/WRIT_OPEN_PENDING_MAX_MS/);
  });

  it("bounds the ledger retention window by the compaction lag and by dates that exist", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEDGER_RETENTION_HOURS: "1" }).ledgerRetentionHours).toBe(1);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEDGER_RETENTION_HOURS: "87600" }).ledgerRetentionHours).toBe(87_600);
    // now - 1e10 h is no date: every entry would compare older than the cutoff and be tombstoned.
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEDGER_RETENTION_HOURS: "1e10" })).toThrow(/WRIT_LEDGER_RETENTION_HOURS \(ledgerRetentionHours\)/);
    // retention.ms "1": tombstones gone before a restore reads them.
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEDGER_RETENTION_HOURS: "0.0000001" })).toThrow(/WRIT_LEDGER_RETENTION_HOURS/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEDGER_RETENTION_HOURS: "0.5" })).toThrow(/WRIT_LEDGER_RETENTION_HOURS/);
  });

  it("refuses durations past Node's longest timer, which would fire after 1 ms", () => {
    for (const variable of [
      "WRIT_SOR_TIMEOUT_MS",
      "WRIT_RESTORE_TIMEOUT_MS",
      "WRIT_OUTAGE_BACKOFF_INITIAL_MS",
      "WRIT_OUTAGE_BACKOFF_MAX_MS",
      "WRIT_LSO_CHECK_INTERVAL_MS",
      "WRIT_HANG_HEAL_AFTER_MS",
      "WRIT_TRANSACTION_TIMEOUT_MS",
      "WRIT_SESSION_TIMEOUT_MS",
    ]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", [variable]: "3000000000" }), variable).toThrow(new RegExp(`${variable} \\(\\w+\\): at most 2147483647`));
    }
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_TIMEOUT_MS: "2147483647" }).sorTimeoutMs).toBe(2_147_483_647);
    expect(() => parseConfig(ClientConfig, { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", submitTimeoutMs: 3_000_000_000 }, "client")).toThrow(/submitTimeoutMs: at most 2147483647/);
  });

  it("a client's reply topic must start with the owners' reply prefix: they answer nowhere else (it would only time out)", () => {
    const client = (input: Record<string, unknown>) => () => parseConfig(ClientConfig, { brokers: "a:1", agentId: "a", ...input }, "client");
    expect(client({ replyTopic: "billing-replies" })).toThrow(/replyTopic: billing-replies does not start with the owners' reply prefix writ\.replies\./);
    expect(client({ replyTopic: "writ.replies." })).toThrow(/replyTopic: /);
    expect(client({ replyTopic: "acme.replies-a", replyTopicPrefix: "acme.replies-" })).not.toThrow();
    expect(client({ replyTopic: "writ.replies.a" })).not.toThrow();
  });

  it("refuses an instance id that would break the x-writ-owner header of every write", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_INSTANCE_ID: "owner-a.1" }).instanceId).toBe("owner-a.1");
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).instanceId).toMatch(/^owner-\d+-[a-z0-9]+$/);
    for (const id of ["owner\r\nx-evil: 1", "owner-€", "owner a", "x".repeat(129)]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_INSTANCE_ID: id }), id).toThrow(/WRIT_INSTANCE_ID \(instanceId\)/);
    }
  });

  it("reads numbers in decimal only, naming the variable", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_HEALTH_PORT: "8080", WRIT_LEDGER_RETENTION_HOURS: "1.5" })).toMatchObject({ healthPort: 8080, ledgerRetentionHours: 1.5 });
    // Number("   ") is 0 and Number("0x50") is 80.
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_COMMIT_LINGER_MS: "   " })).toThrow(/WRIT_COMMIT_LINGER_MS \(commitLingerMs\)/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_HEALTH_PORT: "0x50" })).toThrow(/WRIT_HEALTH_PORT \(healthPort\)/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_INTENT_PARTITIONS: "0b11" })).toThrow(/WRIT_INTENT_PARTITIONS/);
  });

  it("refuses a reply topic prefix outside the topic-name characters and ids with control characters", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REPLY_TOPIC_PREFIX: "acme.replies-" }).replyTopicPrefix).toBe("acme.replies-");
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REPLY_TOPIC_PREFIX: "bad topic/" })).toThrow(/WRIT_REPLY_TOPIC_PREFIX \(replyTopicPrefix\)/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_GROUP_ID: "owners\n" })).toThrow(/WRIT_GROUP_ID \(groupId\)/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_CLIENT_ID: "owner\x1b[2J" })).toThrow(/WRIT_CLIENT_ID \(clientId\)/);
  });

  it("takes the failed transactions in a row after which a partition is reported as not moving", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).stuckAfterFailures).toBe(5);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_STUCK_AFTER_FAILURES: "2" }).stuckAfterFailures).toBe(2);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_STUCK_AFTER_FAILURES: "0" })).toThrow(/WRIT_STUCK_AFTER_FAILURES \(stuckAfterFailures\)/);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_STUCK_AFTER_FAILURES: "1.5" })).toThrow(/WRIT_STUCK_AFTER_FAILURES/);
  });

  it("bounds registry lookups of unseen schema ids: 100 a second by default, 1 to 10,000", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).registryLookupsPerSecond).toBe(100);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REGISTRY_LOOKUPS_PER_S: "500" }).registryLookupsPerSecond).toBe(500);
    for (const bad of ["0", "-1", "10001", "2.5", "fast"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REGISTRY_LOOKUPS_PER_S: bad }), bad).toThrow(/WRIT_REGISTRY_LOOKUPS_PER_S \(registryLookupsPerSecond\)/);
    }
  });

  it("caps the wait a system of record's Retry-After imposes: 60 s by default, 0 (ignored) to an hour", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).sorRetryAfterMaxMs).toBe(60_000);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_RETRY_AFTER_MAX_MS: "0" }).sorRetryAfterMaxMs).toBe(0);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_RETRY_AFTER_MAX_MS: "3600000" }).sorRetryAfterMaxMs).toBe(3_600_000);
    for (const bad of ["-1", "3600001", "1.5", "1m"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_RETRY_AFTER_MAX_MS: bad }), bad).toThrow(/WRIT_SOR_RETRY_AFTER_MAX_MS \(sorRetryAfterMaxMs\)/);
    }
  });
});
