import { randomUUID } from "node:crypto";
import { AIMessage, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import type { StructuredToolInterface } from "@langchain/core/tools";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph, type BaseCheckpointSaver } from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { describe, expect, it } from "vitest";
import { refundPaymentSpec, tagTicketSpec } from "../../../examples/demo-tool-specs.ts";
import { writLangChainReadTool, writLangChainTool, type WritLangChainOutput } from "../../../producers/adapters/langchain.ts";
import { callContext, createRouterTopics, outsideWrite, refundsAt, startDemoHarness } from "../../helpers/adapter-fixtures.ts";
import { readVersion } from "../../helpers/writ-harness.ts";

const refundArgs = { paymentId: "pay_1", amountCents: 500, reason: "damaged", note: "Photos attached." };

/** What the scripted model says next, given the last message (a ToolMessage, or the user's). */
type Script = (last: BaseMessage | undefined) => AIMessage | Promise<AIMessage>;
const call = (name: string, args: Record<string, unknown>, id = `call_${name}_${randomUUID().slice(0, 8)}`) => new AIMessage({ content: "", tool_calls: [{ id, name, args, type: "tool_call" }] });

/** agent -> tools -> agent ... with a checkpointer, the usual LangGraph tool loop; the agent's turns are scripted. */
function toolLoop(tools: StructuredToolInterface[], script: Script, checkpointer: BaseCheckpointSaver) {
  return new StateGraph(MessagesAnnotation)
    .addNode("agent", async ({ messages }) => ({ messages: [await script(messages.at(-1))] }))
    .addNode("tools", new ToolNode(tools))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition, ["tools", END])
    .addEdge("tools", "agent")
    .compile({ checkpointer });
}

const readThenRefund: Script = (last) => {
  if (!ToolMessage.isInstance(last)) return call("get_payment", { id: "pay_1" });
  if (last.name === "get_payment") return call("refund_payment", refundArgs);
  return new AIMessage(`refund: ${(last.artifact as WritLangChainOutput).status}`);
};

function toolOutputs(messages: BaseMessage[], name: string): WritLangChainOutput[] {
  return messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m) && m.name === name).map((m) => m.artifact as WritLangChainOutput);
}

