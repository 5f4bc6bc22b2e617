// The agent side's public shapes: what a submit resolves to, what a caller passes, the WritClient interface, and
// the two intents a caller may build without a client (a create's input, an undo). The Kafka implementation is
// in writ-client.ts, which re-exports all of it.
import { randomUUID } from "node:crypto";
import { undoIntentKey, type KeyedTool } from "../src/keys.ts";
import type { EntityRef, JsonPatchOp } from "../src/schemas/common.ts";
import type { Escalation } from "../src/schemas/escalation.ts";
import type { Reply } from "../src/schemas/reply.ts";
import { ABSENT_VERSION, LEDGER_VERSION, type WriteIntent } from "../src/schemas/write-intent.ts";
import type { CreateToolDeclaration } from "../src/tools.ts";
import type { ChangeInput, ChangeResult } from "./change.ts";

/** Replies one `replies()` iteration holds unread at the most; past it the oldest are dropped (and counted in a warning). */
export const MAX_UNREAD_REPLIES = 1024;

/** Why a waiting submit can get no reply any more. */
export type NoReplyReason = "reply_consumer_stopped" | "client_closed";

/** What `submit` resolves to when no reply came before the deadline. */
export interface UnknownOutcome {
  status: "unknown";
  intentId: string;
  intentKey: string;
  /**
   * Why no reply can come, when it is known: `reply_consumer_stopped`, the client's reply
   * consumer stopped for good while the submit waited (its reply can no longer be read);
   * `client_closed`, the client was closed while it waited.
   */
  reason?: NoReplyReason;
  message: string;
}

/**
 * What `submit` resolves to when no reply came before the deadline because
 * the agent's reply partition is blocked: its last stable offset stayed at
 * `offset` for the whole wait while records were written after it, so an
 * open transaction hides every later reply from read_committed readers
 * (a "hanging transaction"; writ's owners heal their own, `writ doctor`
 * finds the rest). The write may or may not have happened, as with `unknown`.
 */
export interface BlockedOutcome {
  status: "blocked";
  intentId: string;
  intentKey: string;
  topic: string;
  partition: number;
  offset: string;
  message: string;
}

export type SubmitResult = Reply | UnknownOutcome | BlockedOutcome;

export interface SubmitOptions {
  timeoutMs?: number;
  /**
   * A record leased to a change that spans records answers other writes `leased` (nothing written):
   * `wait` (the default) submits again, backing off, until the deadline; `answer` resolves with that reply.
   */
  onLeased?: "wait" | "answer";
}

/** A write as a tool call describes it; the client adds ids, the key and the reply topic. */
export interface IntentInput {
  tool: KeyedTool;
  entity: EntityRef;
  runId: string;
  stepId: string;
  toolCallId?: string;
  baseVersion: string;
  delta: JsonPatchOp[];
  params: Record<string, unknown>;
}

/**
 * The write an undo compensates: its intent key with its record and tool; its
 * reply or submit result (an `applied` reply names them); or only its intent
 * key. Record and tool missing from what is given are taken from this
 * client's own submissions (it remembers its last 10 000); `writ undo <key>`
 * looks any key up in the ledger.
 */
export type UndoTarget = string | SubmitResult | { intentKey: string; entity: EntityRef; tool: string | KeyedTool };

/**
 * The IntentInput of a create: the entity `{recordType, externalId(params)}`,
 * base version `"absent"` and the delta `[{op: "add", path: "", value:
 * body(params)}]`, as the owner rebuilds and checks them.
 *
 * @example
 * await writ.submit(createIntentInput(openCase, { runId, stepId: "open-case-1", params: { orderRef: "ORD-7781", subject: "Damaged" } }));
 */
export function createIntentInput<P extends Record<string, unknown>>(
  tool: CreateToolDeclaration<P>,
  i: { runId: string; stepId: string; params: P; toolCallId?: string },
): IntentInput {
  const params = tool.params.parse(i.params);
  return {
    tool,
    entity: { type: tool.recordType, id: tool.create.externalId(params) },
    runId: i.runId,
    stepId: i.stepId,
    ...(i.toolCallId !== undefined ? { toolCallId: i.toolCallId } : {}),
    baseVersion: ABSENT_VERSION,
    delta: [{ op: "add", path: "", value: tool.create.body(params) }],
    params: i.params,
  };
}

/**
 * The WriteIntent that undoes the intent keyed `undone.intentKey`: intent key
 * `undoIntentKey(undone)` (the same for every submission, by any agent), the
 * undone intent's record and tool, base version `"ledger"`, no delta and no
 * params: the record's owner builds the compensating change from its ledger.
 */
export function buildUndoIntent(i: {
  undone: { intentKey: string; entity: EntityRef; tool: string };
  agentId: string;
  runId: string;
  stepId: string;
  replyTo: string;
  toolCallId?: string;
}): WriteIntent {
  return {
    intentId: randomUUID(),
    intentKey: undoIntentKey(i.undone.intentKey),
    entity: i.undone.entity,
    tool: i.undone.tool,
    agent: { id: i.agentId, runId: i.runId, stepId: i.stepId, ...(i.toolCallId ? { toolCallId: i.toolCallId } : {}) },
    baseVersion: LEDGER_VERSION,
    delta: [],
    params: {},
    replyTo: i.replyTo,
    createdAt: new Date().toISOString(),
    undo: { intentKey: i.undone.intentKey },
  };
}

