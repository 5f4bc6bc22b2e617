// Pinned bases (producers/adapters/intent-bases.ts) through the AI SDK and LangChain adapters, against a
// scripted owner: a call keeps the base it was first pinned at by its tool-call id, so replaying a call whose
// conflict was lost is sent against the version it was approved on (the ledger answers the same conflict),
// while a new call, the model deciding again, is sent against the conflict's `current`.
import { AIMessage } from "@langchain/core/messages";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode } from "@langchain/langgraph/prebuilt";
import { generateText, stepCountIs, type ModelMessage } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { describe, expect, it } from "vitest";
import { tagTicketSpec } from "../../examples/demo-tool-specs.ts";
import { writReadTool, writTool } from "../../producers/adapters/ai-sdk.ts";
import { MemoryIntentBases, REMEMBERED_CALLS, recordIntentBases, submitRepeatableToolCall, toolCallIntentKey, type IntentPin } from "../../producers/adapters/intent-bases.ts";
import { writLangChainReadTool, writLangChainTool } from "../../producers/adapters/langchain.ts";
import { VersionBook, type WritCallContext } from "../../producers/adapters/tool-bridge.ts";
import type { IntentInput, SubmitResult, WritClient } from "../../producers/writ-client.ts";
import type { Versioned } from "../../src/schemas/common.ts";

const T42 = { type: "ticket", id: "T-42" };
const at = "2025-01-01T00:00:00.000Z";
const v1: Versioned = { state: { tags: ["billing"] }, version: '"v1"' };
const v2: Versioned = { state: { tags: ["billing", "legal-hold"] }, version: '"v2"' };
const params = { ticketId: "T-42", tag: "vip" };

/** An owner whose record is at v2: an intent based on v1 meets a conflict (`current`: v2), one based on v2 is applied. */
function ownerAtV2() {
  const sent: IntentInput[] = [];
  const client = {
    agentId: "support-bob",
    submit: async (i: IntentInput): Promise<SubmitResult> => {
      sent.push(i);
      return i.baseVersion === v1.version
        ? ({ status: "conflict", intentId: "i", intentKey: "k", duplicate: sent.length > 1, at, entity: T42, cycle: 1, message: "changed", current: v2, your_change: i.delta } as SubmitResult)
        : ({ status: "applied", intentId: "i", intentKey: "k", duplicate: false, at, entity: T42, state: { tags: ["billing", "legal-hold", "vip"] }, version: '"v3"', via: "patch" } as SubmitResult);
    },
  } as unknown as WritClient;
  return { client, sent, bases: () => sent.map((i) => [i.toolCallId, i.baseVersion]) };
}

