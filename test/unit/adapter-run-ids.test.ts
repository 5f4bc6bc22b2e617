// A run or step id longer than an intent carries (the wire's 256 characters), from a harness (`_meta` over MCP,
// a LangGraph thread id, a conversation id, WRIT_RUN_ID): refused at once naming where it came from, before a
// read, a pin or a version book is made for it. Before, every write of such a run failed at encoding
// (`codec_failed`, the schema's issues as text) after a read, and the MCP read tool kept a book per id however long.
// The AI SDK and LangChain read tools refuse one too (they read, and the model went on to a write that failed). A
// step id is not set only when undefined or null: a falsy test took step 0 for none. A stdio MCP server with no run
// id configured warns that each process is its own run.
import { Agent, run, setTracingDisabled } from "@openai/agents";
import { ScriptedModel, assistantMessage, functionCall } from "@openai/agents/testing";
import { pino } from "pino";
import { beforeAll, describe, expect, it } from "vitest";
import { refundPaymentSpec, tagTicketSpec } from "../../examples/demo-tool-specs.ts";
import { writReadTool } from "../../producers/adapters/ai-sdk.ts";
import { RUN_ID_META_KEY, STEP_ID_META_KEY, createWritMcpServer, startWritMcpHttpServer, stdioRunId } from "../../producers/adapters/mcp-server.ts";
import { writLangChainReadTool, writLangChainTool } from "../../producers/adapters/langchain.ts";
import { writAgentTool } from "../../producers/adapters/openai-agents.ts";
import { VersionBook, submitToolCall } from "../../producers/adapters/tool-bridge.ts";
import type { SubmitResult } from "../../producers/writ-client.ts";
import { createLogger } from "../../src/logger.ts";
import { MAX_RUN_ID_LENGTH } from "../../src/schemas/write-intent.ts";
import type { Versioned } from "../../src/schemas/common.ts";
import { scripted } from "../helpers/scripted-client.ts";
import { connectInMemory } from "../helpers/mcp-in-memory.ts";

const T42 = { type: "ticket", id: "T-42" };
const applied = { status: "applied", intentId: "i", intentKey: "k", duplicate: false, at: "2025-01-01T00:00:00.000Z", entity: T42, state: { tags: ["vip"] }, version: '"v2"', via: "patch" } as SubmitResult;
const tooLong = "r".repeat(MAX_RUN_ID_LENGTH + 1);

beforeAll(() => setTracingDisabled(true));

function counted() {
  let reads = 0;
  const read = async (): Promise<Versioned> => {
    reads++;
    return { state: { tags: [] }, version: '"v1"' };
  };
  return { read, reads: () => reads };
}

