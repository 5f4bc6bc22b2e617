// Regression: an owner that stopped in the middle of applying an operator's decision left the ledger entry
// `pending` with the escalation still recorded. The resolution record, read again from the committed offset, was
// refused ("not open"), and the entry stayed pending for good. Now the apply resumes: it reconciles first, so a
// write that reached the system of record before the stop is never made twice. Counted at the fake system.
// Regression too: an escalation whose write may have happened under another reason than `outcome_unknown` (a
// `sor_protocol` after an unknown outcome; an operator's apply whose answer was lost) was applied without a
// reconcile, and the change landed twice. The ledger now says so (`mayHaveWritten`), and the apply reconciles first.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { deltaFingerprint, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import { type ExecContext, IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import { Escalation } from "../../../src/schemas/escalation.ts";
import type { Resolution } from "../../../src/schemas/resolution.ts";
import { escalatedCase, NOW, T1 } from "./escalated-case.ts";
import { outage, protocolError, version } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";

const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };

function setup(status: "pending" | "done") {
  return escalatedCase(addTag, { status, state: { tags: [] }, delta: [{ op: "add", path: "/tags/-", value: "vip" }] });
}

describe("an operator's apply, resumed after its owner stopped mid-way", () => {
  it("settles as applied by reconciling when the write had reached the system: no second PATCH", async () => {
    const { sor, tool, key, resolution, ledger } = setup("pending");
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "vip" }], key); // the write the stopped owner made
    const resolver = new Resolver({ now: () => NOW });
    const plan = resolver.plan(resolution, tool, resolution.intent.replyTo, ledger);
    expect(plan).toMatchObject({ kind: "apply", resumed: true });
    if (plan.kind !== "apply") return;
    const step = await resolver.apply(resolution, tool, resolution.intent.replyTo, plan, ctx);
    expect(step.kind).toBe("settled");
    if (step.kind !== "settled") return;
    expect(step.effects.ledger).toMatchObject({ status: "done", outcome: { status: "applied" } });
    expect(sor.patches).toHaveLength(0);
    expect(sor.commitsOf(key)).toBe(1);
    expect((sor.current(T1)!.state as { tags: string[] }).tags).toEqual(["vip"]);
  });

  it("writes once when the stopped owner had not written", async () => {
    const { sor, tool, key, resolution, ledger } = setup("pending");
    const resolver = new Resolver({ now: () => NOW });
    const plan = resolver.plan(resolution, tool, resolution.intent.replyTo, ledger);
    expect(plan).toMatchObject({ kind: "apply", resumed: true });
    if (plan.kind !== "apply") return;
    const step = await resolver.apply(resolution, tool, resolution.intent.replyTo, plan, ctx);
    expect(step).toMatchObject({ kind: "settled", effects: { ledger: { status: "done", outcome: { status: "applied" } } } });
    expect(sor.patches).toHaveLength(1);
    expect(sor.commitsOf(key)).toBe(1);
  });

  it("refuses to discard while an apply may have written: only an apply can tell", () => {
    const { tool, resolution, ledger } = setup("pending");
    const plan = new Resolver({ now: () => NOW }).plan({ ...resolution, decision: "discard", resolutionId: "res-2" }, tool, resolution.intent.replyTo, ledger);
    expect(plan).toMatchObject({ kind: "settled", effects: { replies: [{ value: { status: "rejected", reason: "resolution_not_applicable" } }] } });
  });

  it("an open escalation (not resumed) is applied without a reconcile lookup first", async () => {
    const { sor, tool, resolution, ledger } = setup("done");
    const resolver = new Resolver({ now: () => NOW });
    const plan = resolver.plan(resolution, tool, resolution.intent.replyTo, ledger);
    expect(plan).toMatchObject({ kind: "apply", resumed: false });
    if (plan.kind !== "apply") return;
    await resolver.apply(resolution, tool, resolution.intent.replyTo, plan, ctx);
    expect(sor.lookups).toHaveLength(0);
    expect(sor.patches).toHaveLength(1);
  });

  it("a conflict whose answer carries no record reopens the escalation with the record as read now", async () => {
    const { sor, tool, resolution, ledger } = setup("done");
    const resolver = new Resolver({ now: () => NOW });
    const plan = resolver.plan(resolution, tool, resolution.intent.replyTo, ledger);
    if (plan.kind !== "apply") throw new Error(plan.kind);
    // Someone else wrote meanwhile; the adapter (conflictAnswer "read", its default) carries no record.
    sor.script.patch.push({ kind: "answer", outcome: { kind: "precondition_failed", current: null }, changeFirst: [{ op: "add", path: "/tags/-", value: "other" }] });
    const step = await resolver.apply(resolution, tool, resolution.intent.replyTo, plan, ctx);
    expect(step).toMatchObject({
      kind: "settled",
      effects: { replies: [{ value: { status: "rejected", reason: "resolution_conflict", details: { current: { state: { tags: ["other"] }, version: version(2) } } } }] },
    });
  });
});

