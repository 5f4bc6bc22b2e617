// The ledger topic holds each intent key's changes in the order the owner made them, whatever the interleaving
// of the retention sweep, the commit loop and intents of the same key: a restore (the next owner) finds the
// latest change last. A tombstone or an attempt's earlier result committed after a new attempt's `pending`
// entry would make a write under way look expired or settled, and the redelivered intent write again.
// Open escalations are kept past retention (a person's decision closes them).
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../../src/codec.ts";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../../src/keys.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";
import type { SystemOfRecord } from "../../../src/sor/adapter.ts";
import { type AdmittedTool, admitTools, declareWriteTool } from "../../../src/tools.ts";
import { IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import { Resolver } from "../../../src/owner/resolution.ts";
import { KIND_HEADER } from "../../../src/schemas/resolution.ts";
import type { PartitionOwner } from "../../../src/owner/partition-owner.ts";
import { escalatedCase } from "./escalated-case.ts";
import { FakeSystem, version } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";
import { committedLedger, frozenClock, gate, intentRecord, ownerWith, txns, until } from "./partition-owner-harness.ts";

const restored = vi.hoisted(() => ({ entries: [] as [string, unknown][] }));
vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith(restored.entries as [string, RestoredEntry][]) };
});

afterEach(() => {
  txns.length = 0;
  restored.entries = [];
  vi.restoreAllMocks();
});

const T1 = { type: "ticket", id: "T-1" };
const T2 = { type: "ticket", id: "T-2" };
const LINGER_MS = 1_000;
const twoDaysAgo = () => new Date(Date.now() - 48 * 3_600_000).toISOString();