describe("LangChain adapter on a real broker", () => {
  it("interrupt-resume-replay: approval interrupt before the write, resume, replay from the older checkpoint; one refund", async () => {
    const h = await startDemoHarness({ payment: true });
    const ctx = callContext(h, await h.client("billing-agent"));
    const tools = [writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundPaymentSpec, ctx, { approval: true })];
    const graph = toolLoop(tools, readThenRefund, new MemorySaver());
    const config = { configurable: { thread_id: `thread-${randomUUID()}` } };

    await graph.invoke({ messages: [{ role: "user", content: "refund 5 EUR on pay_1" }] }, config);
    const asked = await graph.getState(config);
    expect(asked.next).toEqual(["tools"]);
    expect(asked.tasks.flatMap((t) => t.interrupts).map((i) => i.value)).toMatchObject([
      { type: "writ_approval", tool: "refund_payment", entity: { type: "payment", id: "pay_1" }, params: refundArgs },
    ]);
    expect(h.records.patchRequests()).toHaveLength(0);

    const resumed = await graph.invoke(new Command({ resume: { approved: true } }), config);
    const replayed = await graph.invoke(new Command({ resume: { approved: true } }), asked.config);

    expect(toolOutputs(resumed.messages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: false }]);
    expect(toolOutputs(replayed.messages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: true }]);
    expect(await refundsAt(h)).toBe(1);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });

  it("replay-in-a-new-process: fresh tools over the same checkpoints repeat the approved attempt (base recalled from the thread's read)", async () => {
    const h = await startDemoHarness({ payment: true });
    const client = await h.client("billing-agent");
    const checkpointer = new MemorySaver();
    // Each graph stands for one process: its own tools, version book and in-memory bases.
    const graphInNewProcess = () => {
      const ctx = callContext(h, client);
      return toolLoop([writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundPaymentSpec, ctx, { approval: true })], readThenRefund, checkpointer);
    };
    const config = { configurable: { thread_id: `thread-${randomUUID()}` } };

    await graphInNewProcess().invoke({ messages: [{ role: "user", content: "refund 5 EUR on pay_1" }] }, config);
    const asked = await graphInNewProcess().getState(config);
    const resumed = await graphInNewProcess().invoke(new Command({ resume: { approved: true } }), config);
    const replayed = await graphInNewProcess().invoke(new Command({ resume: { approved: true } }), asked.config);

    expect(toolOutputs(resumed.messages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: false }]);
    expect(toolOutputs(replayed.messages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: true }]);
    expect(await refundsAt(h)).toBe(1);
  });

  it("resumed-in-a-new-process on a strict tool: the write is based on the version the thread read, so a change made meanwhile is a conflict", async () => {
    const h = await startDemoHarness({ ticket: { status: "open", tags: ["billing"] } });
    const client = await h.client("support-agent");
    const checkpointer = new MemorySaver();
    const script: Script = (last) => {
      if (!ToolMessage.isInstance(last)) return String(last?.content) === "tag it vip" ? call("tag_ticket", { ticketId: "T-1", tag: "vip" }) : call("get_ticket", { id: "T-1" });
      return new AIMessage(`${last.name}: ${(last.artifact as WritLangChainOutput).status}`);
    };
    // Each graph stands for one process: its own tools and version book.
    const graphInNewProcess = () => {
      const ctx = callContext(h, client);
      return toolLoop([writLangChainReadTool({ recordType: "ticket" }, ctx), writLangChainTool(tagTicketSpec, ctx)], script, checkpointer);
    };
    const config = { configurable: { thread_id: `thread-${randomUUID()}` } };

    await graphInNewProcess().invoke({ messages: [{ role: "user", content: "look at T-1" }] }, config);
    await outsideWrite(h, "ticket", "T-1", (s) => ({ ...s, tags: [...s.tags, "chargeback-risk"] }));
    const tagged = await graphInNewProcess().invoke({ messages: [{ role: "user", content: "tag it vip" }] }, config);

    expect(toolOutputs(tagged.messages, "tag_ticket")).toMatchObject([
      { status: "conflict", current: { version: '"v2"' }, your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }] },
    ]);
    expect((await readVersion(h.records, "ticket", "T-1")).state.tags).toEqual(["billing", "chargeback-risk"]);
  });

  it("threads-are-runs: the same refund in two threads is two intents, each written once", async () => {
    const h = await startDemoHarness({ payment: true });
    const ctx = callContext(h, await h.client("billing-agent"));
    const graph = toolLoop([writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundPaymentSpec, ctx)], readThenRefund, new MemorySaver());

    const outcomes: WritLangChainOutput[] = [];
    for (const threadId of [`thread-a-${randomUUID()}`, `thread-b-${randomUUID()}`]) {
      for (let attempt = 0; attempt < 2; attempt++) {
        // A fresh run of the same thread from the user's message: the harness retrying the whole turn.
        const result = await graph.invoke({ messages: [{ role: "user", content: "refund 5 EUR on pay_1" }] }, { configurable: { thread_id: threadId } });
        outcomes.push(...toolOutputs(result.messages, "refund_payment").slice(-1));
      }
    }

    expect(outcomes).toMatchObject([
      { status: "applied", duplicate: false },
      { status: "applied", duplicate: true },
      { status: "applied", duplicate: false },
      { status: "applied", duplicate: true },
    ]);
    expect(await refundsAt(h)).toBe(2);
  });

  it("denied: resuming with approved false writes nothing and tells the model not to retry", async () => {
    const h = await startDemoHarness({ payment: true });
    const ctx = callContext(h, await h.client("billing-agent"));
    const graph = toolLoop([writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundPaymentSpec, ctx, { approval: true })], readThenRefund, new MemorySaver());
    const config = { configurable: { thread_id: `thread-${randomUUID()}` } };

    await graph.invoke({ messages: [{ role: "user", content: "refund 5 EUR on pay_1" }] }, config);
    const denied = await graph.invoke(new Command({ resume: { approved: false, reason: "over the limit" } }), config);

    expect(toolOutputs(denied.messages, "refund_payment")).toMatchObject([{ status: "denied", reason: "over the limit" }]);
    expect(toolOutputs(denied.messages, "refund_payment")[0]!.instruction).toMatch(/nothing was written/);
    expect(await refundsAt(h)).toBe(0);
    expect(h.records.patchRequests()).toHaveLength(0);
  });

  it("conflict-back-to-the-model: a ticket changed since the model read it comes back with current and your_change; deciding again writes", async () => {
    const h = await startDemoHarness({ ticket: { status: "open", tags: ["billing"] } });
    const ctx = callContext(h, await h.client("support-agent"));
    const graph = toolLoop(
      [writLangChainReadTool({ recordType: "ticket" }, ctx), writLangChainTool(tagTicketSpec, ctx)],
      async (last) => {
        if (!ToolMessage.isInstance(last)) return call("get_ticket", { id: "T-1" });
        if (last.name === "get_ticket") {
          // Meanwhile another integration tags the ticket.
          await outsideWrite(h, "ticket", "T-1", (s) => ({ ...s, tags: [...s.tags, "chargeback-risk"] }));
          return call("tag_ticket", { ticketId: "T-1", tag: "vip" }, "call_1");
        }
        if ((last.artifact as WritLangChainOutput).status === "conflict") return call("tag_ticket", { ticketId: "T-1", tag: "vip" }, "call_2");
        return new AIMessage("tagged");
      },
      new MemorySaver(),
    );

    const result = await graph.invoke({ messages: [{ role: "user", content: "tag T-1 vip" }] }, { configurable: { thread_id: `thread-${randomUUID()}` } });

    const messages = result.messages.filter((m): m is ToolMessage => ToolMessage.isInstance(m) && m.name === "tag_ticket");
    const [conflict, decidedAgain] = messages.map((m) => m.artifact as WritLangChainOutput);
    expect(conflict).toMatchObject({
      status: "conflict",
      cycle: 1,
      current: { state: { tags: ["billing", "chargeback-risk"] }, version: '"v2"' },
      your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
    });
    // The model reads the content: the same object as JSON.
    expect(JSON.parse(String(messages[0]!.content))).toEqual(conflict);
    expect(conflict!.instruction).toMatch(/NOT applied/);
    expect(decidedAgain).toMatchObject({ status: "applied", duplicate: false });
    expect((await readVersion(h.records, "ticket", "T-1")).state.tags).toEqual(["billing", "chargeback-risk", "vip"]);
    expect(h.records.history("ticket", "T-1").filter((e) => e.kind === "patch")).toHaveLength(1);
  });

  it("unknown-outcome: outside a graph (run id from the context), no owner yet; the model is told not to assume failure, and asking again writes once", async () => {
    const h = await startDemoHarness({ payment: true, owner: false });
    await createRouterTopics(h);
    const client = await h.client("billing-agent");
    const ctx = callContext(h, client, { runId: `run-${randomUUID()}` });
    const refund = writLangChainTool(refundPaymentSpec, { ...ctx, timeoutMs: 1500 });

    // Called with a tool call, a LangChain tool answers with a ToolMessage.
    const unknown = (await refund.invoke({ id: "call_1", name: "refund_payment", args: refundArgs, type: "tool_call" })) as unknown as ToolMessage;
    await h.startRouter();
    const again = (await writLangChainTool(refundPaymentSpec, { ...ctx, timeoutMs: 30_000 }).invoke({
      id: "call_2",
      name: "refund_payment",
      args: refundArgs,
      type: "tool_call",
    })) as unknown as ToolMessage;

    expect(unknown.artifact).toMatchObject({ status: "unknown" });
    expect((unknown.artifact as WritLangChainOutput).instruction).toMatch(/do not assume it failed/i);
    expect(again.artifact).toMatchObject({ status: "applied" });
    expect(await refundsAt(h)).toBe(1);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });
});
