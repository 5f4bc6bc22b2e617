import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { InMemoryTransport } from "@modelcontextprotocol/sdk/inMemory.js";
import type { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";

/** An MCP client connected to `server` over an in-memory transport pair (no process, no socket); close it when done. */
export async function connectInMemory(server: McpServer): Promise<Client> {
  const [a, b] = InMemoryTransport.createLinkedPair();
  await server.connect(a);
  const mcp = new Client({ name: "test", version: "1" });
  await mcp.connect(b);
  return mcp;
}
