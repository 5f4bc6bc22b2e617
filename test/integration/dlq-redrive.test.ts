// `writ dlq redrive` against a real broker and owner: a record dead-lettered for a cause an operator can fix (its
// reply topic did not exist yet) goes back to the intents topic once it is fixed, is written once, and a second
// redrive of it is answered as a repeat. Writes are counted at the records server.
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment } from "../../examples/demo-tools.ts";
import { WireCodec } from "../../src/codec.ts";
import { readWholeTopic } from "../../src/cli/topic-reader.ts";
import { createLogger } from "../../src/logger.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, cliEnv, deadLetterOf, readVersion, refundIntent, registryUrl, startHarness, writ } from "../helpers/writ-harness.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

/**
 * Owners with pay_1 seeded, for the cases of dead letters written by anyone: refunds of pay_1 (`refund`: their
 * bytes) answered on a reply topic not created yet, so dead-lettered reply_topic_missing; `writeDlq` writes a dead
 * letter of pay_1 to writ.dlq as any producer may; `redriveRealOne` creates the reply topic, redrives that reason
 * (the outcomes in order), and finds the real one (a refund of 900) applied once.
 */
async function lateRefunds(name: string) {
  const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
  h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
  await h.startRouter();
  const agent = await h.client(`agent-${name}-${h.id}`);
  const lateTopic = `writ.replies.late-${h.id}`;
  const version = (await readVersion(h.records, "payment", "pay_1")).version;
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
  const refund = (amountCents: number, run = `run-${h.id}`) => codec.encode(h.config.topics.intents, "WriteIntent", { ...agent.buildIntent(refundIntent(run, version, amountCents)), replyTo: lateTopic });
  const kafka = new Kafka({ clientId: `dlq-forger-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
  const forger = kafka.producer();
  await forger.connect();
  onTestFinished(() => forger.disconnect());
  const writeDlq = (letter: DeadLetter) => forger.send({ topic: h.config.topics.dlq, messages: [{ key: "payment:pay_1", value: JSON.stringify(letter) }] });
  const redriveRealOne = async (outcomes: string[]) => {
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: lateTopic, numPartitions: 1 }]);
    const sent = await writ(["dlq", "redrive", "--reason", "reply_topic_missing", "--json"], cliEnv(h));
    expect(sent.code, sent.stderr).toBe(1);
    expect(sent.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { outcome: string }).outcome)).toEqual(outcomes);
    const [reply] = (await h.readTopic(lateTopic, "Reply", 1)) as Reply[];
    expect(reply).toMatchObject({ status: "applied", duplicate: false });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([expect.objectContaining({ amountCents: 900 })]);
  };
  return { h, refund, writeDlq, redriveRealOne };
}

describe("writ dlq redrive", () => {
  it("a dead letter whose cause is fixed (its reply topic created) is written once; redriven again, answered as a repeat; --dry-run sends nothing", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client(`agent-dlq-${h.id}`);
    const env = cliEnv(h);

    // An intent naming a reply topic that does not exist yet (a client that did not create it): owners create no
    // topic an intent names, so it is dead-lettered reply_topic_missing.
    const lateTopic = `writ.replies.late-${h.id}`;
    const intent = {
      ...agent.buildIntent(refundIntent(`run-${h.id}`, (await readVersion(h.records, "payment", "pay_1")).version, 900)),
      replyTo: lateTopic,
    };
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
    await h.produceRaw("payment:pay_1", await codec.encode(h.config.topics.intents, "WriteIntent", intent));
    const [dead] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    expect(dead).toMatchObject({ reason: "reply_topic_missing", key: "payment:pay_1", truncated: false });

    const dry = await writ(["dlq", "redrive", "--reason", "reply_topic_missing", "--dry-run"], env);
    expect(dry.code, dry.stderr).toBe(0);
    expect(dry.stdout).toMatch(new RegExp(`reply_topic_missing source=${h.config.topics.intents.replace(/\./g, "\\.")}\\[\\d\\]@\\d+ key=payment:pay_1: would send`));
    expect(dry.stderr).toContain("1 dead letter selected, 1 would be sent, 0 not sent");

    // Sent back before the cause is fixed: dead-lettered again, the same record, naming the dead letter it came from.
    const early = await writ(["dlq", "redrive", "--reason", "reply_topic_missing"], env);
    expect(early.code, early.stderr).toBe(0);
    const twice = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 2)) as DeadLetter[];
    expect(twice[1]).toMatchObject({ reason: "reply_topic_missing", key: "payment:pay_1", sha256: dead!.sha256 });
    expect(twice[1]!.headers["writ-redriven-from"]).toMatch(new RegExp(`^${h.config.topics.dlq.replace(/\./g, "\\.")}:\\d+:\\d+$`));

    // The operator fixes the cause, then redrives: the two dead letters are one record, sent once.
    const kafka = new Kafka({ clientId: `dlq-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: lateTopic, numPartitions: 1 }]);
    expect(h.records.patchRequests()).toHaveLength(0);

    const sent = await writ(["dlq", "redrive", "--reason", "reply_topic_missing", "--json"], env);
    expect(sent.code, sent.stderr).toBe(0);
    const lines = sent.stdout.trim().split("\n").map((l) => JSON.parse(l) as { outcome: string; reason: string; source: { partition: number; offset: string } });
    expect(lines.map((l) => l.outcome)).toEqual(["sent", "same_record"]);
    expect(lines[0]).toMatchObject({ reason: "reply_topic_missing", source: dead!.source });
    const [first] = (await h.readTopic(lateTopic, "Reply", 1)) as Reply[];
    expect(first).toMatchObject({ status: "applied", duplicate: false, intentKey: intent.intentKey });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);

    // Again, by its source offset: a repeat, answered from the ledger; nothing written.
    const again = await writ(["dlq", "redrive", "--source", `${dead!.source.partition}:${dead!.source.offset}`], env);
    expect(again.code, again.stderr).toBe(0);
    expect(again.stdout).toContain(": sent");
    const replies = (await h.readTopic(lateTopic, "Reply", 2)) as Reply[];
    expect(replies[1]).toMatchObject({ status: "applied", duplicate: true, intentKey: intent.intentKey });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);

    // Usage: a selector is required, and reasons are checked.
    expect((await writ(["dlq", "redrive"], env)).code).toBe(2);
    const bad = await writ(["dlq", "redrive", "--reason", "nope"], env);
    expect(bad.code).toBe(2);
    expect(bad.stderr).toMatch(/--reason nope is not a dead-letter reason/);
  }, 120_000);

  it("a truncated dead letter (an intent too large for the owners, sent back once their limit is raised) goes from its source; one naming another record there is refused", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // Owners that take at most 16 KiB, with 52 KiB records (the least that holds a resolution of a 16 KiB intent): a
    // 60 KB intent is dead-lettered too_large, its value cut to fit.
    const strict = await h.startRouter({ config: { ...h.config, maxIntentBytes: 16_384, maxMessageBytes: 53_248 } });
    const agent = await h.client(`agent-big-${h.id}`);
    const env = cliEnv(h);
    const intent = agent.buildIntent(refundIntent(`run-${h.id}`, (await readVersion(h.records, "payment", "pay_1")).version, 800));
    // an attachment-sized field the schema does not know (owners drop it once admitted)
    await h.produceRaw("payment:pay_1", Buffer.from(JSON.stringify({ ...intent, attachment: "x".repeat(60_000) })));
    const [dead] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    expect(dead).toMatchObject({ reason: "too_large", key: "payment:pay_1", truncated: true });
    expect(dead!.originalBytes).toBeGreaterThan(60_000);
    expect(Buffer.from(dead!.valueBase64, "base64").length).toBeLessThan(dead!.originalBytes);
    // A forged dead letter naming the same source offset with another sha256: not the record there.
    const forger = new Kafka({ clientId: `dlq-forger-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    await forger.send({ topic: h.config.topics.dlq, messages: [{ key: "payment:pay_1", value: JSON.stringify({ ...dead, sha256: "0".repeat(64) }) }] });

    // The cause fixed: owners with the default limits.
    await strict.stop();
    await h.startRouter();
    const sent = await writ(["dlq", "redrive", "--reason", "too_large", "--json"], env);
    expect(sent.code, sent.stderr).toBe(1);
    const lines = sent.stdout.trim().split("\n").map((l) => JSON.parse(l) as { outcome: string });
    expect(lines.map((l) => l.outcome)).toEqual(["sent", "source_changed"]);
    const [reply] = (await h.readTopic(intent.replyTo, "Reply", 1)) as Reply[];
    expect(reply).toMatchObject({ status: "applied", duplicate: false, intentKey: intent.intentKey });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  }, 120_000);

  it("dead letters larger together than a record batch the intents topic takes (intents too large for the owners, sent back once their limit is raised) are all sent, in batches that fit", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // Owners with the default limits (256 KiB intents, 1,000,000-byte records): five 300 KB intents of one
    // record are dead-lettered too_large, whole; together (1.5 MB) they are more than one record batch may be.
    const strict = await h.startRouter();
    const agent = await h.client(`agent-many-${h.id}`);
    const version = (await readVersion(h.records, "payment", "pay_1")).version;
    for (let i = 1; i <= 5; i++) {
      const intent = agent.buildIntent(refundIntent(`run-${h.id}`, version, 100 * i));
      await h.produceRaw("payment:pay_1", Buffer.from(JSON.stringify({ ...intent, attachment: "x".repeat(300_000) })));
    }
    const dead = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 5)) as DeadLetter[];
    expect(dead.map((d) => [d.reason, d.truncated])).toEqual(Array(5).fill(["too_large", false]));

    await strict.stop();
    await h.startRouter({ config: { ...h.config, maxIntentBytes: 400_000 } });
    const sent = await writ(["dlq", "redrive", "--reason", "too_large", "--json"], cliEnv(h));
    expect(sent.code, sent.stderr).toBe(0);
    expect(sent.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { outcome: string }).outcome)).toEqual(Array(5).fill("sent"));
    await waitFor(() => h.records.patchRequests().filter((r) => r.type === "payment").length >= 5, { timeoutMs: 60_000, message: "five refunds written" });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(5);
  }, 180_000);

  it("a dead letter naming no offset of the intents topic (forged: the schema takes any string) is refused source_invalid; the run goes on and sends the others", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    await h.startRouter();
    const agent = await h.client(`agent-off-${h.id}`);
    const bytes = Buffer.from(JSON.stringify(agent.buildIntent(refundIntent(`run-${h.id}`, '"1"', 300))));
    const letter = (source: DeadLetter["source"], truncated: boolean) => deadLetterOf(bytes, source, { reason: "too_large", truncated, ...(truncated ? { carried: bytes.subarray(0, 10) } : {}) });
    const forger = new Kafka({ clientId: `dlq-forger-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    await forger.send({
      topic: h.config.topics.dlq,
      messages: [
        { key: "payment:pay_1", value: JSON.stringify(letter({ topic: h.config.topics.intents, partition: 0, offset: "1e3" }, true)) },
        { key: "payment:pay_1", value: JSON.stringify(letter({ topic: h.config.topics.intents, partition: 1, offset: "7" }, false)) },
      ],
    });
    await h.readTopic(h.config.topics.dlq, "DeadLetter", 2);

    const run = await writ(["dlq", "redrive", "--all", "--json"], cliEnv(h));
    expect(run.code, run.stderr).toBe(1);
    expect(run.stdout.trim().split("\n").map((l) => (JSON.parse(l) as { outcome: string }).outcome)).toEqual(["source_invalid", "sent"]);
  }, 120_000);

  it("a forged dead letter with a real one's key and sha256 but other bytes, ahead of it, is refused value_changed; the real one is sent", async () => {
    const { h, refund, writeDlq, redriveRealOne } = await lateRefunds("dlqv");
    const bytes = await refund(900);
    // Another refund's bytes, under the real intent's key and sha256, written to writ.dlq before the owner dead-letters the real one.
    const forged = deadLetterOf(bytes, { topic: h.config.topics.intents, partition: 0, offset: "0" }, { carried: await refund(5_000, `run-x-${h.id}`) });
    await writeDlq(forged);
    await h.produceRaw("payment:pay_1", bytes);
    const letters = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 2)) as DeadLetter[];
    expect(letters.map((l) => [l.reason, l.sha256])).toEqual([
      ["reply_topic_missing", forged.sha256],
      ["reply_topic_missing", forged.sha256],
    ]);
    await redriveRealOne(["value_changed", "sent"]);
  }, 120_000);

  it("a forged truncated dead letter with a real one's key, sha256 and reason but another record's source, ahead of it, is refused source_changed; the real one is sent", async () => {
    const { h, refund, writeDlq, redriveRealOne } = await lateRefunds("dlqt");
    const bytes = await refund(900);
    // Another record of the intents topic, for the forgery's source: not an intent, dead-lettered for another reason.
    await h.produceRaw("payment:pay_2", Buffer.from("{not json"));
    const [elsewhere] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    expect(elsewhere).toMatchObject({ key: "payment:pay_2", source: { topic: h.config.topics.intents } });
    // A truncated copy of the real intent's dead letter naming that record, written before the owner dead-letters the real one.
    const forged = deadLetterOf(bytes, elsewhere!.source, { truncated: true, carried: bytes.subarray(0, 10) });
    await writeDlq(forged);
    await h.produceRaw("payment:pay_1", bytes);
    const letters = ((await h.readTopic(h.config.topics.dlq, "DeadLetter", 3)) as DeadLetter[]).filter((l) => l.key === "payment:pay_1");
    expect(letters.map((l) => [l.reason, l.sha256, l.truncated])).toEqual([
      ["reply_topic_missing", forged.sha256, true],
      ["reply_topic_missing", forged.sha256, false],
    ]);
    await redriveRealOne(["source_changed", "sent"]);
  }, 120_000);

  it("a record's whole dead letter after its truncated one is sent after it, in the order they came", async () => {
    const { h, refund, writeDlq } = await lateRefunds("dlqo");
    // The first intent's dead letter as a truncated one (its value cut, its source the original), then the second's, whole.
    const first = await refund(900);
    await h.produceRaw("payment:pay_1", first);
    const [dead] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    await writeDlq(deadLetterOf(first, dead!.source, { reason: "too_large", truncated: true, carried: first.subarray(0, 10) }));
    await h.produceRaw("payment:pay_1", await refund(500));
    const [, , second] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 3)) as DeadLetter[];
    expect([second!.reason, second!.truncated]).toEqual(["reply_topic_missing", false]);

    const run = await writ(["dlq", "redrive", "--reason", "too_large", "--source", `${second!.source.partition}:${second!.source.offset}`, "--json"], cliEnv(h));
    expect(run.code, run.stderr).toBe(0);
    const lines = run.stdout.trim().split("\n").map((l) => JSON.parse(l) as { dlq: { partition: number; offset: string }; reason: string; outcome: string });
    expect(lines.map((l) => [l.reason, l.outcome])).toEqual([
      ["too_large", "sent"],
      ["reply_topic_missing", "sent"],
    ]);
    // on the intents topic (one key, one partition), in that order
    const kafka = new Kafka({ clientId: `dlq-reader-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const redriven: string[] = [];
    await readWholeTopic(kafka, h.config.topics.intents, createLogger({ level: "silent" }), (r) => {
      const from = r.headers?.["writ-redriven-from"];
      if (from !== undefined) redriven.push(from.toString());
    });
    expect(redriven).toEqual(lines.map((l) => `${h.config.topics.dlq}:${l.dlq.partition}:${l.dlq.offset}`));
  }, 120_000);
});
