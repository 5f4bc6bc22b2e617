import { WritError } from "../../src/errors.ts";
import { LruMap } from "../../src/lru-map.ts";
import type { EntityRef, JsonPatchOp, Versioned } from "../../src/schemas/common.ts";
import { MAX_RUN_ID_LENGTH } from "../../src/schemas/write-intent.ts";
import type { WriteToolDeclaration } from "../../src/tools.ts";
import type { SubmitResult, WritClient } from "../writ-client.ts";

/**
 * How a framework tool call becomes a write intent: which record the params
 * target, and the delta to apply to the record as the harness last read it.
 * The model supplies only the params; the harness supplies the version.
 */
export interface WritToolSpec<P extends Record<string, unknown> = Record<string, unknown>> {
  tool: WriteToolDeclaration<P>;
  /** The record the call targets, from the model's params. */
  entity(params: P): EntityRef;
  /** The RFC 6902 delta for these params against `current` (the version the harness carries). */
  delta(params: P, current: Versioned): JsonPatchOp[];
  /** Description shown to the model; defaults to the declaration's. */
  description?: string;
}

/** Entities a {@link VersionBook} keeps by default. */
export const DEFAULT_VERSION_BOOK_SIZE = 10_000;

/**
 * Versions the harness has read, per entity: read tools put them here and
 * write tools take `baseVersion` from here, so the model never invents one.
 * The state is kept with the version: deltas are computed against it. At most
 * `maxEntries` entities, least recently used dropped first, so a long-lived
 * session cannot grow it without bound; a dropped entity is read again.
 */
export class VersionBook {
  private readonly seen: LruMap<string, Versioned>;

  constructor(options: { maxEntries?: number } = {}) {
    const max = options.maxEntries ?? DEFAULT_VERSION_BOOK_SIZE;
    if (!Number.isSafeInteger(max) || max < 1) throw new WritError("config_invalid", `VersionBook maxEntries must be a positive integer (it is ${max})`, { retriable: false, context: { field: "maxEntries" } });
    this.seen = new LruMap(max);
  }

  remember(entity: EntityRef, record: Versioned): void {
    this.seen.set(`${entity.type}:${entity.id}`, record);
  }

  get(entity: EntityRef): Versioned | undefined {
    return this.seen.get(`${entity.type}:${entity.id}`);
  }
}

/** What a write-tool adapter needs from the harness for one call. */
export interface WritCallContext {
  client: WritClient;
  /** The run or conversation id: the same across retries, approval and resume. */
  runId: string;
  /**
   * The harness's step id, when the same intent may legitimately happen twice
   * in one run. Default: one write per run, tool and intent (what users want
   * across re-plans, where models mint new tool-call ids).
   */
  stepId?: string;
  /** The framework's tool-call id: carried for correlation only, never part of the key. */
  toolCallId?: string;
  versions: VersionBook;
  /** Reads a record with its version when the harness has not read it yet. */
  read(entity: EntityRef): Promise<Versioned>;
  timeoutMs?: number;
}

/** The stable step id used when the harness gives none. */
export const DEFAULT_STEP_ID = "once-per-run";

/**
 * Throws `config_invalid` naming the field when the harness's run or step id is not one an intent can carry
 * (1 to {@link MAX_RUN_ID_LENGTH} characters). Checked before anything is read, pinned or kept under it:
 * otherwise every write of such a run failed only at encoding (`codec_failed`, the schema's issues as text),
 * after a read, and the MCP server kept a version book per id however long. A step id of undefined or null is
 * not set (the default step); any other non-string (a number: 0 was taken for "not set", 1 was refused) is refused.
 */
export function checkRunIds(ids: { runId: string; stepId?: string | null | undefined }, names: { runId: string; stepId: string } = { runId: "runId", stepId: "stepId" }): void {
  for (const [field, value] of [["runId", ids.runId], ["stepId", ids.stepId]] as const) {
    if (field === "stepId" && (value === undefined || value === null)) continue;
    if (typeof value === "string" && value.length >= 1 && value.length <= MAX_RUN_ID_LENGTH) continue;
    const name = names[field];
    const got = typeof value === "string" ? `${value.length} characters` : typeof value;
    throw new WritError("config_invalid", `${name} must be a string of 1 to ${MAX_RUN_ID_LENGTH} characters (it is ${got}), as an intent carries it`, {
      retriable: false,
      context: { field: name },
    });
  }
}

