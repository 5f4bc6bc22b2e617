// A consumer writ stops stays stopped, whatever kafkajs's crash handling does meanwhile.
import type { Consumer } from "kafkajs";

/** How long a stop waits for a start kafkajs has under way to join or crash before it disconnects anyway. */
export const RESTART_SETTLE_MS = 10_000;

/** The smallest `initialRetryTime` of writ's Kafka clients (the router's: 200 ms; kafkajs's default: 300 ms). */
const MIN_RETRY_MS = 200;

export interface ConsumerStop {
  /** Disconnects the consumer for good (see {@link keepStopped}). Never rejects. */
  disconnect(): Promise<void>;
}

/**
 * The way to stop `consumer` for good. kafkajs restarts a consumer after a retriable crash: once the crash's own
 * disconnect is done it emits CRASH and sets a timer, which starts the consumer again. Two windows let a stopped
 * consumer come back, join its group again once Kafka answers (a deleted group recreated) and consume:
 * - a disconnect() while the crash is disconnecting shares that stop and clears no timer (none is set yet): the
 *   consumer is disconnected again once the timer is set (the next turn of the event loop after CRASH);
 * - a disconnect() once the timer has fired, while the new start connects or joins: its runner is not running yet,
 *   so the stop ends nothing and forgets it, and it goes on to join. The stop waits for that start to join (then
 *   the stop leaves the group as usual) or crash, up to `settleMs`; should it still be connecting then (Kafka
 *   unreachable the whole time), it disconnects anyway and says so with `onUnsettled`.
 * A stop before the timer fires clears it (kafkajs's own stop does). The consumer's listeners are added here: make
 * it before the consumer runs.
 */
export function keepStopped(consumer: Pick<Consumer, "on" | "events" | "disconnect">, opts: { settleMs?: number; onUnsettled?: () => void } = {}): ConsumerStop {
  let stopped = false;
  // When kafkajs's restart timer fires, while a restart is scheduled or under way; null once it joined or crashed.
  let restartAt: number | null = null;
  let settled: (() => void) | null = null;
  const settle = () => {
    restartAt = null;
    settled?.();
    settled = null;
  };
  const disconnectAgain = () => setImmediate(() => void consumer.disconnect().catch(() => undefined));
  consumer.on(consumer.events.CRASH, (event) => {
    settle();
    if (!event.payload.restart) return;
    if (stopped) disconnectAgain();
    else {
      // kafkajs waits the error's retryTime, else the client's initialRetryTime: never less than the smaller of the two.
      const retryTime = (event.payload.error as { retryTime?: unknown }).retryTime;
      const wait = typeof retryTime === "number" && retryTime > 0 ? Math.min(retryTime, MIN_RETRY_MS) : MIN_RETRY_MS;
      restartAt = Date.now() + wait;
    }
  });
  consumer.on(consumer.events.GROUP_JOIN, settle);
  return {
    async disconnect() {
      stopped = true;
      // Well before the timer fires, the stop clears it; from shortly before, a start may be under way: waited for.
      if (restartAt !== null && Date.now() >= restartAt - 50) {
        const joinedOrCrashed = await new Promise<boolean>((resolve) => {
          const timer = setTimeout(() => resolve(false), opts.settleMs ?? RESTART_SETTLE_MS);
          settled = () => {
            clearTimeout(timer);
            resolve(true);
          };
        });
        if (!joinedOrCrashed) opts.onUnsettled?.();
        // Joined: its runner runs once join() has returned, a few microtasks on; the stop then ends it.
        await new Promise((r) => setImmediate(r));
      }
      await consumer.disconnect().catch(() => undefined);
    },
  };
}
