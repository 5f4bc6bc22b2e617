import { describe, expect, it } from "vitest";
import { PartitionLedger } from "../../src/ledger/ledger-state.ts";
import { LedgerEntry, type LedgerIntentEntry, type LedgerLeaseEntry } from "../../src/schemas/ledger-entry.ts";

const entry = (status: LedgerIntentEntry["status"], opts: { key?: string; at?: string; replyTo?: string } = {}): LedgerIntentEntry => ({
  kind: "intent",
  intentKey: opts.key ?? "k".repeat(64),
  intentId: "i1",
  status,
  entity: { type: "ticket", id: "T-1" },
  tool: "tag_ticket",
  fingerprint: "f",
  attempts: [{ baseVersion: '"v1"', deltaFingerprint: "d" }],
  cycles: 0,
  replyTo: opts.replyTo ?? "writ.replies.a",
  updatedAt: opts.at ?? new Date().toISOString(),
});

describe("PartitionLedger", () => {
  it("progress: the restore's last progress entry of its own partition is where intake resumes; none is null", () => {
    const progress = (partition: number, offset: string) => ({ kind: "progress" as const, partition, offset, at: new Date().toISOString() });
    expect(new PartitionLedger(2, [["k".repeat(64), entry("done")]]).progress).toBeNull();
    const ledger = new PartitionLedger(2, [
      ["__progress__:2", progress(2, "17")],
      ["k".repeat(64), entry("done")],
      ["__progress__:2", progress(2, "9007199254740993")],
      ["__progress__:5", progress(5, "99999999999999999")],
    ]);
    expect(ledger.progress).toBe(9007199254740993n);
    // Not an intent entry: the ledger's size and lookups do not see it.
    expect(ledger.size).toBe(1);
    expect(ledger.get("__progress__:2")).toBeUndefined();
  });

  it("progress entries on the wire: decimal int64 offsets only", () => {
    const at = new Date().toISOString();
    expect(LedgerEntry.safeParse({ kind: "progress", partition: 0, offset: "0", at }).success).toBe(true);
    expect(LedgerEntry.safeParse({ kind: "progress", partition: 3, offset: "9223372036854775807", at }).success).toBe(true);
    for (const offset of ["-1", "01", "1e3", "", "12345678901234567890", 5]) {
      expect(LedgerEntry.safeParse({ kind: "progress", partition: 0, offset, at }).success, String(offset)).toBe(false);
    }
  });

  it("follows the transition table: done is final", () => {
    const ledger = new PartitionLedger(0);
    ledger.stage(entry("pending"));
    ledger.stage(entry("done"));
    expect(() => ledger.stage(entry("pending"))).toThrow(/cannot go from done to pending/);
    expect(() => new PartitionLedger(0).stage(entry("done"))).toThrow(/cannot go from absent to done/);
  });

  it("reads the newest layer: staged over sending over committed", () => {
    const ledger = new PartitionLedger(0, [["k".repeat(64), entry("pending")]]);
    ledger.stage(entry("conflicted"));
    expect(ledger.get("k".repeat(64))?.status).toBe("conflicted");
    ledger.takeStaged();
    ledger.stage(entry("done"));
    expect(ledger.get("k".repeat(64))?.status).toBe("done");
    expect(ledger.size).toBe(1);
  });

  it("commits only what a transaction carried, and one transaction at a time", () => {
    const ledger = new PartitionLedger(0);
    ledger.stage(entry("pending"));
    expect(ledger.takeStaged()).toHaveLength(1);
    expect(ledger.size).toBe(0);
    ledger.stage(entry("pending", { key: "other" }));
    expect(() => ledger.takeStaged()).toThrow(/already in flight/);
    ledger.committedSending();
    expect(ledger.get("k".repeat(64))?.status).toBe("pending");
    expect(ledger.size).toBe(1);
    expect(ledger.get("other")?.status).toBe("pending");
  });

  it("lists entries past the retention cutoff oldest first, without scanning past the first recent one, and skips pending", () => {
    const old = new Date(Date.now() - 3_600_000).toISOString();
    const ledger = new PartitionLedger(0, [
      ["a", entry("done", { key: "a", at: old })],
      ["b", entry("pending", { key: "b", at: old })],
      ["c", entry("done", { key: "c", at: old })],
      ["d", entry("done", { key: "d" })],
      ["e", entry("done", { key: "e", at: old })],
    ]);
    expect(ledger.expired(new Date(Date.now() - 60_000), 10)).toEqual(["a", "c"]);
    expect(ledger.expired(new Date(Date.now() - 60_000), 1)).toEqual(["a"]);
  });

  it("never expires an open escalation (a person's decision closes it), nor a key `busy` names; a decided escalation expires", () => {
    const old = new Date(Date.now() - 48 * 3_600_000).toISOString();
    const escalated = (key: string): LedgerIntentEntry => ({
      ...entry("done", { key, at: old }),
      outcome: { status: "escalated", reason: "outcome_unknown", message: "m", escalationId: `e-${key}`, at: old },
    });
    const ledger = new PartitionLedger(0, [
      ["a", escalated("a")],
      ["b", entry("done", { key: "b", at: old })],
      ["c", entry("conflicted", { key: "c", at: old })],
      ["d", { ...entry("done", { key: "d", at: old }), outcome: { status: "rejected", reason: "escalation_discarded", message: "m", at: old } }],
    ]);
    const cutoff = new Date(Date.now() - 24 * 3_600_000);
    expect(ledger.expired(cutoff, 10)).toEqual(["b", "c", "d"]);
    expect(ledger.expired(cutoff, 10, (key) => key === "c")).toEqual(["b", "d"]);
    // Open escalations do not count against the batch: the sweep still finds what is due behind them.
    expect(ledger.expired(cutoff, 1)).toEqual(["b"]);
    expect(ledger.openEscalationCount).toBe(1);
  });

  it("a sweep never walks what never expires: open escalations and pending entries before the expired ones cost it nothing", () => {
    const old = new Date(Date.now() - 48 * 3_600_000).toISOString();
    const escalated = (key: string): LedgerIntentEntry => ({
      ...entry("done", { key, at: old }),
      outcome: { status: "escalated", reason: "outcome_unknown", message: "m", escalationId: `e-${key}`, at: old },
    });
    const kept = Array.from({ length: 3_000 }, (_, i) => `kept-${i}`);
    const due = Array.from({ length: 5 }, (_, i) => `due-${i}`);
    const recent = Array.from({ length: 5 }, (_, i) => `recent-${i}`);
    const ledger = new PartitionLedger(0, [
      ...kept.map((k, i): [string, LedgerIntentEntry] => [k, i % 2 ? escalated(k) : entry("pending", { key: k, at: old })]),
      ...due.map((k): [string, LedgerIntentEntry] => [k, entry("done", { key: k, at: old })]),
      ...recent.map((k): [string, LedgerIntentEntry] => [k, entry("done", { key: k })]),
    ]);
    /** A sweep, and its tombstones committed. */
    const sweep = (cutoff: Date) => {
      const out = ledger.expired(cutoff, 1_000);
      for (const k of out) ledger.tombstone(k);
      ledger.takeStaged();
      ledger.committedSending();
      return { out, visits: ledger.lastExpiryVisits };
    };
    const dayAgo = new Date(Date.now() - 24 * 3_600_000);
    // Every expired entry behind the kept ones is found, and only they are looked at.
    expect(sweep(dayAgo)).toEqual({ out: due, visits: due.length });
    expect(sweep(dayAgo)).toEqual({ out: [], visits: 0 });
    // Once the recent entries are past retention too, likewise.
    const later = new Date(Date.now() + 3_600_000);
    expect(sweep(later)).toEqual({ out: recent, visits: recent.length });
    expect(sweep(later)).toEqual({ out: [], visits: 0 });
    // A decided escalation and a settled pending entry are due again, and found.
    const decided = { ...escalated(kept[1]!), outcome: { status: "rejected" as const, reason: "escalation_discarded" as const, message: "m", at: old } };
    ledger.stage(decided, { resolution: true });
    ledger.stage(entry("done", { key: kept[0]!, at: old }));
    ledger.takeStaged();
    ledger.committedSending();
    expect(sweep(later)).toEqual({ out: [kept[1], kept[0]], visits: 2 });
    expect([ledger.size, ledger.openEscalationCount, ledger.pendingCount]).toEqual([kept.length - 2, kept.length / 2 - 1, kept.length / 2 - 1]);
  });

  it("expires nothing for an invalid cutoff (a retention window past the dates, now - 1e10 h), not everything", () => {
    const old = new Date(Date.now() - 3_600_000).toISOString();
    const ledger = new PartitionLedger(0, [["a", entry("done", { key: "a", at: old })], ["b", entry("done", { key: "b" })]]);
    expect(ledger.expired(new Date(Date.now() - 1e10 * 3_600_000), 10)).toEqual([]);
    expect(ledger.expired(new Date(NaN), 10)).toEqual([]);
  });

  it("counts the reply topics its committed entries name, and forgets one when its last entry goes", () => {
    const ledger = new PartitionLedger(0, [
      ["a", entry("done", { key: "a", replyTo: "writ.replies.x" })],
      ["b", entry("done", { key: "b", replyTo: "writ.replies.y" })],
    ]);
    expect(ledger.replyTopics().sort()).toEqual(["writ.replies.x", "writ.replies.y"]);
    ledger.tombstone("b");
    ledger.takeStaged();
    ledger.committedSending();
    expect(ledger.replyTopics()).toEqual(["writ.replies.x"]);
  });
});

