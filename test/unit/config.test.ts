import { getHeapStatistics } from "node:v8";
import { describe, expect, it } from "vitest";
import { ClientConfig, configWarnings, parseConfig, routerConfigFromEnv } from "../../src/config.ts";
import { startRouter } from "../../src/owner/router.ts";

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

  it("WRIT_REQUIRE_AGENT_REGISTRY: an owner required to verify signatures refuses to start without a registry, naming WRIT_AGENT_REGISTRY", async () => {
    // Off by default: the demo and development run open (with a warning).
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).requireAgentRegistry).toBe(false);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REQUIRE_AGENT_REGISTRY: "false" }).requireAgentRegistry).toBe(false);
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REQUIRE_AGENT_REGISTRY: "true" })).toThrow(/WRIT_AGENT_REGISTRY \(agentRegistryPath\): required, since WRIT_REQUIRE_AGENT_REGISTRY/);
    // Set but empty is unset.
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REQUIRE_AGENT_REGISTRY: "1", WRIT_AGENT_REGISTRY: "" })).toThrow(/WRIT_AGENT_REGISTRY \(agentRegistryPath\): required/);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REQUIRE_AGENT_REGISTRY: "true", WRIT_AGENT_REGISTRY: "/etc/writ/agents.json" })).toMatchObject({ requireAgentRegistry: true, agentRegistryPath: "/etc/writ/agents.json" });
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_REQUIRE_AGENT_REGISTRY: "maybe" })).toThrow(/WRIT_REQUIRE_AGENT_REGISTRY \(requireAgentRegistry\): true or false/);
    // A config given in code is held to it too, before anything connects (this broker is never dialled).
    await expect(startRouter({ config: { brokers: ["127.0.0.1:9"], requireAgentRegistry: true }, tools: [], systems: [] })).rejects.toThrow(/WRIT_AGENT_REGISTRY \(agentRegistryPath\): required/);
  });


  it("WRIT_SIGNING_AUDIENCE: 1–128 of A-Z a-z 0-9 . _ : / -, and only with an agent registry (naming both variables)", async () => {
    const registry = { KAFKA_BROKERS: "a:1", WRIT_AGENT_REGISTRY: "/etc/writ/agents.json" };
    expect(routerConfigFromEnv(registry).signingAudience).toBeUndefined();
    expect(routerConfigFromEnv({ ...registry, WRIT_SIGNING_AUDIENCE: "acme:billing/prod-eu-1" }).signingAudience).toBe("acme:billing/prod-eu-1");
    expect(routerConfigFromEnv({ ...registry, WRIT_SIGNING_AUDIENCE: "a".repeat(128) }).signingAudience).toHaveLength(128);
    for (const bad of ["a".repeat(129), "prod eu", "prod\u001b[2J", "prod,eu", "é"]) {
      expect(() => routerConfigFromEnv({ ...registry, WRIT_SIGNING_AUDIENCE: bad }), bad).toThrow(/WRIT_SIGNING_AUDIENCE \(signingAudience\): 1–128 of A-Z a-z 0-9 \. _ : \/ -/);
    }
    // Without a registry no signature is verified, so an audience would check nothing: refused, not ignored.
    let thrown: unknown;
    try {
      routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SIGNING_AUDIENCE: "prod" });
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toMatchObject({ code: "config_invalid", context: { field: "WRIT_SIGNING_AUDIENCE" } });
    expect((thrown as Error).message).toMatch(/WRIT_SIGNING_AUDIENCE \(signingAudience\) needs an agent registry, WRIT_AGENT_REGISTRY/);
    // In code too, before anything connects (this broker is never dialled).
    await expect(startRouter({ config: { brokers: ["127.0.0.1:9"], signingAudience: "prod" }, tools: [], systems: [] })).rejects.toThrow(/WRIT_SIGNING_AUDIENCE \(signingAudience\) needs an agent registry/);
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
      "WRIT_STOP_TIMEOUT_MS",
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

  it("bounds the health endpoints' connections: a 10 s headers timeout by default, a cap per address when set", () => {
    const defaults = routerConfigFromEnv({ KAFKA_BROKERS: "a:1" });
    expect([defaults.healthHeadersTimeoutMs, defaults.healthMaxConnectionsPerAddress]).toEqual([10_000, 16]);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_HEALTH_HEADERS_TIMEOUT_MS: "2000", WRIT_HEALTH_MAX_CONNECTIONS_PER_ADDRESS: "16" })).toMatchObject({ healthHeadersTimeoutMs: 2000, healthMaxConnectionsPerAddress: 16 });
    for (const bad of ["0", "600001", "1.5", "10s"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_HEALTH_HEADERS_TIMEOUT_MS: bad }), bad).toThrow(/WRIT_HEALTH_HEADERS_TIMEOUT_MS \(healthHeadersTimeoutMs\)/);
    }
    for (const bad of ["0", "65", "many"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_HEALTH_MAX_CONNECTIONS_PER_ADDRESS: bad }), bad).toThrow(/WRIT_HEALTH_MAX_CONNECTIONS_PER_ADDRESS \(healthMaxConnectionsPerAddress\)/);
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

  it("bounds what one agent holds by leases: 15 minutes' hold (at least a second), 64 leases a partition (1 to 100,000) by default", () => {
    const defaults = routerConfigFromEnv({ KAFKA_BROKERS: "a:1" });
    expect([defaults.leaseMaxHoldMs, defaults.maxLeasesPerAgent]).toEqual([900_000, 64]);
    const set = routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEASE_MAX_HOLD_MS: "1000", WRIT_MAX_LEASES_PER_AGENT: "1" });
    expect([set.leaseMaxHoldMs, set.maxLeasesPerAgent]).toEqual([1000, 1]);
    for (const bad of ["999", "-1", "1.5", "15m"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEASE_MAX_HOLD_MS: bad }), bad).toThrow(/WRIT_LEASE_MAX_HOLD_MS \(leaseMaxHoldMs\)/);
    }
    for (const bad of ["0", "100001", "2.5", "many"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_MAX_LEASES_PER_AGENT: bad }), bad).toThrow(/WRIT_MAX_LEASES_PER_AGENT \(maxLeasesPerAgent\)/);
    }
  });

  it("warns at start, naming both, when WRIT_LEASE_MAX_HOLD_MS is below the longest lease time to live an agent may ask (600 s): one grant outlasts the hold", () => {
    expect(configWarnings(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }))).toEqual([]);
    expect(configWarnings(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEASE_MAX_HOLD_MS: "600000" }))).toEqual([]);
    const [warning, ...rest] = configWarnings(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_LEASE_MAX_HOLD_MS: "599999" }));
    expect(rest).toEqual([]);
    expect(warning).toMatch(/WRIT_LEASE_MAX_HOLD_MS \(leaseMaxHoldMs, 599999 ms\)/);
    expect(warning).toMatch(/lease\.ttlMs, up to 600000 ms/);
  });

  it("bounds writ owner's clean stop: 25 s by default (under Kubernetes' default grace period of 30 s), at least 1 ms", () => {
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).stopTimeoutMs).toBe(25_000);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_STOP_TIMEOUT_MS: "90000" }).stopTimeoutMs).toBe(90_000);
    for (const bad of ["0", "-1", "1.5", "30s"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_STOP_TIMEOUT_MS: bad }), bad).toThrow(/WRIT_STOP_TIMEOUT_MS \(stopTimeoutMs\)/);
    }
  });

  it("bounds the answer bytes an owner holds at once: a quarter of the heap limit (at most 256 MiB) by default, at least 1 MiB", () => {
    const heapQuarter = Math.floor(getHeapStatistics().heap_size_limit / 4);
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1" }).sorResponseBytesInFlight).toBe(Math.max(1024 * 1024, Math.min(256 * 1024 * 1024, heapQuarter)));
    expect(routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT: "33554432" }).sorResponseBytesInFlight).toBe(33_554_432);
    for (const bad of ["0", "1048575", "1.5", "64MiB", "-1"]) {
      expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT: bad }), bad).toThrow(/WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT \(sorResponseBytesInFlight\)/);
    }
  });

  it("says what a setting takes, and what it got, instead of zod's bare wording", () => {
    const message = (env: Record<string, string>) => {
      try {
        routerConfigFromEnv({ KAFKA_BROKERS: "a:1", ...env });
      } catch (err) {
        return (err as Error).message;
      }
      throw new Error("no error");
    };
    expect(() => routerConfigFromEnv({})).toThrow("KAFKA_BROKERS (brokers): not set: give the brokers as host:port[,…]");
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "" })).toThrow("KAFKA_BROKERS (brokers): not set");
    expect(message({ WRIT_SOR_TIMEOUT_MS: "5s" })).toBe('invalid router configuration: WRIT_SOR_TIMEOUT_MS (sorTimeoutMs): a whole number of milliseconds, got "5s"');
    expect(message({ WRIT_SOR_TIMEOUT_MS: "5.5" })).toContain("WRIT_SOR_TIMEOUT_MS (sorTimeoutMs): a whole number of milliseconds, got 5.5");
    expect(message({ WRIT_SOR_TIMEOUT_MS: "0" })).toContain("WRIT_SOR_TIMEOUT_MS (sorTimeoutMs): at least 1, got 0");
    expect(message({ WRIT_LEDGER_RETENTION_HOURS: "a day" })).toContain('WRIT_LEDGER_RETENTION_HOURS (ledgerRetentionHours): a number of hours, got "a day"');
    expect(message({ WRIT_MAX_INTENT_BYTES: "1MB" })).toContain('WRIT_MAX_INTENT_BYTES (maxIntentBytes): a whole number of bytes, got "1MB"');
    expect(message({ WRIT_HEALTH_PORT: "http" })).toContain('WRIT_HEALTH_PORT (healthPort): a port number (a whole number), got "http"');
    expect(message({ WRIT_UNKNOWN_ROUNDS: "three" })).toContain('WRIT_UNKNOWN_ROUNDS (unknownRounds): a whole number, got "three"');
    expect(message({ WRIT_TRANSACTION_PROTOCOL: "v3" })).toContain('WRIT_TRANSACTION_PROTOCOL (transactionProtocol): one of auto, v1, v2, got "v3"');
    // a long value is cut; zod's own wording is gone from every message
    expect(message({ WRIT_SOR_TIMEOUT_MS: "x".repeat(500) })).toMatch(/got "x{40}…"$/);
    for (const env of [{}, { WRIT_SOR_TIMEOUT_MS: "5s" }, { WRIT_TRANSACTION_PROTOCOL: "v3" }, { WRIT_INTENT_PARTITIONS: "-1" }, { WRIT_HEALTH_PORT: "70000" }]) {
      expect(() => routerConfigFromEnv({ ...env, ...(Object.keys(env).length > 0 ? { KAFKA_BROKERS: "a:1" } : {}) })).toThrow(/^(?!.*(Invalid input|Invalid option|Too small|Too big|received string))/);
    }
    // the same for the client's options
    expect(() => parseConfig(ClientConfig, { agentId: "a", replyTopic: "writ.replies.a" }, "client")).toThrow("brokers: not set");
    expect(() => parseConfig(ClientConfig, { brokers: "a:1", replyTopic: "writ.replies.a" }, "client")).toThrow("agentId: not set");
    expect(() => parseConfig(ClientConfig, { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", submitTimeoutMs: "30s" }, "client")).toThrow('submitTimeoutMs: a whole number of milliseconds, got "30s"');
  });

  it("never repeats a secret's value in a message", () => {
    const secret = "s3cr3t-passw0rd-value";
    const messages: string[] = [];
    for (const input of [
      { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", kafka: { sasl: { mechanism: "plain", username: "u", password: 12345 } } },
      { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", kafka: { sasl: { mechanism: secret, username: "u", password: secret } } },
      { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", schemaRegistryUrl: "http://r", schemaRegistryAuth: { username: "u", password: 7 } },
      { brokers: "a:1", agentId: "a", replyTopic: "writ.replies.a", kafka: { ssl: { key: 42, cert: 43 } } },
    ]) {
      try {
        parseConfig(ClientConfig, input, "client");
      } catch (err) {
        messages.push((err as Error).message);
      }
    }
    expect(messages).toHaveLength(4);
    for (const m of messages) {
      expect(m).not.toContain(secret);
      expect(m).not.toMatch(/got (12345|7|42)\b/);
    }
    expect(() => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", KAFKA_SASL_MECHANISM: secret, KAFKA_SASL_USERNAME: "u", KAFKA_SASL_PASSWORD: secret })).toThrow(/^(?!.*s3cr3t).*KAFKA_SASL_MECHANISM/);
  });
});
