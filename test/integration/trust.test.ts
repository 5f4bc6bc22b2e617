import { generateKeyPairSync, randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { createWritClient } from "../../producers/writ-client.ts";
import { partitionFor } from "../../src/kafka/partition.ts";
import { createLogger } from "../../src/logger.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { AgentRegistry } from "../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../src/security/signing.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl, startHarness } from "../helpers/writ-harness.ts";

const refund = (runId: string, version: string, amountCents = 700) => ({
  tool: refundPayment,
  entity: { type: "payment", id: "pay_1" },
  runId,
  stepId: `refund-${amountCents}`,
  baseVersion: version,
  delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "late" as const } }],
  params: { amountCents, reason: "late" },
});

describe("the trust boundary on a real broker", () => {
  it("wrong-partition: an intent another client's partitioner put on the wrong partition is forwarded to its owner partition and written once", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 6 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const intent = agent.buildIntent(refund(`run-${randomUUID()}`, version));
    const home = partitionFor("payment:pay_1", 6);
    const kafka = new Kafka({ clientId: "foreign", brokers: brokers(), logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    // The same intent twice, on two partitions that are not its key's: forwarded once each, deduped by the owner.
    for (const p of [(home + 1) % 6, (home + 2) % 6]) {
      await producer.send({ topic: h.config.topics.intents, messages: [{ key: "payment:pay_1", value: JSON.stringify(intent), partition: p }] });
    }
    const replies = await h.readTopic(`writ.replies.billing-agent.${h.id}`, "Reply", 2);
    expect(replies.map((r) => r.status)).toEqual(["applied", "applied"]);
    expect(replies.filter((r) => r.duplicate)).toHaveLength(1);
    expect(h.records.patchRequests(intent.intentKey)).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("signed-agents: with an agent registry a signed intent is applied; an unsigned one is dead-lettered unauthenticated and answered on the agent's registered topic", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const key = generateKeyPairSync("ed25519");
    const replyTopic = `writ.replies.signer.${h.id}`;
    const agents = AgentRegistry.from({
      agents: { signer: { keys: [{ id: "k1", publicKey: key.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["refund_payment"], replyTopic } },
    });
    await h.startRouter({ agents });
    const common = { brokers: brokers(), agentId: "signer", replyTopic, intentsTopic: h.config.topics.intents, schemaRegistryUrl: registryUrl(), logger: createLogger({ level: "warn" }) };
    const signedClient = await createWritClient({ ...common, signer: { keyId: "k1", privateKey: key.privateKey } });
    onTestFinished(() => signedClient.close());
    const unsignedClient = await createWritClient(common);
    onTestFinished(() => unsignedClient.close());
    const { version } = await readVersion(h.records, "payment", "pay_1");

    const applied = await signedClient.submit(refund(`run-${randomUUID()}`, version));
    expect(applied).toMatchObject({ status: "applied" });
    // Answered before the owner authenticated the record: the client's submit holds that rejection until its
    // deadline (another answer to the intent id would win; test/unit/client/writ-client.test.ts shows the hold),
    // so the test waits for the answer itself, as the client reads it on its registered topic, not for the deadline.
    const unsigned = unsignedClient.buildIntent(refund(`run-${randomUUID()}`, version, 900));
    const answers: Reply[] = [];
    const reading = new AbortController();
    onTestFinished(() => reading.abort());
    void (async () => {
      for await (const r of unsignedClient.replies({ signal: reading.signal })) answers.push(r);
    })();
    // Its result is the hold above, settled when the client closes at the test's end; a failed send is shown.
    let sendFailed: unknown;
    void unsignedClient.submit(unsigned).catch((err: unknown) => (sendFailed = err));
    const refused = await waitFor(() => answers.find((r) => r.intentId === unsigned.intentId), {
      message: () => `a reply to ${unsigned.intentId}; got ${JSON.stringify(answers)}${sendFailed === undefined ? "" : `; the submit threw ${String(sendFailed)}`}`,
    });
    expect(refused).toMatchObject({ status: "rejected", reason: "unauthenticated" });
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead.map((d) => d.reason)).toEqual(["unauthenticated"]);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  /**
   * Deployment "prod" (WRIT_SIGNING_AUDIENCE=prod) and the agent's key registered there as on staging: the bytes the
   * agent signed for staging, read from staging's intents topic and produced to prod's, verify (same key) and must
   * still not write. `audience` is prod's owners' signingAudience; the intent is produced as a replayer would, its
   * value and signature header unchanged.
   */
  async function replayDeployment(audience: string | undefined) {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const key = generateKeyPairSync("ed25519");
    const replyTopic = `writ.replies.signer.${h.id}`;
    const agents = AgentRegistry.from({
      agents: { signer: { keys: [{ id: "k1", publicKey: key.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["refund_payment"], replyTopic } },
    });
    await h.startRouter({ agents, config: { ...h.config, ...(audience === undefined ? {} : { signingAudience: audience }) } });
    const signer = { keyId: "k1", privateKey: key.privateKey };
    // Prod's own client (it also creates the agent's reply topic, where refusals are answered).
    const prod = await h.client("signer", { replyTopic, signer, audience: "prod" });
    const { version } = await readVersion(h.records, "payment", "pay_1");
    // What the agent signed for staging (its client there has audience "staging"), as it sits on staging's topic.
    const staging = { ...prod.buildIntent(refund(`run-${randomUUID()}`, version, 900)), audience: "staging" };
    const kafka = new Kafka({ clientId: "replayer", brokers: brokers(), logLevel: logLevel.NOTHING });
    const producer = kafka.producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    const replay = () =>
      producer.send({
        topic: h.config.topics.intents,
        messages: [{ key: "payment:pay_1", value: JSON.stringify(staging), headers: { [SIGNATURE_HEADER]: signIntent(staging, signer) } }],
      });
    return { h, prod, staging, replay, replyTopic, version };
  }

  it("signing-audience: an intent signed for another deployment's audience, replayed here with its signature, is dead-lettered unauthenticated and writes nothing; one signed for this deployment is applied", async () => {
    const { h, prod, staging, replay, replyTopic, version } = await replayDeployment("prod");
    await replay();
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead.map((d) => d.reason)).toEqual(["unauthenticated"]);
    expect(dead[0]!.message).toMatch(/audience_mismatch: the intent is signed for audience "staging"/);
    const refusal = (await h.readTopic(replyTopic, "Reply", 1)).find((r) => r.intentId === staging.intentId);
    expect(refusal).toMatchObject({ status: "rejected", reason: "unauthenticated", details: { problem: "audience_mismatch", received: "staging" } });
    // Nothing reached the system of record for it.
    expect(h.records.patchRequests(staging.intentKey)).toHaveLength(0);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(0);

    // The same write signed for this deployment (prod's client puts its audience in) is applied, once.
    const own = prod.buildIntent(refund(`run-${randomUUID()}`, version, 700));
    expect(own.audience).toBe("prod");
    expect(await prod.submit(own)).toMatchObject({ status: "applied" });
    expect(h.records.patchRequests(own.intentKey)).toHaveLength(1);
    expect(h.records.patchRequests(staging.intentKey)).toHaveLength(0);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([expect.objectContaining({ amountCents: 700 })]);
  });

  it("signing-audience control: owners without WRIT_SIGNING_AUDIENCE apply the very replay the audience stops", async () => {
    const { h, staging, replay, replyTopic } = await replayDeployment(undefined);
    await replay();
    const replies = await h.readTopic(replyTopic, "Reply", 1);
    expect(replies.find((r) => r.intentId === staging.intentId)).toMatchObject({ status: "applied" });
    expect(h.records.patchRequests(staging.intentKey)).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([expect.objectContaining({ amountCents: 900 })]);
  });
});
