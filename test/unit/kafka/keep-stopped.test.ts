// A consumer writ stopped stays stopped (src/kafka/keep-stopped.ts), in both windows where kafkajs would start it
// again. A real kafkajs consumer that cannot reach a broker: it crashes (retriably) and kafkajs schedules its restart.
import { createServer, type Server, type Socket } from "node:net";
import { Kafka, logLevel } from "kafkajs";
import { afterEach, describe, expect, it } from "vitest";
import { keepStopped } from "../../../src/kafka/keep-stopped.ts";
import { waitFor } from "../../helpers/wait-for.ts";

const RETRY_MS = 100;
let cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups.reverse()) await c();
  cleanups = [];
});

function consumerOn(brokers: string[], requestTimeout = 30_000) {
  const kafka = new Kafka({ clientId: "keep-stopped-test", brokers, logLevel: logLevel.NOTHING, requestTimeout, retry: { retries: 0, initialRetryTime: RETRY_MS } });
  const consumer = kafka.consumer({ groupId: "keep-stopped-test", retry: { retries: 0, initialRetryTime: RETRY_MS } });
  const crashes: { restart: boolean; afterStop: boolean }[] = [];
  const state = { stopped: false };
  consumer.on(consumer.events.CRASH, (e) => crashes.push({ restart: e.payload.restart, afterStop: state.stopped }));
  // Whatever a test leaves: kafkajs's own stop clears a pending restart timer.
  cleanups.push(() => consumer.disconnect().catch(() => undefined));
  return { consumer, crashes, state };
}

/** A TCP listener that accepts and never answers: a start connecting to it is under way until its request times out. */
async function silentBroker(): Promise<{ address: string; connections: () => number }> {
  let connections = 0;
  const sockets = new Set<Socket>();
  const server: Server = createServer((socket) => {
    connections++;
    sockets.add(socket);
    socket.on("close", () => sockets.delete(socket));
    socket.on("error", () => undefined);
  });
  await new Promise<void>((r) => server.listen(0, "127.0.0.1", r));
  cleanups.push(async () => {
    for (const s of sockets) s.destroy();
    await new Promise<void>((r) => server.close(() => r()));
  });
  const port = (server.address() as { port: number }).port;
  return { address: `127.0.0.1:${port}`, connections: () => connections };
}

/** No restart within 20 retry times: where each restart of a consumer that cannot connect would be one more of `count`. */
async function noMore(count: () => number, seen: number): Promise<void> {
  await expect(waitFor(() => count() > seen, { timeoutMs: 20 * RETRY_MS, intervalMs: 20 })).rejects.toThrow(/timed out/);
}

describe("keepStopped: a stop while the crash's own disconnect runs (shared, before kafkajs sets its restart timer)", () => {
  async function stoppedMidCrash(guarded: boolean) {
    const { consumer, crashes, state } = consumerOn(["127.0.0.1:9"]);
    const stopper = guarded ? keepStopped(consumer) : null;
    let stopping: Promise<void> | null = null;
    // STOP is emitted inside the crash's disconnect: the owner's stop lands there.
    consumer.on(consumer.events.STOP, () => {
      if (stopping) return;
      state.stopped = true;
      stopping = stopper ? stopper.disconnect() : consumer.disconnect();
    });
    await consumer.run({ eachMessage: async () => undefined }).catch(() => undefined);
    await waitFor(() => crashes.length > 0 && stopping !== null, { message: () => `crashes ${JSON.stringify(crashes)}` });
    await stopping;
    // That crash was to be restarted: kafkajs decided so after the owner's stop.
    expect(crashes[0]).toEqual({ restart: true, afterStop: true });
    return crashes;
  }

  it("no restart follows", async () => {
    const crashes = await stoppedMidCrash(true);
    await noMore(() => crashes.length, 1);
  });

  it("control: kafkajs's disconnect() alone, and the stopped consumer starts again", async () => {
    const crashes = await stoppedMidCrash(false);
    await waitFor(() => crashes.length > 1, { timeoutMs: 20 * RETRY_MS, intervalMs: 20, message: "no restart after the stop" });
  });
});

describe("keepStopped: a stop once kafkajs's restart has begun (its start connecting, not running yet)", () => {
  async function stoppedMidRestart(guarded: boolean) {
    const broker = await silentBroker();
    // Each start waits on the silent broker for its request's timeout, then crashes, retriably.
    const { consumer, crashes, state } = consumerOn([broker.address], 1_000);
    const stopper = guarded ? keepStopped(consumer, { settleMs: 30_000 }) : null;
    await consumer.run({ eachMessage: async () => undefined }).catch(() => undefined);
    await waitFor(() => crashes.length > 0, { message: "no first crash" });
    // The restart's start has connected: it is under way, and a stop cannot end it.
    await waitFor(() => broker.connections() > 1, { message: "no restart connected" });
    state.stopped = true;
    await (stopper ? stopper.disconnect() : consumer.disconnect());
    return { broker, seen: broker.connections() };
  }

  it("the stop waits for that start to end and nothing starts after it", async () => {
    const { broker, seen } = await stoppedMidRestart(true);
    await noMore(broker.connections, seen);
  });

  it("control: kafkajs's disconnect() alone returns at once, and the start it left goes on restarting", async () => {
    const { broker, seen } = await stoppedMidRestart(false);
    await waitFor(() => broker.connections() > seen, { timeoutMs: 10_000, intervalMs: 20, message: "nothing connected after the stop" });
  });
});
