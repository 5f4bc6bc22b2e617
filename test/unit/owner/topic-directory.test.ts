// The topic directory's reading of what a topic takes (src/owner/topic-directory.ts), over a fake admin: a topic
// found has its max.message.bytes and segment.bytes read into the encoder's limits, once per TTL, concurrent
// questions sharing one read; a read that fails (no DESCRIBE_CONFIGS) never fails the question. At the broker:
// oversize-records.test.ts.
import type { Admin } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { type OutRecord, ProduceLimits } from "../../../src/owner/produce-limits.ts";
import { TopicDirectory } from "../../../src/owner/topic-directory.ts";

/** An admin whose topics have these configs (a function: it throws, as a denied DescribeConfigs does). */
function adminWith(configs: Record<string, Record<string, string> | (() => never)>) {
  const reads: string[] = [];
  const admin = {
    listTopics: async () => Object.keys(configs),
    describeConfigs: async ({ resources }: { resources: { name: string; configNames: string[] }[] }) => {
      const name = resources[0]!.name;
      reads.push(name);
      const c = configs[name]!;
      if (typeof c === "function") c();
      return { resources: [{ resourceName: name, configEntries: Object.entries(c).filter(([k]) => resources[0]!.configNames.includes(k)).map(([configName, configValue]) => ({ configName, configValue })) }] };
    },
  };
  return { admin: admin as unknown as Admin, reads };
}

describe("TopicDirectory: what a topic takes", () => {
  it("reads a found topic's max.message.bytes and segment.bytes (the least) into the limits, once per TTL, concurrent questions sharing one read", async () => {
    const { admin, reads } = adminWith({ "writ.replies.small": { "max.message.bytes": "4000", "segment.bytes": "1073741824", "retention.ms": "1" }, "writ.replies.tiny-segments": { "max.message.bytes": "1048588", "segment.bytes": "900" } });
    const limits = new ProduceLimits(1_000_000);
    const directory = new TopicDirectory(admin, { limits, positiveTtlMs: 60_000 });

    expect(await Promise.all([directory.exists("writ.replies.small"), directory.exists("writ.replies.small"), directory.exists("writ.replies.tiny-segments")])).toEqual([true, true, true]);
    expect(await directory.exists("writ.replies.small")).toBe(true);
    expect(await directory.exists("writ.replies.missing")).toBe(false);

    expect(limits.of("writ.replies.small")).toBe(4000);
    expect(limits.of("writ.replies.tiny-segments")).toBe(900);
    expect(reads.sort()).toEqual(["writ.replies.small", "writ.replies.tiny-segments"]);
  });

  // Every rewind and failed open of a partition calls forget(): it cleared the configs too, and each reopening read
  // every reply topic's configs again. What they were cleared for: a topic whose limit shrank after it was read.
  it("a partition's reopening (forget) reads no topic's configs again; a size refusal of a round with a record of a topic reads that topic's again, and a topic deleted and created again is read anew", async () => {
    const a = "writ.replies.a";
    const b = "writ.replies.b";
    const configs: Record<string, Record<string, string>> = { [a]: { "max.message.bytes": "4000" }, [b]: { "max.message.bytes": "5000" } };
    const { admin, reads } = adminWith(configs);
    const limits = new ProduceLimits(1_000_000);
    const directory = new TopicDirectory(admin, { limits, positiveTtlMs: 60_000 });
    const ask = async () => [await directory.exists(a), await directory.exists(b)];

    expect(await ask()).toEqual([true, true]);
    directory.forget();
    expect(await ask()).toEqual([true, true]);
    expect(reads).toEqual([a, b]);

    // a's limit shrinks after it was read: a transaction's round with a reply to it (and a ledger entry) is refused.
    configs[a]!["max.message.bytes"] = "3000";
    const refusing = { send: async () => Promise.reject(Object.assign(new Error("too large"), { type: "MESSAGE_TOO_LARGE" })) };
    const round: OutRecord[] = [
      { topic: "writ.ledger", key: "k", value: Buffer.alloc(100) },
      { topic: a, key: "k", value: Buffer.alloc(3_500) },
    ];
    await expect(limits.send(refusing, round, 0)).rejects.toThrow("too large");
    directory.forget();
    expect(await ask()).toEqual([true, true]);
    expect(reads).toEqual([a, b, a]);
    expect(limits.of(a)).toBe(3000);
    directory.forget();
    await ask();
    expect(reads).toEqual([a, b, a]);

    // b deleted (found missing after a failed transaction), then created again with a smaller limit.
    const gone = configs[b]!;
    delete configs[b];
    directory.forget();
    expect(await directory.exists(b)).toBe(false);
    configs[b] = { ...gone, "max.message.bytes": "1000" };
    expect(await directory.exists(b)).toBe(true);
    expect(reads).toEqual([a, b, a, b]);
    expect(limits.of(b)).toBe(1000);
  });

  it("a topic whose configs cannot be read exists all the same; the denial is logged once, and the topic is written as if it took all", async () => {
    const denied = () => {
      throw Object.assign(new Error("Not authorized to access topics: [Topic authorization failed]"), { type: "TOPIC_AUTHORIZATION_FAILED" });
    };
    const { admin } = adminWith({ "writ.replies.a": denied, "writ.replies.b": denied });
    const lines: string[] = [];
    const log = pino({ level: "debug" }, { write: (line: string) => void lines.push(line) });
    const limits = new ProduceLimits(1_000_000);
    const directory = new TopicDirectory(admin, { limits, log });

    expect(await directory.exists("writ.replies.a")).toBe(true);
    expect(await directory.exists("writ.replies.b")).toBe(true);

    expect(limits.of("writ.replies.a")).toBe(1_000_000);
    expect(lines.filter((l) => l.includes("DESCRIBE_CONFIGS"))).toHaveLength(1);
  });

  it("without limits, nothing is read", async () => {
    const { admin, reads } = adminWith({ "writ.replies.a": { "max.message.bytes": "10" } });
    expect(await new TopicDirectory(admin).exists("writ.replies.a")).toBe(true);
    expect(reads).toEqual([]);
  });
});
