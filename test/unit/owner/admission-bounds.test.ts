// The gate's bounds at their edges: an intent exactly as large and as deep as owners admit, and the resolution of
// it, which carries it one level down with a change as large (resolutionBounds); one byte or one level past either
// is dead-lettered before anything walks it.
import type { IHeaders, KafkaMessage } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { jsonDepth } from "../../../src/canonical-json.ts";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey } from "../../../src/keys.ts";
import { type Admission, type AdmissionDeps, admit } from "../../../src/owner/admission.ts";
import { KIND_HEADER, resolutionBounds } from "../../../src/schemas/resolution.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { nested } from "../../helpers/nested.ts";
import { FakeSystem } from "./fake-system.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const REPLY_TO = "writ.replies.agent-1";
const OPS_REPLY_TO = "writ.replies.ops";
const SOURCE = { topic: "writ.intents", partition: 0, offset: "7" };
const MAX_BYTES = 4_096;
const MAX_DEPTH = 10;
const BOUNDS = resolutionBounds({ maxIntentBytes: MAX_BYTES, maxJsonDepth: MAX_DEPTH });

const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string().min(1) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

const deps: AdmissionDeps = {
  config: { maxIntentBytes: MAX_BYTES, maxJsonDepth: MAX_DEPTH, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: 24, topics: { intents: "writ.intents" } },
  codec: new WireCodec({}),
  tools: admitTools([tagTicket], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 }),
  replyTopics: { exists: async (topic) => topic === REPLY_TO || topic === OPS_REPLY_TO },
  now: () => NOW,
  partitions: 1,
};

const ENTITY = { type: "ticket", id: "T-1" };
const KEY = intentKey({ agentId: "agent-1", tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, runId: "run-1", stepId: "s1", entity: ENTITY, params: { tag: "vip" } });

/** An intent whose tags are `tags`: the intent is 3 levels deeper than they are (intent, delta, operation). */
function intent(tags: unknown): Record<string, unknown> {
  return {
    intentId: "intent-1",
    intentKey: KEY,
    entity: ENTITY,
    tool: "tag_ticket",
    agent: { id: "agent-1", runId: "run-1", stepId: "s1" },
    baseVersion: '"1"',
    delta: [{ op: "replace", path: "/tags", value: tags }],
    params: { tag: "vip" },
    replyTo: REPLY_TO,
    createdAt: NOW.toISOString(),
  };
}

/** The tags that make the intent's JSON exactly `bytes` long. */
function tagsOf(bytes: number): unknown {
  const bare = Buffer.byteLength(JSON.stringify(intent(["vip", ""])));
  return ["vip", "x".repeat(bytes - bare)];
}

function resolution(escalated: Record<string, unknown>, extra: Record<string, unknown> = {}): Record<string, unknown> {
  return {
    kind: "resolution",
    resolutionId: "res-1",
    escalationId: "esc-1",
    intent: escalated,
    decision: "apply",
    baseVersion: '"2"',
    operator: { id: "ops" },
    replyTo: OPS_REPLY_TO,
    entity: ENTITY,
    createdAt: NOW.toISOString(),
    ...extra,
  };
}

function record(value: unknown, headers: IHeaders = {}): KafkaMessage {
  return { key: Buffer.from("ticket:T-1"), value: Buffer.from(typeof value === "string" ? value : JSON.stringify(value)), timestamp: "0", attributes: 0, offset: SOURCE.offset, headers } as KafkaMessage;
}
const resolutionRecord = (value: unknown) => record(value, { [KIND_HEADER]: Buffer.from("resolution") });

/** The admission's kind, and for an answer its reason and whether it was dead-lettered. */
function outcome(a: Admission): string {
  return a.kind === "answered" ? `${a.reason}${a.effects.deadLetters.length > 0 ? " (dead letter)" : ""}` : a.kind;
}

