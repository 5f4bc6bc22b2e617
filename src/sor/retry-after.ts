// Retry-After (RFC 9110 §10.2.3) of a system of record's 429, 503 or other
// outage answer: how long it asked to be left alone. The header comes from
// the other side, so anything but the two forms below is ignored.
import { MAX_TIMER_MS } from "../config.ts";

/** Longest header value looked at: either form fits in 29 characters; a longer one is not parsed at all. */
export const MAX_RETRY_AFTER_LENGTH = 64;

/** RFC 9110 §5.6.7 IMF-fixdate, e.g. `Sun, 06 Nov 1994 08:49:37 GMT` (Date.parse alone takes almost anything). */
const IMF_FIXDATE = /^(?:Mon|Tue|Wed|Thu|Fri|Sat|Sun), \d{2} (?:Jan|Feb|Mar|Apr|May|Jun|Jul|Aug|Sep|Oct|Nov|Dec) \d{4} \d{2}:\d{2}:\d{2} GMT$/;

/**
 * The wait a Retry-After value asks for, in ms from `nowMs`: delta-seconds
 * (digits only), or an IMF-fixdate (a date already past is 0). Undefined for
 * no header or anything else (negative, fractional, another date format, a
 * list, over {@link MAX_RETRY_AFTER_LENGTH} characters). At most Node's
 * longest timer; the owner caps it far lower (`sorRetryAfterMaxMs`).
 */
export function parseRetryAfter(value: string | null | undefined, nowMs: number): number | undefined {
  if (value === null || value === undefined || value.length > MAX_RETRY_AFTER_LENGTH) return undefined;
  const text = value.trim();
  if (/^\d+$/.test(text)) return Math.min(Number(text) * 1000, MAX_TIMER_MS);
  if (!IMF_FIXDATE.test(text)) return undefined;
  const at = Date.parse(text);
  if (Number.isNaN(at)) return undefined;
  return Math.min(Math.max(0, at - nowMs), MAX_TIMER_MS);
}
