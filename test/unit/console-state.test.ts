// The console's memory (src/console/state.ts), without Kafka: bounds, records
// read twice, replies read before their intents or escalations, and the
// owners' committed offset settling intents that get no reply.
import { createHash } from "node:crypto";
import { describe, expect, it } from "vitest";
import { sseFrame } from "../../src/console/server.ts";
import { ConsoleState, DEFAULT_LIMITS, NAME_CHARS } from "../../src/console/state.ts";
import { notRedrivable, redrivenFrom } from "../../src/dlq-redrive.ts";
import { entityKey } from "../../src/schemas/common.ts";
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
/** An id as name() shows one that is not shown as it is (escaped, or with a `\` or `…`): with the digest of the record's own. */
const marked = (shown: string, raw: string) => `${shown} (sha256 ${createHash("sha256").update(Buffer.from(raw, "utf16le")).digest("hex").slice(0, 32)})`;
const where = (topic: string, offset: number, partition = 0) => ({ topic, partition, offset: String(offset) });
const applied = (n: number, extra: Record<string, unknown> = {}): Reply =>
  ({ status: "applied", intentId: `i-${n}`, intentKey: key(n), duplicate: false, at, entity: { type: "ticket", id: `T-${n}` }, state: null, version: '"v2"', via: "patch", ...extra }) as Reply;
