import { undoIntentKey } from "../keys.ts";
import type { LedgerView } from "../ledger/ledger-state.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";

/** What the ledger says to do with an intent whose key it may already hold (step 2; see docs/architecture.md §3.2). */
export type LedgerVerdict = "write" | "repeat" | "reused";

/** The parts of an incoming intent that the decision depends on. */
export interface AttemptFacts {
  /** sha256 over tool, entity and the non-free-text params. */
  fingerprint: string;
  baseVersion: string;
  /** sha256 over the delta with free-text values blanked. */
  deltaFingerprint: string;
}

/**
 * `write`: go on to pending and the system of record; `repeat`: answer with
 * the stored reply; `reused`: the key came with a different intent (Stripe's
 * rule: reject, write nothing).
 */
export function classifyAttempt(entry: LedgerIntentEntry | undefined, a: AttemptFacts): LedgerVerdict {
  if (!entry) return "write";
  if (entry.fingerprint !== a.fingerprint) return "reused";
  // An earlier owner left it pending: take it up (reconcile first).
  if (entry.status === "pending") return "write";
  const sameAttempt = (x: { baseVersion: string; deltaFingerprint: string }) =>
    x.baseVersion === a.baseVersion && x.deltaFingerprint === a.deltaFingerprint;
  // Any attempt seen before is a repeat: a late retry must not start a new conflict cycle. (A repeat of a conflict
  // that finds the record at its own base version is written after all: IntentPipeline.repeatConflict.)
  if (entry.attempts.some(sameAttempt)) return "repeat";
  // After a conflict, a new base version or delta is the agent deciding again.
  if (entry.status === "conflicted") return "write";
  // Settled: a retry built from a fresh read (new base, so maybe a new delta) is the same intent again;
  // another delta from a base already used is the key reused for a different change.
  return entry.attempts.some((x) => x.baseVersion === a.baseVersion) ? "reused" : "repeat";
}

/**
 * Whether a request of this intent key may have reached the system of record, and may still arrive there: an
 * earlier owner left the key `pending` (it may have sent its PATCH and stopped), or the key's last attempt was
 * answered `conflict` after a request whose outcome was unknown (its stored outcome marked `mayHaveWritten`). The
 * key's next write then reconciles first, and goes on the record as that reconcile read it (docs/architecture.md §3.8).
 */
export function mayHaveWritten(entry: LedgerIntentEntry | undefined): boolean {
  if (entry?.status === "pending") return true;
  return entry?.status === "conflicted" && entry.outcome?.status === "conflict" && entry.outcome.mayHaveWritten === true;
}

/**
 * The intent key of the applied undo of `intent`, a repeat whose key's `entry` settled it `applied`, if its record's
 * ledger holds one (an undo of a record is on the same partition); never for an undo itself. Asked only when a repeat
 * is answered from the key's entry: a change compensated before and run again by a client that does not remember it
 * must hear that the step no longer stands (docs/architecture.md §10).
 */
export function appliedUndoOf(ledger: LedgerView, intent: { intentKey: string; undo?: unknown }, entry: LedgerIntentEntry): string | undefined {
  if (entry.outcome?.status !== "applied" || intent.undo || entry.undoOf !== undefined) return undefined;
  const key = intent.intentKey;
  const undoKey = undoIntentKey(key);
  const undo = ledger.get(undoKey);
  return undo?.undoOf === key && undo.status === "done" && undo.outcome?.status === "applied" ? undoKey : undefined;
}
