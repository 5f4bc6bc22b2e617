// deltaRefusal: the change rebuilt from the params on the current record, compared with the one given.
import { describe, expect, it } from "vitest";
import { WritError } from "../../../src/errors.ts";
import { deltaRefusal } from "../../../src/owner/delta-check.ts";
import type { JsonPatchOp, Versioned } from "../../../src/schemas/common.ts";

const current: Versioned = { state: { n: 1 }, version: "v1" };
const wording = { notCanonical: "nc: ", failed: "failed: ", mismatch: "mismatch" };
const add = (n: unknown): JsonPatchOp[] => [{ op: "add", path: "/n", value: n }];

describe("deltaRefusal", () => {
  it("is null when the tool has no delta function", () => {
    expect(deltaRefusal({}, { n: 2 }, current, add(2), wording)).toBeNull();
  });

  it("is null when the rebuilt delta is the same (canonically)", () => {
    const tool = { deriveDelta: (p: Record<string, unknown>) => add(p.n) };
    expect(deltaRefusal(tool, { n: 2 }, current, add(2), wording)).toBeNull();
  });

  it("refuses a different delta with the caller's wording", () => {
    const tool = { deriveDelta: (p: Record<string, unknown>) => add(p.n) };
    expect(deltaRefusal(tool, { n: 2 }, current, add(3), wording)).toEqual({ reason: "delta_mismatch", message: "mismatch" });
  });

  it("refuses a delta function that throws, with its message", () => {
    const tool = {
      deriveDelta: (): JsonPatchOp[] => {
        throw new Error("boom");
      },
    };
    expect(deltaRefusal(tool, {}, current, add(1), wording)).toEqual({ reason: "delta_mismatch", message: "failed: boom" });
    const thrower = {
      deriveDelta: (): JsonPatchOp[] => {
        throw "raw";
      },
    };
    expect(deltaRefusal(thrower, {}, current, add(1), wording)).toEqual({ reason: "delta_mismatch", message: "failed: raw" });
  });

  it("refuses a rebuilt delta with no canonical form as not_canonical", () => {
    const tool = { deriveDelta: () => add("\uD800") };
    const refused = deltaRefusal(tool, {}, current, add(1), wording);
    expect(refused?.reason).toBe("not_canonical");
    expect(refused?.message.startsWith("nc: ")).toBe(true);
  });

  it("caps a long message at 2000 characters", () => {
    const tool = {
      deriveDelta: (): JsonPatchOp[] => {
        throw new WritError("not_canonical", "x".repeat(5000), { retriable: false });
      },
    };
    const refused = deltaRefusal(tool, {}, current, add(1), wording);
    expect(refused?.reason).toBe("not_canonical");
    expect(refused?.message).toHaveLength(2000);
  });
});