/** An escalation read on writ.human, keyed as an owner keys it (its intent's entity). */
const human = (s: ConsoleState, offset: number, e: Escalation) => s.escalation(where("writ.human", offset), e, entityKey(e.intent.entity));
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
  it("holds the ACL check's answer (null before it), in the snapshot and as a changed section", () => {
    const s = new ConsoleState(topics);
    expect(s.trust).toBeNull();
    expect(s.snapshot().trust).toBeNull();
    s.changes();
    const check = { status: "warning", reason: "no_authorizer", message: "the cluster has no authorizer", owners: ["User:writ-owner"], topics: [] } as const;
    s.setTrust({ ...check, owners: [...check.owners], topics: [] });
    expect(s.trust).toMatchObject(check);
    expect(s.changes()).toMatchObject({ trust: check });
    expect(s.snapshot().trust).toMatchObject(check);
  });

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
    human(s, 0, escalation(1));
    human(s, 1, { ...escalation(2), reason: "sor_protocol", mayHaveWritten: true });
    human(s, 2, { ...escalation(3), reason: "outcome_unknown" });
    const shown = Object.fromEntries(s.snapshot().escalations.map((e) => [e.escalationId, e.mayHaveWritten]));
    expect(shown).toEqual({ "e-1": false, "e-2": true, "e-3": true });
  });

  it("keeps each list bounded, and cuts long values", () => {
    const s = new ConsoleState(topics, { recent: 5, inFlight: 10, escalations: 3, valueChars: 50 });
    for (let i = 0; i < 40; i++) s.intent(where("writ.intents", i), intent(i));
    for (let i = 0; i < 20; i++) s.reply(where("writ.replies.alice", i), applied(100 + i));
    for (let i = 0; i < 6; i++) human(s, i, escalation(200 + i));
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
    for (let i = 0; i < 3; i++) human(s, i, escalation(i));
    s.reply(where("writ.replies.alice", 0), applied(1, { resolvedBy: "ops" }));
    human(s, 3, escalation(3));
    // e-1 was resolved: it made room.
    expect(s.snapshot().escalations.map((e) => `${e.escalationId}:${e.status}`)).toEqual(["e-0:open", "e-2:open", "e-3:open"]);
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 3, escalationsResolved: 0, escalationsDropped: 0 });
    // All open: the oldest (maybe being decided on the page) stays resolvable; the new one is counted.
    human(s, 4, escalation(4));
    expect(s.resolvable("e-0")).toHaveProperty("escalation");
    expect(s.resolvable("e-4")).toEqual({ refused: "escalation_unknown" });
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 3, escalationsDropped: 1 });
  });

  it("a close read on a reply topic (before or after its escalation) is only reported: the page may still decide; the owner's answer to the console's own decision is final", () => {
    const s = new ConsoleState(topics);
    human(s, 0, escalation(1));
    expect(s.resolvable("e-1")).toMatchObject({ escalation: { escalationId: "e-1", intent: { intentId: "i-1" }, current: { version: '"v4"' } } });
    // Any producer can write a reply topic: a reply with resolvedBy says who closed it, and leaves it resolvable.
    s.reply(where("writ.replies.alice", 0), applied(1, { resolvedBy: "mallory" }));
    expect(s.snapshot().escalations[0]).toMatchObject({ status: "resolved", resolution: { outcome: "applied", from: "reply", by: "mallory" } });
    expect(s.resolvable("e-1")).toMatchObject({ escalation: { intent: { intentId: "i-1" } } });

    // read before its escalation, likewise
    s.reply(where("writ.replies.alice", 1), { status: "rejected", intentId: "i-2", intentKey: key(2), duplicate: false, at, reason: "returned_by_operator", message: "look again", resolvedBy: "ops" } as Reply);
    human(s, 1, escalation(2));
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-2")).toMatchObject({ status: "resolved", resolution: { outcome: "returned", from: "reply", message: "look again" } });
    expect(s.resolvable("e-2")).toHaveProperty("escalation");
    // the owner's answer to a decision sent from the console replaces the reported close, and is final
    s.resolutionAnswered("e-2", "discard", "ops", { status: "rejected", reason: "resolution_not_applicable", message: "not open" });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-2")).toMatchObject({ resolution: { outcome: "not_open", from: "console" } });
    expect(s.resolvable("e-2")).toMatchObject({ refused: "escalation_not_open" });
    // and a later reply does not reopen it to the page
    s.reply(where("writ.replies.alice", 2), { status: "rejected", intentId: "i-2", intentKey: key(2), duplicate: false, at, reason: "escalation_discarded", message: "x", resolvedBy: "mallory" } as Reply);
    expect(s.resolvable("e-2")).toMatchObject({ refused: "escalation_not_open" });

    human(s, 2, escalation(3));
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", message: "changed" });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-3")).toMatchObject({ status: "open", lastAttempt: { reason: "resolution_conflict" } });
    expect(s.resolvable("e-3")).toHaveProperty("escalation");
    // the owner's refusal with the record as it read it: the escalation shows that record (the page marks a change
    // written against the earlier one); a resolution still takes its default base from the writ.human record
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", message: "changed", details: { current: { version: '"v7"', state: { tags: ["moved"] } } } });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-3")).toMatchObject({ status: "open", current: { version: '"v7"', state: { json: JSON.stringify({ tags: ["moved"] }, null, 2) } } });
    expect(s.resolvable("e-3")).toMatchObject({ escalation: { current: { version: '"v4"' } } });
    // details that are not a record read change nothing
    for (const details of [null, "x", { current: null }, { current: { version: 7, state: {} } }, { current: { state: {} } }, { current: { version: '"v9"' } }]) {
      s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", message: "changed", details });
      expect(s.escalationItem("e-3")?.current?.version).toBe('"v7"');
    }
    s.resolutionAnswered("e-3", "apply", "ops", { status: "applied", version: '"v5"' });
    expect(s.snapshot().escalations.find((e) => e.escalationId === "e-3")).toMatchObject({ status: "resolved", resolution: { outcome: "applied", from: "console", by: "ops" } });
    expect(s.resolvable("e-3")).toMatchObject({ refused: "escalation_not_open" });
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 0, escalationsResolved: 3 });
  });

  it("a second record with the same escalation id and another intent or message contests it: shown, refused to the page; the same record again does not", () => {
    const s = new ConsoleState(topics);
    human(s, 0, escalation(1));
    human(s, 1, escalation(1)); // the same claim again (read twice): nothing changes
    expect(s.escalationItem("e-1")?.contested).toBeUndefined();
    expect(s.resolvable("e-1")).toHaveProperty("escalation");
    const forged = { ...escalation(1), message: "harmless, safe to apply", intent: { ...intent(1), delta: [{ op: "add" as const, path: "/tags/-", value: "ATTACKER" }] } };
    human(s, 2, forged);
    // the first record stays shown, marked contested; the page may not resolve it
    expect(s.snapshot().escalations[0]).toMatchObject({ escalationId: "e-1", message: "m", contested: { where: where("writ.human", 2) } });
    expect(s.snapshot().escalations[0]!.change.json).not.toContain("ATTACKER");
    expect(s.resolvable("e-1")).toMatchObject({ refused: "escalation_contested" });
    // a reason alone differing contests too
    human(s, 3, escalation(2));
    human(s, 4, { ...escalation(2), reason: "outcome_unknown" });
    expect(s.resolvable("e-2")).toMatchObject({ refused: "escalation_contested" });
    // and the record version alone (an apply's default base: a copy showing a later one would write over a change)
    human(s, 5, escalation(3));
    human(s, 6, { ...escalation(3), current: { state: { tags: ["changed since"] }, version: '"v9"' } });
    expect(s.resolvable("e-3")).toMatchObject({ refused: "escalation_contested" });
  });

  it("a copy with the same id, intent and record version but another record state contests it too: an Apply would write a change built on the forged state onto the real version", () => {
    const s = new ConsoleState(topics);
    const first = escalation(1);
    human(s, 0, { ...first, current: { state: { tags: ["forged"] }, version: first.current!.version } });
    human(s, 1, first);
    expect(s.resolvable("e-1")).toMatchObject({ refused: "escalation_contested" });
  });

  it("ids and versions differing only in a lone surrogate, or named `.` or `..`, are shown apart and escaped (as UTF-8 each lone surrogate was U+FFFD: one digest)", () => {
    const s = new ConsoleState(topics);
    const [a, b] = [`${"v".repeat(200)}\ud800`, `${"v".repeat(200)}\udbff`];
    expect(s.name(a)).not.toBe(s.name(b));
    // a lone surrogate is shown escaped, so the page can encode the name in a URL
    const lone = s.name("e-\ud800");
    expect(lone).toMatch(/^e-\\ud800 \(sha256 [0-9a-f]{32}\)$/);
    expect(() => encodeURIComponent(lone)).not.toThrow();
    expect(s.name("e-\ud83d\ude00")).toBe("e-\ud83d\ude00");
    for (const dots of [".", ".."]) expect(s.name(dots)).toMatch(/ \(sha256 [0-9a-f]{32}\)$/);
  });

  it("a writ.human record not keyed by its intent's entity (as an owner keys it) is not kept, and counted", () => {
    const s = new ConsoleState(topics);
    s.escalation(where("writ.human", 0), escalation(1), "ticket:T-other");
    s.escalation(where("writ.human", 1), escalation(1), null);
    expect(s.snapshot().escalations).toEqual([]);
    expect(s.snapshot().counts).toMatchObject({ escalationsOpen: 0, escalationsMiskeyed: 2 });
    // the genuine record is then kept, uncontested
    human(s, 2, escalation(1));
    expect(s.resolvable("e-1")).toHaveProperty("escalation");
  });

  it("cuts every string a record brings to a bound, says how much was cut; keeps of an escalation only what resolving needs, within the owners' intent size", () => {
    const s = new ConsoleState(topics, { textChars: 100, intentChars: 4096 });
    const mega = "A".repeat(1_000_000);
    const long = (n: number) => `${n}-${"x".repeat(300)}`;
    human(s, 0, { ...escalation(1), message: mega, reason: mega, at: mega, intent: { ...intent(1), tool: mega, agent: { id: mega, runId: mega, stepId: "s" } } });
    s.reply(where("writ.replies.alice", 0), { status: "rejected", intentId: mega, intentKey: mega, duplicate: false, at: mega, reason: mega, message: mega } as Reply);
    s.reply(where("writ.replies.alice", 1), applied(7, { resolvedBy: mega, version: mega, via: mega }));
    s.deadLetter(where("writ.dlq", 0), { reason: mega, message: mega, source: { topic: mega, partition: 0, offset: "4" }, key: mega, valueBase64: "", originalBytes: 3, sha256: mega, truncated: false, headers: {}, at: mega });
    // two long ids sharing their beginning stay two
    human(s, 1, { ...escalation(2), escalationId: long(1) });
    human(s, 2, { ...escalation(3), escalationId: long(2) });
    const snap = s.snapshot();
    const json = JSON.stringify(snap);
    expect(json.length).toBeLessThan(20_000);
    expect(snap.escalations[0]!.message).toBe(`${"A".repeat(100)}… (999900 more characters)`);
    expect(snap.replies[1]!.message).toMatch(/… \(999900 more characters\)$/);
    expect(snap.deadLetters[0]!.message).toMatch(/… \(999900 more characters\)$/);
    expect(snap.escalations).toHaveLength(3);
    expect(new Set(snap.escalations.map((e) => e.escalationId)).size).toBe(3);
    expect(snap.counts.cut).toBeGreaterThan(10);
    // what a resolution carries is the whole record's (the id and intent as written, the version)
    const r = s.resolvable(snap.escalations[1]!.escalationId);
    expect(r).toMatchObject({ escalation: { escalationId: long(1), intent: { intentId: "i-2" }, current: { state: null, version: '"v4"' } } });
    // an intent larger than an owner admits is not kept: the page says to use the CLI
    human(s, 3, { ...escalation(4), intent: { ...intent(4), params: { big: "y".repeat(5000) } } });
    expect(s.resolvable("e-4")).toMatchObject({ refused: "escalation_too_large" });
  });

  it("shows every string a record brings with its controls and bidi overrides escaped (as writ escalations list does), its JSON still the same value; records still correlate by their ids", () => {
    const s = new ConsoleState(topics);
    // U+202E reverses what follows it on the page: ticket:12\u202e34 showed as ticket:1243, and the rest of its line reversed
    const odd = "12\u202e34";
    const i = { ...intent(1), intentId: `i-${odd}`, entity: { type: "ticket", id: odd }, tool: "tag\u2066", agent: { id: "al\x9bice", runId: "r\x1b]0;", stepId: "s" }, delta: [{ op: "replace" as const, path: "/tags", value: ["a\u202eb", "c\x9bd", "e\x1bf"] }] };
    s.intent(where("writ.intents", 0), i);
    expect(s.snapshot().inFlight[0]).toMatchObject({
      intentId: marked("i-12\\u202e34", `i-${odd}`),
      entity: marked("ticket:12\\u202e34", `ticket:${odd}`),
      tool: marked("tag\\u2066", "tag\u2066"),
      agent: marked("al\\x9bice", "al\x9bice"),
      runId: marked("r\\x1b]0;", "r\x1b]0;"),
    });
    human(s, 0, { ...escalation(1), escalationId: `e-${odd}`, reason: "r\u2069", message: "m\x1b[2J\u202e", intent: i });
    const e = s.snapshot().escalations[0]!;
    expect([e.escalationId, e.entity, e.reason, e.message, e.intentId]).toEqual([marked("e-12\\u202e34", `e-${odd}`), marked("ticket:12\\u202e34", `ticket:${odd}`), "r\\u2069", "m\\x1b[2J\\u202e", marked("i-12\\u202e34", `i-${odd}`)]);
    // the change as JSON: nothing raw a page would act on, and it parses back to the agent's change (the page prefills it)
    expect(e.change.json).not.toMatch(/[\x7f-\x9f\u202a-\u202e\u2066-\u2069]/);
    expect(JSON.parse(e.change.json)).toEqual(i.delta);
    expect(JSON.parse(s.clip({ "k\u2067": ["\x7f", "\u202a"] }).json)).toEqual({ "k\u2067": ["\x7f", "\u202a"] });
    // cut and escaped: still a bound, and still nothing raw
    const long = s.clip("\u202e".repeat(10_000));
    expect([long.truncated, /[\u202a-\u202e]/.test(long.json)]).toEqual([true, false]);
    // the page names the escalation as shown; what a resolution carries is the record's own
    expect(s.resolvable(e.escalationId)).toMatchObject({ escalation: { escalationId: `e-${odd}`, intent: { intentId: `i-${odd}`, entity: { id: odd } } } });
    // a reply is matched to its intent and escalation by the same ids
    s.reply(where("writ.replies.alice", 0), { status: "rejected", intentId: `i-${odd}`, intentKey: key(1), duplicate: false, at, reason: "escalation_discarded", message: "no\u202e", resolvedBy: "ops\x1b" } as Reply);
    const snap = s.snapshot();
    expect(snap.inFlight).toEqual([]);
    expect(snap.replies[0]).toMatchObject({ intentId: marked("i-12\\u202e34", `i-${odd}`), message: "no\\u202e", resolvedBy: marked("ops\\x1b", "ops\x1b"), tool: marked("tag\\u2066", "tag\u2066") });
    expect(snap.escalations[0]).toMatchObject({ status: "resolved", resolution: { outcome: "discarded", by: marked("ops\\x1b", "ops\x1b") } });
    s.deadLetter(where("writ.dlq", 0), { reason: "r\x85", message: "m\u202d", source: { topic: "t\u202e", partition: 0, offset: "4\u2066" }, key: `ticket:${odd}`, valueBase64: "", originalBytes: 3, sha256: "ab", truncated: false, headers: {}, at });
    expect(s.snapshot().deadLetters[0]).toMatchObject({ reason: "r\\x85", message: "m\\u202d", key: marked("ticket:12\\u202e34", `ticket:${odd}`), source: { topic: marked("t\\u202e", "t\u202e"), offset: marked("4\\u2066", "4\u2066") } });
    // a long one: cut, escaped, with the digest of the whole
    human(s, 1, { ...escalation(2), escalationId: `\u202e${"x".repeat(300)}` });
    expect(s.snapshot().escalations.map((x) => x.escalationId)).toContainEqual(expect.stringMatching(/^\\u202ex+… \(301 characters, sha256 [0-9a-f]{32}\)$/));
  });

  it("the owner's answer to a decision from the page is given bounded: its fields cut and escaped, its details clipped JSON (a record 500 deep stalled the tab)", () => {
    const s = new ConsoleState(topics, { textChars: 100 });
    let deep: unknown = "x".repeat(100_000);
    for (let i = 0; i < 500; i++) deep = { n: [deep] };
    const answer = { status: "rejected", intentId: "r-1", intentKey: key(1), duplicate: false, at, reason: "resolution_conflict", message: `changed\u202e${"m".repeat(5000)}`, details: { current: { version: '"v7"', state: deep } } };
    const shown = s.answerShown(answer);
    expect(Object.keys(shown).sort()).toEqual(["details", "message", "reason", "status"]);
    // 100 characters as shown: 7, the escape's 6, then 87 of the 5000; 5008 - 95 not shown
    expect(shown).toMatchObject({ status: "rejected", reason: "resolution_conflict", message: `changed\\u202e${"m".repeat(87)}… (4913 more characters)` });
    expect(shown.details!.truncated).toBe(true);
    expect(shown.details!.json.startsWith('{"current":{"version":"\\"v7\\"","state":{"n":[{"n":[')).toBe(true);
    expect(JSON.stringify(shown).length).toBeLessThan(2 * DEFAULT_LIMITS.valueChars);
    // an applied one: its version and the way it was written; a small details value indented whole
    expect(s.answerShown({ status: "applied", version: '"v8"', via: "patch\x1b", details: { a: 1 } } as never)).toEqual({ status: "applied", version: '"v8"', via: marked("patch\\x1b", "patch\x1b"), details: { json: '{\n  "a": 1\n}', truncated: false } });
  });

  it("two ids shown alike stay two keys: an id with ESC and one with a backslash and `x1b` (both shown `\\x1b`) are two intents in flight, a reply to one answers it only; an escalation pair differing only so is not contested", () => {
    const s = new ConsoleState(topics);
    const [raw, literal] = ["i-\x1b", "i-\\x1b"];
    s.intent(where("writ.intents", 0), { ...intent(1), intentId: raw });
    s.intent(where("writ.intents", 1), { ...intent(2), intentId: literal });
    // also one that cannot be told apart by its look alone: the form another id is shown in
    const lookalike = marked("i-\\x1b", raw);
    s.intent(where("writ.intents", 2), { ...intent(3), intentId: lookalike });
    const ids = s.snapshot().inFlight.map((i) => i.intentId);
    expect(new Set(ids).size).toBe(3);
    expect(ids).toContain(marked("i-\\x1b", raw));
    s.reply(where("writ.replies.alice", 0), applied(1, { intentId: literal }));
    // newest first: the look-alike (shown with a digest of its own), the ESC one; the literal one answered
    expect(s.snapshot().inFlight.map((i) => i.intentId)).toEqual([marked(lookalike, lookalike), marked("i-\\x1b", raw)]);
    // an id shown as it is (no escape, no `\`, no `…`) is its own key, unmarked
    expect(s.name("i-1")).toBe("i-1");
    // nor is a short id that reads as a long one cut (with its `…` and digest) that long one
    const cut = new ConsoleState(topics);
    const long = `i-${"x".repeat(300)}`;
    cut.intent(where("writ.intents", 0), { ...intent(1), intentId: long });
    cut.intent(where("writ.intents", 1), { ...intent(2), intentId: cut.name(long) });
    expect(new Set(cut.snapshot().inFlight.map((i) => i.intentId)).size).toBe(2);
    // two escalations whose ids and intents differ only so: two, neither contested, each resolved with its own ids
    human(s, 0, { ...escalation(1), escalationId: "e-\x1b", intent: { ...intent(1), intentId: raw } });
    human(s, 1, { ...escalation(1), escalationId: "e-\\x1b", intent: { ...intent(1), intentId: literal } });
    const escalations = s.snapshot().escalations;
    expect(escalations.map((e) => [e.escalationId, e.contested ?? null])).toEqual([
      [marked("e-\\x1b", "e-\x1b"), null],
      [marked("e-\\x1b", "e-\\x1b"), null],
    ]);
    for (const [e, [id, intentId]] of escalations.map((e, i) => [e, [["e-\x1b", raw], ["e-\\x1b", literal]][i]!] as const)) {
      expect(s.resolvable(e.escalationId)).toMatchObject({ escalation: { escalationId: id, intent: { intentId } } });
    }
  });

  it("escapes first, then cuts on whole escapes: a message, an id or a value made of escapable characters stays within its bound (escaping after the cut made them up to 6 times longer), and says how many characters were not shown", () => {
    const s = new ConsoleState(topics, { textChars: 2000, valueChars: 4000 });
    // a message: 500 whole `\x1b` of the 3000, then how many were not shown
    const text = s.text("\x1b".repeat(3000));
    expect(text).toBe(`${"\\x1b".repeat(500)}… (2500 more characters)`);
    // a bound that falls inside an escape: cut before it, never in it
    for (const textChars of [2001, 2002, 2003, 2005]) {
      const t = new ConsoleState(topics, { textChars }).text("\u202e".repeat(2000));
      const shown = t.slice(0, t.indexOf("…"));
      expect(shown.length, `${textChars}`).toBeLessThanOrEqual(textChars);
      expect(shown, `${textChars}`).toMatch(/^(\\u202e)+$/);
      expect(t.slice(shown.length), `${textChars}`).toBe(`… (${2000 - shown.length / 6} more characters)`);
    }
    // a short one that escaping makes too long is cut too
    expect(s.text("\u2066".repeat(400))).toBe(`${"\\u2066".repeat(333)}… (67 more characters)`);
    // an id: at most NAME_CHARS as shown, whole escapes, the digest of the whole
    for (const id of ["\u202e".repeat(150), "\x1b".repeat(60), `e-${"中\x1b".repeat(55)}`, "\\".repeat(300)]) {
      const name = s.name(id);
      expect(name.length, JSON.stringify(id)).toBeLessThanOrEqual(NAME_CHARS);
      expect(name, JSON.stringify(id)).toMatch(new RegExp(`^(?:e-)?(?:\\\\u202e|\\\\x1b|中|\\\\)*… \\(${id.length} characters, sha256 [0-9a-f]{32}\\)$`));
    }
    // a value: at most valueChars of the escaped JSON, from its beginning, ending on a whole escape (its own or
    // JSON's: `\n`, `\"`, `\u0000`); the characters of the JSON not shown counted
    const value = { k: "\u202e\n\"\u0000\x85".repeat(2000) };
    const json = JSON.stringify(value);
    const escaped = json.replace(/[\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);
    for (const valueChars of [4000, 4001, 4002, 4003, 4004, 4005]) {
      const clipped = new ConsoleState(topics, { valueChars }).clip(value);
      const [shown, more] = clipped.json.split("\n… ");
      expect(clipped.truncated).toBe(true);
      expect(shown!.length, `${valueChars}`).toBeLessThanOrEqual(valueChars);
      expect(shown!.length, `${valueChars}`).toBeGreaterThan(valueChars - 6);
      expect(escaped.startsWith(shown!), `${valueChars}`).toBe(true);
      expect(shown!.slice(6), `${valueChars}`).toMatch(/^(?:\\u202e|\\n|\\"|\\u0000|\\u0085)*$/);
      // what is shown, unescaped, is that many characters of the JSON: with the rest, all of it
      const rawShown = shown!.replace(/\\u(202e|0085)/g, "x").length;
      expect(more, `${valueChars}`).toBe(`(${json.length - rawShown} more characters)`);
    }
    // one whose compact JSON fits only before escaping is cut as well
    const small = s.clip("\u202e".repeat(3000));
    expect([small.truncated, small.json.length < 4100]).toEqual([true, true]);
    // not cut: still the same value
    expect(JSON.parse(s.clip(value.k.slice(0, 500)).json)).toBe(value.k.slice(0, 500));
  });

  it("an escalation's record version shown escaped or cut carries the version itself (rawVersion) for Apply; one shown as it is, or one no owner could have read (past 256 characters), does not", () => {
    const s = new ConsoleState(topics);
    const nel = 'W/"v\x85"';
    const long = `"${"v".repeat(248)}"`;
    human(s, 0, { ...escalation(1), current: { state: {}, version: nel } });
    human(s, 1, { ...escalation(2), current: { state: {}, version: long } });
    human(s, 2, { ...escalation(3), current: { state: {}, version: '"v4"' } });
    const byId = (id: string) => s.escalationItem(id)!.current!;
    expect(byId("e-1")).toMatchObject({ version: marked('W/"v\\x85"', nel), rawVersion: nel });
    expect(byId("e-2").version.length).toBeLessThanOrEqual(NAME_CHARS);
    expect(byId("e-2")).toMatchObject({ rawVersion: long });
    expect(byId("e-3")).toEqual({ version: '"v4"', state: { json: "{}", truncated: false } });
    // the record an owner's refusal carries: the same; a version past 256 characters is none writ carries
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", details: { current: { version: "\u202e7", state: {} } } });
    expect(byId("e-3")).toMatchObject({ version: marked("\\u202e7", "\u202e7"), rawVersion: "\u202e7" });
    s.resolutionAnswered("e-3", "apply", "ops", { status: "rejected", reason: "resolution_conflict", details: { current: { version: "x".repeat(300), state: {} } } });
    expect(byId("e-3").version.length).toBeLessThanOrEqual(NAME_CHARS);
    expect(byId("e-3").rawVersion).toBeUndefined();
  });

  it("clip() cuts the compact JSON, and indents only a value whose compact form fits (deep nesting would indent to 100x its size)", () => {
    const s = new ConsoleState(topics, { valueChars: 4000 });
    let deep: unknown = 0;
    for (let i = 0; i < 118; i++) deep = [deep];
    const value = { a: Array.from({ length: 4000 }, () => deep) };
    const c = s.clip(value);
    expect(c.truncated).toBe(true);
    // the compact text, cut: no indentation in it
    expect(c.json.startsWith(`{"a":[[[[`)).toBe(true);
    expect(c.json).toMatch(new RegExp(`\\n… \\(${JSON.stringify(value).length - 4000} more characters\\)$`));
    // a small value is indented as before
    expect(s.clip({ a: [1] })).toEqual({ json: '{\n  "a": [\n    1\n  ]\n}', truncated: false });
    // one that fits compact but not indented is shown whole, compact
    let nested: unknown = "x";
    for (let i = 0; i < 100; i++) nested = [nested];
    expect(s.clip(nested)).toEqual({ json: JSON.stringify(nested), truncated: false });
  });

  it("a frame that cannot be serialized is logged and skipped (it threw in the pump's timer: the process exited)", () => {
    const logged: unknown[] = [];
    const log = { error: (...a: unknown[]) => void logged.push(a) };
    const tooLong = { toJSON: () => { throw new RangeError("Invalid string length"); } };
    expect(sseFrame("update", { escalations: [tooLong] }, log as never)).toBeNull();
    expect(logged).toHaveLength(1);
    expect(sseFrame("update", { a: 1 }, log as never)).toBe('event: update\ndata: {"a":1}\n\n');
  });

  it("changes() hands out only the sections that changed, once", () => {
    const s = new ConsoleState(topics);
    s.changes();
    s.deadLetter(where("writ.dlq", 0), { reason: "undecodable", message: "m", source: where("writ.intents", 4), key: "ticket:T-1", valueBase64: "", originalBytes: 3, sha256: "ab", truncated: false, headers: {}, at });
    const c = s.changes();
    expect(Object.keys(c!).sort()).toEqual(["at", "counts", "deadLetterChanges"]);
    expect(s.changes()).toBeNull();
    // a snapshot for a new stream leaves the changes to the open ones
    s.setLag({ group: "g", topic: "writ.intents", at, total: 0, partitions: [] });
    s.snapshot();
    expect(Object.keys(s.changes()!)).toContain("lag");
  });

  it("an update carries what changed of the escalations, not the whole list: a record not kept, a reply or one more escalation costs the pages that escalation, not every one (hostile records can fill the list)", () => {
    const s = new ConsoleState(topics, { escalations: 3 });
    const big = "x".repeat(3000);
    const bulky = (n: number): Escalation => ({ ...escalation(n), message: big, intent: { ...intent(n), params: { big } } });
    for (let i = 0; i < 3; i++) human(s, i, bulky(i));
    const first = s.changes()!;
    expect(first).not.toHaveProperty("escalations");
    expect(first.escalationChanges!.added.map((e) => e.escalationId)).toEqual(["e-0", "e-1", "e-2"]);
    expect(first.escalationChanges!.order).toEqual(["0:0", "0:1", "0:2"]);
    // the list is full of open ones: one more is counted; the pages' list is unchanged
    human(s, 3, bulky(3));
    expect(Object.keys(s.changes()!).sort()).toEqual(["at", "counts"]);
    // a close reported on a reply topic: that escalation's status fields, none of the others', no message or change
    s.reply(where("writ.replies.alice", 0), applied(1, { resolvedBy: "mallory" }));
    const closed = s.changes()!;
    expect(closed.escalationChanges).toEqual({
      order: ["0:0", "0:2", "0:1"],
      added: [],
      changed: [{ where: where("writ.human", 1), status: "resolved", resolution: { outcome: "applied", from: "reply", by: "mallory", at, version: '"v2"' } }],
    });
    expect(JSON.stringify(closed).length).toBeLessThan(big.length);
    // a new one takes the resolved one's place: it alone comes whole
    human(s, 4, bulky(4));
    const added = s.changes()!.escalationChanges!;
    expect(added.order).toEqual(["0:0", "0:2", "0:4"]);
    expect([added.added.map((e) => e.escalationId), added.changed]).toEqual([["e-4"], []]);
    // a contest: its status fields
    human(s, 5, { ...bulky(0), message: "forged" });
    expect(s.changes()!.escalationChanges!.changed).toEqual([{ where: where("writ.human", 0), status: "open", contested: { where: where("writ.human", 5) } }]);
    // the snapshot (a new page) still has the whole list
    expect(s.snapshot().escalations.map((e) => e.escalationId)).toEqual(["e-0", "e-2", "e-4"]);
  });

  it("an update carries the replies, conflicts and dead letters read since, not the lists again; of a dead letter marked sent back, its mark", () => {
    const s = new ConsoleState(topics, { recent: 3 });
    const big = "y".repeat(3000);
    const conflictReply = (n: number) =>
      ({ status: "conflict", intentId: `i-${n}`, intentKey: key(n), duplicate: false, at, entity: { type: "ticket", id: `T-${n}` }, cycle: 1, message: big, current: { state: { big }, version: '"v2"' }, your_change: [] }) as Reply;
    for (let i = 0; i < 3; i++) s.reply(where("writ.replies.alice", i), conflictReply(i));
    expect(s.changes()!.conflictChanges!.added.map((c) => c.intentId)).toEqual(["i-2", "i-1", "i-0"]);
    s.reply(where("writ.replies.alice", 3), conflictReply(3));
    const one = s.changes()!;
    expect(one).not.toHaveProperty("conflicts");
    expect(one).not.toHaveProperty("replies");
    expect([one.conflictChanges!.added.map((c) => c.intentId), one.replyChanges!.added.map((r) => r.intentId)]).toEqual([["i-3"], ["i-3"]]);
    // one conflict's message and record, not the list's
    expect(JSON.stringify(one).length).toBeLessThan(3 * big.length);
    // dead letters: the new ones; then one marked sent back, its mark only
    const value = (n: number) => Buffer.from(`{"n":${n}}`);
    const letter = (n: number) => ({ reason: "reply_topic_missing", message: big, source: where("writ.intents", n), key: "ticket:T-1", valueBase64: value(n).toString("base64"), originalBytes: value(n).length, sha256: redrivenFrom(`writ.dlq:0:${n}`, "writ.dlq", Buffer.from("ticket:T-1"), value(n))!.sha256, truncated: false, headers: {}, at });
    for (let i = 0; i < 3; i++) s.deadLetter(where("writ.dlq", i), letter(i));
    expect(s.changes()!.deadLetterChanges!.added.map((d) => d.where.offset)).toEqual(["2", "1", "0"]);
    s.redriven(where("writ.intents", 50), redrivenFrom("writ.dlq:0:1", "writ.dlq", Buffer.from("ticket:T-1"), value(1))!);
    const marked = s.changes()!;
    expect(marked).not.toHaveProperty("deadLetters");
    expect(marked.deadLetterChanges).toEqual({ added: [], sentBack: [{ where: where("writ.dlq", 1), sentBack: where("writ.intents", 50) }] });
    // the snapshot (a new page) has the lists whole
    expect(s.snapshot().deadLetters.map((d) => [d.where.offset, d.sentBack?.offset ?? null])).toEqual([["2", null], ["1", "50"], ["0", null]]);
  });

  it("marks a dead letter sent back only by a record with its key and value, read before or after it, truncated or not", () => {
    const s = new ConsoleState(topics);
    const value = Buffer.from('{"an":"intent"}');
    const letter = (sha256: string, truncated = false) => ({ reason: "reply_topic_missing", message: "m", source: where("writ.intents", 4), key: "ticket:T-1", valueBase64: value.toString("base64"), originalBytes: value.length, sha256, truncated, headers: {}, at });
    const sha = redrivenFrom("writ.dlq:0:7", "writ.dlq", Buffer.from("ticket:T-1"), value)!.sha256;
    // the header alone (any producer's to set): another value, another key, another dlq topic mark nothing
    expect(redrivenFrom("other.dlq:0:7", "writ.dlq", null, value)).toBeNull();
    expect(redrivenFrom("writ.dlq:0:x", "writ.dlq", null, value)).toBeNull();
    s.deadLetter(where("writ.dlq", 7), letter(sha));
    s.redriven(where("writ.intents", 50), redrivenFrom("writ.dlq:0:7", "writ.dlq", Buffer.from("ticket:T-1"), Buffer.from("forged"))!);
    s.redriven(where("writ.intents", 51), redrivenFrom("writ.dlq:0:7", "writ.dlq", Buffer.from("ticket:T-2"), value)!);
    expect(s.deadLetterAt(0, "7")!.sentBack).toBeNull();
    // the very record: marked, with where it went; a later copy does not move the mark
    s.snapshot();
    s.redriven(where("writ.intents", 52), redrivenFrom("writ.dlq:0:7", "writ.dlq", Buffer.from("ticket:T-1"), value)!);
    s.redriven(where("writ.intents", 53), redrivenFrom("writ.dlq:0:7", "writ.dlq", Buffer.from("ticket:T-1"), value)!);
    expect(s.deadLetterAt(0, "7")!.sentBack).toEqual(where("writ.intents", 52));
    expect(Object.keys(s.changes()!)).toContain("deadLetterChanges");
    // read before its dead letter (two readers, two topics): kept and applied when the dead letter comes, also
    // when a forged claim came first
    s.redriven(where("writ.intents", 59, 1), redrivenFrom("writ.dlq:1:9", "writ.dlq", Buffer.from("ticket:T-1"), Buffer.from("forged"))!);
    s.redriven(where("writ.intents", 60, 1), redrivenFrom("writ.dlq:1:9", "writ.dlq", Buffer.from("ticket:T-1"), value)!);
    s.deadLetter(where("writ.dlq", 9, 1), letter(sha));
    expect(s.deadLetterAt(1, "9")!.sentBack).toEqual(where("writ.intents", 60, 1));
    // a truncated dead letter's sha256 is the whole original's: the original sent back from its source marks it
    s.redriven(where("writ.intents", 61), redrivenFrom("writ.dlq:0:11", "writ.dlq", Buffer.from("ticket:T-1"), value)!);
    s.deadLetter(where("writ.dlq", 11), letter(sha, true));
    expect(s.deadLetterAt(0, "11")!.sentBack).toEqual(where("writ.intents", 61));
    expect(notRedrivable(s.deadLetterAt(0, "11")!, "writ.intents")).toBeNull();
    expect(notRedrivable(s.deadLetterAt(0, "7")!, "writ.intents")).toBeNull();
    expect(notRedrivable(s.deadLetterAt(0, "7")!, "another.intents")?.outcome).toBe("other_topic");
  });
});
