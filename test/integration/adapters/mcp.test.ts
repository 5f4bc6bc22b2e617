import { spawn } from "node:child_process";
import { generateKeyPairSync } from "node:crypto";
import { mkdtempSync, rmSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { request } from "node:http";
import { join, resolve } from "node:path";
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StdioClientTransport } from "@modelcontextprotocol/sdk/client/stdio.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { describe, expect, it, onTestFailed, onTestFinished } from "vitest";
import { readers, specs } from "../../../examples/demo-tool-specs.ts";
import { AgentRegistry } from "../../../src/security/agent-registry.ts";
import { RUN_ID_META_KEY, startWritMcpHttpServer, recordsReader } from "../../../producers/adapters/mcp-server.ts";
import { putRecord, startDemoHarness } from "../../helpers/adapter-fixtures.ts";
import { waitFor } from "../../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl, type Harness } from "../../helpers/writ-harness.ts";

const conversation = () => `conv-${Math.random().toString(36).slice(2, 10)}`;
const refund = { paymentId: "pay_1", amountCents: 500, reason: "damaged", note: "Photos of the broken item attached." };

async function connect(transport: StdioClientTransport | StreamableHTTPClientTransport): Promise<Client> {
  const client = new Client({ name: "writ-test-agent", version: "0.0.0" });
  await client.connect(transport);
  onTestFinished(() => client.close());
  return client;
}

async function call(client: Client, name: string, args: Record<string, unknown>, meta?: Record<string, unknown>) {
  const result = await client.callTool({ name, arguments: args, ...(meta ? { _meta: meta } : {}) });
  const text = (result.content as { type: string; text: string }[])[0]!.text;
  expect(JSON.parse(text)).toEqual(result.structuredContent);
  return result.structuredContent as Record<string, any>;
}

async function httpServer(h: Harness) {
  const client = await h.client("mcp-agent");
  const mcp = await startWritMcpHttpServer({ client, tools: specs, read: recordsReader(specs, readers({ RECORDS_URL: h.records.url })) });
  onTestFinished(() => mcp.close());
  return mcp;
}

/**
 * The entry point (producers/mcp-main.ts) on stdio for the harness's topics and records, as agent `agentId`, with
 * `env` added; its stderr is shown if the test fails.
 */
async function stdioServer(h: Harness, agentId: string, env: Record<string, string> = {}): Promise<Client> {
  const transport = new StdioClientTransport({
    command: process.execPath,
    args: [resolve(import.meta.dirname, "../../../producers/mcp-main.ts"), "--stdio"],
    env: {
      PATH: process.env.PATH ?? "",
      KAFKA_BROKERS: brokers().join(","),
      ...(registryUrl() ? { SCHEMA_REGISTRY_URL: registryUrl()! } : {}),
      WRIT_INTENTS_TOPIC: h.config.topics.intents,
      WRIT_MCP_AGENT_ID: agentId,
      RECORDS_URL: h.records.url,
      WRIT_RUN_ID: conversation(),
      LOG_LEVEL: "error",
      ...env,
    },
    stderr: "pipe",
  });
  let serverStderr = "";
  transport.stderr?.on("data", (chunk: Buffer) => (serverStderr += chunk.toString()));
  onTestFailed(() => console.error(`MCP server stderr:\n${serverStderr}`));
  return connect(transport);
}

/**
 * Owners that require signatures (an agent registry listing `agentId` with a fresh key and the reply topic the MCP
 * server takes by default) and the audience `prod`, over a harness seeded with pay_1; the key's PEM in a file.
 */
async function signedDeployment(agentId: (h: Harness) => string) {
  const h = await startDemoHarness({ payment: true, owner: false });
  const key = generateKeyPairSync("ed25519");
  const dir = mkdtempSync(join(tmpdir(), "writ-mcp-signed-"));
  onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
  const keyFile = join(dir, "agent.pem");
  writeFileSync(keyFile, key.privateKey.export({ type: "pkcs8", format: "pem" }), { mode: 0o600 });
  const id = agentId(h);
  const agents = AgentRegistry.from({
    agents: { [id]: { keys: [{ id: "mcp-k1", publicKey: key.publicKey.export({ type: "spki", format: "pem" }).toString() }], tools: ["refund_payment", "tag_ticket"], replyTopic: `writ.replies.${id}` } },
  });
  await h.startRouter({ agents, config: { ...h.config, signingAudience: "prod" } });
  return { h, id, keyFile };
}