describe("the gate's bounds at their edges", () => {
  it("admits an intent exactly maxJsonDepth deep, and a resolution carrying it (one level more); one level more of either is dead-lettered too_deep", async () => {
    const deepest = intent(["vip", nested(MAX_DEPTH - 4)]);
    expect(jsonDepth(deepest, 64)).toBe(MAX_DEPTH);
    expect(outcome(await admit(record(deepest), SOURCE, deps))).toBe("admitted");
    expect(outcome(await admit(record(intent(["vip", nested(MAX_DEPTH - 3)])), SOURCE, deps))).toBe("too_deep (dead letter)");

    // Its resolution, with a delta as deep as one in an intent may be (maxJsonDepth less one).
    const delta = deepest.delta;
    expect(jsonDepth(delta, 64)).toBe(BOUNDS.delta.maxDepth);
    expect(jsonDepth(resolution(deepest, { delta }), 64)).toBe(BOUNDS.maxDepth);
    expect(outcome(await admit(resolutionRecord(resolution(deepest, { delta })), SOURCE, deps))).toBe("resolution");
    // One level past the resolution's bound: refused before anything walks it.
    const tooDeep = resolution(intent(["vip", nested(MAX_DEPTH - 3)]));
    expect(jsonDepth(tooDeep, 64)).toBe(BOUNDS.maxDepth + 1);
    expect(outcome(await admit(resolutionRecord(tooDeep), SOURCE, deps))).toBe("too_deep (dead letter)");
    // A delta deeper than an intent's may be, within the whole record's bound: refused too.
    const deepDelta = [{ op: "replace", path: "/tags", value: nested(MAX_DEPTH - 2) }];
    expect(jsonDepth(resolution(deepest, { delta: deepDelta }), 64)).toBe(BOUNDS.maxDepth);
    const refused = await admit(resolutionRecord(resolution(deepest, { delta: deepDelta })), SOURCE, deps);
    expect(outcome(refused)).toBe("too_deep (dead letter)");
    expect(refused.kind === "answered" && refused.effects.deadLetters[0]!.value.message).toMatch(/^resolution: its delta is nested deeper than 9 levels/);
  });

  it("admits an intent of exactly maxIntentBytes, and a resolution carrying it with a delta as large; one byte more of either is dead-lettered too_large", async () => {
    const largest = intent(tagsOf(MAX_BYTES));
    expect(Buffer.byteLength(JSON.stringify(largest))).toBe(MAX_BYTES);
    expect(outcome(await admit(record(largest), SOURCE, deps))).toBe("admitted");
    expect(outcome(await admit(record(intent(tagsOf(MAX_BYTES + 1))), SOURCE, deps))).toBe("too_large (dead letter)");

    // The delta: as large as an intent, with the longest message; then the record padded to its bound exactly.
    const deltaOf = (bytes: number) => [{ op: "replace", path: "/tags", value: "x".repeat(bytes - Buffer.byteLength(JSON.stringify([{ op: "replace", path: "/tags", value: "" }]))) }];
    const full = resolution(largest, { delta: deltaOf(MAX_BYTES), message: "m".repeat(2_000) });
    const pad = (r: Record<string, unknown>, total: number) => ({ ...r, pad: "p".repeat(total - Buffer.byteLength(JSON.stringify({ ...r, pad: "" }))) });
    expect(outcome(await admit(resolutionRecord(pad(full, BOUNDS.maxBytes)), SOURCE, deps))).toBe("resolution");
    expect(outcome(await admit(resolutionRecord(pad(full, BOUNDS.maxBytes + 1)), SOURCE, deps))).toBe("too_large (dead letter)");
    // A delta larger than an intent may be, within the whole record's bound: refused too.
    const refused = await admit(resolutionRecord(resolution(largest, { delta: deltaOf(MAX_BYTES + 1) })), SOURCE, deps);
    expect(outcome(refused)).toBe("too_large (dead letter)");
    expect(refused.kind === "answered" && refused.effects.deadLetters[0]!.value.message).toMatch(/^resolution: its delta is 4097 bytes as JSON, over the 4096/);
  });

  it("dead-letters an intent within maxIntentBytes as sent whose canonical JSON is larger (numbers as JavaScript writes them): its escalation and resolution would be", async () => {
    // `1e20` is 21 bytes as JavaScript writes it, in an escalation and in the resolution an operator sends back.
    const numbers = `[${Array.from({ length: 400 }, () => "1e20").join(",")}]`;
    const text = JSON.stringify(intent(["vip"])).replace('["vip"]', numbers);
    expect(Buffer.byteLength(text)).toBeLessThanOrEqual(MAX_BYTES);
    expect(Buffer.byteLength(JSON.stringify(JSON.parse(text)))).toBeGreaterThan(MAX_BYTES);
    const a = await admit(record(text), SOURCE, deps);
    expect(outcome(a)).toBe("too_large (dead letter)");
    expect(a.kind === "answered" && a.effects.deadLetters[0]!.value.message).toMatch(/as canonical JSON/);
    // As many as fit written as JavaScript writes them: admitted.
    expect(outcome(await admit(record(JSON.stringify(intent(["vip", ...Array.from({ length: 100 }, () => 1e20)]))), SOURCE, deps))).toBe("admitted");
  });
});
