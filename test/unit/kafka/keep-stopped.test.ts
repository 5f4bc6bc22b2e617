// A consumer its owner stopped while kafkajs was handling a crash stays stopped (src/kafka/keep-stopped.ts). A real
// kafkajs consumer, on an address nothing listens on: it crashes (retriably) and kafkajs schedules its restart.
import { Kafka, logLevel } from "kafkajs";
import { afterEach, describe, expect, it } from "vitest";
import { keepStopped } from "../../../src/kafka/keep-stopped.ts";
import { waitFor } from "../../helpers/wait-for.ts";

const RETRY_MS = 100;
let cleanups: (() => Promise<void>)[] = [];

afterEach(async () => {
  for (const c of cleanups) await c();
  cleanups = [];
});

/**
 * A consumer whose owner stops it at the worst moment: while the crash's own disconnect runs (its STOP event), the
 * owner's disconnect() shares it, before kafkajs sets the restart timer. `guarded`: with keepStopped.
 */
async function stoppedMidCrash(guarded: boolean) {
  const kafka = new Kafka({ clientId: "keep-stopped-test", brokers: ["127.0.0.1:9"], logLevel: logLevel.NOTHING, retry: { retries: 0, initialRetryTime: RETRY_MS } });
  const consumer = kafka.consumer({ groupId: "keep-stopped-test", retry: { retries: 0, initialRetryTime: RETRY_MS } });
  let stopped = false;
  let stopping: Promise<void> | null = null;
  const crashes: { restart: boolean; afterStop: boolean }[] = [];
  if (guarded) keepStopped(consumer, () => stopped);
  consumer.on(consumer.events.STOP, () => {
    if (stopping) return;
    stopped = true;
    stopping = consumer.disconnect();
  });
  consumer.on(consumer.events.CRASH, (e) => crashes.push({ restart: e.payload.restart, afterStop: stopped }));
  cleanups.push(async () => {
    stopped = true;
    await consumer.disconnect().catch(() => undefined);
  });
  // run() starts the consumer, which cannot reach the broker: its first crash.
  await consumer.run({ eachMessage: async () => undefined }).catch(() => undefined);
  await waitFor(() => crashes.length > 0 && stopping !== null, { message: () => `crashes ${JSON.stringify(crashes)}` });
  await stopping;
  return crashes;
}

describe("keepStopped", () => {
  it("stops the restart kafkajs schedules for a crash whose disconnect the owner's stop shared", async () => {
    const crashes = await stoppedMidCrash(true);
    // That crash was to be restarted (kafkajs's decision, made after the owner stopped it).
    expect(crashes[0]).toEqual({ restart: true, afterStop: true });
    // No restart happens: no further crash, where each restart of a consumer that cannot connect would be one.
    await expect(waitFor(() => crashes.length > 1, { timeoutMs: 20 * RETRY_MS, intervalMs: 20 })).rejects.toThrow(/timed out/);
  });

  it("control: without it the stopped consumer starts again (and would join its group once Kafka answers)", async () => {
    const crashes = await stoppedMidCrash(false);
    expect(crashes[0]).toEqual({ restart: true, afterStop: true });
    await waitFor(() => crashes.length > 1, { timeoutMs: 20 * RETRY_MS, intervalMs: 20, message: "no restart after the stop" });
  });
});
