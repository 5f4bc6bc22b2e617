// The console's memory (src/console/state.ts), without Kafka: bounds, records
// read twice, replies read before their intents or escalations, and the
// owners' committed offset settling intents that get no reply.
import { describe, expect, it } from "vitest";
import { ConsoleState } from "../../src/console/state.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";

const topics = { intents: "writ.intents", human: "writ.human", dlq: "writ.dlq", replyPrefix: "writ.replies." };
const at = "2026-01-01T00:00:00.000Z";
const key = (n: number) => n.toString(16).padStart(64, "0");

function intent(n: number, agent = "alice"): WriteIntent {
  return {
    intentId: `i-${n}`,
    intentKey: key(n),
    entity: { type: "ticket", id: `T-${n}` },
    tool: "tag_ticket",
    agent: { id: agent, runId: "r", stepId: `s-${n}` },
    baseVersion: '"v1"',
    delta: [{ op: "replace", path: "/tags", value: ["x"] }],
    params: { tag: "x" },
    replyTo: `writ.replies.${agent}`,
    createdAt: at,
  };
}
const where = (topic: string, offset: number, partition = 0) => ({ topic, partition, offset: String(offset) });
const applied = (n: number, extra: Record<string, unknown> = {}): Reply =>
  ({ status: "applied", intentId: `i-${n}`, intentKey: key(n), duplicate: false, at, entity: { type: "ticket", id: `T-${n}` }, state: null, version: '"v2"', via: "patch", ...extra }) as Reply;
const escalation = (n: number): Escalation => ({
  escalationId: `e-${n}`,
  reason: "conflict_cycles_exhausted",
  message: "m",
  intent: intent(n),
  cycles: 3,
  current: { state: { tags: [] }, version: '"v4"' },
  at,
});

