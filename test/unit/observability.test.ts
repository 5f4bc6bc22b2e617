import { describe, expect, it } from "vitest";
import { WritError } from "../../src/errors.ts";
import { PartitionLedger } from "../../src/ledger/ledger-state.ts";
import { observeSystem } from "../../src/metrics/observed-system.ts";
import { intentOutcome } from "../../src/metrics/outcome.ts";
import { RouterMetrics } from "../../src/metrics/router-metrics.ts";
import { effects } from "../../src/owner/effects.ts";
import type { LedgerIntentEntry } from "../../src/schemas/ledger-entry.ts";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { formatTraceparent, headerText, parseTraceparent, spanContextFromHeaders, traceHeaders } from "../../src/tracing/trace-context.ts";

const TP = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";

describe("W3C trace context", () => {
  it("reads a header value as text: a string, a Buffer, the first of repeated ones; null (a null header value) as absent", () => {
    expect(headerText("a")).toBe("a");
    expect(headerText(Buffer.from("b"))).toBe("b");
    expect(headerText([Buffer.from("c"), "d"])).toBe("c");
    expect(headerText(null)).toBeUndefined();
    expect(headerText(undefined)).toBeUndefined();
    expect(spanContextFromHeaders({ traceparent: null } as never)).toBeNull();
  });

  it("parses and formats traceparent, with tracestate", () => {
    const sc = parseTraceparent(TP, "congo=t61rcWkgMzE")!;
    expect(sc).toMatchObject({ traceId: "0af7651916cd43dd8448eb211c80319c", spanId: "b7ad6b7169203331", traceFlags: 1, isRemote: true });
    expect(formatTraceparent(sc)).toBe(TP);
    expect(traceHeaders(sc)).toEqual({ traceparent: TP, tracestate: "congo=t61rcWkgMzE" });
  });

  it("refuses malformed values", () => {
    for (const bad of [
      "",
      "ff-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01",
      "00-00000000000000000000000000000000-b7ad6b7169203331-01",
      "00-0af7651916cd43dd8448eb211c80319c-0000000000000000-01",
      "00-0AF7651916CD43DD8448EB211C80319C-b7ad6b7169203331-01",
      "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-extra",
      "00-0af7651916cd43dd8448eb211c8031-b7ad6b7169203331-01",
    ]) {
      expect(parseTraceparent(bad)).toBeNull();
    }
    // A later version may append fields.
    expect(parseTraceparent("01-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01-later")).not.toBeNull();
  });

  it("reads Kafka headers (Buffers) and HTTP headers (any case)", () => {
    expect(spanContextFromHeaders({ traceparent: Buffer.from(TP) })?.spanId).toBe("b7ad6b7169203331");
    expect(spanContextFromHeaders({ TraceParent: TP })?.spanId).toBe("b7ad6b7169203331");
    expect(spanContextFromHeaders({ other: "x" })).toBeNull();
    expect(spanContextFromHeaders(undefined)).toBeNull();
  });
});

function fakeSystem(answers: { read?: () => Promise<unknown> } = {}): SystemOfRecord & { seen: Record<string, string>[] } {
  const seen: Record<string, string>[] = [];
  return {
    seen,
    name: "billing",
    capabilities: { idempotencyKeys: true, idempotencyLookup: true },
    async read(_e, opts) {
      seen.push({ ...opts.headers });
      if (answers.read) return (await answers.read()) as never;
      return { state: {}, version: '"v1"' };
    },
    async patch(_e, _ops, opts) {
      seen.push({ ...opts.headers });
      return { kind: "precondition_failed", current: null };
    },
    async lookupIdempotencyKey(_e, _k, opts) {
      seen.push({ ...opts.headers });
      return "not_applied";
    },
  };
}