export interface WritClient {
  /** The agent this client submits for (part of every `run`-scoped intent key). */
  readonly agentId: string;
  /**
   * Builds the WriteIntent (id, key, reply topic) without sending it. Throws a
   * non-retriable WritError `not_canonical` when an intent field's value has no
   * canonical JSON (RFC 8785: a string with a lone surrogate, NaN, ±Infinity).
   */
  buildIntent(input: IntentInput): WriteIntent;
  /**
   * Publishes the intent and resolves with its reply. At the deadline it
   * resolves `{status: "unknown"}` (or `{status: "blocked"}` when the reply
   * partition is held by an open transaction) and never replays on its own:
   * the write may have happened. Submitting the same intent key again asks
   * the owner again, and is always safe.
   *
   * A `rejected` reply the owner gives before it has authenticated the record
   * (`unauthenticated`, `schema_invalid`, `schema_subject_mismatch`,
   * `undecodable`, `too_deep`, `key_missing`, `key_mismatch`, `not_canonical`)
   * may answer a forged record naming this intent id: it does not settle the
   * submit at once. Any other answer to the intent id before the deadline wins;
   * at the deadline the submit resolves with that rejection, not `unknown`.
   *
   * Rejects, before anything is sent, with a non-retriable WritError
   * `not_canonical` when any value in the intent has no canonical JSON (RFC
   * 8785: a string with a lone surrogate, NaN, ±Infinity), which owners
   * would refuse; `too_deep` when the intent is nested deeper than
   * `maxJsonDepth`, and `too_large` when its encoded value is larger than
   * `maxIntentBytes` (the client's options; owners dead-letter such intents
   * without a reply, so waiting for one would only end in `unknown`).
   */
  submit(intent: IntentInput | WriteIntent, opts?: SubmitOptions): Promise<SubmitResult>;
  /**
   * Submits the undo of an applied write, once: the tool's declared
   * compensating change (a reversal for a refund, removing an added tag),
   * applied by the record's owner only on the version the write produced.
   * Resolves like `submit`: `applied`; `conflict` with the current state when
   * the record changed since the write (nothing undone); `rejected` with
   * `undo_target_unknown`, `undo_target_not_applied`, `undo_not_declared`, …
   * Submitting it again (any agent, any run) is a repeat, answered from the
   * ledger. `runId`/`stepId` are carried for correlation only (default
   * `undo`, `undo-<key prefix>`); they are not part of the undo's key.
   */
  undo(target: UndoTarget, opts?: { timeoutMs?: number; runId?: string; stepId?: string; toolCallId?: string }): Promise<SubmitResult>;
  /** Publishes many intents in one producer request and resolves each reply. */
  submitAll(intents: (IntentInput | WriteIntent)[], opts?: SubmitOptions): Promise<SubmitResult[]>;
  /**
   * Runs a change that spans records under leases (see `producers/change.ts`
   * and docs/architecture.md §10): leases in entity-key order, each step an
   * intent of its own on the record as leased, the declared undos of the
   * applied steps when a step is not applied, then the releases. Calling it
   * again with the same run and step resumes the change.
   */
  change(input: ChangeInput): Promise<ChangeResult>;
  /** The topic this client's replies arrive on (every intent it builds names it). */
  readonly replyTopic: string;
  /**
   * Every reply read from this agent's reply topic while it is iterated: each iteration listens from its
   * first `next()` until it returns or `signal` aborts. At most {@link MAX_UNREAD_REPLIES} replies wait
   * unread per iteration; past that the oldest are dropped, and a warning logs how many.
   */
  replies(opts?: { signal?: AbortSignal }): AsyncIterable<Reply>;
  /**
   * An operator's decision on an escalation from `writ.human`: `apply` it on
   * the record at `baseVersion` (default: the version the escalation showed),
   * `discard` it, or `return` it to its agent with `message`. The record's
   * owner carries it out; the agent gets the outcome on its reply topic, and
   * this resolves with the reply the owner sends this client (keyed by the
   * resolution's id), or `unknown` at the deadline. This client's agent id is
   * the operator's (with an agent registry it must be allowed `writ.resolve`).
   * A `delta` is written only within the escalated tool's `allowedPaths` and
   * their operations, as an agent's: beyond them the answer is `rejected`
   * `patch_path_not_allowed` / `patch_op_not_allowed`, nothing written, the
   * escalation still open.
   */
  resolve(
    escalation: Escalation,
    decision: { decision: "apply" | "discard" | "return"; baseVersion?: string; delta?: JsonPatchOp[]; message?: string },
    opts?: { timeoutMs?: number },
  ): Promise<SubmitResult>;
  close(): Promise<void>;
}
