// An outage of one system of record pauses its intents without their in-flight places: another system's intent
// on the same partition is read and applied while the in-flight bound is full of paused intents, and once the
// system answers again its intents resume within the in-flight bound, in their records' order, once each.
import { afterEach, describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { intentKey } from "../../../src/keys.ts";
import { admitTools, declareWriteTool } from "../../../src/tools.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { FakeSystem, outage } from "./fake-system.ts";
import { intentRecord, ownerWith, txns } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([]) };
});
afterEach(() => {
  txns.length = 0;
});

const tool = (name: string, recordType: string, system: string) =>
  declareWriteTool({
    name, recordType, params: z.object({ tag: z.string().min(1) }), intentFields: ["tag"], allowedPaths: ["/tags/-"], keyScope: "run",
    versionPolicy: "rebase-commutative", system, reconcile: "idempotency-key",
  });

function intent(toolName: string, step: string, entity: { type: string; id: string }, tag: string) {
  const key = intentKey({ agentId: "a", tool: { name: toolName, keyScope: "run", intentFields: ["tag"] }, runId: "r", stepId: step, entity, params: { tag } });
  const value = JSON.stringify({
    intentId: step, intentKey: key, entity, tool: toolName, agent: { id: "a", runId: "r", stepId: step }, baseVersion: '"1"',
    delta: [{ op: "add", path: "/tags/-", value: tag }], params: { tag }, replyTo: "writ.replies.a", createdAt: new Date().toISOString(),
  });
  return { key, value, entityKey: `${entity.type}:${entity.id}` };
}

const committed = () => txns.filter((t) => t.committed);

/** The statuses of the replies committed for an intent key. */
function repliesOf(key: string): string[] {
  return committed()
    .flatMap((t) => t.records)
    .filter((r) => r.topic === "writ.replies.a" && r.value !== null)
    .map((r) => JSON.parse(r.value!.toString("utf8")) as { intentKey: string; status: string })
    .filter((r) => r.intentKey === key)
    .map((r) => r.status);
}

