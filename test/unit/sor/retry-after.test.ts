// Retry-After as writ reads it: delta-seconds and IMF-fixdate only; the header is the server's, so anything
// else (negative, fractional, other date formats, lists, oversize) is no wait at all.
import { describe, expect, it } from "vitest";
import { MAX_TIMER_MS } from "../../../src/config.ts";
import { MAX_RETRY_AFTER_LENGTH, parseRetryAfter } from "../../../src/sor/retry-after.ts";

const NOW = Date.parse("2026-03-01T12:00:00.000Z");

describe("parseRetryAfter", () => {
  it("delta-seconds: digits, in ms", () => {
    expect(parseRetryAfter("2", NOW)).toBe(2000);
    expect(parseRetryAfter("0", NOW)).toBe(0);
    expect(parseRetryAfter(" 120 ", NOW)).toBe(120_000);
    expect(parseRetryAfter("007", NOW)).toBe(7000);
  });

  it("an IMF-fixdate: the wait from now", () => {
    expect(parseRetryAfter("Sun, 01 Mar 2026 12:00:05 GMT", NOW)).toBe(5000);
    expect(parseRetryAfter("Sun, 01 Mar 2026 13:00:00 GMT", NOW)).toBe(3_600_000);
  });

  it("a date already past is no wait (0)", () => {
    expect(parseRetryAfter("Sun, 01 Mar 2026 11:59:59 GMT", NOW)).toBe(0);
    expect(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", NOW)).toBe(0);
  });

  it("no header, garbage, negative or fractional numbers, other date forms and lists are ignored", () => {
    for (const value of [null, undefined, "", " ", "-1", "-0", "1.5", "1e3", "0x10", "+5", "soon", "Infinity", "NaN", "2, 3", "5 s",
      // RFC 850 and asctime (obsolete), ISO 8601, and what Date.parse alone would take.
      "Sunday, 01-Mar-26 12:00:05 GMT", "Sun Mar  1 12:00:05 2026", "2026-03-01T12:00:05Z", "2026-03", "March 1, 2026",
      "Sun, 01 Mar 2026 12:00:05 UTC", "Sun, 1 Mar 2026 12:00:05 GMT", "Sun, 01 Mar 2026 12:00:05 GMT, Sun, 01 Mar 2026 12:00:06 GMT"]) {
      expect(parseRetryAfter(value, NOW), String(value)).toBeUndefined();
    }
  });

  it("an oversize value is not parsed at all, whatever it holds", () => {
    expect(parseRetryAfter("1".padStart(MAX_RETRY_AFTER_LENGTH, "0"), NOW)).toBe(1000);
    expect(parseRetryAfter("1".padStart(MAX_RETRY_AFTER_LENGTH + 1, "0"), NOW)).toBeUndefined();
    expect(parseRetryAfter(" ".repeat(100_000) + "1", NOW)).toBeUndefined();
    expect(parseRetryAfter("9".repeat(1_000_000), NOW)).toBeUndefined();
  });

  it("a huge wait is at most Node's longest timer (the owner caps it far lower)", () => {
    expect(parseRetryAfter("9".repeat(60), NOW)).toBe(MAX_TIMER_MS);
    expect(parseRetryAfter("Fri, 31 Dec 9999 23:59:59 GMT", NOW)).toBe(MAX_TIMER_MS);
  });
});
