// MCP (`@modelcontextprotocol/sdk`, an optional peer dependency): declared
// write tools, and a read tool, as an MCP server, so any MCP-speaking agent
// writes through writ. Transports: stdio, and streamable HTTP bound to 127.0.0.1.
//
// The run id (the intent key's run scope) of a tool call is, in this order:
//   1. `_meta["writ/runId"]` on the tools/call request: a harness that knows its
//      conversation id sets it, and a retry after a reconnect is then still a repeat;
//   2. the MCP session id (streamable HTTP): one session is one run, and a session outlives the server's
//      memory of it (idle expiry, a restart): its ids are signed, so a request carrying one is served in
//      that session re-opened (mcp-session-ids.ts);
//   3. the server's configured run id (stdio: `--run-id` / `WRIT_RUN_ID`), else
//      one random id per server process, warned about at start (stdioRunId): a
//      host that starts the server again for the same conversation makes a new run.
// The model never supplies it.
import { createHash, randomUUID, timingSafeEqual } from "node:crypto";
import { createServer, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { McpServer } from "@modelcontextprotocol/sdk/server/mcp.js";
import { StdioServerTransport } from "@modelcontextprotocol/sdk/server/stdio.js";
import {
  WebStandardStreamableHTTPServerTransport,
  type WebStandardStreamableHTTPServerTransportOptions,
} from "@modelcontextprotocol/sdk/server/webStandardStreamableHttp.js";
import { getRequestListener } from "@hono/node-server";
import { LATEST_PROTOCOL_VERSION, type CallToolResult } from "@modelcontextprotocol/sdk/types.js";
import { z } from "zod";
import { WritError } from "../../src/errors.ts";
import { componentLogger, createLogger, type Logger } from "../../src/logger.ts";
import { connectionLimits, listen } from "../../src/listen.ts";
import { LruMap } from "../../src/lru-map.ts";
import type { EntityRef, Versioned } from "../../src/schemas/common.ts";
import type { RecordReader } from "../../src/sor/record-reader.ts";
import { callTimeoutMs, type WritClient } from "../writ-client.ts";
import { sessionIds } from "./mcp-session-ids.ts";
import { MemoryIntentBases, submitRepeatableToolCall, type IntentBases } from "./intent-bases.ts";
import { REFUSED_FOR_NOW, VersionBook, checkRunIds, readForTool, modelResultOrUnknown, toReadResult, type ModelToolResult, type WritCallContext, type WritToolSpec } from "./tool-bridge.ts";

/** `_meta` key of a tools/call request carrying the harness's run (conversation) id. */
export const RUN_ID_META_KEY = "writ/runId";
/** `_meta` key of a tools/call request carrying a step id (only when one run may make the same intent twice). */
export const STEP_ID_META_KEY = "writ/stepId";
/** Name of the read tool. */
export const READ_TOOL_NAME = "read_record";

/** What a writ MCP server needs; shared by all its sessions. */
export interface WritMcpServerOptions {
  client: WritClient;
  tools: readonly WritToolSpec<any>[];
  /** Reads a record with its version; see {@link recordsReader}. */
  read(entity: EntityRef): Promise<Versioned>;
  /** Record types the read tool serves. Default: those the tools write. */
  readableTypes?: readonly string[];
  /** The base each intent was first sent against, so repeats are answered as repeats. Default: in memory, per process. */
  bases?: IntentBases;
  /** Deadline of one submission in ms; past it the tool answers `unknown`. Default: the client's (30 000). */
  timeoutMs?: number;
  /** Server name in the MCP handshake. Default `writ`. */
  name?: string;
  /**
   * Records a run's version book keeps (least recently used dropped, then read again). Default 10 000. The
   * books are kept per run in this process ({@link MAX_MCP_RUN_VERSION_BOOKS} runs at most), and created by the
   * first server of the process that serves the run.
   */
  maxVersions?: number;
  logger?: Logger;
}

/** One session's server: the run id falls back to `fallbackRunId` where the transport has no session id (stdio). */
export function createWritMcpServer(options: WritMcpServerOptions, session: { fallbackRunId?: string } = {}): McpServer {
  // Checked here, as the client checks a call's: a bad one refused at start, not on every write.
  if (options.timeoutMs !== undefined) callTimeoutMs(options.timeoutMs, 0);
  const server = new McpServer({ name: options.name ?? "writ", version: "0.1.0" }, { capabilities: { tools: {} } });
  const bookOptions = options.maxVersions === undefined ? {} : { maxEntries: options.maxVersions };
  // Only for a read with no run id at all (no `_meta`, no session, no fallback): no write could use it.
  const unscoped = new VersionBook(bookOptions);
  const bases = options.bases ?? processBases;
  const readable = [...new Set(options.readableTypes ?? options.tools.map((s) => s.tool.recordType))];
  // The call's run and step ids, `_meta` read once; one an intent cannot carry is refused here, naming the key,
  // before a book is kept under it.
  const idsOf = (extra: { _meta?: Record<string, unknown>; sessionId?: string }): { runId: string | undefined; stepId: string | undefined } => {
    const runId = metaString(extra._meta, RUN_ID_META_KEY) ?? extra.sessionId ?? session.fallbackRunId;
    const stepId = metaString(extra._meta, STEP_ID_META_KEY);
    if (runId !== undefined) checkRunIds({ runId, stepId }, META_ID_NAMES);
    return { runId, stepId };
  };
  /**
   * The versions of a call's run, kept per run in the process: a session re-opened after idling (a new
   * server), or another session naming the same `_meta["writ/runId"]`, finds what the model read in it. A
   * call whose `_meta` names another run than its session also finds what was read in the session.
   */
  const versionsOf = (runId: string | undefined, sessionId: string | undefined): VersionBook => {
    if (runId === undefined) return unscoped;
    const book = runVersionBook(options.client.agentId, runId, bookOptions);
    const sessionBook = sessionId === undefined || sessionId === runId ? undefined : runVersionBooks.get(runBookKey(options.client.agentId, sessionId));
    return sessionBook ? new FallbackVersionBook(book, sessionBook) : book;
  };
  const log = options.logger ? componentLogger(options.logger, "mcp") : undefined;

  for (const spec of options.tools) {
    server.registerTool(
      spec.tool.name,
      {
        description: `${spec.description ?? spec.tool.description ?? spec.tool.name} Writes go through writ: in the same session, calling again with the same arguments is safe and returns the same outcome.`,
        inputSchema: spec.tool.params as z.ZodObject,
        outputSchema: ModelToolResultShape,
        annotations: { readOnlyHint: false, idempotentHint: true, openWorldHint: true },
      },
      async (args: Record<string, unknown>, extra) => {
        const { runId, stepId } = idsOf(extra);
        if (!runId) throw new WritError("config_invalid", "no run id for this call: set _meta[\"writ/runId\"]", { retriable: false, context: { tool: spec.tool.name } });
        const ctx: WritCallContext = {
          client: options.client,
          runId,
          ...(stepId === undefined ? {} : { stepId }),
          // JSON-RPC ids restart in each session: scoped by it, so that a pin's remembered calls (intent-bases.ts) of
          // one session never match a new call of another session of the same run.
          toolCallId: `${extra.sessionId === undefined ? "" : `${extra.sessionId.slice(0, 200)}:`}${String(extra.requestId).slice(0, 50)}`,
          versions: versionsOf(runId, extra.sessionId),
          read: options.read,
          ...(options.timeoutMs === undefined ? {} : { timeoutMs: options.timeoutMs }),
        };
        // An error that leaves the outcome open is answered `unknown` (call again, same arguments), not `isError` with its text.
        const onOpenOutcome = (err: unknown, reason: string) => log?.warn({ err, reason, tool: spec.tool.name, runId }, "write's outcome open after an error; answered unknown");
        return toolResult(await modelResultOrUnknown(submitRepeatableToolCall(ctx, spec, args, bases), { onOpenOutcome }));
      },
    );
  }

  if (readable.length > 0) {
    server.registerTool(
      READ_TOOL_NAME,
      {
        description: `Read a record (${readable.join(", ")}) with its current version before changing it.`,
        inputSchema: z.object({ type: z.enum(readable as [string, ...string[]]), id: z.string().min(1).max(256) }),
        outputSchema: z.object({
          status: z.literal("read"),
          entity: z.object({ type: z.string(), id: z.string() }),
          record: z.unknown(),
          version: z.string(),
          instruction: z.string(),
        }),
        annotations: { readOnlyHint: true, openWorldHint: true },
      },
      async ({ type, id }, extra) => {
        const entity = { type, id };
        const result = toReadResult(entity, await readForTool({ read: options.read, versions: versionsOf(idsOf(extra).runId, extra.sessionId) }, entity));
        return { content: [{ type: "text", text: JSON.stringify(result) }], structuredContent: { ...result } };
      },
    );
  }
  return server;
}

/**
 * Every result also as JSON text, for clients that show only `content`. A refusal that holds is flagged
 * `isError`; one that ends by itself (`leased`: call again later) is not, like a conflict.
 */
function toolResult(result: ModelToolResult): CallToolResult {
  const isError = result.status === "rejected" && !REFUSED_FOR_NOW.has(result.reason);
  return { content: [{ type: "text", text: JSON.stringify(result) }], structuredContent: result, isError };
}

/** The advertised output: every {@link ModelToolResult} has a status and an instruction; the rest depends on the status. */
const ModelToolResultShape = z.looseObject({
  status: z.enum(["applied", "conflict", "rejected", "escalated", "unknown"]),
  instruction: z.string(),
});

const processBases = new MemoryIntentBases();

/** Runs whose version books a process keeps; past it the least recently used run's is dropped (its next write reads afresh). */
export const MAX_MCP_RUN_VERSION_BOOKS = 1024;

/** Version books per agent and run, for every server of the process (as `processBases` keeps the pins). */
const runVersionBooks = new LruMap<string, VersionBook>(MAX_MCP_RUN_VERSION_BOOKS);

const runBookKey = (agentId: string, runId: string): string => JSON.stringify([agentId, runId]);

function runVersionBook(agentId: string, runId: string, options: { maxEntries?: number }): VersionBook {
  const key = runBookKey(agentId, runId);
  let book = runVersionBooks.get(key);
  if (!book) runVersionBooks.set(key, (book = new VersionBook(options)));
  return book;
}

/** The run's book, then, for what it has not seen, the session's: what the model read in the session without `_meta`. */
class FallbackVersionBook extends VersionBook {
  readonly #run: VersionBook;
  readonly #session: VersionBook;

  constructor(run: VersionBook, session: VersionBook) {
    super({ maxEntries: 1 });
    this.#run = run;
    this.#session = session;
  }

  override get(entity: EntityRef): Versioned | undefined {
    return this.#run.get(entity) ?? this.#session.get(entity);
  }

  override remember(entity: EntityRef, record: Versioned): void {
    this.#run.remember(entity, record);
  }
}

/** How a refused run or step id is named to the harness: where a tools/call request sets them. */
const META_ID_NAMES = { runId: `_meta["${RUN_ID_META_KEY}"]`, stepId: `_meta["${STEP_ID_META_KEY}"]` };

/**
 * A `_meta` id as given, undefined when absent or null (a harness's "none"). Any other value is refused naming the key: passed over, a
 * conversation id sent as a number made the session the run (a retry from a new session wrote again), and a
 * step id sent as a number made two writes of one run one (the second answered as a repeat, never written).
 * The length, and an empty string, are checked by checkRunIds.
 */
function metaString(meta: Record<string, unknown> | undefined, key: string): string | undefined {
  const value = meta === undefined || !Object.hasOwn(meta, key) ? undefined : meta[key];
  if (value === undefined || value === null) return undefined;
  if (typeof value === "string") return value;
  throw new WritError("config_invalid", `_meta["${key}"] must be a string (it is ${typeof value})`, { retriable: false, context: { field: `_meta["${key}"]` } });
}

/**
 * A reader over record readers, by the tools' record types: a tool's records
 * are read from the reader named as its system. Readers are read-only by type
 * (see RecordReader): the agent side cannot hold a writing adapter.
 */
export function recordsReader(tools: readonly WritToolSpec<any>[], readers: readonly RecordReader[], opts: { timeoutMs?: number } = {}) {
  const byType = new Map<string, RecordReader>();
  for (const spec of tools) {
    const reader = readers.find((s) => s.name === spec.tool.system);
    if (!reader) throw new WritError("config_invalid", `tool ${spec.tool.name}: no record reader named ${spec.tool.system}`, { retriable: false, context: { tool: spec.tool.name } });
    byType.set(spec.tool.recordType, reader);
  }
  return async (entity: EntityRef): Promise<Versioned> => {
    const reader = byType.get(entity.type);
    if (!reader) throw new WritError("config_invalid", `no tool writes ${entity.type} records`, { retriable: false, context: { entity: `${entity.type}:${entity.id}` } });
    const record = await reader.read(entity, { timeoutMs: opts.timeoutMs ?? 5_000 });
    if (!record) throw new WritError("sor_protocol", `${entity.type}:${entity.id} does not exist`, { retriable: false, context: { entity: `${entity.type}:${entity.id}` } });
    return record;
  };
}

/** A running stdio server. */
export interface WritMcpStdio {
  runId: string;
  close(): Promise<void>;
}

/**
 * Serves on this process's stdin/stdout (stdout then carries only MCP
 * messages; logs go to stderr). `runId` defaults to one random id per process
 * ({@link stdioRunId}: warned about at start).
 */
export async function serveWritMcpStdio(options: WritMcpServerOptions & { runId?: string }): Promise<WritMcpStdio> {
  const runId = stdioRunId(options.runId, options.logger);
  const server = createWritMcpServer(options, { fallbackRunId: runId });
  await server.connect(new StdioServerTransport());
  return { runId, close: () => server.close() };
}

/**
 * The run id of a stdio server's calls that name none in `_meta["writ/runId"]`: the configured one (checked),
 * else one random id for this process, with a warning. No stable default is right: the process is all a stdio
 * server knows of its host, and a host may serve several conversations from one server, or start a new server
 * for the same conversation (a resume after approval). A new process is a new run, so a write retried there is
 * a new intent, which may be written again; the harness names its run (`_meta`, `--run-id`, `WRIT_RUN_ID`).
 */
export function stdioRunId(configured: string | undefined, logger?: Logger): string {
  if (configured !== undefined) {
    checkRunIds({ runId: configured });
    return configured;
  }
  const runId = `mcp-stdio-${randomUUID()}`;
  (logger ? componentLogger(logger, "mcp") : undefined)?.warn(
    { runId },
    'no run id configured (--run-id or WRIT_RUN_ID): calls without _meta["writ/runId"] are in this process\'s own run, so a write retried after the server is started again (a resume after approval) is a new intent and may be written again',
  );
  return runId;
}

/** Options of {@link startWritMcpHttpServer}. */
export interface WritMcpHttpOptions extends WritMcpServerOptions {
  /** TCP port on 127.0.0.1; 0 takes an ephemeral one. Default 0. */
  port?: number;
  /**
   * Bearer token every request must carry (`Authorization: Bearer <token>`);
   * compared in constant time, never logged. Unset: no authentication (the
   * server binds 127.0.0.1 only). Session ids are signed with a key derived
   * from it, so a server restarted with the same token serves the sessions
   * issued before (same run); without one the key is the process's own.
   */
  token?: string;
  /** Endpoint path. Default `/mcp`. */
  path?: string;
  /** Open sessions at most; past it an initialize is refused 503. Default 256. */
  maxSessions?: number;
  /**
   * A session with no request for this long is let go from memory. Default 30 min. Its id stays good: a later
   * request carrying it re-opens the session (same id, same run), as after a restart of a server with the same
   * `token`; only a session its client ended (DELETE) answers 404.
   */
  sessionIdleMs?: number;
  /**
   * How long a connection may take to send a request's headers, from its opening or its request's first byte
   * (default 10 s); past it the server closes it, so sockets that send nothing or dribble cannot hold the
   * connection slots ({@link mcpMaxConnections}). A whole request (body included) gets 30 s, or this if longer;
   * an idle keep-alive connection 5 s. A session's event stream is not bounded by these (the SDK sends it a
   * comment every 15 s).
   */
  headersTimeoutMs?: number;
}

/**
 * Open connections to the MCP server at most: one per session (each holds at most one GET event stream: the
 * SDK answers a second 409) and 256 more for requests, so streams alone never take every slot.
 */
export const mcpMaxConnections = (maxSessions: number): number => maxSessions + 256;

/** Default of {@link WritMcpHttpOptions.maxSessions}. */
export const DEFAULT_MAX_MCP_SESSIONS = 256;
/** Default of {@link WritMcpHttpOptions.sessionIdleMs}. */
export const DEFAULT_MCP_SESSION_IDLE_MS = 30 * 60_000;

/** Session ids a client ended (DELETE) that this process remembers, to answer them 404 rather than re-open them. */
const MAX_ENDED_SESSIONS = 4096;

/**
 * The SDK's web-standard streamable HTTP transport, served to Node's HTTP
 * server through `@hono/node-server`'s request listener: what the SDK's own
 * Node transport does inside, but with the web transport in writ's hands, so
 * that a session is re-opened through its public `handleRequest` (a Request
 * in, a Response out) rather than through the Node transport's internals.
 */
class NodeMcpTransport {
  readonly web: WebStandardStreamableHTTPServerTransport;
  /** Node request in, Node response out; SSE streams are piped as they come. */
  readonly handle: (req: IncomingMessage, res: ServerResponse) => Promise<void>;
  constructor(options: WebStandardStreamableHTTPServerTransportOptions) {
    this.web = new WebStandardStreamableHTTPServerTransport(options);
    // overrideGlobalObjects: false, as the SDK's Node transport: the process's Request and Response stay Node's own.
    this.handle = getRequestListener((request) => this.web.handleRequest(request), { overrideGlobalObjects: false });
  }
}

/** One open session: `busy` counts its requests still open (a GET event stream included). */
interface OpenSession {
  transport: NodeMcpTransport;
  server: McpServer;
  lastSeen: number;
  busy: number;
}

/** A running streamable HTTP server. */
export interface WritMcpHttp {
  /** e.g. `http://127.0.0.1:39100/mcp`. */
  url: string;
  /** Open MCP sessions. */
  sessions(): number;
  close(): Promise<void>;
}

/**
 * Streamable HTTP on 127.0.0.1, one MCP session per client (its session id is
 * the run id unless the request names one in `_meta`). Requests whose Host or
 * Origin is not this loopback address are refused (DNS rebinding; MCP
 * transports spec, "Security Warning").
 *
 * @example
 * const mcp = await startWritMcpHttpServer({ client, tools: specs, read, port: 39100 });
 * // an MCP client connects to mcp.url
 */
export async function startWritMcpHttpServer(options: WritMcpHttpOptions): Promise<WritMcpHttp> {
  const log = componentLogger(options.logger ?? createLogger({ name: "writ-mcp" }), "mcp-http");
  const path = options.path ?? "/mcp";
  const maxSessions = positiveInt("maxSessions", options.maxSessions ?? DEFAULT_MAX_MCP_SESSIONS);
  const idleMs = positiveInt("sessionIdleMs", options.sessionIdleMs ?? DEFAULT_MCP_SESSION_IDLE_MS);
  // Checked here, not at the first initialize, where it would be a 500.
  if (options.maxVersions !== undefined) positiveInt("maxVersions", options.maxVersions);
  if (options.timeoutMs !== undefined) callTimeoutMs(options.timeoutMs, 0);
  const limits = connectionLimits({ maxConnections: mcpMaxConnections(maxSessions), ...(options.headersTimeoutMs === undefined ? {} : { headersTimeoutMs: options.headersTimeoutMs }) });
  const sessions = new Map<string, OpenSession>();
  // Sessions being initialized count against the cap too, so concurrent initializes cannot overshoot it.
  let opening = 0;
  const token = options.token === undefined ? null : sha256(options.token);
  const ids = sessionIds(options.token);
  const ended = new LruMap<string, true>(MAX_ENDED_SESSIONS);
  const reopening = new Map<string, Promise<OpenSession | null>>();
  let port = 0;

  const track = (open: OpenSession, res: ServerResponse): void => {
    open.lastSeen = Date.now();
    if (res.closed) return;
    open.busy++;
    res.once("close", () => {
      open.busy--;
      open.lastSeen = Date.now();
    });
  };
  // A session in the middle of a request is in use, however long ago it began.
  const expired = (open: OpenSession, now: number): boolean => open.busy === 0 && now - open.lastSeen >= idleMs;
  const expire = (id: string, open: OpenSession): void => {
    sessions.delete(id);
    log.debug({ session: id }, "MCP session closed after being idle");
    // Closes the transport (and any stream of it); its onclose finds the session already gone.
    open.server.close().catch((err: unknown) => log.warn({ err, session: id }, "closing an idle MCP session failed"));
  };

  // Its client ended it (DELETE): let go, and answered 404 from now on rather than re-opened.
  const endSession = (id: string): void => {
    sessions.delete(id);
    ended.set(id, true);
    // Its run is over (a request carrying its id answers 404): what it read goes too.
    runVersionBooks.delete(runBookKey(options.client.agentId, id));
  };
  const refuseAtCap = (res: ServerResponse): void => {
    res.setHeader("retry-after", String(Math.ceil(Math.min(idleMs, 60_000) / 1000)));
    refuse(res, 503, "too many MCP sessions", { reason: "session_limit", maxSessions });
  };

  /**
   * Opens session `id` again on a new server and transport: the SDK's transport takes requests of a session
   * only after an initialize of its own, so it is given one here (with the protocol version the client's
   * request names), and its `initialized` notification, through the web transport's `handleRequest`; the
   * session's id is `id`, so its run is the same. Null when the transport does not take them (the client then
   * gets a 404 and starts a new session).
   */
  const reopen = async (id: string, version: string | string[] | undefined): Promise<OpenSession | null> => {
    opening++;
    const server = createWritMcpServer(options);
    try {
      const transport = new NodeMcpTransport({ sessionIdGenerator: () => id, onsessionclosed: endSession });
      transport.web.onclose = () => {
        if (sessions.get(id)?.transport === transport) sessions.delete(id);
      };
      await server.connect(transport.web);
      const protocolVersion = typeof version === "string" ? version : LATEST_PROTOCOL_VERSION;
      const post = (body: unknown, headers: Record<string, string> = {}) =>
        transport.web
          .handleRequest(
            new Request(`http://127.0.0.1:${port}${path}`, {
              method: "POST",
              headers: { "content-type": "application/json", accept: "application/json, text/event-stream", ...headers },
              body: JSON.stringify(body),
            }),
          )
          .then(async (r) => ({ status: r.status, text: await r.text() }));
      const init = await post({ jsonrpc: "2.0", id: 0, method: "initialize", params: { protocolVersion, capabilities: {}, clientInfo: { name: "writ-reopened-session", version: "1" } } });
      const initialized = await post({ jsonrpc: "2.0", method: "notifications/initialized" }, { "mcp-session-id": id, "mcp-protocol-version": protocolVersion });
      if (init.status !== 200 || initialized.status !== 202 || transport.web.sessionId !== id) {
        log.warn({ session: id, initialize: init.status, initialized: initialized.status }, "re-opening an MCP session failed; its client must start a new one (a new run)");
        await server.close();
        return null;
      }
      const open: OpenSession = { transport, server, lastSeen: Date.now(), busy: 0 };
      sessions.set(id, open);
      log.info({ session: id }, "MCP session re-opened (let go while idle, or issued before a restart): same session, same run");
      return open;
    } catch (err) {
      await server.close().catch(() => undefined);
      throw err;
    } finally {
      opening--;
    }
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const allowedHosts = [`127.0.0.1:${port}`, `localhost:${port}`];
    if (!allowedHosts.includes(req.headers.host ?? "")) return refuse(res, 403, "host not allowed");
    const origin = req.headers.origin;
    if (origin !== undefined && !allowedHosts.some((h) => origin === `http://${h}`)) return refuse(res, 403, "origin not allowed");
    if (new URL(req.url ?? "/", "http://127.0.0.1").pathname !== path) return refuse(res, 404, "not found");
    if (token !== null && !bearerMatches(req.headers.authorization, token)) {
      res.setHeader("www-authenticate", 'Bearer realm="writ-mcp"');
      return refuse(res, 401, "unauthorized");
    }

    const sessionId = req.headers["mcp-session-id"];
    if (typeof sessionId === "string") {
      let open = sessions.get(sessionId);
      if (open && expired(open, Date.now())) {
        expire(sessionId, open);
        open = undefined;
      }
      if (!open) {
        // 404 tells an MCP client to initialize a new session (transports spec, "Session Management"): only
        // for an id this server never issued, or one its client ended. Any other was let go from memory (idle,
        // or a restart) and is re-opened, so that its run goes on.
        if (!ids.issued(sessionId) || ended.get(sessionId)) return refuse(res, 404, "session not found");
        if (sessions.size + opening >= maxSessions) return refuseAtCap(res);
        // One re-opening per id, however many of its requests arrive at once.
        let reopened = reopening.get(sessionId);
        if (!reopened) {
          reopened = reopen(sessionId, req.headers["mcp-protocol-version"]).finally(() => reopening.delete(sessionId));
          reopening.set(sessionId, reopened);
        }
        open = (await reopened) ?? undefined;
        if (!open) return refuse(res, 404, "session not found");
      }
      track(open, res);
      return open.transport.handle(req, res);
    }
    if (req.method !== "POST") return refuse(res, 400, "no session: POST an initialize request first");
    // At the cap a new session is refused rather than an idle one evicted: idle sessions make room as they
    // expire (and come back when their clients return).
    if (sessions.size + opening >= maxSessions) return refuseAtCap(res);
    let reserved = true;
    opening++;
    try {
      const server = createWritMcpServer(options);
      const transport: NodeMcpTransport = new NodeMcpTransport({
        sessionIdGenerator: () => ids.issue(),
        onsessioninitialized: (id) => {
          reserved = false;
          opening--;
          const open: OpenSession = { transport, server, lastSeen: Date.now(), busy: 0 };
          sessions.set(id, open);
          track(open, res);
          log.debug({ session: id }, "MCP session opened");
        },
        onsessionclosed: endSession,
      });
      transport.web.onclose = () => {
        if (transport.web.sessionId) sessions.delete(transport.web.sessionId);
      };
      await server.connect(transport.web);
      await transport.handle(req, res);
      // Not an initialize request: the transport answered 400 and no session exists.
      if (!transport.web.sessionId) await server.close();
    } finally {
      if (reserved) opening--;
    }
  };

  const http = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err }, "MCP request failed");
      if (!res.headersSent) refuse(res, 500, "internal error");
      else res.end();
    });
  });
  // Every client comes from 127.0.0.1: a cap per address would be the cap.
  await listen(http, { ...limits, port: options.port ?? 0, host: "127.0.0.1", log, what: "MCP server" });
  port = (http.address() as AddressInfo).port;
  const sweep = setInterval(() => {
    const now = Date.now();
    for (const [id, open] of sessions) if (expired(open, now)) expire(id, open);
  }, Math.min(60_000, Math.max(10, Math.ceil(idleMs / 2))));
  sweep.unref();

  return {
    url: `http://127.0.0.1:${port}${path}`,
    sessions: () => sessions.size,
    async close() {
      clearInterval(sweep);
      await Promise.all([...sessions.values()].map(({ server }) => server.close().catch(() => undefined)));
      sessions.clear();
      http.closeAllConnections();
      await new Promise<void>((resolve) => http.close(() => resolve()));
    },
  };
}

const sha256 = (s: string): Buffer => createHash("sha256").update(s, "utf8").digest();

/** Digests of both sides, so the comparison takes the same time whatever the given token's length (as src/console/auth.ts). */
function bearerMatches(header: string | undefined, token: Buffer): boolean {
  const m = /^Bearer (.+)$/.exec(header ?? "");
  if (!m) return false;
  return timingSafeEqual(sha256(m[1]!), token);
}

function positiveInt(field: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new WritError("config_invalid", `${field} must be a positive integer (it is ${value})`, { retriable: false, context: { field } });
  return value;
}

function refuse(res: ServerResponse, status: number, message: string, data?: Record<string, unknown>): void {
  const error = { code: -32000, message, ...(data ? { data } : {}) };
  // A refusal closes its connection (and any body not read): cheap refused requests cannot keep a slot (src/listen.ts).
  res.writeHead(status, { "content-type": "application/json", connection: "close" }).end(JSON.stringify({ jsonrpc: "2.0", error, id: null }));
}
