import { createServer, type Server } from "node:http";
import { WritError } from "../errors.ts";
import { listen, listenFault, probeListen } from "../listen.ts";
import type { Logger } from "../logger.ts";

/** Open connections to the health endpoints at most. */
export const HEALTH_MAX_CONNECTIONS = 64;

/** How long `/healthz` keeps listing an outage after it was last reported. ms. */
export const OUTAGE_LISTED_MS = 60_000;

/**
 * An outage on `/healthz`: the system, the last reason, since when it has been out and when it was last seen out
 * (ISO times), and when it answered again, once it has (the entry stays until a minute after `lastSeenAt`).
 */
export interface OutageReport {
  system: string;
  reason: string;
  since: string;
  lastSeenAt: string;
  answeredAt?: string;
}

/**
 * What an owner process reports about itself: problems that need a person
 * (an unreadable ledger partition, a hanging transaction, a consumer that
 * gave up), outages that pause work and heal on their own (a system of
 * record, the registry), and readiness (every assigned partition restored).
 */
export class HealthBoard {
  private readonly problems = new Map<string, { message: string; since: number }>();
  /** By system: since when it has been out, when it was last reported out, and when it answered again (if it has). */
  private readonly outages = new Map<string, { reason: string; since: number; lastSeen: number; answeredAt?: number }>();
  private readiness: () => { ready: boolean; detail: unknown } = () => ({ ready: false, detail: "starting" });

  /** Where an outage's start (warn) and its end (info) are said, once each. */
  private readonly log: Logger | undefined;

  constructor(log?: Logger) {
    this.log = log;
  }

  problem(key: string, message: string): void {
    if (!this.problems.has(key)) this.problems.set(key, { message, since: Date.now() });
  }

  clear(key: string): void {
    this.problems.delete(key);
  }

  /**
   * A system that was unreachable just now; listed until it has not been reported for a minute
   * ({@link OUTAGE_LISTED_MS}), also after it answers again. The first report of an outage is logged (warn).
   */
  outage(system: string, reason: string): void {
    const now = Date.now();
    const known = this.outages.get(system);
    if (known !== undefined && known.answeredAt === undefined) {
      known.reason = reason;
      known.lastSeen = now;
      return;
    }
    this.outages.set(system, { reason, since: now, lastSeen: now });
    this.log?.warn({ system, reason }, "system of record unavailable; intents for it pause until it answers");
  }

  /** A call `system` answered (any answer but an outage): ends its outage, if it has one, said once (info). */
  answered(system: string): void {
    const known = this.outages.get(system);
    if (known === undefined || known.answeredAt !== undefined) return;
    const now = Date.now();
    known.answeredAt = now;
    this.log?.info(
      { system, since: new Date(known.since).toISOString(), outageMs: now - known.since },
      `system of record answers again after an outage; /healthz lists the outage for ${OUTAGE_LISTED_MS / 1000} s after it was last seen`,
    );
  }

  setReadiness(fn: () => { ready: boolean; detail: unknown }): void {
    this.readiness = fn;
  }

  /** Healthy: nothing that needs a person. Outages are reported but do not fail health: they heal by themselves. */
  health(): { ok: boolean; problems: { key: string; message: string; sinceMs: number }[]; outages: OutageReport[] } {
    const now = Date.now();
    for (const [k, o] of this.outages) if (now - o.lastSeen > OUTAGE_LISTED_MS) this.outages.delete(k);
    const iso = (ms: number) => new Date(ms).toISOString();
    return {
      ok: this.problems.size === 0,
      problems: [...this.problems].map(([key, p]) => ({ key, message: p.message, sinceMs: now - p.since })),
      outages: [...this.outages].map(([system, o]) => ({
        system,
        reason: o.reason,
        since: iso(o.since),
        lastSeenAt: iso(o.lastSeen),
        ...(o.answeredAt === undefined ? {} : { answeredAt: iso(o.answeredAt) }),
      })),
    };
  }

  ready(): { ready: boolean; detail: unknown } {
    return this.readiness();
  }

  /**
   * Serves `/healthz` (200 healthy, 503 with the problems), `/readyz` (200 once
   * every assigned partition is restored) and, given `metrics`, `/metrics`
   * (Prometheus text format). At most {@link HEALTH_MAX_CONNECTIONS} connections, each closed when its request's
   * headers take longer than `headersTimeoutMs` (default 10 s), its whole request longer than 30 s, or it idles
   * 5 s after a response; `maxConnectionsPerAddress` caps one address's share (default: no cap of its own).
   */
  async serve(opts: {
    host: string;
    port: number;
    log: Logger;
    metrics?: () => Promise<{ contentType: string; body: string }>;
    headersTimeoutMs?: number;
    maxConnectionsPerAddress?: number;
  }): Promise<Server> {
    const server = createServer((req, res) => {
      const path = (req.url ?? "/").split("?")[0];
      if (path === "/metrics" && opts.metrics) {
        opts.metrics().then(
          (m) => res.writeHead(200, { "content-type": m.contentType }).end(m.body),
          (err: unknown) => res.writeHead(500, { "content-type": "text/plain" }).end(`metrics failed: ${err instanceof Error ? err.message : String(err)}`),
        );
        return;
      }
      let status = 404;
      let body: unknown = { error: "not found" };
      if (path === "/healthz") {
        const h = this.health();
        status = h.ok ? 200 : 503;
        body = h;
      } else if (path === "/readyz") {
        const r = this.ready();
        status = r.ready ? 200 : 503;
        body = r;
      }
      res.writeHead(status, { "content-type": "application/json" });
      res.end(JSON.stringify(body));
    });
    await listen(server, {
      port: opts.port,
      host: opts.host,
      maxConnections: HEALTH_MAX_CONNECTIONS,
      ...(opts.headersTimeoutMs === undefined ? {} : { headersTimeoutMs: opts.headersTimeoutMs }),
      ...(opts.maxConnectionsPerAddress === undefined ? {} : { maxConnectionsPerAddress: opts.maxConnectionsPerAddress }),
      log: opts.log,
      what: "health endpoints",
    });
    const addr = server.address();
    opts.log.info({ address: typeof addr === "object" && addr ? `${addr.address}:${addr.port}` : addr }, "health endpoints serving");
    return server;
  }
}

/**
 * Why the health endpoints cannot listen on `host:port`, as the setting to fix ({@link listenFault}): WRIT_HEALTH_PORT
 * or WRIT_HEALTH_HOST. A config_invalid error, so `writ owner` says it in one line (exit 2).
 */
export function healthListenError(host: string, port: number, err: unknown): WritError {
  const { setting, reason } = listenFault("the health endpoints", host, port, err);
  const [variable, field] = setting === "port" ? ["WRIT_HEALTH_PORT", "healthPort"] : ["WRIT_HEALTH_HOST", "healthHost"];
  return new WritError("config_invalid", `invalid router configuration: ${variable} (${field}): ${reason}`, { retriable: false, cause: err, context: { field: variable } });
}

/**
 * The health address tried at the owner's start ({@link probeListen}): one that cannot be had fails the start
 * ({@link healthListenError}) before anything connects to Kafka, not once the owner has joined its group.
 */
export async function checkHealthAddress(host: string, port: number): Promise<void> {
  await probeListen(host, port).catch((err: unknown) => {
    throw healthListenError(host, port, err);
  });
}
