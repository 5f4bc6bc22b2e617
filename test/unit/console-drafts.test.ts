// The console page's drafts (src/console/assets/drafts.js, plain JavaScript the page imports): what the operator
// typed on an escalation's card, kept by escalation id, over its prefill; marked when the record it was written
// against is no longer the one shown; gone with its escalation.
import { describe, expect, it } from "vitest";
import { baseToSend, DraftBook, decidable, prefill } from "../../src/console/assets/drafts.js";
import type { EscalationItem } from "../../src/console/view.ts";

const where = { topic: "writ.human", partition: 0, offset: "0" };
const clipped = (value: unknown) => ({ json: JSON.stringify(value, null, 2), truncated: false });
const change = [{ op: "replace", path: "/tags", value: ["x"] }];

function item(n: number, version: string | null = '"v4"', extra: Partial<EscalationItem> = {}): EscalationItem {
  return {
    escalationId: `e-${n}`,
    reason: "conflict_cycles_exhausted",
    message: "m",
    at: "2026-01-01T00:00:00.000Z",
    entity: `ticket:T-${n}`,
    tool: "tag_ticket",
    agent: "alice",
    runId: "r",
    intentId: `i-${n}`,
    intentKey: `k-${n}`,
    cycles: 3,
    baseVersion: '"v1"',
    change: clipped(change),
    params: clipped({ tag: "x" }),
    current: version === null ? null : { version, state: clipped({ tags: [] }) },
    mayHaveWritten: false,
    status: "open",
    where,
    ...extra,
  };
}

