// `npm run example:ai-sdk`: a refund through an AI SDK 7 tool, with approval,
// continued twice from the same saved messages; written once.
//
// No API key: the model is the SDK's own test model (`MockLanguageModelV4`
// from `ai/test`), scripted to read the payment, then ask for the refund. The
// broker, registry, records server and one owner are real (the owner runs
// in-process here; `npm run owner` is the same code). The last line is
// measured at the records server.
import { generateText, stepCountIs, type ModelMessage, type ToolApprovalResponse } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { writReadTool, writTool, type WritRunContext } from "../producers/adapters/ai-sdk.ts";
import { VersionBook } from "../producers/adapters/tool-bridge.ts";
import { refundPaymentSpec } from "./demo-tool-specs.ts";
import { describeToolOutput, runExample, startExampleStack } from "./example-stack.ts";

const ex = await startExampleStack("ai-sdk");
const { records, say } = ex;
const conversationId = `conv-ai-sdk-${ex.id}`;

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + AI SDK 7 (conversation ${conversationId})`);
  say(ex.endpointsLine);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  await ex.startOwner({ intentPartitions: 3 });
  const client = await ex.client("billing-agent");
  say(`  one owner in-process (group ${ex.groupId}); agent client on ${ex.replyTopic("billing-agent")}`);

  const run: WritRunContext = { client, runId: conversationId, versions: new VersionBook(), read: ex.readEntity, timeoutMs: 60_000 };
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
  for (const r of toolResults(turn1.responseMessages)) say(`  model -> ${r.toolName}: ${describeToolOutput(r.output)}`);
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
    for (const r of toolResults(turn.responseMessages)) say(`    ${r.toolName} executed: ${describeToolOutput(r.output)}`);
    say(`    model: ${turn.text}`);
  }

  const refunds = await ex.refunds("pay_1001");
  say("");
  say(`records server: pay_1001 has ${refunds.count} refund(s) at ${refunds.version}; PATCH requests for it: ${refunds.patchRequests}`);
  return { refunds_created: refunds.count };
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

await runExample(ex, main);
