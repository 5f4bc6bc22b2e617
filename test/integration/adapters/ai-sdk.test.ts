import { randomUUID } from "node:crypto";
import { generateText, stepCountIs, type ModelMessage, type ToolSet } from "ai";
import { MockLanguageModelV4 } from "ai/test";
import { describe, expect, it } from "vitest";
import { refundPaymentSpec, tagTicketSpec } from "../../../examples/demo-tool-specs.ts";
import { writReadTool, writTool, type WritRunContext, type WritToolOutput } from "../../../producers/adapters/ai-sdk.ts";
import { callContext, createRouterTopics, outsideWrite, refundsAt, startDemoHarness } from "../../helpers/adapter-fixtures.ts";
import { readVersion } from "../../helpers/writ-harness.ts";

const refundArgs = { paymentId: "pay_1", amountCents: 500, reason: "damaged", note: "Photos attached." };

interface ToolCallStep {
  tool: string;
  input: unknown;
  id?: string;
}
/** What the scripted model does next, given the last tool result it sees (none: the user spoke). */
type Script = (last: { toolName: string; toolCallId: string; output: any } | undefined, step: number) => ToolCallStep | string | Promise<ToolCallStep | string>;

/** The SDK's test model, answering each step from `script`. */
function scriptedModel(script: Script): MockLanguageModelV4 {
  const usage = { inputTokens: { total: 1, noCache: 1, cacheRead: undefined, cacheWrite: undefined }, outputTokens: { total: 1, text: 1, reasoning: undefined } };
  let step = 0;
  return new MockLanguageModelV4({
    doGenerate: async ({ prompt }) => {
      const lastMsg = prompt.at(-1);
      const part = lastMsg?.role === "tool" ? lastMsg.content.findLast((p) => p.type === "tool-result") : undefined;
      const last = part ? { toolName: part.toolName, toolCallId: part.toolCallId, output: part.output.type === "json" ? part.output.value : part.output } : undefined;
      const next = await script(last, step++);
      if (typeof next === "string") return { content: [{ type: "text", text: next }], finishReason: { unified: "stop", raw: undefined }, usage, warnings: [] };
      return {
        content: [{ type: "tool-call", toolCallId: next.id ?? `call_${next.tool}_${step}`, toolName: next.tool, input: JSON.stringify(next.input) }],
        finishReason: { unified: "tool-calls", raw: undefined },
        usage,
        warnings: [],
      };
    },
  });
}

/** Tool outputs of one generateText result, in order, by tool name. */
function outputsOf(messages: readonly ModelMessage[], toolName: string): any[] {
  return messages.flatMap((m) =>
    m.role === "tool" ? m.content.flatMap((p) => (p.type === "tool-result" && p.toolName === toolName && p.output.type === "json" ? [p.output.value] : [])) : [],
  );
}

const readThenRefund: Script = (last) => {
  if (!last) return { tool: "get_payment", input: { id: "pay_1" } };
  if (last.toolName === "get_payment") return { tool: "refund_payment", input: refundArgs, id: "call_refund_1" };
  return `refund: ${last.output.status}`;
};

