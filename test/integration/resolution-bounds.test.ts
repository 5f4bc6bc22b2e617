// Escalations of intents at the owners' bounds (maxJsonDepth deep, maxIntentBytes large) resolved by the TypeScript
// client, the CLI and the console; resolutions past the bounds a resolution of them is allowed are dead-lettered.
import { randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it, onTestFinished } from "vitest";
import type { IntentInput } from "../../producers/client-api.ts";
import { DEFAULT_MAX_INTENT_BYTES, DEFAULT_MAX_JSON_DEPTH, type WritClient } from "../../producers/writ-client.ts";
import { jsonDepth } from "../../src/canonical-json.ts";
import { WireCodec } from "../../src/codec.ts";
import { startConsole } from "../../src/console/server.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import { KIND_HEADER, resolutionBounds } from "../../src/schemas/resolution.ts";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";
import { nested } from "../helpers/nested.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, cliEnv, escalatedCase, registryUrl, startHarness, tagTicketNoDelta, writ } from "../helpers/writ-harness.ts";

const bounds = resolutionBounds({ maxIntentBytes: DEFAULT_MAX_INTENT_BYTES, maxJsonDepth: DEFAULT_MAX_JSON_DEPTH });

/** The tag intent with its tags nested so that the whole intent is exactly the owners' maxJsonDepth deep. */
function deepest(input: IntentInput): IntentInput {
  // intent → delta → operation → tags → …: the tags take what the three levels above them leave.
  return { ...input, delta: [{ op: "replace", path: "/tags", value: ["needs-human", nested(DEFAULT_MAX_JSON_DEPTH - 4)] }] };
}

/** The tag intent padded so that its encoded value is exactly the owners' maxIntentBytes (as the client sends it). */
async function largest(agent: WritClient, codec: WireCodec, topic: string, input: IntentInput): Promise<WriteIntent> {
  const padded = (pad: number) => agent.buildIntent({ ...input, delta: [{ op: "replace", path: "/tags", value: ["needs-human", "x".repeat(pad)] }] });
  const bare = (await codec.encode(topic, "WriteIntent", padded(0))).length;
  const intent = padded(DEFAULT_MAX_INTENT_BYTES - bare);
  expect((await codec.encode(topic, "WriteIntent", intent)).length).toBe(DEFAULT_MAX_INTENT_BYTES);
  return intent;
}

