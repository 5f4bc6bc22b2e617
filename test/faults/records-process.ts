// The fault suite's system of record: the demo records server in a process of its own, as a real
// system of record is remote: the suite's agents never stall its event loop, and an outage is a
// real one (the process is killed; connections are refused) while its SQLite file keeps every
// committed write for the checks afterwards.
import { spawn, type ChildProcess } from "node:child_process";
import { createWriteStream, readFileSync } from "node:fs";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import type { DemoFaultInput } from "../../src/testing/demo-records-server.ts";
import { DemoRecordsStore } from "../../src/testing/demo-records-store.ts";

/**
 * The first port of the range the OS draws the local ports of outgoing connections from: Linux's
 * /proc/sys/net/ipv4/ip_local_port_range (32768-60999 by default), else 32768 (below macOS's 49152).
 */
export function ephemeralFrom(rangeFile = "/proc/sys/net/ipv4/ip_local_port_range"): number {
  try {
    const from = Number(readFileSync(rangeFile, "utf8").trim().split(/\s+/)[0]);
    if (Number.isInteger(from) && from > 0 && from <= 65535) return from;
  } catch {
    // no /proc (macOS): its range starts higher still
  }
  return 32768;
}

/**
 * Where the first start draws its port from: above every fixed port of the stacks and the test files (the highest
 * 22997, test/faults/run-hang-case.ts), at most 32767 (above lie fixed ports such as the console's 39200), and below
 * `ephemeral`, the start of the range the OS draws the local ports of outgoing connections from. The kernel's pick
 * for port 0 lies inside that range: while the server was down in an outage, any connection (an owner's to the
 * broker, the suite's own) could be given that port as its local port, and the restart on it failed. Below the
 * range, only a listener can take it, and none binds to a port drawn here.
 * null when the range starts at 23000 or lower: no port is clear of both the fixed ports and the range, and the
 * server takes the kernel's pick (port 0), which a connection may hold when an outage's restart binds it again.
 */
export function recordsPorts(ephemeral: number): { from: number; to: number } | null {
  return ephemeral > 23000 ? { from: 23000, to: Math.min(ephemeral - 1, 32767) } : null;
}

export const RECORDS_PORTS = recordsPorts(ephemeralFrom());

function drawPort(): number {
  if (RECORDS_PORTS === null) return 0;
  return RECORDS_PORTS.from + Math.floor(Math.random() * (RECORDS_PORTS.to - RECORDS_PORTS.from + 1));
}

export class RecordsProcess {
  /** Drawn by the first start (another draw when a listener holds it; the kernel's pick for a draw of 0); every restart binds it again. */
  private port: number | null = null;
  private readonly dbPath: string;
  private readonly logFile: string;
  private readonly script: string;
  private readonly draw: () => number;
  private proc: ChildProcess | null = null;
  /** Total ms the server was down (killed and not yet serving again). */
  downMs = 0;
  outages = 0;

  constructor(opts: { root: string; dbPath: string; logFile: string; drawPort?: () => number }) {
    this.dbPath = opts.dbPath;
    this.logFile = opts.logFile;
    this.script = join(opts.root, "src", "testing", "demo-records-server-main.ts");
    this.draw = opts.drawPort ?? drawPort;
  }

  /** Its address, once started. */
  get url(): string {
    if (this.port === null) throw new Error("the records server has no address before its first start");
    return `http://127.0.0.1:${this.port}`;
  }

  /** Starts the server (again, on its port) and resolves once it listens: it logs its url then. */
  async start(): Promise<void> {
    if (this.port !== null) {
      await this.launch(this.port);
      return;
    }
    for (let attempt = 1; ; attempt++) {
      try {
        this.port = await this.launch(this.draw());
        return;
      } catch (err) {
        if (!(err instanceof PortTaken) || attempt >= 10) throw err;
      }
    }
  }

  /** Starts the server on `port` (0: the kernel's pick); resolves with the port it listens on. */
  private async launch(port: number): Promise<number> {
    const log = createWriteStream(this.logFile, { flags: "a" });
    const proc = spawn(process.execPath, [this.script], {
      env: {
        ...process.env,
        // Only 127.0.0.1 in tests (and the url the start waits for names it), whatever the environment says.
        RECORDS_HOST: "127.0.0.1",
        RECORDS_PORT: String(port),
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
    return listeningOn(proc, port, this.logFile);
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

/** The records server exited at start because a listener held its port. */
class PortTaken extends Error {}

/**
 * Resolves with the port once `proc` logs its url on `port` (any port for 0); rejects when it exits first (PortTaken
 * when the port was held), or after 30 s.
 */
function listeningOn(proc: ChildProcess, port: number, logFile: string): Promise<number> {
  return new Promise((resolve, reject) => {
    let out = "";
    const done = (end: () => void) => {
      clearTimeout(timer);
      proc.stdout!.off("data", onData);
      proc.off("exit", onExit);
      end();
    };
    const onData = (chunk: Buffer) => {
      out += chunk.toString("utf8");
      const url = /"url":"http:\/\/127\.0\.0\.1:(\d+)"/.exec(out);
      if (url !== null && (port === 0 || Number(url[1]) === port)) done(() => resolve(Number(url[1])));
    };
    const onExit = (code: number | null) =>
      done(() => reject(out.includes("EADDRINUSE") ? new PortTaken(`port ${port} is taken; see ${logFile}`) : new Error(`records server exited with ${code}; see ${logFile}`)));
    const timer = setTimeout(() => done(() => reject(new Error(`records server did not listen within 30 s; see ${logFile}`))), 30_000);
    proc.stdout!.on("data", onData);
    proc.once("exit", onExit);
  });
}
