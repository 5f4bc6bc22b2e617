// A TCP relay in front of a Kafka broker that a test can cut: a broker outage for the clients behind it, while the
// shared broker itself runs on. Kafka clients connect to the addresses Metadata answers give, not to the bootstrap
// address, so the relay rewrites the brokers in each Metadata response (kafkajs's v0 to v6) to its own address: a
// single-broker cluster only, and Metadata before v9 (it throws otherwise, rather than corrupt the answer).
// Coordinators (FindCoordinator) are found by node id among those brokers, so they go through the relay too.
import { connect, createServer, type Socket } from "node:net";
import type { AddressInfo } from "node:net";

const METADATA = 3;

export interface KafkaRelay {
  /** `127.0.0.1:<port>`: give it as the only broker. */
  readonly broker: string;
  /**
   * From now on every connection is dropped, open ones at once: the broker is gone for the clients behind the relay.
   * `spare`: new connections of the clients whose id (the client id of their first request) it accepts are
   * relayed all the same, as for a client that asks only after the broker is back.
   */
  cut(opts?: { spare?: (clientId: string) => boolean }): void;
  /** Connections are relayed again: the broker is back. */
  restore(): void;
  /** Connections dropped since the cut. */
  refused(): number;
  /** Connections relayed so far (a client's new connection to the broker shows here). */
  relayed(): number;
  /** The first Metadata answer the relay could not rewrite (more than one broker, a flexible version), if any. */
  error(): Error | null;
  close(): Promise<void>;
}

/** Splits a stream of Kafka frames (int32 size, then the frame): `each` gets every whole frame, size included. */
function frames(each: (frame: Buffer) => void): (chunk: Buffer) => void {
  let pending = Buffer.alloc(0);
  return (chunk) => {
    pending = Buffer.concat([pending, chunk]);
    while (pending.length >= 4 && pending.length >= 4 + pending.readInt32BE(0)) {
      const size = pending.readInt32BE(0);
      each(pending.subarray(0, 4 + size));
      pending = pending.subarray(4 + size);
    }
  };
}

/**
 * A Metadata response with every broker at `host:port`. Frame: size, correlation id, [throttle v3+], brokers, rest.
 * Only for what this relay can serve, else it throws: a single-broker cluster (one relay stands for one broker),
 * and Metadata before v9 (v9+ is flexible: compact strings and tagged fields this parser would corrupt).
 */
export function rewriteMetadata(frame: Buffer, version: number, host: string, port: number): Buffer {
  if (version >= 9) throw new Error(`kafka-relay: Metadata v${version} is flexible (v9+), which the relay cannot rewrite; it serves kafkajs's v0 to v6`);
  let at = 8 + (version >= 3 ? 4 : 0);
  const head = frame.subarray(4, at);
  const count = frame.readInt32BE(at);
  at += 4;
  const brokers: Buffer[] = [];
  const upstream = new Set<string>();
  for (let i = 0; i < count; i++) {
    const nodeId = frame.readInt32BE(at);
    at += 4;
    const hostLength = frame.readInt16BE(at);
    const upstreamHost = frame.toString("utf8", at + 2, at + 2 + hostLength);
    at += 2 + hostLength;
    upstream.add(`${upstreamHost}:${frame.readInt32BE(at)}`);
    at += 4;
    const rackStart = at;
    if (version >= 1) {
      const rack = frame.readInt16BE(at);
      at += 2 + Math.max(0, rack);
    }
    const hostBytes = Buffer.from(host);
    const b = Buffer.alloc(4 + 2 + hostBytes.length + 4);
    b.writeInt32BE(nodeId, 0);
    b.writeInt16BE(hostBytes.length, 4);
    hostBytes.copy(b, 6);
    b.writeInt32BE(port, 6 + hostBytes.length);
    brokers.push(b, frame.subarray(rackStart, at));
  }
  // Every broker would be mapped to this one relay: a client would send a partition's requests to the wrong broker.
  if (upstream.size > 1) throw new Error(`kafka-relay: the cluster has ${upstream.size} brokers (${[...upstream].join(", ")}); the relay stands for one broker only`);
  const countBytes = Buffer.alloc(4);
  countBytes.writeInt32BE(count, 0);
  const body = Buffer.concat([head, countBytes, ...brokers, frame.subarray(at)]);
  const size = Buffer.alloc(4);
  size.writeInt32BE(body.length, 0);
  return Buffer.concat([size, body]);
}