describe("observeSystem (no SDK registered)", () => {
  it("times every call by system, method and outcome, and passes the headers on", async () => {
    const calls: string[] = [];
    const inner = fakeSystem();
    const system = observeSystem(inner, (s, m, o, sec) => {
      expect(sec).toBeGreaterThanOrEqual(0);
      calls.push(`${s} ${m} ${o}`);
    });
    const entity = { type: "payment", id: "pay_1" };
    await system.read(entity, { timeoutMs: 100, headers: { "x-writ-owner": "o p0 s1" } });
    await system.patch(entity, [], { ifMatch: '"v1"', idempotencyKey: "k", timeoutMs: 100, headers: { "x-writ-owner": "o p0 s1", traceparent: TP } });
    await system.lookupIdempotencyKey!(entity, "k", { timeoutMs: 100 });
    expect(calls).toEqual(["billing read ok", "billing patch precondition_failed", "billing lookup not_applied"]);
    expect(inner.seen[0]).toEqual({ "x-writ-owner": "o p0 s1" });
    // Without an SDK the incoming trace context is passed on as it came.
    expect(inner.seen[1]).toEqual({ "x-writ-owner": "o p0 s1", traceparent: TP });
    expect(system.upsertByExternalId).toBeUndefined();
  });

  it("labels outages unavailable and passes errors through", async () => {
    const calls: string[] = [];
    const down = observeSystem(
      fakeSystem({ read: () => Promise.reject(new WritError("sor_unavailable", "connection refused", { retriable: true })) }),
      (_s, m, o) => calls.push(`${m} ${o}`),
    );
    await expect(down.read({ type: "payment", id: "p" }, { timeoutMs: 100 })).rejects.toThrow(/connection refused/);
    const broken = observeSystem(fakeSystem({ read: () => Promise.reject(new Error("boom")) }), (_s, m, o) => calls.push(`${m} ${o}`));
    await expect(broken.read({ type: "payment", id: "p" }, { timeoutMs: 100 })).rejects.toThrow("boom");
    expect(calls).toEqual(["read unavailable", "read error"]);
  });
});

describe("intent outcomes", () => {
  const reply = (status: "applied" | "conflict" | "rejected", duplicate = false) =>
    ({ status, duplicate, intentId: "i", intentKey: "k", at: "t", message: "m", reason: "sor_rejected" }) as never;
  it("one outcome per intent: repeat, escalated, dead_lettered, else the reply's status", () => {
    expect(intentOutcome(undefined, effects({ replies: [{ topic: "t", value: reply("applied", true) }] }))?.outcome).toBe("repeat");
    // The same submission delivered again (the offset commit lags results) is told apart from an agent's repeat.
    expect(intentOutcome(undefined, effects({ replies: [{ topic: "t", value: reply("applied", true) }], redelivered: true }))?.outcome).toBe("redelivered");
    expect(intentOutcome(undefined, effects({ replies: [{ topic: "t", value: reply("conflict") }] }))?.outcome).toBe("conflict");
    expect(intentOutcome(undefined, effects({ replies: [{ topic: "t", value: reply("rejected") }] }))).toMatchObject({ tool: "none", outcome: "rejected" });
    const dead = effects({ deadLetters: [{ key: null, value: { reason: "undecodable" } as never }] });
    expect(intentOutcome(undefined, dead)).toMatchObject({ outcome: "dead_lettered", deadLetters: ["undecodable"] });
    const escalated = effects({ escalations: [{ key: "e", value: { reason: "processing_failed" } as never }], deadLetters: [{ key: null, value: { reason: "processing_failed" } as never }] });
    expect(intentOutcome(undefined, escalated)).toMatchObject({ outcome: "escalated", escalations: ["processing_failed"], deadLetters: ["processing_failed"] });
  });
});

describe("RouterMetrics", () => {
  it("counts committed outcomes and reads gauges from the owners at scrape time", async () => {
    const m = new RouterMetrics();
    m.owner.committed(0, 12, [
      { tool: "tag_ticket", outcome: "repeat", escalations: [], deadLetters: [] },
      { tool: "tag_ticket", outcome: "redelivered", escalations: [], deadLetters: [] },
      { tool: "none", outcome: "dead_lettered", escalations: [], deadLetters: ["too_large"] },
    ]);
    m.owner.opened(0, 300);
    m.pipeline.conflict({ tool: { name: "tag_ticket", recordType: "ticket" } } as never, "version_mismatch");
    m.fetched(0, "10");
    const escalatedAt = Date.now() - 7_200_000;
    m.attach({
      partitions: () => [
        { partition: 0, ledgerEntries: 5, pending: 1, oldestPendingSince: Date.now() - 2000, escalations: 3, oldestEscalationSince: escalatedAt, leases: 2, committedOffset: 7n },
      ],
      highWatermarks: () => Promise.reject(new Error("broker away")),
    });
    const text = await m.text();
    expect(text).toContain('writ_intents_total{tool="tag_ticket",outcome="repeat"} 1');
    expect(text).toContain('writ_duplicates_answered_total{tool="tag_ticket"} 1');
    expect(text).toContain('writ_intents_total{tool="tag_ticket",outcome="redelivered"} 1');
    expect(text).toContain('writ_dead_letters_total{reason="too_large"} 1');
    expect(text).toContain('writ_conflicts_total{tool="tag_ticket",record_type="ticket",cause="version_mismatch"} 1');
    expect(text).toContain('writ_ledger_entries{partition="0"} 5');
    expect(text).toContain('writ_ledger_pending_entries{partition="0"} 1');
    expect(text).toContain('writ_leases_held{partition="0"} 2');
    // The probe failed: lag from the last fetched batch's high watermark.
    expect(text).toContain('writ_consumer_lag_records{partition="0"} 3');
    expect(text).toMatch(/writ_ledger_oldest_pending_age_seconds\{partition="0"\} (1\.9|2)/);
    expect(text).toContain('writ_ledger_escalated_entries{partition="0"} 3');
    expect(Number(/writ_ledger_oldest_escalated_age_seconds\{partition="0"\} ([0-9.]+)/.exec(text)?.[1])).toBeGreaterThanOrEqual(7200);
    expect(text).toContain('writ_restore_duration_seconds_count{partition="0"} 1');
    expect(text).toContain('writ_transaction_duration_seconds_count{partition="0"} 1');
    // Two routers, two registries.
    expect(await new RouterMetrics().text()).not.toContain("tag_ticket");
  });
});

