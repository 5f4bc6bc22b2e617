// The fault suite's records server (test/faults/records-process.ts) restarts after an outage on the port it had,
// and that port lies below the range the OS draws outgoing connections' local ports from: the kernel's pick for
// port 0, which it used to take, lies inside it, where any connection could hold it while the server was down.
import { mkdtempSync, readFileSync } from "node:fs";
import { createServer, type AddressInfo, type Server } from "node:net";
import { tmpdir } from "node:os";
import { join, resolve } from "node:path";
import { afterEach, describe, expect, it } from "vitest";
import { RECORDS_PORTS, RecordsProcess } from "../faults/records-process.ts";

const root = resolve(import.meta.dirname, "..", "..");
/** The lowest port of Linux's range for outgoing connections' local ports (32768 by default). */
const ephemeralFrom = (() => {
  try {
    return Number(readFileSync("/proc/sys/net/ipv4/ip_local_port_range", "utf8").trim().split(/\s+/)[0]);
  } catch {
    return 32768;
  }
})();

const stops: (() => Promise<void>)[] = [];
afterEach(async () => {
  for (const stop of stops.splice(0).reverse()) await stop();
});

function records(drawPort?: () => number): RecordsProcess {
  const dir = mkdtempSync(join(tmpdir(), "writ-records-process-"));
  const r = new RecordsProcess({ root, dbPath: join(dir, "records.db"), logFile: join(dir, "records.log"), ...(drawPort ? { drawPort } : {}) });
  stops.push(() => r.stop());
  return r;
}

async function holdPort(): Promise<Server> {
  // one of the records server's own range, as a listener another suite started might hold
  for (let port = RECORDS_PORTS.to; ; port--) {
    const server = createServer();
    const bound = await new Promise<boolean>((done) => {
      server.once("error", () => done(false));
      server.listen(port, "127.0.0.1", () => done(true));
    });
    if (bound) {
      stops.push(() => new Promise((done) => server.close(() => done())));
      return server;
    }
  }
}

describe("the fault suite's records server", () => {
  it("listens below the ephemeral range, and an outage's restart binds the same port, keeping its records", async () => {
    expect(RECORDS_PORTS.to).toBeLessThan(ephemeralFrom);
    const r = records();
    await r.start();
    const port = Number(new URL(r.url).port);
    expect(port).toBeGreaterThanOrEqual(RECORDS_PORTS.from);
    expect(port).toBeLessThan(ephemeralFrom);
    await r.seed("payment", "pay_1", { amountCents: 100, refunds: [] });
    await r.outage(0);
    expect(r.outages).toBe(1);
    expect(r.url).toBe(`http://127.0.0.1:${port}`);
    const res = await fetch(`${r.url}/records/payment/pay_1`);
    expect(res.status).toBe(200);
    expect(await res.json()).toMatchObject({ amountCents: 100 });
  });

  it("a first port a listener holds is drawn again", async () => {
    const held = (await holdPort()).address() as AddressInfo;
    const draws = [held.port, held.port - 1];
    const r = records(() => draws.shift() ?? RECORDS_PORTS.from);
    await r.start();
    expect(r.url).toBe(`http://127.0.0.1:${held.port - 1}`);
    expect(draws).toEqual([]);
  });
});
