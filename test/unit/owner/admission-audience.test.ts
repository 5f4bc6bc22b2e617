// The signing audience at admission (WRIT_SIGNING_AUDIENCE, docs/wire-contract.md §7): an owner that requires one
// admits a signed intent or resolution only when the `audience` it carries (signed with it) is its own; anything
// else is refused unauthenticated, as a bad signature is, so bytes signed for another deployment that lists the same
// agent key are not replayed here. Checked after the signature only; without a required audience nothing changes.
import { generateKeyPairSync } from "node:crypto";
import type { IHeaders, KafkaMessage } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey } from "../../../src/keys.ts";
import { type Admission, type AdmissionDeps, admit, audienceRefusal, RESOLVE_TOOL } from "../../../src/owner/admission.ts";
import { Reply } from "../../../src/schemas/reply.ts";
import { AgentRegistry } from "../../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../../src/security/signing.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";

const NOW = new Date("2025-06-01T12:00:00.000Z");
const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string().min(1) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags", "/tags/-"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
});
const tools = admitTools([tagTicket], [new FakeSystem("helpdesk")], { sorTimeoutMs: 1_000 });

const alice = generateKeyPairSync("ed25519");
const operatorKey = generateKeyPairSync("ed25519");
const registry = AgentRegistry.from({
  agents: {
    alice: { keys: [{ id: "k1", publicKey: alice.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["tag_ticket"], replyTopic: "writ.replies.alice" },
    ops: { keys: [{ id: "k1", publicKey: operatorKey.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: [RESOLVE_TOOL], replyTopic: "writ.replies.ops" },
  },
});

function deps(signingAudience: string | undefined, agents: AgentRegistry | undefined = registry): AdmissionDeps {
  return {
    config: {
      maxIntentBytes: 262_144,
      maxJsonDepth: 32,
      replyTopicPrefix: "writ.replies.",
      ledgerRetentionHours: 24,
      topics: { intents: "writ.intents" },
      ...(signingAudience === undefined ? {} : { signingAudience }),
    },
    codec: new WireCodec({}),
    tools,
    replyTopics: { exists: async (t) => ["writ.replies.alice", "writ.replies.ops"].includes(t) },
    now: () => NOW,
    agents,
    partitions: 1,
  };
}

function intent(audience?: string): Record<string, unknown> {
  const entity = { type: "ticket", id: "T-1" };
  return {
    intentId: "i-1",
    intentKey: intentKey({ tool: { name: "tag_ticket", keyScope: "run", intentFields: ["tag"] }, agentId: "alice", runId: "r", stepId: "s", entity, params: { tag: "vip" } }),
    entity,
    tool: "tag_ticket",
    agent: { id: "alice", runId: "r", stepId: "s" },
    baseVersion: '"1"',
    delta: [{ op: "add", path: "/tags/-", value: "vip" }],
    params: { tag: "vip" },
    replyTo: "writ.replies.alice",
    createdAt: NOW.toISOString(),
    ...(audience === undefined ? {} : { audience }),
  };
}

function resolution(audience?: string): Record<string, unknown> {
  return {
    kind: "resolution",
    resolutionId: "res-1",
    escalationId: "esc-1",
    intent: intent(),
    decision: "discard",
    operator: { id: "ops" },
    replyTo: "writ.replies.ops",
    entity: { type: "ticket", id: "T-1" },
    createdAt: NOW.toISOString(),
    ...(audience === undefined ? {} : { audience }),
  };
}

function record(value: unknown, headers: IHeaders): KafkaMessage {
  return { key: Buffer.from("ticket:T-1"), value: Buffer.from(JSON.stringify(value)), timestamp: "0", attributes: 0, offset: "7", headers } as KafkaMessage;
}

const signedBy = (v: unknown, key = alice.privateKey): IHeaders => ({ [SIGNATURE_HEADER]: signIntent(v, { keyId: "k1", privateKey: key }) });
const asResolution = (v: unknown): IHeaders => ({ ...signedBy(v, operatorKey.privateKey), "writ-kind": Buffer.from("resolution") });
const source = { topic: "writ.intents", partition: 0, offset: "7" };

function answer(a: Admission) {
  if (a.kind !== "answered") throw new Error(`expected an answer, got ${a.kind}`);
  for (const r of a.effects.replies) Reply.parse(r.value);
  return {
    reason: a.reason,
    dead: a.effects.deadLetters.map((d) => d.value.reason),
    deadMessage: a.effects.deadLetters[0]?.value.message ?? "",
    replies: a.effects.replies.map((r) => ({ topic: r.topic, value: r.value as Record<string, unknown> })),
  };
}

describe("admission: the signing audience (WRIT_SIGNING_AUDIENCE)", () => {
  it("an intent signed for another deployment's audience is refused unauthenticated: dead-lettered, answered on the agent's registered topic, saying which", async () => {
    const v = intent("staging");
    const a = answer(await admit(record(v, signedBy(v)), source, deps("prod")));
    expect(a).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"] });
    expect(a.deadMessage).toMatch(/^agent alice: audience_mismatch: .*"staging"/);
    expect(a.deadMessage).not.toContain("prod");
    expect(a.replies).toHaveLength(1);
    expect(a.replies[0]!.topic).toBe("writ.replies.alice");
    expect(a.replies[0]!.value).toMatchObject({ status: "rejected", reason: "unauthenticated", intentId: "i-1", details: { problem: "audience_mismatch", received: "staging" } });
  });

  it("a signed intent naming no audience is refused unauthenticated (audience_missing) by an owner that requires one", async () => {
    const v = intent();
    const a = answer(await admit(record(v, signedBy(v)), source, deps("prod")));
    expect(a).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"] });
    expect(a.deadMessage).toMatch(/audience_missing/);
    expect(a.replies[0]!.value).toMatchObject({ reason: "unauthenticated", details: { problem: "audience_missing" } });
  });

  it("an intent signed for the owner's own audience is admitted", async () => {
    const v = intent("prod");
    const a = await admit(record(v, signedBy(v)), source, deps("prod"));
    expect(a.kind).toBe("admitted");
    if (a.kind === "admitted") expect(a.admitted.intent.audience).toBe("prod");
  });

  it("the audience is compared exactly: case, a prefix, a suffix are other audiences", async () => {
    for (const other of ["Prod", "pro", "prod-eu", "prod/"]) {
      const v = intent(other);
      expect(answer(await admit(record(v, signedBy(v)), source, deps("prod"))).reason, other).toBe("unauthenticated");
    }
  });

  it("without a required audience, a signed intent with any audience or none is admitted (as before)", async () => {
    for (const audience of [undefined, "prod", "staging"]) {
      const v = intent(audience);
      expect((await admit(record(v, signedBy(v)), source, deps(undefined))).kind, String(audience)).toBe("admitted");
    }
  });

  it("the audience is covered by the signature: one rewritten to the owner's after signing fails the signature check", async () => {
    const v = intent("staging");
    const headers = signedBy(v);
    const a = answer(await admit(record({ ...v, audience: "prod" }, headers), source, deps("prod")));
    expect(a.reason).toBe("unauthenticated");
    expect(a.deadMessage).toMatch(/not signed by agent alice: the signature does not match/);
    expect(a.deadMessage).not.toMatch(/audience_/);
  });

  it("an unsigned or badly signed intent is refused for its signature, never told about the audience (no probing without the key)", async () => {
    const v = intent("staging");
    for (const headers of [{}, signedBy(v, generateKeyPairSync("ed25519").privateKey)]) {
      const a = answer(await admit(record(v, headers), source, deps("prod")));
      expect(a.reason).toBe("unauthenticated");
      expect(a.deadMessage).not.toMatch(/audience/);
      for (const r of a.replies) expect(r.value.details).toBeUndefined();
    }
  });

  it("a resolution signed for another audience, or for none, is refused unauthenticated; its own audience is admitted; unset admits all", async () => {
    const wrong = resolution("staging");
    const a = answer(await admit(record(wrong, asResolution(wrong)), source, deps("prod")));
    expect(a).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"] });
    expect(a.deadMessage).toMatch(/^operator ops: audience_mismatch/);
    expect(a.replies[0]).toMatchObject({ topic: "writ.replies.ops", value: { intentId: "res-1", reason: "unauthenticated", details: { problem: "audience_mismatch", received: "staging" } } });

    const none = resolution();
    const b = answer(await admit(record(none, asResolution(none)), source, deps("prod")));
    expect(b).toMatchObject({ reason: "unauthenticated", dead: ["unauthenticated"] });
    expect(b.replies[0]!.value).toMatchObject({ details: { problem: "audience_missing" } });

    const right = resolution("prod");
    expect((await admit(record(right, asResolution(right)), source, deps("prod"))).kind).toBe("resolution");
    for (const r of [wrong, none, right]) expect((await admit(record(r, asResolution(r)), source, deps(undefined))).kind).toBe("resolution");
  });

  it("a resolution's audience is its own, not its intent's: an intent carrying the owner's audience does not make the resolution this deployment's", async () => {
    const r = { ...resolution("staging"), intent: intent("prod") };
    expect(answer(await admit(record(r, asResolution(r)), source, deps("prod"))).reason).toBe("unauthenticated");
  });

  it("an audience outside 1–128 of A-Z a-z 0-9 . _ : / - fails the schema before anything else (schema_invalid)", async () => {
    for (const bad of ["", "x".repeat(129), "prod\u001b[2J", "prod env"]) {
      const v = intent(bad);
      const a = answer(await admit(record(v, signedBy(v)), source, deps("prod")));
      expect(a.reason, JSON.stringify(bad)).toBe("schema_invalid");
    }
  });

  it("audienceRefusal quotes a received audience bounded and printable", () => {
    const hostile = `${"a".repeat(200)}\u001b]52;c;x\u0007`;
    const refusal = audienceRefusal(hostile, "prod", "intent")!;
    expect(refusal.details).toMatchObject({ problem: "audience_mismatch" });
    const received = (refusal.details as { received: string }).received;
    expect(received.length).toBeLessThanOrEqual(129);
    expect(received).not.toMatch(/[\x00-\x1f\x7f-\x9f]/);
    expect(refusal.message.length).toBeLessThan(500);
    expect(audienceRefusal("prod", "prod", "intent")).toBeNull();
    expect(audienceRefusal(undefined, undefined, "intent")).toBeNull();
  });
});