describe("the console page's drafts", () => {
  it("fills a card with the prefill until the operator types: the record's version and the agent's change, whole only", () => {
    const book = new DraftBook();
    expect(book.fields(item(1))).toEqual({ base: '"v4"', delta: clipped(change).json, use: false, message: "", open: false });
    expect(prefill(item(1, null, { change: { json: "[… cut", truncated: true } }))).toEqual({ base: "", delta: "", use: false, message: "", open: false });
  });

  it("keeps what the operator typed by escalation id, over the prefill, and never on another escalation's card", () => {
    const book = new DraftBook();
    const [one, two] = [item(1), item(2)];
    book.edit(one, "delta", "[edited]");
    book.edit(one, "use", true);
    book.edit(one, "message", "checked");
    book.edit(one, "open", true);
    expect(book.fields(one)).toEqual({ base: '"v4"', delta: "[edited]", use: true, message: "checked", open: true });
    // the same escalation as a later update brings it (a new object): the same draft
    expect(book.fields({ ...one, cycles: 3 })).toEqual(book.fields(one));
    expect(book.fields(two)).toEqual(prefill(two));
    expect(book.get("e-2")).toBeUndefined();
    expect(() => book.edit(one, "nonsense" as "message", "x")).toThrow(/no such field/);
  });

  it("a message alone follows no record: the base version keeps following the record shown", () => {
    const book = new DraftBook();
    book.edit(item(1), "message", "hello");
    expect(book.fields(item(1, '"v5"'))).toMatchObject({ base: '"v5"', message: "hello" });
    expect(book.stale(item(1, '"v5"'))).toBeNull();
  });

  it("the change, its box and the base version are kept together with the record they were written against; another record shown marks them, and they stay as typed", () => {
    const book = new DraftBook();
    book.edit(item(1), "delta", "[edited]");
    expect(book.get("e-1")?.pinned).toEqual({ base: '"v4"', delta: "[edited]", use: false, basis: '"v4"' });
    expect(book.stale(item(1))).toBeNull();
    // the record changed under the edit (an owner's answer read it again): kept as typed, on the version it was written against
    const moved = item(1, '"v5"');
    expect(book.stale(moved)).toEqual({ was: '"v4"', now: '"v5"' });
    expect(book.fields(moved)).toMatchObject({ base: '"v4"', delta: "[edited]" });
    // a base version typed pins the change too (the prefill as it was)
    const other = new DraftBook();
    other.edit(item(2), "base", '"v3"');
    expect(other.fields(item(2, '"v9"'))).toMatchObject({ base: '"v3"', delta: clipped(change).json });
    expect(other.stale(item(2, '"v9"'))).toEqual({ was: '"v4"', now: '"v9"' });
    // an escalation shown without a record, then with one
    const unread = new DraftBook();
    unread.edit(item(3, null), "delta", "[x]");
    expect(unread.stale(item(3, '"v1"'))).toEqual({ was: "", now: '"v1"' });
  });

  it("kept: the change stays, to apply on the record shown now; started again: the prefill of the record now, the message kept", () => {
    const book = new DraftBook();
    book.edit(item(1), "delta", "[edited]");
    book.edit(item(1), "message", "checked");
    book.edit(item(2), "delta", "[two]");
    const moved1 = item(1, '"v5"');
    const moved2 = item(2, '"v7"');
    book.keep(moved1);
    expect(book.stale(moved1)).toBeNull();
    expect(book.fields(moved1)).toEqual({ base: '"v5"', delta: "[edited]", use: false, message: "checked", open: false });
    book.reset(moved2);
    expect(book.stale(moved2)).toBeNull();
    expect(book.fields(moved2)).toEqual(prefill(moved2));
    expect(book.get("e-2")).toBeUndefined();
    book.reset(moved1);
    expect(book.fields(moved1)).toEqual({ ...prefill(moved1), message: "checked" });
  });

  it("a draft goes with its escalation: gone from the list, resolved by a decision from this console, or contested; kept while reported resolved by a reply", () => {
    const book = new DraftBook();
    for (const n of [1, 2, 3, 4, 5]) book.edit(item(n), "delta", `[${n}]`);
    const reported = item(2, '"v4"', { status: "resolved", resolution: { outcome: "applied", from: "reply", by: "mallory", at: "2026-01-01T00:00:01.000Z" } });
    const closed = item(3, '"v4"', { status: "resolved", resolution: { outcome: "discarded", from: "console", by: "ops", at: "2026-01-01T00:00:01.000Z" } });
    const contested = item(4, '"v4"', { contested: { where } });
    expect([item(1), reported, closed, contested].map(decidable)).toEqual([true, true, false, false]);
    book.prune([item(1), reported, closed, contested]);
    expect(["e-1", "e-2", "e-3", "e-4", "e-5"].map((id) => book.get(id) !== undefined)).toEqual([true, true, false, false, false]);
    // an escalation that comes back (a new snapshot) has no draft of the dropped one
    expect(book.fields(item(5))).toEqual(prefill(item(5)));
  });
  it("an Apply on the version shown sends the record's own when it is shown otherwise (escaped, cut: rawVersion); a version typed, or kept from a draft, goes as typed", () => {
    const raw = 'W/"v\x85"';
    const shown = 'W/"v\\x85" (sha256 0123456789abcdef)';
    const e = item(1, null, { current: { version: shown, state: clipped({}), rawVersion: raw } });
    // shown escaped in the field, sent as the record's own
    expect(prefill(e).base).toBe(shown);
    expect(baseToSend(e, prefill(e).base)).toBe(raw);
    // kept on the record shown now: the same
    const book = new DraftBook();
    book.edit(item(1), "delta", "[edited]");
    book.keep(e);
    expect(baseToSend(e, book.fields(e).base)).toBe(raw);
    // typed: as typed; a record shown as it is: as shown; none read: as typed
    expect(baseToSend(e, '"v9"')).toBe('"v9"');
    // typed with spaces around: trimmed; a version that itself begins or ends with a space, shown as it is: kept whole
    expect(baseToSend(e, '  "v9" ')).toBe('"v9"');
    const spaced = item(4, " v4 ");
    expect(baseToSend(spaced, prefill(spaced).base)).toBe(" v4 ");
    expect(baseToSend(item(2), '"v4"')).toBe('"v4"');
    expect(baseToSend(item(3, null), '"v1"')).toBe('"v1"');
    expect(baseToSend(undefined, '"v1"')).toBe('"v1"');
  });
});
