import { describe, expect, it } from "vitest";
import { PartitionLedger } from "../../src/ledger/ledger-state.ts";
import type { LedgerIntentEntry } from "../../src/schemas/ledger-entry.ts";

const entry = (status: LedgerIntentEntry["status"], at = new Date().toISOString()): LedgerIntentEntry => ({
  kind: "intent",
  intentKey: "k".repeat(64),
  intentId: "i1",
  status,
  entity: { type: "ticket", id: "T-1" },
  tool: "tag_ticket",
  fingerprint: "f",
  attempts: [{ baseVersion: '"v1"', deltaFingerprint: "d" }],
  cycles: 0,
  replyTo: "writ.replies.a",
  updatedAt: at,
});

describe("PartitionLedger", () => {
  it("follows the transition table: done is final", () => {
    const ledger = new PartitionLedger(0);
    const txn = ledger.begin();
    expect(() => txn.put(entry("done"))).toThrow(/absent to done/);
    txn.put(entry("pending"));
    txn.put(entry("done"));
    expect(() => txn.put(entry("pending"))).toThrow(/done to pending/);
  });

  it("shows staged changes to the owner and nothing to others until commit", () => {
    const ledger = new PartitionLedger(0);
    const txn = ledger.begin();
    txn.put(entry("pending"));
    expect(txn.get("k".repeat(64))?.status).toBe("pending");
    expect(ledger.get("k".repeat(64))).toBeUndefined();
    txn.commit();
    expect(ledger.get("k".repeat(64))?.status).toBe("pending");
  });

  it("ignores the restore reader while owned, so an older entry cannot overwrite the owner's newer one", () => {
    const ledger = new PartitionLedger(0);
    ledger.own();
    const txn = ledger.begin();
    txn.put(entry("pending"));
    txn.put(entry("done"));
    txn.commit();
    ledger.applyRead("k".repeat(64), entry("pending"));
    expect(ledger.get("k".repeat(64))?.status).toBe("done");
  });

  it("lists entries past the retention cutoff", () => {
    const ledger = new PartitionLedger(0);
    ledger.applyRead("k".repeat(64), entry("done", "2020-01-01T00:00:00.000Z"));
    expect(ledger.expired(new Date("2021-01-01T00:00:00Z"), 10)).toEqual(["k".repeat(64)]);
    expect(ledger.expired(new Date("2019-01-01T00:00:00Z"), 10)).toEqual([]);
  });
});
