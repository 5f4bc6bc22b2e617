import { describe, expect, it } from "vitest";
import { z } from "zod";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { admitTools, declareWriteTool, isCommutative } from "../../src/tools.ts";

const system = (name: string, lookup: boolean): SystemOfRecord => ({
  name,
  capabilities: { idempotencyKeys: lookup, idempotencyLookup: lookup },
  read: async () => null,
  patch: async () => ({ kind: "unknown", message: "unused" }),
  ...(lookup ? { lookupIdempotencyKey: async () => "not_applied" as const } : {}),
});

const base = {
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag" as const],
  allowedPaths: ["/tags/-"],
  keyScope: "run" as const,
  versionPolicy: "strict" as const,
  system: "helpdesk",
};

describe("admitTools", () => {
  it("admits a complete declaration with defaults resolved", () => {
    const tools = admitTools([declareWriteTool({ ...base, reconcile: "idempotency-key" })], [system("helpdesk", true)], { sorTimeoutMs: 5000 });
    const t = tools.get("tag_ticket")!;
    expect(t.maxConflictCycles).toBe(2);
    expect(t.isAllowedPath("/tags/-")).toBe(true);
    expect(t.isAllowedPath("/owner")).toBe(false);
  });

  it("refuses a tool without a key scope, naming the tool and the field", () => {
    const { keyScope: _, ...noScope } = base;
    expect(() => admitTools([noScope as never], [system("helpdesk", true)], { sorTimeoutMs: 5000 })).toThrow(
      /tool "tag_ticket": keyScope: missing key scope/,
    );
  });

  it("refuses a tool without a version policy", () => {
    const { versionPolicy: _, ...noPolicy } = base;
    expect(() => admitTools([noPolicy as never], [system("helpdesk", true)], { sorTimeoutMs: 5000 })).toThrow(
      /tool "tag_ticket": versionPolicy: missing version policy/,
    );
  });

  it("refuses a tool with no reconcile path where the system keeps no idempotency keys", () => {
    expect(() => admitTools([declareWriteTool(base)], [system("helpdesk", false)], { sorTimeoutMs: 5000 })).toThrow(
      /tool "tag_ticket": missing reconcile: system "helpdesk" keeps no idempotency keys/,
    );
    const withFn = declareWriteTool({ ...base, reconcile: () => "not_applied" as const });
    expect(admitTools([withFn], [system("helpdesk", false)], { sorTimeoutMs: 5000 }).has("tag_ticket")).toBe(true);
  });

  it("refuses an unknown system and an intent field that is not a param", () => {
    expect(() => admitTools([declareWriteTool({ ...base, system: "crm" })], [system("helpdesk", true)], { sorTimeoutMs: 1 })).toThrow(
      /system "crm" is not configured/,
    );
    expect(() =>
      admitTools([declareWriteTool({ ...base, intentFields: ["nope" as "tag"] })], [system("helpdesk", true)], { sorTimeoutMs: 1 }),
    ).toThrow(/intent field "nope" is not a param/);
  });
});

describe("path patterns and commutativity", () => {
  it("match one segment with * and any depth with /**", () => {
    const [t] = admitTools(
      [declareWriteTool({ ...base, allowedPaths: ["/fields/*", "/meta/**"], reconcile: "idempotency-key" })],
      [system("helpdesk", true)],
      { sorTimeoutMs: 1 },
    ).values();
    expect(t!.isAllowedPath("/fields/a")).toBe(true);
    expect(t!.isAllowedPath("/fields/a/b")).toBe(false);
    expect(t!.isAllowedPath("/meta/a/b/c")).toBe(true);
  });

  it("only appends commute", () => {
    expect(isCommutative([{ op: "add", path: "/tags/-", value: "x" }])).toBe(true);
    expect(isCommutative([{ op: "replace", path: "/tags", value: [] }])).toBe(false);
  });
});