/**
 * Whether a read tool's harness gave a run id: undefined, null and "" are none (the read is served, as a read
 * outside any run); anything else is one, and goes to {@link checkRunIds} (a number such as 0 is refused, as a
 * write refuses it).
 */
export function hasRunId<T>(runId: T | undefined | null): runId is T {
  return runId !== undefined && runId !== null && runId !== "";
}

/** Submits one tool call as a write intent and resolves with the reply (or `unknown`). */
export async function submitToolCall<P extends Record<string, unknown>>(
  ctx: WritCallContext,
  spec: WritToolSpec<P>,
  params: P,
): Promise<SubmitResult> {
  checkRunIds(ctx);
  const entity = spec.entity(params);
  let current = ctx.versions.get(entity);
  if (!current) {
    current = await ctx.read(entity);
    ctx.versions.remember(entity, current);
  }
  const result = await ctx.client.submit(
    {
      tool: spec.tool,
      entity,
      runId: ctx.runId,
      stepId: ctx.stepId ?? DEFAULT_STEP_ID,
      ...(ctx.toolCallId ? { toolCallId: ctx.toolCallId } : {}),
      baseVersion: current.version,
      delta: spec.delta(params, current),
      params,
    },
    ctx.timeoutMs === undefined ? undefined : { timeoutMs: ctx.timeoutMs },
  );
  // A repeat (or a reply too large for the broker) carries the version without the record: remembering it
  // would pair a version with no state, and the next delta would be built from nothing.
  if (result.status === "applied" && !result.duplicate && !result.truncated) ctx.versions.remember(entity, { state: result.state, version: result.version });
  if (result.status === "conflict" && !result.truncated) ctx.versions.remember(entity, result.current);
  return result;
}

/** A reply in the shape a model can act on: what happened and what to do next. */
export type ModelToolResult =
  /** `truncated`: the record was left out (the reply would exceed the broker's message size), so `record` is null. */
  | { status: "applied"; duplicate: boolean; record: unknown; version: string; truncated?: true; instruction: string }
  /** `truncated`: `current.state` was left out, as for `applied`. */
  | { status: "conflict"; cycle: number; current: Versioned; your_change: JsonPatchOp[]; truncated?: true; instruction: string }
  | { status: "rejected"; reason: string; message: string; instruction: string }
  | { status: "escalated"; reason: string; instruction: string }
  /** `reason`: set when the submit failed with an error that leaves the outcome open ({@link outcomeOpenReason}). */
  | { status: "unknown"; reason?: string; instruction: string };

/**
 * Refusals that end by themselves: a record leased to a change that spans records takes writes again once the
 * change ends, so the same call later may write. Every other refusal holds for the same arguments.
 */
export const REFUSED_FOR_NOW: ReadonlySet<string> = new Set(["leased"]);

export function toModelResult(result: SubmitResult): ModelToolResult {
  switch (result.status) {
    case "applied":
      return {
        status: "applied",
        duplicate: result.duplicate,
        record: result.state,
        version: result.version,
        // Carried so that a run continued from saved messages does not take this null for the record (recallVersions).
        ...(result.truncated ? { truncated: true as const } : {}),
        instruction: result.duplicate
          ? "This write had already been applied; nothing was written again. Do not call the tool again for it."
          : "The write was applied. Do not call the tool again for it.",
      };
    case "conflict":
      return {
        status: "conflict",
        cycle: result.cycle,
        current: result.current,
        your_change: result.your_change,
        ...(result.truncated ? { truncated: true as const } : {}),
        instruction:
          "The record changed since it was read; your change was NOT applied. Look at `current` and decide again: call the tool again only if the change is still right for the current record." +
          (result.truncated ? " `current.state` was too large to include: read the record again before deciding." : ""),
      };
    case "rejected":
      return {
        status: "rejected",
        reason: result.reason,
        message: result.message,
        instruction: REFUSED_FOR_NOW.has(result.reason)
          ? "The write was refused for now and nothing was written: the record is held by another change (the message says until when at the latest). Call the tool again later with the same arguments."
          : result.reason === KEY_REUSED
            ? KEY_REUSED_INSTRUCTION
            : "The write was refused and nothing was written. Do not retry it unchanged.",
      };
    case "escalated":
      return {
        status: "escalated",
        reason: result.reason,
        instruction: "A person will handle this write. Tell the user it is with a human; do not retry.",
      };
    default:
      return { status: "unknown", instruction: UNKNOWN_INSTRUCTION };
  }
}