describe("a run or step id longer than an intent carries", () => {
  it("the wire's bound is the one the adapters check", () => {
    expect(MAX_RUN_ID_LENGTH).toBe(256);
  });

  it("submitToolCall: refused config_invalid naming the field, with nothing read or submitted; 256 characters pass", async () => {
    const { client, sent } = scripted(() => applied);
    const { read, reads } = counted();
    const call = (runId: string, stepId?: string) => submitToolCall({ client, runId, ...(stepId ? { stepId } : {}), versions: new VersionBook(), read }, tagTicketSpec, { ticketId: "T-42", tag: "vip" });
    await expect(call(tooLong)).rejects.toMatchObject({ code: "config_invalid", context: { field: "runId" } });
    await expect(call("run-1", tooLong)).rejects.toMatchObject({ code: "config_invalid", context: { field: "stepId" } });
    expect(reads()).toBe(0);
    expect(sent).toHaveLength(0);
    await expect(call("r".repeat(MAX_RUN_ID_LENGTH))).resolves.toMatchObject({ status: "applied" });
    expect(sent).toHaveLength(1);
  });

  it("MCP: a write or read whose _meta names one is refused naming the _meta key, nothing read or submitted", async () => {
    const { client, sent } = scripted(() => applied);
    const { read, reads } = counted();
    const server = createWritMcpServer({ client, tools: [tagTicketSpec], read, logger: createLogger({ level: "silent" }) }, { fallbackRunId: "run-mcp" });
    const mcp = await connectInMemory(server);
    try {
      const text = (r: Awaited<ReturnType<typeof mcp.callTool>>) => (r.content as { text: string }[])[0]!.text;
      const write = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" }, _meta: { [RUN_ID_META_KEY]: tooLong } });
      expect(write.isError).toBe(true);
      expect(text(write)).toContain(`_meta["${RUN_ID_META_KEY}"] must be a string of 1 to ${MAX_RUN_ID_LENGTH} characters`);
      const step = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" }, _meta: { [STEP_ID_META_KEY]: tooLong } });
      expect(text(step)).toContain(`_meta["${STEP_ID_META_KEY}"] must be a string of 1 to ${MAX_RUN_ID_LENGTH} characters`);
      const readResult = await mcp.callTool({ name: "read_record", arguments: { type: "ticket", id: "T-42" }, _meta: { [RUN_ID_META_KEY]: "x".repeat(1_000_000) } });
      expect(readResult.isError).toBe(true);
      expect(reads()).toBe(0);
      expect(sent).toHaveLength(0);
      // null is a harness's "not set": the session's (here the configured) run id and the default step, served.
      const none = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" }, _meta: { [RUN_ID_META_KEY]: null, [STEP_ID_META_KEY]: null } });
      expect(none.structuredContent).toMatchObject({ status: "applied" });
      expect(sent.map((i) => i.runId)).toEqual(["run-mcp"]);
      sent.length = 0;
      // The control: the same calls under a run id an intent carries are served.
      const ok = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" }, _meta: { [RUN_ID_META_KEY]: "r".repeat(MAX_RUN_ID_LENGTH) } });
      expect(ok.structuredContent).toMatchObject({ status: "applied" });
      expect(sent).toHaveLength(1);
    } finally {
      await mcp.close();
    }
  });

  it("MCP: a deadline no call could keep (0, NaN, past Node's longest timer) is refused when the server is made, naming timeoutMs", () => {
    const { client } = scripted(() => applied);
    const { read } = counted();
    const make = (timeoutMs: number) => createWritMcpServer({ client, tools: [tagTicketSpec], read, timeoutMs, logger: createLogger({ level: "silent" }) });
    for (const bad of [0, Number.NaN, 2 ** 31, 1.5]) expect(() => make(bad)).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "timeoutMs" } }));
    expect(() => make(10_000)).not.toThrow();
  });

  it("MCP over HTTP: the same deadline is refused when the server starts, not as an internal error at each session's initialize", async () => {
    const { client } = scripted(() => applied);
    const { read } = counted();
    await expect(startWritMcpHttpServer({ client, tools: [tagTicketSpec], read, timeoutMs: 0, token: "t".repeat(32), port: 0, logger: createLogger({ level: "silent" }) })).rejects.toMatchObject({
      code: "config_invalid",
      context: { field: "timeoutMs" },
    });
  });

  it("LangChain: a numeric thread id is the run (its decimal string); any other non-string is refused naming it, not passed over for the context's run id", async () => {
    const { client, sent } = scripted(() => applied);
    const { read } = counted();
    const t = writLangChainTool(tagTicketSpec, { client, versions: new VersionBook(), read, runId: "process-run" });
    const args = { ticketId: "T-42", tag: "vip" };
    await t.invoke(args, { configurable: { thread_id: 42 } });
    await t.invoke(args, { configurable: { thread_id: 43 } });
    await t.invoke(args, { configurable: { thread_id: null } });
    expect(sent.map((i) => i.runId)).toEqual(["42", "43", "process-run"]);
    await expect(t.invoke(args, { configurable: { thread_id: { id: 44 } } })).rejects.toMatchObject({ code: "config_invalid", context: { field: "configurable.thread_id" } });
    expect(sent).toHaveLength(3);
  });
});

