// A refusal remembered for signed bytes (refusals.ts) must never outrank their intent key's own entry. Signed bytes
// applied, then a copy of them (a redelivery after a restart: the offset commit lags by design; a copy from
// writ.intents) reaching an owner deployed without the tool, was answered `unknown_tool`, "nothing written", for a
// write that stands, and that refusal was remembered: once the tool was back, the memory answered before the key's
// entry, so the agent kept hearing "rejected" for up to 23 h. With the key's entry pending (an owner died mid-PATCH),
// the memory kept every later copy from taking that entry up and reconciling it.
import { generateKeyPairSync } from "node:crypto";
import type { KafkaMessage } from "kafkajs";
import { describe, expect, it, vi } from "vitest";
import { canonicalJson, sha256Hex } from "../../../src/canonical-json.ts";
import { undoIntentKey } from "../../../src/keys.ts";
import { intentFingerprints } from "../../../src/owner/admission.ts";
import { effects, rejectedReply } from "../../../src/owner/effects.ts";
import type { PartitionOwner } from "../../../src/owner/partition-owner.ts";
import { answerRefused, rememberRefusal, submissionIn } from "../../../src/owner/refusals.ts";
import { LedgerEntry, type LedgerIntentEntry, type LedgerLeaseEntry, leaseLedgerKey, refusalLedgerKey } from "../../../src/schemas/ledger-entry.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { AgentRegistry } from "../../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, signIntent } from "../../../src/security/signing.ts";
import { admitTools } from "../../../src/tools.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTagIntentJson, ownerWith, resetAfterEach, restoring, txns } from "./partition-owner-harness.ts";
import { addTag } from "./pipeline-fixtures.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => (await import("./partition-owner-harness.ts")).restoreMock());
resetAfterEach();

const T1 = { type: "ticket", id: "T-1" };
const REPLY_TO = "writ.replies.agent-1";
const agentKey = generateKeyPairSync("ed25519");
const agents = AgentRegistry.from({
  agents: { "agent-1": { keys: [{ id: "k1", publicKey: agentKey.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["add_tag"], replyTopic: REPLY_TO } },
});
/** X: agent-1's add_tag of "vip" on T-1, signed. */
const X = JSON.parse(addTagIntentJson("s1")) as WriteIntent;
const signedRecord = (offset: number, v: WriteIntent = X): KafkaMessage =>
  ({ offset: String(offset), key: Buffer.from("ticket:T-1"), value: Buffer.from(JSON.stringify(v)), headers: { [SIGNATURE_HEADER]: signIntent(v, { keyId: "k1", privateKey: agentKey.privateKey }) }, timestamp: String(Date.now()), attributes: 0 }) as KafkaMessage;

/** An owner of the deploy `tools` (none: one without add_tag), restored with `entries`, running. */
async function ownerOf(sor: FakeSystem | null, entries: Map<string, unknown>): Promise<PartitionOwner> {
  restoring.entries = [...entries];
  const owner = ownerWith({ agents, ...(sor ? { tools: admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }) } : {}) });
  owner.start();
  await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
  return owner;
}

/** X delivered at `offset`, settled (its offset committed), the owner closed. */
async function deliverX(owner: PartitionOwner, offset: number): Promise<void> {
  owner.accept([signedRecord(offset)], String(offset));
  await waitFor(() => txns.some((t) => t.committed && t.offset === String(offset + 1)), { timeoutMs: 10_000, message: `offset ${offset} never settled` });
  await owner.close();
}

/** The ledger as the committed transactions left it, over `from`: what the next owner restores. */
function ledgerAfter(from: Map<string, unknown>): Map<string, unknown> {
  const ledger = new Map(from);
  for (const r of txns.filter((t) => t.committed).flatMap((t) => t.records)) {
    if (r.topic !== "writ.ledger" || r.key === null) continue;
    if (r.value === null) ledger.delete(r.key);
    else ledger.set(r.key, LedgerEntry.parse(JSON.parse(r.value.toString("utf8"))));
  }
  return ledger;
}

