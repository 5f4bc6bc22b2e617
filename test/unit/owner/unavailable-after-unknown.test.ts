// unavailable-after-unknown: a PATCH whose outcome was unknown is still on its way; reconcile finds it not applied;
// the next PATCH never leaves (429 or connection refused: `unavailable`; or the owner cannot confirm it owns the
// partition) and the intent pauses. During the pause the first request arrives and commits. The next try must
// reconcile again (and find it applied), not write on a fresh read: a rebase-commutative tool rebases onto any
// version, so a second read would take the record holding the late change for the one to write on: written twice.
// Counted at the system (the fake's commits per intent key), for a fresh intent and for one an earlier owner left
// pending (its request may land during the pause just the same).
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import { type ExecContext, IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { admitTools } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";
import { addTag, writePlan } from "./pipeline-fixtures.ts";

const T1 = { type: "ticket", id: "T-1" };

function setup() {
  const sor = new FakeSystem("helpdesk");
  sor.seed(T1, { tags: [] });
  const tool = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }).get("add_tag")!;
  const params = { tag: "vip" };
  const key = intentKey({ tool, agentId: "a", runId: "r", stepId: "s", entity: T1, params });
  const delta = [{ op: "add" as const, path: "/tags/-", value: "vip" }];
  const intent = { intentId: "i-1", intentKey: key, entity: T1, tool: "add_tag", agent: { id: "a", runId: "r", stepId: "s" }, baseVersion: version(1), delta, params, replyTo: "writ.replies.a", createdAt: new Date().toISOString() };
  const a: AdmittedIntent = { intent, tool, entityKey: "ticket:T-1", params, fingerprint: paramsFingerprint("add_tag", T1, params, tool.freeTextParams), deltaFingerprint: deltaFingerprint(delta, tool.isFreeTextPath) };
  const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }) });
  return { sor, a, key, pipeline };
}

/** The key pending, as an owner that sent the PATCH and then died left it. */
function inherited(a: AdmittedIntent): PartitionLedger {
  const entry: LedgerIntentEntry = {
    kind: "intent",
    intentKey: a.intent.intentKey,
    intentId: "earlier",
    status: "pending",
    entity: T1,
    tool: "add_tag",
    fingerprint: a.fingerprint,
    attempts: [{ baseVersion: a.intent.baseVersion, deltaFingerprint: a.deltaFingerprint }],
    cycles: 0,
    replyTo: a.intent.replyTo,
    updatedAt: new Date().toISOString(),
  };
  return new PartitionLedger(0, [[entry.intentKey, entry]]);
}

const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };

describe("unavailable after an unknown outcome: the late request lands during the pause", () => {
  it.each([
    ["429 (unavailable)", "unavailable"],
    ["ownership not confirmed (mayWrite false)", "not-owner"],
  ] as const)("%s: the next try reconciles and finds it applied; one commit at the system", async (_name, cause) => {
    const { sor, a, key, pipeline } = setup();
    const plan = writePlan(pipeline.classify(a, new PartitionLedger(0)));
    // PATCH 1 is still on its way when the owner stops waiting; reconcile then finds it not applied.
    sor.script.patch.push({ kind: "lands-later" });
    let owner = true;
    if (cause === "unavailable") sor.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "429: slow down" } });
    const first = await pipeline.execute(a, plan.pending, plan.state, {
      ...ctx,
      mayWrite: () => {
        // The second PATCH is about to leave: the owner lost sight of its membership (not-owner case).
        if (cause === "not-owner" && sor.patches.length === 1) owner = false;
        return owner;
      },
    });
    expect(first).toMatchObject({ kind: "retry-later", notSent: true });
    expect(sor.commitsOf(key)).toBe(0);

    // During the pause the first request arrives and commits (the server was slow, not down).
    expect(sor.landHeld()).toBe(1);
    owner = true;
    const second = await pipeline.execute(a, plan.pending, plan.state, ctx);

    expect(sor.commitsOf(key)).toBe(1);
    expect(second).toMatchObject({ kind: "settled", note: "applied via reconcile" });
    expect(sor.current(T1)!.state).toEqual({ tags: ["vip"] });
    expect(sor.patches).toHaveLength(cause === "unavailable" ? 2 : 1);
  });

  it("an inherited pending (the earlier owner's PATCH still on its way), its retry answered 429: reconciled again after the pause", async () => {
    const { sor, a, key, pipeline } = setup();
    const plan = writePlan(pipeline.classify(a, inherited(a)));
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "429: slow down" } });
    expect(await pipeline.execute(a, plan.pending, plan.state, ctx)).toMatchObject({ kind: "retry-later" });
    // The earlier owner's request (If-Match on the version it read, the one this owner's reconcile read too) lands.
    sor.change(T1, a.intent.delta, key);
    const second = await pipeline.execute(a, plan.pending, plan.state, ctx);
    expect(sor.commitsOf(key)).toBe(1);
    expect(second).toMatchObject({ kind: "settled", note: "applied via reconcile" });
    expect(sor.current(T1)!.state).toEqual({ tags: ["vip"] });
  });

  it("when it does not land during the pause, the write goes on the record as the new reconcile read it, and the late request meets a 412", async () => {
    const { sor, a, key, pipeline } = setup();
    const plan = writePlan(pipeline.classify(a, new PartitionLedger(0)));
    sor.script.patch.push({ kind: "lands-later" });
    sor.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "connection refused" } });
    expect(await pipeline.execute(a, plan.pending, plan.state, ctx)).toMatchObject({ kind: "retry-later" });
    // Another writer changes the record during the pause.
    sor.change(T1, [{ op: "add", path: "/tags/-", value: "other" }]);
    const second = await pipeline.execute(a, plan.pending, plan.state, ctx);
    expect(second).toMatchObject({ kind: "settled", note: "applied via patch" });
    expect(sor.lookups).toHaveLength(2);
    expect(sor.patches.map((p) => p.ifMatch)).toEqual([version(1), version(1), version(2)]);
    expect(sor.landHeld()).toBe(0);
    expect(sor.commitsOf(key)).toBe(1);
    expect(sor.current(T1)!.state).toEqual({ tags: ["other", "vip"] });
  });
});