describe("ConsoleState", () => {
  it("an intent is in flight until its reply (read before or after it); a record read twice counts once", () => {
    const s = new ConsoleState(topics);
    s.intent(where("writ.intents", 0), intent(1));
    s.intent(where("writ.intents", 0), intent(1)); // the same offset again (a reader restarted)
    expect(s.snapshot().counts).toMatchObject({ intents: 1, inFlight: 1 });
    s.reply(where("writ.replies.alice", 0), applied(1));
    expect(s.snapshot().inFlight).toEqual([]);
    // reply first, then its intent: never in flight
    s.reply(where("writ.replies.alice", 1), applied(2));
    s.intent(where("writ.intents", 1), intent(2));
    const snap = s.snapshot();
    expect(snap.inFlight).toEqual([]);
    expect(snap.counts).toMatchObject({ applied: 2, inFlight: 0 });
    // the reply names neither agent nor tool: taken from the intent, else from the reply topic's name
    expect(snap.replies.map((r) => [r.agent, r.tool, r.agentFromTopic])).toEqual([
      ["alice", null, true],
      ["alice", "tag_ticket", false],
    ]);
  });

  it("the owners' committed offset settles intents that will get no reply (dead-lettered), and keeps later ones", () => {
    const s = new ConsoleState(topics);
    for (let i = 0; i < 3; i++) s.intent(where("writ.intents", i), intent(i));
    s.setLag({ group: "g", topic: "writ.intents", at, total: 1, partitions: [{ partition: 0, committed: "2", end: "3", lastStable: "3", logStart: "0", lag: 1 }] });
    expect(s.snapshot().inFlight.map((i) => i.intentId)).toEqual(["i-2"]);
    s.intent(where("writ.intents", 1, 0), intent(9)); // below the committed offset: settled already
    expect(s.snapshot().counts.inFlight).toBe(1);
  });

  it("an escalation whose write may already have happened says so (marked by the owner, or an unknown outcome)", () => {
    const s = new ConsoleState(topics);
    s.escalation(where("writ.human", 0), escalation(1));
    s.escalation(where("writ.human", 1), { ...escalation(2), reason: "sor_protocol", mayHaveWritten: true });
    s.escalation(where("writ.human", 2), { ...escalation(3), reason: "outcome_unknown" });
    const shown = Object.fromEntries(s.snapshot().escalations.map((e) => [e.escalationId, e.mayHaveWritten]));
    expect(shown).toEqual({ "e-1": false, "e-2": true, "e-3": true });
  });

  it("keeps each list bounded, and cuts long values", () => {
    const s = new ConsoleState(topics, { recent: 5, inFlight: 10, escalations: 3, valueChars: 50 });
    for (let i = 0; i < 40; i++) s.intent(where("writ.intents", i), intent(i));
    for (let i = 0; i < 20; i++) s.reply(where("writ.replies.alice", i), applied(100 + i));
    for (let i = 0; i < 6; i++) s.escalation(where("writ.human", i), escalation(200 + i));
    const snap = s.snapshot();
    expect(snap.inFlight).toHaveLength(5);
    expect(snap.counts).toMatchObject({ inFlight: 10, inFlightDropped: 30, applied: 20 });
    expect(snap.replies).toHaveLength(5);
    // All three kept are open: the later ones are counted, not kept, so none on the page vanishes.
    expect(snap.escalations.map((e) => e.escalationId)).toEqual(["e-200", "e-201", "e-202"]);
    expect(snap.counts).toMatchObject({ escalationsOpen: 3, escalationsDropped: 3 });
    const big = s.clip({ text: "x".repeat(500) });
    expect(big.truncated).toBe(true);
    expect(big.json.length).toBeLessThan(120);
  });

  it("a full list of escalations drops a resolved one first, and never an open one the operator can see", () => {
    const s = new ConsoleState(topics, { escalations: 3 });
    for (let i = 0; i < 3; i++) s.escalation(where("writ.human", i), escalation(i));
    s.reply(where("writ.replies.alice", 0), applied(1, { resolvedBy: "ops" }));
    s.escalation(where("writ.human", 3), escalation(3));
    // e-1 was resolved: it made room.
    expect(s.snapshot().escalations.map((e) => `${e.escalationId}:${e.status}`)).toEqual(["e-0:open", "e-2:open", "e-3:open"]);
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 3, escalationsResolved: 0, escalationsDropped: 0 });
    // All open: the oldest (maybe being decided on the page) stays resolvable; the new one is counted.
    s.escalation(where("writ.human", 4), escalation(4));
    expect(s.openEscalation("e-0")).toBeDefined();
    expect(s.openEscalation("e-4")).toBeUndefined();
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 3, escalationsDropped: 1 });
  });

  it("an escalation closes on the agent's reply carrying resolvedBy, also when that reply is read first; resolution_not_applicable marks it not open", () => {
    const s = new ConsoleState(topics);
    s.escalation(where("writ.human", 0), escalation(1));
    expect(s.openEscalation("e-1")?.intent.intentId).toBe("i-1");
    s.reply(where("writ.replies.alice", 0), applied(1, { resolvedBy: "ops" }));
    expect(s.snapshot().escalations[0]).toMatchObject({ status: "resolved", resolution: { outcome: "applied", by: "ops" } });
    expect(s.openEscalation("e-1")).toBeUndefined();

    s.reply(where("writ.replies.alice", 1), { status: "rejected", intentId: "i-2", intentKey: key(2), duplicate: false, at, reason: "returned_by_operator", message: "look again", resolvedBy: "ops" } as Reply);
    s.escalation(where("writ.human", 1), escalation(2));
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-2")).toMatchObject({ status: "resolved", resolution: { outcome: "returned", message: "look again" } });

    s.escalation(where("writ.human", 2), escalation(3));
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", message: "changed" });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-3")).toMatchObject({ status: "open", lastAttempt: { reason: "resolution_conflict" } });
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_not_applicable", message: "not open" });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-3")).toMatchObject({ status: "resolved", resolution: { outcome: "not_open" } });
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 0, escalationsResolved: 3 });
  });

  it("changes() hands out only the sections that changed, once", () => {
    const s = new ConsoleState(topics);
    s.changes();
    s.deadLetter(where("writ.dlq", 0), { reason: "undecodable", message: "m", source: where("writ.intents", 4), key: "ticket:T-1", valueBase64: "", originalBytes: 3, sha256: "ab", truncated: false, headers: {}, at });
    const c = s.changes();
    expect(Object.keys(c!).sort()).toEqual(["at", "counts", "deadLetters"]);
    expect(s.changes()).toBeNull();
    // a snapshot for a new stream leaves the changes to the open ones
    s.setLag({ group: "g", topic: "writ.intents", at, total: 0, partitions: [] });
    s.snapshot();
    expect(Object.keys(s.changes()!)).toContain("lag");
  });
});