describe("an outage of one system of record, on a partition shared with another", () => {
  it("pauses its intents without their in-flight places: the other system's intent is applied meanwhile; afterwards they resume within the bound, in order, once each", async () => {
    const helpdesk = new FakeSystem("helpdesk");
    const billing = new FakeSystem("billing");
    for (const id of ["T-1", "T-2", "T-3"]) helpdesk.seed({ type: "ticket", id }, { tags: [] });
    billing.seed({ type: "invoice", id: "I-1" }, { tags: [] });

    // Down until told otherwise; then its reads wait at a gate, to count how many run at once.
    let down = true;
    let gate: { open: boolean; waiters: (() => void)[] } = { open: false, waiters: [] };
    let reading = 0;
    let mostReading = 0;
    const refused: string[] = [];
    const read = helpdesk.read.bind(helpdesk);
    helpdesk.read = async (entity, opts) => {
      if (down) {
        refused.push(`${entity.type}:${entity.id}`);
        throw outage();
      }
      reading++;
      mostReading = Math.max(mostReading, reading);
      try {
        if (!gate.open) await new Promise<void>((resolve) => gate.waiters.push(resolve));
        return await read(entity, opts);
      } finally {
        reading--;
      }
    };

    const tools = admitTools([tool("tag_ticket", "ticket", "helpdesk"), tool("tag_invoice", "invoice", "billing")], [helpdesk, billing], { sorTimeoutMs: 1_000 });
    const owner = ownerWith({ tools, config: { maxInFlightPerPartition: 2, outageBackoffInitialMs: 5, outageBackoffMaxMs: 20 } });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });

    // Two intents on T-1 (the second waits behind the first), one each on T-2 and T-3: three paused at once,
    // more than the two in-flight places. Then the billing intent.
    const t1 = intent("tag_ticket", "t1", { type: "ticket", id: "T-1" }, "first");
    const t2 = intent("tag_ticket", "t2", { type: "ticket", id: "T-1" }, "second");
    const t3 = intent("tag_ticket", "t3", { type: "ticket", id: "T-2" }, "t3");
    const t4 = intent("tag_ticket", "t4", { type: "ticket", id: "T-3" }, "t4");
    const i1 = intent("tag_invoice", "i1", { type: "invoice", id: "I-1" }, "paid");
    const all = [t1, t2, t3, t4, i1];
    owner.accept(all.map((x, offset) => intentRecord(offset, x.value, x.entityKey)), String(all.length - 1));

    await waitFor(() => repliesOf(i1.key).length > 0, {
      timeoutMs: 10_000,
      message: () => `billing: ${billing.reads.length} reads, ${billing.commitsOf(i1.key)} commits while helpdesk is down (${refused.length} helpdesk tries refused)`,
    });
    expect(repliesOf(i1.key)).toEqual(["applied"]);
    expect(billing.commitsOf(i1.key)).toBe(1);
    expect(billing.current({ type: "invoice", id: "I-1" })?.state).toEqual({ tags: ["paid"] });
    // The paused intents: tried (reads that met the outage), nothing written, no answer, the offset held at the first.
    await waitFor(() => new Set(refused).size === 3, { timeoutMs: 10_000, message: () => `helpdesk tries refused: ${JSON.stringify(refused)}` });
    expect(new Set(refused)).toEqual(new Set(["ticket:T-1", "ticket:T-2", "ticket:T-3"]));
    expect(helpdesk.patches).toEqual([]);
    for (const t of [t1, t2, t3, t4]) expect(repliesOf(t.key)).toEqual([]);
    expect(committed().every((t) => t.offset === null || t.offset === "0")).toBe(true);
    expect(owner.load).toBe(4); // the four helpdesk intents, kept until their results commit

    // The system answers again: the paused intents take places again, two at a time at most.
    down = false;
    await waitFor(() => reading === 2, { timeoutMs: 10_000, message: () => `${reading} helpdesk reads waiting at the gate` });
    const release = gate;
    gate = { open: true, waiters: [] };
    for (const go of release.waiters) go();

    await waitFor(() => [t1, t2, t3, t4].every((t) => repliesOf(t.key).length > 0), {
      timeoutMs: 10_000,
      message: () => `replies: ${JSON.stringify([t1, t2, t3, t4].map((t) => repliesOf(t.key)))}`,
    });
    expect(mostReading).toBe(2);
    for (const t of [t1, t2, t3, t4]) {
      expect(repliesOf(t.key)).toEqual(["applied"]);
      expect(helpdesk.commitsOf(t.key)).toBe(1);
    }
    // T-1's two intents in offset order.
    expect(helpdesk.current({ type: "ticket", id: "T-1" })?.state).toEqual({ tags: ["first", "second"] });
    await waitFor(() => committed().some((t) => t.offset === "5"), { timeoutMs: 10_000, message: () => `offsets: ${JSON.stringify(committed().map((t) => t.offset))}` });
    expect(owner.load).toBe(0);
    await owner.close();
  });
  it("with maxPausedPerPartition intents paused, the down system's later intents wait unstarted (keys held, nothing lost, offset held); the other system's intent still runs", async () => {
    const helpdesk = new FakeSystem("helpdesk");
    const billing = new FakeSystem("billing");
    const tickets = ["T-1", "T-2", "T-3", "T-4", "T-5", "T-6"];
    for (const id of tickets) helpdesk.seed({ type: "ticket", id }, { tags: [] });
    billing.seed({ type: "invoice", id: "I-1" }, { tags: [] });
    let down = true;
    const refused: string[] = [];
    const read = helpdesk.read.bind(helpdesk);
    helpdesk.read = async (entity, opts) => {
      if (!down) return read(entity, opts);
      refused.push(`${entity.type}:${entity.id}`);
      throw outage();
    };
    const tools = admitTools([tool("tag_ticket", "ticket", "helpdesk"), tool("tag_invoice", "invoice", "billing")], [helpdesk, billing], { sorTimeoutMs: 1_000 });
    const owner = ownerWith({ tools, config: { maxInFlightPerPartition: 2, maxPausedPerPartition: 2, outageBackoffInitialMs: 5, outageBackoffMaxMs: 20 } });
    owner.start();
    await waitFor(() => owner.state === "running", { timeoutMs: 5_000, message: "the owner never opened its partition" });
    const ts = tickets.map((id) => intent("tag_ticket", id, { type: "ticket", id }, id));
    const i1 = intent("tag_invoice", "i1", { type: "invoice", id: "I-1" }, "paid");
    const all = [...ts, i1];
    owner.accept(all.map((x, offset) => intentRecord(offset, x.value, x.entityKey)), String(all.length - 1));

    // Two paused fill the bound: the other four helpdesk intents do not start (they would only pause and hold the
    // two in-flight places); the billing intent takes a place.
    await waitFor(() => repliesOf(i1.key).length > 0, { timeoutMs: 10_000, message: () => `billing reads: ${billing.reads.length}; helpdesk tries refused: ${JSON.stringify([...new Set(refused)])}` });
    expect(repliesOf(i1.key)).toEqual(["applied"]);
    expect(new Set(refused)).toEqual(new Set(["ticket:T-1", "ticket:T-2"]));
    expect(committed().every((t) => t.offset === null || t.offset === "0")).toBe(true);
    expect(owner.load).toBe(6);

    down = false;
    await waitFor(() => ts.every((t) => repliesOf(t.key).length > 0), { timeoutMs: 10_000, message: () => `replies: ${JSON.stringify(ts.map((t) => repliesOf(t.key)))}` });
    for (const t of ts) {
      expect(repliesOf(t.key)).toEqual(["applied"]);
      expect(helpdesk.commitsOf(t.key)).toBe(1);
    }
    await waitFor(() => committed().some((t) => t.offset === "7"), { timeoutMs: 10_000, message: () => `offsets: ${JSON.stringify(committed().map((t) => t.offset))}` });
    expect(owner.load).toBe(0);
    await owner.close();
  });
});
