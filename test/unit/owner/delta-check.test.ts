// deltaRefusal: the change rebuilt from the params on the current record, compared with the one given.
// scopeRefusal: a delta against its tool's allowedPaths and the operations allowed there (intents and resolutions).
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { WritError } from "../../../src/errors.ts";
import { deltaRefusal, scopeRefusal } from "../../../src/owner/delta-check.ts";
import type { JsonPatchOp, Versioned } from "../../../src/schemas/common.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";

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

describe("scopeRefusal", () => {
  const tool = admitTools(
    [
      declareWriteTool({
        name: "tag_ticket",
        recordType: "ticket",
        params: z.object({ tag: z.string() }),
        intentFields: ["tag"],
        allowedPaths: ["/tags/-", { path: "/tags/*", ops: ["remove"] }, "/notes/**"],
        freeTextPaths: ["/notes/**", "/owner"],
        keyScope: "run",
        versionPolicy: "strict",
        system: "helpdesk",
        reconcile: "idempotency-key",
      }),
    ],
    [new FakeSystem("helpdesk")],
    { sorTimeoutMs: 1_000 },
  ).get("tag_ticket")!;

  it("is null for a delta within the tool's paths and operations", () => {
    expect(scopeRefusal(tool, [{ op: "add", path: "/tags/-", value: "vip" }, { op: "remove", path: "/tags/0" }, { op: "replace", path: "/notes/a/b", value: "x" }])).toBeNull();
  });

  it("refuses a path outside the allowed ones, naming each (a move's or copy's from too), before any operation", () => {
    expect(
      scopeRefusal(tool, [
        { op: "add", path: "/tags/-", value: "ok" },
        { op: "replace", path: "/owner", value: "mallory" },
        { op: "remove", path: "/tags" },
        { op: "copy", from: "/refund_amount", path: "/tags/-" },
      ]),
    ).toEqual({ reason: "patch_path_not_allowed", message: "tool tag_ticket may not touch /owner, /tags, /refund_amount", details: { paths: ["/owner", "/tags", "/refund_amount"] } });
  });

  it("a free-text path is no permission: only allowedPaths are", () => {
    expect(scopeRefusal(tool, [{ op: "replace", path: "/owner", value: "x" }])).toMatchObject({ reason: "patch_path_not_allowed", details: { paths: ["/owner"] } });
  });

  it("refuses an operation not allowed where it acts (a bare pattern allows add, replace and test)", () => {
    const ops: JsonPatchOp[] = [
      { op: "remove", path: "/tags/0" },
      { op: "add", path: "/tags/0", value: "x" },
      { op: "move", from: "/tags/1", path: "/tags/-" },
      { op: "copy", from: "/tags/0", path: "/notes/x" },
    ];
    expect(scopeRefusal(tool, ops)).toEqual({
      reason: "patch_op_not_allowed",
      message: "tool tag_ticket may not add /tags/0, move /tags/-, copy /notes/x",
      details: { ops: ["add /tags/0", "move /tags/-", "copy /notes/x"] },
    });
  });

  it("names at most ten paths or operations", () => {
    const many = Array.from({ length: 30 }, (_, i): JsonPatchOp => ({ op: "replace", path: `/f${i}`, value: i }));
    const refused = scopeRefusal(tool, many);
    expect(refused?.reason).toBe("patch_path_not_allowed");
    expect(refused?.details).toEqual({ paths: many.slice(0, 10).map((op) => op.path) });
    const ops = scopeRefusal(tool, Array.from({ length: 30 }, (): JsonPatchOp => ({ op: "add", path: "/tags/0", value: 1 })));
    expect(ops?.details).toEqual({ ops: Array.from({ length: 10 }, () => "add /tags/0") });
  });
});