const setTags = declareWriteTool({
  name: "set_tags",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"],
  allowedPaths: ["/tags"],
  versionPolicy: "strict",
  keyScope: "run",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

/** A system whose reads of T-2 and PATCHes of T-1 wait for their gates when given. */
function gatedSystem(sys: FakeSystem, gates: { readT2?: Promise<void>; patchT1?: Promise<void> }) {
  const seen = { readingT2: false, patchingT1: false };
  const sor: SystemOfRecord = Object.assign(Object.create(sys), {
    name: "helpdesk",
    capabilities: sys.capabilities,
    read: async (e: typeof T1, o: never) => {
      if (e.id === "T-2" && gates.readT2) {
        seen.readingT2 = true;
        await gates.readT2;
      }
      return sys.read(e, o);
    },
    lookupIdempotencyKey: (e: never, k: never, o: never) => sys.lookupIdempotencyKey(e, k, o),
    patch: async (e: typeof T1, ops: never, o: never) => {
      if (e.id === "T-1" && gates.patchT1) {
        seen.patchingT1 = true;
        await gates.patchT1;
      }
      return sys.patch(e, ops, o);
    },
  });
  return { sor, seen };
}

/** An intent of `tool` (params { tag: "vip" }) on `entity` at `base`; the same `stepId` is the same intent key. */
function intent(tool: AdmittedTool, intentId: string, stepId: string, entity: typeof T1, base: string) {
  const params = { tag: "vip" };
  const key = intentKey({ tool, agentId: "a", runId: "r", stepId, entity, params });
  const delta = tool.name === "add_tag" ? [{ op: "add", path: "/tags/-", value: "vip" }] : [{ op: "replace", path: "/tags", value: ["vip"] }];
  const json = JSON.stringify({ intentId, intentKey: key, entity, tool: tool.name, agent: { id: "a", runId: "r", stepId }, baseVersion: base, delta, params, replyTo: "writ.replies.a", createdAt: new Date().toISOString() });
  return { key, json, params, delta };
}

/** The add_tag intent key K's entry as a first attempt left it two days ago: conflicted (past the 24 h retention). */
function conflictedTwoDaysAgo(tool: AdmittedTool, k: ReturnType<typeof intent>): [string, RestoredEntry] {
  const at = twoDaysAgo();
  const entry: LedgerIntentEntry = {
    kind: "intent", intentKey: k.key, intentId: "i-0", status: "conflicted", entity: T1, tool: tool.name, agentId: "a",
    fingerprint: paramsFingerprint(tool.name, T1, k.params, tool.freeTextParams),
    attempts: [{ baseVersion: version(1), deltaFingerprint: deltaFingerprint(k.delta as never, tool.isFreeTextPath) }],
    cycles: 1, replyTo: "writ.replies.a", updatedAt: at, outcome: { status: "conflict", cycle: 1, version: version(2), at },
  };
  return [k.key, entry];
}

/**
 * A codec that holds the encode of dead letters, of the progress entry (and of `pending` entries of `heldKey`)
 * until their gates open: a dead letter staged while an intent works makes the commit loop linger.
 */
function gatedCodec(heldKey?: string) {
  const codec = new WireCodec({});
  const encode = codec.encode.bind(codec);
  const progress = gate();
  const pending = gate();
  const deadLetter = gate();
  const seen = { progressAsked: false, pendingAsked: false, pendingEncoded: false, deadLettered: false };
  codec.encode = async (topic, name, value) => {
    const v = value as { kind?: string; status?: string; intentKey?: string };
    if (name === "DeadLetter") await deadLetter.wait;
    if (name === "LedgerEntry" && v.kind === "progress") {
      seen.progressAsked = true;
      await progress.wait;
    }
    const ofHeldKey = name === "LedgerEntry" && v.status === "pending" && v.intentKey === heldKey;
    if (ofHeldKey) {
      seen.pendingAsked = true;
      await pending.wait;
    }
    const out = await encode(topic, name, value);
    if (ofHeldKey) seen.pendingEncoded = true;
    if (name === "DeadLetter") seen.deadLettered = true;
    return out;
  };
  return { codec, progress, pending, deadLetter, seen };
}

/** The changes of ledger key `key` the (committed) transactions carried, in order: statuses, or `tombstone`. */
const changesOf = (key: string, of: "committed" | "sent" = "committed") =>
  committedLedger(of)
    .filter((r) => r.startsWith(`${key}:`))
    .map((r) => r.slice(key.length + 1));

/**
 * An owner over `tools` whose ledger holds a first attempt of `k` from two days ago (conflicted), with `codec`,
 * running with the clock standing still (its linger runs out when the test says).
 */
async function ownerPastRetention(tools: ReadonlyMap<string, AdmittedTool>, k: ReturnType<typeof intent>, codec: WireCodec) {
  restored.entries = [conflictedTwoDaysAgo(tools.get("add_tag")!, k)];
  const owner = ownerWith({ codec, tools, config: { commitLingerMs: LINGER_MS } });
  owner.start();
  await until(() => owner.state === "running", () => `owner ${owner.state}`);
  return owner;
}

/**
 * With an intent at work, the dead letter of offset 0 is staged and the commit loop lingers (nothing committed:
 * the clock stands still); then the linger runs out and a sweep is asked for. Resolves once the sweep's commit,
 * carrying the dead letter and moving the progress entry, waits for that entry's encode.
 */
async function sweepWithTheDeadLetter(owner: PartitionOwner, clock: { advance(ms: number): void }, gated: ReturnType<typeof gatedCodec>) {
  gated.deadLetter.open();
  await until(() => gated.seen.deadLettered, () => JSON.stringify(gated.seen));
  expect([gated.seen.progressAsked, txns.some((t) => t.committed)]).toEqual([false, false]);
  clock.advance(LINGER_MS + 1);
  owner.requestSweep();
  await until(() => gated.seen.progressAsked, () => "the sweep's commit never asked for its progress entry");
}

describe("the ledger's order per key", () => {
  it("sweep-during-attempt: an expired entry whose key has an attempt under way is not tombstoned; the attempt's entries follow it", async () => {
    const clock = frozenClock();
    const sys = new FakeSystem("helpdesk");
    sys.seed(T1, { tags: [] });
    sys.change(T1, [{ op: "add", path: "/tags/-", value: "other" }]);
    const { sor } = gatedSystem(sys, {});
    const tools = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 });
    const k = intent(tools.get("add_tag")!, "i-1", "s", T1, version(2));
    const gated = gatedCodec(k.key);
    const owner = await ownerPastRetention(tools, k, gated.codec);
    // The new attempt at offset 1 classified against the conflicted entry and is encoding its `pending` entry
    // (held) when the sweep runs.
    owner.accept([intentRecord(0, "not JSON"), intentRecord(1, k.json)], "1");
    await until(() => gated.seen.pendingAsked, () => JSON.stringify(gated.seen));
    await sweepWithTheDeadLetter(owner, clock, gated);
    gated.pending.open();
    await until(() => gated.seen.pendingEncoded, () => "the pending entry was never encoded");
    gated.progress.open();
    await until(() => changesOf(k.key).includes("done"), () => JSON.stringify(committedLedger()));
    await owner.close();
    expect(changesOf(k.key)).toEqual(["pending", "done"]);
    expect(sys.commitsOf(k.key)).toBe(1);
  });

  it("sweep-then-new-attempt: a key tombstoned by a commit waiting for its progress entry gets its new attempt's pending entry after the tombstone", async () => {
    const clock = frozenClock();
    const sys = new FakeSystem("helpdesk");
    sys.seed(T1, { tags: [] });
    sys.seed(T2, { tags: [] });
    sys.change(T1, [{ op: "add", path: "/tags/-", value: "other" }]);
    const readT2 = gate();
    const { sor, seen: sys2 } = gatedSystem(sys, { readT2: readT2.wait });
    const tools = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 });
    const tool = tools.get("add_tag")!;
    const k = intent(tool, "i-1", "s", T1, version(2));
    const gated = gatedCodec();
    const owner = await ownerPastRetention(tools, k, gated.codec);
    // Offset 1 is another record's intent at work. Nothing holds K when the sweep tombstones it.
    owner.accept([intentRecord(0, "not JSON"), intentRecord(1, intent(tool, "x", "x", T2, version(1)).json, "ticket:T-2")], "1");
    await until(() => sys2.readingT2, () => JSON.stringify(sys2));
    await sweepWithTheDeadLetter(owner, clock, gated);
    // A new attempt of K arrives while that commit encodes its progress entry: K is absent for it (tombstoned).
    let encodedK = false;
    const { codec } = gated;
    const encode = codec.encode.bind(codec);
    codec.encode = async (topic, name, value) => {
      const out = await encode(topic, name, value);
      if (name === "LedgerEntry" && (value as { intentKey?: string }).intentKey === k.key) encodedK = true;
      return out;
    };
    owner.accept([intentRecord(2, k.json)], "2");
    await until(() => encodedK, () => "the new attempt's pending entry was never encoded");
    gated.progress.open();
    readT2.open();
    clock.advance(LINGER_MS + 1);
    await until(() => changesOf(k.key).includes("done"), () => JSON.stringify(committedLedger()));
    await owner.close();
    expect(changesOf(k.key)).toEqual(["tombstone", "pending", "done"]);
    expect(sys.commitsOf(k.key)).toBe(1);
  });

  it("result-then-new-attempt: an attempt's result not yet committed reaches the topic before the next attempt's pending entry of its key", async () => {
    const clock = frozenClock();
    const sys = new FakeSystem("helpdesk");
    sys.seed(T1, { tags: [] });
    sys.seed(T2, { tags: [] });
    sys.change(T1, [{ op: "replace", path: "/tags", value: ["x"] }]);
    const readT2 = gate();
    const patchT1 = gate();
    const { sor, seen } = gatedSystem(sys, { readT2: readT2.wait, patchT1: patchT1.wait });
    const tools = admitTools([setTags], [sor], { sorTimeoutMs: 1_000 });
    const tool = tools.get("set_tags")!;
    const first = intent(tool, "a1", "s", T1, version(1));
    const again = intent(tool, "a2", "s", T1, version(2));
    const codec = new WireCodec({});
    const encode = codec.encode.bind(codec);
    let againPending = false;
    codec.encode = async (topic, name, value) => {
      const out = await encode(topic, name, value);
      if (name === "LedgerEntry" && (value as { intentId?: string; status?: string }).intentId === "a2") againPending = true;
      return out;
    };
    const owner = ownerWith({ codec, tools, config: { commitLingerMs: LINGER_MS } });
    owner.start();
    await until(() => owner.state === "running", () => `owner ${owner.state}`);
    // Offset 0 keeps the loop lingering (its read held). Offset 1 meets a conflict (its base is behind): its result
    // (`conflicted`) is staged. Offset 2, the same key on the version now, starts at once and stages its `pending`
    // entry before the conflicted result committed.
    owner.accept([intentRecord(0, intent(tool, "x", "x", T2, version(1)).json, "ticket:T-2"), intentRecord(1, first.json), intentRecord(2, again.json)], "2");
    await until(() => seen.readingT2 && againPending, () => JSON.stringify({ ...seen, againPending }));
    clock.advance(LINGER_MS + 1);
    readT2.open();
    // While the second attempt's PATCH is out, a restore (its read_uncommitted scan included) finds its pending entry last.
    await until(() => seen.patchingT1, () => "the second attempt's PATCH never left");
    expect(changesOf(first.key, "sent")).toEqual(["pending", "conflicted", "pending"]);
    patchT1.open();
    await until(() => changesOf(first.key).includes("done"), () => JSON.stringify(committedLedger()));
    await owner.close();
    expect(changesOf(first.key)).toEqual(["pending", "conflicted", "pending", "done"]);
  });

  it("open escalations are kept past retention; settled entries as old are tombstoned", async () => {
    const at = twoDaysAgo();
    const base = (key: string): LedgerIntentEntry => ({
      kind: "intent", intentKey: key, intentId: `i-${key.slice(0, 4)}`, status: "done", entity: T1, tool: "add_tag", agentId: "a", fingerprint: "f",
      attempts: [{ baseVersion: version(1), deltaFingerprint: "d" }], cycles: 2, replyTo: "writ.replies.a", updatedAt: at,
    });
    const escalated = "e".repeat(64);
    const applied = "a".repeat(64);
    restored.entries = [
      [escalated, { ...base(escalated), outcome: { status: "escalated", reason: "outcome_unknown", message: "m", escalationId: "esc-1", at } }],
      [applied, { ...base(applied), outcome: { status: "applied", version: version(2), via: "patch", at } }],
    ];
    const owner = ownerWith();
    owner.start();
    await until(() => owner.state === "running", () => `owner ${owner.state}`);
    expect(owner.stats()).toMatchObject({ ledgerEntries: 2, escalations: 1, oldestEscalationSince: Date.parse(at) });
    owner.requestSweep();
    await until(() => committedLedger().length > 0, () => "the sweep committed nothing");
    expect(committedLedger()).toEqual([`${applied}:tombstone`]);
    expect(owner.stats()).toMatchObject({ ledgerEntries: 1, escalations: 1 });
    await owner.close();
  });

  /**
   * An intent whose processing fails on every try (maxProcessingAttempts 1) while its `pending` entry's encode is
   * held: `opts.failPending` makes that staging fail once let go. Resolves with the owner and what its log said.
   */
  async function exhaustedWithPendingHeld(opts: { failPending?: boolean } = {}) {
    const sys = new FakeSystem("helpdesk");
    sys.seed(T1, { tags: [] });
    const tools = admitTools([addTag], [sys], { sorTimeoutMs: 1_000 });
    const k = intent(tools.get("add_tag")!, "i-1", "s", T1, version(1));
    const gated = gatedCodec(k.key);
    gated.progress.open();
    gated.deadLetter.open();
    if (opts.failPending) {
      const encode = gated.codec.encode.bind(gated.codec);
      gated.codec.encode = async (topic, name, value) => {
        const out = await encode(topic, name, value);
        if (name === "LedgerEntry" && (value as { status?: string }).status === "pending") throw new Error("the pending entry cannot be encoded");
        return out;
      };
    }
    // A bug in the write (not an outage): the try fails before it waited for its pending entry.
    vi.spyOn(IntentPipeline.prototype, "execute").mockRejectedValue(new Error("a bug"));
    const { owner, log } = await failingOnce(tools, gated, intentRecord(0, k.json), k.key, "intent processing failed");
    return { owner, k, log };
  }

  /**
   * An owner (maxProcessingAttempts 1) given `record`, whose one try failed (its log said `failed`) while the
   * pending entry of `key` was held; nothing of the key has left. Then the entry is let go.
   */
  async function failingOnce(tools: ReadonlyMap<string, AdmittedTool>, gated: ReturnType<typeof gatedCodec>, record: ReturnType<typeof intentRecord>, key: string, failed: string) {
    const lines: string[] = [];
    const log = pino({ level: "error" }, new Writable({ write: (chunk, _enc, done) => void (lines.push(String(chunk)), done()) }));
    const owner = ownerWith({ codec: gated.codec, tools, log, config: { maxProcessingAttempts: 1 } });
    owner.start();
    await until(() => owner.state === "running", () => `owner ${owner.state}`);
    owner.accept([record], "0");
    await until(() => lines.some((l) => l.includes(failed)), () => lines.join(""));
    // Nothing of the key left before its pending entry: the failed run's result waits for it.
    expect(changesOf(key, "sent")).toEqual([]);
    gated.pending.open();
    return { owner, log: lines };
  }

  it("failed-while-pending-in-flight: an intent out of processing attempts is settled only after its pending entry is durable", async () => {
    const { owner, k, log } = await exhaustedWithPendingHeld();
    await until(() => changesOf(k.key).length === 2, () => JSON.stringify(committedLedger("sent")) + log.join(""));
    await owner.close();
    expect(changesOf(k.key)).toEqual(["pending", "done"]);
  });

  it("failed-resolution-while-pending-in-flight: an operator's apply out of attempts puts the escalation back only after its pending entry", async () => {
    const c = escalatedCase(addTag, { status: "done", state: { tags: [] }, delta: [{ op: "add", path: "/tags/-", value: "vip" }] });
    restored.entries = [[c.key, c.entry]];
    const gated = gatedCodec(c.key);
    gated.progress.open();
    gated.deadLetter.open();
    vi.spyOn(Resolver.prototype, "apply").mockRejectedValue(new Error("a bug"));
    // Dated now: the owner runs on the real clock, and dates a resolution as an intent (stale past the retention).
    const record = intentRecord(0, JSON.stringify({ ...c.resolution, createdAt: new Date().toISOString() }));
    record.headers = { [KIND_HEADER]: Buffer.from("resolution") };
    const { owner, log } = await failingOnce(new Map([[c.tool.name, c.tool]]), gated, record, c.key, "resolution failed");
    await until(() => changesOf(c.key).length === 2, () => JSON.stringify(committedLedger("sent")) + log.join(""));
    await owner.close();
    // The escalation is open again, last: a restore finds it so, not an apply under way.
    expect(changesOf(c.key)).toEqual(["pending", "done"]);
    const answers = txns.filter((t) => t.committed).flatMap((t) => t.records).filter((r) => r.topic === c.resolution.replyTo);
    expect(answers.map((r) => JSON.parse(r.value!.toString("utf8")) as unknown)).toMatchObject([{ status: "rejected", reason: "processing_failed" }]);
  });

  it("failed-pending-staging: an intent out of attempts whose pending entry could not be staged is answered without a ledger entry", async () => {
    const { owner, k } = await exhaustedWithPendingHeld({ failPending: true });
    const replies = () => txns.filter((t) => t.committed).flatMap((t) => t.records).filter((r) => r.topic === "writ.replies.a");
    await until(() => replies().length === 1, () => JSON.stringify(txns));
    await owner.close();
    expect(JSON.parse(replies()[0]!.value!.toString("utf8"))).toMatchObject({ status: "rejected", reason: "processing_failed" });
    expect(changesOf(k.key, "sent")).toEqual([]);
  });
});
