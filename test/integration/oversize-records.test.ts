// Records an owner must write that are larger than the broker (or a topic) takes, on the real broker: a system of
// record answering with a multi-MB state, a reply topic whose max.message.bytes is small, a forwarded record whose
// headers inflate past the limit. Each intent is answered (or dead-lettered with what it could not carry), the
// partition goes on (a later intent on it is applied), and effects are counted at the records server, whose own
// Idempotency-Key dedupe is off.
import { randomUUID } from "node:crypto";
import { CompressionTypes, type ConfigResourceTypes, Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import { WireCodec } from "../../src/codec.ts";
import { partitionFor } from "../../src/kafka/partition.ts";
import type { Router } from "../../src/owner/router.ts";
import { undoIntentKey } from "../../src/keys.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import type { AppliedReply } from "../../src/schemas/reply.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl, startHarness, type Harness } from "../helpers/writ-harness.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

/** A ticket state of about `bytes` bytes of JSON: its tags, each 100 characters. */
function bigTicket(bytes: number, tags: string[] = []) {
  const filler = Array.from({ length: Math.ceil(bytes / 103) }, (_, i) => `t${String(i).padStart(99, "0")}`);
  return { status: "open", tags: [...tags, ...filler] };
}

async function harness(intentPartitions = 1): Promise<Harness> {
  const h = await startHarness({ tools: [tagTicket], intentPartitions });
  h.records.setConfig({ honourIdempotencyKey: false });
  return h;
}

/** A tag of `ticket` with `tagName`, as an agent builds it on the version it reads now. */
async function tagInput(h: Harness, ticket: string, tagName: string) {
  const read = await readVersion(h.records, "ticket", ticket);
  const tags = read.state.tags as string[];
  return {
    tool: tagTicket,
    entity: { type: "ticket", id: ticket },
    runId: `run-${randomUUID().slice(0, 8)}`,
    stepId: `tag-${tagName}`,
    baseVersion: read.version,
    delta: [{ op: "replace" as const, path: "/tags", value: [...tags, tagName] }],
    params: { tag: tagName },
  };
}

/** `agent` tags `ticket` with `tagName` on the version it reads now. */
async function tag(h: Harness, agent: WritClient, ticket: string, tagName: string, opts: { timeoutMs?: number } = {}) {
  return agent.submit(await tagInput(h, ticket, tagName), opts);
}

/** writ_records_refused_size_total{topic_kind, outcome} as the router serves it (0 when not yet counted). */
async function sizeRefusals(router: Router, topicKind: string, outcome: string): Promise<number> {
  const line = (await router.metrics()).split("\n").find((l) => l.startsWith(`writ_records_refused_size_total{topic_kind="${topicKind}",outcome="${outcome}"}`));
  return line === undefined ? 0 : Number(line.split(" ").at(-1));
}

