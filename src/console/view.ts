// What the console shows, as the page receives it: the snapshot's sections and their items, the bounds the
// console keeps to, and why an escalation may not be resolved from the page. The state that fills them is
// state.ts (which re-exports this module).
import type { AclCheck } from "../doctor/acls.ts";
import type { Reply } from "../schemas/reply.ts";

/** Where a record was read. */
export interface RecordRef {
  topic: string;
  partition: number;
  offset: string;
}

export interface ConsoleLimits {
  /** Items kept per recent list (replies, conflicts, dead letters) and shown of the intents in flight. */
  recent: number;
  /** Intents in flight tracked at most (the oldest are dropped, and counted). */
  inFlight: number;
  /** Escalations kept at most (resolved ones are dropped first; then new open ones are not kept, and counted). */
  escalations: number;
  /** Characters of JSON kept per record state, change or params (longer ones are cut, and say so). */
  valueChars: number;
  /** Characters kept of a message or reason read from a record (longer ones are cut, and say so). */
  textChars: number;
  /**
   * Characters of JSON kept of an open escalation's intent, for resolving it (the owners' maxIntentBytes: a
   * larger intent was never admitted, and its resolution would be refused as too large anyway).
   */
  intentChars: number;
}

export const DEFAULT_LIMITS: ConsoleLimits = { recent: 100, inFlight: 2000, escalations: 500, valueChars: 4000, textChars: 2000, intentChars: 262_144 };

/**
 * Characters an id, name, entity, version or key read from a record is shown in at most, escapes counted. One cut,
 * or shown otherwise than it is, keeps a digest of the whole, so two ids never show as one (ConsoleState.name).
 */
export const NAME_CHARS = 200;

/**
 * A record as an owner read it, as the page shows it: its version as shown (escaped and bounded as an id is), and
 * `rawVersion`, the version itself, when that differs (an escaped or cut one): what the page sends back as the base
 * version of an Apply on it, never shown.
 */
export interface RecordShown {
  version: string;
  state: Clipped;
  rawVersion?: string;
}

/** JSON text, cut at `valueChars` (escaped first, then cut on a whole escape). */
export interface Clipped {
  json: string;
  truncated: boolean;
}

export interface InFlightItem {
  kind: "intent" | "resolution";
  /** The intent id (a resolution: its resolution id, which its answer is keyed by). */
  intentId: string;
  intentKey: string;
  entity: string;
  tool: string;
  /** The agent (a resolution: the operator). */
  agent: string;
  runId: string | null;
  baseVersion: string | null;
  /** A resolution's decision. */
  decision?: string;
  createdAt: string;
  where: RecordRef;
}

export interface ReplyItem {
  intentId: string;
  intentKey: string;
  status: Reply["status"];
  duplicate: boolean;
  at: string;
  entity: string | null;
  tool: string | null;
  agent: string | null;
  /** True when the agent is the reply topic's suffix, not read from the intent. */
  agentFromTopic: boolean;
  version?: string;
  via?: string;
  cycle?: number;
  reason?: string;
  message?: string;
  escalationId?: string;
  resolvedBy?: string;
  where: RecordRef;
}

export interface ConflictItem {
  intentId: string;
  intentKey: string;
  at: string;
  entity: string;
  tool: string | null;
  agent: string | null;
  cycle: number;
  message: string;
  /** The version the agent wrote from (from its intent, when the console saw it). */
  baseVersion: string | null;
  current: { version: string; state: Clipped };
  yourChange: Clipped;
  where: RecordRef;
}

export interface ResolutionOutcome {
  /** applied, discarded, returned: the escalation is closed; not_open: an owner said it is not open (any more). */
  outcome: "applied" | "discarded" | "returned" | "not_open";
  /**
   * console: the owner's answer to a decision this console sent (final: the page refuses another). reply: read
   * on a reply topic, which any producer can write: reported only, the operator may still decide (the owner
   * answers resolution_not_applicable when it really is closed).
   */
  from: "console" | "reply";
  by: string | null;
  at: string;
  message?: string;
  version?: string;
}

export interface EscalationItem {
  escalationId: string;
  reason: string;
  message: string;
  at: string;
  entity: string;
  tool: string;
  agent: string;
  runId: string;
  intentId: string;
  intentKey: string;
  cycles: number;
  /** The version the agent's intent was made from. */
  baseVersion: string;
  change: Clipped;
  params: Clipped;
  /** The record as the owner last read it, when it could. */
  current: RecordShown | null;
  /** The escalated write may have reached the system of record already (the escalation says so). */
  mayHaveWritten: boolean;
  status: "open" | "resolved";
  resolution?: ResolutionOutcome;
  /** The last decision sent on it that did not close it (e.g. a resolution_conflict). */
  lastAttempt?: { decision: string; by: string | null; at: string; status: string; reason?: string; message?: string };
  /**
   * Another record on writ.human claims this escalation id with a different intent, reason or message (where
   * it was read): one of them is forged, and the page refuses to resolve it (the ledger decides: `writ
   * escalations list`, `writ escalations resolve`).
   */
  contested?: { where: RecordRef };
  where: RecordRef;
}

