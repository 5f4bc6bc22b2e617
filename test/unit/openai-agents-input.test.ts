// The OpenAI Agents JS adapter with a scripted model and a scripted client (no broker): arguments the model
// sent that do not parse go back to the model as a `rejected` result to fix, nothing sent; before, the
// tools' `errorFunction: null` made them end the whole run (ToolCallError). Errors that leave a write's
// outcome open still end the run (a resume from the saved RunState asks for it).
import { Agent, run, setTracingDisabled, type RunResult } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { KafkaJSNumberOfRetriesExceeded, KafkaJSRequestTimeoutError } from "kafkajs";
import { beforeAll, describe, expect, it, vi } from "vitest";
import { refundPaymentSpec } from "../../examples/demo-tool-specs.ts";
import { writAgentReadTool, writAgentTool } from "../../producers/adapters/openai-agents.ts";
import type { SubmitResult } from "../../producers/writ-client.ts";
import type { Versioned } from "../../src/schemas/common.ts";
import { scripted } from "../helpers/scripted-client.ts";

beforeAll(() => setTracingDisabled(true));

const read = async (): Promise<Versioned> => ({ state: { amountCents: 10_000, refunds: [] }, version: '"v1"' });
const applied = { status: "applied", intentId: "i", intentKey: "k", duplicate: false, at: "2025-01-01T00:00:00.000Z", entity: { type: "payment", id: "pay_1" }, state: {}, version: '"v2"', via: "patch" } as SubmitResult;

function outputs(result: RunResult<any, any>): unknown[] {
  return result.newItems.filter((i) => i.type === "tool_call_output_item").map((i) => (i as { output: unknown }).output);
}

async function runWith(calls: Record<string, unknown>[], answer: () => SubmitResult, extraTools: "read" | "none" = "none", needsApproval = false) {
  const { client, sent } = scripted(answer);
  const model = new ScriptedModel([...calls.map((args, i) => [functionCall(i === 0 && extraTools === "read" ? "read_record" : "refund_payment", args, { callId: `call_${i}` })]), [assistantMessage("done")]]);
  const tools = [writAgentTool(refundPaymentSpec, { client, read, needsApproval }), ...(extraTools === "read" ? [writAgentReadTool({ read, recordTypes: ["payment"] })] : [])];
  const agent = new Agent({ name: "billing-agent", instructions: "x", model, tools });
  return { result: await run(agent, "refund", { context: { runId: "run-oa-input" } }), sent };
}

describe("OpenAI Agents adapter: a model's arguments that do not parse", () => {
  it("a refund of 0 cents is answered rejected invalid_params, nothing sent, and the model's corrected call writes", async () => {
    const { result, sent } = await runWith([{ paymentId: "pay_1", amountCents: 0, reason: "damaged" }, { paymentId: "pay_1", amountCents: 500, reason: "damaged" }], () => applied);
    const [bad, good] = outputs(result);
    expect(bad).toMatchObject({ status: "rejected", reason: "invalid_params", instruction: expect.stringContaining("Fix them") });
    // Not the SDK's "Invalid JSON input" (it was JSON): with its tool data redacted (its default), no field is named.
    expect((bad as { message: string }).message).toMatch(/^the arguments do not parse as JSON or do not match the tool's parameters/);
    expect((bad as { message: string }).message).not.toMatch(/Invalid JSON/);
    expect(good).toMatchObject({ status: "applied" });
    expect(sent).toHaveLength(1);
    expect(result.finalOutput).toBe("done");
  });

  it("where the SDK may show tool data (OPENAI_AGENTS_DONT_LOG_TOOL_DATA=0), the answer names the field", async () => {
    vi.stubEnv("OPENAI_AGENTS_DONT_LOG_TOOL_DATA", "0");
    try {
      const { result, sent } = await runWith([{ paymentId: "pay_1", amountCents: 0, reason: "damaged" }], () => applied);
      expect(outputs(result)).toEqual([expect.objectContaining({ status: "rejected", reason: "invalid_params", message: expect.stringMatching(/^the arguments do not match the tool's parameters: .*amountCents/s) })]);
      expect(sent).toHaveLength(0);
    } finally {
      vi.unstubAllEnvs();
    }
  });

  it("with approval: no person is asked to approve arguments that do not parse (a missing intent field ended the run); they are answered rejected", async () => {
    for (const args of [{ paymentId: "pay_1", amountCents: 500 }, { paymentId: "pay_1", amountCents: 0, reason: "damaged" }, { amountCents: 500, reason: "damaged" }]) {
      const { result, sent } = await runWith([args], () => applied, "none", true);
      expect(result.interruptions).toEqual([]);
      expect(outputs(result)).toEqual([expect.objectContaining({ status: "rejected", reason: "invalid_params" })]);
      expect(sent).toHaveLength(0);
    }
  });

  it("the read tool answers an unknown record type the same way", async () => {
    const { result, sent } = await runWith([{ type: "invoice", id: "inv_1" }], () => applied, "read");
    expect(outputs(result)).toEqual([expect.objectContaining({ status: "rejected", reason: "invalid_params" })]);
    expect(sent).toHaveLength(0);
  });

  it("an error that leaves the outcome open still ends the run", async () => {
    const thrown = new KafkaJSNumberOfRetriesExceeded(new KafkaJSRequestTimeoutError("Request Produce timed out"), { retryCount: 5, retryTime: 3000 });
    await expect(
      runWith([{ paymentId: "pay_1", amountCents: 500, reason: "damaged" }], () => {
        throw thrown;
      }),
    ).rejects.toThrow(/Produce timed out|retries/i);
  });
});
