// The fault suite's records server (test/faults/records-process.ts) restarts after an outage on the port it had,
// and that port lies below the range the OS draws outgoing connections' local ports from, as this machine's
// /proc/sys/net/ipv4/ip_local_port_range sets it: the kernel's pick for port 0, which it used to take, lies inside
// it, where any connection could hold it while the server was down.
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, type AddressInfo, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterAll, afterEach, describe, expect, it } from "vitest";
import { RECORDS_PORTS, RecordsProcess, ephemeralFrom, recordsPorts } from "../faults/records-process.ts";

const root = resolve(import.meta.dirname, "..", "..");
/** The first port of this machine's range for outgoing connections' local ports, read here (32768 without /proc). */
const range = (() => {
  try {
    return Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
  } catch {
    return 32768;
  }
})();
const dirs: string[] = [];
const tempDir = (): string => {
  const dir = mkdtempSync(join(tmpdir(), "writ-records-process-"));
  dirs.push(dir);
  return dir;
};
afterAll(() => {
  for (const dir of dirs) rmSync(dir, { recursive: true, force: true });
});

const stops: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const stop of stops.splice(0).reverse()) await stop();
});

function records(drawPort?: () => number): RecordsProcess {
  const dir = tempDir();
  const r = new RecordsProcess({ root, dbPath: join(dir, "records.db"), logFile: join(dir, "records.log"), ...(drawPort ? { drawPort } : {}) });
  stops.push(() => r.stop());
  return r;
}

async function holdPort(): Promise<Server> {
  // one of the records server's own range, as a listener another suite started might hold (anywhere below the
  // ephemeral range where it has none)
  for (let port = RECORDS_PORTS?.to ?? range - 1; ; port--) {
    const server = createServer();
    const bound = await new Promise<boolean>((done) => {
      server.once("error", () => done(false));
      server.listen(port, "127.0.0.1", () => done(true));
    });
    if (bound) {
      stops.push(() => close(server));
      return server;
    }
  }
}

const close = (server: Server): Promise<void> => new Promise((done) => server.close(() => done()));

describe("the fault suite's records server", () => {
  it("draws its port above the fixed ports and below the range read from /proc, where there is room", () => {
    const file = (text: string): string => {
      const f = join(tempDir(), "ip_local_port_range");
      writeFileSync(f, text);
      return f;
    };
    expect(ephemeralFrom(file("32768\t60999\n"))).toBe(32768);
    expect(ephemeralFrom(file("28000 60999\n"))).toBe(28000);
    expect(ephemeralFrom(file("garbage\n"))).toBe(32768);
    expect(ephemeralFrom(join(tempDir(), "missing"))).toBe(32768);
    expect(recordsPorts(32768)).toEqual({ from: 23000, to: 32767 });
    expect(recordsPorts(28000)).toEqual({ from: 23000, to: 27999 });
    expect(recordsPorts(49152)).toEqual({ from: 23000, to: 32767 });
    // no room between the fixed ports (up to 22997) and the range: the kernel's pick
    expect(recordsPorts(23000)).toBeNull();
    expect(recordsPorts(1024)).toBeNull();
    expect(RECORDS_PORTS).toEqual(recordsPorts(range));
  });

  it.runIf(RECORDS_PORTS !== null)("listens below the ephemeral range, and an outage's restart binds the same port, keeping its records", async () => {
    expect(RECORDS_PORTS!.to).toBeLessThan(range);
    const r = records();
    await r.start();
    const port = Number(new URL(r.url).port);
    expect(port).toBeGreaterThanOrEqual(RECORDS_PORTS!.from);
    expect(port).toBeLessThan(range);
    await r.seed("payment", "pay_1", { amountCents: 100, refunds: [] });
    await r.outage(0);
    expect(r.outages).toBe(1);
    expect(r.url).toBe(`http://127.0.0.1:${port}`);
    const res = await fetch(`${r.url}/records/payment/pay_1`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ amountCents: 100 });
  });

  it("with no room below the range, takes the kernel's pick", async () => {
    const r = records(() => 0);
    await r.start();
    expect(Number(new URL(r.url).port)).toBeGreaterThan(0);
    await r.seed("payment", "pay_1", { amountCents: 100, refunds: [] });
    expect((await fetch(`${r.url}/records/payment/pay_1`)).status).toBe(200);
  });

  it("a first port a listener holds is drawn again", async () => {
    const held = (await holdPort()).address() as AddressInfo;
    // a port free a moment ago for the second draw (below the range, only a listener could take it since)
    const spareServer = await holdPort();
    const spare = (spareServer.address() as AddressInfo).port;
    await close(spareServer);
    const draws = [held.port, spare];
    const r = records(() => draws.shift() ?? held.port);
    await r.start();
    expect(r.url).toBe(`http://127.0.0.1:${spare}`);
    expect(draws).toEqual([]);
  });
});