/** The answers to X so far: [status, reason or version, duplicate]. */
const answers = () =>
  txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic === REPLY_TO)
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { intentId: string; status: string; reason?: string; version?: string; duplicate: boolean })
    .filter((a) => a.intentId === X.intentId)
    .map((a) => [a.status, a.reason ?? a.version, a.duplicate]);

const refusalKeys = (ledger: Map<string, unknown>) => [...ledger.keys()].filter((k) => k.startsWith("__refused__:"));

/** The refusal of X an owner from before this fix remembered (answered unknown_tool on a deploy without add_tag). */
function rememberedUnknownTool(): [string, LedgerIntentEntry] {
  const reply = rejectedReply(X.intentId, X.intentKey, "unknown_tool", "no write tool named add_tag is admitted", new Date().toISOString());
  const digest = sha256Hex(canonicalJson(X));
  const entry = rememberRefusal({ digest, intent: X }, effects({ replies: [{ topic: REPLY_TO, value: reply }] }), new Date(), undefined).refusal!;
  expect(entry.intentKey).toBe(refusalLedgerKey(digest));
  return [entry.intentKey, entry];
}

/**
 * X's entry as an owner that died after staging it left it: pending, its PATCH maybe sent. `signed`: with X's digest
 * (an owner of this version); without, as owners before `signedDigest` wrote it.
 */
function pendingX(sor: FakeSystem, signed = false): LedgerIntentEntry {
  const { fingerprint, deltaFingerprint } = intentFingerprints(admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }).get("add_tag")!, X);
  const attempts = [{ baseVersion: X.baseVersion, deltaFingerprint }];
  const digest = signed ? { signedDigest: sha256Hex(canonicalJson(X)) } : {};
  return { kind: "intent", intentKey: X.intentKey, intentId: X.intentId, status: "pending", entity: T1, tool: "add_tag", agentId: "agent-1", fingerprint, ...digest, attempts, cycles: 0, replyTo: REPLY_TO, updatedAt: new Date().toISOString() };
}

/** T-1's lease, held by another agent's change. */
function heldLease(): [string, LedgerLeaseEntry] {
  const now = Date.now();
  const held: LedgerLeaseEntry = {
    kind: "lease",
    entity: T1,
    change: "c".repeat(64),
    agentId: "agent-2",
    replyTo: "writ.replies.agent-2",
    acquiredAt: new Date(now - 60_000).toISOString(),
    expiresAt: new Date(now + 600_000).toISOString(),
    updatedAt: new Date(now - 60_000).toISOString(),
  };
  return [leaseLedgerKey("ticket:T-1"), held];
}

/** The dead letters committed so far: [reason, the record they hold]. */
const deadLetters = () =>
  txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic === "writ.dlq")
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { reason: string; valueBase64: string; headers: Record<string, string> });

