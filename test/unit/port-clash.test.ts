// The local stacks start a JVM again when one of their fixed ports was taken
// (src/testing/local-stack.ts retryOnPortClash): CI once lost its secure stack
// to an outgoing connection holding 127.0.0.1:39692 as its local port.
import { existsSync, mkdtempSync, writeFileSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { connect, createServer, type AddressInfo, type Socket } from "node:net";
import { freePort } from "../../src/testing/free-port.ts";
import { isSelfConnection, PortServedByAnotherCluster, retryOnPortClash, tcpOpen } from "../../src/testing/local-stack.ts";

describe("retryOnPortClash", () => {
  it("starts again after a JVM exited on a taken port, keeping the failed attempt's log beside", async () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-port-clash-"));
    const logFile = join(dir, "broker.log");
    const said: string[] = [];
    let launches = 0;
    await retryOnPortClash("broker", [logFile], async () => {
      launches++;
      if (launches === 1) {
        writeFileSync(logFile, "ERROR Unable to start acceptor\norg.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:39692: Address already in use.\n");
        throw new Error("broker JVM exited during startup");
      }
    }, (l) => said.push(l));
    expect(launches).toBe(2);
    expect(existsSync(`${logFile}.port-clash-1`)).toBe(true);
    expect(said).toEqual([expect.stringContaining("starting it again in 2 s (attempt 2 of 5)")]);
  });

  it("any other failure is thrown at once, and a port that stays taken after the last attempt too", async () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-port-clash-"));
    const logFile = join(dir, "registry.out");
    let launches = 0;
    await expect(
      retryOnPortClash("registry", [logFile], async () => {
        launches++;
        writeFileSync(logFile, "ERROR something else entirely\n");
        throw new Error("registry JVM exited during startup");
      }, () => undefined),
    ).rejects.toThrow("registry JVM exited");
    expect(launches).toBe(1);
    await expect(
      retryOnPortClash("registry", [logFile], async () => {
        launches++;
        writeFileSync(logFile, "Port 38081 seems to be in use by another process\n");
        throw new Error("still taken");
      }, () => undefined, 2),
    ).rejects.toThrow("still taken");
    expect(launches).toBe(3);
  });

  it("another stack's broker answering on the port is no passing clash: thrown at once", async () => {
    const dir = mkdtempSync(join(tmpdir(), "writ-port-clash-"));
    const logFile = join(dir, "broker.log");
    let launches = 0;
    const taken = retryOnPortClash("broker", [logFile], async () => {
      launches++;
      // the JVM's log says the port was taken, as after a passing clash
      writeFileSync(logFile, "org.apache.kafka.common.KafkaException: Socket server failed to bind to 127.0.0.1:19093: Address already in use.\n");
      throw new PortServedByAnotherCluster("broker: 127.0.0.1:19092 answers as a broker of cluster pQ0h8r3WS6-7LNz1Zy0aBg");
    }, () => undefined);
    await expect(taken).rejects.toThrow(PortServedByAnotherCluster);
    expect(launches).toBe(1);
  });
});

/**
 * A connection from 127.0.0.1:`port` to itself, on a port found free. Another process may take that port between
 * the look and the connect's bind (EADDRINUSE): then another port, a few times.
 */
async function selfConnection(): Promise<Socket> {
  for (let attempt = 1; ; attempt++) {
    const port = await freePort();
    try {
      return await new Promise<Socket>((resolve, reject) => {
        const s = connect({ host: "127.0.0.1", port, localAddress: "127.0.0.1", localPort: port });
        s.once("connect", () => resolve(s));
        s.once("error", reject);
      });
    } catch (err) {
      if ((err as NodeJS.ErrnoException).code !== "EADDRINUSE" || attempt >= 5) throw err;
    }
  }
}

describe("readiness probes and connections to themselves", () => {
  // A connect to a port nobody listens on, from that same port, succeeds (TCP simultaneous open) and holds the
  // port: made here on purpose, as Linux's port choice made it for the broker probe of kafka:up.
  it("a connection whose two ends are one address and port is told apart from one to a listener", async () => {
    const self = await selfConnection();
    try {
      expect(isSelfConnection(self)).toBe(true);
      // Probed while the self-connection holds the port, so no other process can listen there meanwhile.
      expect(await tcpOpen("127.0.0.1", self.localPort!, 500)).toBe(false);
    } finally {
      self.destroy();
    }

    // A listener on a port of its own: the kernel's pick for port 0, held from the start.
    const server = createServer((s) => s.destroy());
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    const { port } = server.address() as AddressInfo;
    try {
      const real = await new Promise<Socket>((resolve, reject) => {
        const s = connect({ host: "127.0.0.1", port });
        s.once("connect", () => resolve(s));
        s.once("error", reject);
      });
      expect(isSelfConnection(real)).toBe(false);
      real.destroy();
      expect(await tcpOpen("127.0.0.1", port, 500)).toBe(true);
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