/** A later intent on the same partition is applied: the partition is moving. Written once, counted at the records server. */
async function partitionMoves(h: Harness) {
  const bob = await h.client("bob");
  h.records.seed("ticket", "T-later", { status: "open", tags: [] });
  const later = await tag(h, bob, "T-later", "later", { timeoutMs: 60_000 });
  expect(later).toMatchObject({ status: "applied", duplicate: false });
  expect(h.records.patchRequests(later.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
}

describe("records larger than the broker takes, on a real broker", () => {
  it("undo-conflict-multi-MB-state: an undo meeting a 3 MB record is answered, nothing is written, and the partition goes on", async () => {
    const h = await harness();
    h.records.seed("ticket", "T-big", { status: "open", tags: ["billing"] });
    await h.startRouter();
    const alice = await h.client("alice");
    const tagged = await tag(h, alice, "T-big", "vip");
    expect(tagged).toMatchObject({ status: "applied", version: '"v2"' });
    // Another writer grows the ticket to 3 MB: the undo's compensating change on it (its tags without "vip") is as large.
    h.records.seed("ticket", "T-big", bigTicket(3_000_000, ["billing", "vip"]));

    const undo = await alice.undo(tagged as AppliedReply, { timeoutMs: 60_000 });

    expect(undo).toMatchObject({ status: "rejected", reason: "undo_failed", intentKey: undoIntentKey(tagged.intentKey), details: { version: '"v3"' } });
    expect("message" in undo && undo.message).toMatch(/bytes as JSON, over the 262144/);
    // Nothing was undone, and the ticket is as the other writer left it.
    expect(h.records.patchRequests(undoIntentKey(tagged.intentKey))).toEqual([]);
    expect((await readVersion(h.records, "ticket", "T-big")).version).toBe('"v3"');
    await partitionMoves(h);
  }, 120_000);

  it("shrunk-reply-topic: a reply topic whose max.message.bytes drops to 4000 after the owner read it refuses a 50 kB reply; the owner reads the topic again after the failed transaction, and the reply goes out without the state, written once; the partition goes on", async () => {
    const h = await harness();
    h.records.seed("ticket", "T-shrunk", { status: "open", tags: ["billing"] });
    const router = await h.startRouter();
    const shrunk = await h.client("shrunk");
    expect(await tag(h, shrunk, "T-shrunk", "first")).toMatchObject({ status: "applied" });
    await alterReplyTopic(h, "shrunk", 4000);
    h.records.seed("ticket", "T-shrunk", bigTicket(50_000, ["billing", "first"]));

    const reply = await tag(h, shrunk, "T-shrunk", "vip", { timeoutMs: 60_000 });

    expect(reply).toMatchObject({ status: "applied", duplicate: false, state: null, truncated: true });
    expect(h.records.patchRequests(reply.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
    // The broker's refusal, then the reply written without its state: both counted, by kind, never by topic name.
    // (`unnamed`: refused in a request of several records, before the partition sends them one at a time.)
    expect((await sizeRefusals(router, "reply", "refused")) + (await sizeRefusals(router, "unnamed", "refused"))).toBeGreaterThanOrEqual(1);
    expect(await sizeRefusals(router, "reply", "truncated")).toBeGreaterThanOrEqual(1);
    await partitionMoves(h);
  }, 120_000);

  // Read from the topic's configs when the owner finds the topic (as owners with DESCRIBE_CONFIGS on the reply topics
  // do), or learned from the broker's refusal (as those without do): the first reply meets what the topic takes.
  for (const c of [
    { agent: "small", internals: {}, name: "small-reply-topic: a reply topic of max.message.bytes 4000 gets the reply without the 50 kB state; written once, and the partition goes on" },
    {
      agent: "undescribed",
      internals: { ablateTopicLimits: true },
      name: "undescribed-small-reply-topic: an owner that cannot read topics' configs meets the refusal of a 50 kB reply by a topic of max.message.bytes 4000, learns it, and answers without the state; written once, and the partition goes on",
    },
    {
      agent: "undescribed-v1",
      internals: { ablateTopicLimits: true },
      protocol: "v1" as const,
      name: "undescribed-small-reply-topic-txn-v1: the same with kafkajs's own transactions (v1), whose refusal comes from its producer",
    },
  ]) {
    it(c.name, async () => {
      const h = await harness();
      await createReplyTopic(h, c.agent, 4000);
      h.records.seed("ticket", "T-50k", bigTicket(50_000, ["billing"]));
      const router = await h.startRouter("protocol" in c ? { config: { ...h.config, transactionProtocol: c.protocol } } : {}, c.internals);
      const agent = await h.client(c.agent);

      const reply = await tag(h, agent, "T-50k", "vip", { timeoutMs: 60_000 });

      expect(reply).toMatchObject({ status: "applied", duplicate: false, state: null, truncated: true, version: '"v2"' });
      expect(h.records.patchRequests(reply.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
      expect((await readVersion(h.records, "ticket", "T-50k")).state.tags).toContain("vip");
      expect(await sizeRefusals(router, "reply", "truncated")).toBeGreaterThanOrEqual(1);
      // Read ahead, the topic refuses nothing; undescribed, its refusal is learned and counted.
      const refused = (await sizeRefusals(router, "reply", "refused")) + (await sizeRefusals(router, "unnamed", "refused"));
      if (c.agent === "small") expect(refused).toBe(0);
      else expect(refused).toBeGreaterThanOrEqual(1);
      await partitionMoves(h);
    }, 120_000);
  }

  it("closed-reply-topic: a reply topic of max.message.bytes 0 takes nothing: the intent is written once and dead-lettered undeliverable with its reply; the partition goes on", async () => {
    const h = await harness();
    await createReplyTopic(h, "closed", 0);
    h.records.seed("ticket", "T-closed", { status: "open", tags: ["billing"] });
    const router = await h.startRouter();
    const closed = await h.client("closed");
    const input = await tagInput(h, "T-closed", "vip");
    const intent = closed.buildIntent(input);

    // No reply can reach this agent: its submit ends at its deadline, while the dead letter says what happened.
    const submitted = closed.submit(intent, { timeoutMs: 10_000 });
    const dead = await waitFor(async () => (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)).find((d) => d.reason === "undeliverable"), {
      timeoutMs: 60_000,
      message: "an undeliverable dead letter",
    });

    expect(dead).toMatchObject({ source: { topic: h.config.topics.intents, partition: 0 }, key: "ticket:T-closed", truncated: false });
    // The intent's record whole, as the client framed it.
    const kept = await new WireCodec({ schemaRegistryUrl: registryUrl() }).decode("WriteIntent", Buffer.from(dead.valueBase64, "base64"));
    expect(kept).toMatchObject({ ok: true, value: { intentId: intent.intentId, intentKey: intent.intentKey } });
    expect(dead.undelivered).toMatchObject({ topic: `writ.replies.closed.${h.id}`, value: { status: "applied", intentId: intent.intentId, truncated: true, state: null } });
    expect(h.records.patchRequests(intent.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
    expect(await sizeRefusals(router, "reply", "undeliverable")).toBeGreaterThanOrEqual(1);
    await partitionMoves(h);
    expect(await submitted).toMatchObject({ status: "unknown" });
  }, 180_000);

  it("wrong-partition-huge-headers: a record whose gzip-compressed headers inflate to 3 MB, on the wrong partition, is dead-lettered too_large instead of forwarded; the partition goes on", async () => {
    const h = await harness(3);
    h.records.seed("ticket", "T-fwd", { status: "open", tags: [] });
    const router = await h.startRouter();
    const alice = await h.client("alice");
    const intent = alice.buildIntent(await tagInput(h, "T-fwd", "vip"));
    const home = partitionFor("ticket:T-fwd", 3);
    const wrong = (home + 1) % 3;
    const kafka = new Kafka({ clientId: "foreign", brokers: brokers(), logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    // The broker takes it (a few kB compressed); forwarded as it is, uncompressed, it would not fit any batch.
    await producer.send({
      topic: h.config.topics.intents,
      compression: CompressionTypes.GZIP,
      messages: [{ key: "ticket:T-fwd", value: JSON.stringify(intent), partition: wrong, headers: { pad: "a".repeat(3_000_000) } }],
    });

    const dead = await waitFor(async () => (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)).find((d) => d.reason === "too_large"), { timeoutMs: 60_000, message: "a too_large dead letter" });

    expect(dead).toMatchObject({ source: { topic: h.config.topics.intents, partition: wrong }, key: "ticket:T-fwd", truncated: false });
    expect(dead.message).toMatch(new RegExp(`forwarded to partition ${home} \\(its key's\\) it would take \\d+ bytes with its headers`));
    expect(JSON.parse(Buffer.from(dead.valueBase64, "base64").toString("utf8"))).toMatchObject({ intentKey: intent.intentKey });
    expect(h.records.patchRequests(intent.intentKey)).toEqual([]);
    expect(await sizeRefusals(router, "forward", "too_large")).toBe(1);
    // The same partition goes on: a later intent on it, without the padding, is forwarded and applied once.
    const later = alice.buildIntent(await tagInput(h, "T-fwd", "later"));
    await producer.send({ topic: h.config.topics.intents, messages: [{ key: "ticket:T-fwd", value: JSON.stringify(later), partition: wrong }] });
    await waitFor(() => h.records.patchRequests(later.intentKey).length > 0, { timeoutMs: 60_000, message: "the later intent's PATCH" });
    expect(h.records.patchRequests(later.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
  }, 120_000);
});

describe("a ledger topic smaller than writ's largest ledger entry, on a real broker", () => {
  it("small-ledger-topic: an owner refuses to start on a ledger whose max.message.bytes is below the largest entry, naming the topic, its limit, what it needs and the fix; sized so, it starts and writes", async () => {
    const h = await harness();
    const ledgerConfigs = [
      { name: "cleanup.policy", value: "compact" },
      { name: "min.compaction.lag.ms", value: "3600000" },
    ];
    const admin = new Kafka({ clientId: "small-ledger", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(async () => {
      await admin.deleteTopics({ topics: [h.config.topics.intents, h.config.topics.ledger] }).catch(() => undefined);
      await admin.disconnect();
    });
    await createTopicsWithLeaders(admin, [
      { topic: h.config.topics.intents, numPartitions: 1 },
      { topic: h.config.topics.ledger, numPartitions: 1, configEntries: [...ledgerConfigs, { name: "max.message.bytes", value: "100000" }] },
    ]);

    // WRIT_MAX_INTENT_BYTES (262144) of an undoable tool's params and 65536 of the entry's fields.
    await expect(h.startRouter()).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining(
        `${h.config.topics.ledger} (ledger) takes records of at most 100000 bytes (max.message.bytes=100000); writ needs 327680, its largest entry`,
      ),
    });

    await admin.alterConfigs({
      validateOnly: false,
      resources: [{ type: 2 as ConfigResourceTypes, name: h.config.topics.ledger, configEntries: [...ledgerConfigs, { name: "max.message.bytes", value: "327680" }] }],
    });
    await h.startRouter();
    await partitionMoves(h);
  }, 120_000);
});

/** Creates agent `agentId`'s reply topic (as its client names it) with this max.message.bytes, before its client does. */
async function createReplyTopic(h: Harness, agentId: string, maxMessageBytes: number): Promise<void> {
  const kafka = new Kafka({ clientId: "reply-topic", brokers: brokers(), logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  try {
    const topic = `writ.replies.${agentId}.${h.id}`;
    await createTopicsWithLeaders(admin, [{ topic, numPartitions: 1, configEntries: [{ name: "max.message.bytes", value: String(maxMessageBytes) }] }]);
    onTestFinished(async () => {
      const cleanup = kafka.admin();
      await cleanup.connect();
      await cleanup.deleteTopics({ topics: [topic] }).catch(() => undefined);
      await cleanup.disconnect();
    });
  } finally {
    await admin.disconnect();
  }
}

/** Sets agent `agentId`'s reply topic's max.message.bytes (as an operator, or a misconfigured agent platform, would). */
async function alterReplyTopic(h: Harness, agentId: string, maxMessageBytes: number): Promise<void> {
  const admin = new Kafka({ clientId: "reply-topic", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    await admin.alterConfigs({
      validateOnly: false,
      resources: [{ type: 2 as ConfigResourceTypes, name: `writ.replies.${agentId}.${h.id}`, configEntries: [{ name: "max.message.bytes", value: String(maxMessageBytes) }] }],
    });
  } finally {
    await admin.disconnect();
  }
}
