// A refused signed intent produced again later, on the real broker, against the demo records server with its own
// Idempotency-Key dedupe off: what reaches the system of record is counted there (PATCH requests per intent key).
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { noteAccount, refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { buildLeaseIntent } from "../../producers/change.ts";
import { createWritClient } from "../../producers/writ-client.ts";
import { changeId } from "../../src/keys.ts";
import { createLogger } from "../../src/logger.ts";
import { WireCodec } from "../../src/codec.ts";
import { isControlRecord } from "../../src/schemas/control.ts";
import { AgentRegistry } from "../../src/security/agent-registry.ts";
import { brokers, readVersion, registryUrl, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { produceAgain, recordedIntent } from "../helpers/intent-replay.ts";

type H = Awaited<ReturnType<typeof startHarness>>;

/** A harness with the records server's own dedupe off, and signing agents registered with `grants`. */
async function signedHarness(grants: Record<string, string[]>) {
  const h = await startHarness({ tools: [refundPayment, tagTicket, noteAccount] });
  h.records.setConfig({ honourIdempotencyKey: false });
  h.records.seed("payment", "pay_R", { amountCents: 100_000, refunds: [] });
  const keys = Object.fromEntries(Object.keys(grants).map((a) => [a, generateKeyPairSync("ed25519")]));
  const topicOf = (agent: string) => `writ.replies.${agent}.${h.id}`;
  const registry = (g: Record<string, string[]>) =>
    AgentRegistry.from({
      agents: Object.fromEntries(
        Object.entries(g).map(([agent, tools]) => [agent, { keys: [{ id: "k1", publicKey: keys[agent]!.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools, replyTopic: topicOf(agent) }]),
      ),
    });
  const client = async (agent: string) => {
    const c = await createWritClient({
      brokers: brokers(),
      agentId: agent,
      replyTopic: topicOf(agent),
      intentsTopic: h.config.topics.intents,
      schemaRegistryUrl: registryUrl(),
      submitTimeoutMs: 30_000,
      logger: createLogger({ level: "warn" }),
      signer: { keyId: "k1", privateKey: keys[agent]!.privateKey },
    });
    onTestFinished(() => c.close());
    return c;
  };
  const { version } = await readVersion(h.records, "payment", "pay_R");
  const refundInput = { tool: refundPayment, entity: { type: "payment", id: "pay_R" }, runId: "run-b", stepId: "refund", baseVersion: version, delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 2500, reason: "late" as const } }], params: { amountCents: 2500, reason: "late" } };
  return { h, registry, client, topicOf, refundInput };
}

/** The answers on reply topic `topic`, as they arrive, decoded: [intentId, status, reason, duplicate]. A live list. */
async function watchReplies(h: H, topic: string): Promise<[string, string, string, boolean][]> {
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
  const seen: [string, string, string, boolean][] = [];
  const consumer = new Kafka({ brokers: brokers(), clientId: `watcher-${h.id}`, logLevel: logLevel.NOTHING }).consumer({ groupId: `writ.test-replies.${randomUUID()}`, maxWaitTimeInMs: 100 });
  onTestFinished(() => consumer.disconnect());
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  await consumer.run({
    eachMessage: async ({ message }) => {
      if (isControlRecord(message.headers)) return;
      const d = await codec.decode("Reply", message.value);
      if (d.ok) seen.push([d.value.intentId, d.value.status, d.value.status === "rejected" ? d.value.reason : "", d.value.duplicate]);
    },
  });
  return seen;
}

describe("refused signed intents on a real broker", () => {
  it("refusal-replay: an intent refused `leased`, produced again after the release and an owner restart, gets the same refusal (a repeat), nothing sent; a new submit of it is applied once", async () => {
    const { h, registry, client, topicOf, refundInput } = await signedHarness({ resolver: ["refund_payment"], billing: ["refund_payment"] });
    const agents = registry({ resolver: ["refund_payment"], billing: ["refund_payment"] });
    const first = await h.startRouter({ agents });
    const [resolver, billing] = await Promise.all([client("resolver"), client("billing")]);
    const change = changeId({ agentId: "resolver", runId: `run-${randomUUID().slice(0, 8)}`, stepId: "c" });
    const lease = (op: "acquire" | "release") =>
      buildLeaseIntent({ change, op, entity: refundInput.entity, tool: "refund_payment", agentId: "resolver", runId: "r", stepId: `s/${op}`, replyTo: resolver.replyTopic, ...(op === "acquire" ? { ttlMs: 60_000 } : {}) });
    const replies = await watchReplies(h, topicOf("billing"));

    // Agent A (resolver) holds the payment's lease; agent B's refund is refused `leased`, and B moves on.
    expect(await resolver.submit(lease("acquire"))).toMatchObject({ status: "applied", via: "lease" });
    const refund = billing.buildIntent(refundInput);
    expect(await billing.submit(refund, { onLeased: "answer" })).toMatchObject({ status: "rejected", reason: "leased", duplicate: false });
    expect(await resolver.submit(lease("release"))).toMatchObject({ status: "applied", via: "lease", lease: { released: true } });

    // The refusal was remembered (a ledger entry), and counted so.
    await waitFor(async () => /writ_refusals_remembered_total\{reason="leased"\} 1/.test(await first.metrics()), { timeoutMs: 10_000, message: "writ_refusals_remembered_total did not count the refusal" });

    // B's refund as its client produced it, copied off the intents topic; a new owner (it restores the ledger).
    const bytes = await recordedIntent(h, refund.intentId);
    await first.stop();
    await h.startRouter({ agents });
    await produceAgain(h, bytes);
    const mine = () => replies.filter(([id]) => id === refund.intentId);
    await waitFor(() => mine().length >= 2, { timeoutMs: 30_000, message: () => `the replay's answer (${mine().length} answers seen)` });
    expect(mine().map(([, ...rest]) => rest)).toEqual([
      ["rejected", "leased", false],
      ["rejected", "leased", true],
    ]);
    expect(h.records.patchRequests(refund.intentKey)).toEqual([]);

    // B submits the refund anew (a new intent id, the same intent key): decided on the state now, applied once.
    const applied = await billing.submit(refundInput, { onLeased: "answer" });
    expect(applied).toMatchObject({ status: "applied", via: "patch", duplicate: false, intentKey: refund.intentKey });
    expect(applied.intentId).not.toBe(refund.intentId);
    expect(h.records.patchRequests(refund.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_R")).state.refunds).toEqual([{ amountCents: 2500, reason: "late" }]);
  });

  it("refusal-replay-grant: an intent refused `tool_not_allowed`, produced again (before and after the tool is granted and the owner restarted), gets the same refusal; a new submit is applied once", async () => {
    const { h, registry, client, topicOf, refundInput } = await signedHarness({ billing: ["tag_ticket"] });
    const first = await h.startRouter({ agents: registry({ billing: ["tag_ticket"] }) });
    const billing = await client("billing");
    const replies = await watchReplies(h, topicOf("billing"));
    const refund = billing.buildIntent(refundInput);
    expect(await billing.submit(refund, { onLeased: "answer" })).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: false });
    const bytes = await recordedIntent(h, refund.intentId);
    const mine = () => replies.filter(([id]) => id === refund.intentId).map(([, ...rest]) => rest);

    // Again while still not granted: refused at admission, answered as the repeat it is.
    await produceAgain(h, bytes);
    await waitFor(() => mine().length >= 2, { timeoutMs: 30_000, message: () => `the first replay's answer (${mine().length} answers seen)` });
    // The grant changes (owners restarted with the new registry); the same bytes again.
    await first.stop();
    await h.startRouter({ agents: registry({ billing: ["tag_ticket", "refund_payment"] }) });
    await produceAgain(h, bytes);
    await waitFor(() => mine().length >= 3, { timeoutMs: 30_000, message: () => `the second replay's answer (${mine().length} answers seen)` });
    expect(mine()).toEqual([
      ["rejected", "tool_not_allowed", false],
      ["rejected", "tool_not_allowed", true],
      ["rejected", "tool_not_allowed", true],
    ]);
    expect(h.records.patchRequests(refund.intentKey)).toEqual([]);

    const applied = await billing.submit(refundInput, { onLeased: "answer" });
    expect(applied).toMatchObject({ status: "applied", via: "patch", duplicate: false, intentKey: refund.intentKey });
    expect(h.records.patchRequests(refund.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
  });
});