/**
 * The owner's refusal of a call whose intent key (run, tool, record, intent fields) an earlier call with other
 * arguments holds: this call wrote nothing, but the earlier one may have been applied. Told "nothing was
 * written", a model takes the earlier write for refused too, and may make it again under changed intent
 * fields (a new key: a second write).
 */
const KEY_REUSED = "key_reused_with_different_params";
const KEY_REUSED_INSTRUCTION =
  "This call was not written: an earlier call of this tool on this record, for the same intent, was made in this run with other arguments, and that earlier write may have been applied. Do not assume it failed: read the record before deciding; calling again with the earlier call's arguments returns its outcome.";

// Safe only in the same run: the run id is part of the intent key, and a new run (over MCP HTTP, a new
// session that carries no `_meta["writ/runId"]`) makes the same call a new intent that could write twice.
const UNKNOWN_INSTRUCTION =
  "No answer yet: the write may or may not have happened. Do not assume it failed and do not retry with new ids. In this same run (this conversation or session), calling the same tool with the same arguments again is safe and asks for the outcome; from a new session it may count as a new write, so read the record first.";

/**
 * The codes with which the client refuses an intent for good before sending it (src/errors.ts): the same
 * arguments would be refused the same way, so the model must not call the tool again with them.
 */
const REFUSED_BEFORE_SENDING: ReadonlySet<string> = new Set(["too_large", "too_deep", "not_canonical", "input_too_deep", "changed_by_validation"]);

/**
 * The model's result of a submit: {@link toModelResult} of its outcome, or, when the client refused the
 * intent before sending it (`too_large`, `too_deep`, `not_canonical`, `changed_by_validation`), a
 * `rejected` result with that reason that tells the model not to call again unchanged. Any other error
 * is thrown, as before.
 */
export async function modelResultOf(submitted: Promise<SubmitResult>): Promise<ModelToolResult> {
  try {
    return toModelResult(await submitted);
  } catch (err) {
    if (!(err instanceof WritError) || err.retriable || !REFUSED_BEFORE_SENDING.has(err.code)) throw err;
    return {
      status: "rejected",
      reason: err.code === "input_too_deep" ? "too_deep" : err.code,
      message: err.message,
      instruction: "The write was refused before it was sent and nothing was written. Calling the tool again with the same arguments fails the same way: change them, or tell the user.",
    };
  }
}

/**
 * WritError codes that leave a write's outcome open whether or not the error is retriable: the client was
 * closed or its reply consumer stopped (an intent sent before may have been written, and a new client asks
 * again), the deadline passed before sending (`not_sent`), Kafka failed (`kafka_failed`) or a retry gave up
 * (`retries_exhausted`). Every retriable WritError (`registry_unavailable`, `sor_unavailable`, …) does too.
 */
const OUTCOME_OPEN_CODES: ReadonlySet<string> = new Set(["client_closed", "reply_consumer_stopped", "not_sent", "kafka_failed", "retries_exhausted"]);

/**
 * Why an error thrown by a submit leaves its outcome open, or undefined when it does not. Open: a kafkajs
 * error (a produce that failed after request timeouts may have been written by the idempotent producer),
 * a retriable WritError, and the codes of {@link OUTCOME_OPEN_CODES}. The reason is the WritError's code,
 * or `kafka_error`. Not open: refusals before sending (`too_large`, …: {@link modelResultOf} answers
 * them `rejected`), configuration and codec errors, and programming errors (a TypeError): those throw.
 */
