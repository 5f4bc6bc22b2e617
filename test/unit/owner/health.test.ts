import pino from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { HealthBoard, OUTAGE_LISTED_MS } from "../../../src/owner/health.ts";

const T0 = new Date("2025-06-01T12:00:00.000Z").getTime();
let lines: { level: number; msg: string; system?: string }[];
let board: HealthBoard;

beforeEach(() => {
  vi.useFakeTimers({ toFake: ["Date"], now: T0 });
  lines = [];
  board = new HealthBoard(pino({ level: "info" }, { write: (line: string) => void lines.push(JSON.parse(line)) }));
});
afterEach(() => vi.useRealTimers());

const at = (ms: number) => vi.setSystemTime(T0 + ms);
const iso = (ms: number) => new Date(T0 + ms).toISOString();

describe("HealthBoard outages", () => {
  it("say since when a system has been out and when it was last seen out, and when it answered again", () => {
    board.outage("billing", "timeout");
    at(5_000);
    board.outage("billing", "503");
    expect(board.health().outages).toEqual([{ system: "billing", reason: "503", since: iso(0), lastSeenAt: iso(5_000) }]);
    at(7_000);
    board.answered("billing");
    // still listed (by design, a minute after it was last seen), now with when it answered
    at(5_000 + OUTAGE_LISTED_MS);
    expect(board.health().outages).toEqual([{ system: "billing", reason: "503", since: iso(0), lastSeenAt: iso(5_000), answeredAt: iso(7_000) }]);
    at(5_001 + OUTAGE_LISTED_MS);
    expect(board.health().outages).toEqual([]);
    expect(board.health().ok).toBe(true);
  });

  it("log the start once (warn) and the end once (info)", () => {
    board.outage("billing", "timeout");
    board.outage("billing", "timeout");
    at(1_000);
    board.answered("billing");
    board.answered("billing");
    board.answered("helpdesk"); // never out: nothing to say
    expect(lines.map((l) => [l.level, l.system, l.msg.split(";")[0]])).toEqual([
      [40, "billing", "system of record unavailable"],
      [30, "billing", "system of record answers again after an outage"],
    ]);
    expect(lines[1]).toMatchObject({ since: iso(0), outageMs: 1_000 });
    // out again after it answered: a new outage, said again
    at(2_000);
    board.outage("billing", "reset");
    expect(lines).toHaveLength(3);
    expect(board.health().outages).toEqual([{ system: "billing", reason: "reset", since: iso(2_000), lastSeenAt: iso(2_000) }]);
  });
});