describe("a resolution whose intent came from a forged escalation record", () => {
  it("is refused when its delta or base is none the ledger holds for the key: the forged delta is never written", async () => {
    const { sor, tool, resolution, ledger } = setup("done");
    const resolver = new Resolver({ now: () => NOW });
    // Same escalation id, tool, entity and params (all readable on writ.human): only the delta is the forger's.
    // The tool appends, so an apply would write the intent's own delta.
    const forged = { ...resolution, intent: { ...resolution.intent, delta: [{ op: "add" as const, path: "/tags/-", value: "ATTACKER" }] } };
    expect(resolver.plan(forged, tool, forged.replyTo, ledger)).toMatchObject({
      kind: "settled",
      effects: { replies: [{ value: { status: "rejected", reason: "resolution_not_applicable", message: expect.stringContaining("forged") } }] },
    });
    const otherBase = { ...resolution, intent: { ...resolution.intent, baseVersion: version(7) } };
    expect(resolver.plan(otherBase, tool, otherBase.replyTo, ledger)).toMatchObject({ kind: "settled" });
    // The escalated intent itself is carried out.
    expect(resolver.plan(resolution, tool, resolution.replyTo, ledger)).toMatchObject({ kind: "apply" });
    expect(sor.patches).toHaveLength(0);
  });

  it("is refused, not thrown, when its params have no canonical form (a throw would count as a processing failure)", () => {
    const { tool, resolution, ledger } = setup("done");
    const resolver = new Resolver({ now: () => NOW });
    const odd = { ...resolution, intent: { ...resolution.intent, params: { ...resolution.intent.params, amount: Number.NaN } } };
    expect(resolver.plan(odd, tool, odd.replyTo, ledger)).toMatchObject({
      kind: "settled",
      effects: { replies: [{ value: { status: "rejected", reason: "resolution_not_applicable", message: expect.stringContaining("canonical") } }] },
    });
  });
});