describe("PartitionLedger pending accessors", () => {
  const entry = (key: string, status: LedgerIntentEntry["status"], at: string): LedgerIntentEntry => ({
    kind: "intent",
    intentKey: key,
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
  it("counts committed pending entries and knows the oldest, as transactions commit", () => {
    const ledger = new PartitionLedger(0, [
      ["a", entry("a", "pending", "2026-01-01T00:00:10Z")],
      ["b", entry("b", "done", "2026-01-01T00:00:05Z")],
    ]);
    expect(ledger.pendingCount).toBe(1);
    ledger.stage(entry("c", "pending", "2026-01-01T00:00:01Z"));
    expect(ledger.pendingCount).toBe(1);
    ledger.takeStaged();
    ledger.committedSending();
    expect(ledger.pendingCount).toBe(2);
    expect(ledger.oldestPendingSince()).toBe(Date.parse("2026-01-01T00:00:01Z"));
    ledger.stage(entry("c", "done", "2026-01-01T00:00:20Z"));
    ledger.stage(entry("a", "done", "2026-01-01T00:00:20Z"));
    ledger.takeStaged();
    ledger.committedSending();
    expect(ledger.pendingCount).toBe(0);
    expect(ledger.oldestPendingSince()).toBeNull();
  });

  it("counts committed open escalations and knows when the oldest was escalated, until a decision closes it", () => {
    const escalated = (key: string, at: string, updatedAt = at): LedgerIntentEntry => ({
      ...entry(key, "done", updatedAt),
      outcome: { status: "escalated", reason: "conflict_cycles_exhausted", message: "m", escalationId: `e-${key}`, at },
    });
    const ledger = new PartitionLedger(0, [
      ["a", escalated("a", "2026-01-01T00:00:10Z")],
      ["b", { ...entry("b", "done", "2026-01-01T00:00:05Z"), outcome: { status: "applied", version: '"v2"', via: "patch", at: "2026-01-01T00:00:05Z" } }],
      ["c", entry("c", "conflicted", "2026-01-01T00:00:00Z")],
    ]);
    expect([ledger.openEscalationCount, ledger.oldestOpenEscalationSince()]).toEqual([1, Date.parse("2026-01-01T00:00:10Z")]);
    // A later updatedAt than its escalation (as when an operator's refused decision puts the entry back): it has waited since it was escalated.
    ledger.stage(escalated("c", "2026-01-01T00:00:01Z", "2026-01-01T00:00:30Z"));
    ledger.takeStaged();
    ledger.committedSending();
    expect([ledger.openEscalationCount, ledger.oldestOpenEscalationSince()]).toEqual([2, Date.parse("2026-01-01T00:00:01Z")]);
    // Decided (applied by an operator): closed.
    ledger.stage({ ...entry("c", "done", "2026-01-01T00:00:40Z"), outcome: { status: "applied", version: '"v3"', via: "resolution", at: "2026-01-01T00:00:40Z" } }, { resolution: true });
    ledger.stage(entry("a", "pending", "2026-01-01T00:00:40Z"), { resolution: true });
    ledger.takeStaged();
    ledger.committedSending();
    expect([ledger.openEscalationCount, ledger.oldestOpenEscalationSince()]).toEqual([0, null]);
  });
});
