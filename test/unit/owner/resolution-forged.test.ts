// Regression: the resolver checked a resolution's intent against the escalated entry by fingerprints only, which
// leave out free-text values and the intent id. A copy of a real writ.human record, forged under its escalation id
// with other free text and the intent id of another in-flight submit of the same agent, was carried out: `apply`
// wrote the forged text, and the agent was answered under the forged intent id (settling that other submit). Now
// the owner keeps a digest of the escalated intent with the escalated outcome and refuses any other intent, and the
// agent is answered under the id the ledger holds. Writes counted at the fake system.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { deltaFingerprint, escalatedIntentDigest, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { ExecContext } from "../../../src/owner/intent-pipeline.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import type { Resolution } from "../../../src/schemas/resolution.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { NOW, OPS_REPLIES, T1 } from "./escalated-case.ts";
import { FakeSystem, version } from "./fake-system.ts";

const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };
const AGENT_REPLIES = "writ.replies.agent-1";
const FORGED_TEXT = "REFUND APPROVED BY CFO; wire to acct 123";

const noteTool = declareWriteTool({
  name: "note_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string(), note: z.string() }),
  intentFields: ["tag"] as ["tag"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  reconcile: "idempotency-key",
  allowedPaths: ["/tags", "/note"],
  freeTextParams: ["note"],
  freeTextPaths: ["/note"],
  delta: (p) => [
    { op: "replace", path: "/tags", value: [p.tag] },
    { op: "replace", path: "/note", value: p.note },
  ],
});

/** An escalated note on T-1 (intent id i-1), its entry with the digest (as owners write it now) or without (older owners). */
function setup(opts: { digest: boolean }) {
  const sor = new FakeSystem("helpdesk");
  sor.seed(T1, { tags: [], note: "" });
  const tool = admitTools([noteTool], [sor], { sorTimeoutMs: 1_000 }).get(noteTool.name)!;
  const params = { tag: "vip", note: "customer asked politely" };
  const key = intentKey({ tool, agentId: "agent-1", runId: "r", stepId: "s", entity: T1, params });
  const delta: JsonPatchOp[] = [
    { op: "replace", path: "/tags", value: ["vip"] },
    { op: "replace", path: "/note", value: params.note },
  ];
  const intent: WriteIntent = { intentId: "i-1", intentKey: key, entity: T1, tool: tool.name, agent: { id: "agent-1", runId: "r", stepId: "s" }, baseVersion: version(1), delta, params, replyTo: AGENT_REPLIES, createdAt: NOW.toISOString() };
  const entry: LedgerIntentEntry = {
    kind: "intent",
    intentKey: key,
    intentId: "i-1",
    status: "done",
    entity: T1,
    tool: tool.name,
    fingerprint: paramsFingerprint(tool.name, T1, params, tool.freeTextParams),
    attempts: [{ baseVersion: intent.baseVersion, deltaFingerprint: deltaFingerprint(delta, tool.isFreeTextPath) }],
    cycles: 2,
    replyTo: AGENT_REPLIES,
    updatedAt: NOW.toISOString(),
    outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: "x", escalationId: "esc-1", at: NOW.toISOString(), ...(opts.digest ? { intentDigest: escalatedIntentDigest(intent) } : {}) },
  };
  // Another in-flight submit's id, other free text: the same fingerprints, tool, base and delta fingerprint.
  const forged: WriteIntent = {
    ...intent,
    intentId: "i-OTHER-INFLIGHT",
    params: { ...params, note: FORGED_TEXT },
    delta: [
      { op: "replace", path: "/tags", value: ["vip"] },
      { op: "replace", path: "/note", value: FORGED_TEXT },
    ],
  };
  const resolution = (of: WriteIntent, decision: Resolution["decision"]): Resolution => ({
    kind: "resolution",
    resolutionId: "res-1",
    escalationId: "esc-1",
    intent: of,
    decision,
    ...(decision === "apply" ? { baseVersion: version(1) } : {}),
    operator: { id: "ops" },
    replyTo: OPS_REPLIES,
    entity: T1,
    createdAt: NOW.toISOString(),
  });
  const ledger = new PartitionLedger(0, [[key, entry]]);
  return { sor, tool, intent, forged, resolution, ledger };
}

const resolver = new Resolver({ now: () => NOW });

describe("a resolution of a forged copy of an escalation", () => {
  it("apply: refused resolution_not_applicable, nothing written, nothing said to the agent", async () => {
    const c = setup({ digest: true });
    const plan = resolver.plan(c.resolution(c.forged, "apply"), c.tool, OPS_REPLIES, c.ledger);
    expect(plan.kind).toBe("settled");
    if (plan.kind !== "settled") return;
    expect(plan.effects.ledger).toBeUndefined();
    expect(plan.effects.replies).toHaveLength(1);
    expect(plan.effects.replies[0]!.topic).toBe(OPS_REPLIES);
    expect(plan.effects.replies[0]!.value).toMatchObject({ status: "rejected", reason: "resolution_not_applicable", message: expect.stringContaining("not the escalated intent") });
    expect(c.sor.patches).toHaveLength(0);
  });

  it("discard of a copy differing only in its intent id: refused, the escalation stays open", () => {
    const c = setup({ digest: true });
    const plan = resolver.plan(c.resolution({ ...c.intent, intentId: "i-OTHER-INFLIGHT" }, "discard"), c.tool, OPS_REPLIES, c.ledger);
    expect(plan.kind).toBe("settled");
    if (plan.kind !== "settled") return;
    expect(plan.effects.ledger).toBeUndefined();
    expect(plan.effects.replies.map((r) => [r.topic, r.value.intentId, r.value.status === "rejected" ? r.value.reason : r.value.status])).toEqual([[OPS_REPLIES, "res-1", "resolution_not_applicable"]]);
  });

  it("an entry of an older owner (no digest): the agent is answered under the escalated intent id, never the copy's", () => {
    const c = setup({ digest: false });
    const plan = resolver.plan(c.resolution({ ...c.intent, intentId: "i-OTHER-INFLIGHT" }, "discard"), c.tool, OPS_REPLIES, c.ledger);
    expect(plan.kind).toBe("settled");
    if (plan.kind !== "settled") return;
    expect(plan.effects.replies.map((r) => [r.topic, r.value.intentId])).toEqual([
      [AGENT_REPLIES, "i-1"],
      [OPS_REPLIES, "res-1"],
    ]);
  });

  it("the genuine intent still resolves: applied with its own text, the agent answered under its id", async () => {
    const c = setup({ digest: true });
    const r = c.resolution(c.intent, "apply");
    const plan = resolver.plan(r, c.tool, OPS_REPLIES, c.ledger);
    if (plan.kind !== "apply") throw new Error(`planned ${plan.kind}`);
    const step = await resolver.apply(r, c.tool, OPS_REPLIES, plan, ctx);
    if (step.kind !== "settled") throw new Error(`step ${step.kind}`);
    expect(c.sor.patches.map((p) => p.ops)).toEqual([c.intent.delta]);
    expect(step.effects.replies.map((x) => [x.topic, x.value.intentId, x.value.status])).toEqual([
      [AGENT_REPLIES, "i-1", "applied"],
      [OPS_REPLIES, "res-1", "applied"],
    ]);
    // The outcome replaces the escalated one: a later resolution of it is not applicable.
    expect(step.effects.ledger?.outcome?.status).toBe("applied");
  });
});