describe("an escalation whose write may have happened, whatever its reason", () => {
  const resolver = new Resolver({ now: () => NOW });
  /** Plans and carries out `resolution` against `ledger`: the step. */
  async function applyOn(resolution: Resolution, tool: ReturnType<typeof setup>["tool"], ledger: PartitionLedger) {
    const plan = resolver.plan(resolution, tool, resolution.replyTo, ledger);
    expect(plan).toMatchObject({ kind: "apply" });
    if (plan.kind !== "apply") throw new Error(plan.note);
    return resolver.apply(resolution, tool, resolution.replyTo, plan, ctx);
  }

  it("sor_protocol after an unknown outcome: the operator's apply reconciles first and writes once", async () => {
    const { sor, tool, key, resolution } = setup("done");
    const intent = resolution.intent;
    const a = {
      intent,
      tool,
      entityKey: "ticket:T-1",
      fingerprint: paramsFingerprint(tool.name, T1, intent.params, tool.freeTextParams),
      deltaFingerprint: deltaFingerprint(intent.delta, tool.isFreeTextPath),
      params: intent.params,
    };
    const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }), now: () => NOW });
    const plan = pipeline.classify(a, new PartitionLedger(0, []));
    if (plan.kind !== "write") throw new Error(`planned ${plan.kind}`);
    // PATCH: answer lost before it committed; reconcile says not applied; the PATCH on its read meets a 412
    // without the record, and the read after it breaks the protocol.
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unknown", message: "timeout" } }, { kind: "answer", outcome: { kind: "precondition_failed", current: null } });
    sor.script.read.push({ kind: "ok" }, { kind: "ok" }, { kind: "throw", error: protocolError("401 token expired") });
    const step = await pipeline.execute(a, plan.pending, plan.state, ctx);
    expect(step).toMatchObject({ kind: "settled", effects: { ledger: { outcome: { status: "escalated", reason: "sor_protocol", mayHaveWritten: true } } } });
    if (step.kind !== "settled") return;
    // The escalation on writ.human says so too: the operator checks the record before deciding.
    expect(step.effects.escalations[0]!.value).toMatchObject({ reason: "sor_protocol", mayHaveWritten: true });
    expect(Escalation.parse(step.effects.escalations[0]!.value).mayHaveWritten).toBe(true);
    // The lost request was still in flight: it commits after all.
    sor.change(T1, intent.delta, key);
    const escalationId = step.effects.escalations[0]!.value.escalationId;
    const applied = await applyOn({ ...resolution, escalationId, baseVersion: sor.current(T1)!.version }, tool, new PartitionLedger(0, [[key, step.effects.ledger!]]));
    expect(applied).toMatchObject({ kind: "settled", effects: { ledger: { status: "done", outcome: { status: "applied", via: "reconcile" } } } });
    expect(sor.commitsOf(key)).toBe(1);
    expect((sor.current(T1)!.state as { tags: string[] }).tags).toEqual(["vip"]);
  });

  it("processing_failed after a write that may have happened is marked too", () => {
    const { tool, resolution } = setup("done");
    const intent = resolution.intent;
    const a = { intent, tool, entityKey: "ticket:T-1", fingerprint: "f", deltaFingerprint: "d", params: intent.params };
    const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }), now: () => NOW });
    const { entry } = setup("pending");
    const state = { inherited: true, mayHaveWritten: true, needsReconcile: true, unknownRounds: 0 };
    expect(pipeline.failed(a, entry, state, new Error("boom"))).toMatchObject({
      effects: { ledger: { outcome: { reason: "processing_failed", mayHaveWritten: true } }, escalations: [{ value: { reason: "processing_failed", mayHaveWritten: true } }] },
    });
    expect(pipeline.failed(a, entry, { ...state, inherited: false, mayHaveWritten: false }, new Error("boom"))).toMatchObject({ effects: { ledger: { outcome: { status: "rejected" } } } });
  });

  it("an operator's apply whose answer was lost and could not be checked: applied again, it reconciles and writes once", async () => {
    const { sor, tool, key, resolution, ledger } = setup("done");
    sor.script.read.push({ kind: "ok" }, { kind: "throw", error: outage("503") });
    sor.script.patch.push({ kind: "commit-then-unknown" });
    const first = await applyOn(resolution, tool, ledger);
    expect(first).toMatchObject({
      kind: "settled",
      effects: { ledger: { status: "done", outcome: { status: "escalated", reason: "conflict_cycles_exhausted", mayHaveWritten: true } } },
    });
    if (first.kind !== "settled") return;
    expect(sor.commitsOf(key)).toBe(1);
    const again = await applyOn({ ...resolution, resolutionId: "res-2", baseVersion: sor.current(T1)!.version }, tool, new PartitionLedger(0, [[key, first.effects.ledger!]]));
    expect(again).toMatchObject({ kind: "settled", effects: { ledger: { status: "done", outcome: { status: "applied", via: "reconcile" } } } });
    expect(sor.commitsOf(key)).toBe(1);
    expect((sor.current(T1)!.state as { tags: string[] }).tags).toEqual(["vip"]);
  });
});
