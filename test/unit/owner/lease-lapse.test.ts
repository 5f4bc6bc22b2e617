// A lease that lapses (its time to live out, no release) keeps a replay mark for its change in the record's ledger
// lease entry, as a release does: the owner finds it at an intent's start or in the sweep, stages the freed entry
// before anything the record's later intents write (its encoding waits for the transaction, its place does not),
// and a replay of the lapsed lease's acquire is refused `lease_replayed`. Over a producer that records each
// transaction (partition-owner-harness.ts); effects counted at the fake system.
import { afterEach, describe, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey, leaseIntentKey } from "../../../src/keys.ts";
import type { RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import type { LedgerLeaseEntry } from "../../../src/schemas/ledger-entry.ts";
import { LEASE_VERSION } from "../../../src/schemas/write-intent.ts";
import { admitTools } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";
import { gate, intentRecord, ownerWith, txns, until } from "./partition-owner-harness.ts";
import { addTag } from "./pipeline-fixtures.ts";

/** When the restored lapsed lease's latest acquire was created: each test sets it before its owner starts. */
const lapse = vi.hoisted(() => ({ acquiredBy: "" }));
vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([lapsedLeaseOf(lapse.acquiredBy)]) };
});

afterEach(() => {
  txns.length = 0;
});

const T1 = { type: "ticket", id: "T-1" };
const LEASE_KEY = "__lease__:ticket:T-1";
const STALLED = "c".repeat(64);
const OTHER = "e".repeat(64);

/** Change STALLED's lease of T-1, taken by agent `a`'s acquire created at `acquiredBy`, lapsed a second ago. */
function lapsedLeaseOf(acquiredBy: string): [string, RestoredEntry] {
  const now = Date.now();
  const entry: LedgerLeaseEntry = {
    kind: "lease", entity: T1, change: STALLED, agentId: "a", replyTo: "writ.replies.a",
    acquiredAt: acquiredBy, expiresAt: new Date(now - 1_000).toISOString(), updatedAt: acquiredBy, lastAcquireCreatedAt: acquiredBy,
  };
  return [LEASE_KEY, entry as RestoredEntry];
}

function acquireJson(change: string, agentId: string, intentId: string, createdAt: string): string {
  return JSON.stringify({
    intentId, intentKey: leaseIntentKey(change, "acquire", T1), entity: T1, tool: "add_tag", agent: { id: agentId, runId: "r", stepId: "c/acquire" },
    baseVersion: LEASE_VERSION, delta: [], params: {}, replyTo: `writ.replies.${agentId}`, createdAt, lease: { change, op: "acquire", ttlMs: 30_000 },
  });
}

/** What the committed transactions wrote to T-1's lease key, in topic order. */
function leaseWrites(): (LedgerLeaseEntry | null)[] {
  return txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic === "writ.ledger" && r.key === LEASE_KEY)
    .map((r) => (r.value === null ? null : (JSON.parse(r.value.toString("utf8")) as LedgerLeaseEntry)));
}

/** The committed replies to intent `intentId`. */
function repliesTo(intentId: string): { status: string; reason?: string }[] {
  return txns
    .filter((t) => t.committed)
    .flatMap((t) => t.records)
    .filter((r) => r.topic.startsWith("writ.replies.") && r.value !== null)
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { intentId: string; status: string; reason?: string })
    .filter((v) => v.intentId === intentId);
}

function system() {
  const sys = new FakeSystem("helpdesk");
  sys.seed(T1, { tags: [] });
  return { sys, tools: admitTools([addTag], [sys], { sorTimeoutMs: 1_000 }) };
}

async function running(owner: ReturnType<typeof ownerWith>) {
  owner.start();
  await until(() => owner.state === "running", () => `owner ${owner.state}`);
}

