// The fault suite's system of record: the demo records server in a process of its own, as a real
// system of record is remote: the suite's agents never stall its event loop, and an outage is a
// real one (the process is killed; connections are refused) while its SQLite file keeps every
// committed write for the checks afterwards.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { DemoFaultInput } from "../../src/testing/demo-records-server.ts";
import { DemoRecordsStore } from "../../src/testing/demo-records-store.ts";

export class RecordsProcess {
  readonly url: string;
  private readonly port: number;
  private readonly dbPath: string;
  private readonly logFile: string;
  private readonly script: string;
  private proc: ChildProcess | null = null;
  /** Total ms the server was down (killed and not yet serving again). */
  downMs = 0;
  outages = 0;

  constructor(opts: { root: string; port: number; dbPath: string; logFile: string }) {
    this.port = opts.port;
    this.dbPath = opts.dbPath;
    this.logFile = opts.logFile;
    this.script = join(opts.root, "src", "testing", "demo-records-server-main.ts");
    this.url = `http://127.0.0.1:${opts.port}`;
  }

  async start(): Promise<void> {
    const log = createWriteStream(this.logFile, { flags: "a" });
    const proc = spawn(process.execPath, [this.script], {
      env: {
        ...process.env,
        RECORDS_PORT: String(this.port),
        RECORDS_DB: this.dbPath,
        // writ's dedupe is what the suite measures: the server applies a repeated key again.
        RECORDS_HONOUR_IDEMPOTENCY_KEY: "false",
        RECORDS_ENFORCE_IF_MATCH: "true",
      },
      stdio: ["ignore", "pipe", "pipe"],
    });
    proc.stdout!.pipe(log, { end: false });
    proc.stderr!.pipe(log, { end: false });
    proc.once("exit", () => log.end());
    this.proc = proc;
    const deadline = Date.now() + 30_000;
    while (Date.now() < deadline) {
      if (proc.exitCode !== null) throw new Error(`records server exited with ${proc.exitCode}; see ${this.logFile}`);
      const ok = await fetch(`${this.url}/_admin/stats`, { signal: AbortSignal.timeout(1000) }).then(
        (r) => r.ok,
        () => false,
      );
      if (ok) return;
      await sleep(100);
    }
    throw new Error(`records server did not serve within 30 s; see ${this.logFile}`);
  }

  /** A hard outage: SIGKILL, down for `ms`, then the same server on the same port and database. */
  async outage(ms: number): Promise<void> {
    const started = Date.now();
    await this.kill();
    this.outages++;
    await sleep(ms);
    await this.start();
    this.downMs += Date.now() - started;
  }

  private async kill(): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null) return;
    const gone = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
    proc.kill("SIGKILL");
    await gone;
  }

  async stop(): Promise<void> {
    const proc = this.proc;
    if (!proc || proc.exitCode !== null) return;
    const gone = new Promise<void>((resolve) => proc.once("exit", () => resolve()));
    proc.kill("SIGTERM");
    await Promise.race([gone, sleep(10_000).then(() => proc.kill("SIGKILL"))]);
    await gone;
  }

  async seed(type: string, id: string, state: unknown): Promise<void> {
    await this.admin("PUT", `/_admin/records/${encodeURIComponent(type)}/${encodeURIComponent(id)}`, state);
  }

  async setFaults(faults: readonly DemoFaultInput[]): Promise<void> {
    await this.admin("POST", "/_admin/faults", faults);
  }

  /** The server's database, for the checks once it has stopped. */
  openStore(): DemoRecordsStore {
    return new DemoRecordsStore(this.dbPath);
  }

  private async admin(method: string, path: string, body: unknown): Promise<void> {
    for (let attempt = 1; ; attempt++) {
      try {
        const res = await fetch(`${this.url}${path}`, {
          method,
          headers: { "content-type": "application/json" },
          body: JSON.stringify(body),
          signal: AbortSignal.timeout(5000),
        });
        if (!res.ok) throw new Error(`${method} ${path}: ${res.status} ${await res.text()}`);
        return;
      } catch (err) {
        // The server may be in an outage the suite itself caused; it comes back.
        if (attempt >= 60) throw err;
        await sleep(500);
      }
    }
  }
}
