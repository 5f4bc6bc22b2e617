// A registry that refuses a schema only clients register (docs/operations.md §6.7): owners never register
// `<intents topic>-Resolution` (nor `<intents topic>-value`), so a level there that refuses writ's schema (FORWARD or
// FULL at an upgrade, an older client on a subject a newer one made) has no `schema:` problem on /healthz. The
// client writes the resolution as plain JSON, which owners read, and says so once. Real owner, broker and registry;
// the write counted at the records server, its Idempotency-Key dedupe off.
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { resolutionSubject } from "../../src/schemas/resolution.ts";
import { ccompat, refusingSubject } from "../helpers/registry-subjects.ts";
import { escalatedCase, readVersion, startHarness, tagTicketNoDelta } from "../helpers/writ-harness.ts";

describe("a client whose subject refuses writ's schema", () => {
  it("resolves an escalation through a Resolution subject at FULL that holds another schema: applied once, one warning, nothing registered", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 1 });
    h.records.setConfig({ honourIdempotencyKey: false });
    const subject = resolutionSubject(h.config.topics.intents);
    await refusingSubject(subject);
    await h.startRouter();
    const ticket = `T-refused-${h.id}`;
    const { escalation, escalatedReply } = await escalatedCase(h, `agent-refused-${h.id}`, ticket, tagTicketNoDelta);
    const lines: { level: number; msg: string; subject?: string; reason?: string }[] = [];
    const logger = pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line)) });
    const ops = await h.client(`ops-refused-${h.id}`, { logger });
    const before = await readVersion(h.records, "ticket", ticket);
    const delta = [{ op: "replace" as const, path: "/tags", value: ["needs-human"] }];
    const applied = await ops.resolve(escalation, { decision: "apply", baseVersion: before.version, delta }, { timeoutMs: 30_000 });
    expect(applied).toMatchObject({ status: "applied", resolvedBy: `ops-refused-${h.id}` });
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
    // Said once (warn), with the registry's answer, however many resolutions follow.
    const again = await ops.resolve(escalation, { decision: "discard" }, { timeoutMs: 30_000 });
    expect(again).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    const warned = lines.filter((l) => l.level === 40 && l.subject === subject);
    expect(warned).toHaveLength(1);
    expect(warned[0]!.msg).toMatch(/written as plain JSON/);
    expect(warned[0]!.reason).toMatch(/409/);
    // The subject still holds only the schema it refused writ's for.
    expect(await (await ccompat(`/subjects/${subject}/versions`)).json()).toEqual([1]);
  }, 120_000);
});
