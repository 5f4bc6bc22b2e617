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
      /tool "tag_ticket": system: "crm" is not configured/,
    );
    expect(() =>
      admitTools([declareWriteTool({ ...base, intentFields: ["nope" as "tag"] })], [system("helpdesk", true)], { sorTimeoutMs: 1 }),
    ).toThrow(/intent field "nope" is not a param/);
  });
});

describe("admitTools: create tools and undo", () => {
  const creating = (lookup: boolean, upsert = true): SystemOfRecord => ({
    ...system("helpdesk", lookup),
    ...(upsert ? { upsertByExternalId: async () => ({ kind: "unknown" as const, message: "unused" }) } : {}),
  });
  const openCase = {
    name: "open_case",
    recordType: "case",
    params: z.object({ orderRef: z.string() }),
    intentFields: ["orderRef" as const],
    create: { externalId: (p: { orderRef: string }) => p.orderRef, body: () => ({ status: "open" }) },
    keyScope: "run" as const,
    system: "helpdesk",
  };

  it("admits a create tool without paths or a version policy, and keeps an edit tool's undo", () => {
    const tools = admitTools(
      [declareWriteTool(openCase), declareWriteTool({ ...base, undo: () => [{ op: "remove", path: "/tags/0" }] })],
      [creating(true)],
      { sorTimeoutMs: 5000, requireDelta: false },
    );
    expect(tools.get("open_case")).toMatchObject({ versionPolicy: "strict", create: openCase.create });
    expect(tools.get("open_case")!.isAllowedPath("/status")).toBe(false);
    expect(typeof tools.get("tag_ticket")!.undo).toBe("function");
    // With an agent registry every edit tool needs a delta function; a create's body is its binding.
    expect(() => admitTools([declareWriteTool(openCase)], [creating(true)], { sorTimeoutMs: 5000, requireDelta: true })).not.toThrow();
  });

  it("refuses a create tool with a delta, paths or a version policy, on a system that cannot create, or with no way to reconcile", () => {
    const mixed = { ...openCase, delta: () => [], allowedPaths: ["/status"], versionPolicy: "strict" } as never;
    expect(() => admitTools([mixed], [creating(true)], { sorTimeoutMs: 1 })).toThrow(/delta: a create tool's change is its create\.body.*allowedPaths: a create tool.*versionPolicy: a create tool/);
    expect(() => admitTools([declareWriteTool(openCase)], [creating(true, false)], { sorTimeoutMs: 1 })).toThrow(/create needs system "helpdesk" to create by external id \(upsertByExternalId\)/);
    expect(() => admitTools([declareWriteTool(openCase)], [creating(false)], { sorTimeoutMs: 1 })).toThrow(/missing reconcile.*create\.intentKeyField/);
    const marked = declareWriteTool({ ...openCase, create: { ...openCase.create, intentKeyField: "writKey" } });
    expect(admitTools([marked], [creating(false)], { sorTimeoutMs: 1 }).has("open_case")).toBe(true);
  });

  it("the intentKeyField reconcile: ours only when the record carries our key", async () => {
    const marked = declareWriteTool({ ...openCase, create: { ...openCase.create, intentKeyField: "writKey" } });
    const t = admitTools([marked], [creating(false)], { sorTimeoutMs: 1 }).get("open_case")!;
    const ask = (state: unknown) =>
      t.reconcile({ intent: { intentKey: "k1" } as never, current: state === null ? null : { state, version: '"1"' }, system: t.system, timeoutMs: 1, headers: {} });
    expect(await ask(null)).toBe("not_applied");
    expect(await ask({ writKey: "k1" })).toBe("applied");
    expect(await ask({ writKey: "k2" })).toBe("not_applied");
    expect(await ask({})).toBe("not_applied");
  });

  it("undoPaths: the undo's scope (else allowedPaths, or none for a create); refused without an undo", () => {
    const undo = () => [{ op: "add" as const, path: "/reversals/-", value: 1 }];
    const tools = admitTools(
      [
        declareWriteTool({ ...base, name: "plain", undo }),
        declareWriteTool({ ...base, name: "scoped", undo, undoPaths: [{ path: "/reversals/-", ops: ["add"] }] }),
        declareWriteTool(openCase),
      ],
      [creating(true)],
      { sorTimeoutMs: 5000, requireDelta: false },
    );
    const scope = (name: string) => tools.get(name)!.undoScope;
    expect(scope("plain")!.isAllowedPath("/tags/-")).toBe(true);
    expect(scope("plain")!.isAllowedPath("/reversals/-")).toBe(false);
    expect(scope("scoped")!.isAllowedPath("/tags/-")).toBe(false);
    expect(scope("scoped")!.isAllowedOp({ op: "add", path: "/reversals/-", value: 1 })).toBe(true);
    // The tool's own scope is unchanged by its undo's.
    expect(tools.get("scoped")!.isAllowedPath("/reversals/-")).toBe(false);
    expect(scope("open_case")).toBeNull();
    expect(() => admitTools([declareWriteTool({ ...base, undoPaths: ["/reversals/-"] })], [creating(true)], { sorTimeoutMs: 1 })).toThrow(
      /tool "tag_ticket": undoPaths: declared without an undo function/,
    );
  });

  it("refuses an edit tool without allowed paths", () => {
    const { allowedPaths: _, ...noPaths } = base;
    expect(() => admitTools([{ ...noPaths, reconcile: "idempotency-key" } as never], [system("helpdesk", true)], { sorTimeoutMs: 1 })).toThrow(
      /tool "tag_ticket": allowedPaths: at least one allowed path/,
    );
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
