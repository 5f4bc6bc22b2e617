import { describe, expect, it } from "vitest";
import { checkDelta, deltaBounds, deltaRoom, MAX_DELTA_BYTES } from "../../src/console/delta.ts";

describe("the console's check of a delta given with Apply", () => {
  const bounds = deltaBounds();

  it("is bounded as owners admit a resolution's delta: the console's 64 KiB or their maxIntentBytes, their maxJsonDepth less one (as in an intent)", () => {
    expect(bounds).toEqual({ maxBytes: MAX_DELTA_BYTES, maxDepth: 31 });
    expect(deltaBounds({ maxIntentBytes: 16_384, maxJsonDepth: 10 })).toEqual({ maxBytes: 16_384, maxDepth: 9 });
  });

  it("takes a JSON Patch for apply, parsed by the clients' schema", () => {
    const delta = [{ op: "replace", path: "/tags", value: ["vip"] }, { op: "move", from: "/a", path: "/b" }];
    expect(checkDelta(delta, "apply", bounds)).toEqual({ ok: true, delta });
  });

  it("refuses, with its reason, a delta for another decision, one too large or too deep, and one that is not a JSON Patch", () => {
    expect(checkDelta([{ op: "remove", path: "/tags" }], "discard", bounds)).toMatchObject({ ok: false, reason: "delta_not_for_apply" });
    const large = [{ op: "replace", path: "/tags", value: ["x".repeat(100)] }];
    expect(checkDelta(large, "apply", { maxBytes: 100, maxDepth: 31 })).toMatchObject({ ok: false, reason: "delta_too_large", error: expect.stringMatching(/^the delta is \d+ bytes as JSON; at most 100/) });
    let deep: unknown = 1;
    for (let i = 0; i < 30; i++) deep = { a: deep };
    // the array, the operation and 30 levels of value: one past 31
    expect(checkDelta([{ op: "add", path: "/x", value: deep }], "apply", bounds)).toMatchObject({ ok: false, reason: "delta_too_deep" });
    expect(checkDelta([{ op: "add", path: "/x", value: (deep as { a: unknown }).a }], "apply", bounds)).toMatchObject({ ok: true });
    for (const bad of [{ op: "replace", path: "/tags", value: [] }, [], [{ op: "frobnicate", path: "/tags" }], [{ op: "replace", path: "tags", value: 1 }], [{ op: "replace", path: "/tags" }], [{ op: "remove", path: "/tags", value: 1 }], "[]"]) {
      expect(checkDelta(bad, "apply", bounds)).toMatchObject({ ok: false, reason: "delta_invalid", error: expect.stringMatching(/^the delta is not a JSON Patch \(RFC 6902\), an array of operations such as /) });
    }
    expect(checkDelta([{ op: "frobnicate", path: "/tags" }], "apply", bounds)).toMatchObject({ error: expect.stringMatching(/ at \[0\]\.op$/) });
  });

  it("refuses a delta nested as deep as the endpoint's body bound allows as too deep, without overflowing the stack measuring it", () => {
    // 40,000 levels fit in the endpoint's 80 KiB; JSON.stringify of them throws RangeError.
    const deep: unknown = JSON.parse("[".repeat(40_000) + "]".repeat(40_000));
    expect(checkDelta(deep, "apply", bounds)).toMatchObject({ ok: false, reason: "delta_too_deep" });
  });

  it("leaves a delta what owners admit of a resolution less the escalated intent and the allowance of its other fields (the message among them)", () => {
    const intent = { tool: "tag_ticket", params: { note: "x".repeat(1_000) } };
    const intentBytes = Buffer.byteLength(JSON.stringify(intent));
    expect(deltaRoom({ maxIntentBytes: 10_000 }, intent)).toBe(2 * 10_000 - intentBytes);
    expect(deltaRoom({}, intent)).toBe(2 * 262_144 - intentBytes);
    expect(deltaRoom({ maxIntentBytes: 1_024 }, { params: { note: "x".repeat(3_000) } })).toBeLessThan(0);
  });
});
