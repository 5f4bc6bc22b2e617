// One ownership of an intents partition (a Session) and one fetched intent in
// it (a Slot): the state PartitionOwner (partition-owner.ts) and its commit
// loop (commit-loop.ts) share.
import type { KafkaMessage } from "kafkajs";
import type { PartitionLedger } from "../ledger/ledger-state.ts";
import type { IntentOutcome } from "../metrics/outcome.ts";
import type { Resolution } from "../schemas/resolution.ts";
import type { AdmittedTool } from "../tools.ts";
import type { IntentTrace } from "../tracing/spans.ts";
import type { AdmittedIntent } from "./admission.ts";
import type { Effects } from "./effects.ts";
import type { Plan } from "./intent-pipeline.ts";
import type { LeaseGate } from "./record-leases.ts";
import type { SignedResolution } from "./refusals.ts";
import type { ResolvePlan } from "./resolution.ts";
import type { OutRecord } from "./records.ts";
import type { OwnerProducer, OwnerTransaction } from "./transactions.ts";

/** One fetched intent, from intake until the transaction carrying its result commits. */
export interface Slot {
  readonly seq: number;
  readonly offset: bigint;
  readonly message: KafkaMessage;
  admitted?: AdmittedIntent;
  plan?: Plan;
  /** What its record's lease meant for it when it started. */
  gate?: LeaseGate;
  pendingDurable: boolean;
  /** Unexpected failures so far (not outages). */
  failures: number;
  /** Consecutive outage pauses. */
  outages: number;
  /** Number of the transaction that carries its result; unset until the result is staged. */
  txn?: number;
  /**
   * Its result, once decided, until it is staged. Staging encodes it (the registry) and may fail; a retry stages
   * this again and never runs the intent again: the write it carries may already be at the system of record.
   */
  result?: Effects;
  /** A person's decision on an escalation, instead of an intent (see resolution.ts); `signed`: its bytes, authenticated (refusals.ts). */
  resolution?: { resolution: Resolution; tool: AdmittedTool; entityKey: string; replyTo: string; signed?: SignedResolution; plan?: ResolvePlan };
  /** When it was fetched, started, had its pending entry durable, and was settled (ms; for the debug timeline). */
  times: { accepted: number; started?: number; durable?: number; settled?: number };
  /** Its `writ.process` span, and what its staged result came to (for metrics, at commit). */
  trace?: IntentTrace;
  outcome?: IntentOutcome | null;
}

/** Everything of one ownership of the partition: from a fence-and-restore until a failure, a fence or the release. */
export class Session {
  private static opened = 0;
  /** Numbers the sessions of this process, for the `x-writ-owner` header and logs. */
  readonly seq = ++Session.opened;
  readonly abort = new AbortController();
  readonly tasks = new Set<Promise<void>>();
  readonly producer: OwnerProducer;
  readonly ledger: PartitionLedger;
  /**
   * The partition's open transaction, begun by the first `pending` entry sent
   * into it and ended by the next commit (which adds the results staged since).
   */
  openTxn: OwnerTransaction | null = null;
  /** `pending` entries sent into `openTxn` and not committed yet: work the commit loop must commit soon. */
  inOpenTxn = 0;
  /** When the first of them was acknowledged (ms). */
  openSince = 0;
  /** `pending` entries waiting to be sent into the open transaction, and whether a send of them is queued. */
  toSend: PendingSend[] = [];
  sendQueued = false;
  /** Every Kafka call of the session (sends into the open transaction, commits) runs after the one before. */
  private chain: Promise<unknown> = Promise.resolve();

  constructor(producer: OwnerProducer, ledger: PartitionLedger) {
    this.producer = producer;
    this.ledger = ledger;
  }

  get active(): boolean {
    return !this.abort.signal.aborted;
  }

  /** Runs `call` after every Kafka call of the session before it. */
  serial<T>(call: () => Promise<T>): Promise<T> {
    const done = this.chain.then(call);
    this.chain = done.catch(() => undefined);
    return done;
  }

  /** Takes the open transaction (and its entries) for a commit. */
  takeOpen(): OwnerTransaction | null {
    const open = this.openTxn;
    this.openTxn = null;
    this.inOpenTxn = 0;
    this.openSince = 0;
    return open;
  }
}

/** A `pending` entry waiting to be sent into the open transaction; its intent's write waits for the broker's acknowledgement. */
export interface PendingSend {
  record: OutRecord;
  resolve: () => void;
  reject: (err: Error) => void;
}
