import { randomUUID } from "node:crypto";
import { mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { entityKey } from "../../src/schemas/common.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import { declareWriteTool } from "../../src/tools.ts";
import { brokers, cliEnv, escalatedCase, readVersion, refundIntent, startHarness, tagTicketNoDelta, writ } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

/** Tags a ticket with a note beside it (free text: a retry may reword it). */
const noteTicket = declareWriteTool({
  name: "note_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string().min(1).max(64), note: z.string().max(500) }),
  intentFields: ["tag"],
  freeTextParams: ["note"],
  freeTextPaths: ["/note"],
  allowedPaths: ["/tags", "/note"],
  delta: (p, current) => {
    const tags = ((current.state as { tags?: unknown } | null)?.tags ?? []) as unknown[];
    return [
      { op: "replace", path: "/tags", value: tags.includes(p.tag) ? tags : [...tags, p.tag] },
      // add: sets the member whether or not the ticket has one yet.
      { op: "add", path: "/note", value: p.note },
    ];
  },
  keyScope: "run",
  versionPolicy: "strict",
  maxConflictCycles: 2,
  system: "helpdesk",
  reconcile: "idempotency-key",
});

/** Writes each of `forged` to writ.human as any producer can, keyed as owners key escalations (one record per request). */
async function forge(h: Awaited<ReturnType<typeof startHarness>>, ...forged: Escalation[]): Promise<void> {
  const forger = new Kafka({ brokers: brokers(), clientId: `forger-${h.id}`, logLevel: logLevel.NOTHING }).producer();
  await forger.connect();
  try {
    for (const f of forged) await forger.send({ topic: h.config.topics.human, messages: [{ key: entityKey(f.intent.entity), value: JSON.stringify(f) }] });
  } finally {
    await forger.disconnect();
  }
}

describe("resolving escalations", () => {
  it("apply: the owner writes the escalated intent on the record as the operator saw it; the agent gets applied, a repeat is a duplicate", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const { agent, seen, escalation, escalatedReply } = await escalatedCase(h, "agent-a", "T-70");
    const ops = await h.client("ops-1");
    const now = await readVersion(h.records, "ticket", "T-70");

    // A base the operator did not see now: a conflict back to the operator, nothing written.
    const stale = await ops.resolve(escalation, { decision: "apply", baseVersion: '"v1"' });
    expect(stale).toMatchObject({ status: "rejected", reason: "resolution_conflict" });
    expect(h.records.history("ticket", "T-70").filter((e) => e.kind === "patch")).toHaveLength(0);

    const done = await ops.resolve(escalation, { decision: "apply", baseVersion: now.version });
    expect(done).toMatchObject({ status: "applied", resolvedBy: "ops-1" });
    expect((await readVersion(h.records, "ticket", "T-70")).state.tags).toEqual(["needs-human"]);
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
    // The agent hears it on its own reply topic, under the escalated intent's id.
    const toAgent = await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"));
    expect(toAgent).toMatchObject({ resolvedBy: "ops-1" });
    // The ledger holds the decision: the agent asking again is answered from it, nothing written.
    const again = await agent.submit({
      tool: tagTicket,
      entity: { type: "ticket", id: "T-70" },
      runId: escalation.intent.agent.runId,
      stepId: "tag-1",
      baseVersion: escalation.intent.baseVersion,
      delta: escalation.intent.delta,
      params: { tag: "needs-human" },
    });
    expect(again).toMatchObject({ status: "applied", duplicate: true });
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(1);
  });

  it("discard: nothing is written, the agent is told, and the escalation is closed for good", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-b", "T-71");
    const ops = await h.client("ops-2");
    const discarded = await ops.resolve(escalation, { decision: "discard", message: "customer withdrew the request" });
    expect(discarded).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "customer withdrew the request" });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "rejected"));
    const twice = await ops.resolve(escalation, { decision: "apply" });
    expect(twice).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    expect(h.records.history("ticket", "T-71").filter((e) => e.kind === "patch")).toHaveLength(0);
  });

  it("writ escalations resolve --apply on a tool without a delta function: refused resolution_delta_required without --delta; with --delta, written once", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-c", "T-72", tagTicketNoDelta);
    const env = cliEnv(h);
    const operator = ["--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"];
    const patches = () => h.records.patchRequests(escalatedReply.intentKey);

    // Without a change to write: refused, saying how to give one; nothing written, still open.
    const bare = await writ(["escalations", "resolve", escalation.escalationId, "--apply", ...operator], env);
    expect(bare.code, bare.stderr).toBe(1);
    const refused = JSON.parse(bare.stdout);
    expect(refused).toMatchObject({ status: "rejected", reason: "resolution_delta_required" });
    expect(refused.message).toContain("--delta");
    expect(patches()).toHaveLength(0);

    // A --delta / --delta-file that is not a JSON Patch array: a usage error naming the option, nothing sent.
    const notArray = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta", '{"op":"replace","path":"/tags","value":[]}', ...operator], env);
    expect([notArray.code, notArray.stderr]).toEqual([2, expect.stringContaining("--delta is not a JSON Patch (RFC 6902), an array of operations")]);
    const file = join(mkdtempSync(join(tmpdir(), "writ-delta-")), "delta.json");
    writeFileSync(file, JSON.stringify([{ op: "frobnicate", path: "/tags" }]));
    const badOp = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta-file", file, ...operator], env);
    expect([badOp.code, badOp.stderr]).toEqual([2, expect.stringContaining(`--delta-file ${file} is not a JSON Patch`)]);
    const notApply = await writ(["escalations", "resolve", escalation.escalationId, "--discard", "--delta", "[]", ...operator], env);
    expect([notApply.code, notApply.stderr]).toEqual([2, expect.stringContaining("--delta goes with --apply")]);
    expect(patches()).toHaveLength(0);

    // With the change: applied once, on the record as it is now; the agent is told.
    const delta = [{ op: "replace", path: "/tags", value: ["needs-human"] }];
    const applied = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--delta", JSON.stringify(delta), ...operator], env);
    expect(applied.code, applied.stdout + applied.stderr).toBe(0);
    expect(JSON.parse(applied.stdout)).toMatchObject({ status: "applied", resolvedBy: `ops-cli-${h.id}` });
    expect(patches()).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-72")).state.tags).toEqual(["needs-human"]);
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"));
  });

  it("escalation-past-retention: an open escalation is kept past the ledger's retention, and a decision on it is still carried out and answered", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // 3.6 s of retention, so the sweep runs within the test (below the config's least hour: a test-only override).
    await h.startRouter({}, { ledgerRetentionHours: 0.001 });
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-d", "T-73");
    // A write settled after the escalation: once its entry is tombstoned, every sweep has passed the escalation's too.
    const billing = await h.client("billing-agent");
    const later = await billing.submit(refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_1")).version));
    expect(later).toMatchObject({ status: "applied" });

    const ledger = await h.watchLedger();
    await waitFor(() => ledger.some((m) => m.key === later.intentKey && m.tombstone), { timeoutMs: 30_000, message: "the later write's entry was never tombstoned" });
    expect(ledger.filter((m) => m.key === escalatedReply.intentKey && m.tombstone)).toEqual([]);

    // Past retention, the operator decides: carried out, and the agent hears it.
    const ops = await h.client("ops-4");
    const discarded = await ops.resolve(escalation, { decision: "discard", message: "not needed any more" });
    expect(discarded).toMatchObject({ status: "rejected", reason: "escalation_discarded", message: "not needed any more" });
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "rejected"), { timeoutMs: 30_000, message: "the agent never heard the decision" });
  });
  it("forged-escalation: a writ.human copy under a real escalation id, its free text and intent id changed, is not carried out; the genuine one is", async () => {
    const h = await startHarness({ tools: [noteTicket], intentPartitions: 1 });
    await h.startRouter();
    const note = "customer asked politely";
    const { seen, escalation, escalatedReply } = await escalatedCase(h, "agent-f", "T-74", noteTicket, (_agent, input) => ({
      ...input,
      params: { tag: "needs-human", note },
      delta: [...input.delta, { op: "add", path: "/note", value: note }],
    }));
    // Another submit of the same agent, whose reply a forged copy would claim.
    const otherIntentId = `other-${randomUUID()}`;
    const FORGED = "REFUND APPROVED BY CFO; wire to acct 123";
    const forged: Escalation = {
      ...escalation,
      message: "safe to apply",
      intent: {
        ...escalation.intent,
        intentId: otherIntentId,
        params: { ...escalation.intent.params, note: FORGED },
        delta: escalation.intent.delta.map((op) => (op.path === "/note" && op.op === "add" ? { ...op, value: FORGED } : op)),
      },
    };
    await forge(h, forged);
    const copy = await waitFor(async () => (await h.readTopic(h.config.topics.human, "Escalation", 2)).find((e) => e.intent.intentId === otherIntentId), { message: "the forged copy on writ.human" });
    const now = await readVersion(h.records, "ticket", "T-74");
    const forgedWrites = () => h.records.history("ticket", "T-74").filter((e) => e.kind === "patch" && JSON.stringify(e.ops).includes(FORGED));
    const patches = () => h.records.patchRequests(escalatedReply.intentKey);

    // A client given the forged copy: the owner refuses it, writes nothing, answers nobody but the operator.
    const ops = await h.client("ops-f");
    const refused = await ops.resolve(copy, { decision: "apply", baseVersion: now.version });
    expect(refused).toMatchObject({ status: "rejected", reason: "resolution_not_applicable" });
    expect(refused.status === "rejected" && refused.message).toContain("not the escalated intent");
    expect(forgedWrites()).toHaveLength(0);
    expect(patches()).toHaveLength(0);

    // The CLI sees two different records under the id: contested, nothing sent (it would send the first, here the genuine one).
    const cli = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"], cliEnv(h));
    expect([cli.code, cli.stderr]).toEqual([1, expect.stringContaining("is contested")]);

    // The genuine record still resolves: written once, with its own text; the agent answered under its id.
    const done = await ops.resolve(escalation, { decision: "apply", baseVersion: now.version });
    expect(done, JSON.stringify(done)).toMatchObject({ status: "applied", resolvedBy: "ops-f" });
    expect((await readVersion(h.records, "ticket", "T-74")).state).toMatchObject({ tags: ["needs-human"], note });
    expect(patches()).toHaveLength(1);
    await waitFor(() => seen.find((r) => r.intentId === escalatedReply.intentId && r.status === "applied"), { message: "the agent's applied reply" });
    // The agent's reply topic, read again from its start (at least what the agent saw): none under the other submit's id.
    const replies = await h.readTopic(escalation.intent.replyTo, "Reply", seen.length);
    expect(replies.filter((r) => r.intentId === otherIntentId)).toEqual([]);
    expect(seen.filter((r) => r.intentId === otherIntentId)).toEqual([]);
    expect(forgedWrites()).toHaveLength(0);
  });

  it("writ escalations list and resolve hold what they show of a large backlog, not every escalation whole: 80 escalations of 800 KB records each, in a 40 MB heap", async () => {
    const h = await startHarness({ tools: [tagTicket], intentPartitions: 1 });
    await h.startRouter();
    const { escalation } = await escalatedCase(h, "agent-m", "T-76");
    // A backlog on writ.human: each showing a record of 800 KB (owners cut an escalation to fit the topic's 1 MB).
    const state = { status: "open", notes: "n".repeat(800_000) };
    const backlog = Array.from({ length: 80 }, (_, i): Escalation => ({ ...escalation, escalationId: `backlog-${i}-${h.id}`, current: { version: '"9"', state }, at: new Date(Date.parse(escalation.at) + 1000 + i).toISOString() }));
    await forge(h, ...backlog);
    await h.readTopic(h.config.topics.human, "Escalation", 81);

    const env = { ...cliEnv(h), NODE_OPTIONS: "--max-old-space-size=40" };
    const list = await writ(["escalations", "list"], env);
    expect(list.code, list.stderr.slice(-2000)).toBe(0);
    expect(list.stdout).toContain(`81 escalations on ${h.config.topics.human}`);
    const resolved = await writ(["escalations", "resolve", escalation.escalationId, "--discard", "--operator", `ops-m-${h.id}`, "--timeout-ms", "30000"], env);
    expect(resolved.code, resolved.stderr.slice(-2000)).toBe(0);
    expect(JSON.parse(resolved.stdout)).toMatchObject({ status: "rejected", reason: "escalation_discarded" });
  });

  it("forged-escalation-base: a writ.human copy under a real escalation id showing a later record version is contested by the CLI; nothing is written over a change made since the escalation", async () => {
    const h = await startHarness({ tools: [tagTicket], intentPartitions: 1 });
    await h.startRouter();
    const { escalation, escalatedReply } = await escalatedCase(h, "agent-g", "T-75");
    // A person changes the record after the escalation: an apply on the version the escalation showed is a conflict.
    h.records.seed("ticket", "T-75", { status: "closed by a person", tags: ["do-not-tag"] });
    const now = await readVersion(h.records, "ticket", "T-75");
    expect(now.version).not.toBe(escalation.current?.version);
    // The same intent, reason and message (copied from the genuine record), showing the record as it is now, dated first.
    const forged: Escalation = { ...escalation, current: now, at: new Date(Date.parse(escalation.at) - 60_000).toISOString() };
    await forge(h, forged);
    await waitFor(async () => (await h.readTopic(h.config.topics.human, "Escalation", 2)).find((e) => e.at === forged.at), { message: "the forged copy on writ.human" });

    const cli = await writ(["escalations", "resolve", escalation.escalationId, "--apply", "--operator", `ops-cli-${h.id}`, "--timeout-ms", "30000"], cliEnv(h));
    expect([cli.code, cli.stderr], cli.stdout).toEqual([1, expect.stringContaining("is contested")]);
    expect(h.records.patchRequests(escalatedReply.intentKey)).toHaveLength(0);
    expect((await readVersion(h.records, "ticket", "T-75")).state).toMatchObject({ tags: ["do-not-tag"] });
  });
});