export function outcomeOpenReason(err: unknown): string | undefined {
  if (err instanceof WritError) {
    if (REFUSED_BEFORE_SENDING.has(err.code)) return undefined;
    return err.retriable || OUTCOME_OPEN_CODES.has(err.code) ? err.code : undefined;
  }
  // By name, not instanceof: a second copy of kafkajs in node_modules has classes of its own.
  if (err instanceof Error && err.name.startsWith("KafkaJS")) return "kafka_error";
  return undefined;
}

/**
 * {@link modelResultOf} for the frameworks that hand a tool's error to the model as text (LangChain's
 * ToolNode: "Error: … Please fix your mistakes."; MCP: `isError` with the message; the AI SDK: a
 * `tool-error`): an error that leaves the outcome open ({@link outcomeOpenReason}) is the `unknown`
 * result, with the error's short reason, instead of a failure the model would answer with a changed call
 * (a new intent key, a possible second write). The `unknown` instruction tells it that the same call in
 * the same run is safe and asks for the outcome. Any other error is thrown, as by `modelResultOf`.
 * (OpenAI Agents JS ends the run on a tool's error instead, and its resume submits the same key again: that
 * adapter uses `modelResultOf`.) `onOpenOutcome` hears the error the model is not shown, e.g. to log it.
 */
export async function modelResultOrUnknown(
  submitted: Promise<SubmitResult>,
  opts: { onOpenOutcome?: (err: unknown, reason: string) => void } = {},
): Promise<ModelToolResult> {
  try {
    return await modelResultOf(submitted);
  } catch (err) {
    const reason = outcomeOpenReason(err);
    if (reason === undefined) throw err;
    opts.onOpenOutcome?.(err, reason);
    return { status: "unknown", reason, instruction: UNKNOWN_INSTRUCTION };
  }
}

/** Reads a record with its version for a read tool, and remembers the version for the writes that follow. */
export async function readForTool(ctx: Pick<WritCallContext, "read" | "versions">, entity: EntityRef): Promise<Versioned> {
  const record = await ctx.read(entity);
  ctx.versions.remember(entity, record);
  return record;
}

/** What a read tool returns to the model: the record, and the version writes will be based on. */
export interface ReadToolResult {
  status: "read";
  entity: EntityRef;
  record: unknown;
  version: string;
  instruction: string;
}

export function toReadResult(entity: EntityRef, record: Versioned): ReadToolResult {
  return {
    status: "read",
    entity,
    record: record.state,
    version: record.version,
    instruction: "This is the record as it is now. Your writes to it are checked against this version.",
  };
}

/**
 * Fills `versions`, for entities it does not know yet, from tool results
 * already in the conversation, oldest first: read results, and write results
 * that carry their `entity` (`applied`: the new version; `conflict`: `current`).
 * A run continued from saved messages in a fresh process then bases its
 * writes on what the model saw, not on a new read. A result that carries the
 * version without the record (a repeat, or a reply too large for the broker)
 * is passed over, as `submitToolCall` does: a version paired with no state
 * would build the next delta from nothing, and the write would drop what the
 * record held. An older result, or a read, is used instead.
 */
export function recallVersions(versions: VersionBook, outputs: Iterable<unknown>): void {
  const latest = new Map<string, { entity: EntityRef; record: Versioned }>();
  for (const out of outputs) {
    if (typeof out !== "object" || out === null) continue;
    const o = out as Record<string, unknown>;
    const entity = o.entity as Partial<EntityRef> | undefined;
    if (typeof entity?.type !== "string" || typeof entity.id !== "string") continue;
    const current = o.current as Partial<Versioned> | undefined;
    let record: Versioned | undefined;
    // A null record says it too: outputs saved before `truncated` was carried have nothing else to tell.
    const stateless = o.truncated === true || (o.status === "applied" && (o.duplicate === true || o.record === null)) || (o.status === "conflict" && current?.state === null);
    if (stateless) continue;
    if ((o.status === "read" || o.status === "applied") && typeof o.version === "string") record = { state: o.record, version: o.version };
    else if (o.status === "conflict" && typeof current?.version === "string") record = { state: current.state, version: current.version };
    if (record) latest.set(`${entity.type}:${entity.id}`, { entity: { type: entity.type, id: entity.id }, record });
  }
  for (const { entity, record } of latest.values()) if (!versions.get(entity)) versions.remember(entity, record);
}
