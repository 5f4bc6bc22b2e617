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
import { entityKey } from "../../src/schemas/common.ts";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";
import { AgentRegistry } from "../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../src/security/signing.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { declareWriteTool } from "../../src/tools.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { brokers, escalateTicket, readVersion, registryUrl, startHarness } from "../helpers/writ-harness.ts";
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
  /** The registry granting `g`; each agent answered on `topics[agent]`, else its own topic. */
  const registry = (g: Record<string, string[]>, topics: Record<string, string> = {}) =>
    AgentRegistry.from({
      agents: Object.fromEntries(
        Object.entries(g).map(([agent, tools]) => [agent, { keys: [{ id: "k1", publicKey: keys[agent]!.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools, replyTopic: topics[agent] ?? topicOf(agent) }]),
      ),
    });
  const client = async (agent: string, replyTopic = topicOf(agent)) => {
    const c = await createWritClient({
      brokers: brokers(),
      agentId: agent,
      replyTopic,
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
  /** `intent` signed with `agent`'s key, produced as a client outside writ's would (plain JSON): what a retry layer sends. */
  const produceSigned = async (agent: string, intent: WriteIntent) => {
    const producer = new Kafka({ brokers: brokers(), clientId: `signer-${h.id}`, logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    try {
      const headers = { [SIGNATURE_HEADER]: signIntent(intent, { keyId: "k1", privateKey: keys[agent]!.privateKey }) };
      await producer.send({ topic: h.config.topics.intents, messages: [{ key: entityKey(intent.entity), value: JSON.stringify(intent), headers }] });
    } finally {
      await producer.disconnect();
    }
  };
  return { h, registry, client, topicOf, refundInput, produceSigned };
}

/**
 * Intent `intentId`'s bytes, recorded off the intents topic, produced again once: its answers on `replies` (the
 * original's and the replay's), [status, reason, duplicate].
 */
async function replayOnce(h: H, replies: [string, string, string, boolean][], intentId: string): Promise<[string, string, boolean][]> {
  await produceAgain(h, await recordedIntent(h, intentId));
  const mine = () => replies.filter(([id]) => id === intentId).map(([, ...rest]) => rest);
  await waitFor(() => mine().length >= 2, { timeoutMs: 30_000, message: () => `the replay's answer (${mine().length} answers seen)` });
  return mine();
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

  it("refusal-replay-deploy: intents refused `unknown_tool` and `patch_path_not_allowed`, produced again after a deploy of the tool and of its wider paths, get the same refusals; nothing is written", async () => {
    const { h, registry, client, topicOf, refundInput } = await signedHarness({ billing: ["refund_payment", "tag_ticket"] });
    const agents = registry({ billing: ["refund_payment", "tag_ticket"] });
    h.records.seed("ticket", "T-R", { subject: "s", status: "open", tags: [] });
    const ticket = await readVersion(h.records, "ticket", "T-R");
    // The owners as first deployed: no refund_payment, and a tag_ticket that may set only a ticket's status.
    const statusOnly = declareWriteTool({ ...tagTicket, allowedPaths: ["/status"] });
    const first = await h.startRouter({ agents, tools: [statusOnly, noteAccount] });
    const billing = await client("billing");
    const replies = await watchReplies(h, topicOf("billing"));
    const refund = billing.buildIntent(refundInput);
    const tag = billing.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: "T-R" }, runId: "run-b", stepId: "tag", baseVersion: ticket.version, delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" } });
    expect(await billing.submit(refund)).toMatchObject({ status: "rejected", reason: "unknown_tool", duplicate: false });
    expect(await billing.submit(tag)).toMatchObject({ status: "rejected", reason: "patch_path_not_allowed", duplicate: false });
    const recorded = [await recordedIntent(h, refund.intentId), await recordedIntent(h, tag.intentId)];

    // The tool deployed, tag_ticket's paths widened (owners restarted with them); the same bytes again.
    await first.stop();
    await h.startRouter({ agents });
    for (const bytes of recorded) await produceAgain(h, bytes);
    const of = (id: string) => replies.filter(([i]) => i === id).map(([, ...rest]) => rest);
    await waitFor(() => of(refund.intentId).length >= 2 && of(tag.intentId).length >= 2, { timeoutMs: 30_000, message: () => `the replays' answers (${replies.length} answers seen)` });
    expect(of(refund.intentId)).toEqual([
      ["rejected", "unknown_tool", false],
      ["rejected", "unknown_tool", true],
    ]);
    expect(of(tag.intentId)).toEqual([
      ["rejected", "patch_path_not_allowed", false],
      ["rejected", "patch_path_not_allowed", true],
    ]);
    expect(h.records.patchRequests()).toEqual([]);
    expect((await readVersion(h.records, "ticket", "T-R")).state.tags).toEqual([]);

    // A new submission of the refund (a new intent id) is decided on the owners as they are now: applied once.
    expect(await billing.submit(refundInput)).toMatchObject({ status: "applied", via: "patch", duplicate: false, intentKey: refund.intentKey });
    expect(h.records.patchRequests(refund.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
  });

  it("refusal-replay-applied: an applied intent produced again to owners deployed without its tool is answered applied (a repeat), not unknown_tool, and nothing is remembered: again once the tool is back, applied; one PATCH in all", async () => {
    const { h, registry, client, topicOf, refundInput } = await signedHarness({ billing: ["refund_payment"] });
    const agents = registry({ billing: ["refund_payment"] });
    const first = await h.startRouter({ agents });
    const billing = await client("billing");
    const replies = await watchReplies(h, topicOf("billing"));
    const refund = billing.buildIntent(refundInput);
    const applied = await billing.submit(refund);
    expect(applied).toMatchObject({ status: "applied", via: "patch", duplicate: false });
    const bytes = await recordedIntent(h, refund.intentId);
    const mine = () => replies.filter(([id]) => id === refund.intentId).map(([, ...rest]) => rest);

    // A rollback to owners without refund_payment; the refund's bytes again (a redelivery, a copy from writ.intents).
    await first.stop();
    const rolledBack = await h.startRouter({ agents, tools: [tagTicket, noteAccount] });
    await produceAgain(h, bytes);
    await waitFor(() => mine().length >= 2, { timeoutMs: 30_000, message: () => `the first replay's answer (${mine().length} answers seen)` });
    expect(mine()).toEqual([
      ["applied", "", false],
      ["applied", "", true],
    ]);
    expect(await rolledBack.metrics()).not.toMatch(/writ_refusals_remembered_total\{reason="unknown_tool"\} [1-9]/);
    // The tool deployed again; the same bytes once more.
    await rolledBack.stop();
    await h.startRouter({ agents });
    await produceAgain(h, bytes);
    await waitFor(() => mine().length >= 3, { timeoutMs: 30_000, message: () => `the second replay's answer (${mine().length} answers seen)` });
    expect(mine().slice(2)).toEqual([["applied", "", true]]);
    expect(h.records.patchRequests(refund.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_R")).state.refunds).toEqual([{ amountCents: 2500, reason: "late" }]);
  });

  it("refusal-replay-register: an intent refused `reply_topic_not_registered` is answered so again on the registered topic, and after its topic is registered, as a repeat; nothing is written", async () => {
    const { h, registry, client, topicOf, refundInput, produceSigned } = await signedHarness({ billing: ["refund_payment"] });
    // The agent's new reply topic, which its client uses before the registry says so.
    const newTopic = `writ.replies.billing-new.${h.id}`;
    const [registered, moved] = [await client("billing"), await client("billing", newTopic)];
    const first = await h.startRouter({ agents: registry({ billing: ["refund_payment"] }) });
    const [onRegistered, onNew] = [await watchReplies(h, registered.replyTopic), await watchReplies(h, newTopic)];
    const refund = moved.buildIntent(refundInput);
    expect(refund.replyTo).toBe(newTopic);
    await produceSigned("billing", refund);
    const mine = (seen: typeof onNew) => seen.filter(([id]) => id === refund.intentId).map(([, ...rest]) => rest);
    await waitFor(() => mine(onRegistered).length >= 1, { timeoutMs: 30_000, message: "the refusal on the registered reply topic" });
    const bytes = await recordedIntent(h, refund.intentId);

    // Again while the registry still names the old topic: answered there, never on the topic the intent names.
    await produceAgain(h, bytes);
    await waitFor(() => mine(onRegistered).length >= 2, { timeoutMs: 30_000, message: () => `the first replay's answer (${mine(onRegistered).length} answers seen)` });
    // The agent's reply topic registered (owners restarted with the new registry); the same bytes again.
    await first.stop();
    await h.startRouter({ agents: registry({ billing: ["refund_payment"] }, { billing: newTopic }) });
    await produceAgain(h, bytes);
    await waitFor(() => mine(onNew).length >= 1, { timeoutMs: 30_000, message: () => `the second replay's answer (${mine(onNew).length} answers seen)` });
    expect(mine(onRegistered)).toEqual([
      ["rejected", "reply_topic_not_registered", false],
      ["rejected", "reply_topic_not_registered", true],
    ]);
    expect(mine(onNew)).toEqual([["rejected", "reply_topic_not_registered", true]]);
    expect(h.records.patchRequests()).toEqual([]);

    const applied = await moved.submit(refundInput);
    expect(applied).toMatchObject({ status: "applied", via: "patch", duplicate: false, intentKey: refund.intentKey });
    expect(h.records.patchRequests(refund.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
  });

  it("refusal-replay-record: a lease acquire refused `entity_not_found`, produced again once the record exists, gets the same refusal: no lease is taken", async () => {
    const { h, client, registry, topicOf } = await signedHarness({ resolver: ["refund_payment"], billing: ["refund_payment"] });
    await h.startRouter({ agents: registry({ resolver: ["refund_payment"], billing: ["refund_payment"] }) });
    const [resolver, billing] = await Promise.all([client("resolver"), client("billing")]);
    const replies = await watchReplies(h, topicOf("resolver"));
    const entity = { type: "payment", id: "pay_N" };
    const change = changeId({ agentId: "resolver", runId: `run-${randomUUID().slice(0, 8)}`, stepId: "c" });
    const acquire = buildLeaseIntent({ change, op: "acquire", entity, tool: "refund_payment", agentId: "resolver", runId: "r", stepId: "s/acquire", replyTo: resolver.replyTopic, ttlMs: 60_000 });
    expect(await resolver.submit(acquire)).toMatchObject({ status: "rejected", reason: "entity_not_found", duplicate: false });

    // The payment is created since (the record's state changed); the acquire's bytes again.
    h.records.seed("payment", "pay_N", { amountCents: 100_000, refunds: [] });
    expect(await replayOnce(h, replies, acquire.intentId)).toEqual([
      ["rejected", "entity_not_found", false],
      ["rejected", "entity_not_found", true],
    ]);
    // No lease was taken: another agent's refund of the payment is applied, not refused `leased`.
    const { version } = await readVersion(h.records, "payment", "pay_N");
    const refund = { tool: refundPayment, entity, runId: "run-n", stepId: "refund", baseVersion: version, delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 100, reason: "late" as const } }], params: { amountCents: 100, reason: "late" } };
    expect(await billing.submit(refund, { onLeased: "answer" })).toMatchObject({ status: "applied", via: "patch" });
  });

  it("refusal-replay-hold: a renewal refused `lease_hold_exceeded`, produced again once its lease lapsed, gets the same refusal: the record is not taken anew", async () => {
    const { h, client, registry, topicOf, refundInput } = await signedHarness({ resolver: ["refund_payment"], billing: ["refund_payment"] });
    await h.startRouter({ agents: registry({ resolver: ["refund_payment"], billing: ["refund_payment"] }), config: { ...h.config, leaseMaxHoldMs: 1000 } });
    const [resolver, billing] = await Promise.all([client("resolver"), client("billing")]);
    const replies = await watchReplies(h, topicOf("resolver"));
    const entity = { type: "payment", id: "pay_R" };
    const change = changeId({ agentId: "resolver", runId: `run-${randomUUID().slice(0, 8)}`, stepId: "c" });
    const acquire = () => buildLeaseIntent({ change, op: "acquire", entity, tool: "refund_payment", agentId: "resolver", runId: "r", stepId: "s/acquire", replyTo: resolver.replyTopic, ttlMs: 2000 });
    expect(await resolver.submit(acquire())).toMatchObject({ status: "applied", via: "lease" });
    // Renewed until owners refuse: a second after the grant.
    const refused = await waitFor(
      async () => {
        const intent = acquire();
        return (await resolver.submit(intent)).status === "rejected" ? intent : undefined;
      },
      { timeoutMs: 20_000, message: "no renewal was refused" },
    );
    // The lease lapses: another agent's refund, waiting it out, is applied.
    expect(await billing.submit(refundInput, { timeoutMs: 30_000 })).toMatchObject({ status: "applied", via: "patch" });

    // The refused renewal's bytes again: refused so again, nothing taken (the lapse marked only the acquires it granted).
    expect(await replayOnce(h, replies, refused.intentId)).toEqual([
      ["rejected", "lease_hold_exceeded", false],
      ["rejected", "lease_hold_exceeded", true],
    ]);
    const { version } = await readVersion(h.records, "payment", "pay_R");
    const next = { ...refundInput, stepId: "refund-2", baseVersion: version, delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 100, reason: "late" as const } }], params: { amountCents: 100, reason: "late" } };
    const write = await billing.submit(next, { onLeased: "answer" });
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(h.records.patchRequests(write.intentKey).map((r) => r.outcome)).toEqual(["applied"]);
  });

  it("resolution-replay: an operator's apply refused `tool_not_allowed` (no writ.resolve yet) and one refused `patch_path_not_allowed` (owners rolled back to narrower paths), produced again after the grant and the paths' return, get the same refusals; nothing is written; a new apply is applied once", async () => {
    const { h, registry, client, topicOf } = await signedHarness({ billing: ["tag_ticket"], ops: ["tag_ticket"] });
    const granted = registry({ billing: ["tag_ticket"], ops: ["tag_ticket", "writ.resolve"] });
    let owners = await h.startRouter({ agents: registry({ billing: ["tag_ticket"], ops: ["tag_ticket"] }) });
    const [billing, ops] = [await client("billing"), await client("ops")];
    const replies = await watchReplies(h, topicOf("ops"));
    const cases: Escalation[] = [];
    for (const ticket of ["T-RA", "T-RB"]) {
      const escalated = await escalateTicket(h, billing, ticket);
      cases.push(await waitFor(async () => (await h.readTopic(h.config.topics.human, "Escalation", cases.length + 1)).find((e) => e.intent.intentKey === escalated.intentKey), { message: `the escalation of ${ticket}` }));
    }
    const [a, b] = cases as [Escalation, Escalation];
    const applies = (e: Escalation) => h.records.patchRequests(e.intent.intentKey).filter((r) => r.outcome === "applied");

    // T-RA's apply while the operator may not resolve; T-RB's once granted, on owners whose tag_ticket may set only a
    // ticket's status (its change, the tags, is refused at the apply, and the escalation stays open).
    const refusedA = await ops.resolve(a, { decision: "apply" });
    expect(refusedA).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: false });
    await owners.stop();
    owners = await h.startRouter({ agents: granted, tools: [declareWriteTool({ ...tagTicket, allowedPaths: ["/status"] })] });
    const refusedB = await ops.resolve(b, { decision: "apply" });
    expect(refusedB).toMatchObject({ status: "rejected", reason: "patch_path_not_allowed", duplicate: false });
    const recorded = [await recordedIntent(h, refusedA.intentId), await recordedIntent(h, refusedB.intentId)];

    // tag_ticket's paths back (owners restarted, the operator granted); both resolutions' bytes again.
    await owners.stop();
    await h.startRouter({ agents: granted });
    for (const bytes of recorded) await produceAgain(h, bytes);
    const of = (id: string) => replies.filter(([i]) => i === id).map(([, ...rest]) => rest);
    await waitFor(() => of(refusedA.intentId).length >= 2 && of(refusedB.intentId).length >= 2, { timeoutMs: 30_000, message: () => `the replays' answers (${replies.length} answers seen)` });
    expect(of(refusedA.intentId)).toEqual([
      ["rejected", "tool_not_allowed", false],
      ["rejected", "tool_not_allowed", true],
    ]);
    expect(of(refusedB.intentId)).toEqual([
      ["rejected", "patch_path_not_allowed", false],
      ["rejected", "patch_path_not_allowed", true],
    ]);
    expect([...applies(a), ...applies(b)]).toEqual([]);
    for (const ticket of ["T-RA", "T-RB"]) expect((await readVersion(h.records, "ticket", ticket)).state.tags).toEqual([]);

    // The escalation is still open: a new decision on it (a new resolution) is carried out, written once.
    expect(await ops.resolve(a, { decision: "apply" })).toMatchObject({ status: "applied", via: "patch", duplicate: false });
    expect(applies(a)).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-RA")).state.tags).toEqual(["needs-human"]);
  });

  it("resolution-pending-replay: an operator's apply refused `tool_not_allowed` while another operator's apply of the escalation is pending through an outage of the records system, produced again once that apply ended in a conflict and the operator is granted, gets the same refusal; nothing is written", async () => {
    const before = { billing: ["tag_ticket"], ops: ["tag_ticket", "writ.resolve"], lead: ["tag_ticket"] };
    const { h, registry, client, topicOf } = await signedHarness(before);
    // The helpdesk behind a proxy that answers 503 while down: an outage that holds an apply's pending entry.
    const proxy = await startRecordingProxy(h.records.url);
    const systems = () => [
      createHttpSystemOfRecord({ name: "billing", baseUrl: h.records.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    const config = { ...h.config, outageBackoffInitialMs: 50, outageBackoffMaxMs: 500 };
    const owners = await h.startRouter({ agents: registry(before), systems: systems(), config });
    const [billing, ops, lead] = [await client("billing"), await client("ops"), await client("lead")];
    const replies = await watchReplies(h, topicOf("lead"));
    const escalated = await escalateTicket(h, billing, "T-RP");
    const e = await waitFor(async () => (await h.readTopic(h.config.topics.human, "Escalation", 1)).find((x) => x.intent.intentKey === escalated.intentKey), { message: "the escalation of T-RP" });
    const applies = () => h.records.patchRequests(e.intent.intentKey).filter((r) => r.outcome === "applied");

    // Ops applies the escalation while the helpdesk is down: its pending entry staged, its reads answered 503. A second
    // read comes after an outage pause, which follows the pending entry's acknowledgement.
    proxy.down = true;
    const first = ops.resolve(e, { decision: "apply" });
    const reads = () => proxy.seen.filter((r) => r.status === 503 && r.path === "/records/ticket/T-RP").length;
    await waitFor(() => reads() >= 2, { timeoutMs: 30_000, message: () => `ops's apply meeting the outage (${reads()} reads)` });
    // The ticket changes meanwhile, outside writ; lead, not yet allowed to resolve, decides on it: refused.
    h.records.seed("ticket", "T-RP", { status: "reopened", tags: [] });
    const now = await readVersion(h.records, "ticket", "T-RP");
    const refused = await lead.resolve(e, { decision: "apply", baseVersion: now.version });
    expect(refused).toMatchObject({ status: "rejected", reason: "tool_not_allowed", duplicate: false });
    // The helpdesk is back: ops's apply meets the changed ticket, and the escalation is open again.
    proxy.down = false;
    expect(await first).toMatchObject({ status: "rejected", reason: "resolution_conflict" });
    const bytes = await recordedIntent(h, refused.intentId);

    // Lead granted writ.resolve (owners restarted with the registry); lead's refused resolution's bytes again.
    await owners.stop();
    await h.startRouter({ agents: registry({ ...before, lead: ["tag_ticket", "writ.resolve"] }), systems: systems(), config });
    await produceAgain(h, bytes);
    const mine = () => replies.filter(([id]) => id === refused.intentId).map(([, ...rest]) => rest);
    await waitFor(() => mine().length >= 2, { timeoutMs: 30_000, message: () => `the replay's answer (${mine().length} answers seen)` });
    expect(mine()).toEqual([
      ["rejected", "tool_not_allowed", false],
      ["rejected", "tool_not_allowed", true],
    ]);
    expect(applies()).toEqual([]);
    expect((await readVersion(h.records, "ticket", "T-RP")).state.tags).toEqual([]);

    // The escalation is still open: lead's new decision (a new resolution) is carried out, written once.
    expect(await lead.resolve(e, { decision: "apply", baseVersion: now.version })).toMatchObject({ status: "applied", via: "patch", duplicate: false });
    expect(applies()).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-RP")).state.tags).toEqual(["needs-human"]);
  });
});
