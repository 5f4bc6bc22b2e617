import { EventEmitter } from "node:events";
import type { Consumer } from "kafkajs";
import { afterEach, describe, expect, it, vi } from "vitest";
import { memberLease, whenConfirmed } from "../../../src/owner/member-lease.ts";

const events = { REQUEST: "consumer.network.request", HEARTBEAT: "consumer.heartbeat", GROUP_JOIN: "consumer.group_join" } as const;

/** A consumer that emits what kafkajs's does, in its order: a request's network event, then (if it succeeded) HEARTBEAT or GROUP_JOIN. */
function fakeConsumer() {
  const emitter = new EventEmitter();
  const consumer = {
    events,
    on: (name: string, listener: (event: unknown) => void) => {
      emitter.on(name, listener);
      return () => emitter.off(name, listener);
    },
  } as unknown as Pick<Consumer, "on" | "events">;
  const answered = (apiName: "Heartbeat" | "SyncGroup", sentAt: number, ok = true) => {
    emitter.emit(events.REQUEST, { payload: { apiName, sentAt } });
    if (ok) emitter.emit(apiName === "Heartbeat" ? events.HEARTBEAT : events.GROUP_JOIN, { payload: {} });
  };
  return { consumer, answered, fetched: (sentAt: number) => emitter.emit(events.REQUEST, { payload: { apiName: "Fetch", sentAt } }) };
}

const SESSION = 10_000;

describe("member lease", () => {
  it("stands for half the session timeout from the send time of the last answered heartbeat or join", () => {
    let now = 1_000_000;
    const { consumer, answered, fetched } = fakeConsumer();
    const lease = memberLease(consumer, SESSION, () => now);
    expect(lease.confirmed()).toBe(false);
    answered("SyncGroup", now - 10);
    expect(lease.confirmed()).toBe(true);
    now += 4_000;
    answered("Heartbeat", now - 5);
    now += 4_900;
    expect(lease.confirmed()).toBe(true);
    // Other requests renew nothing; a heartbeat answered with an error renews nothing.
    fetched(now);
    answered("Heartbeat", now, false);
    now += 200;
    expect(lease.confirmed()).toBe(false);
  });

  it("an answer read after a pause does not renew it: the zombie's case", () => {
    let now = 1_000_000;
    const { consumer, answered } = fakeConsumer();
    const lease = memberLease(consumer, SESSION, () => now);
    answered("Heartbeat", now);
    // A heartbeat leaves; the process stops before reading its answer and wakes past the session timeout.
    const sentBeforeThePause = now + 1_000;
    now += 1_000 + SESSION + 6_000;
    answered("Heartbeat", sentBeforeThePause);
    // Dated from the answer (the code before this test), the same events confirmed it and the zombie wrote.
    expect(lease.confirmed()).toBe(false);
    // A heartbeat sent after waking and answered renews it.
    answered("Heartbeat", now + 10);
    now += 20;
    expect(lease.confirmed()).toBe(true);
  });
});

describe("taking a fenced partition up again (whenConfirmed)", () => {
  afterEach(() => void vi.useRealTimers());

  it("waits while the coordinator has not answered this member lately: its InitProducerId would fence the group's owner", async () => {
    vi.useFakeTimers();
    let confirmed = false;
    let wanted = true;
    const act = vi.fn();
    whenConfirmed({ confirmed: () => confirmed }, 5_000, () => wanted, act);
    await vi.advanceTimersByTimeAsync(5_000 * 4);
    expect(act).not.toHaveBeenCalled();
    confirmed = true;
    await vi.advanceTimersByTimeAsync(5_000);
    expect(act).toHaveBeenCalledTimes(1);
    await vi.advanceTimersByTimeAsync(5_000 * 4);
    expect(act).toHaveBeenCalledTimes(1);

    // Not wanted any more (the member rejoined and the partition went elsewhere, or it stopped): it gives up.
    const later = vi.fn();
    confirmed = false;
    whenConfirmed({ confirmed: () => confirmed }, 5_000, () => wanted, later);
    await vi.advanceTimersByTimeAsync(5_000);
    wanted = false;
    confirmed = true;
    await vi.advanceTimersByTimeAsync(5_000 * 4);
    expect(later).not.toHaveBeenCalled();
    expect(vi.getTimerCount()).toBe(0);
  });
});