describe("read tools refuse a run id no intent can carry, as the write tools do", () => {
  it("AI SDK: refused config_invalid naming runId (or stepId), nothing read; 256 characters read", async () => {
    const { client } = scripted(() => applied);
    const { read, reads } = counted();
    const readTool = (runId: string, stepId?: string) => writReadTool({ recordType: "ticket" }, { client, runId, ...(stepId === undefined ? {} : { stepId }), versions: new VersionBook(), read });
    const call = (runId: string, stepId?: string) => readTool(runId, stepId).execute!({ id: "T-42" }, { toolCallId: "c1", messages: [] } as never);
    await expect(call(tooLong)).rejects.toMatchObject({ code: "config_invalid", context: { field: "runId" } });
    await expect(call("run-1", "")).rejects.toMatchObject({ code: "config_invalid", context: { field: "stepId" } });
    expect(reads()).toBe(0);
    await expect(call("r".repeat(MAX_RUN_ID_LENGTH))).resolves.toMatchObject({ status: "read" });
    expect(reads()).toBe(1);
  });

  it("LangChain: refused naming configurable.thread_id or the context's runId, wherever it came from, in the read and the write tool; a read with no run id is served", async () => {
    const { client, sent } = scripted(() => applied);
    const { read, reads } = counted();
    const ctx = (runId?: string) => ({ client, versions: new VersionBook(), read, ...(runId === undefined ? {} : { runId }) });
    const thread = { configurable: { thread_id: tooLong } };
    await expect(writLangChainReadTool({ recordType: "ticket" }, ctx()).invoke({ id: "T-42" }, thread)).rejects.toMatchObject({ code: "config_invalid", context: { field: "configurable.thread_id" } });
    await expect(writLangChainReadTool({ recordType: "ticket" }, ctx(tooLong)).invoke({ id: "T-42" })).rejects.toMatchObject({ code: "config_invalid", context: { field: "runId" } });
    await expect(writLangChainTool(tagTicketSpec, ctx("run-lc")).invoke({ ticketId: "T-42", tag: "vip" }, thread)).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining(`configurable.thread_id must be a string of 1 to ${MAX_RUN_ID_LENGTH} characters`),
      context: { field: "configurable.thread_id" },
    });
    expect(reads()).toBe(0);
    expect(sent).toHaveLength(0);
    await writLangChainReadTool({ recordType: "ticket" }, ctx()).invoke({ id: "T-42" });
    await writLangChainReadTool({ recordType: "ticket" }, ctx()).invoke({ id: "T-42" }, { configurable: { thread_id: "r".repeat(MAX_RUN_ID_LENGTH) } });
    expect(reads()).toBe(2);
  });
});

describe("a read with no run id is served by every read tool; a present non-string one is refused, as a write refuses it", () => {
  const aiRead = (ctx: Record<string, unknown>) => writReadTool({ recordType: "ticket" }, ctx as never).execute!({ id: "T-42" }, { toolCallId: "c1", messages: [] } as never);

  it("AI SDK and LangChain serve a read whose run id is undefined, null or \"\" (the AI SDK refused it)", async () => {
    const { client } = scripted(() => applied);
    const { read, reads } = counted();
    for (const none of [{}, { runId: undefined }, { runId: null }, { runId: "" }]) {
      await expect(aiRead({ client, versions: new VersionBook(), read, ...none })).resolves.toMatchObject({ status: "read" });
      expect(String(await writLangChainReadTool({ recordType: "ticket" }, { client, versions: new VersionBook(), read, ...none } as never).invoke({ id: "T-42" }))).toContain('"status":"read"');
    }
    expect(reads()).toBe(8);
  });

  it("AI SDK and LangChain refuse a run id of 0 on a read, naming runId, as Python's read tools refuse WritDeps.run_id=0 (LangChain served it)", async () => {
    const { client } = scripted(() => applied);
    const { read, reads } = counted();
    await expect(aiRead({ client, versions: new VersionBook(), read, runId: 0 })).rejects.toMatchObject({ code: "config_invalid", context: { field: "runId" } });
    await expect(writLangChainReadTool({ recordType: "ticket" }, { client, versions: new VersionBook(), read, runId: 0 } as never).invoke({ id: "T-42" })).rejects.toMatchObject({
      code: "config_invalid",
      context: { field: "runId" },
    });
    expect(reads()).toBe(0);
  });

  it("LangChain's write tool refuses a context run id of 0 naming runId (a plain error before), and an empty thread id is none, as in Python", async () => {
    const { client, sent } = scripted(() => applied);
    const { read } = counted();
    await expect(writLangChainTool(tagTicketSpec, { client, versions: new VersionBook(), read, runId: 0 } as never).invoke({ ticketId: "T-42", tag: "vip" })).rejects.toMatchObject({
      code: "config_invalid",
      context: { field: "runId" },
    });
    expect(sent).toHaveLength(0);
    // thread_id "" is none (threadIdOf already made it so): the context's run id is the run.
    await writLangChainTool(tagTicketSpec, { client, versions: new VersionBook(), read, runId: "run-ctx" }).invoke({ ticketId: "T-42", tag: "vip" }, { configurable: { thread_id: "" } });
    expect(sent.map((intent) => intent.runId)).toEqual(["run-ctx"]);
  });
});

