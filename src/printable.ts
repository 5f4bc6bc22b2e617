// Text from Kafka records (entity ids, keys, messages that quote an attacker's field names) and from the
// brokers (transactional ids, errors) is hostile once it reaches an operator's terminal: ESC and OSC
// sequences clear the screen, fake lines, set the title or write the clipboard (OSC 52), and bidi
// overrides reorder what is shown. Human-readable output passes it through here first.

/**
 * C0 and C1 controls (ESC, CSI 0x9b, OSC 0x9d, CR, LF …), DEL, the bidi embeddings/overrides and isolates, and a
 * lone surrogate (no character: shown as U+FFFD, and refused by encodeURIComponent).
 */
const UNPRINTABLE = /[\x00-\x1f\x7f-\x9f\u202a-\u202e\u2066-\u2069]|[\ud800-\udbff](?![\udc00-\udfff])|(?<![\ud800-\udbff])[\udc00-\udfff]/g;

/** `s` with every control and bidi override shown as a visible escape (`\x1b`, `\u202e`), never acted on. */
export function printable(s: string): string {
  return s.replace(UNPRINTABLE, (c) => {
    const n = c.charCodeAt(0);
    return n <= 0xff ? `\\x${n.toString(16).padStart(2, "0")}` : `\\u${n.toString(16)}`;
  });
}

/** Characters JSON.stringify leaves raw that a terminal may still act on: DEL, the C1 controls, bidi overrides. */
const JSON_UNSAFE = /[\x7f-\x9f\u202a-\u202e\u2066-\u2069]/g;

/**
 * JSON text with those written as \u escapes (inside its strings, the only place they can be): the same value, safe
 * on a terminal and in a page (the console's values, src/console/state.ts).
 */
export const jsonSafe = (json: string): string => json.replace(JSON_UNSAFE, (c) => `\\u${c.charCodeAt(0).toString(16).padStart(4, "0")}`);

/**
 * `value` as one line of JSON that is also safe on a terminal: JSON.stringify escapes the C0 controls but not
 * the C1 ones (0x9b is a CSI where it is honoured) nor bidi overrides; they are written as \u escapes, which
 * parse to the same value.
 */
export function jsonLine(value: unknown): string {
  return jsonSafe(JSON.stringify(value));
}
