// Vercel AI SDK (v7) adapter: a declared write tool becomes an AI SDK `tool()`
// whose execute submits a write intent and hands the model the owner's answer.
//
// Approval is the SDK's own (`toolApproval` on generateText / streamText /
// ToolLoopAgent): execute runs only once a call is approved. What writ adds is
// that running it again (the approval response replayed, the run continued
// from the same saved messages twice, the model re-planning the same refund
// under a new tool-call id) reaches the same intent key and the ledger's
// stored reply, never a second write.
import { tool, type ModelMessage, type Tool } from "ai";
import { z } from "zod";
import type { EntityRef } from "../../src/schemas/common.ts";
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
 * What the harness gives writ for a run: everything but the per-call tool-call
 * id. `bases` keeps the base version each intent was first sent against (see
 * intent-bases.ts); default: in memory, per tool. A harness that continues
 * runs in another process stores them with the messages
 * (`recordIntentBases(saved.bases)`).
 *
 * `recallFromMessages` (default true): fill `versions` from the read and write
 * results in the messages of the step, for the records it has not seen
 * ({@link recallVersions}). Only for a message history the server stores
 * itself: a write is based on those results (its base version, and the state
 * its delta is built from), so a history the browser sends (`useChat` posts
 * the whole conversation) could carry a forged read result. Set it to false
 * there, and keep `versions` on the server per conversation (a VersionBook that
 * outlives the request), or let each write read the record.
 */
export type WritRunContext = Omit<WritCallContext, "toolCallId"> & { bases?: IntentBases; recallFromMessages?: boolean };

/** One AI SDK tool call, as a context factory sees it. */
export interface AiSdkToolCall {
  toolCallId: string;
  /** The messages sent to the model for the step that made the call (saved history included). */
  messages: ModelMessage[];
  /** This tool's entry of `toolsContext`, if the harness passed one. */
  context: unknown;
}

/**
 * The run context, fixed (a tool set built per conversation) or built per call,
 * e.g. from `toolsContext` when one tool set serves many conversations.
 */
export type WritRunContextSource = WritRunContext | ((call: AiSdkToolCall) => WritRunContext | Promise<WritRunContext>);

/** What a write tool returns to the model: {@link ModelToolResult} plus the record it targeted. */
export type WritToolOutput = ModelToolResult & { entity: EntityRef };

/**
 * An AI SDK tool for a declared write tool. The model supplies the params; the
 * run id (the conversation id) comes from the harness, the step id defaults to
 * `DEFAULT_STEP_ID` (one write per run, tool and intent), and the base version
 * from the harness's {@link VersionBook}, filled by read tools and, for a run
 * continued from saved messages, from the read results in those messages.
 * Those messages are trusted: recall them only from a history the server
 * stores itself. With a history the client sends (`useChat`), pass
 * `recallFromMessages: false` and a server-side book (see {@link WritRunContext}).
 *
 * @example
 * const versions = new VersionBook();
 * const run = { client: writ, runId: conversationId, versions, read: (e) => billing.read(e, { timeoutMs: 5000 }) };
 * const result = await generateText({
 *   model, messages,
 *   tools: { get_payment: writReadTool({ recordType: "payment" }, run), refund_payment: writTool(refundSpec, run) },
 *   toolApproval: { refund_payment: "user-approval" },
 * });
 */
export function writTool<P extends Record<string, unknown>>(
  spec: WritToolSpec<P>,
  context: WritRunContextSource,
): Tool<P, WritToolOutput> {
  const memoryBases = new MemoryIntentBases();
  const callContext = async (call: AiSdkToolCall) => {
    const run = typeof context === "function" ? await context(call) : context;
    if (run.recallFromMessages !== false) recallVersions(run.versions, toolOutputs(call.messages));
    const { bases = memoryBases, recallFromMessages: _recall, ...rest } = run;
    return { ctx: { ...rest, toolCallId: call.toolCallId }, bases };
  };
  return tool<P, WritToolOutput, any>({
    description: spec.description ?? spec.tool.description ?? spec.tool.name,
    inputSchema: spec.tool.params,
    // Runs when the model's call arrives, before an approval request is made
    // and saved: the base is pinned then, so the approved call, and every
    // replay of it, is sent against the version the person approved.
    onInputAvailable: async ({ input, toolCallId, messages, context: toolContext }) => {
      const { ctx, bases } = await callContext({ toolCallId, messages, context: toolContext });
      // Best effort: execute pins (and reports a failed read) if this could not.
      await pinToolCallBase(ctx, spec, input as P, bases).catch(() => undefined);
    },
    execute: async (params, { toolCallId, messages, context: toolContext }) => {
      const { ctx, bases } = await callContext({ toolCallId, messages, context: toolContext });
      return { ...(await modelResultOrUnknown(submitRepeatableToolCall(ctx, spec, params, bases))), entity: spec.entity(params) };
    },
  });
}

/** A read tool over one record type: the model names the record by id. */
export interface WritReadToolSpec {
  recordType: string;
  /** Default: "Read a <recordType> record with its current version." */
  description?: string;
}

/**
 * An AI SDK tool that reads a record with its version and remembers the
 * version for the writes that follow (and puts it in the conversation, where a
 * continued run finds it again).
 */
export function writReadTool(
  spec: WritReadToolSpec,
  context: WritRunContextSource,
): Tool<{ id: string }, ReadToolResult> {
  return tool<{ id: string }, ReadToolResult, any>({
    description: spec.description ?? `Read a ${spec.recordType} record with its current version.`,
    inputSchema: z.object({ id: z.string().min(1).describe(`the ${spec.recordType} id`) }),
    execute: async ({ id }, { toolCallId, messages, context: toolContext }) => {
      const run = typeof context === "function" ? await context({ toolCallId, messages, context: toolContext }) : context;
      // As a write tool would: a run whose ids no intent can carry is refused at its first call, before a read
      // the model would go on from to a write that fails. A read with no run id at all is served, as LangChain's is.
      if (hasRunId(run.runId)) checkRunIds(run);
      const entity = { type: spec.recordType, id };
      return toReadResult(entity, await readForTool(run, entity));
    },
  });
}

/** The JSON outputs of tool results in a message history, oldest first. */
function toolOutputs(messages: readonly ModelMessage[]): unknown[] {
  const out: unknown[] = [];
  for (const m of messages) {
    if (m.role !== "tool") continue;
    for (const part of m.content) {
      if (part.type === "tool-result" && part.output.type === "json") out.push(part.output.value);
    }
  }
  return out;
}
