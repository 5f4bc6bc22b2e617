// `npm run example:openai-agents`: an OpenAI Agents JS agent refunds through
// writ, with a human approval in between, and is resumed twice from the same
// saved state (as after a crash before the newer state was stored). No API
// key: a scripted model stands in for the LLM. It starts what it needs (the
// local broker and registry unless KAFKA_BROKERS is set, a records server, an
// owner in-process) and prints, last, what the records server holds.
import { randomUUID } from "node:crypto";
import { Agent, RunState, run, setTracingDisabled, type AgentInputItem, type RunResult } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall, modelResponder } from "@openai/agents/testing";
import { Kafka, logLevel } from "kafkajs";
import { writAgentTool } from "../producers/adapters/openai-agents.ts";
import type { ModelToolResult } from "../producers/adapters/tool-bridge.ts";
import { createWritClient, type WritClient } from "../producers/writ-client.ts";
import { ensureStack } from "../scripts/local-stack.ts";
import { createLogger } from "../src/logger.ts";
import { startRouter, type Router } from "../src/owner/router.ts";
import { startDemoRecordsServer } from "../src/sor/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../src/sor/http-adapter.ts";
import { refundPaymentSpec } from "./demo-tool-specs.ts";
import { systems, tools } from "./demo-tools.ts";

const say = (line: string) => console.log(line);
setTracingDisabled(true);

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
const id = randomUUID().slice(0, 8);
const topics = { intents: `writ.intents.ex-agents-${id}`, ledger: `writ.ledger.ex-agents-${id}`, human: `writ.human.ex-agents-${id}`, dlq: `writ.dlq.ex-agents-${id}` };
const replyTopic = `writ.replies.ex-agents-${id}`;
const logger = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: "example-openai-agents" });
const billing = createHttpSystemOfRecord({ name: "billing", baseUrl: records.url });
const clients: WritClient[] = [];
let router: Router | undefined;

/** The harness's store of saved run states (a database table in a real deployment). */
const savedStates = new Map<string, string>();

async function main(): Promise<{ refunds_created: number }> {
  const conversationId = `conv-${id}`;
  say(`writ + OpenAI Agents JS (conversation ${conversationId}); a scripted model stands in for the LLM, no API key`);
  say(`  Kafka ${brokers.join(",")}; registry ${registryUrl ?? "none (plain JSON)"}; records server ${records.url}`);
  const seeded = records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  router = await startRouter({
    config: { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.owners.ex-agents-${id}`, intentPartitions: 1, topics },
    tools,
    systems: systems({ RECORDS_URL: records.url }),
    logger,
  });
  say(`  owner started in-process on ${topics.intents}; pay_1001 at ${seeded.version} with 0 refunds`);

  say("");
  say("1. the agent runs; the model calls refund_payment, which needs approval");
  const paused = await run(await billingAgent(), "Please refund 50 EUR on pay_1001, the item arrived broken.", { context: { runId: conversationId } });
  const pending = paused.interruptions[0]!;
  say(`   paused: approve ${pending.name} ${pending.arguments}?`);
  savedStates.set(conversationId, paused.state.toString());
  say(`   state saved (${savedStates.get(conversationId)!.length} bytes); records server: ${await refundCount()} refund(s)`);

  say("");
  say("2. a person approves; the harness resumes from the saved state");
  const resumed = await resumeApproved(conversationId);
  describe(resumed);
  say("   ...and crashes before it stores the newer state");

  say("");
  say("3. after the restart: new process, new client, the same (older) saved state, approved again");
  const again = await resumeApproved(conversationId);
  describe(again);

  const refunds = await refundCount();
  say("");
  say(`records server: pay_1001 has ${refunds} refund(s) after two resumes; PATCH requests for it: ${records.patchRequests().filter((r) => r.id === "pay_1001").length}`);
  return { refunds_created: refunds };
}

/** The agent as a fresh process builds it: its own writ client, tool and model. */
async function billingAgent(): Promise<Agent<{ runId: string }>> {
  const client = await createWritClient({ brokers, agentId: "billing-agent", replyTopic, intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger });
  clients.push(client);
  const read = async (entity: { type: string; id: string }) => {
    const record = await billing.read(entity, { timeoutMs: 5_000 });
    if (!record) throw new Error(`${entity.type}:${entity.id} does not exist`);
    return record;
  };
  const refund = writAgentTool(refundPaymentSpec, { client, read, needsApproval: true });
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

async function refundCount(): Promise<number> {
  const record = await billing.read({ type: "payment", id: "pay_1001" }, { timeoutMs: 5_000 });
  return (record?.state as { refunds: unknown[] }).refunds.length;
}

async function shutdown(): Promise<void> {
  await Promise.all(clients.map((c) => c.close()));
  await router?.stop();
  await deleteTopics([...Object.values(topics), replyTopic]).catch(() => undefined);
  await records.close();
  if (stack.started) {
    say("  stopping the local broker and registry this example started");
    await stack.stop();
  }
}

async function deleteTopics(names: string[]): Promise<void> {
  const admin = new Kafka({ clientId: "writ-example-cleanup", brokers, logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const existing = new Set(await admin.listTopics());
    await admin.deleteTopics({ topics: names.filter((n) => existing.has(n)) });
  } finally {
    await admin.disconnect();
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
