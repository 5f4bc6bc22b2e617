// Retry-After as writ reads it: delta-seconds and the three HTTP-date forms of RFC 9110 §5.6.7 (IMF-fixdate,
// RFC 850, asctime); the header is the server's, so anything else (negative, fractional, other date formats,
// out-of-range fields, lists, oversize) is no wait at all.
import { describe, expect, it } from "vitest";
import { MAX_TIMER_MS } from "../../../src/config.ts";
import { MAX_RETRY_AFTER_LENGTH, parseHttpDate, parseRetryAfter } from "../../../src/sor/retry-after.ts";

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

  it("the obsolete forms a recipient must accept too: RFC 850 and asctime", () => {
    expect(parseRetryAfter("Sunday, 01-Mar-26 12:00:05 GMT", NOW)).toBe(5000);
    expect(parseRetryAfter("Sun Mar  1 12:00:05 2026", NOW)).toBe(5000);
    expect(parseRetryAfter("Sun Mar 01 12:00:05 2026", NOW)).toBe(5000);
    expect(parseRetryAfter("Sun Mar 15 12:00:00 2026", NOW)).toBe(14 * 86_400_000);
    // RFC 9110's own examples name one instant.
    const rfc = Date.parse("1994-11-06T08:49:37Z");
    for (const d of ["Sun, 06 Nov 1994 08:49:37 GMT", "Sunday, 06-Nov-94 08:49:37 GMT", "Sun Nov  6 08:49:37 1994"]) expect(parseHttpDate(d, NOW), d).toBe(rfc);
  });

  it("an RFC 850 two-digit year more than 50 years ahead is the most recent past year with those digits", () => {
    expect(parseHttpDate("Monday, 01-Jan-76 00:00:00 GMT", NOW)).toBe(Date.UTC(2076, 0, 1)); // 50 years ahead: kept
    expect(parseHttpDate("Friday, 01-Jan-77 00:00:00 GMT", NOW)).toBe(Date.UTC(1977, 0, 1)); // 51: a century back
    expect(parseHttpDate("Saturday, 01-Jan-00 00:00:00 GMT", NOW)).toBe(Date.UTC(2000, 0, 1));
    expect(parseHttpDate("Sunday, 06-Nov-94 08:49:37 GMT", Date.UTC(1994, 10, 6))).toBe(Date.parse("1994-11-06T08:49:37Z"));
  });

  it("fields out of range are no date, in every form", () => {
    for (const value of ["Sun, 31 Feb 2026 12:00:00 GMT", "Sun, 00 Mar 2026 12:00:00 GMT", "Sun, 01 Mar 2026 24:00:00 GMT", "Sun, 01 Mar 2026 12:60:00 GMT",
      "Sun, 01 Mar 2026 12:00:61 GMT", "Sunday, 31-Feb-26 12:00:00 GMT", "Sun Feb 30 12:00:00 2026", "Sun Mar  0 12:00:00 2026", "Sun, 01 Mar 0099 12:00:00 GMT"]) {
      expect(parseRetryAfter(value, NOW), value).toBeUndefined();
    }
    // A leap second is allowed: it is the next minute's first.
    expect(parseRetryAfter("Sun, 01 Mar 2026 12:00:60 GMT", NOW)).toBe(60_000);
  });

  it("a date already past is no wait (0)", () => {
    expect(parseRetryAfter("Sun, 01 Mar 2026 11:59:59 GMT", NOW)).toBe(0);
    expect(parseRetryAfter("Sun, 06 Nov 1994 08:49:37 GMT", NOW)).toBe(0);
  });

  it("no header, garbage, negative or fractional numbers, other date forms and lists are ignored", () => {
    for (const value of [null, undefined, "", " ", "-1", "-0", "1.5", "1e3", "0x10", "+5", "soon", "Infinity", "NaN", "2, 3", "5 s",
      // Near misses of the three forms (a short weekday in RFC 850, a long one elsewhere, a lower-case month, a
      // three-digit year, no GMT, a one-digit day unpadded), ISO 8601, and what Date.parse alone would take.
      "Sun, 01-Mar-26 12:00:05 GMT", "Sunday, 01 Mar 2026 12:00:05 GMT", "Sunday Mar  1 12:00:05 2026", "Sun, 01 mar 2026 12:00:05 GMT",
      "Sunday, 01-Mar-026 12:00:05 GMT", "Sunday, 01-Mar-26 12:00:05", "Sun Mar 1 12:00:05 2026", "Sun Mar  1 12:00:05 2026 GMT",
      "2026-03-01T12:00:05Z", "2026-03", "March 1, 2026",
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
