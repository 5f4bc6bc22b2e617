// `npm run example:openai-agents`: an OpenAI Agents JS agent refunds through
// writ, with a human approval in between, and is resumed twice from the same
// saved state (as after a crash before the newer state was stored). No API
// key: a scripted model stands in for the LLM. It starts what it needs (the
// local broker and registry unless KAFKA_BROKERS is set, a records server, an
// owner in-process) and prints, last, what the records server holds.
import { Agent, RunState, run, setTracingDisabled, type AgentInputItem, type RunResult } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from "@openai/agents/testing";
import { writAgentTool } from "../producers/adapters/openai-agents.ts";
import type { ModelToolResult } from "../producers/adapters/tool-bridge.ts";
import { refundPaymentSpec } from "./demo-tool-specs.ts";
import { runExample, startExampleStack } from "./example-stack.ts";

setTracingDisabled(true);
const ex = await startExampleStack("openai-agents", { tag: "agents", deleteTopics: true });
const { records, say } = ex;

/** The harness's store of saved run states (a database table in a real deployment). */
const savedStates = new Map<string, string>();

async function main(): Promise<{ refunds_created: number }> {
  const conversationId = `conv-${ex.id}`;
  say(`writ + OpenAI Agents JS (conversation ${conversationId}); a scripted model stands in for the LLM, no API key`);
  say(ex.endpointsLine);
  const seeded = records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  await ex.startOwner();
  say(`  owner started in-process on ${ex.topics.intents}; pay_1001 at ${seeded.version} with 0 refunds`);

  say("");
  say("1. the agent runs; the model calls refund_payment, which needs approval");
  const paused = await run(await billingAgent(), "Please refund 50 EUR on pay_1001, the item arrived broken.", { context: { runId: conversationId } });
  const pending = paused.interruptions[0]!;
  say(`   paused: approve ${pending.name} ${pending.arguments}?`);
  savedStates.set(conversationId, paused.state.toString());
  say(`   state saved (${savedStates.get(conversationId)!.length} bytes); records server: ${(await ex.refunds("pay_1001")).count} refund(s)`);

  say("");
  say("2. a person approves; the harness resumes from the saved state");
  const resumed = await resumeApproved(conversationId);
  describe(resumed);
  say("   ...and crashes before it stores the newer state");

  say("");
  say("3. after the restart: new process, new client, the same (older) saved state, approved again");
  const again = await resumeApproved(conversationId);
  describe(again);

  const refunds = await ex.refunds("pay_1001");
  say("");
  say(`records server: pay_1001 has ${refunds.count} refund(s) after two resumes; PATCH requests for it: ${refunds.patchRequests}`);
  return { refunds_created: refunds.count };
}

/** The agent as a fresh process builds it: its own writ client, tool and model. */
async function billingAgent(): Promise<Agent<{ runId: string }>> {
  const client = await ex.client("billing-agent");
  const refund = writAgentTool(refundPaymentSpec, { client, read: ex.readEntity, needsApproval: true });
  return new Agent<{ runId: string }>({ name: "billing-agent", instructions: "Refund what customers ask for, once.", model: scriptedModel(), tools: [refund] });
}

/** One model turn, decided from the transcript as an LLM would: call the tool, or answer from its result. */
function scriptedModel(): ScriptedModel {
  return new ScriptedModel([
    modelResponder((call) => {
      const input = call.request.input as AgentInputItem[];
      const result = [...input].reverse().find((i) => i.type === "function_call_result");
      if (!result || !("output" in result)) {
        return [functionCall("refund_payment", { paymentId: "pay_1001", amountCents: 5000, reason: "damaged", note: "Customer sent photos of the broken item." }, { callId: "call_refund_1" })];
      }
      const reply = JSON.parse((result.output as { text: string }).text) as ModelToolResult;
      return [assistantMessage(reply.status === "applied" ? `Refunded 50.00 EUR on pay_1001 (record now at ${reply.version}).` : `The refund is ${reply.status}.`)];
    }),
  ]);
}

async function resumeApproved(conversationId: string): Promise<RunResult<any, any>> {
  const agent = await billingAgent();
  const state = await RunState.fromString(agent, savedStates.get(conversationId)!);
  for (const interruption of state.getInterruptions()) state.approve(interruption);
  return run(agent, state);
}

function describe(result: RunResult<any, any>): void {
  for (const item of result.newItems) {
    if (item.type !== "tool_call_output_item") continue;
    const r = item.output as ModelToolResult;
    const detail =
      r.status === "applied" ? `applied at ${r.version}${r.duplicate ? " (duplicate: the stored reply, nothing written)" : ""}` : `${r.status}: ${r.instruction}`;
    say(`   refund_payment -> ${detail}`);
  }
  say(`   agent: "${String(result.finalOutput)}"`);
}

await runExample(ex, main);
