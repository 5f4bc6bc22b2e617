// `npm run example:langchain`: a refund through a LangChain tool in a LangGraph
// graph that interrupts for approval, resumes, and is then replayed from the
// older checkpoint (as after a crash before the newer one was stored); written once.
//
// No API key: the model turns are LangChain's own fake chat models
// (`@langchain/core/utils/testing`), scripted to read the payment, then ask for
// the refund, then answer. The broker, registry, records server and one owner
// are real (the owner runs in-process here; `npm run owner` is the same code).
// The last line is measured at the records server.
import { AIMessage, AIMessageChunk, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import { FakeListChatModel, FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { writLangChainReadTool, writLangChainTool, type WritApprovalRequest, type WritThreadContext } from "../producers/adapters/langchain.ts";
import { VersionBook } from "../producers/adapters/tool-bridge.ts";
import { refundPaymentSpec } from "./demo-tool-specs.ts";
import { describeToolOutput, runExample, startExampleStack } from "./example-stack.ts";

const ex = await startExampleStack("langchain", { tag: "lc" });
const { records, say } = ex;
const threadId = `thread-langchain-${ex.id}`;

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + LangChain.js / LangGraph (thread ${threadId})`);
  say(ex.endpointsLine);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  await ex.startOwner({ intentPartitions: 3 });
  const client = await ex.client("billing-agent");
  say(`  one owner in-process (group ${ex.groupId}); agent client on ${ex.replyTopic("billing-agent")}`);

  const ctx: WritThreadContext = { client, versions: new VersionBook(), read: ex.readEntity, timeoutMs: 60_000 };
  const tools = [writLangChainReadTool({ recordType: "payment" }, ctx), writLangChainTool(refundPaymentSpec, ctx, { approval: true })];
  const graph = new StateGraph(MessagesAnnotation)
    .addNode("agent", async ({ messages }) => ({ messages: [await scriptedTurn(messages, tools)] }))
    .addNode("tools", new ToolNode(tools))
    .addEdge(START, "agent")
    .addConditionalEdges("agent", toolsCondition, ["tools", END])
    .addEdge("tools", "agent")
    .compile({ checkpointer: new MemorySaver() });
  const config = { configurable: { thread_id: threadId } };

  say("");
  say("the customer asks for 50.00 EUR back on pay_1001 (item arrived damaged)");
  const first = await graph.invoke({ messages: [{ role: "user", content: "My order pay_1001 arrived broken. Please refund 50 EUR." }] }, config);
  for (const m of first.messages) if (ToolMessage.isInstance(m)) say(`  ${m.name}: ${describeToolOutput(m.artifact)}`);
  const asked = await graph.getState(config);
  for (const i of asked.tasks.flatMap((t) => t.interrupts)) {
    const req = i.value as WritApprovalRequest;
    say(`  interrupt: approve ${req.tool} ${JSON.stringify(req.params)} on ${req.entity.type} ${req.entity.id}?`);
  }
  say(`  checkpoint ${asked.config.configurable?.checkpoint_id} stored, next: ${asked.next.join(",")}`);

  say("a person approves: resume the thread with Command({ resume: { approved: true } })");
  const resumed = await graph.invoke(new Command({ resume: { approved: true } }), config);
  report(resumed.messages);

  say("replay from that older checkpoint (as after a crash before the newer checkpoint was stored)");
  const replayed = await graph.invoke(new Command({ resume: { approved: true } }), asked.config);
  report(replayed.messages);

  const refunds = await ex.refunds("pay_1001");
  say("");
  say(`records server: pay_1001 has ${refunds.count} refund(s) at ${refunds.version}; PATCH requests for it: ${refunds.patchRequests}`);
  return { refunds_created: refunds.count };
}

/**
 * One model turn, from LangChain's fake chat models: the user's message ->
 * read the payment; the read -> the refund; the refund's result -> a sentence.
 */
async function scriptedTurn(messages: BaseMessage[], tools: Parameters<FakeStreamingChatModel["bindTools"]>[0]): Promise<BaseMessage> {
  const last = messages.at(-1);
  const callTool = (name: string, args: Record<string, unknown>) =>
    new FakeStreamingChatModel({ chunks: [new AIMessageChunk({ content: "", tool_calls: [{ id: `call_${name}_1`, name, args, type: "tool_call" }] })] })
      .bindTools(tools)
      .invoke(messages);
  if (!ToolMessage.isInstance(last)) return callTool("get_payment", { id: "pay_1001" });
  if (last.name === "get_payment") return callTool("refund_payment", { paymentId: "pay_1001", amountCents: 5000, reason: "damaged", note: "Customer sent photos of the broken item." });
  const out = last.artifact as { status?: string; duplicate?: boolean };
  const text = out.status === "applied" ? `The refund is done${out.duplicate ? " (it had already been made)" : ""}.` : `The refund came back ${out.status}.`;
  const said = await new FakeListChatModel({ responses: [text] }).invoke(messages);
  return new AIMessage(String(said.content));
}

function report(messages: BaseMessage[]): void {
  const refund = messages.findLast((m) => ToolMessage.isInstance(m) && m.name === "refund_payment") as ToolMessage | undefined;
  if (refund) say(`  refund_payment ran: ${describeToolOutput(refund.artifact)}`);
  say(`  model: ${String(messages.at(-1)?.content)}`);
}

await runExample(ex, main);
