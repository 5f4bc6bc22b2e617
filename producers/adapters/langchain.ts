// LangChain.js adapter: a declared write tool becomes a `@langchain/core` tool
// whose call submits a write intent. In a LangGraph graph the run id is the
// thread (`configurable.thread_id`), and approval is LangGraph's
// human-in-the-loop: `interrupt()` before the write, `new Command({ resume })`
// to go on.
//
// On resume LangGraph runs the interrupted node again from its start, and a
// run replayed from an older checkpoint (after a crash before the newer one was
// stored) runs the tool again after the write. Both reach the same intent key
// (thread id, step id, tool, record, intent fields), so the ledger answers with
// the stored reply: one write.
import { ToolMessage } from "@langchain/core/messages";
import { tool, type ToolRunnableConfig } from "@langchain/core/tools";
import { getCurrentTaskInput, interrupt } from "@langchain/langgraph";
import { z } from "zod";
import type { EntityRef } from "../../src/schemas/common.ts";
import { WritError } from "../../src/errors.ts";
import { MemoryIntentBases, pinToolCallBase, submitRepeatableToolCall, type IntentBases } from "./intent-bases.ts";
import {
  checkRunIds,
  hasRunId,
  readForTool,
  recallVersions,
  modelResultOrUnknown,
  toReadResult,
  type ModelToolResult,
  type ReadToolResult,
  type WritCallContext,
  type WritToolSpec,
} from "./tool-bridge.ts";

/**
 * What the harness gives writ: everything but the ids LangGraph supplies. The
 * thread id wins over `runId`; `runId` serves a tool called outside a graph.
 * `bases` keeps the base version each intent was first sent against (see
 * intent-bases.ts); default: in memory, per tool.
 *
 * `recallFromMessages` (default true): fill `versions` from the artifacts of
 * the tool messages in the graph state, for the records it has not seen
 * ({@link recallVersions}). Only for a thread whose messages the server's own
 * nodes wrote: a write is based on those results (its base version, and the
 * state its delta is built from), so a thread that takes messages from the
 * browser (a LangGraph server's `useStream` input) could carry a forged read
 * result. Set it to false there, and keep `versions` on the server per thread,
 * or let each write read the record.
 */
export type WritThreadContext = Omit<WritCallContext, "toolCallId" | "runId"> & { runId?: string; bases?: IntentBases; recallFromMessages?: boolean };

/** One LangChain tool call, as a context factory sees it. */
export interface LangChainToolCall {
  toolCallId: string | undefined;
  /** `config.configurable.thread_id`, when the tool runs in a graph with a checkpointer. */
  threadId: string | undefined;
  config: ToolRunnableConfig;
}

export type WritThreadContextSource = WritThreadContext | ((call: LangChainToolCall) => WritThreadContext | Promise<WritThreadContext>);

/** The interrupt value a write tool raises when it needs approval. */
export interface WritApprovalRequest {
  type: "writ_approval";
  tool: string;
  entity: EntityRef;
  params: Record<string, unknown>;
  toolCallId?: string;
}

/** The resume value: `new Command({ resume: { approved: true } })`. A bare boolean is accepted too. */
export type WritApprovalDecision = { approved: boolean; reason?: string } | boolean;

/** What the tool returns when the person said no. */
export interface DeniedToolResult {
  status: "denied";
  reason?: string;
  instruction: string;
}

/** The tool's artifact (and, as JSON, its content): the model result plus the record it targeted. */
export type WritLangChainOutput = (ModelToolResult | DeniedToolResult) & { entity: EntityRef };

export interface WritLangChainToolOptions<P> {
  /**
   * Ask a person before the write, with LangGraph's `interrupt()` (needs a
   * graph with a checkpointer). `true`, or a function of the params. Default: false.
   */
  approval?: boolean | ((params: P) => boolean);
}

/**
 * A LangChain tool for a declared write tool. Its content is the JSON the
 * model reads; its artifact (`ToolMessage.artifact`) the same object, for the
 * harness.
 *
 * @example
 * const versions = new VersionBook();
 * const ctx = { client: writ, versions, read: (e) => billing.read(e, { timeoutMs: 5000 }) };
 * const tools = [writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundSpec, ctx, { approval: true })];
 * const graph = buildGraph(tools).compile({ checkpointer: new MemorySaver() });
 * await graph.invoke({ messages }, { configurable: { thread_id: conversationId } });    // stops at the interrupt
 * await graph.invoke(new Command({ resume: { approved: true } }), { configurable: { thread_id: conversationId } });
 */
