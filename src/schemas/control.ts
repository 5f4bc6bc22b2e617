/**
 * Control records: what writ writes to a topic that is not a value of its
 * schema. Every reader of writ's topics (the client, the tools, clients in
 * other languages; see the wire contract in the README) skips a record that
 * carries {@link CONTROL_HEADER}, whatever its value.
 *
 * `heal`: a record with the key `__writ_heal__` and a null value that an owner
 * writes to a partition in one of its transactions, so that the transaction's
 * commit marker also closes a transaction its transactional id left open there
 * (see `healTargets` in `src/owner/partition-restore.ts`). On the compacted
 * ledger it is a tombstone of a key no entry has.
 */
export const CONTROL_HEADER = "writ-control";
export type ControlKind = "heal";

/** True when a record's headers mark it as a control record. */
export function isControlRecord(headers: Record<string, unknown> | undefined): boolean {
  return headers !== undefined && headers[CONTROL_HEADER] !== undefined;
}

/** Key of heal records: the ledger is compacted, and a compacted topic refuses a record without a key. */
export const HEAL_KEY = "__writ_heal__";

/**
 * True for a heal record exactly: key {@link HEAL_KEY}, a null value, and
 * {@link CONTROL_HEADER} `heal` (one header, not a list). On the intents
 * topic only this shape is skipped: it carries nothing to answer or lose;
 * any record with a value is an intent to admit, whatever its headers say.
 */
export function isHealRecord(message: { key?: Buffer | string | null; value?: Buffer | string | null; headers?: Record<string, unknown> }): boolean {
  if (message.value !== null && message.value !== undefined) return false;
  const key = message.key;
  if (key === null || key === undefined || key.length !== HEAL_KEY.length || key.toString() !== HEAL_KEY) return false;
  const header = message.headers?.[CONTROL_HEADER];
  return (typeof header === "string" || Buffer.isBuffer(header)) && header.length === 4 && header.toString() === "heal";
}
