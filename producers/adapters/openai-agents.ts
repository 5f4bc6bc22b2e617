// OpenAI Agents JS (`@openai/agents`, an optional peer dependency): writ write
// tools as function tools. The model supplies the params; the run context
// supplies the run id; the adapter supplies the version, and keeps what it read
// inside the run context so that a saved `RunState` carries it across approval,
// resume and a crash between the two.
import { ModelBehaviorError, tool, type FunctionTool, type RunContext } from "@openai/agents";
import { z } from "zod";
import { WritError } from "../../src/errors.ts";
import { entityKey, type EntityRef, type Versioned } from "../../src/schemas/common.ts";
import type { WritClient } from "../writ-client.ts";
import { pinToolCallBase, recordIntentBases, submitRepeatableToolCall, type IntentBases } from "./intent-bases.ts";
import {
  VersionBook,
  checkRunIds,
  readForTool,
  modelResultOf,
  toReadResult,
  type ModelToolResult,
  type ReadToolResult,
  type WritCallContext,
  type WritToolSpec,
} from "./tool-bridge.ts";

/**
 * The run context a writ tool expects: pass it as `run(agent, input, { context })`.
 * `RunState.toString()` serializes it and `RunState.fromString()` restores it,
 * so everything here is plain JSON.
 */
export interface WritAgentContext {
  /** The conversation or run id: the same across retries, approval and resume (the intent key's run scope). */
  runId: string;
  /**
   * Kept by the adapter, not by you: the versions this run has read (by entity
   * key) and the base each intent was first submitted against (by intent key,
   * with the bases its latest tool calls were sent against: an `IntentPin`).
   */
  writ?: WritRunRecords;
}

/** What the adapter keeps in the run context. */
export interface WritRunRecords {
  versions: Record<string, Versioned>;
  bases: Record<string, Versioned>;
}

/** Options of {@link writAgentTool}. */
export interface WritAgentToolOptions<P extends Record<string, unknown>, TContext extends object = WritAgentContext> {
  client: WritClient;
  /** Reads a record with its version (e.g. `systemOfRecord.read`), when the run has not read it yet. */
  read(entity: EntityRef): Promise<Versioned>;
  /** The run id of a run. Default: `context.runId`. */
  runId?: (context: TContext) => string | undefined;
  /** Deadline of one submission in ms; past it the tool answers `unknown`. Default: the client's `submitTimeoutMs` (30 000). */
  timeoutMs?: number;
  /**
   * Ask a person before the write: `true`, or a policy. The run stops with an
   * interruption; approve it on the `RunState` and run again. Default false.
   * When approval is needed the adapter reads the record before the run stops,
   * so the saved state carries the version the approver saw, and every resume
   * from it (also a second one from the same older state) is the same attempt.
   */
  needsApproval?: boolean | ((runContext: RunContext<TContext>, params: P, callId?: string) => Promise<boolean>);
  /**
   * A step id, only when the same intent may legitimately happen twice in one
   * run. Default: one write per run, tool, target and intent fields, which is
   * what survives a re-plan (models mint new tool-call ids). undefined or null: that default; any other
   * value must be a string of 1 to 256 characters (a number is refused: `String(n)` it).
   */
  stepId?: (context: TContext, params: P) => string | undefined | null;
  /** Tool name shown to the model. Default: the declaration's name. */
  name?: string;
}

/**
 * A writ write tool for OpenAI Agents JS: `execute` submits the call as a
 * write intent and returns {@link ModelToolResult} (`applied`, `conflict`
 * with `current` and `your_change`, `rejected`, `escalated` or `unknown`, each
 * with an instruction for the model).
 *
 * Errors that leave the outcome open (Kafka or the system of record
 * unreachable) are not turned into text for the model: they end the run, so
 * the harness resumes it, and a resume submits the same intent again, which is safe.
 *
 * @example
 * const read = async (e: EntityRef) => (await billing.read(e, { timeoutMs: 5000 }))!;
 * const refund = writAgentTool(refundSpec, { client: writ, read, needsApproval: true });
 * const agent = new Agent({ name: "billing", instructions, tools: [refund] });
 * let result = await run(agent, "Refund pay_1001", { context: { runId: conversationId } });
 * // later, maybe in another process:
 * const state = await RunState.fromString(agent, saved);
 * state.approve(state.getInterruptions()[0]!);
 * result = await run(agent, state);
 */