describe("a lapsed lease keeps its replay marks", () => {
  it("lapse-then-acquire: found lapsed by another change's acquire, the freed entry (its mark) reaches the ledger before the new lease, which carries the mark", async () => {
    const acquiredBy = (lapse.acquiredBy = new Date(Date.now() - 5_000).toISOString());
    const { tools } = system();
    // The freed entry's encoding is held until the new lease's result is encoded: its place must not depend on it.
    const codec = new WireCodec({});
    const encode = codec.encode.bind(codec);
    const freedEncode = gate();
    const seen = { freedAsked: false, acquireAnswered: false };
    codec.encode = async (topic, name, value) => {
      const v = value as { kind?: string; releasedAt?: string; intentId?: string };
      if (name === "LedgerEntry" && v.kind === "lease" && v.releasedAt !== undefined) {
        seen.freedAsked = true;
        await freedEncode.wait;
      }
      const out = await encode(topic, name, value);
      if (name === "Reply" && v.intentId === "b-1") seen.acquireAnswered = true;
      return out;
    };
    const owner = ownerWith({ codec, tools });
    await running(owner);

    owner.accept([intentRecord(0, acquireJson(OTHER, "b", "b-1", new Date().toISOString()))], "0");
    await until(() => seen.acquireAnswered && seen.freedAsked, () => JSON.stringify(seen));
    freedEncode.open();
    await until(() => repliesTo("b-1").length === 1, () => JSON.stringify(leaseWrites()));
    await owner.close();

    expect(repliesTo("b-1")).toMatchObject([{ status: "applied" }]);
    const writes = leaseWrites();
    const mark = { change: STALLED, agentId: "a", before: acquiredBy, until: new Date(Date.parse(acquiredBy) + 15 * 60_000).toISOString() };
    expect(writes.map((w) => (w === null ? "tombstone" : w.releasedAt === undefined ? `held by ${w.change.slice(0, 1)}` : `freed from ${w.change.slice(0, 1)}`))).toEqual(["freed from c", "held by e"]);
    expect(writes[0]!.released).toEqual([mark]);
    expect(writes[1]!.released).toEqual([mark]);
  });

  it("lapse-swept: the sweep frees a lapsed lease with its mark; its acquire's bytes again are refused `lease_replayed`, and another agent's write is applied once", async () => {
    const acquiredBy = (lapse.acquiredBy = new Date(Date.now() - 5_000).toISOString());
    const { sys, tools } = system();
    const owner = ownerWith({ tools });
    await running(owner);

    owner.requestSweep();
    await until(() => leaseWrites().length === 1, () => JSON.stringify(leaseWrites()));
    expect(leaseWrites()[0]).toMatchObject({ change: STALLED, releasedAt: expect.any(String), released: [{ change: STALLED, agentId: "a", before: acquiredBy }] });

    // The stalled agent's acquire, its bytes produced again: refused, nothing taken.
    owner.accept([intentRecord(0, acquireJson(STALLED, "a", "a-1", acquiredBy))], "0");
    await until(() => repliesTo("a-1").length === 1, () => JSON.stringify(txns));
    expect(repliesTo("a-1")).toMatchObject([{ status: "rejected", reason: "lease_replayed" }]);
    expect(leaseWrites()).toHaveLength(1);

    // Another agent's write of the record: applied, never `leased`; one PATCH at the system.
    const params = { tag: "vip" };
    const key = intentKey({ tool: tools.get("add_tag")!, agentId: "b", runId: "r", stepId: "w", entity: T1, params });
    const write = { intentId: "b-2", intentKey: key, entity: T1, tool: "add_tag", agent: { id: "b", runId: "r", stepId: "w" }, baseVersion: version(1), delta: [{ op: "add", path: "/tags/-", value: "vip" }], params, replyTo: "writ.replies.b", createdAt: new Date().toISOString() };
    owner.accept([intentRecord(1, JSON.stringify(write))], "1");
    await until(() => repliesTo("b-2").length === 1, () => JSON.stringify(txns));
    await owner.close();
    expect(repliesTo("b-2")).toMatchObject([{ status: "applied" }]);
    expect(sys.patchCount(T1)).toBe(1);
  });
});
