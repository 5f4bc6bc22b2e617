// A run or step id longer than an intent carries (the wire's 256 characters), from a harness (`_meta` over MCP,
// a LangGraph thread id, a conversation id, WRIT_RUN_ID): refused at once naming where it came from, before a
// read, a pin or a version book is made for it. Before, every write of such a run failed at encoding
// (`codec_failed`, the schema's issues as text) after a read, and the MCP read tool kept a book per id however long.
import { describe, expect, it } from "vitest";
import { tagTicketSpec } from "../../examples/demo-tool-specs.ts";
import { RUN_ID_META_KEY, STEP_ID_META_KEY, createWritMcpServer, startWritMcpHttpServer } from "../../producers/adapters/mcp-server.ts";
import { writLangChainTool } from "../../producers/adapters/langchain.ts";
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
