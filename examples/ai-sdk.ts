// `npm run example:ai-sdk`: a refund through an AI SDK 7 tool, with approval,
// continued twice from the same saved messages; written once.
//
// No API key: the model is the SDK's own test model (`MockLanguageModelV4`
// from `ai/test`), scripted to read the payment, then ask for the refund. The
// broker, registry, records server and one owner are real (the owner runs
// in-process here; `npm run owner` is the same code). The last line is
// measured at the records server.
import { randomUUID } from "node:crypto";
import { generateText, stepCountIs, type ModelMessage, type ToolApprovalResponse } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { writReadTool, writTool, type WritRunContext } from "../producers/adapters/ai-sdk.ts";
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
const logger = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: "example-ai-sdk" });
const id = randomUUID().slice(0, 8);
const conversationId = `conv-ai-sdk-${id}`;

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
const topics = { intents: `writ.intents.ex-ai-sdk-${id}`, ledger: `writ.ledger.ex-ai-sdk-${id}`, human: `writ.human.ex-ai-sdk-${id}`, dlq: `writ.dlq.ex-ai-sdk-${id}` };
let router: Router | undefined;
let client: WritClient | undefined;

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + AI SDK 7 (conversation ${conversationId})`);
  say(`  Kafka ${brokers.join(",")}; registry ${registryUrl ?? "none (plain JSON)"}; records server ${records.url}`);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  router = await startRouter({
    config: { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.owners.ex-ai-sdk-${id}`, topics, intentPartitions: 3 },
    tools: [refundPayment, tagTicket],
    systems: systems({ RECORDS_URL: records.url }),
    logger,
  });
  client = await createWritClient({
    brokers,
    agentId: "billing-agent",
    replyTopic: `writ.replies.billing-agent.ex-ai-sdk-${id}`,
    intentsTopic: topics.intents,
    schemaRegistryUrl: registryUrl,
    logger,
  });
  say(`  one owner in-process (group writ.owners.ex-ai-sdk-${id}); agent client on writ.replies.billing-agent.ex-ai-sdk-${id}`);

  const billing = createHttpSystemOfRecord({ name: "billing", baseUrl: records.url });
  const run: WritRunContext = {
    client,
    runId: conversationId,
    versions: new VersionBook(),
    read: async (entity) => {
      const record = await billing.read(entity, { timeoutMs: 5000 });
      if (!record) throw new Error(`${entity.type} ${entity.id} not found`);
      return record;
    },
    timeoutMs: 60_000,
  };
  const tools = {
    get_payment: writReadTool({ recordType: "payment" }, run),
    refund_payment: writTool(refundPaymentSpec, run),
  };
  const model = scriptedModel();
  const settings = { model, tools, toolApproval: { refund_payment: "user-approval" as const }, stopWhen: stepCountIs(5) };

  say("");
  say("turn 1: the customer asks for 50.00 EUR back on pay_1001 (item arrived damaged)");
  const messages: ModelMessage[] = [{ role: "user", content: "My order pay_1001 arrived broken. Please refund 50 EUR." }];
  const turn1 = await generateText({ ...settings, messages });
  for (const r of toolResults(turn1.responseMessages)) say(`  model -> ${r.toolName}: ${describe(r.output)}`);
  const requests = turn1.content.filter((p) => p.type === "tool-approval-request");
  for (const req of requests) say(`  model -> ${req.toolCall.toolName} ${JSON.stringify(req.toolCall.input)}: approval requested`);
  messages.push(...turn1.responseMessages);

  say("a person approves; the harness saves the conversation and continues it");
  const approvals: ToolApprovalResponse[] = requests.map((req) => ({ type: "tool-approval-response", approvalId: req.approvalId, approved: true }));
  messages.push({ role: "tool", content: approvals });
  const saved = JSON.stringify(messages);
  for (const label of ["continuation 1", "continuation 2, from the same saved messages (as after a crash before the first one's result was stored)"]) {
    say(`  ${label}:`);
    const turn = await generateText({ ...settings, messages: JSON.parse(saved) as ModelMessage[] });
    for (const r of toolResults(turn.responseMessages)) say(`    ${r.toolName} executed: ${describe(r.output)}`);
    say(`    model: ${turn.text}`);
  }

  const payment = await readRecord("payment", "pay_1001");
  const refunds = (payment.state as { refunds: unknown[] }).refunds.length;
  const patches = records.patchRequests().filter((r) => r.type === "payment" && r.id === "pay_1001").length;
  say("");
  say(`records server: pay_1001 has ${refunds} refund(s) at ${payment.version}; PATCH requests for it: ${patches}`);
  return { refunds_created: refunds };
}

/**
 * The SDK's test model, scripted like a model that reads before it writes:
 * user message -> read the payment; read result -> refund; refund result -> a sentence.
 */
function scriptedModel(): MockLanguageModelV4 {
  const usage = {
    inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined },
    outputTokens: { total: 1, text: 1, reasoning: undefined },
  };
  const toolCall = (toolName: string, input: unknown) => ({
    content: [{ type: "tool-call" as const, toolCallId: `call_${toolName}_1`, toolName, input: JSON.stringify(input) }],
    finishReason: { unified: "tool-calls" as const, raw: undefined },
    usage,
    warnings: [],
  });
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const last = prompt.at(-1);
      const result = last?.role === "tool" ? last.content.findLast((p) => p.type === "tool-result") : undefined;
      if (!result) return toolCall("get_payment", { id: "pay_1001" });
      if (result.toolName === "get_payment") {
        return toolCall("refund_payment", { paymentId: "pay_1001", amountCents: 5000, reason: "damaged", note: "Customer sent photos of the broken item." });
      }
      const out = result.output.type === "json" ? (result.output.value as { status?: string; duplicate?: boolean }) : {};
      const text = out.status === "applied" ? `The refund is done${out.duplicate ? " (it had already been made)" : ""}.` : `The refund came back ${out.status}.`;
      return { content: [{ type: "text" as const, text }], finishReason: { unified: "stop" as const, raw: undefined }, usage, warnings: [] };
    },
  });
}

function toolResults(messages: readonly ModelMessage[]): { toolName: string; output: unknown }[] {
  return messages.flatMap((m) =>
    m.role === "tool"
      ? m.content.flatMap((p) => (p.type === "tool-result" && p.output.type === "json" ? [{ toolName: p.toolName, output: p.output.value }] : []))
      : [],
  );
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