export interface DeadLetterItem {
  reason: string;
  message: string;
  at: string;
  key: string | null;
  source: RecordRef;
  originalBytes: number;
  truncated: boolean;
  sha256: string;
  where: RecordRef;
  /**
   * Where on the intents topic it was sent back (by the console or `writ dlq redrive`), or null: the first
   * record read there whose writ-redriven-from header names this dead letter and whose key and value are its
   * own (the header alone is any producer's to set).
   */
  sentBack: RecordRef | null;
}

/** What a record sent back from a dead letter says of it (src/dlq-redrive.ts `redrivenFrom`). */
export interface SentBackFrom {
  partition: number;
  offset: string;
  key: string | null;
  sha256: string;
}

export interface LagPartition {
  partition: number;
  /** The owners' committed offset; null when the group has none for the partition. */
  committed: string | null;
  /** High watermark. */
  end: string;
  lastStable: string;
  logStart: string;
  /** end minus committed (minus the log start without a committed offset). */
  lag: number;
}

export interface LagView {
  group: string;
  topic: string;
  at: string;
  partitions: LagPartition[];
  total: number;
  error?: string;
}

export interface Counts {
  applied: number;
  conflict: number;
  rejected: number;
  escalated: number;
  duplicate: number;
  intents: number;
  resolutions: number;
  deadLetters: number;
  escalationsOpen: number;
  escalationsResolved: number;
  /** Open escalations not kept because the list was full of open ones (`writ escalations list` shows them). */
  escalationsDropped: number;
  inFlight: number;
  /** Intents dropped from the in-flight list because it was full. */
  inFlightDropped: number;
  /** Records that did not decode (they are in writ.dlq when they were intents). */
  undecodable: number;
  /** writ.human records not kept: their Kafka key is not their intent's entity key (an owner writes it so; forged). */
  escalationsMiskeyed: number;
  /** Strings read from records that were cut to the console's bounds. */
  cut: number;
}

export interface ConsoleTopics {
  intents: string;
  human: string;
  dlq: string;
  replyPrefix: string;
  /** The reply topics found so far. */
  replies: string[];
}

export interface ConsoleSnapshot {
  at: string;
  topics: ConsoleTopics;
  counts: Counts;
  inFlight: InFlightItem[];
  replies: ReplyItem[];
  conflicts: ConflictItem[];
  escalations: EscalationItem[];
  deadLetters: DeadLetterItem[];
  lag: LagView | null;
  /**
   * Who may write the trusted topics (writ.ledger, writ.human, writ.dlq, the reply topics), checked at the
   * console's start as `writ doctor` does (src/doctor/acls.ts); null until then.
   */
  trust: AclCheck | null;
}

export type Section = Exclude<keyof ConsoleSnapshot, "at">;

/** Where an escalation's record was read on writ.human, `partition:offset`: its place in an update's `order`. */
export const escalationPlace = (e: Pick<EscalationItem, "where">): string => `${e.where.partition}:${e.where.offset}`;

/** What may change of an escalation once it is listed. */
export type EscalationStatus = Pick<EscalationItem, "where" | "status" | "resolution" | "lastAttempt" | "contested">;

/**
 * What an update says of the escalations, in place of the whole list (the snapshot has it): hostile records can
 * fill the list with hundreds of escalations of several kilobytes each, and a record that changes one of them (a
 * reply, one more escalation) must not cost every open page the whole list again. So for the recent lists
 * (RecentChanges).
 */
export interface EscalationChanges {
  /** Every escalation kept, in the page's order (open oldest first, then resolved newest first), by `escalationPlace`. */
  order: string[];
  /** Escalations new to the list, or whose record shown changed (an owner's answer to this console): whole. */
  added: EscalationItem[];
  /** Escalations listed before whose status, outcome, last decision or contest changed: those fields. */
  changed: EscalationStatus[];
}

/**
 * What an update says of a recent list (replies, conflicts, dead letters), in place of the list: the items read
 * since, newest first (the page puts them in front of the ones it has, and keeps `limits.recent`); of the dead
 * letters also the ones marked sent back since.
 */
export interface RecentChanges<T> {
  added: T[];
}
export interface DeadLetterChanges extends RecentChanges<DeadLetterItem> {
  sentBack: Pick<DeadLetterItem, "where" | "sentBack">[];
}

/** The sections changed since the last update; the escalations and the recent lists as what changed of them. */
export type ConsoleChanges = Partial<Omit<ConsoleSnapshot, "escalations" | "replies" | "conflicts" | "deadLetters">> & {
  at: string;
  escalationChanges?: EscalationChanges;
  replyChanges?: RecentChanges<ReplyItem>;
  conflictChanges?: RecentChanges<ConflictItem>;
  deadLetterChanges?: DeadLetterChanges;
};

/** Why the page may not resolve an escalation (the answer's `reason`, with 404 for unknown, 409 otherwise). */
export type NotResolvable = "escalation_unknown" | "escalation_not_open" | "escalation_contested" | "escalation_too_large";

/**
 * The owner's answer to a decision sent from the page, as the page shows it: bounded as a record's strings are
 * (its `details` can carry a whole record, as large and deep as the system of record keeps it), the details as
 * clipped JSON.
 */
export interface AnswerShown {
  status: string;
  reason?: string;
  message?: string;
  version?: string;
  via?: string;
  details?: Clipped;
}
