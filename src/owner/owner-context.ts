import type { Admin, Kafka } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import type { WritError } from "../errors.ts";
import type { LedgerReader } from "../ledger/ledger-reader.ts";
import type { IntentOutcome } from "../metrics/outcome.ts";
import type { Logger } from "../logger.ts";
import type { AdmissionDeps, AdmittedIntent } from "./admission.ts";
import type { HealthBoard } from "./health.ts";
import type { IntentPipeline } from "./intent-pipeline.ts";
import type { RecordEncoder } from "./records.ts";
import type { OwnerGroupsLook } from "./single-writer.ts";
import type { TopicDirectory } from "./topic-directory.ts";

/** The fetch side, as a partition owner steers it: pause, resume and rewind its partition. */
export interface Intake {
  pause(partition: number): void;
  resume(partition: number): void;
  /** The next fetch of `partition` starts at `offset`; batches fetched before are dropped as stale. */
  seek(partition: number, offset: string): void;
}

/** What the router hands each partition owner: shared, process-wide parts. */
export interface OwnerContext {
  kafka: Kafka;
  admin: Admin;
  config: RouterConfig;
  codec: WireCodec;
  encoder: RecordEncoder;
  /** Restores ledger partitions (read_committed). */
  reader: LedgerReader;
  /** Scans them read_uncommitted after each restore, for `pending` entries of aborted transactions. */
  inDoubtReader: LedgerReader;
  pipeline: IntentPipeline;
  admission: AdmissionDeps;
  topicDirectory: TopicDirectory;
  intake: Intake;
  /** Whether this process still holds its group membership (its last heartbeat is recent): no write leaves otherwise. */
  lease: { confirmed(): boolean };
  health: HealthBoard;
  /**
   * Another producer of this partition's transactional id fenced this owner.
   * The router drops it, and builds a new one if the group still assigns the
   * partition here: the fencer may be an owner that was already leaving.
   */
  onFenced(partition: number): void;
  /** Test seams of the fault suite (see RouterInternals); never set in production. */
  hooks?: {
    /**
     * Runs after a transaction's records and offsets were sent and before its commit: holds the commit. `topics`:
     * the topics it wrote; `offset`: whether it carries the group's consumed offset.
     */
    beforeCommit?(info: { partition: number; topics: string[]; offset: boolean }): Promise<void>;
  };
  /** Ablation control (fault suite only): leases are granted to whoever asks and refuse nothing. */
  ablateLeases?: boolean;
  /** Ablation control (fault suite only): a restore skips the scan for `pending` entries of aborted transactions. */
  ablateInDoubtScan?: boolean;
  /** Ablation control (tests only): a restore takes a ledger partition whatever other group still writes it, or consumes its intents topic. */
  ablateSingleWriter?: boolean;
  /** Ablation control (tests only): a restore skips the take-up check (other groups of owners on the intents topic), not the ledger's. */
  ablateTakeUp?: boolean;
  /**
   * Other groups of owners of this intents topic, for the take-up check of a restore (single-writer.ts, checkTakeUp):
   * memoized briefly and per join, so that the partitions one rebalance assigns share one look.
   */
  ownerGroups(): Promise<OwnerGroupsLook>;
  /**
   * Whether this process holds its partitions (the watch found another group of owners on its intents topic): its
   * owners admit and start no new intent; those in flight finish. Unset: never.
   */
  holding?(): boolean;
  /** A partition's open found the configuration wrong (another group of owners on its intents topic): the process stops. */
  onConfigInvalid?(err: WritError): void;
  observe?: {
    forwarded?(partition: number): void;
    /** A record's lease expired and was released (its change did not end in time). */
    leaseExpired?(partition: number, recordType: string): void;
    /** A lease acquire refused by a bound: its agent at its lease limit, its change past the longest hold, or its agent in the cool-down after it. */
    leaseRefused?(partition: number, reason: "lease_limit" | "lease_hold_exceeded" | "lease_cooldown"): void;
    /** A refusal of signed bytes staged to be remembered for them (refusals.ts), by its reason. */
    refusalRemembered?(partition: number, reason: string): void;
    /** The partition was taken up and runs (ms: fence, marker, ledger restore, heal). */
    opened?(partition: number, ms: number): void;
    /** A transaction carrying these intents' results committed (ms: from its begin to its commit). */
    committed?(partition: number, ms: number, outcomes: readonly IntentOutcome[]): void;
  };
  log: Logger;
}
