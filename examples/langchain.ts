// `npm run example:langchain`: a refund through a LangChain tool in a LangGraph
// graph that interrupts for approval, resumes, and is then replayed from the
// older checkpoint (as after a crash before the newer one was stored); written once.
//
// No API key: the model turns are LangChain's own fake chat models
// (`@langchain/core/utils/testing`), scripted to read the payment, then ask for
// the refund, then answer. The broker, registry, records server and one owner
// are real (the owner runs in-process here; `npm run owner` is the same code).
// The last line is measured at the records server.
import { randomUUID } from "node:crypto";
import { AIMessage, AIMessageChunk, ToolMessage, type BaseMessage } from "@langchain/core/messages";
import { FakeListChatModel, FakeStreamingChatModel } from "@langchain/core/utils/testing";
import { Command, END, MemorySaver, MessagesAnnotation, START, StateGraph } from "@langchain/langgraph";
import { ToolNode, toolsCondition } from "@langchain/langgraph/prebuilt";
import { writLangChainReadTool, writLangChainTool, type WritApprovalRequest, type WritThreadContext } from "../producers/adapters/langchain.ts";
import { VersionBook } from "../producers/adapters/tool-bridge.ts";
import { createWritClient, type WritClient } from "../producers/writ-client.ts";
import { ensureStack } from "../scripts/local-stack.ts";
import { createLogger } from "../src/logger.ts";
import { startRouter, type Router } from "../src/owner/router.ts";
import { startDemoRecordsServer } from "../src/sor/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../src/sor/http-adapter.ts";
import { refundPaymentSpec } from "./demo-tool-specs.ts";
import { refundPayment, systems, tagTicket } from "./demo-tools.ts";

// kafkajs 2.2.4 sets a negative timeout once per process on Node 24 (harmless), and
// announces its v2 partitioner; neither helps a reader of this example.
process.removeAllListeners("warning");
process.on("warning", (w) => {
  if (w.name !== "TimeoutNegativeWarning") process.stderr.write(`${w.name}: ${w.message}\n`);
});
process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";

const say = (line: string) => console.log(line);
const logger = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: "example-langchain" });
const id = randomUUID().slice(0, 8);
const threadId = `thread-langchain-${id}`;

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
const topics = { intents: `writ.intents.ex-lc-${id}`, ledger: `writ.ledger.ex-lc-${id}`, human: `writ.human.ex-lc-${id}`, dlq: `writ.dlq.ex-lc-${id}` };
let router: Router | undefined;
let client: WritClient | undefined;

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + LangChain.js / LangGraph (thread ${threadId})`);
  say(`  Kafka ${brokers.join(",")}; registry ${registryUrl ?? "none (plain JSON)"}; records server ${records.url}`);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  router = await startRouter({
    config: { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.owners.ex-lc-${id}`, topics, intentPartitions: 3 },
    tools: [refundPayment, tagTicket],
    systems: systems({ RECORDS_URL: records.url }),
    logger,
  });
  client = await createWritClient({
    brokers,
    agentId: "billing-agent",
    replyTopic: `writ.replies.billing-agent.ex-lc-${id}`,
    intentsTopic: topics.intents,
    schemaRegistryUrl: registryUrl,
    logger,
  });
  say(`  one owner in-process (group writ.owners.ex-lc-${id}); agent client on writ.replies.billing-agent.ex-lc-${id}`);

  const billing = createHttpSystemOfRecord({ name: "billing", baseUrl: records.url });
  const ctx: WritThreadContext = {
    client,
    versions: new VersionBook(),
    read: async (entity) => {
      const record = await billing.read(entity, { timeoutMs: 5000 });
      if (!record) throw new Error(`${entity.type} ${entity.id} not found`);
      return record;
    },
    timeoutMs: 60_000,
  };
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
  for (const m of first.messages) if (ToolMessage.isInstance(m)) say(`  ${m.name}: ${describe(m.artifact)}`);
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

  const payment = await readRecord("payment", "pay_1001");
  const refunds = (payment.state as { refunds: unknown[] }).refunds.length;
  const patches = records.patchRequests().filter((r) => r.type === "payment" && r.id === "pay_1001").length;
  say("");
  say(`records server: pay_1001 has ${refunds} refund(s) at ${payment.version}; PATCH requests for it: ${patches}`);
  return { refunds_created: refunds };
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
  if (refund) say(`  refund_payment ran: ${describe(refund.artifact)}`);
  say(`  model: ${String(messages.at(-1)?.content)}`);
}

function describe(output: unknown): string {
  const o = output as { status: string; version?: string; duplicate?: boolean; record?: { refunds?: unknown[] }; instruction?: string };
  switch (o.status) {
    case "read":
      return `read at ${o.version}, ${o.record?.refunds?.length ?? 0} refund(s)`;
    case "applied":
      return o.duplicate ? `applied at ${o.version} (duplicate: the ledger's stored reply, nothing written)` : `applied at ${o.version}`;
    default:
      return `${o.status}: ${o.instruction}`;
  }
}

async function readRecord(type: string, recordId: string): Promise<{ state: unknown; version: string }> {
  const res = await fetch(`${records.url}/records/${type}/${recordId}`);
  if (!res.ok) throw new Error(`records server: GET ${type}/${recordId} answered ${res.status}`);
  return { state: await res.json(), version: res.headers.get("etag")! };
}

async function shutdown(): Promise<void> {
  await client?.close();
  await router?.stop();
  await records.close();
  if (stack.started) {
    say("  stopping the local broker and registry this example started");
    await stack.stop();
  }
}

let exitCode = 0;
try {
  const result = await main();
  await shutdown();
  console.log(JSON.stringify(result));
} catch (err) {
  console.error("example failed:", err);
  exitCode = 1;
  await shutdown().catch(() => undefined);
}
process.exit(exitCode);