describe("PartitionLedger: each agent's leases, counted for WRIT_MAX_LEASES_PER_AGENT", () => {
  const T0 = Date.parse("2025-06-01T12:00:00.000Z");
  const iso = (ms: number) => new Date(ms).toISOString();
  const lease = (id: string, agentId: string, expiresAt: number, extra: Partial<LedgerLeaseEntry> = {}): LedgerLeaseEntry => ({
    kind: "lease",
    entity: { type: "ticket", id },
    change: "c".repeat(64),
    agentId,
    replyTo: "writ.replies.a",
    acquiredAt: iso(T0),
    expiresAt: iso(expiresAt),
    updatedAt: iso(T0),
    ...extra,
  });
  const released = (id: string, agentId: string) => lease(id, agentId, T0, { releasedAt: iso(T0), released: [{ change: "c".repeat(64), agentId, before: iso(T0), until: iso(T0 + 900_000) }] });
  const restored = (...entries: LedgerLeaseEntry[]): [string, LedgerLeaseEntry][] => entries.map((e) => [`__lease__:ticket:${e.entity.id}`, e]);

  it("restore: the live, unreleased leases of each agent, the last entry of a record standing", () => {
    const ledger = new PartitionLedger(0, [
      ...restored(lease("T-1", "a", T0 + 60_000), lease("T-2", "a", T0 + 60_000), lease("T-3", "b", T0 + 60_000), released("T-4", "a"), lease("T-5", "a", T0)),
      // T-2 later taken by b (a's lease lapsed, and was freed): a's entry is gone
      ...restored(lease("T-2", "b", T0 + 120_000)),
    ]);
    expect(ledger.leasesHeldBy("a", T0)).toBe(1);
    expect(ledger.leasesHeldBy("b", T0)).toBe(2);
    expect(ledger.leasesHeldBy("nobody", T0)).toBe(0);
    // An expired lease is not counted (at its expiry, as the gate finds it lapsed), though still in the ledger.
    expect(ledger.leasesHeldBy("b", T0 + 60_000)).toBe(1);
    expect(ledger.lease("ticket:T-3")).toMatchObject({ agentId: "b" });
    expect(ledger.leasesHeldBy("b", T0 + 120_000)).toBe(0);
  });

  it("staged, sending, committed: a grant counts from its staging, a renewal moves its expiry, a release, a lapse or another agent's grant ends it", () => {
    const ledger = new PartitionLedger(0, restored(lease("T-1", "a", T0 + 60_000)));
    ledger.stageLease("ticket:T-2", lease("T-2", "a", T0 + 60_000));
    expect(ledger.leasesHeldBy("a", T0)).toBe(2);
    ledger.takeStaged();
    expect(ledger.leasesHeldBy("a", T0)).toBe(2);
    // Renewed while its grant is in flight: staged over sending, one lease, expiring later.
    ledger.stageLease("ticket:T-2", lease("T-2", "a", T0 + 180_000));
    expect(ledger.leasesHeldBy("a", T0)).toBe(2);
    ledger.committedSending();
    ledger.takeStaged();
    ledger.committedSending();
    expect(ledger.leasesHeldBy("a", T0 + 60_000)).toBe(1);
    // Released (the entry stays, freed): not counted.
    ledger.stageLease("ticket:T-2", released("T-2", "a"));
    expect(ledger.leasesHeldBy("a", T0 + 60_000)).toBe(0);
    // Another agent's grant on a record after a's lease there lapsed: b's, not a's.
    ledger.stageLease("ticket:T-3", lease("T-3", "a", T0 + 120_000));
    expect(ledger.leasesHeldBy("a", T0 + 60_000)).toBe(1);
    ledger.stageLease("ticket:T-3", null);
    ledger.stageLease("ticket:T-3", lease("T-3", "b", T0 + 180_000));
    ledger.stageLease("ticket:T-1", lease("T-1", "b", T0 + 180_000));
    expect([ledger.leasesHeldBy("a", T0 + 60_000), ledger.leasesHeldBy("b", T0 + 60_000)]).toEqual([0, 2]);
    ledger.takeStaged();
    ledger.committedSending();
    expect([ledger.leasesHeldBy("a", T0 + 60_000), ledger.leasesHeldBy("b", T0 + 60_000)]).toEqual([0, 2]);
  });

  it("a grant claimed before its staging counts at once, once; one never staged counts until its expiry", () => {
    const ledger = new PartitionLedger(0);
    ledger.claimLease("ticket:T-1", "a", T0 + 60_000);
    expect(ledger.leasesHeldBy("a", T0)).toBe(1);
    ledger.stageLease("ticket:T-1", lease("T-1", "a", T0 + 60_000));
    expect(ledger.leasesHeldBy("a", T0)).toBe(1);
    ledger.claimLease("ticket:T-2", "a", T0 + 30_000);
    expect(ledger.leasesHeldBy("a", T0)).toBe(2);
    expect(ledger.leasesHeldBy("a", T0 + 30_000)).toBe(1);
    // Expired entries dropped from the count stay so: the lapse staged later (freed) changes nothing.
    ledger.stageLease("ticket:T-2", null);
    expect(ledger.leasesHeldBy("a", T0)).toBe(1);
  });
});
