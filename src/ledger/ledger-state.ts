import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";

export type LedgerStatus = LedgerIntentEntry["status"];

/**
 * The intent-key lifecycle as a transition table (the shape of kafkajs's
 * transactionStateMachine): absent → pending → conflicted ↺ pending → done.
 * `pending → pending` is a new owner taking up an attempt an earlier one left.
 */
export const LEDGER_TRANSITIONS: Readonly<Record<LedgerStatus | "absent", readonly LedgerStatus[]>> = {
  absent: ["pending"],
  pending: ["pending", "conflicted", "done"],
  conflicted: ["pending", "done"],
  done: [],
};

export function assertTransition(key: string, from: LedgerStatus | "absent", to: LedgerStatus): void {
  if (!LEDGER_TRANSITIONS[from].includes(to)) {
    throw new Error(`ledger: intent key ${key} cannot go from ${from} to ${to}`);
  }
}

/** A change staged in a batch: an entry to write, or a tombstone (null). */
export type StagedChange = LedgerIntentEntry | null;

/** Read-only view of one ledger partition: what everyone but the owner gets. */
export interface LedgerView {
  get(intentKey: string): LedgerIntentEntry | undefined;
  readonly size: number;
}

/**
 * The owner's handle on a partition's ledger for one transaction: reads see
 * staged changes first; nothing reaches the committed view until the Kafka
 * transaction that carries the changes has committed.
 */
export class LedgerTransaction implements LedgerView {
  private readonly staged = new Map<string, StagedChange>();
  private readonly base: PartitionLedger;

  constructor(base: PartitionLedger) {
    this.base = base;
  }

  get(intentKey: string): LedgerIntentEntry | undefined {
    if (this.staged.has(intentKey)) return this.staged.get(intentKey) ?? undefined;
    return this.base.get(intentKey);
  }

  get size(): number {
    return this.base.size;
  }

  put(entry: LedgerIntentEntry): void {
    assertTransition(entry.intentKey, this.get(entry.intentKey)?.status ?? "absent", entry.status);
    this.staged.set(entry.intentKey, entry);
  }

  tombstone(intentKey: string): void {
    this.staged.set(intentKey, null);
  }

  /** The staged changes, in key order of first staging. */
  changes(): [string, StagedChange][] {
    return [...this.staged.entries()];
  }

  get empty(): boolean {
    return this.staged.size === 0;
  }

  /** Call only after the Kafka transaction committed. */
  commit(): void {
    for (const [key, change] of this.staged) this.base.applyOwn(key, change);
    this.staged.clear();
  }
}

/**
 * The ledger of one intents partition as this process knows it. `following`:
 * the restore reader applies every entry it reads; `owned`: this process is
 * the partition's single writer, so only its own committed transactions
 * change the view.
 */
export class PartitionLedger implements LedgerView {
  readonly partition: number;
  private readonly entries = new Map<string, LedgerIntentEntry>();
  private mode: "following" | "owned" = "following";

  constructor(partition: number) {
    this.partition = partition;
  }

  get(intentKey: string): LedgerIntentEntry | undefined {
    return this.entries.get(intentKey);
  }

  get size(): number {
    return this.entries.size;
  }

  get owned(): boolean {
    return this.mode === "owned";
  }

  /** From the restore reader; ignored while owned, since the owner's own writes are newer. */
  applyRead(intentKey: string, entry: LedgerIntentEntry | null): void {
    if (this.mode === "owned") return;
    if (entry === null) this.entries.delete(intentKey);
    else this.entries.set(intentKey, entry);
  }

  applyOwn(intentKey: string, entry: StagedChange): void {
    if (entry === null) this.entries.delete(intentKey);
    else this.entries.set(intentKey, entry);
  }

  own(): void {
    this.mode = "owned";
  }

  release(): void {
    this.mode = "following";
  }

  begin(): LedgerTransaction {
    return new LedgerTransaction(this);
  }

  /** Keys whose last change is older than `cutoff`: due for a tombstone. */
  expired(cutoff: Date, limit: number): string[] {
    const out: string[] = [];
    const cut = cutoff.getTime();
    for (const [key, entry] of this.entries) {
      if (Date.parse(entry.updatedAt) < cut) out.push(key);
      if (out.length >= limit) break;
    }
    return out;
  }
}