describe("a step id of 0 is a step id, not none", () => {
  const args = { paymentId: "pay_1", amountCents: 500, reason: "damaged" };
  const paid = { ...applied, entity: { type: "payment", id: "pay_1" } } as SubmitResult;
  async function runStep(stepId: () => unknown) {
    const { client, sent } = scripted(() => paid);
    const read = async (): Promise<Versioned> => ({ state: { amountCents: 10_000, refunds: [] }, version: '"v1"' });
    const model = new ScriptedModel([[functionCall("refund_payment", args, { callId: "call_1" })], [assistantMessage("done")]]);
    const tool = writAgentTool(refundPaymentSpec, { client, read, stepId: stepId as () => string });
    const outcome = await run(new Agent({ name: "billing-agent", instructions: "x", model, tools: [tool] }), "refund", { context: { runId: "run-steps" } }).then(
      () => "ran",
      (err: unknown) => err,
    );
    return { outcome, sent };
  }

  it("OpenAI Agents: a stepId function's 0 (any number) is refused naming it, nothing sent, as its 1 was; undefined and null are the default step", async () => {
    for (const n of [0, 1]) {
      const { outcome, sent } = await runStep(() => n);
      // The SDK ends the run with a ToolCallError carrying the tool's.
      expect(outcome).toMatchObject({ error: { code: "config_invalid", message: expect.stringContaining("stepId(context, params) must be a string"), context: { field: "stepId(context, params)" } } });
      expect(sent).toHaveLength(0);
    }
    for (const none of [undefined, null]) {
      const { outcome, sent } = await runStep(() => none);
      expect(outcome).toBe("ran");
      expect(sent.map((i) => i.stepId)).toEqual(["once-per-run"]);
    }
    expect((await runStep(() => "0")).sent.map((i) => i.stepId)).toEqual(["0"]);
  });

  it("a context's stepId of null is the default step, as undefined (it was refused as an object)", async () => {
    const { client, sent } = scripted(() => applied);
    const { read } = counted();
    await submitToolCall({ client, runId: "run-1", stepId: null as unknown as string, versions: new VersionBook(), read }, tagTicketSpec, { ticketId: "T-42", tag: "vip" });
    expect(sent.map((i) => i.stepId)).toEqual(["once-per-run"]);
  });
});

describe("a stdio MCP server with no run id configured", () => {
  it("warns at start that every process is its own run; a configured one is taken, checked, with no warning", () => {
    const lines: string[] = [];
    const logger = pino({ level: "warn" }, { write: (line: string) => void lines.push(line) });
    const runId = stdioRunId(undefined, logger);
    expect(runId).toMatch(/^mcp-stdio-/);
    expect(lines).toHaveLength(1);
    expect(JSON.parse(lines[0]!)).toMatchObject({ level: 40, runId, msg: expect.stringContaining("WRIT_RUN_ID") });
    expect(stdioRunId(undefined, logger)).not.toBe(runId);
    lines.length = 0;
    expect(stdioRunId("conversation-7", logger)).toBe("conversation-7");
    expect(lines).toHaveLength(0);
    expect(() => stdioRunId(tooLong, logger)).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "runId" } }));
  });
});
