// `npm run example:mcp` (stdio) or `npm run example:mcp -- --http`: an MCP
// client from the SDK talks to writ's MCP server, reads a payment, refunds it,
// and calls the refund again as a client retry would. Over stdio it spawns the
// real entry point (`npm run mcp -- --stdio`, run id from WRIT_RUN_ID); over
// HTTP it serves in-process on 127.0.0.1 (run id = the MCP session id). It
// starts what it needs (the local broker and registry unless KAFKA_BROKERS is
// set, a records server, an owner in-process) and prints, last, what the
// records server holds.
import { randomUUID } from "node:crypto";
import { resolve } from "node:path";
import { parseArgs } from "node:util";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { Kafka, logLevel } from "kafkajs";
import { startWritMcpHttpServer, systemsReader, type WritMcpHttp } from "../producers/adapters/mcp-server.ts";
import type { ModelToolResult } from "../producers/adapters/tool-bridge.ts";
import { createWritClient, type WritClient } from "../producers/writ-client.ts";
import { ensureStack } from "../scripts/local-stack.ts";
import { createLogger } from "../src/logger.ts";
import { startRouter, type Router } from "../src/owner/router.ts";
import { startDemoRecordsServer } from "../src/sor/demo-records-server.ts";
import { specs } from "./demo-tool-specs.ts";
import { systems, tools } from "./demo-tools.ts";

const say = (line: string) => console.log(line);
const { values: args } = parseArgs({ options: { http: { type: "boolean", default: false } } });
const transportName = args.http ? "streamable HTTP" : "stdio";

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
const id = randomUUID().slice(0, 8);
const topics = { intents: `writ.intents.ex-mcp-${id}`, ledger: `writ.ledger.ex-mcp-${id}`, human: `writ.human.ex-mcp-${id}`, dlq: `writ.dlq.ex-mcp-${id}` };
const agentId = `ex-mcp-${id}`;
const replyTopic = `writ.replies.${agentId}`;
const logger = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: "example-mcp" });
let router: Router | undefined;
let writ: WritClient | undefined;
let http: WritMcpHttp | undefined;
let mcp: Client | undefined;
let serverStderr = "";

async function main(): Promise<{ refunds_created: number }> {
  say(`writ + MCP over ${transportName}: an MCP client from the SDK calls writ's write tools`);
  say(`  Kafka ${brokers.join(",")}; registry ${registryUrl ?? "none (plain JSON)"}; records server ${records.url}`);
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  router = await startRouter({
    config: { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.owners.ex-mcp-${id}`, intentPartitions: 1, topics },
    tools,
    systems: systems({ RECORDS_URL: records.url }),
    logger,
  });
  say(`  owner started in-process on ${topics.intents}`);

  mcp = new Client({ name: "example-agent", version: "0.0.0" });
  await mcp.connect(args.http ? await httpTransport() : stdioTransport(`conv-${id}`));
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

  const res = await fetch(`${records.url}/records/payment/pay_1001`);
  const refunds = ((await res.json()) as { refunds: unknown[] }).refunds.length;
  say("");
  say(`records server: pay_1001 has ${refunds} refund(s) after two calls; PATCH requests for it: ${records.patchRequests().filter((r) => r.id === "pay_1001").length}`);
  return { refunds_created: refunds };
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
      WRIT_INTENTS_TOPIC: topics.intents,
      WRIT_MCP_AGENT_ID: agentId,
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
  writ = await createWritClient({ brokers, agentId, replyTopic, intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger });
  http = await startWritMcpHttpServer({ client: writ, tools: specs, read: systemsReader(specs, systems({ RECORDS_URL: records.url })), logger });
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

async function shutdown(): Promise<void> {
  await mcp?.close().catch(() => undefined);
  await http?.close();
  await writ?.close();
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
  if (serverStderr) console.error(`MCP server stderr:\n${serverStderr}`);
  exitCode = 1;
  await shutdown().catch(() => undefined);
}
process.exit(exitCode);