describe("AI SDK adapter on a real broker", () => {
  it("approval-then-replay: an approved refund, continued twice from the same saved messages, writes once", async () => {
    const h = await startDemoHarness({ payment: true });
    const run = callContext(h, await h.client("billing-agent"), { runId: `conv-${randomUUID()}` });
    const tools = { get_payment: writReadTool({ recordType: "payment" }, run), refund_payment: writTool(refundPaymentSpec, run) };
    const settings = { model: scriptedModel(readThenRefund), tools, toolApproval: { refund_payment: "user-approval" as const }, stopWhen: stepCountIs(5) };

    const messages: ModelMessage[] = [{ role: "user", content: "refund 5 EUR on pay_1" }];
    const asked = await generateText({ ...settings, messages });
    const request = asked.content.find((p) => p.type === "tool-approval-request");
    expect(request?.toolCall.toolName).toBe("refund_payment");
    expect(h.records.patchRequests()).toHaveLength(0);
    messages.push(...asked.responseMessages, { role: "tool", content: [{ type: "tool-approval-response", approvalId: request!.approvalId, approved: true }] });
    const saved = JSON.stringify(messages);

    const first = await generateText({ ...settings, messages: JSON.parse(saved) });
    const second = await generateText({ ...settings, messages: JSON.parse(saved) });

    expect(outputsOf(first.responseMessages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: false, entity: { type: "payment", id: "pay_1" } }]);
    expect(outputsOf(second.responseMessages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: true }]);
    expect(await refundsAt(h)).toBe(1);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });

  it("continued-in-a-new-process: fresh tools and version book still repeat the approved attempt (base recalled from the saved read)", async () => {
    const h = await startDemoHarness({ payment: true });
    const client = await h.client("billing-agent");
    const runId = `conv-${randomUUID()}`;
    const toolsFor = (run: WritRunContext): ToolSet => ({ get_payment: writReadTool({ recordType: "payment" }, run), refund_payment: writTool(refundPaymentSpec, run) });
    const settings = (tools: ToolSet) => ({ model: scriptedModel(readThenRefund), tools, toolApproval: { refund_payment: "user-approval" as const }, stopWhen: stepCountIs(5) });

    const messages: ModelMessage[] = [{ role: "user", content: "refund 5 EUR on pay_1" }];
    const asked = await generateText({ ...settings(toolsFor(callContext(h, client, { runId }))), messages });
    const request = asked.content.find((p) => p.type === "tool-approval-request")!;
    messages.push(...asked.responseMessages, { role: "tool", content: [{ type: "tool-approval-response", approvalId: request.approvalId, approved: true }] });
    const saved = JSON.stringify(messages);

    // Each continuation in its own "process": new tools, new version book, new in-memory bases.
    const first = await generateText({ ...settings(toolsFor(callContext(h, client, { runId }))), messages: JSON.parse(saved) });
    const second = await generateText({ ...settings(toolsFor(callContext(h, client, { runId }))), messages: JSON.parse(saved) });

    expect(outputsOf(first.responseMessages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: false }]);
    expect(outputsOf(second.responseMessages, "refund_payment")).toMatchObject([{ status: "applied", duplicate: true }]);
    expect(await refundsAt(h)).toBe(1);
  });

  it("continued-in-a-new-process on a strict tool: the write is based on the version the model read, so a change made meanwhile is a conflict", async () => {
    const h = await startDemoHarness({ ticket: { status: "open", tags: ["billing"] } });
    const client = await h.client("support-agent");
    const runId = `conv-${randomUUID()}`;
    const toolsFor = (run: WritRunContext): ToolSet => ({ get_ticket: writReadTool({ recordType: "ticket" }, run), tag_ticket: writTool(tagTicketSpec, run) });

    const messages: ModelMessage[] = [{ role: "user", content: "look at T-1" }];
    const looked = await generateText({
      model: scriptedModel((last) => (last ? "T-1 is tagged billing." : { tool: "get_ticket", input: { id: "T-1" } })),
      tools: toolsFor(callContext(h, client, { runId })),
      messages,
      stopWhen: stepCountIs(3),
    });
    messages.push(...looked.responseMessages);
    await outsideWrite(h, "ticket", "T-1", (s) => ({ ...s, tags: [...s.tags, "chargeback-risk"] }));
    messages.push({ role: "user", content: "tag it vip" });

    // Another process continues the conversation: new tools, empty version book.
    const tagged = await generateText({
      model: scriptedModel((last) => (last ? "done" : { tool: "tag_ticket", input: { ticketId: "T-1", tag: "vip" } })),
      tools: toolsFor(callContext(h, client, { runId })),
      messages,
      stopWhen: stepCountIs(3),
    });

    expect(outputsOf(tagged.responseMessages, "tag_ticket")).toMatchObject([
      { status: "conflict", current: { version: '"v2"' }, your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }] },
    ]);
    expect((await readVersion(h.records, "ticket", "T-1")).state.tags).toEqual(["billing", "chargeback-risk"]);
  });

  it("retry-with-new-tool-call-id: the model calls the refund again under a new id with a reworded note; one refund", async () => {
    const h = await startDemoHarness({ payment: true });
    const run = callContext(h, await h.client("billing-agent"), { runId: `conv-${randomUUID()}` });
    const tools = { get_payment: writReadTool({ recordType: "payment" }, run), refund_payment: writTool(refundPaymentSpec, run) };
    const model = scriptedModel((last) => {
      if (!last) return { tool: "get_payment", input: { id: "pay_1" } };
      if (last.toolName === "get_payment") return { tool: "refund_payment", input: refundArgs, id: "call_a" };
      if (last.toolCallId === "call_a") return { tool: "refund_payment", input: { ...refundArgs, note: "Refund for the damaged item." }, id: "call_b" };
      return "done";
    });

    const result = await generateText({ model, tools, messages: [{ role: "user", content: "refund 5 EUR on pay_1" }], stopWhen: stepCountIs(6) });

    expect(outputsOf(result.responseMessages, "refund_payment")).toMatchObject([
      { status: "applied", duplicate: false },
      { status: "applied", duplicate: true },
    ]);
    expect(await refundsAt(h)).toBe(1);
  });

  it("conflict-back-to-the-model: a ticket changed since the model read it comes back with current and your_change; deciding again writes", async () => {
    const h = await startDemoHarness({ ticket: { status: "open", tags: ["billing"] } });
    const run = callContext(h, await h.client("support-agent"), { runId: `conv-${randomUUID()}` });
    const tools = { get_ticket: writReadTool({ recordType: "ticket" }, run), tag_ticket: writTool(tagTicketSpec, run) };
    const model = scriptedModel(async (last) => {
      if (!last) return { tool: "get_ticket", input: { id: "T-1" } };
      if (last.toolName === "get_ticket") {
        // Meanwhile another integration tags the ticket.
        await outsideWrite(h, "ticket", "T-1", (s) => ({ ...s, tags: [...s.tags, "chargeback-risk"] }));
        return { tool: "tag_ticket", input: { ticketId: "T-1", tag: "vip" }, id: "call_1" };
      }
      if (last.output.status === "conflict") return { tool: "tag_ticket", input: { ticketId: "T-1", tag: "vip" }, id: "call_2" };
      return "tagged";
    });

    const result = await generateText({ model, tools, messages: [{ role: "user", content: "tag T-1 vip" }], stopWhen: stepCountIs(6) });

    const [conflict, decidedAgain] = outputsOf(result.responseMessages, "tag_ticket") as WritToolOutput[];
    expect(conflict).toMatchObject({
      status: "conflict",
      cycle: 1,
      current: { state: { tags: ["billing", "chargeback-risk"] }, version: '"v2"' },
      your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
      entity: { type: "ticket", id: "T-1" },
    });
    expect(conflict!.instruction).toMatch(/NOT applied/);
    expect(decidedAgain).toMatchObject({ status: "applied", duplicate: false });
    const ticket = await readVersion(h.records, "ticket", "T-1");
    expect(ticket.state.tags).toEqual(["billing", "chargeback-risk", "vip"]);
    expect(h.records.history("ticket", "T-1").filter((e) => e.kind === "patch")).toHaveLength(1);
  });

  it("unknown-outcome: no owner answers before the deadline; the model is told not to assume failure, and asking again writes once", async () => {
    const h = await startDemoHarness({ payment: true, owner: false });
    await createRouterTopics(h);
    const client = await h.client("billing-agent");
    const runId = `conv-${randomUUID()}`;
    const base = callContext(h, client, { runId });
    // The first refund call gets a short deadline and no owner is running yet.
    const run = (call: { toolCallId: string }): WritRunContext => ({ ...base, timeoutMs: call.toolCallId === "call_1" ? 1500 : 30_000 });
    const tools = { get_payment: writReadTool({ recordType: "payment" }, run), refund_payment: writTool(refundPaymentSpec, run) };
    const model = scriptedModel(async (last) => {
      if (!last) return { tool: "get_payment", input: { id: "pay_1" } };
      if (last.toolName === "get_payment") return { tool: "refund_payment", input: refundArgs, id: "call_1" };
      if (last.output.status === "unknown") {
        await h.startRouter();
        return { tool: "refund_payment", input: refundArgs, id: "call_2" };
      }
      return "done";
    });

    const result = await generateText({ model, tools, messages: [{ role: "user", content: "refund 5 EUR on pay_1" }], stopWhen: stepCountIs(6) });

    const [unknown, again] = outputsOf(result.responseMessages, "refund_payment");
    expect(unknown.status).toBe("unknown");
    expect(unknown.instruction).toMatch(/do not assume it failed/i);
    expect(again).toMatchObject({ status: "applied" });
    expect(await refundsAt(h)).toBe(1);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });
});
