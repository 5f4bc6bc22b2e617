// Deltas bound to params: a tool that declares how its delta derives from its params has every intent's
// delta rebuilt right before the PATCH; an intent whose delta says more than its params writes nothing.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { deltaFingerprint, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import { IntentPipeline, type ExecContext } from "../../../src/owner/intent-pipeline.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";

const PAY = { type: "payment", id: "pay_1" };
const refund = declareWriteTool({
  name: "refund",
  recordType: "payment",
  params: z.object({ amountCents: z.number().int().positive() }),
  intentFields: ["amountCents"],
  allowedPaths: [{ path: "/refunds/-", ops: ["add"] }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "billing",
  reconcile: "idempotency-key",
  delta: (p) => [{ op: "add", path: "/refunds/-", value: { amountCents: p.amountCents } }],
});
const unbound = declareWriteTool({ ...refund, name: "refund_unbound", delta: undefined });
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };

function setup() {
  const sor = new FakeSystem("billing");
  sor.seed(PAY, { refunds: [] });
  const tools = admitTools([refund, unbound], [sor], { sorTimeoutMs: 1000 });
  const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }) });
  const intent = (toolName: string, amountCents: number, delta: JsonPatchOp[]): AdmittedIntent => {
    const tool = tools.get(toolName)!;
    const params = { amountCents };
    return {
      intent: {
        intentId: `i-${Math.random()}`,
        intentKey: "a".repeat(64),
        entity: PAY,
        tool: toolName,
        agent: { id: "agent", runId: "r", stepId: "s" },
        baseVersion: version(1),
        delta,
        params,
        replyTo: "writ.replies.agent",
        createdAt: new Date().toISOString(),
      },
      tool,
      entityKey: "payment:pay_1",
      fingerprint: paramsFingerprint(toolName, PAY, params, []),
      deltaFingerprint: deltaFingerprint(delta, () => false),
      params,
    };
  };
  const run = async (a: AdmittedIntent) => {
    const plan = pipeline.classify(a, new PartitionLedger(0));
    if (plan.kind !== "write") throw new Error(plan.kind);
    return pipeline.execute(a, plan.pending, plan.state, ctx);
  };
  return { sor, intent, run };
}

const big = [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 99_999_999 } }];

describe("deltas bound to params", () => {
  it("a refund of 1 cent in its params cannot write 99,999,999 from its delta: rejected delta_mismatch, nothing written", async () => {
    const { sor, intent, run } = setup();
    const step = await run(intent("refund", 1, big));
    expect(step).toMatchObject({ kind: "settled" });
    expect((step as { effects: { replies: { value: unknown }[] } }).effects.replies[0]!.value).toMatchObject({ status: "rejected", reason: "delta_mismatch" });
    expect(sor.patchCount(PAY)).toBe(0);
    expect(sor.current(PAY)?.state).toEqual({ refunds: [] });
  });

  it("the delta its params give is written", async () => {
    const { sor, intent, run } = setup();
    await run(intent("refund", 1, [{ op: "add", path: "/refunds/-", value: { amountCents: 1 } }]));
    expect(sor.current(PAY)?.state).toEqual({ refunds: [{ amountCents: 1 }] });
  });

  it("ablation: the same tool without a delta declaration writes what the delta says", async () => {
    const { sor, intent, run } = setup();
    await run(intent("refund_unbound", 1, big));
    expect(sor.current(PAY)?.state).toEqual({ refunds: [{ amountCents: 99_999_999 }] });
  });

  it("a delta rebuilt from a record holding a lone surrogate cannot be compared: rejected not_canonical, nothing written", async () => {
    // The tool copies the record's label into its delta; the system of record holds "\ud800" (legal JSON text).
    const relabel = declareWriteTool({
      ...refund,
      name: "refund_relabel",
      delta: (p, current) => [{ op: "add", path: "/refunds/-", value: { amountCents: p.amountCents, label: (current.state as { label: string }).label } }],
    });
    const sor = new FakeSystem("billing");
    sor.seed(PAY, { refunds: [], label: "cut \ud83d" });
    const tools = admitTools([relabel], [sor], { sorTimeoutMs: 1000 });
    const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }) });
    const params = { amountCents: 1 };
    const delta: JsonPatchOp[] = [{ op: "add", path: "/refunds/-", value: { amountCents: 1, label: "cut" } }];
    const a: AdmittedIntent = {
      intent: { intentId: "i-1", intentKey: "a".repeat(64), entity: PAY, tool: "refund_relabel", agent: { id: "agent", runId: "r", stepId: "s" }, baseVersion: version(1), delta, params, replyTo: "writ.replies.agent", createdAt: new Date().toISOString() },
      tool: tools.get("refund_relabel")!,
      entityKey: "payment:pay_1",
      fingerprint: paramsFingerprint("refund_relabel", PAY, params, []),
      deltaFingerprint: deltaFingerprint(delta, () => false),
      params,
    };
    const plan = pipeline.classify(a, new PartitionLedger(0));
    if (plan.kind !== "write") throw new Error(plan.kind);
    const step = await pipeline.execute(a, plan.pending, plan.state, ctx);
    expect(step).toMatchObject({ kind: "settled" });
    const reply = (step as { effects: { replies: { value: { message: string } }[] } }).effects.replies[0]!.value;
    expect(reply).toMatchObject({ status: "rejected", reason: "not_canonical" });
    expect(reply.message).toContain("at /0/value/label");
    expect(sor.patchCount(PAY)).toBe(0);
  });

  it("owners with an agent registry refuse to start with a tool that does not bind its delta", () => {
    const sor = new FakeSystem("billing");
    expect(() => admitTools([unbound], [sor], { sorTimeoutMs: 1000, requireDelta: true })).toThrow(/missing delta/);
    expect(admitTools([refund], [sor], { sorTimeoutMs: 1000, requireDelta: true }).size).toBe(1);
  });
});