export function writAgentTool<P extends Record<string, unknown>, TContext extends object = WritAgentContext>(
  spec: WritToolSpec<P>,
  options: WritAgentToolOptions<P, TContext>,
): FunctionTool<TContext, z.ZodObject, ModelToolResult> {
  const policy = options.needsApproval ?? false;
  const needsApproval =
    policy === false
      ? false
      : async (runContext: RunContext<TContext>, params: P, callId?: string): Promise<boolean> => {
          // The SDK asks before it parses: arguments that do not parse are answered `rejected` (invalidInputAnswered)
          // with nothing written, so there is nothing to approve. Pinned as given, a call missing an intent field
          // threw here, and the SDK ended the run.
          if (!(await spec.tool.params.safeParseAsync(params)).success) return false;
          const needed = policy === true ? true : await policy(runContext, params, callId);
          if (needed) {
            const { ctx, bases } = callContext(runContext, options, params, callId);
            await pinToolCallBase(ctx, spec, params, bases);
          }
          return needed;
        };
  return tool({
    name: options.name ?? spec.tool.name,
    description: spec.description ?? spec.tool.description ?? spec.tool.name,
    parameters: modelParameters(spec),
    needsApproval: needsApproval as boolean | ((runContext: RunContext, params: Record<string, unknown>, callId?: string) => Promise<boolean>),
    errorFunction: invalidInputAnswered,
    async execute(input, runContext, details): Promise<ModelToolResult> {
      if (!runContext) throw missingContext(spec.tool.name);
      const params = input as P;
      const { ctx, bases } = callContext(runContext as RunContext<TContext>, options, params, details?.toolCall?.callId);
      // modelResultOf, not modelResultOrUnknown: with `invalidInputAnswered` an error that leaves the outcome
      // open (Kafka, the system of record) ends the run rather than reaching the model, and the harness's
      // resume from the saved RunState submits the same intent key again (run id and pins in the context),
      // which asks for the outcome. The other adapters' frameworks hand errors to the model as text instead.
      return modelResultOf(submitRepeatableToolCall(ctx, spec, params, bases));
    },
  }) as unknown as FunctionTool<TContext, z.ZodObject, ModelToolResult>;
}

/** Options of {@link writAgentReadTool}. */
export interface WritAgentReadToolOptions {
  /** Reads a record with its version (e.g. `systemOfRecord.read`). */
  read(entity: EntityRef): Promise<Versioned>;
  /** The record types the model may read. */
  recordTypes: readonly [string, ...string[]];
  /** Default `read_record`. */
  name?: string;
}

/**
 * A read tool that returns a record with its version ({@link ReadToolResult})
 * and remembers the version in the run context, so the writes that follow are conditional on what the
 * model saw.
 *
 * @example
 * const readRecord = writAgentReadTool({ read, recordTypes: ["payment"] });
 */
export function writAgentReadTool<TContext extends object = WritAgentContext>(
  options: WritAgentReadToolOptions,
): FunctionTool<TContext, z.ZodObject, ReadToolResult> {
  const parameters = z.object({ type: z.enum(options.recordTypes), id: z.string().min(1).max(256) });
  return tool({
    name: options.name ?? "read_record",
    description: `Read a record (${options.recordTypes.join(", ")}) with its current version before changing it.`,
    parameters,
    errorFunction: invalidInputAnswered,
    async execute(input, runContext) {
      if (!runContext) throw missingContext(options.name ?? "read_record");
      const records = runRecords(runContext.context as TContext, options.name ?? "read_record");
      const entity = { type: input.type, id: input.id };
      const read = await readForTool({ read: options.read, versions: new ContextVersionBook(records) }, entity);
      return toReadResult(entity, read);
    },
  }) as unknown as FunctionTool<TContext, z.ZodObject, ReadToolResult>;
}

/**
 * The tools' `errorFunction`: arguments the model sent that do not parse (a refund of 0 cents, an unknown
 * reason) are answered `rejected` (`invalid_params`), nothing sent, for the model to fix, as in the other
 * adapters' frameworks; with `errorFunction: null` they ended the whole run. Every other error is thrown
 * again, so it ends the run as before: a resume from the saved RunState asks for an open outcome.
 */
