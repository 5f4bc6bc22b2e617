// Regression: an operator's apply rebuilt the escalated change from the intent's params as they came on the wire, never
// run through the tool's params schema, while the agent's own write is built from the params the schema gives
// (defaults applied, transforms run; admission.ts). A tool whose schema fills a default had its delta function throw
// on the raw params: the throw left the resolver, was retried as a processing failure and could never be applied; a
// transform gave a different change than the agent's intent would, written with writ's authority. Now the apply parses
// the params with the schema deployed (parsedParams, admission's own), refuses `params_invalid` when it no longer
// takes them, and a delta function that throws is an answer to the operator: the escalation stays open. Counted at
// the fake system.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import type { Step } from "../../../src/owner/intent-pipeline.ts";
import type { Reply } from "../../../src/schemas/reply.ts";
import { declareWriteTool, type WriteToolDeclaration } from "../../../src/tools.ts";
import { escalatedApply, OPS_REPLIES, T1 } from "./escalated-case.ts";

const base = {
  recordType: "ticket",
  intentFields: ["tag"] as ["tag"],
  keyScope: "run" as const,
  versionPolicy: "strict" as const,
  system: "helpdesk",
  reconcile: "idempotency-key" as const,
  allowedPaths: ["/tags"],
};
/** The escalated intent's params are {tag: "vip"}: the schema adds `also` (an empty list) and upper-cases the tag. */
const withDefaults = declareWriteTool({
  ...base,
  name: "tag_defaults",
  params: z.object({ tag: z.string().transform((t) => t.toUpperCase()), also: z.array(z.string()).default([]) }),
  delta: (p, c) => [{ op: "replace", path: "/tags", value: [...((c.state as { tags: string[] }).tags ?? []), p.tag, ...p.also] }],
});
/** A schema deployed since the escalation that no longer takes its params. */
const narrowed = declareWriteTool({ ...base, name: "tag_narrowed", params: z.object({ tag: z.enum(["urgent"]) }), delta: (p) => [{ op: "replace", path: "/tags", value: [p.tag] }] });
/** A delta function that throws on the record as it is now. */
const throwing = declareWriteTool({
  ...base,
  name: "tag_throwing",
  params: z.object({ tag: z.string() }),
  delta: () => {
    throw new Error("no tags field on this record");
  },
});

const setup = (decl: WriteToolDeclaration<any>) =>
  escalatedApply(decl, { status: "done", state: { tags: ["old"] }, delta: [{ op: "replace", path: "/tags", value: ["old", "VIP"] }] });

function settled(step: Step): { reply: Reply & { reason?: string; message?: string; details?: Record<string, unknown> }; ledger: unknown } {
  if (step.kind !== "settled") throw new Error(`not settled: ${step.kind}`);
  return { reply: step.effects.replies.find((r) => r.topic === OPS_REPLIES)!.value as never, ledger: step.effects.ledger };
}

describe("an operator's apply builds the change from the params the tool's schema gives, as an agent's write is", () => {
  it("a schema's default and transform: the change rebuilt from them is written once (before, the delta function threw on the raw params)", async () => {
    const { sor, apply } = setup(withDefaults);
    const { reply } = settled(await apply());
    expect(reply).toMatchObject({ status: "applied" });
    expect(sor.patches.map((p) => p.ops)).toEqual([[{ op: "replace", path: "/tags", value: ["old", "VIP"] }]]);
    expect(sor.current(T1)!.state).toEqual({ tags: ["old", "VIP"] });
  });

  it("the operator's delta is compared with the one those params give: the right one is written, the raw params' one refused", async () => {
    const { sor, apply } = setup(withDefaults);
    expect(settled(await apply([{ op: "replace", path: "/tags", value: ["old", "vip"] }])).reply).toMatchObject({ status: "rejected", reason: "delta_mismatch" });
    expect(sor.patches).toHaveLength(0);
    expect(settled(await apply([{ op: "replace", path: "/tags", value: ["old", "VIP"] }])).reply).toMatchObject({ status: "applied" });
    expect(sor.patches).toHaveLength(1);
  });

  it("params the schema deployed now refuses: params_invalid with its issues, the escalation left open, nothing written", async () => {
    const { sor, entry, apply } = setup(narrowed);
    const { reply, ledger } = settled(await apply());
    expect(reply).toMatchObject({ status: "rejected", reason: "params_invalid", details: { issues: [expect.objectContaining({ path: ["tag"] })], current: { state: { tags: ["old"] } } } });
    expect(reply.message).toMatch(/^params do not fit tool tag_narrowed: tag: .*: nothing was written, the escalation stays open; discard it, or return it to its agent$/);
    expect(ledger).toMatchObject({ status: "done", outcome: entry.outcome });
    expect(sor.patches).toHaveLength(0);
  });

  it("a delta function that throws on the record now is answered (delta_mismatch, the escalation open), not thrown out of the resolver", async () => {
    const { sor, entry, apply } = setup(throwing);
    const { reply, ledger } = settled(await apply());
    expect(reply).toMatchObject({ status: "rejected", reason: "delta_mismatch", message: "the tool's delta function failed on the intent's params and the current record: no tags field on this record" });
    expect(ledger).toMatchObject({ status: "done", outcome: entry.outcome });
    expect(sor.patches).toHaveLength(0);
  });
});