const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: 1, text: 1, reasoning: undefined } };
function model(calls: { tool: string; input: unknown; id: string }[]) {
  let step = 0;
  return new MockLanguageModelV4({
    doGenerate: async () => {
      const next = calls[step++];
      if (!next) return { content: [{ type: "text", text: "done" }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      return { content: [{ type: "tool-call", toolCallId: next.id, toolName: next.tool, input: JSON.stringify(next.input) }], finishReason: { unified: "tool-calls", raw: undefined }, usage, warnings: [] };
    },
  });
}

describe("a replayed call keeps its base after its conflict was lost; a new call gets the moved pin", () => {
  it("AI SDK: continued twice from the same saved messages, the approved call is sent against v1 both times; the model's new call after reading the conflict against v2", async () => {
    let record = v1;
    const owner = ownerAtV2();
    const run = { client: owner.client, runId: "conv-1", versions: new VersionBook(), read: async () => record };
    const tools = { get_ticket: writReadTool({ recordType: "ticket" }, run), tag_ticket: writTool(tagTicketSpec, run) };
    const settings = { tools, toolApproval: { tag_ticket: "user-approval" as const }, stopWhen: stepCountIs(4) };
    const approve = async (messages: ModelMessage[], calls: { tool: string; input: unknown; id: string }[]) => {
      const asked = await generateText({ ...settings, model: model(calls), messages });
      const request = asked.content.find((p) => p.type === "tool-approval-request")!;
      return [...messages, ...asked.responseMessages, { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] }] as ModelMessage[];
    };
    const saved = JSON.stringify(
      await approve([{ role: "user", content: "tag T-42 vip" }], [
        { tool: "get_ticket", input: { id: "T-42" }, id: "call_read" },
        { tool: "tag_ticket", input: params, id: "call_tag" },
      ]),
    );
    record = v2; // changed after the approval
    await generateText({ ...settings, model: model([]), messages: JSON.parse(saved) }); // conflict; its result is lost
    const again = await generateText({ ...settings, model: model([]), messages: JSON.parse(saved) }); // the same saved messages again
    expect(owner.bases()).toEqual([
      ["call_tag", '"v1"'],
      ["call_tag", '"v1"'],
    ]);
    // Stored this time: the model reads the conflict and decides again, under a new tool-call id.
    const history = [...JSON.parse(saved), ...again.responseMessages, { role: "user", content: "still tag it" }] as ModelMessage[];
    await generateText({ ...settings, model: model([]), messages: await approve(history, [{ tool: "tag_ticket", input: params, id: "call_tag_2" }]) });
    expect(owner.bases()[2]).toEqual(["call_tag_2", '"v2"']);
    expect(owner.sent[2]!.delta).toEqual([{ op: "replace", path: "/tags", value: ["billing", "legal-hold", "vip"] }]);
  });

  it("LangGraph: a replay from the older (approved) checkpoint after the conflict is sent against v1; a new call after it against v2", async () => {
    let record = v1;
    const owner = ownerAtV2();
    const ctx = { client: owner.client, versions: new VersionBook(), read: async () => record };
    const tools = [writLangChainReadTool({ recordType: "ticket" }, ctx), writLangChainTool(tagTicketSpec, ctx, { approval: true })];
    const tagCall = (id: string) => new AIMessage({ content: "", tool_calls: [{ id, name: "tag_ticket", args: params, type: "tool_call" }] });
    const script = [new AIMessage({ content: "", tool_calls: [{ id: "c0", name: "get_ticket", args: { id: "T-42" }, type: "tool_call" }] }), tagCall("c1")];
    const graph = new StateGraph(MessagesAnnotation)
      .addNode("agent", async () => ({ messages: [script.shift() ?? new AIMessage("done")] }))
      .addNode("tools", new ToolNode(tools))
      .addEdge(START, "agent")
      .addConditionalEdges("agent", (s) => ((s.messages.at(-1) as AIMessage).tool_calls?.length ? "tools" : END), ["tools", END])
      .addEdge("tools", "agent")
      .compile({ checkpointer: new MemorySaver() });
    const config = { configurable: { thread_id: "t1" } };
    await graph.invoke({ messages: [{ role: "user", content: "tag" }] }, config); // interrupts for approval
    const asked = await graph.getState(config);
    record = v2;
    await graph.invoke(new Command({ resume: { approved: true } }), config); // conflict
    await graph.invoke(new Command({ resume: { approved: true } }), asked.config); // replayed from the older checkpoint
    expect(owner.bases()).toEqual([
      ["c1", '"v1"'],
      ["c1", '"v1"'],
    ]);
    script.push(tagCall("c2"));
    await graph.invoke({ messages: [{ role: "user", content: "still tag it" }] }, config);
    await graph.invoke(new Command({ resume: { approved: true } }), config);
    expect(owner.bases()[2]).toEqual(["c2", '"v2"']);
    expect(owner.sent[2]!.delta).toEqual([{ op: "replace", path: "/tags", value: ["billing", "legal-hold", "vip"] }]);
  });
});

describe("the stored pin", () => {
  const ctxOf = (client: WritClient, toolCallId?: string): WritCallContext => ({
    client,
    runId: "run-1",
    versions: new VersionBook(),
    read: async () => v1,
    ...(toolCallId ? { toolCallId } : {}),
  });

  it("is plain JSON: a run context saved after the conflict (as a RunState carries it) still sends the call against its own base", async () => {
    const owner = ownerAtV2();
    const store: Record<string, Versioned> = {};
    await submitRepeatableToolCall(ctxOf(owner.client, "c1"), tagTicketSpec, params, recordIntentBases(store));
    const restored = recordIntentBases(JSON.parse(JSON.stringify(store)));
    await submitRepeatableToolCall(ctxOf(owner.client, "c1"), tagTicketSpec, params, restored);
    await submitRepeatableToolCall(ctxOf(owner.client, "c2"), tagTicketSpec, params, restored);
    expect(owner.bases()).toEqual([
      ["c1", '"v1"'],
      ["c1", '"v1"'],
      ["c2", '"v2"'],
    ]);
  });

  it("stored before (a bare Versioned) is the pin of every call; calls without a tool-call id follow the pin as before", async () => {
    const owner = ownerAtV2();
    const bases = new MemoryIntentBases();
    const key = toolCallIntentKey(ctxOf(owner.client), tagTicketSpec, params);
    bases.set(key, v1);
    await submitRepeatableToolCall(ctxOf(owner.client, "c1"), tagTicketSpec, params, bases); // conflict
    await submitRepeatableToolCall(ctxOf(owner.client, "c1"), tagTicketSpec, params, bases);
    await submitRepeatableToolCall(ctxOf(owner.client), tagTicketSpec, params, bases);
    bases.set(key, v1);
    await submitRepeatableToolCall(ctxOf(owner.client), tagTicketSpec, params, bases); // conflict
    await submitRepeatableToolCall(ctxOf(owner.client), tagTicketSpec, params, bases);
    expect(owner.bases()).toEqual([
      ["c1", '"v1"'],
      ["c1", '"v1"'],
      [undefined, '"v2"'],
      [undefined, '"v1"'],
      [undefined, '"v2"'],
    ]);
  });

  it("remembers the latest calls only", async () => {
    const owner = ownerAtV2();
    const store: Record<string, IntentPin> = {};
    const bases = recordIntentBases(store);
    for (let n = 0; n <= REMEMBERED_CALLS; n++) await submitRepeatableToolCall(ctxOf(owner.client, `c${n}`), tagTicketSpec, params, bases);
    const [pin] = Object.values(store);
    expect(pin!.version).toBe('"v2"');
    const remembered = [...(pin!.earlier ?? []).flatMap((e) => e.calls), ...(pin!.calls ?? [])];
    expect(remembered).toHaveLength(REMEMBERED_CALLS);
    expect(remembered).not.toContain("c0");
  });
});