export function writLangChainTool<P extends Record<string, unknown>>(
  spec: WritToolSpec<P>,
  context: WritThreadContextSource,
  options: WritLangChainToolOptions<P> = {},
) {
  const memoryBases = new MemoryIntentBases();
  return tool(
    async (params: P, config: ToolRunnableConfig): Promise<[string, WritLangChainOutput]> => {
      const call = toolCall(config);
      const entity = spec.entity(params);
      const { bases = memoryBases, runId: fallbackRunId, recallFromMessages = true, ...run } = await resolve(context, call);
      // An empty thread id is none (as in Python): the context's run id is taken, and checked, instead.
      const runId = hasRunId(call.threadId) ? call.threadId : fallbackRunId;
      if (!hasRunId(runId)) {
        throw new Error(`writ tool ${spec.tool.name}: no run id (no configurable.thread_id, no runId in the context); a random one would defeat deduplication`);
      }
      checkThreadRunIds(call, runId, run.stepId);
      const ctx: WritCallContext = { ...run, runId, ...(call.toolCallId ? { toolCallId: call.toolCallId } : {}) };
      if (recallFromMessages) recallVersions(ctx.versions, threadToolOutputs(config));
      const needsApproval = typeof options.approval === "function" ? options.approval(params) : options.approval === true;
      if (needsApproval) {
        // This function runs again from the top on resume: before the interrupt
        // only the pin (a read at most) happens, so the approved write, and any
        // replay of it, is sent against the version that was there when asked.
        await pinToolCallBase(ctx, spec, params, bases);
        const request: WritApprovalRequest = { type: "writ_approval", tool: spec.tool.name, entity, params, ...(call.toolCallId ? { toolCallId: call.toolCallId } : {}) };
        const decision = interrupt<WritApprovalRequest, WritApprovalDecision>(request);
        const approved = typeof decision === "boolean" ? decision : decision?.approved === true;
        if (!approved) {
          const reason = typeof decision === "object" ? decision?.reason : undefined;
          return asToolOutput({
            status: "denied",
            ...(reason ? { reason } : {}),
            instruction: "A person did not approve this write; nothing was written. Do not call the tool again for it unless the user asks.",
            entity,
          });
        }
      }
      return asToolOutput({ ...(await modelResultOrUnknown(submitRepeatableToolCall(ctx, spec, params, bases))), entity });
    },
    {
      name: spec.tool.name,
      description: spec.description ?? spec.tool.description ?? spec.tool.name,
      schema: spec.tool.params as z.ZodType<P>,
      responseFormat: "content_and_artifact",
    },
  );
}

/** A read tool over one record type: the model names the record by id. */
export interface WritReadToolSpec {
  recordType: string;
  /** Default: `get_<recordType>`. */
  name?: string;
  /** Default: "Read a <recordType> record with its current version." */
  description?: string;
}

/** A LangChain tool that reads a record with its version and remembers the version for the writes that follow. */
export function writLangChainReadTool(spec: WritReadToolSpec, context: WritThreadContextSource) {
  return tool(
    async ({ id }: { id: string }, config: ToolRunnableConfig): Promise<[string, ReadToolResult]> => {
      const call = toolCall(config);
      const run = await resolve(context, call);
      // As the write tools do: a run whose ids no intent can carry is refused at its first call, before a read the
      // model would go on from to a write that fails. A read with no run id at all (outside a graph) is served.
      const runId = hasRunId(call.threadId) ? call.threadId : run.runId;
      if (hasRunId(runId)) checkThreadRunIds(call, runId, run.stepId);
      const entity = { type: spec.recordType, id };
      return asToolOutput(toReadResult(entity, await readForTool(run, entity)));
    },
    {
      name: spec.name ?? `get_${spec.recordType}`,
      description: spec.description ?? `Read a ${spec.recordType} record with its current version.`,
      schema: z.object({ id: z.string().min(1).describe(`the ${spec.recordType} id`) }),
      responseFormat: "content_and_artifact",
    },
  );
}

function asToolOutput<T>(result: T): [string, T] {
  return [JSON.stringify(result), result];
}

function toolCall(config: ToolRunnableConfig): LangChainToolCall {
  return { toolCallId: config.toolCall?.id, threadId: threadIdOf(config.configurable?.thread_id), config };
}

/**
 * The thread id as a run id: a string as given, a number as its decimal string (a checkpointer that takes one
 * keys the thread by it), absent for undefined, null or "". Anything else is refused naming it: passed over, the
 * call fell back to the context's run id, so writes of two threads shared one run (the second answered as a repeat).
 */
function threadIdOf(value: unknown): string | undefined {
  if (value === undefined || value === null || value === "") return undefined;
  if (typeof value === "string") return value;
  if (typeof value === "number" && Number.isFinite(value)) return String(value);
  throw new WritError("config_invalid", `configurable.thread_id must be a string or a number (it is ${typeof value})`, { retriable: false, context: { field: "configurable.thread_id" } });
}

/** {@link checkRunIds}, naming where the run id came from: the thread, or the context's `runId`. */
function checkThreadRunIds(call: LangChainToolCall, runId: string, stepId: string | undefined): void {
  checkRunIds({ runId, stepId }, { runId: hasRunId(call.threadId) ? "configurable.thread_id" : "runId", stepId: "stepId" });
}

async function resolve(source: WritThreadContextSource, call: LangChainToolCall): Promise<WritThreadContext> {
  return typeof source === "function" ? source(call) : source;
}

/** Artifacts of the tool messages in the graph state, oldest first; none outside a graph. */
function threadToolOutputs(config: ToolRunnableConfig): unknown[] {
  let state: unknown;
  try {
    state = getCurrentTaskInput(config);
  } catch {
    return [];
  }
  const messages = (state as { messages?: unknown } | undefined)?.messages;
  if (!Array.isArray(messages)) return [];
  return messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m)).map((m) => m.artifact);
}
