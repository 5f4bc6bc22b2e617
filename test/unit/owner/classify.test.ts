import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { classifyAttempt } from "../../../src/owner/classify.ts";
import type { LedgerIntentEntry } from "../../../src/schemas/ledger-entry.ts";

const attempt = fc.record({ baseVersion: fc.constantFrom('"v1"', '"v2"', '"v3"', '"v4"'), deltaFingerprint: fc.constantFrom("d1", "d2", "d3") });
const entry = (status: LedgerIntentEntry["status"], attempts: { baseVersion: string; deltaFingerprint: string }[]): LedgerIntentEntry => ({
  kind: "intent",
  intentKey: "k".repeat(64),
  intentId: "i",
  status,
  entity: { type: "ticket", id: "T-1" },
  tool: "tag_ticket",
  fingerprint: "F",
  attempts,
  cycles: 0,
  replyTo: "writ.replies.a",
  updatedAt: new Date(0).toISOString(),
});

describe("classifyAttempt (the ledger's step 2)", () => {
  it("writes an intent the ledger does not hold", () => {
    fc.assert(fc.property(attempt, (a) => classifyAttempt(undefined, { fingerprint: "F", ...a }) === "write"));
  });

  it("rejects a key that comes with other params, whatever its state", () => {
    fc.assert(
      fc.property(fc.constantFrom("pending", "conflicted", "done"), fc.array(attempt, { minLength: 1 }), attempt, (status, attempts, a) =>
        classifyAttempt(entry(status as LedgerIntentEntry["status"], attempts), { fingerprint: "OTHER", ...a }) === "reused",
      ),
    );
  });

  it("answers any attempt seen before from the ledger once conflicted or done (a late retry starts no new cycle)", () => {
    fc.assert(
      fc.property(fc.constantFrom("conflicted", "done"), fc.array(attempt, { minLength: 1 }), fc.nat(), (status, attempts, i) => {
        const seen = attempts[i % attempts.length]!;
        return classifyAttempt(entry(status as LedgerIntentEntry["status"], attempts), { fingerprint: "F", ...seen }) === "repeat";
      }),
    );
  });

  it("takes up an intent an earlier owner left pending", () => {
    fc.assert(fc.property(fc.array(attempt, { minLength: 1 }), attempt, (attempts, a) => classifyAttempt(entry("pending", attempts), { fingerprint: "F", ...a }) === "write"));
  });

  it("after a conflict, a new base or delta is the agent deciding again", () => {
    expect(classifyAttempt(entry("conflicted", [{ baseVersion: '"v1"', deltaFingerprint: "d1" }]), { fingerprint: "F", baseVersion: '"v2"', deltaFingerprint: "d2" })).toBe("write");
  });

  it("once done, a retry from a fresh read is a repeat, another change from a base already used is key reuse", () => {
    const done = entry("done", [{ baseVersion: '"v1"', deltaFingerprint: "d1" }]);
    expect(classifyAttempt(done, { fingerprint: "F", baseVersion: '"v2"', deltaFingerprint: "d9" })).toBe("repeat");
    expect(classifyAttempt(done, { fingerprint: "F", baseVersion: '"v1"', deltaFingerprint: "d9" })).toBe("reused");
  });
});
