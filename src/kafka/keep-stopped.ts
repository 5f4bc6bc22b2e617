// A consumer stopped by its owner stays stopped, whatever kafkajs's crash handling does meanwhile.
import type { Consumer } from "kafkajs";

/**
 * Keeps `consumer` stopped once its owner has stopped it (`stopped()` true from the moment its stop begins).
 * kafkajs restarts a consumer after a retriable crash on a timer it sets once the crash's own disconnect is done,
 * right after emitting CRASH (kafkajs src/consumer/index.js, onCrash). A disconnect() called while that crash is
 * disconnecting shares its stop and clears no timer (none is set yet): the consumer starts again after its owner
 * stopped it, retries until Kafka answers, and joins its group again (a stopped owner's group back on the cluster
 * after a cleanup deleted it; a stopped router's member rejoining). Such a crash's restart is stopped here, once
 * the timer is set: the next turn of the event loop, well before the timer's retry time (300 ms or more) is up.
 */
export function keepStopped(consumer: Pick<Consumer, "on" | "events" | "disconnect">, stopped: () => boolean): void {
  const stopAgain = () => setImmediate(() => void consumer.disconnect().catch(() => undefined));
  consumer.on(consumer.events.CRASH, (event) => {
    if (event.payload.restart && stopped()) stopAgain();
  });
  // A restart whose timer had fired when the stop came, still connecting (no runner yet for the stop to end), goes
  // on to join the group: it leaves it again.
  consumer.on(consumer.events.GROUP_JOIN, () => {
    if (stopped()) stopAgain();
  });
}
