import { Agent, RunState, run, setTracingDisabled, type AgentInputItem, type RunResult } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall, modelResponder, type RecordedModelCall } from "@openai/agents/testing";
import { beforeAll, describe, expect, it } from "vitest";
import { refundPaymentSpec, tagTicketSpec } from "../../../examples/demo-tool-specs.ts";
import { writAgentReadTool, writAgentTool } from "../../../producers/adapters/openai-agents.ts";
import type { ModelToolResult } from "../../../producers/adapters/tool-bridge.ts";
import type { WritClient } from "../../../producers/writ-client.ts";
import { putRecord, recordReader, startDemoHarness } from "../../helpers/adapter-fixtures.ts";
import { readVersion, type Harness } from "../../helpers/writ-harness.ts";

beforeAll(() => setTracingDisabled(true));

const conversation = () => `conv-${Math.random().toString(36).slice(2, 10)}`;

/** The model's closing message, written from the last tool result it was given. */
const finalAnswer = modelResponder((call: RecordedModelCall) => {
  const input = call.request.input as AgentInputItem[];
  const last = [...input].reverse().find((i) => i.type === "function_call_result");
  const output = last && "output" in last ? (last.output as { type: string; text: string }) : undefined;
  const result = output ? (JSON.parse(output.text) as ModelToolResult) : undefined;
  return [assistantMessage(`tool said: ${result?.status ?? "nothing"}`)];
});

function toolOutputs(result: RunResult<any, any>): Record<string, ModelToolResult> {
  const out: Record<string, ModelToolResult> = {};
  for (const item of result.newItems) {
    if (item.type === "tool_call_output_item") out[(item.rawItem as { callId: string }).callId] = item.output as ModelToolResult;
  }
  return out;
}

function refundAgent(client: WritClient, h: Harness, model: ScriptedModel) {
  const refund = writAgentTool(refundPaymentSpec, { client, read: recordReader(h), needsApproval: true });
  return new Agent({ name: "billing-agent", instructions: "Refund payments the customer asks about.", model, tools: [refund] });
}

describe("OpenAI Agents JS adapter on a real broker", () => {
  it("approval-then-resume-twice-from-older-state: one refund, the second resume gets the stored reply", async () => {
    const h = await startDemoHarness({ payment: true });
    const client = await h.client("billing-agent");
    const runId = conversation();
    const call = { paymentId: "pay_1", amountCents: 500, reason: "damaged", note: "Photos of the broken item attached." };
    const model = new ScriptedModel([[functionCall("refund_payment", call, { callId: "call_refund" })], finalAnswer, finalAnswer]);

    const paused = await run(refundAgent(client, h, model), "Refund 5 EUR on pay_1, it arrived broken.", { context: { runId } });
    expect(paused.interruptions.map((i) => i.name)).toEqual(["refund_payment"]);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(0);
    const saved = paused.state.toString();

    // Resume 1: approve and run; it writes. Its new state is never stored (the harness crashes).
    const agent1 = refundAgent(client, h, model);
    const state1 = await RunState.fromString(agent1, saved);
    state1.approve(state1.getInterruptions()[0]!);
    const resumed1 = await run(agent1, state1);

    // Resume 2, as after the crash: new tools, a new client, the same older saved state, approved again.
    // The same agent (a restarted process keeps its agent id: run-scoped keys include it).
    const client2 = await h.client("billing-agent");
    const agent2 = refundAgent(client2, h, model);
    const state2 = await RunState.fromString(agent2, saved);
    state2.approve(state2.getInterruptions()[0]!);
    const resumed2 = await run(agent2, state2);

    expect(toolOutputs(resumed1).call_refund).toMatchObject({ status: "applied", duplicate: false });
    expect(toolOutputs(resumed2).call_refund).toMatchObject({ status: "applied", duplicate: true });
    expect(resumed1.finalOutput).toBe("tool said: applied");
    expect(resumed2.finalOutput).toBe("tool said: applied");
    model.assertComplete();
    const after = await readVersion(h.records, "payment", "pay_1");
    expect(after.state.refunds).toEqual([{ amountCents: 500, reason: "damaged" }]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment" && r.id === "pay_1")).toHaveLength(1);
  });

  it("race-with-outside-writer: the conflict carries current and your_change, and deciding again applies without a lost update", async () => {
    const h = await startDemoHarness({ ticket: { subject: "Charged twice", status: "open", tags: ["billing"] } });
    const client = await h.client("support-agent");
    const read = recordReader(h);
    const model = new ScriptedModel([
      [functionCall("read_record", { type: "ticket", id: "T-1" }, { callId: "call_read" })],
      modelResponder(async () => {
        // Another integration changes the ticket after the model read it.
        const res = await putRecord(h, "ticket", "T-1", (s) => ({ ...s, status: "pending" }));
        expect(res.status).toBe(200);
        return [functionCall("tag_ticket", { ticketId: "T-1", tag: "vip" }, { callId: "call_tag_1" })];
      }),
      // The model looks at `current` and decides again: a new tool-call id, the same intent.
      [functionCall("tag_ticket", { ticketId: "T-1", tag: "vip" }, { callId: "call_tag_2" })],
      finalAnswer,
    ]);
    const agent = new Agent({
      name: "support-agent",
      instructions: "Tag tickets.",
      model,
      tools: [writAgentReadTool({ read, recordTypes: ["ticket"] }), writAgentTool(tagTicketSpec, { client, read })],
    });

    const result = await run(agent, "Tag T-1 as vip.", { context: { runId: conversation() } });

    const outputs = toolOutputs(result);
    expect(outputs.call_read).toMatchObject({ status: "read", entity: { type: "ticket", id: "T-1" }, version: '"v1"' });
    expect(outputs.call_tag_1).toMatchObject({
      status: "conflict",
      cycle: 1,
      current: { version: '"v2"', state: { status: "pending", tags: ["billing"] } },
      your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
    });
    expect(outputs.call_tag_2).toMatchObject({ status: "applied", duplicate: false, version: '"v3"' });
    expect(result.finalOutput).toBe("tool said: applied");
    const after = await readVersion(h.records, "ticket", "T-1");
    expect(after.state).toEqual({ subject: "Charged twice", status: "pending", tags: ["billing", "vip"] });
  });

  it("a run without a run id fails before anything is sent", async () => {
    const h = await startDemoHarness({ payment: true, owner: false });
    const client = await h.client("billing-agent");
    const model = new ScriptedModel([[functionCall("refund_payment", { paymentId: "pay_1", amountCents: 500, reason: "damaged" }, { callId: "c1" })]]);
    const agent = new Agent({ name: "billing-agent", instructions: "x", model, tools: [writAgentTool(refundPaymentSpec, { client, read: recordReader(h) })] });

    await expect(run(agent, "Refund pay_1", { context: {} })).rejects.toThrow(/need a run id/);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(0);
  });
});