function invalidInputAnswered(_context: RunContext, err: unknown): string {
  if (!(err instanceof ModelBehaviorError) || err.name !== "InvalidToolInputError") throw err;
  const cause = (err as { originalError?: unknown }).originalError;
  const result: ModelToolResult = {
    status: "rejected",
    reason: "invalid_params",
    // The SDK's own message ("Invalid JSON input for tool") is wrong for JSON that fails the schema; its cause
    // names the field only when the SDK may show tool data (OPENAI_AGENTS_DONT_LOG_TOOL_DATA=0), else it is redacted.
    message: (cause instanceof Error
      ? `the arguments do not ${cause instanceof SyntaxError ? "parse as JSON" : "match the tool's parameters"}: ${cause.message}`
      : "the arguments do not parse as JSON or do not match the tool's parameters; check them against its parameter schema"
    ).slice(0, 2000),
    instruction: "The arguments do not match the tool's parameters and nothing was written. Fix them and call the tool again.",
  };
  // Returned as the object execute returns (the SDK serializes either); the declared type is a string.
  return result as unknown as string;
}

function callContext<P extends Record<string, unknown>, TContext extends object>(
  runContext: RunContext<TContext>,
  options: WritAgentToolOptions<P, TContext>,
  params: P,
  toolCallId?: string,
): { ctx: WritCallContext; bases: IntentBases } {
  const context = runContext.context;
  const runId = (options.runId ?? defaultRunId)(context);
  if (typeof runId !== "string" || runId === "") {
    throw new WritError("config_invalid", "writ agent tools need a run id: run(agent, input, { context: { runId: conversationId } })", {
      retriable: false,
      context: { field: "context.runId" },
    });
  }
  // Only undefined or null is "no step id": a falsy test took a step 0 for none, so steps 0 and 1 of one intent
  // were one write and the default step (0 answered as a repeat of the call without one). A number is refused,
  // as any non-string, naming the option.
  const stepId = options.stepId?.(context, params) ?? undefined;
  checkRunIds({ runId, stepId }, { runId: options.runId ? "runId(context)" : "context.runId", stepId: "stepId(context, params)" });
  const records = runRecords(context, "writ tool");
  const ctx: WritCallContext = {
    client: options.client,
    runId,
    ...(stepId === undefined ? {} : { stepId }),
    ...(toolCallId ? { toolCallId } : {}),
    versions: new ContextVersionBook(records),
    read: options.read,
    ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
  };
  return { ctx, bases: recordIntentBases(records.bases) };
}

function defaultRunId(context: object | undefined): string | undefined {
  const runId = (context as { runId?: unknown } | undefined)?.runId;
  return typeof runId === "string" ? runId : undefined;
}

/** The adapter's records inside the run context, created on first use. */
function runRecords(context: unknown, toolName: string): WritRunRecords {
  if (typeof context !== "object" || context === null) throw missingContext(toolName);
  const holder = context as { writ?: WritRunRecords };
  holder.writ ??= { versions: {}, bases: {} };
  holder.writ.versions ??= {};
  holder.writ.bases ??= {};
  return holder.writ;
}

function missingContext(toolName: string): WritError {
  return new WritError("config_invalid", `tool ${toolName}: run the agent with a context object, e.g. { runId: conversationId }`, {
    retriable: false,
    context: { tool: toolName, field: "context" },
  });
}

/** The model-facing schema: the declaration's params (a zod object, as the SDK's strict tools require). */
function modelParameters(spec: WritToolSpec<any>): z.ZodObject {
  const params: unknown = spec.tool.params;
  if (!(params instanceof z.ZodObject)) {
    throw new WritError("config_invalid", `tool ${spec.tool.name}: params must be a zod object to be offered to a model`, {
      retriable: false,
      context: { tool: spec.tool.name, field: "params" },
    });
  }
  return params;
}

/** A {@link VersionBook} whose contents live in the run context (plain JSON). */
class ContextVersionBook extends VersionBook {
  readonly #records: WritRunRecords;

  constructor(records: WritRunRecords) {
    super();
    this.#records = records;
  }

  override get(entity: EntityRef): Versioned | undefined {
    return this.#records.versions[entityKey(entity)];
  }

  override remember(entity: EntityRef, record: Versioned): void {
    this.#records.versions[entityKey(entity)] = record;
  }
}