describe("resolving escalations of intents at the owners' bounds", () => {
  it("an intent exactly maxJsonDepth deep, escalated: applied by the client with a delta as deep as its own, discarded by the CLI, returned by the console; a resolution one level deeper is dead-lettered too_deep", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const shape = (_agent: WritClient, input: IntentInput) => deepest(input);
    const escalate = (n: string) => escalatedCase(h, `agent-deep-${n}`, `T-deep-${n}`, tagTicketNoDelta, shape);
    const [a, b, c] = await Promise.all([escalate("a"), escalate("b"), escalate("c")]);
    expect(jsonDepth(a.escalation.intent, 64)).toBe(DEFAULT_MAX_JSON_DEPTH);
    const delta = a.escalation.intent.delta;
    expect(jsonDepth(delta, 64)).toBe(bounds.delta.maxDepth);

    // The TypeScript client: apply, with the intent's own change as the delta (the tool has no delta function).
    const ops = await h.client(`ops-deep-${h.id}`);
    const applied = await ops.resolve(a.escalation, { decision: "apply", delta }, { timeoutMs: 30_000 });
    expect(applied).toMatchObject({ status: "applied", resolvedBy: `ops-deep-${h.id}` });
    await waitFor(() => a.seen.find((r) => r.intentId === a.escalatedReply.intentId && r.status === "applied"), { message: "the agent's applied reply" });
    // written once, at the records server, with the escalated change
    expect(h.records.patchRequests(a.escalatedReply.intentKey)).toHaveLength(1);
    expect(h.records.history("ticket", "T-deep-a").filter((e) => e.kind === "patch").map((e) => e.ops)).toEqual([delta]);

    // The CLI: discard.
    const discarded = await writ(["escalations", "resolve", b.escalation.escalationId, "--discard", "--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"], cliEnv(h));
    expect(discarded.code, discarded.stdout + discarded.stderr).toBe(0);
    expect(JSON.parse(discarded.stdout)).toMatchObject({ status: "rejected", reason: "escalation_discarded" });
    await waitFor(() => b.seen.find((r) => r.intentId === b.escalatedReply.intentId && r.status === "rejected"), { message: "the agent told of the discard" });

    // The console: return to the agent.
    const operatorToken = `oper-${randomUUID()}`;
    const console_ = await startConsole({
      brokers: brokers(),
      ...(registryUrl() ? { schemaRegistryUrl: registryUrl()! } : {}),
      topics: { intents: h.config.topics.intents, human: h.config.topics.human, dlq: h.config.topics.dlq },
      replyPrefix: `writ.replies.cons-${h.id}-`,
      groupId: h.config.groupId,
      token: `read-${randomUUID()}`,
      operatorToken,
      operator: { id: `ops-console-${h.id}`, replyTopic: `writ.replies.cons-${h.id}-ops` },
      discoverIntervalMs: 300,
      logger: pino({ level: process.env.LOG_LEVEL ?? "warn" }),
    });
    onTestFinished(() => console_.close());
    await console_.ready;
    const headers = { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: console_.url };
    await waitFor(async () => JSON.stringify(await (await fetch(`${console_.url}/api/state`, { headers })).json()).includes(c.escalation.escalationId), { message: "the console has read the escalation" });
    const returned = await fetch(`${console_.url}/api/escalations/${encodeURIComponent(c.escalation.escalationId)}/resolve`, { method: "POST", headers, body: JSON.stringify({ decision: "return", message: "too deep for me" }) });
    expect([returned.status, await returned.json()]).toMatchObject([200, { answer: { status: "rejected", reason: "returned_by_operator" } }]);
    await waitFor(() => c.seen.find((r) => r.intentId === c.escalatedReply.intentId && r.status === "rejected"), { message: "the agent told of the return" });

    // Nothing but the apply was written.
    expect(h.records.history("ticket", "T-deep-b").filter((e) => e.kind === "patch")).toHaveLength(0);
    expect(h.records.history("ticket", "T-deep-c").filter((e) => e.kind === "patch")).toHaveLength(0);

    // Hostile resolutions, sent as any producer can: one level past what a resolution may nest (its intent one
    // deeper than owners admit), and one whose delta is deeper than an intent's may be, are dead-lettered too_deep.
    const resolution = (intent: unknown, delta?: unknown) => ({
      kind: "resolution",
      resolutionId: randomUUID(),
      escalationId: a.escalation.escalationId,
      intent,
      decision: "apply",
      baseVersion: '"v1"',
      ...(delta === undefined ? {} : { delta }),
      operator: { id: "mallory" },
      replyTo: `writ.replies.mallory.${h.id}`,
      entity: { type: "ticket", id: "T-deep-a" },
      createdAt: new Date().toISOString(),
    });
    const tooDeepIntent = { ...a.escalation.intent, delta: [{ op: "replace", path: "/tags", value: ["needs-human", nested(DEFAULT_MAX_JSON_DEPTH - 3)] }] };
    const tooDeepDelta = [{ op: "replace", path: "/tags", value: nested(DEFAULT_MAX_JSON_DEPTH - 2) }];
    expect(jsonDepth(resolution(tooDeepIntent), 64)).toBe(bounds.maxDepth + 1);
    expect([jsonDepth(resolution(a.escalation.intent, tooDeepDelta), 64), jsonDepth(tooDeepDelta, 64)]).toEqual([bounds.maxDepth, bounds.delta.maxDepth + 1]);
    const producer = new Kafka({ brokers: brokers(), clientId: `hostile-${h.id}`, logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    await producer.send({
      topic: h.config.topics.intents,
      messages: [resolution(tooDeepIntent), resolution(a.escalation.intent, tooDeepDelta)].map((r) => ({ key: "ticket:T-deep-a", value: JSON.stringify(r), headers: { [KIND_HEADER]: "resolution" } })),
    });
    const dead = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 2)) as DeadLetter[];
    expect(dead.map((d) => [d.reason, d.message])).toEqual([
      ["too_deep", `resolution: JSON nested deeper than ${bounds.maxDepth} levels`],
      ["too_deep", expect.stringMatching(new RegExp(`^resolution: its delta is nested deeper than ${bounds.delta.maxDepth} levels`))],
    ]);
    expect(h.records.patchRequests(a.escalatedReply.intentKey)).toHaveLength(1);
  }, 180_000);

  it("an intent of exactly maxIntentBytes, escalated: applied with a delta as large as its own by the client and by the CLI; a resolution past its byte bound is dead-lettered too_large", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const codec = new WireCodec({ ...(registryUrl() ? { schemaRegistryUrl: registryUrl()! } : {}) });
    const shape = (agent: WritClient, input: IntentInput) => largest(agent, codec, h.config.topics.intents, input);
    const escalate = (n: string) => escalatedCase(h, `agent-big-${n}`, `T-big-${n}`, tagTicketNoDelta, shape);
    const [a, b] = await Promise.all([escalate("a"), escalate("b")]);

    // The TypeScript client: apply, the intent's own change as the delta, both carried whole in the resolution.
    const ops = await h.client(`ops-big-${h.id}`);
    const delta = a.escalation.intent.delta;
    const applied = await ops.resolve(a.escalation, { decision: "apply", delta }, { timeoutMs: 30_000 });
    expect(applied).toMatchObject({ status: "applied", resolvedBy: `ops-big-${h.id}` });
    expect(h.records.patchRequests(a.escalatedReply.intentKey)).toHaveLength(1);
    expect(h.records.history("ticket", "T-big-a").filter((e) => e.kind === "patch").map((e) => e.ops)).toEqual([delta]);
    await waitFor(() => a.seen.find((r) => r.intentId === a.escalatedReply.intentId && r.status === "applied"), { message: "the agent's applied reply" });

    // The CLI: apply, the change from a file.
    const file = join(mkdtempSync(join(tmpdir(), "writ-delta-")), "delta.json");
    writeFileSync(file, JSON.stringify(b.escalation.intent.delta));
    const cli = await writ(["escalations", "resolve", b.escalation.escalationId, "--apply", "--delta-file", file, "--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"], cliEnv(h));
    expect(cli.code, cli.stdout + cli.stderr).toBe(0);
    expect(JSON.parse(cli.stdout)).toMatchObject({ status: "applied", resolvedBy: `ops-cli-${h.id}` });
    expect(h.records.patchRequests(b.escalatedReply.intentKey)).toHaveLength(1);

    // One byte past what a resolution may be: dead-lettered too_large before it is parsed.
    const producer = new Kafka({ brokers: brokers(), clientId: `hostile-${h.id}`, logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    await producer.send({ topic: h.config.topics.intents, messages: [{ key: "ticket:T-big-a", value: Buffer.alloc(bounds.maxBytes + 1, 0x20), headers: { [KIND_HEADER]: "resolution" } }] });
    const [dead] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    expect(dead).toMatchObject({ reason: "too_large", originalBytes: bounds.maxBytes + 1 });
    expect(h.records.patchRequests(a.escalatedReply.intentKey)).toHaveLength(1);
  }, 180_000);
});
