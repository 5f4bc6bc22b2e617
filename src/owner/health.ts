import { createServer, type Server } from "node:http";
import { listen } from "../listen.ts";
import type { Logger } from "../logger.ts";

/**
 * What an owner process reports about itself: problems that need a person
 * (an unreadable ledger partition, a hanging transaction, a consumer that
 * gave up), outages that pause work and heal on their own (a system of
 * record, the registry), and readiness (every assigned partition restored).
 */
export class HealthBoard {
  private readonly problems = new Map<string, { message: string; since: number }>();
  private readonly outages = new Map<string, { reason: string; at: number }>();
  private readiness: () => { ready: boolean; detail: unknown } = () => ({ ready: false, detail: "starting" });

  problem(key: string, message: string): void {
    if (!this.problems.has(key)) this.problems.set(key, { message, since: Date.now() });
  }

  clear(key: string): void {
    this.problems.delete(key);
  }

  /** A system that was unreachable just now; forgotten once it has not been reported for a minute. */
  outage(system: string, reason: string): void {
    this.outages.set(system, { reason, at: Date.now() });
  }

  setReadiness(fn: () => { ready: boolean; detail: unknown }): void {
    this.readiness = fn;
  }

  /** Healthy: nothing that needs a person. Outages are reported but do not fail health: they heal by themselves. */
  health(): { ok: boolean; problems: { key: string; message: string; sinceMs: number }[]; outages: { system: string; reason: string }[] } {
    const now = Date.now();
    for (const [k, o] of this.outages) if (now - o.at > 60_000) this.outages.delete(k);
    return {
      ok: this.problems.size === 0,
      problems: [...this.problems].map(([key, p]) => ({ key, message: p.message, sinceMs: now - p.since })),
      outages: [...this.outages].map(([system, o]) => ({ system, reason: o.reason })),
    };
  }

  ready(): { ready: boolean; detail: unknown } {
    return this.readiness();
  }

  /**
   * Serves `/healthz` (200 healthy, 503 with the problems), `/readyz` (200 once
   * every assigned partition is restored) and, given `metrics`, `/metrics`
   * (Prometheus text format).
   */
  async serve(opts: { host: string; port: number; log: Logger; metrics?: () => Promise<{ contentType: string; body: string }> }): Promise<Server> {
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
    await listen(server, { port: opts.port, host: opts.host, maxConnections: 64, log: opts.log, what: "health endpoints" });
    const addr = server.address();
    opts.log.info({ address: typeof addr === "object" && addr ? `${addr.address}:${addr.port}` : addr }, "health endpoints serving");
    return server;
  }
}
