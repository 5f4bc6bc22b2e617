// `writ console`: a small HTTP server and its page (src/console/assets: plain
// HTML, CSS and two vanilla JS modules, no build step). The page follows writ's
// topics live over server-sent events and, for the operator role, resolves
// escalations through the writ client (createWritClient(...).resolve), as
// `writ escalations resolve` does.
//
// Endpoints (every one checks Host and Origin; all but the page and its assets need a token, and no token ever
// travels in a URL: the link people open is /#token=…, whose fragment no browser sends):
//   GET  /                              the page (static, no data in it; it takes the token from its fragment)
//   GET  /assets/{console.js,drafts.js,console.css}  static, no data in them
//   POST /api/stream-ticket             {ticket, expiresInMs}: a one-use ticket for /events, 30 s (Authorization: Bearer)
//   GET  /events?ticket=…               server-sent events: `hello` (role), `snapshot` (everything),
//                                       `update` (the sections that changed; of the escalations and the recent lists
//                                       only what changed: ConsoleChanges, view.ts); 401 `ticket_invalid`
//   GET  /api/session                   {role, operator, topics, limits, trust}   (Authorization: Bearer)
//   GET  /api/state                     the whole snapshot as JSON          (Authorization: Bearer)
//   POST /api/escalations/<id>/resolve  {decision, baseVersion?, message?, delta?} → {answer}; operator only (403);
//                                       404 or 409 with a `reason` when the page may not decide it (state.resolvable);
//                                       400 with a `reason` for a `delta` (apply's JSON Patch) refused (./delta.ts)
//   POST /api/dead-letters/<partition>/<offset>/redrive   {} → {sentTo, deadLetter}: sends the dead letter at that
//                                       offset of writ.dlq back to the intents topic, as `writ dlq redrive` does;
//                                       operator only (403); 404, 409, 502 or 504 with a `reason` when it is not sent
//                                       (src/console/send-back.ts)
//   POST /api/dead-letters/redrive      {deadLetters: [{partition, offset}, …]} (at most 200) → {sent, notSent,
//                                       results}: several at once, in one produce request, each with its
//                                       `outcome` (`sent`, or the reason the one-at-a-time endpoint answers)
import { readFileSync, existsSync } from "node:fs";
import { createServer, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { dirname, join } from "node:path";
import { fileURLToPath } from "node:url";
import { Kafka, logLevel } from "kafkajs";
import { z } from "zod";
import { createWritClient, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { REDRIVEN_FROM_HEADER } from "../dlq-redrive.ts";
import { WireCodec } from "../codec.ts";
import { WritError } from "../errors.ts";
import { checkTopicAcls, aclCheckFailure, DEFAULT_OWNER_PRINCIPAL, type AclCheck } from "../doctor/acls.ts";
import { registerCompressionCodecs } from "../kafka/compression.ts";
import { kafkaLogCreator } from "../kafka-log.ts";
import { componentLogger, createLogger, type Logger } from "../logger.ts";
import { connectionLimits, listen } from "../listen.ts";
import { Version, type JsonPatchOp } from "../schemas/common.ts";
import type { IntentSigner } from "../security/signing.ts";
import { kafkaConnection, type ConnectionSecurity } from "../security/transport.ts";
import { jsonLine } from "../printable.ts";
import { allowedHostsFor, badAllowedHost, ConsoleAuth, refusedOrigin, StreamTickets, type Role } from "./auth.ts";
import { startFeed, type Feed } from "./feed.ts";
import { checkDelta, deltaBounds, deltaRoom } from "./delta.ts";
import { DeadLetterSender, MAX_SEND_BACK, SEND_BACK_STATUS, type RedriveReport } from "./send-back.ts";
import { ConsoleState, NAME_CHARS, type ConsoleLimits, type NotResolvable } from "./state.ts";
import { EventStreams } from "./streams.ts";

export interface ConsoleOptions {
  brokers: string[];
  schemaRegistryUrl?: string;
  /** SASL and TLS to Kafka, the registry's auth and TLS (as the CLI takes them from the environment: `connectionFor`). */
  connection?: ConnectionSecurity;
  topics: { intents: string; human: string; dlq: string };
  /** Reply topics are the topics with this prefix (default `writ.replies.`). */
  replyPrefix?: string;
  /** The owners' consumer group, for the lag (default `writ.owners`). */
  groupId?: string;
  /** The ledger topic, for the ACL check (default `writ.ledger`). */
  ledgerTopic?: string;
  /**
   * The owners' Kafka principals (default `User:writ-owner`): at the start the console checks, as `writ doctor`
   * does, that no other principal may write writ.ledger, writ.human, writ.dlq or a reply topic, and warns (in its
   * log, in `/api/session`'s and the state's `trust`, and as a banner on the page) when one may or when the cluster
   * has no authorizer.
   */
  ownerPrincipals?: readonly string[];
  /** The read-only token (at least 16 characters). */
  token: string;
  /** The operator token: resolving needs it. Without it the console is read-only. */
  operatorToken?: string;
  /**
   * The agent id escalations are resolved as (default `writ-operator`), its reply topic, signing key and the audience
   * it signs for (the owners' `WRIT_SIGNING_AUDIENCE`; only with `signer`); in
   * `settings`, the owners' admission bounds and the replication factor of the reply topic when the console
   * creates it (`writ console` takes them from the owners' variables).
   */
  operator?: { id?: string; replyTopic?: string; signer?: IntentSigner; audience?: string; settings?: { maxIntentBytes?: number; maxJsonDepth?: number; replicationFactor?: number } };
  /** Default 127.0.0.1. */
  host?: string;
  /** Default 0: an ephemeral port. */
  port?: number;
  /** More Host names the console may be reached by (`name[:port]` or `[IPv6][:port]`; others are refused config_invalid), e.g. behind a proxy. */
  allowedHosts?: string[];
  /** Offsets read back per partition of the topics there at the start (default 1000), or "all". */
  backlog?: number | "all";
  limits?: Partial<ConsoleLimits>;
  discoverIntervalMs?: number;
  lagIntervalMs?: number;
  /** How long a resolution waits for the owner's answer (default 30 s). */
  resolveTimeoutMs?: number;
  /** Most open event streams at once (default 32; at most a quarter of {@link CONSOLE_MAX_CONNECTIONS}). */
  maxStreams?: number;
  /**
   * How long a connection may take to send a request's headers, from its opening or its request's first byte
   * (default 10 s); past it the console closes it, so sockets that send nothing or dribble cannot hold the
   * {@link CONSOLE_MAX_CONNECTIONS} slots. A whole request (body included) gets 30 s, or this if longer; an
   * idle keep-alive connection 5 s. Event streams are not bounded by these: they get a comment every 15 s.
   */
  headersTimeoutMs?: number;
  /** Open connections from one address at most (default: no cap of its own); behind a proxy, every page comes from its address. */
  maxConnectionsPerAddress?: number;
  /** How long a stream ticket may wait for its `/events` request (default 30 s). */
  streamTicketTtlMs?: number;
  /** The clock stream tickets expire by, in ms (default a monotonic one); a test turns it instead of waiting. */
  now?: () => number;
  logger?: Logger;
  /** Called after each decision sent from the page, with the owner's answer (an audit line; never the token). */
  onDecision?: (d: { escalationId: string; decision: string; operator: string; status: string; reason?: string }) => void;
  /** Called after each dead letter sent back from the page, with where it went (an audit line; never the token). */
  onRedrive?: (d: RedriveReport) => void;
  /** How long sending a dead letter back waits to read it from writ.dlq (default 30 s). */
  redriveReadTimeoutMs?: number;
}

export interface ConsoleServer {
  /** e.g. `http://127.0.0.1:39200` (no token in it). */
  readonly url: string;
  readonly port: number;
  readonly state: ConsoleState;
  /** Resolves once the feed's first topic discovery and the ACL check ran. */
  readonly ready: Promise<void>;
  close(): Promise<void>;
}

const ASSETS: Record<string, { file: string; type: string }> = {
  "/assets/console.js": { file: "console.js", type: "text/javascript; charset=utf-8" },
  "/assets/drafts.js": { file: "drafts.js", type: "text/javascript; charset=utf-8" },
  "/assets/console.css": { file: "console.css", type: "text/css; charset=utf-8" },
};

/**
 * The page's files: next to this module (running the TypeScript sources), or
 * the repository's src/console/assets from dist/src/console (tsc copies no
 * HTML, CSS or JS).
 */
export function consoleAssetsDir(): string {
  const here = dirname(fileURLToPath(import.meta.url));
  const candidates = [join(here, "assets"), join(here, "..", "..", "..", "src", "console", "assets")];
  const found = candidates.find((c) => existsSync(join(c, "index.html")));
  if (found === undefined) {
    throw new WritError("config_invalid", `the console's page is missing (looked in ${candidates.join(", ")})`, { retriable: false });
  }
  return found;
}

const SECURITY_HEADERS = {
  "content-security-policy": "default-src 'none'; script-src 'self'; style-src 'self'; connect-src 'self'; img-src 'self' data:; base-uri 'none'; form-action 'none'; frame-ancestors 'none'",
  "x-content-type-options": "nosniff",
  "x-frame-options": "DENY",
  "referrer-policy": "no-referrer",
  "cross-origin-opener-policy": "same-origin",
  "cross-origin-resource-policy": "same-origin",
};

const ResolveBody = z
  .object({
    decision: z.enum(["apply", "discard", "return"]),
    baseVersion: Version.optional(),
    message: z.string().max(2000).optional(),
    /** `apply`: the change to write (JSON Patch), checked by checkDelta for its own reasons. */
    delta: z.unknown().optional(),
  })
  .strict();

const RedriveBody = z.object({}).strict();


const RedriveManyBody = z
  .object({
    deadLetters: z
      .array(z.object({ partition: z.number().int().min(0).max(999_999_999), offset: z.string().regex(/^\d{1,19}$/, "a whole number as a string") }).strict())
      .min(1)
      .max(MAX_SEND_BACK),
  })
  .strict();


const MAX_BODY = 16 * 1024;

/** Open connections to the console at most; event streams take {@link ConsoleOptions.maxStreams} of them at most. */
export const CONSOLE_MAX_CONNECTIONS = 256;

export async function startConsole(opts: ConsoleOptions): Promise<ConsoleServer> {
  const auth = new ConsoleAuth(opts.token, opts.operatorToken);
  const log = componentLogger(opts.logger ?? createLogger({ name: "writ-console" }), "console");
  const assetsDir = consoleAssetsDir();
  const files = new Map<string, Buffer>();
  for (const name of ["index.html", ...Object.values(ASSETS).map((a) => a.file)]) files.set(name, readFileSync(join(assetsDir, name)));
  const ttl = opts.streamTicketTtlMs;
  if (ttl !== undefined && !(Number.isInteger(ttl) && ttl >= 1 && ttl <= 600_000)) {
    throw new WritError("config_invalid", `streamTicketTtlMs must be a whole number of ms from 1 to 600000 (it is ${ttl})`, { retriable: false, context: { field: "streamTicketTtlMs" } });
  }
  const badHost = badAllowedHost(opts.allowedHosts ?? []);
  if (badHost !== null) {
    throw new WritError("config_invalid", `allowedHosts entry ${jsonLine(badHost.entry)}: ${badHost.fault}`, { retriable: false, context: { field: "allowedHosts" } });
  }
  const maxStreams = opts.maxStreams ?? 32;
  if (!(Number.isInteger(maxStreams) && maxStreams >= 1 && maxStreams <= CONSOLE_MAX_CONNECTIONS / 4)) {
    throw new WritError("config_invalid", `maxStreams must be a whole number from 1 to ${CONSOLE_MAX_CONNECTIONS / 4} (it is ${maxStreams})`, { retriable: false, context: { field: "maxStreams" } });
  }
  // Checked before anything connects; listen() applies them.
  const limits = connectionLimits({
    maxConnections: CONSOLE_MAX_CONNECTIONS,
    ...(opts.headersTimeoutMs === undefined ? {} : { headersTimeoutMs: opts.headersTimeoutMs }),
    ...(opts.maxConnectionsPerAddress === undefined ? {} : { maxConnectionsPerAddress: opts.maxConnectionsPerAddress }),
  });
  const tickets = new StreamTickets({ ...(ttl === undefined ? {} : { ttlMs: ttl }), ...(opts.now ? { now: opts.now } : {}) });

  const replyPrefix = opts.replyPrefix ?? "writ.replies.";
  const groupId = opts.groupId ?? "writ.owners";
  const operatorId = opts.operator?.id ?? "writ-operator";
  const maxIntentBytes = opts.operator?.settings?.maxIntentBytes;
  // The change an operator may give with Apply: bounded as owners admit it (and by the console); the resolve
  // endpoint's body may hold it besides the rest.
  const deltaLimits = deltaBounds(opts.operator?.settings);
  const maxResolveBody = MAX_BODY + deltaLimits.maxBytes;
  const state = new ConsoleState({ ...opts.topics, replyPrefix }, { ...(maxIntentBytes !== undefined ? { intentChars: maxIntentBytes } : {}), ...opts.limits });
  const connection: ConnectionSecurity = { ...opts.connection, ...(opts.schemaRegistryUrl ? { schemaRegistryUrl: opts.schemaRegistryUrl } : {}) };
  registerCompressionCodecs();
  const kafka = new Kafka({
    clientId: "writ-console",
    brokers: opts.brokers,
    ...kafkaConnection(connection.kafka),
    logLevel: process.env.LOG_LEVEL?.trim().toLowerCase() === "debug" ? logLevel.DEBUG : logLevel.WARN,
    logCreator: kafkaLogCreator(log),
    connectionTimeout: 3000,
    retry: { retries: 8, initialRetryTime: 300, maxRetryTime: 5000 },
  });
  const codec = new WireCodec(connection);

  // The operator's client: created at the start, so a console that cannot resolve says so at once.
  let operator: WritClient | null = null;
  if (auth.operatorEnabled) {
    operator = await createWritClient({
      brokers: opts.brokers,
      agentId: operatorId,
      replyTopic: opts.operator?.replyTopic ?? `${replyPrefix}${operatorId}`,
      // The reply topics the console follows are the owners' (`writ console` takes WRIT_REPLY_TOPIC_PREFIX).
      replyTopicPrefix: replyPrefix,
      intentsTopic: opts.topics.intents,
      ...connection,
      logger: log,
      ...(opts.operator?.signer ? { signer: opts.operator.signer } : {}),
      ...(opts.operator?.audience !== undefined ? { audience: opts.operator.audience } : {}),
      ...opts.operator?.settings,
    });
  }

  const feed: Feed = startFeed({
    kafka,
    brokers: opts.brokers,
    security: connection.kafka,
    codec,
    state,
    topics: opts.topics,
    replyPrefix,
    groupId,
    backlog: opts.backlog ?? 1000,
    discoverIntervalMs: opts.discoverIntervalMs ?? 5000,
    lagIntervalMs: opts.lagIntervalMs ?? 2000,
    log,
  });

  // Who may write the trusted topics: once, at the start; the page shows a banner unless only the owners may.
  const trusted = checkTrust(kafka, { ...opts.topics, ledger: opts.ledgerTopic ?? "writ.ledger", replyPrefix }, opts.ownerPrincipals ?? [DEFAULT_OWNER_PRINCIPAL]).then((check) => {
    state.setTrust(check);
    const fields = { reason: check.reason, owners: check.owners, ...(check.error ? { error: check.error } : {}) };
    if (check.status === "ok") log.info(fields, `ACL check: ${check.message}`);
    else log.warn(fields, `ACL check: ${check.message}`);
  });

  // Event streams: everything on connect, then what changed, at most every 250 ms; a page that does not read is
  // dropped (EventStreams).
  const streams = new EventStreams();
  const frame = (event: string, data: unknown): string | null => sseFrame(event, data, log);
  const pump = setInterval(() => {
    const changes = state.changes();
    if (changes === null) return;
    // One serialization per change, whatever the number of streams: a burst of escalations makes the section megabytes.
    const text = frame("update", changes);
    // Skipped: the open pages would miss those sections, so they are closed; they reconnect and start from a snapshot.
    if (text === null) streams.endAll();
    else streams.send(text);
  }, 250);
  const heartbeat = setInterval(() => streams.comment("keep-alive"), 15_000);

  const resolving = new Set<string>();
  let allowed = new Set<string>();

  const reply = (res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void => {
    // A refusal closes its connection (and with it any body not read): else a client without a token could keep a
    // slot with cheap refused requests on a keep-alive connection, or a body dribbled after its refusal, for good.
    const close = status >= 400 ? { connection: "close" } : {};
    res.writeHead(status, { ...SECURITY_HEADERS, "content-type": "application/json; charset=utf-8", "cache-control": "no-store", ...close, ...headers }).end(JSON.stringify(body));
  };
  const unauthorized = (res: ServerResponse): void => {
    reply(res, 401, { error: "unauthorized: this console needs its token", reason: "token_invalid" }, { "www-authenticate": 'Bearer realm="writ-console"' });
  };

  /**
   * The operator's client when the request may act as the operator (a POST with the operator token); null once
   * its refusal is answered (405, 401, or 403 naming `what`).
   */
  const asOperator = (req: IncomingMessage, res: ServerResponse, method: string, what: string): WritClient | null => {
    if (method !== "POST") {
      reply(res, 405, { error: "method not allowed" }, { allow: "POST" });
      return null;
    }
    const role = auth.role(ConsoleAuth.tokenOf(req));
    if (role === null) unauthorized(res);
    else if (role !== "operator" || operator === null) reply(res, 403, { error: `${what} needs the operator token` });
    else return operator;
    return null;
  };

  const handle = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const refused = refusedOrigin(req, allowed);
    if (refused !== null) return reply(res, 403, { error: refused });
    const url = new URL(req.url ?? "/", "http://console.invalid");
    const path = url.pathname;
    const method = req.method ?? "GET";

    const asset = Object.hasOwn(ASSETS, path) ? ASSETS[path] : undefined;
    if (asset) {
      if (method !== "GET" && method !== "HEAD") return reply(res, 405, { error: "method not allowed" }, { allow: "GET" });
      res.writeHead(200, { ...SECURITY_HEADERS, "content-type": asset.type, "cache-control": "no-cache" }).end(method === "HEAD" ? undefined : files.get(asset.file));
      return;
    }
    if (path === "/" || path === "/index.html") {
      if (method !== "GET") return reply(res, 405, { error: "method not allowed" }, { allow: "GET" });
      // The page holds no data: it takes its token from the address's fragment (or this tab's storage).
      res.writeHead(200, { ...SECURITY_HEADERS, "content-type": "text/html; charset=utf-8", "cache-control": "no-store" }).end(files.get("index.html"));
      return;
    }
    if (path === "/api/stream-ticket") {
      if (method !== "POST") return reply(res, 405, { error: "method not allowed" }, { allow: "POST" });
      const role = auth.role(ConsoleAuth.tokenOf(req));
      if (role === null) return unauthorized(res);
      const ticket = tickets.issue(role);
      if (ticket === null) return reply(res, 429, { error: "too many stream tickets outstanding; try again shortly", reason: "too_many_tickets" }, { "retry-after": String(Math.ceil(tickets.lifetimeMs / 1000)) });
      return reply(res, 200, { ticket, expiresInMs: tickets.lifetimeMs });
    }
    if (path === "/events") {
      if (method !== "GET") return reply(res, 405, { error: "method not allowed" }, { allow: "GET" });
      const role = tickets.redeem(url.searchParams.get("ticket"));
      if (role === null) return reply(res, 401, { error: "unauthorized: the event stream needs a fresh ticket from POST /api/stream-ticket (each works once)", reason: "ticket_invalid" });
      if (streams.size >= maxStreams) return reply(res, 503, { error: `too many open event streams (${maxStreams})` });
      const snapshot = frame("snapshot", state.snapshot());
      if (snapshot === null) return reply(res, 503, { error: "the console's state could not be sent; try again" }, { "retry-after": "2" });
      res.writeHead(200, { ...SECURITY_HEADERS, "content-type": "text/event-stream; charset=utf-8", "cache-control": "no-store", "x-accel-buffering": "no" });
      res.write("retry: 2000\n\n");
      res.write(frame("hello", session(role))!);
      res.write(snapshot);
      streams.add(res);
      req.on("close", () => streams.delete(res));
      return;
    }
    if (path === "/api/session" || path === "/api/state") {
      if (method !== "GET") return reply(res, 405, { error: "method not allowed" }, { allow: "GET" });
      const role = auth.role(ConsoleAuth.tokenOf(req));
      if (role === null) return unauthorized(res);
      return reply(res, 200, path === "/api/session" ? session(role) : state.snapshot());
    }
    const m = ESCALATION_RESOLVE.exec(path);
    if (m) {
      const client = asOperator(req, res, method, "resolving escalations");
      if (client === null) return;
      let escalationId: string;
      try {
        escalationId = decodeURIComponent(m[1]!);
      } catch {
        return reply(res, 400, { error: "bad escalation id" });
      }
      return resolveEscalation(req, res, escalationId, client);
    }
    if (path === "/api/dead-letters/redrive") {
      if (asOperator(req, res, method, "sending dead letters back") === null) return;
      return redriveDeadLetters(req, res);
    }
    const dl = /^\/api\/dead-letters\/(\d{1,9})\/(\d{1,19})\/redrive$/.exec(path);
    if (dl) {
      if (asOperator(req, res, method, "sending dead letters back") === null) return;
      return redriveDeadLetter(req, res, Number(dl[1]), BigInt(dl[2]!).toString());
    }
    return reply(res, 404, { error: "not found" });
  };

  const session = (role: Role) => ({
    role,
    operator: role === "operator" ? operatorId : null,
    topics: { ...opts.topics, replyPrefix },
    group: groupId,
    limits: state.limits,
    // what the page checks a delta given with Apply against (the endpoint checks it again)
    delta: deltaLimits,
    trust: state.trust,
  });

  /** The request's JSON body parsed by `schema`, or undefined once the error is answered. */
  const jsonBody = async <T>(req: IncomingMessage, res: ServerResponse, schema: z.ZodType<T>, maxBytes = MAX_BODY): Promise<T | undefined> => {
    if (!/^application\/json\b/i.test(req.headers["content-type"] ?? "")) return void reply(res, 415, { error: "send application/json" });
    let raw: string;
    try {
      raw = await readBody(req, maxBytes);
    } catch (err) {
      // The rest of an oversized body is drained, not read into memory; the connection closes after the answer.
      if (err instanceof BodyTooLarge) return void reply(res, 413, { error: err.message, reason: "body_too_large" });
      return void reply(res, 400, { error: "bad request: the body could not be read" });
    }
    try {
      const parsed = schema.safeParse(JSON.parse(raw));
      if (!parsed.success) return void reply(res, 400, { error: `bad request: ${parsed.error.issues.map((i) => `${i.path.join(".") || "(body)"}: ${i.message}`).join("; ")}` });
      return parsed.data;
    } catch {
      return void reply(res, 400, { error: "bad request: not JSON" });
    }
  };

  const resolveEscalation = async (req: IncomingMessage, res: ServerResponse, escalationId: string, client: WritClient): Promise<void> => {
    const body = await jsonBody(req, res, ResolveBody, maxResolveBody);
    if (body === undefined) return;
    let delta: JsonPatchOp[] | undefined;
    if (body.delta !== undefined) {
      const checked = checkDelta(body.delta, body.decision, deltaLimits);
      if (!checked.ok) return reply(res, 400, { error: checked.error, reason: checked.reason });
      delta = checked.delta;
    }
    const found = state.resolvable(escalationId);
    if ("refused" in found) {
      // 409 only for what the page cannot decide; a close some reply reported is no reason (the owner answers).
      const why: Record<NotResolvable, string> = {
        escalation_unknown: "no such escalation (or not read by this console)",
        escalation_not_open: "this escalation is not open any more (the owner answered a decision from this console)",
        escalation_contested: "two different records claim this escalation id: decide from the ledger (writ escalations list, writ escalations resolve)",
        escalation_too_large: "this escalation's intent is too large to resolve from the page: use writ escalations resolve",
      };
      if (found.refused === "escalation_unknown") return reply(res, 404, { error: why.escalation_unknown, reason: found.refused });
      return reply(res, 409, { error: why[found.refused], reason: found.refused, escalation: found.item ?? null });
    }
    const escalation = found.escalation;
    // The resolution carries the escalated intent whole beside the delta: both must fit what owners admit of a
    // resolution (the client would refuse it too_large after the page had checked the delta alone). Always so for
    // an intent an owner admitted; not for a forged escalation's larger one.
    if (delta !== undefined) {
      const room = deltaRoom(opts.operator?.settings, escalation.intent);
      const bytes = Buffer.byteLength(JSON.stringify(delta));
      if (bytes > room) {
        return reply(res, 400, {
          error: `the delta is ${bytes} bytes as JSON; with the escalated intent the resolution carries, at most ${Math.max(0, room)} fit what owners admit of a resolution (twice maxIntentBytes with its other fields): make it smaller`,
          reason: "delta_too_large",
        });
      }
    }
    if (body.decision === "apply" && body.baseVersion === undefined && !escalation.current) {
      return reply(res, 400, { error: "the escalation shows no record version: give the base version to apply on" });
    }
    if (resolving.has(escalationId)) return reply(res, 409, { error: "a decision on this escalation is already on its way" });
    resolving.add(escalationId);
    try {
      const decision = {
        decision: body.decision,
        ...(body.baseVersion !== undefined ? { baseVersion: body.baseVersion } : {}),
        ...(body.message ? { message: body.message } : {}),
        ...(delta !== undefined ? { delta } : {}),
      };
      let answer: SubmitResult;
      try {
        answer = await client.resolve(escalation, decision, { timeoutMs: opts.resolveTimeoutMs ?? 30_000 });
      } catch (err) {
        log.error({ err, escalationId, decision: body.decision, operator: operatorId }, "could not send the resolution");
        return reply(res, 502, { error: `could not send the resolution: ${(err as Error).message}` });
      }
      const a = answer as SubmitResult & { reason?: string; message?: string; at?: string; version?: string };
      state.resolutionAnswered(escalationId, body.decision, operatorId, a);
      log.info({ escalationId, decision: body.decision, operator: operatorId, withDelta: delta !== undefined, status: a.status, reason: a.reason }, "escalation decision from the console");
      opts.onDecision?.({ escalationId, decision: body.decision, operator: operatorId, status: a.status, ...(a.reason ? { reason: a.reason } : {}) });
      // The answer as the page shows it, bounded: any producer can write the operator's reply topic, and a refusal's
      // details carry the record as the owner read it (a large, deeply nested one stalled the page's tab).
      return reply(res, 200, { answer: state.answerShown(a), escalation: state.escalationItem(escalationId) ?? null });
    } finally {
      resolving.delete(escalationId);
    }
  };

  const sender = new DeadLetterSender({
    kafka,
    codec,
    state,
    topics: opts.topics,
    readTimeoutMs: opts.redriveReadTimeoutMs ?? 30_000,
    operatorId,
    log,
    ...(opts.onRedrive ? { onRedrive: opts.onRedrive } : {}),
  });

  /** One dead letter: its answer with the HTTP status of its outcome. */
  const redriveDeadLetter = async (req: IncomingMessage, res: ServerResponse, partition: number, offset: string): Promise<void> => {
    if ((await jsonBody(req, res, RedriveBody)) === undefined) return;
    const [r] = await sender.sendBack([{ partition, offset }]);
    const deadLetter = state.deadLetterAt(partition, offset) ?? null;
    if (r!.outcome === "sent") return reply(res, 200, { sentTo: r!.sentTo, header: REDRIVEN_FROM_HEADER, deadLetter });
    return reply(res, SEND_BACK_STATUS[r!.outcome], { error: r!.error, reason: r!.outcome, ...(deadLetter === null ? {} : { deadLetter }) });
  };

  /** Several dead letters: 200 with an answer for each, in the order asked. */
  const redriveDeadLetters = async (req: IncomingMessage, res: ServerResponse): Promise<void> => {
    const body = await jsonBody(req, res, RedriveManyBody);
    if (body === undefined) return;
    const results = await sender.sendBack(body.deadLetters.map((d) => ({ partition: d.partition, offset: BigInt(d.offset).toString() })));
    const sent = results.filter((r) => r.outcome === "sent").length;
    return reply(res, 200, { sent, notSent: results.length - sent, header: REDRIVEN_FROM_HEADER, results: results.map((r) => ({ ...r, deadLetter: state.deadLetterAt(r.partition, r.offset) ?? null })) });
  };

  const http: Server = createServer((req, res) => {
    handle(req, res).catch((err: unknown) => {
      log.error({ err, path: (req.url ?? "").split("?")[0] }, "console request failed");
      if (!res.headersSent) reply(res, 500, { error: "internal error" });
      else res.end();
    });
  });
  const host = opts.host ?? "127.0.0.1";
  try {
    // Event streams are capped at maxStreams apart from this (a quarter at most); each page load opens a few more connections.
    await listen(http, { ...limits, port: opts.port ?? 0, host, log, what: "console" });
  } catch (err) {
    clearInterval(pump);
    clearInterval(heartbeat);
    await feed.close();
    await operator?.close();
    throw err;
  }
  const port = (http.address() as AddressInfo).port;
  allowed = allowedHostsFor(host, port, opts.allowedHosts);
  const shownHost = host.includes(":") && !host.startsWith("[") ? `[${host}]` : host === "0.0.0.0" ? "127.0.0.1" : host === "::" ? "[::1]" : host;

  let closing: Promise<void> | undefined;
  return {
    url: `http://${shownHost}:${port}`,
    port,
    state,
    ready: Promise.all([feed.started, trusted]).then(() => undefined),
    close() {
      closing ??= (async () => {
        clearInterval(pump);
        clearInterval(heartbeat);
        streams.endAll();
        http.closeAllConnections();
        await new Promise<void>((resolve) => http.close(() => resolve()));
        await feed.close();
        await operator?.close();
        await sender.close();
      })();
      return closing;
    },
  };
}

/** The ACL check (src/doctor/acls.ts) with an admin client of its own; never rejects. */
async function checkTrust(kafka: Kafka, topics: Parameters<typeof checkTopicAcls>[1], owners: readonly string[]): Promise<AclCheck> {
  const admin = kafka.admin();
  try {
    await admin.connect();
    return await checkTopicAcls(admin, topics, owners);
  } catch (err) {
    return aclCheckFailure(err, topics, owners);
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

/**
 * A server-sent event, or null when it cannot be made (logged). The state is bounded, but what it holds came
 * from hostile records: a frame that fails to serialize (RangeError: Invalid string length) must cost that
 * frame, never the process (the pump runs on a timer: an exception there exits).
 */
/**
 * The resolve route. The page names an escalation by its id as shown (ConsoleState.name: at most NAME_CHARS
 * characters), percent-encoded: at most 9 characters for each (one of 3 UTF-8 bytes, as the `…` of a cut or marked
 * id), so every id shown fits.
 */
const ESCALATION_RESOLVE = new RegExp(`^/api/escalations/([^/]{1,${9 * NAME_CHARS}})/resolve$`);

export function sseFrame(event: string, data: unknown, log: Pick<Logger, "error">): string | null {
  try {
    return `event: ${event}\ndata: ${JSON.stringify(data)}\n\n`;
  } catch (err) {
    log.error({ err, event }, "console: a frame could not be made; skipped");
    return null;
  }
}


class BodyTooLarge extends Error {}

/**
 * The request body, at most `max` bytes. Past that (or a Content-Length past it) it rejects with
 * BodyTooLarge and lets the rest drain unbuffered: destroying the request here would take the
 * socket, and with it the 413 that says why.
 */
function readBody(req: IncomingMessage, max: number): Promise<string> {
  return new Promise((resolve, reject) => {
    const tooLarge = () => new BodyTooLarge(`request body over ${max} bytes`);
    if (Number(req.headers["content-length"] ?? 0) > max) {
      req.resume();
      return reject(tooLarge());
    }
    const chunks: Buffer[] = [];
    let size = 0;
    const onData = (c: Buffer) => {
      size += c.length;
      if (size > max) {
        req.off("data", onData);
        req.resume();
        reject(tooLarge());
        return;
      }
      chunks.push(c);
    };
    req.on("data", onData);
    req.on("end", () => resolve(Buffer.concat(chunks).toString("utf8")));
    req.on("error", reject);
  });
}
