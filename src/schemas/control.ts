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