/** The client id in a request's header (api key, version, correlation id, client id), or null where there is none. */
function clientIdOf(frame: Buffer): string | null {
  if (frame.length < 14) return null;
  const length = frame.readInt16BE(12);
  return length < 0 || frame.length < 14 + length ? null : frame.toString("utf8", 14, 14 + length);
}

/** Starts a relay to `target` (`host:port`) on an ephemeral port of 127.0.0.1. */
export async function startKafkaRelay(target: string): Promise<KafkaRelay> {
  const [targetHost, targetPort] = [target.slice(0, target.lastIndexOf(":")), Number(target.slice(target.lastIndexOf(":") + 1))];
  let down = false;
  let spare: ((clientId: string) => boolean) | undefined;
  let refused = 0;
  let relayed = 0;
  let failure: Error | null = null;
  let port = 0;
  const open = new Set<Socket>();
  const refuse = (inbound: Socket) => {
    refused++;
    inbound.destroy();
  };
  const server = createServer((inbound) => {
    open.add(inbound);
    inbound.on("close", () => open.delete(inbound));
    inbound.on("error", () => undefined);
    if (!down) {
      relay(inbound);
      return;
    }
    if (spare === undefined) return refuse(inbound);
    // Its first request says who it is: relayed, that request first, if spared; else dropped.
    const spared = spare;
    let forward: ((frame: Buffer) => void) | null = null;
    let refusedHere = false;
    inbound.on(
      "data",
      frames((frame) => {
        if (forward) return forward(frame);
        if (refusedHere) return;
        const id = clientIdOf(frame);
        if (id === null || !spared(id)) {
          refusedHere = true;
          return refuse(inbound);
        }
        forward = relay(inbound, false);
        forward(frame);
      }),
    );
  });
  /** Relays `inbound` to the broker: each request frame goes through what it returns (read here unless `read` is false). */
  function relay(inbound: Socket, read = true): (frame: Buffer) => void {
    relayed++;
    const outbound = connect(targetPort, targetHost);
    open.add(outbound);
    outbound.on("close", () => open.delete(outbound));
    outbound.on("error", () => inbound.destroy());
    inbound.on("close", () => outbound.destroy());
    outbound.on("close", () => inbound.destroy());
    // Correlation id → version of each Metadata request in flight on this connection.
    const metadata = new Map<number, number>();
    const request = (frame: Buffer) => {
      if (frame.length >= 12 && frame.readInt16BE(4) === METADATA) metadata.set(frame.readInt32BE(8), frame.readInt16BE(6));
      outbound.write(frame);
    };
    if (read) inbound.on("data", frames(request));
    outbound.on(
      "data",
      frames((frame) => {
        const version = frame.length >= 8 ? metadata.get(frame.readInt32BE(4)) : undefined;
        if (version === undefined) return void inbound.write(frame);
        metadata.delete(frame.readInt32BE(4));
        // Thrown in a socket handler it would be an uncaught error in the worker and a client left hanging:
        // kept for the test (error()) and the connection closed instead.
        try {
          inbound.write(rewriteMetadata(frame, version, "127.0.0.1", port));
        } catch (err) {
          failure ??= err as Error;
          inbound.destroy();
        }
      }),
    );
    return request;
  }
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  port = (server.address() as AddressInfo).port;
  return {
    broker: `127.0.0.1:${port}`,
    cut: (opts = {}) => {
      down = true;
      spare = opts.spare;
      for (const s of open) s.destroy();
    },
    restore: () => {
      down = false;
    },
    refused: () => refused,
    relayed: () => relayed,
    error: () => failure,
    close: () => {
      for (const s of open) s.destroy();
      return new Promise<void>((resolve) => server.close(() => resolve()));
    },
  };
}