describe("the intent key's own entry comes before a refusal remembered for the same signed bytes", () => {
  it("X applied; a copy on a deploy without the tool is answered applied (duplicate), nothing remembered; with the tool back, applied again, also over a refusal an earlier owner remembered", async () => {
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    await deliverX(await ownerOf(sor, new Map()), 0);
    expect(answers()).toEqual([["applied", '"2"', false]]);
    const applied = ledgerAfter(new Map());
    expect(applied.get(X.intentKey)).toMatchObject({ status: "done", intentId: X.intentId, outcome: { status: "applied", version: '"2"' } });

    // A rollback to a deploy without add_tag; X is delivered again (its offset was not committed yet).
    await deliverX(await ownerOf(null, applied), 1);
    expect(answers()).toEqual([
      ["applied", '"2"', false],
      ["applied", '"2"', true],
    ]);
    const afterRollback = ledgerAfter(applied);
    expect(refusalKeys(afterRollback)).toEqual([]);

    // The tool deployed again; X once more: the key's entry answers it.
    await deliverX(await ownerOf(sor, afterRollback), 2);
    // And on a ledger where an owner before this fix remembered X's refusal beside the key's entry.
    await deliverX(await ownerOf(sor, new Map([...afterRollback, rememberedUnknownTool()])), 3);
    expect(answers().slice(2)).toEqual([
      ["applied", '"2"', true],
      ["applied", '"2"', true],
    ]);
    expect(sor.patchCount(T1)).toBe(1);
    expect(sor.current(T1)?.state).toEqual({ tags: ["vip"] });
  });

  for (const signed of [true, false]) {
    it(`X pending (its owner died mid-PATCH, the PATCH landed; ${signed ? "" : "no signedDigest: "}an owner ${signed ? "of this version" : "before it"} wrote it): a copy refused on a deploy without the tool gets no "nothing written" (dead-lettered outcome_unknown, nothing remembered), and the dead letter sent back with the tool takes the entry up and reconciles it, also over a refusal an earlier owner remembered`, async () => {
      const sor = new FakeSystem("helpdesk");
      sor.seed(T1, { tags: [] });
      const pending = pendingX(sor, signed);
      // The PATCH reached the system before its owner died: the lookup by the intent key knows it.
      sor.change(T1, [{ op: "add", path: "/tags/-", value: "vip" }], X.intentKey);
      const inDoubt = new Map<string, unknown>([[X.intentKey, pending]]);

      await deliverX(await ownerOf(null, inDoubt), 0);
      expect(answers()).toEqual([]);
      expect(deadLetters().map((d) => d.reason)).toEqual(["outcome_unknown"]);
      const afterRefusal = ledgerAfter(inDoubt);
      expect(refusalKeys(afterRefusal)).toEqual([]);
      expect(afterRefusal.get(X.intentKey)).toMatchObject({ status: "pending" });

      // The tool back, on a ledger where an owner before this fix remembered X's refusal: the dead letter is sent
      // back (its value and headers, as `writ dlq redrive` does), X is taken up and reconciled.
      const [dead] = deadLetters();
      const redriven = { ...signedRecord(1), value: Buffer.from(dead!.valueBase64, "base64"), headers: dead!.headers } as KafkaMessage;
      const owner = await ownerOf(sor, new Map([...afterRefusal, rememberedUnknownTool()]));
      owner.accept([redriven], "1");
      await waitFor(() => txns.some((t) => t.committed && t.offset === "2"), { timeoutMs: 10_000, message: "the redriven record never settled" });
      await owner.close();
      expect(answers()).toEqual([["applied", '"2"', false]]);
      expect(ledgerAfter(afterRefusal).get(X.intentKey)).toMatchObject({ status: "done", outcome: { status: "applied", version: '"2"' } });
      expect(sor.patchCount(T1)).toBe(0);
      expect(sor.commitsOf(X.intentKey)).toBe(1);
    });
  }

  it("X conflicted after a request whose outcome was unknown (mayHaveWritten): a copy refused on a deploy without the tool is dead-lettered outcome_unknown, not answered; without the mark, refused unremembered (nothing of it was written)", async () => {
    const sor = new FakeSystem("helpdesk");
    const conflicted = (mayHaveWritten: boolean): LedgerIntentEntry => ({
      ...pendingX(sor, true),
      status: "conflicted",
      cycles: 1,
      outcome: { status: "conflict", cycle: 1, version: '"5"', at: new Date().toISOString(), ...(mayHaveWritten ? { mayHaveWritten } : {}) },
    });
    const maybe = new Map<string, unknown>([[X.intentKey, conflicted(true)]]);
    await deliverX(await ownerOf(null, maybe), 0);
    expect(answers()).toEqual([]);
    expect(deadLetters().map((d) => d.reason)).toEqual(["outcome_unknown"]);
    expect(refusalKeys(ledgerAfter(maybe))).toEqual([]);

    const settled = new Map<string, unknown>([[X.intentKey, conflicted(false)]]);
    await deliverX(await ownerOf(null, settled), 1);
    expect(answers()).toEqual([["rejected", "unknown_tool", false]]);
    expect(deadLetters()).toHaveLength(1);
    expect(refusalKeys(ledgerAfter(settled))).toEqual([]);
  });

  it("while the key's entry is pending no refusal is remembered for the bytes: X taken up and refused leased after its reconcile found it not applied, and a resubmission refused at admission", async () => {
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    // Another change holds T-1's lease; X's PATCH never reached the system.
    const inDoubt = new Map<string, unknown>([[X.intentKey, pendingX(sor)], heldLease()]);
    await deliverX(await ownerOf(sor, inDoubt), 0);
    expect(answers()).toEqual([["rejected", "leased", false]]);
    const after = ledgerAfter(inDoubt);
    expect(after.get(X.intentKey)).toMatchObject({ status: "pending" });
    expect(refusalKeys(after)).toEqual([]);

    // The agent resubmits (a new intent id, the same key) to an owner deployed without the tool.
    const resubmitted = { ...X, intentId: "s1-again" };
    const owner = await ownerOf(null, after);
    owner.accept([signedRecord(1, resubmitted)], "1");
    await waitFor(() => txns.some((t) => t.committed && t.offset === "2"), { timeoutMs: 10_000, message: "the resubmission never settled" });
    await owner.close();
    expect(refusalKeys(ledgerAfter(after))).toEqual([]);
    // Not "rejected unknown_tool" (final to the clients, whose change() would then compensate the steps before it
    // while this write may stand): dead-lettered outcome_unknown, no answer.
    expect(deadLetters().map((d) => d.reason)).toEqual(["outcome_unknown"]);
    expect(ledgerAfter(after).get(X.intentKey)).toMatchObject({ status: "pending" });
    expect(sor.patchCount(T1)).toBe(0);
  });

  it("the same intent id signed with other content is not the key's entry's submission: X applied, then Y (its delta changed) and Y2 (its params changed) under X's intent id and key get their own refusals, never applied", async () => {
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    await deliverX(await ownerOf(sor, new Map()), 0);
    const applied = ledgerAfter(new Map());
    expect(applied.get(X.intentKey)).toMatchObject({ status: "done", signedDigest: sha256Hex(canonicalJson(X)) });

    const Y = { ...X, delta: [{ op: "replace", path: "/status", value: "closed" }] } as WriteIntent;
    const Y2 = { ...X, params: { tag: "other" }, delta: [{ op: "add", path: "/tags/-", value: "other" }] } as WriteIntent;
    const deliver = async (owner: PartitionOwner, offset: number, v: WriteIntent) => {
      owner.accept([signedRecord(offset, v)], String(offset));
      await waitFor(() => txns.some((t) => t.committed && t.offset === String(offset + 1)), { timeoutMs: 10_000, message: `offset ${offset} never settled` });
      await owner.close();
    };
    await deliver(await ownerOf(sor, applied), 1, Y);
    await deliver(await ownerOf(sor, applied), 2, Y2);
    await deliver(await ownerOf(null, applied), 3, Y);
    expect(answers()).toEqual([
      ["applied", '"2"', false],
      ["rejected", "patch_path_not_allowed", false],
      ["rejected", "intent_key_mismatch", false],
      ["rejected", "unknown_tool", false],
    ]);
    // Y2 again under a fresh intent id (a model calling the tool again in the run with other params): its content is
    // not the key's write's (the tool here tells by its fingerprint), so its refusal is final at once, as an owner
    // admitting it would answer key reuse; never a dead letter for a write it cannot be.
    await deliver(await ownerOf(sor, applied), 4, { ...Y2, intentId: "s1-y2" });
    const y2 = txns.filter((t) => t.committed).flatMap((t) => t.records).filter((r) => r.topic === REPLY_TO).map((r) => JSON.parse(r.value!.toString("utf8")) as { intentId: string; status: string; reason?: string });
    expect(y2.filter((a) => a.intentId === "s1-y2").map((a) => [a.status, a.reason])).toEqual([["rejected", "intent_key_mismatch"]]);
    expect(deadLetters()).toEqual([]);
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("a refusal remembered for X (leased) answers X's copy after another submission wrote the key's entry: not decided again as key reuse, and not overwritten", async () => {
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    const leased = new Map<string, unknown>([heldLease()]);
    await deliverX(await ownerOf(sor, leased), 0);
    expect(answers()).toEqual([["rejected", "leased", false]]);
    const remembered = ledgerAfter(leased);
    const [refusalKey] = refusalKeys(remembered);
    expect(remembered.get(refusalKey!)).toMatchObject({ outcome: { status: "rejected", reason: "leased" } });

    // The lease released; another submission of the key (other params, as an older client built it) applied.
    remembered.delete(heldLease()[0]);
    const other: LedgerIntentEntry = {
      ...pendingX(sor),
      intentId: "another-submission",
      fingerprint: "f".repeat(64),
      attempts: [{ baseVersion: X.baseVersion, deltaFingerprint: "e".repeat(64) }],
      status: "done",
      outcome: { status: "applied", version: '"2"', via: "patch", at: new Date().toISOString() },
    };
    remembered.set(X.intentKey, other);
    await deliverX(await ownerOf(sor, remembered), 1);
    expect(answers()[1]).toEqual(["rejected", "leased", true]);
    expect(ledgerAfter(remembered).get(refusalKey!)).toMatchObject({ outcome: { status: "rejected", reason: "leased" } });
    expect(sor.patchCount(T1)).toBe(0);
  });
});

describe("whose submission the key's entry holds (submissionIn)", () => {
  const digest = sha256Hex(canonicalJson(X));
  const sor = new FakeSystem("helpdesk");
  const refusedOf = (v: WriteIntent) => effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(v.intentId, v.intentKey, "unknown_tool", "no write tool named add_tag is admitted", new Date().toISOString()) }] });
  const view = (entry: LedgerIntentEntry) => ({ get: (k: string) => (k === entry.intentKey ? entry : undefined), size: 1 });
  const appliedX: LedgerIntentEntry = { ...pendingX(sor, true), status: "done", outcome: { status: "applied", version: '"2"', via: "patch", at: new Date().toISOString() } };
  const foreign: [string, WriteIntent][] = [
    ["another agent", { ...X, agent: { ...X.agent, id: "agent-2" }, replyTo: "writ.replies.agent-2" }],
    ["another tool", { ...X, tool: "remove_tag" }],
    ["another record", { ...X, entity: { type: "ticket", id: "T-2" } }],
  ];

  it("the very signed bytes: this; other content under the intent id: other; an entry without signedDigest: maybe", () => {
    expect(submissionIn(appliedX, { digest, intent: X })).toBe("this");
    expect(submissionIn(appliedX, { digest: "0".repeat(64), intent: X })).toBe("other");
    expect(submissionIn(pendingX(sor), { digest, intent: X })).toBe("maybe");
    expect(submissionIn(undefined, { digest, intent: X })).toBe("other");
  });

  const refusedFor = (v: WriteIntent, reason: "unknown_tool" | "stale") => effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(v.intentId, v.intentKey, reason, reason, new Date().toISOString()) }] });

  it("the key's write in doubt, of the same tool on the same record: any submission of the key refused at admission is in doubt (a fresh intent id too: the clients ask again so after unknown; bytes dated ahead too), but not bytes too old to run", () => {
    const again = { ...X, intentId: "s1-again" };
    const signedAgain = { digest: sha256Hex(canonicalJson(again)), intent: again };
    for (const entry of [pendingX(sor, true), pendingX(sor)]) {
      expect(answerRefused(view(entry), X.intentKey, { digest, intent: X }, refusedFor(X, "unknown_tool"), new Date(), REPLY_TO)).toMatchObject({ kind: "in_doubt" });
      expect(answerRefused(view(entry), X.intentKey, signedAgain, refusedFor(again, "unknown_tool"), new Date(), REPLY_TO)).toMatchObject({ kind: "in_doubt" });
      // Dated ahead of this owner's clock: they run once it catches up (a copy then takes the entry up), so no
      // "nothing written" now either.
      const ahead = effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(X.intentId, X.intentKey, "clock_skew", "m", new Date().toISOString()) }] });
      expect(answerRefused(view(entry), X.intentKey, { digest, intent: X }, ahead, new Date(), REPLY_TO)).toMatchObject({ kind: "in_doubt" });
      // Sent back, stale bytes would be refused stale again: a dead letter no redrive settles. Their refusal stands.
      const stale = answerRefused(view(entry), X.intentKey, { digest, intent: X }, refusedFor(X, "stale"), new Date(), REPLY_TO);
      expect(stale.kind === "answer" && stale.effects.replies.map((r) => [r.value.status, r.value.status === "rejected" && r.value.reason])).toEqual([["rejected", "stale"]]);
    }
  });

  it("an entry without signedDigest (an owner before it) holding a write that stands, under these bytes' intent id: in doubt, never 'nothing written'; one holding a refusal: this refusal, not remembered", () => {
    const legacyApplied: LedgerIntentEntry = { ...appliedX, signedDigest: undefined };
    expect(answerRefused(view(legacyApplied), X.intentKey, { digest, intent: X }, refusedOf(X), new Date(), REPLY_TO)).toMatchObject({ kind: "in_doubt" });
    const legacyRefused: LedgerIntentEntry = { ...legacyApplied, outcome: { status: "rejected", reason: "patch_not_applicable", message: "m", at: new Date().toISOString() } };
    const answer = answerRefused(view(legacyRefused), X.intentKey, { digest, intent: X }, refusedOf(X), new Date(), REPLY_TO);
    expect(answer.kind === "answer" && answer.effects.replies.map((r) => [r.value.status, r.value.status === "rejected" && r.value.reason])).toEqual([["rejected", "unknown_tool"]]);
    expect(answer.kind === "answer" && answer.effects.refusal).toBeUndefined();
  });

  it("the key's write applied (or escalated): a retry under a fresh intent id (the step rebuilt after unknown) refused by this deploy, for its content or unweighed, or dated ahead, is in doubt, not 'nothing written'; stale, it keeps its refusal", () => {
    const again = { ...X, intentId: "s1-again" };
    const signedAgain = { digest: sha256Hex(canonicalJson(again)), intent: again };
    const escalatedX: LedgerIntentEntry = { ...appliedX, outcome: { status: "escalated", reason: "outcome_unknown", message: "m", escalationId: "e1", at: new Date().toISOString() } };
    const refusedAs = (reason: string) => effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(again.intentId, again.intentKey, reason as "unknown_tool", "m", new Date().toISOString()) }] });
    for (const entry of [appliedX, escalatedX]) {
      for (const reason of ["unknown_tool", "tool_not_allowed", "patch_path_not_allowed", "params_invalid", "clock_skew"]) {
        expect(answerRefused(view(entry), X.intentKey, signedAgain, refusedAs(reason), new Date(), REPLY_TO), reason).toMatchObject({ kind: "in_doubt" });
      }
      expect(answerRefused(view(entry), X.intentKey, signedAgain, refusedFor(again, "stale"), new Date(), REPLY_TO)).toMatchObject({ kind: "answer" });
    }
  });

  it("an entry without signedDigest holding a write that stands: bytes too old to run keep their refusal (a redrive would refuse them stale again)", () => {
    const legacyApplied: LedgerIntentEntry = { ...appliedX, signedDigest: undefined };
    const stale = answerRefused(view(legacyApplied), X.intentKey, { digest, intent: X }, refusedFor(X, "stale"), new Date(), REPLY_TO);
    expect(stale.kind === "answer" && stale.effects.replies.map((r) => r.value.status === "rejected" && r.value.reason)).toEqual(["stale"]);
  });

  it("bytes of other content than the key's write (the tool deployed here tells by the fingerprint), or dated further ahead than any retention, keep their refusal: they can never be its submission, or never run", () => {
    const again = { ...X, intentId: "s1-again" };
    const signedAgain = { digest: sha256Hex(canonicalJson(again)), intent: again };
    const refusedAs = (reason: string) => effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(again.intentId, again.intentKey, reason as "params_invalid", "m", new Date().toISOString()) }] });
    for (const entry of [appliedX, pendingX(sor, true)]) {
      const other = answerRefused(view(entry), X.intentKey, signedAgain, refusedAs("params_invalid"), new Date(), REPLY_TO, () => ({ fingerprint: "0".repeat(64) }));
      expect(other.kind === "answer" && other.effects.replies.map((r) => r.value.status === "rejected" && r.value.reason)).toEqual(["params_invalid"]);
      // The same content (a step rebuilt after unknown): in doubt.
      expect(answerRefused(view(entry), X.intentKey, signedAgain, refusedAs("params_invalid"), new Date(), REPLY_TO, () => ({ fingerprint: entry.fingerprint }))).toMatchObject({ kind: "in_doubt" });
      const ahead = answerRefused(view(entry), X.intentKey, signedAgain, refusedAs("clock_skew"), new Date(), REPLY_TO, () => ({ farAhead: true }));
      expect(ahead.kind === "answer" && ahead.effects.replies.map((r) => r.value.status === "rejected" && r.value.reason)).toEqual(["clock_skew"]);
    }
  });

  for (const [what, v] of foreign) {
    it(`${what} naming X's intent id and key gets nothing from X's entry: its own refusal, remembered; while X's entry (of an owner before signedDigest) is pending, ${what === "another agent" ? "its own record dead-lettered (the key's write is its tool's on its record: for a global key scope, every agent's)" : "its own refusal"}`, () => {
      const signed = { digest: sha256Hex(canonicalJson(v)), intent: v };
      expect(submissionIn({ ...pendingX(sor), signedDigest: undefined }, signed)).toBe("other");
      for (const entry of [appliedX, { ...pendingX(sor), status: "done" as const, outcome: appliedX.outcome }]) {
        const answer = answerRefused(view(entry), X.intentKey, signed, refusedOf(v), new Date(), REPLY_TO);
        expect(answer.kind === "answer" && answer.effects.replies.map((r) => [r.value.status, r.value.duplicate])).toEqual([["rejected", false]]);
        expect(answer.kind === "answer" && answer.effects.refusal?.outcome).toMatchObject({ reason: "unknown_tool" });
      }
      const whilePending = answerRefused(view(pendingX(sor)), X.intentKey, signed, refusedOf(v), new Date(), REPLY_TO);
      if (what === "another agent") expect(whilePending).toMatchObject({ kind: "in_doubt" });
      else expect(whilePending).toMatchObject({ kind: "answer", effects: { replies: [{ value: { status: "rejected" } }] } });
    });
  }
});

