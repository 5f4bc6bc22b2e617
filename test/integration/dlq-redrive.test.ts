// `writ dlq redrive` against a real broker and owner: a record dead-lettered for a cause an operator can fix (its
// reply topic did not exist yet) goes back to the intents topic once it is fixed, is written once, and a second
// redrive of it is answered as a repeat. Writes are counted at the records server.
import { execFile } from "node:child_process";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment } from "../../examples/demo-tools.ts";
import { WireCodec } from "../../src/codec.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { ROOT } from "../helpers/build.ts";
import { brokers, readVersion, refundIntent, registryUrl, startHarness } from "../helpers/writ-harness.ts";

function writ(args: string[], env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  const base = Object.fromEntries(Object.entries(process.env).filter(([k]) => !/^(WRIT_|LOG_LEVEL$)/.test(k)));
  return new Promise((resolve) => {
    execFile(process.execPath, ["src/cli/main.ts", ...args], { cwd: ROOT, env: { ...base, ...env }, timeout: 60_000 }, (error, stdout, stderr) => {
      resolve({ code: error === null ? 0 : typeof error.code === "number" ? error.code : 1, stdout, stderr });
    });
  });
}

describe("writ dlq redrive", () => {
  it("a dead letter whose cause is fixed (its reply topic created) is written once; redriven again, answered as a repeat; --dry-run sends nothing", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client(`agent-dlq-${h.id}`);
    const env = {
      KAFKA_BROKERS: brokers().join(","),
      ...(registryUrl() ? { SCHEMA_REGISTRY_URL: registryUrl()! } : {}),
      WRIT_INTENTS_TOPIC: h.config.topics.intents,
      WRIT_DLQ_TOPIC: h.config.topics.dlq,
    };

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
    await admin.createTopics({ topics: [{ topic: lateTopic, numPartitions: 1 }], waitForLeaders: true });
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
});
