import { describe, expect, it } from "vitest";
import { deltaFingerprint, intentKey, paramsFingerprint } from "../../src/keys.ts";

const tool = { name: "refund_payment", keyScope: "run" as const, intentFields: ["amountCents", "reason"] };
const entity = { type: "payment", id: "pay_1" };

describe("intentKey", () => {
  it("is the same for the same business intent, whatever free text or key order", () => {
    const a = intentKey({ agentId: "a1", tool, runId: "r1", stepId: "s1", entity, params: { amountCents: 500, reason: "late", note: "sorry!" } });
    const b = intentKey({ agentId: "a1", tool, runId: "r1", stepId: "s1", entity, params: { note: "Apologies for the delay", reason: "late", amountCents: 500 } });
    expect(a).toBe(b);
    expect(a).toMatch(/^[0-9a-f]{64}$/);
  });

  it("differs by run under scope run, not under scope global", () => {
    const params = { amountCents: 500, reason: "late" };
    expect(intentKey({ agentId: "a1", tool, runId: "r1", stepId: "s1", entity, params })).not.toBe(intentKey({ agentId: "a1", tool, runId: "r2", stepId: "s1", entity, params }));
    // Under run scope the agent is part of the key: another agent can never present (or squat) it.
    expect(intentKey({ agentId: "a1", tool, runId: "r1", stepId: "s1", entity, params })).not.toBe(intentKey({ agentId: "a2", tool, runId: "r1", stepId: "s1", entity, params }));
    const global = { ...tool, keyScope: "global" as const };
    expect(intentKey({ agentId: "a1", tool: global, runId: "r1", stepId: "s1", entity, params })).toBe(
      intentKey({ agentId: "a2", tool: global, runId: "r2", stepId: "s1", entity, params }),
    );
  });

  it("differs by step, target and intent fields", () => {
    const base = { agentId: "a1", tool, runId: "r1", stepId: "s1", entity, params: { amountCents: 500, reason: "late" } };
    const k = intentKey(base);
    expect(intentKey({ ...base, stepId: "s2" })).not.toBe(k);
    expect(intentKey({ ...base, entity: { type: "payment", id: "pay_2" } })).not.toBe(k);
    expect(intentKey({ ...base, params: { amountCents: 501, reason: "late" } })).not.toBe(k);
  });

  it("refuses to build a key without a declared intent field", () => {
    expect(() => intentKey({ agentId: "a1", tool, runId: "r", stepId: "s", entity, params: { amountCents: 1 } })).toThrow(/reason/);
  });
});

describe("fingerprints", () => {
  it("ignore free-text params and free-text patch values", () => {
    expect(paramsFingerprint("t", entity, { a: 1, note: "x" }, ["note"])).toBe(paramsFingerprint("t", entity, { a: 1, note: "y" }, ["note"]));
    expect(paramsFingerprint("t", entity, { a: 1 }, [])).not.toBe(paramsFingerprint("t", entity, { a: 2 }, []));
    const isFree = (p: string) => p === "/comment";
    expect(deltaFingerprint([{ op: "replace", path: "/comment", value: "hi" }], isFree)).toBe(
      deltaFingerprint([{ op: "replace", path: "/comment", value: "hello" }], isFree),
    );
    expect(deltaFingerprint([{ op: "replace", path: "/status", value: "a" }], isFree)).not.toBe(
      deltaFingerprint([{ op: "replace", path: "/status", value: "b" }], isFree),
    );
  });

  it("keep a top-level param named __proto__ (as JSON.parse gives it: an own key) in the params fingerprint", () => {
    const one = JSON.parse('{"a":1,"__proto__":{"x":1}}') as Record<string, unknown>;
    const two = JSON.parse('{"a":1,"__proto__":{"x":2}}') as Record<string, unknown>;
    expect(paramsFingerprint("t", entity, one, [])).not.toBe(paramsFingerprint("t", entity, two, []));
    expect(paramsFingerprint("t", entity, one, [])).not.toBe(paramsFingerprint("t", entity, { a: 1 }, []));
  });
});

describe("intentKey, as a property", () => {
  it("ignores key order and params outside the declared intent fields", async () => {
    const fc = (await import("fast-check")).default;
    const json = fc.oneof(fc.string(), fc.integer(), fc.boolean(), fc.constant(null));
    fc.assert(
      fc.property(fc.dictionary(fc.string({ minLength: 1 }).filter((k) => k !== "__proto__"), json), json, json, (extra, amount, reason) => {
        const params = { ...extra, amountCents: amount, reason };
        const reordered = Object.fromEntries(Object.entries(params).reverse());
        const k1 = intentKey({ agentId: "a1", tool, runId: "r", stepId: "s", entity, params });
        const k2 = intentKey({ agentId: "a1", tool, runId: "r", stepId: "s", entity, params: reordered });
        const k3 = intentKey({ agentId: "a1", tool, runId: "r", stepId: "s", entity, params: { amountCents: amount, reason } });
        return k1 === k2 && k2 === k3;
      }),
    );
  });
});
