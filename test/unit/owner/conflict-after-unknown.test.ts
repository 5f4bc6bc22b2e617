// conflict-after-unknown: a PATCH whose outcome was unknown is still on its way; reconcile finds it not applied; the
// next PATCH meets a 412 (another writer), reconcile after it says not applied again, and the agent is answered
// `conflict`. If-Match keeps the late request out only while the record's version, once left, never comes back: an
// API whose ETag is a hash of the record gives the old version again when the record is changed back (another
// writer flips a field and flips it back). Then the late request lands, and the agent's next attempt with the same
// intent key must reconcile first (and find it applied) instead of writing on its read: a rebase-commutative tool
// would write the change a second time. Counted at the system (the fake's commits per intent key).
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { AdmittedIntent } from "../../../src/owner/admission.ts";
import { type ExecContext, IntentPipeline, type Step } from "../../../src/owner/intent-pipeline.ts";
import { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import { admitTools } from "../../../src/tools.ts";
import { type EtagKind, FakeSystem } from "./fake-system.ts";
import { addTag, commit, writePlan } from "./pipeline-fixtures.ts";

const T1 = { type: "ticket", id: "T-1" };
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: {} };
const flip = (status: string) => [{ op: "replace" as const, path: "/status", value: status }];

function setup(etags: EtagKind) {
  const sor = new FakeSystem("helpdesk", { idempotencyKeys: false, idempotencyLookup: true }, { etags });
  const seeded = sor.seed(T1, { status: "open", tags: [] });
  const tool = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }).get("add_tag")!;
  const params = { tag: "vip" };
  const key = intentKey({ tool, agentId: "a", runId: "r", stepId: "s", entity: T1, params });
  const delta = [{ op: "add" as const, path: "/tags/-", value: "vip" }];
  const attempt = (intentId: string, baseVersion: string): AdmittedIntent => ({
    intent: { intentId, intentKey: key, entity: T1, tool: "add_tag", agent: { id: "a", runId: "r", stepId: "s" }, baseVersion, delta, params, replyTo: "writ.replies.a", createdAt: new Date().toISOString() },
    tool,
    entityKey: "ticket:T-1",
    params,
    fingerprint: paramsFingerprint("add_tag", T1, params, tool.freeTextParams),
    deltaFingerprint: deltaFingerprint(delta, tool.isFreeTextPath),
  });
  const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }) });
  return { sor, seeded, key, attempt, pipeline, ledger: new PartitionLedger(0) };
}

/** The first attempt: its PATCH held on its way (answered unknown), the next one meets another writer's change (412). */
async function conflictAfterUnknown(s: ReturnType<typeof setup>): Promise<Extract<Step, { kind: "settled" }>> {
  const a1 = s.attempt("i-1", s.seeded);
  const plan = writePlan(s.pipeline.classify(a1, s.ledger));
  commit(s.ledger, plan.pending);
  s.sor.script.patch.push({ kind: "lands-later" });
  s.sor.script.patch.push({ kind: "changed-first", ops: flip("pending") });
  const step = await s.pipeline.execute(a1, plan.pending, plan.state, ctx);
  if (step.kind !== "settled") throw new Error(`expected settled, got ${JSON.stringify(step)}`);
  LedgerIntentEntry.parse(step.effects.ledger);
  commit(s.ledger, step.effects.ledger);
  return step;
}

describe("conflict after an unknown outcome: the ledger keeps that a request of the key may still land", () => {
  it("versions that come back: the late request lands after the conflict; the next attempt reconciles, finds it applied; one commit", async () => {
    const s = setup("content");
    const first = await conflictAfterUnknown(s);
    expect(first.note).toBe("conflict");
    const met = (first.effects.replies[0]!.value as { current: { version: string } }).current.version;

    // The other writer flips the status back: the record, and so its version, is as the held request's If-Match names it.
    expect(s.sor.change(T1, flip("open"))).toBe(s.seeded);
    expect(s.sor.landHeld()).toBe(1);
    expect(s.sor.commitsOf(s.key)).toBe(1);

    // The agent decides again from the conflict's record, with the same intent key.
    const a2 = s.attempt("i-2", met);
    const plan = writePlan(s.pipeline.classify(a2, s.ledger));
    const marked = plan.state.mayHaveWritten;
    const second = await s.pipeline.execute(a2, plan.pending, plan.state, ctx);

    expect(s.sor.commitsOf(s.key)).toBe(1);
    expect(first.effects.ledger).toMatchObject({ status: "conflicted", outcome: { status: "conflict", mayHaveWritten: true } });
    expect(marked).toBe(true);
    expect(second).toMatchObject({ kind: "settled", note: "applied via reconcile" });
    expect(s.sor.current(T1)!.state).toEqual({ status: "open", tags: ["vip"] });
    expect(s.sor.patches).toHaveLength(2);
  });

  it("when it has not landed, the next attempt's write goes on the record as its reconcile read it: the late request meets a 412", async () => {
    const s = setup("content");
    const first = await conflictAfterUnknown(s);
    const met = (first.effects.replies[0]!.value as { current: { version: string } }).current.version;
    s.sor.change(T1, flip("open"));
    const a2 = s.attempt("i-2", met);
    const plan = writePlan(s.pipeline.classify(a2, s.ledger));
    const second = await s.pipeline.execute(a2, plan.pending, plan.state, ctx);
    expect(second).toMatchObject({ kind: "settled", note: "applied via patch" });
    expect(s.sor.lookups).toHaveLength(3);
    expect(s.sor.patches.at(-1)!.ifMatch).toBe(s.seeded);
    expect(s.sor.landHeld()).toBe(0);
    expect(s.sor.commitsOf(s.key)).toBe(1);
    expect(s.sor.current(T1)!.state).toEqual({ status: "open", tags: ["vip"] });
  });

  it("versions that never come back: the late request meets a 412 whenever it lands (If-Match alone keeps it out)", async () => {
    const s = setup("counter");
    await conflictAfterUnknown(s);
    s.sor.change(T1, flip("open"));
    expect(s.sor.landHeld()).toBe(0);
    expect(s.sor.commitsOf(s.key)).toBe(0);
  });

  it("a conflict with no unknown outcome before it is not marked: the next attempt writes on its read, without a reconcile", async () => {
    const s = setup("counter");
    const a1 = s.attempt("i-1", s.seeded);
    const plan1 = writePlan(s.pipeline.classify(a1, s.ledger));
    commit(s.ledger, plan1.pending);
    s.sor.script.patch.push({ kind: "changed-first", ops: flip("pending") });
    const first = await s.pipeline.execute(a1, plan1.pending, plan1.state, ctx);
    if (first.kind !== "settled") throw new Error(first.kind);
    expect(first.effects.ledger?.outcome).not.toHaveProperty("mayHaveWritten");
    commit(s.ledger, first.effects.ledger);
    const plan2 = writePlan(s.pipeline.classify(s.attempt("i-2", s.sor.current(T1)!.version), s.ledger));
    expect(plan2.state).toMatchObject({ mayHaveWritten: false });
  });
});