describe("signed bytes refused on a deploy without their tool, whose key's write an undo compensated since", () => {
  it("are answered applied (duplicate) with undoneBy, the undo's key, as an owner with the tool answers a repeat", () => {
    const sor = new FakeSystem("helpdesk");
    const at = new Date().toISOString();
    const digest = sha256Hex(canonicalJson(X));
    const x: LedgerIntentEntry = { ...pendingX(sor, true), status: "done", outcome: { status: "applied", version: '"2"', via: "patch", at } };
    const undoKey = undoIntentKey(X.intentKey);
    const undo: LedgerIntentEntry = { ...x, intentKey: undoKey, intentId: "undo-1", signedDigest: undefined, undoOf: X.intentKey, outcome: { status: "applied", version: '"3"', via: "patch", at } };
    const refused = effects({ replies: [{ topic: REPLY_TO, value: rejectedReply(X.intentId, X.intentKey, "unknown_tool", "no write tool named add_tag is admitted", at) }] });
    const answer = (entries: LedgerIntentEntry[]) => {
      const map = new Map(entries.map((e) => [e.intentKey, e]));
      const got = answerRefused({ get: (k) => map.get(k), size: map.size }, X.intentKey, { digest, intent: X }, refused, new Date(), REPLY_TO);
      if (got.kind !== "answer") throw new Error(`expected an answer, got ${got.kind}`);
      return got.effects.replies[0]!.value;
    };
    expect(answer([x])).toMatchObject({ status: "applied", duplicate: true, version: '"2"' });
    expect(answer([x])).not.toHaveProperty("undoneBy");
    expect(answer([x, undo])).toMatchObject({ status: "applied", duplicate: true, version: '"2"', undoneBy: undoKey });
  });
});
