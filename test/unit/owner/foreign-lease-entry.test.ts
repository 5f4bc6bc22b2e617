// A lease entry no owner wrote (any producer with write access to writ.ledger can write one) under another record's
// key: owners write a record's lease only under `leaseLedgerKey(its entity key)`. Read as that key's lease, the
// sweep found it past its end and let go of the lease of the record it names, a live lease of another change. An
// intent's entry under another key than its intent key is passed over by the same rule.
//
// Such entries under their own records' keys are leases, and may name any record type the entity pattern allows:
// writ_leases_expired_total counted each released one under its type, a series per type a producer sent (the
// owner's memory and every /metrics scrape grew without bound), and the warning each release logs quoted the
// entry's agent id and change whole (no bound in the ledger's schema).
import { Writable } from "node:stream";
import { pino } from "pino";
import { afterEach, describe, expect, it, vi } from "vitest";
import { PartitionLedger, type RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import { RouterMetrics } from "../../../src/metrics/router-metrics.ts";
import { type LedgerIntentEntry, type LedgerLeaseEntry, leaseLedgerKey } from "../../../src/schemas/ledger-entry.ts";
import { admitTools } from "../../../src/tools.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTagIntentJson, intentRecord, ownerWith, resetAfterEach, txns, until } from "./partition-owner-harness.ts";
import { addTag } from "./pipeline-fixtures.ts";

const restored = vi.hoisted(() => ({ entries: [] as [string, unknown][] }));
vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith(restored.entries as [string, RestoredEntry][]) };
});

resetAfterEach();
afterEach(() => void (restored.entries = []));

const T1 = { type: "ticket", id: "T-1" };
const MIN = 60_000;

function lease(change: string, agentId: string, from: number, to: number): LedgerLeaseEntry {
  const at = (t: number) => new Date(t).toISOString();
  return { kind: "lease", entity: T1, change, agentId, replyTo: `writ.replies.${agentId}`, acquiredAt: at(from), expiresAt: at(to), updatedAt: at(from) };
}

const FORGED = 40;

/** A lease of `type:id` that ended an hour ago, under its own key. */
function lapsed(type: string, id: string, agentId = "a"): [string, LedgerLeaseEntry] {
  const at = (t: number) => new Date(t).toISOString();
  const now = Date.now();
  const entity = { type, id };
  return [leaseLedgerKey(`${type}:${id}`), { kind: "lease", entity, change: "c".repeat(64 * 1024), agentId, replyTo: "writ.replies.a", acquiredAt: at(now - 7_200_000), expiresAt: at(now - 3_600_000), updatedAt: at(now - 7_200_000) }];
}

describe("a lease entry under another record's key", () => {
  it("is not that record's lease: the sweep leaves T-1's live lease held, and another agent's write to T-1 is refused leased", async () => {
    const now = Date.now();
    const held = lease("c".repeat(64), "agent-2", now - MIN, now + 10 * MIN);
    // Under T-9's key, naming T-1, long past its end.
    const foreign = lease("d".repeat(64), "mallory", now - 60 * MIN, now - 30 * MIN);
    restored.entries = [
      [leaseLedgerKey("ticket:T-1"), held],
      [leaseLedgerKey("ticket:T-9"), foreign],
    ];
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    const owner = ownerWith({ tools: admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }) });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });

    const swept = vi.spyOn(PartitionLedger.prototype, "expiredLeases");
    owner.requestSweep();
    await waitFor(() => swept.mock.calls.length > 0, { timeoutMs: 5_000, message: "the sweep never ran" });

    // agent-1 holds no lease of T-1: its write must wait for agent-2's change.
    owner.accept([intentRecord(0, addTagIntentJson("s1"))], "0");
    await waitFor(() => txns.some((t) => t.committed && t.offset === "1"), { timeoutMs: 10_000, message: "the intent never settled" });
    expect(sor.patchCount(T1)).toBe(0);
    const replies = txns.flatMap((t) => t.records).filter((r) => r.topic === "writ.replies.agent-1");
    expect(replies.map((r) => (JSON.parse(r.value!.toString()) as { reason?: string }).reason)).toEqual(["leased"]);
    await owner.close();
  });

  it("a restore passes such entries over and counts them, keeping every entry under its own key", () => {
    const now = Date.now();
    const own = lease("c".repeat(64), "agent-2", now - MIN, now + 10 * MIN);
    const at = new Date(now).toISOString();
    const intent = (intentKey: string): LedgerIntentEntry => ({
      kind: "intent", intentKey, intentId: "i", status: "done", entity: T1, tool: "add_tag", fingerprint: "f",
      attempts: [{ baseVersion: '"1"', deltaFingerprint: "d" }], cycles: 0, replyTo: "writ.replies.agent-1", updatedAt: at,
      outcome: { status: "applied", version: '"2"', via: "patch", at },
    });
    const ledger = new PartitionLedger(0, [
      [leaseLedgerKey("ticket:T-1"), own],
      [leaseLedgerKey("ticket:T-9"), lease("d".repeat(64), "mallory", now - MIN, now + MIN)],
      ["a".repeat(64), intent("a".repeat(64))],
      ["b".repeat(64), intent("a".repeat(64))],
    ]);
    expect(ledger.foreign).toBe(2);
    expect(ledger.lease("ticket:T-1")).toEqual(own);
    expect(ledger.leaseCount).toBe(1);
    expect(ledger.get("a".repeat(64))?.intentKey).toBe("a".repeat(64));
    expect(ledger.get("b".repeat(64))).toBeUndefined();
  });
});

describe("forged lease entries of many record types, released by the sweep", () => {
  it("count under an admitted tool's record type or `other` (one series, not one each), and log bounded lines", async () => {
    restored.entries = [lapsed("ticket", "T-1"), ...Array.from({ length: FORGED }, (_, i) => lapsed(`forged${i}`, "x", `agent\n${"a".repeat(64 * 1024)}`))];
    const metrics = new RouterMetrics();
    const sor = new FakeSystem("helpdesk");
    const lines: string[] = [];
    const log = pino({ level: "warn" }, new Writable({ write: (chunk: Buffer, _enc, done) => void (lines.push(chunk.toString("utf8")), done()) }));
    const owner = ownerWith({ tools: admitTools([addTag], [sor], { sorTimeoutMs: 1_000 }), observe: metrics.owner, log });
    owner.start();
    await until(() => owner.state === "running", () => `owner ${owner.state}`);
    owner.requestSweep();
    const released = () => txns.filter((t) => t.committed).flatMap((t) => t.records).filter((r) => r.topic === "writ.ledger" && r.key?.startsWith("__lease__:")).length;
    await until(() => released() === FORGED + 1, () => `${released()} leases released`);

    const series = (await metrics.text()).split("\n").filter((l) => l.startsWith("writ_leases_expired_total{"));
    expect(series.sort()).toEqual([`writ_leases_expired_total{record_type="other"} ${FORGED}`, 'writ_leases_expired_total{record_type="ticket"} 1']);
    const warned = lines.filter((l) => l.includes("lease expired and released"));
    expect(warned).toHaveLength(FORGED + 1);
    for (const line of warned) expect(line.length).toBeLessThan(2_000);
    await owner.close();
  });
});
