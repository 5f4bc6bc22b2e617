// An operator's resolution writes only within the escalated tool's scope (its allowedPaths and the operations allowed
// there), as an agent's intent: an escalation of a tool scoped to /tags cannot be used to rewrite /owner. Real owner
// and broker; effects counted at the records server, its Idempotency-Key dedupe off (writ's own checks are measured).
import { describe, expect, it } from "vitest";
import type { JsonPatchOp } from "../../src/schemas/common.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { cliEnv, escalatedCase, readVersion, startHarness, tagTicketNoDelta, writ } from "../helpers/writ-harness.ts";

describe("a resolution's delta within the escalated tool's scope", () => {
  it("tag_ticket_no_delta (scoped to /tags): an apply whose delta touches /owner is refused patch_path_not_allowed and one that removes /tags patch_op_not_allowed (client and CLI), no PATCH; an in-scope delta is written once", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    h.records.setConfig({ honourIdempotencyKey: false });
    await h.startRouter();
    const ticket = `T-scope-${h.id}`;
    const { seen, escalation, escalatedReply } = await escalatedCase(h, `agent-scope-${h.id}`, ticket, tagTicketNoDelta);
    const ops = await h.client(`ops-scope-${h.id}`);
    const before = await readVersion(h.records, "ticket", ticket);
    // The escalation's conflicts wrote nothing: every PATCH from here on is the resolutions'.
    expect(h.records.patchRequests()).toHaveLength(0);

    // The change the agent could have made, plus a field the tool may not touch: refused whole, nothing written.
    const wide = await ops.resolve(escalation, {
      decision: "apply",
      baseVersion: before.version,
      delta: [
        { op: "replace", path: "/tags", value: ["needs-human"] },
        { op: "add", path: "/owner", value: "mallory" },
      ],
    });
    expect(wide).toMatchObject({ status: "rejected", reason: "patch_path_not_allowed", details: { paths: ["/owner"] } });
    expect((wide as { message: string }).message).toMatch(/^tool tag_ticket_no_delta may not touch \/owner \(its allowedPaths\): nothing was written, the escalation stays open/);
    expect(h.records.patchRequests()).toHaveLength(0);

    // From the CLI: an operation the tool may not do on its own path.
    const env = cliEnv(h);
    const operator = ["--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"];
    const removed = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta", '[{"op":"remove","path":"/tags"}]', ...operator], env);
    expect(removed.code, removed.stderr).toBe(1);
    expect(JSON.parse(removed.stdout)).toMatchObject({ status: "rejected", reason: "patch_op_not_allowed", details: { ops: ["remove /tags"] } });
    expect(h.records.patchRequests()).toHaveLength(0);
    expect(await readVersion(h.records, "ticket", ticket)).toEqual(before);

    // Still open: the change within the tool's scope is written, once.
    const delta: JsonPatchOp[] = [{ op: "replace", path: "/tags", value: ["needs-human"] }];
    const applied = await ops.resolve(escalation, { decision: "apply", baseVersion: before.version, delta });
    expect(applied).toMatchObject({ status: "applied", resolvedBy: `ops-scope-${h.id}` });
    expect(h.records.patchRequests()).toHaveLength(1);
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
    expect(h.records.history("ticket", ticket).filter((e) => e.kind === "patch").map((e) => e.ops)).toEqual([delta]);
    expect((await readVersion(h.records, "ticket", ticket)).state).toEqual({ ...before.state, tags: ["needs-human"] });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"), { message: "the agent's reply to the resolution" });
  }, 120_000);
});
