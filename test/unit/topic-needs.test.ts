// What writ's topics must take (src/topics.ts): the ledger's largest entry stays within WRIT_MAX_INTENT_BYTES and
// LEDGER_ENTRY_FIELDS_BYTES, measured as the record the owner sends (the entry's JSON, the registry's framing, the
// key, as a batch of one), with every bounded field at its longest and every character escaped.
import { describe, expect, it } from "vitest";
import { BATCH_OVERHEAD_BYTES, recordBytes } from "../../src/owner/produce-limits.ts";
import { LedgerIntentEntry } from "../../src/schemas/ledger-entry.ts";
import { routerConfigFromEnv } from "../../src/config.ts";
import { batchLimitProblem, KAFKA_DEFAULT_MAX_MESSAGE_BYTES, LEDGER_ENTRY_FIELDS_BYTES, routerTopics, topicNeeds } from "../../src/topics.ts";

/** `n` characters that JSON escapes to six bytes each. */
const escaped = (n: number) => "\u0001".repeat(n);

describe("topicNeeds: the ledger's largest entry", () => {
  it("an entry with its fields at their longest and params of WRIT_MAX_INTENT_BYTES fits what the ledger is checked to take", () => {
    const maxIntentBytes = 262_144;
    const version = escaped(256);
    // Params whose JSON is maxIntentBytes: all that an intent's value may take.
    const params = { p: "x".repeat(maxIntentBytes - 8) };
    expect(Buffer.byteLength(JSON.stringify(params))).toBe(maxIntentBytes);
    const at = new Date(0).toISOString();
    const entry = LedgerIntentEntry.parse({
      kind: "intent",
      intentKey: "f".repeat(64),
      intentId: escaped(128),
      status: "done",
      entity: { type: `a${"b".repeat(63)}`, id: escaped(256) },
      tool: escaped(128),
      agentId: escaped(128),
      fingerprint: "f".repeat(64),
      attempts: Array.from({ length: 16 }, () => ({ baseVersion: version, deltaFingerprint: "f".repeat(64) })),
      cycles: 1_000_000,
      outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: escaped(2000), escalationId: escaped(36), at, mayHaveWritten: true },
      replyTo: escaped(249),
      updatedAt: at,
      params,
      undoOf: "f".repeat(64),
    });
    const value = Buffer.concat([Buffer.alloc(5), Buffer.from(JSON.stringify(entry))]);
    const bytes = recordBytes({ topic: "writ.ledger", key: `__lease__:${"t".repeat(64)}:${"i".repeat(256)}`, value }) + BATCH_OVERHEAD_BYTES;
    expect(bytes).toBeLessThanOrEqual(topicNeeds({ maxIntentBytes, maxMessageBytes: 1_000_000 }).ledger);
    expect(bytes - maxIntentBytes).toBeLessThan(LEDGER_ENTRY_FIELDS_BYTES);
  });

  it("names a topic below its need with its limit, the need and the fix; none at or above it", () => {
    const need = topicNeeds({ maxIntentBytes: 262_144, maxMessageBytes: 1_000_000 });
    expect(need).toEqual({ intents: 1_000_000, ledger: 327_680, human: 1_000_000, dlq: 1_000_000 });
    expect(batchLimitProblem("writ.ledger", "ledger", { bytes: 327_680, config: "max.message.bytes", overridden: true }, need.ledger)).toBeNull();
    expect(batchLimitProblem("writ.ledger", "ledger", { bytes: 327_679, config: "max.message.bytes", overridden: false }, need.ledger)).toBe(
      "writ.ledger (ledger) takes records of at most 327679 bytes (max.message.bytes=327679, the brokers' default: the topic does not set it); writ needs 327680, " +
        "its largest entry (WRIT_MAX_INTENT_BYTES of params and the entry's fields): an entry the broker refuses fails its partition's transactions, and the partition stops " +
        "(kafka-configs --alter --entity-type topics --entity-name writ.ledger --add-config max.message.bytes=327680)",
    );
  });
});

describe("routerTopics: topics writ creates take what writ writes there", () => {
  const env = { KAFKA_BROKERS: "127.0.0.1:9092", WRIT_TOOLS_MODULE: "./tools.ts" };
  const sizeOf = (t: { configEntries?: { name: string; value: string }[] }) => t.configEntries?.find((e) => e.name === "max.message.bytes")?.value;

  it("sets max.message.bytes where writ needs more than Kafka's default, to what the check then asks", () => {
    const config = routerConfigFromEnv({ ...env, WRIT_MAX_INTENT_BYTES: "2000000", WRIT_MAX_MESSAGE_BYTES: "4500000" });
    const needs = topicNeeds(config);
    const byTopic = new Map(routerTopics(config).map((t) => [t.topic, t]));
    expect(sizeOf(byTopic.get(config.topics.ledger)!)).toBe(String(needs.ledger));
    expect(sizeOf(byTopic.get(config.topics.intents)!)).toBe(String(needs.intents));
    expect(sizeOf(byTopic.get(config.topics.human)!)).toBe(String(needs.human));
    expect(sizeOf(byTopic.get(config.topics.dlq)!)).toBe(String(needs.dlq));
    // The ledger keeps its compaction settings beside it.
    expect(byTopic.get(config.topics.ledger)!.configEntries!.map((e) => e.name)).toContain("cleanup.policy");
  });

  it("leaves Kafka's default where it is enough (the defaults)", () => {
    const config = routerConfigFromEnv(env);
    for (const t of routerTopics(config)) expect(sizeOf(t)).toBeUndefined();
    expect(Math.max(...Object.values(topicNeeds(config)))).toBeLessThanOrEqual(KAFKA_DEFAULT_MAX_MESSAGE_BYTES);
  });
});
