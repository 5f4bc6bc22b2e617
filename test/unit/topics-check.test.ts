// `writ topics check`'s rule (judge in src/cli/topics.ts) on settings that let Kafka lose what it acknowledged or
// delete ledger entries inside the dedupe window; the brokers' side is in test/integration/cli.test.ts.
import { describe, expect, it } from "vitest";
import { judge, type TopicState } from "../../src/cli/topics.ts";
import { routerConfigFromEnv } from "../../src/config.ts";
import { routerTopics } from "../../src/topics.ts";

const config = routerConfigFromEnv({ KAFKA_BROKERS: "127.0.0.1:9", WRIT_REPLICATION_FACTOR: "3", WRIT_INTENT_PARTITIONS: "3" });
const good: Record<string, string> = { "min.insync.replicas": "2", "unclean.leader.election.enable": "false", "retention.ms": "604800000", "retention.bytes": "-1" };
const ledgerGood = { ...good, "cleanup.policy": "compact", "delete.retention.ms": "86400000", "min.compaction.lag.ms": "3600000" };

function states(over: Partial<Record<TopicState["role"], Record<string, string>>> = {}): TopicState[] {
  return (["intents", "ledger", "human", "dlq"] as const).map((role) => ({
    topic: config.topics[role],
    role,
    exists: true,
    partitions: role === "intents" || role === "ledger" ? 3 : 1,
    replicationFactor: 3,
    configs: { ...(role === "ledger" ? ledgerGood : good), ...over[role] },
  }));
}

describe("writ topics check: settings that lose acknowledged records", () => {
  it("passes the production settings (replication 3, min.insync.replicas 2, clean elections, a compacted ledger)", () => {
    expect(judge(states(), config, routerTopics(config))).toEqual({ problems: [], warnings: [] });
  });

  it("fails on min.insync.replicas 1 at replication factor 3, naming the topic and the fix", () => {
    const { problems } = judge(states({ ledger: { "min.insync.replicas": "1" } }), config, routerTopics(config));
    expect(problems).toEqual([expect.stringMatching(/^writ\.ledger has min\.insync\.replicas=1 with replication factor 3: .*--add-config min\.insync\.replicas=2\)$/)]);
  });

  it("fails on unclean.leader.election.enable=true on any contract topic", () => {
    const { problems } = judge(states({ intents: { "unclean.leader.election.enable": "true" } }), config, routerTopics(config));
    expect(problems).toEqual([expect.stringMatching(/^writ\.intents has unclean\.leader\.election\.enable=true: .*unclean\.leader\.election\.enable=false\)$/)]);
  });

  it("fails on a ledger compacted and deleted by a retention shorter than the window, or by size; warns on a longer one", () => {
    const short = judge(states({ ledger: { "cleanup.policy": "compact,delete", "retention.ms": "3600000" } }), config, routerTopics(config));
    expect(short.problems).toEqual([expect.stringMatching(/^writ\.ledger has cleanup\.policy=compact,delete and retention\.ms=3600000: Kafka deletes ledger entries inside the 24 h window/)]);
    const bySize = judge(states({ ledger: { "cleanup.policy": "compact,delete", "retention.bytes": "1073741824" } }), config, routerTopics(config));
    expect(bySize.problems).toEqual([expect.stringContaining("retention.bytes=1073741824")]);
    const long = judge(states({ ledger: { "cleanup.policy": "compact,delete" } }), config, routerTopics(config));
    expect(long.problems).toEqual([]);
    expect(long.warnings).toEqual([expect.stringContaining("retention also deletes ledger entries by age")]);
  });

  it("reads a config the broker left empty as unknown, not as 0", () => {
    expect(judge(states({ ledger: { "min.insync.replicas": "", "cleanup.policy": "compact,delete", "retention.ms": "" } }), config, routerTopics(config)).problems).toEqual([]);
  });

  it("writ topics ensure creates topics that pass it: min.insync.replicas 2 at replication factor 3 (whatever the brokers' default), none at 1", () => {
    for (const t of routerTopics(config)) expect(t.configEntries, t.topic).toContainEqual({ name: "min.insync.replicas", value: "2" });
    const single = routerConfigFromEnv({ KAFKA_BROKERS: "127.0.0.1:9" });
    for (const t of routerTopics(single)) expect(t.configEntries?.find((e) => e.name === "min.insync.replicas"), t.topic).toBeUndefined();
  });
});