describe("MCP server on a real broker", () => {
  it("stdio-retry: the entry point writes once across a retry with a reworded note", async () => {
    const h = await startDemoHarness({ payment: true });
    const client = await stdioServer(h, `mcp-agent-${h.id}`);

    const tools = (await client.listTools()).tools;
    expect(tools.map((t) => t.name).sort()).toEqual(["read_record", "refund_payment", "tag_ticket"]);
    expect(tools.find((t) => t.name === "refund_payment")?.annotations).toMatchObject({ idempotentHint: true, readOnlyHint: false });
    const read = await call(client, "read_record", { type: "payment", id: "pay_1" });
    const first = await call(client, "refund_payment", refund);
    const retry = await call(client, "refund_payment", { ...refund, note: "Item arrived broken." });

    expect(read).toMatchObject({ status: "read", entity: { type: "payment", id: "pay_1" }, version: '"v1"', record: { refunds: [] } });
    expect(first).toMatchObject({ status: "applied", duplicate: false, version: '"v2"' });
    expect(retry).toMatchObject({ status: "applied", duplicate: true, version: '"v2"' });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([{ amountCents: 500, reason: "damaged" }]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });

  // An MCP host that goes away closes its end of the server's stdout, and may do so before its stdin: an answer
  // written then met EPIPE as an unhandled 'error' event (a stack trace, exit 1, no clean stop).
  it("stdio-client-gone: the client closing the server's stdout ends the server cleanly (exit 0), not with an unhandled EPIPE", async () => {
    const h = await startDemoHarness({ payment: true });
    const child = spawn(process.execPath, [resolve(import.meta.dirname, "../../../producers/mcp-main.ts"), "--stdio"], {
      env: {
        PATH: process.env.PATH ?? "",
        KAFKA_BROKERS: brokers().join(","),
        ...(registryUrl() ? { SCHEMA_REGISTRY_URL: registryUrl()! } : {}),
        WRIT_INTENTS_TOPIC: h.config.topics.intents,
        WRIT_MCP_AGENT_ID: `mcp-agent-gone-${h.id}`,
        RECORDS_URL: h.records.url,
        WRIT_RUN_ID: conversation(),
        LOG_LEVEL: "info",
      },
      stdio: ["pipe", "pipe", "pipe"],
    });
    onTestFinished(() => void child.kill("SIGKILL"));
    let stdout = "";
    let stderr = "";
    child.stdout.on("data", (chunk: Buffer) => (stdout += chunk.toString()));
    child.stderr.on("data", (chunk: Buffer) => (stderr += chunk.toString()));
    let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
    child.on("exit", (code, signal) => (exit = { code, signal }));
    const send = (message: object) => child.stdin.write(`${JSON.stringify(message)}\n`);
    send({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-06-18", capabilities: {}, clientInfo: { name: "gone", version: "0" } } });
    await waitFor(() => stdout.includes('"id":1'), { timeoutMs: 30_000, message: () => `no answer to initialize; stderr: ${stderr}` });

    // The client's end of stdout closed; its stdin stays open, so only a failed write tells the server.
    child.stdout.destroy();
    for (let id = 2; id < 42; id++) send({ jsonrpc: "2.0", id, method: "tools/list", params: {} });
    await waitFor(() => exit, { timeoutMs: 30_000, message: () => `the MCP server did not stop; stderr: ${stderr}` });

    expect(exit, stderr).toEqual({ code: 0, signal: null });
    expect(stderr).toContain('"reason":"stdout closed"');
    expect(stderr).not.toContain("Unhandled 'error' event");
  });

  it("http-retry: two calls in one MCP session (run id = session id) write once", async () => {
    const h = await startDemoHarness({ payment: true });
    const mcp = await httpServer(h);
    const client = await connect(new StreamableHTTPClientTransport(new URL(mcp.url)));

    const first = await call(client, "refund_payment", refund);
    const retry = await call(client, "refund_payment", refund);

    expect(mcp.sessions()).toBe(1);
    expect(first).toMatchObject({ status: "applied", duplicate: false });
    expect(retry).toMatchObject({ status: "applied", duplicate: true });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("http-reconnect: a retry from a new MCP session naming the same run in _meta writes nothing", async () => {
    const h = await startDemoHarness({ payment: true });
    const mcp = await httpServer(h);
    const meta = { [RUN_ID_META_KEY]: conversation() };

    const before = await connect(new StreamableHTTPClientTransport(new URL(mcp.url)));
    const first = await call(before, "refund_payment", refund, meta);
    await before.close();
    const after = await connect(new StreamableHTTPClientTransport(new URL(mcp.url)));
    const retry = await call(after, "refund_payment", refund, meta);

    expect(first).toMatchObject({ status: "applied", duplicate: false });
    expect(retry).toMatchObject({ status: "applied", duplicate: true });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  // A restart of the MCP server (an upgrade, a crash) empties its memory of sessions. A client that got 404 for
  // its session started a new one, a new run: a retry of a call it never saw answered was a new intent.
  it("http-restart: a retry in the same session after the MCP server restarted writes nothing; a new session would write again", async () => {
    const h = await startDemoHarness({ payment: true });
    const token = `mcp-restart-token-${h.id}-0123456789`;
    const client = await h.client("mcp-agent");
    const read = recordsReader(specs, readers({ RECORDS_URL: h.records.url }));
    const before = await startWritMcpHttpServer({ client, tools: specs, read, token });
    const port = Number(new URL(before.url).port);
    const requestInit = { headers: { authorization: `Bearer ${token}` } };
    const agent = await connect(new StreamableHTTPClientTransport(new URL(before.url), { requestInit }));
    const first = await call(agent, "refund_payment", refund);
    await before.close();

    const after = await startWritMcpHttpServer({ client, tools: specs, read, token, port });
    onTestFinished(() => after.close());
    // The same client, its session id unchanged: served in that session, so in the same run. (Its first request
    // may go out on a kept-alive connection to the old server and fail as a network error: a harness retries it.)
    let retry: Record<string, any> | undefined;
    for (let attempt = 1; retry === undefined; attempt++) {
      try {
        retry = await call(agent, "refund_payment", refund);
      } catch (err) {
        if (attempt === 3 || !/fetch failed/.test((err as Error).message)) throw err;
      }
    }
    expect(after.sessions()).toBe(1);
    expect(first).toMatchObject({ status: "applied", duplicate: false });
    expect(retry).toMatchObject({ status: "applied", duplicate: true });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);

    // The control: what a client that had to start a new session would do (no _meta run id): a second refund.
    const fresh = await connect(new StreamableHTTPClientTransport(new URL(after.url), { requestInit }));
    expect(await call(fresh, "refund_payment", refund)).toMatchObject({ status: "applied", duplicate: false });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(2);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(2);
  });

  it("race-with-outside-writer: the conflict carries current and your_change; deciding again applies without a lost update", async () => {
    const h = await startDemoHarness({ ticket: { subject: "Charged twice", status: "open", tags: ["billing"] } });
    const mcp = await httpServer(h);
    const client = await connect(new StreamableHTTPClientTransport(new URL(mcp.url)));

    const read = await call(client, "read_record", { type: "ticket", id: "T-1" });
    const put = await putRecord(h, "ticket", "T-1", (s) => ({ ...s, status: "pending" }));
    expect(put.status).toBe(200);
    const conflict = await call(client, "tag_ticket", { ticketId: "T-1", tag: "vip" });
    const again = await call(client, "tag_ticket", { ticketId: "T-1", tag: "vip" });

    expect(read).toMatchObject({ version: '"v1"' });
    expect(conflict).toMatchObject({
      status: "conflict",
      cycle: 1,
      current: { version: '"v2"', state: { status: "pending", tags: ["billing"] } },
      your_change: [{ op: "replace", path: "/tags", value: ["billing", "vip"] }],
    });
    expect(again).toMatchObject({ status: "applied", duplicate: false, version: '"v3"' });
    expect((await readVersion(h.records, "ticket", "T-1")).state).toEqual({ subject: "Charged twice", status: "pending", tags: ["billing", "vip"] });
  });

  it("http-bearer-token: with a token set, a request without it (or with another) is refused 401 and opens no session", async () => {
    const h = await startDemoHarness({ owner: false });
    const client = await h.client("mcp-agent");
    const token = "t0ken-for-the-mcp-test-0123456789";
    const mcp = await startWritMcpHttpServer({ client, tools: specs, read: recordsReader(specs, readers({ RECORDS_URL: h.records.url })), token });
    onTestFinished(() => mcp.close());
    const post = (authorization?: string) =>
      fetch(mcp.url, {
        method: "POST",
        headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...(authorization ? { authorization } : {}) },
        body: JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: { protocolVersion: "2025-03-26", capabilities: {}, clientInfo: { name: "t", version: "1" } } }),
      });
    expect((await post()).status).toBe(401);
    expect((await post("Bearer wrong-token-wrong-token-000")).status).toBe(401);
    expect(mcp.sessions()).toBe(0);
    const ok = await post(`Bearer ${token}`);
    expect(ok.status).toBe(200);
    await ok.text();
    expect(mcp.sessions()).toBe(1);
  });

  it("http-host-check: a request with a foreign Host header is refused", async () => {
    const h = await startDemoHarness({ owner: false });
    const mcp = await httpServer(h);
    const url = new URL(mcp.url);
    const status = await new Promise<number>((done, fail) => {
      const req = request(
        { host: url.hostname, port: url.port, path: url.pathname, method: "POST", headers: { host: `evil.example:${url.port}`, "content-type": "application/json", accept: "application/json, text/event-stream" } },
        (res) => {
          res.resume();
          done(res.statusCode ?? 0);
        },
      );
      req.on("error", fail);
      req.end(JSON.stringify({ jsonrpc: "2.0", id: 1, method: "initialize", params: {} }));
    });
    expect(status).toBe(403);
    expect(mcp.sessions()).toBe(0);
  });
  // Owners with an agent registry refuse unsigned intents: an MCP server that could not sign served no writes there.
  it("stdio-signed: with WRIT_MCP_SIGNING_KEY_FILE and WRIT_MCP_KEY_ID the server signs for WRIT_SIGNING_AUDIENCE, and owners requiring signatures and that audience apply its write once", async () => {
    const { h, id, keyFile } = await signedDeployment((h) => `mcp-signed-${h.id}`);
    const client = await stdioServer(h, id, { WRIT_MCP_SIGNING_KEY_FILE: keyFile, WRIT_MCP_KEY_ID: "mcp-k1", WRIT_SIGNING_AUDIENCE: "prod" });

    expect(await call(client, "refund_payment", refund)).toMatchObject({ status: "applied", duplicate: false });
    expect(await call(client, "refund_payment", refund)).toMatchObject({ status: "applied", duplicate: true });
    const sent = await h.readTopic(h.config.topics.intents, "WriteIntent", 2);
    expect(sent.map((i) => [i.agent.id, i.audience])).toEqual([[id, "prod"], [id, "prod"]]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("stdio-signed control: the same server without the key sends unsigned intents, which those owners dead-letter unauthenticated; nothing is written", async () => {
    const { h, id } = await signedDeployment((h) => `mcp-unsigned-${h.id}`);
    // The refusal comes before the owner authenticated the record, so the client holds it to its deadline as a
    // possibly forged answer (test/integration/trust.test.ts), then gives it: a short deadline, room for the owner
    // to dead-letter and answer on a busy machine.
    const client = await stdioServer(h, id, { WRIT_SUBMIT_TIMEOUT_MS: "8000", WRIT_SIGNING_AUDIENCE: "prod" });

    expect(await call(client, "refund_payment", refund)).toMatchObject({ status: "rejected", reason: "unauthenticated" });
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead.map((d) => d.reason)).toEqual(["unauthenticated"]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(0);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(0);
  });
});
