// `npm run example:mcp` (stdio) or `npm run example:mcp -- --http`: an MCP
// client from the SDK talks to writ's MCP server, reads a payment, refunds it,
// and calls the refund again as a client retry would. Over stdio it spawns the
// real entry point (`npm run mcp -- --stdio`, run id from WRIT_RUN_ID); over
// HTTP it serves in-process on 127.0.0.1 (run id = the MCP session id). It
// starts what it needs (the local broker and registry unless KAFKA_BROKERS is
// set, a records server, an owner in-process) and prints, last, what the
// records server holds.
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { startWritMcpHttpServer, recordsReader, type WritMcpHttp } from "../producers/adapters/mcp-server.ts";
import type { ModelToolResult } from "../producers/adapters/tool-bridge.ts";
import { readers, specs } from "./demo-tool-specs.ts";
import { runExample, startExampleStack } from "./example-stack.ts";

const { values: args } = parseArgs({ options: { http: { type: "boolean", default: false } } });
const transportName = args.http ? "streamable HTTP" : "stdio";

const ex = await startExampleStack("mcp", { deleteTopics: true });
const { brokers, registryUrl, records, say } = ex;
const agentId = "billing-agent";
let http: WritMcpHttp | undefined;
let mcp: Client | undefined;
let serverStderr = "";
ex.onShutdown(async () => {
  await mcp?.close().catch(() => undefined);
  await http?.close();
});

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + MCP over ${transportName}: an MCP client from the SDK calls writ's write tools`);
  say(ex.endpointsLine);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  await ex.startOwner();
  say(`  owner started in-process on ${ex.topics.intents}`);

  mcp = new Client({ name: "example-agent", version: "0.0.0" });
  await mcp.connect(args.http ? await httpTransport() : stdioTransport(`conv-${ex.id}`));
  const listed = (await mcp.listTools()).tools;
  say(`  connected; tools: ${listed.map((t) => `${t.name}${t.annotations?.idempotentHint ? " (idempotent)" : ""}`).join(", ")}`);

  say("");
  const read = await call("read_record", { type: "payment", id: "pay_1001" });
  say(`1. read_record payment pay_1001 -> ${read.version}, ${(read.record as { refunds: unknown[] }).refunds.length} refund(s)`);
  const refund = { paymentId: "pay_1001", amountCents: 5000, reason: "damaged", note: "Customer sent photos of the broken item." };
  say(`2. refund_payment ${JSON.stringify(refund)}`);
  say(`   -> ${outcome(await call("refund_payment", refund))}`);
  say("3. the same call again, as a client retry would send it (the model reworded its note)");
  say(`   -> ${outcome(await call("refund_payment", { ...refund, note: "Refund for the damaged item." }))}`);

  const refunds = await ex.refunds("pay_1001");
  say("");
  say(`records server: pay_1001 has ${refunds.count} refund(s) after two calls; PATCH requests for it: ${refunds.patchRequests}`);
  return { refunds_created: refunds.count };
}

/** The real entry point as a child process; the harness's conversation id is its run id. */
function stdioTransport(runId: string): StdioClientTransport {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [resolve(import.meta.dirname, "../producers/mcp-main.ts"), "--stdio"],
    env: {
      PATH: process.env.PATH ?? "",
      KAFKA_BROKERS: brokers.join(","),
      ...(registryUrl ? { SCHEMA_REGISTRY_URL: registryUrl } : {}),
      WRIT_INTENTS_TOPIC: ex.topics.intents,
      WRIT_MCP_AGENT_ID: agentId,
      WRIT_MCP_REPLY_TOPIC: ex.replyTopic(agentId),
      RECORDS_URL: records.url,
      WRIT_RUN_ID: runId,
      LOG_LEVEL: process.env.LOG_LEVEL ?? "error",
    },
    stderr: "pipe",
  });
  transport.stderr?.on("data", (chunk: Buffer) => (serverStderr += chunk.toString()));
  say(`  spawned: node producers/mcp-main.ts --stdio (WRIT_RUN_ID=${runId})`);
  return transport;
}

/** The server in-process on 127.0.0.1; each MCP session is a run. */
async function httpTransport(): Promise<StreamableHTTPClientTransport> {
  const writ = await ex.client(agentId);
  http = await startWritMcpHttpServer({ client: writ, tools: specs, read: recordsReader(specs, readers({ RECORDS_URL: records.url })), logger: ex.logger });
  say(`  serving ${http.url} (run id: the MCP session id)`);
  return new StreamableHTTPClientTransport(new URL(http.url));
}

async function call(name: string, args: Record<string, unknown>): Promise<Record<string, unknown>> {
  const result = await mcp!.callTool({ name, arguments: args });
  if (!result.structuredContent) throw new Error(`${name}: ${JSON.stringify(result.content)}`);
  return result.structuredContent as Record<string, unknown>;
}

function outcome(structured: Record<string, unknown>): string {
  const r = structured as ModelToolResult;
  if (r.status === "applied") return `applied at ${r.version}${r.duplicate ? " (duplicate: the stored reply, nothing written)" : ""}`;
  return `${r.status}: ${r.instruction}`;
}

await runExample(ex, main, {
  onError: () => {
    if (serverStderr) console.error(`MCP server stderr:\n${serverStderr}`);
  },
});
