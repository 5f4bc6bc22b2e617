// Retry-After (RFC 9110 §10.2.3) of a system of record's 429, 503 or other
// outage answer: how long it asked to be left alone. The header comes from
// the other side, so anything but the forms below is ignored.
import { MAX_TIMER_MS } from "../config.ts";

/** Longest header value looked at: every form fits in 32 characters; a longer one is not parsed at all. */
export const MAX_RETRY_AFTER_LENGTH = 64;

const MONTHS = ["Jan", "Feb", "Mar", "Apr", "May", "Jun", "Jul", "Aug", "Sep", "Oct", "Nov", "Dec"];
const MONTH = `(${MONTHS.join("|")})`;
const TIME = "(\\d{2}):(\\d{2}):(\\d{2})";

/**
 * The three HTTP-date forms a recipient must accept (RFC 9110 §5.6.7), each
 * matched whole before any field is read (Date.parse alone takes almost anything):
 * - IMF-fixdate, `Sun, 06 Nov 1994 08:49:37 GMT`;
 * - the obsolete RFC 850 form, `Sunday, 06-Nov-94 08:49:37 GMT` (two-digit year);
 * - ANSI C's asctime, `Sun Nov  6 08:49:37 1994` (the day padded with a space).
 */
const IMF_FIXDATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), (\\d{2}) ${MONTH} (\\d{4}) ${TIME} GMT$`);
const RFC850_DATE = new RegExp(`^(?:Monday|Tuesday|Wednesday|Thursday|Friday|Saturday|Sunday), (\\d{2})-${MONTH}-(\\d{2}) ${TIME} GMT$`);
const ASCTIME_DATE = new RegExp(`^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun) ${MONTH} ([ \\d]\\d) ${TIME} (\\d{4})$`);

/**
 * RFC 9110 §5.6.7: a two-digit year that appears more than 50 years in the
 * future is the most recent year in the past with the same last two digits.
 */
function fullYear(twoDigits: number, nowMs: number): number {
  const nowYear = new Date(nowMs).getUTCFullYear();
  let year = nowYear - (nowYear % 100) + twoDigits;
  if (year > nowYear + 50) year -= 100;
  return year;
}

/** The instant of an HTTP-date's fields, or undefined when a field is out of range (31 Feb, 24:00:00). */
function instant(year: number, month: string, day: number, hh: number, mm: number, ss: number): number | undefined {
  const m = MONTHS.indexOf(month);
  // Second 60 is a leap second (RFC 9110 §5.6.7 allows it); Date.UTC carries it into the next minute.
  if (m < 0 || day < 1 || day > 31 || hh > 23 || mm > 59 || ss > 60) return undefined;
  const at = Date.UTC(year, m, day, hh, mm, ss);
  const check = new Date(Date.UTC(year, m, day));
  // Date.UTC maps years 0-99 to 1900-1999, and rolls 31 Feb over into March: both are refused here.
  if (check.getUTCFullYear() !== year || check.getUTCMonth() !== m || check.getUTCDate() !== day) return undefined;
  return at;
}

/** The instant an HTTP-date names, in ms since the epoch, or undefined for anything that is not one. */
export function parseHttpDate(text: string, nowMs: number): number | undefined {
  let f = IMF_FIXDATE.exec(text);
  if (f) return instant(Number(f[3]), f[2]!, Number(f[1]), Number(f[4]), Number(f[5]), Number(f[6]));
  f = RFC850_DATE.exec(text);
  if (f) return instant(fullYear(Number(f[3]), nowMs), f[2]!, Number(f[1]), Number(f[4]), Number(f[5]), Number(f[6]));
  f = ASCTIME_DATE.exec(text);
  if (f) return instant(Number(f[6]), f[1]!, Number(f[2]!.trim()), Number(f[3]), Number(f[4]), Number(f[5]));
  return undefined;
}

/**
 * The wait a Retry-After value asks for, in ms from `nowMs`: delta-seconds
 * (digits only), or an HTTP-date in any of its three forms (a date already
 * past is 0). Undefined for no header or anything else (negative, fractional,
 * ISO 8601 or other date formats, a list, over {@link MAX_RETRY_AFTER_LENGTH}
 * characters). At most Node's longest timer; the owner caps it far lower
 * (`sorRetryAfterMaxMs`).
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined || value.length > MAX_RETRY_AFTER_LENGTH) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1000, MAX_TIMER_MS);
  const at = parseHttpDate(text, nowMs);
  if (at === undefined) return undefined;
  return Math.min(Math.max(0, at - nowMs), MAX_TIMER_MS);
}
