import type { Admin } from "kafkajs";
import { WritError } from "../errors.ts";

/**
 * One kafkajs admin, its calls one at a time.
 *
 * Every partition owner of a router opens through the same admin, and a
 * rebalance opens a dozen at once. kafkajs 2.2.4's admin is not safe for that:
 * each call sets the cluster's target topics and refreshes metadata, and
 * concurrent calls see each other's half-refreshed metadata. Seen on a real
 * broker: `fetchTopicOffsets` throwing "Cannot destructure property
 * 'partitions' of 'low.pop(...)'", and `fetchOffsets` answering without the
 * partition asked for, which read as "no committed offset" made a restarted
 * owner replay its intents partition from the start. Admin calls are rare
 * (opens, heals, lag), so a queue costs nothing that matters.
 */
export function serialAdmin(admin: Admin): Admin {
  let tail: Promise<unknown> = Promise.resolve();
  return new Proxy(admin, {
    get(target, prop, receiver) {
      const value = Reflect.get(target, prop, receiver);
      if (typeof value !== "function") return value;
      // Listeners, the logger and the connection pass straight through; only requests queue.
      if (prop === "on" || prop === "logger" || prop === "connect" || prop === "disconnect") return value.bind(target);
      return (...args: unknown[]) => {
        // `tail` never rejects: a failed request is its caller's, not the next one's.
        const run = tail.then(() => value.apply(target, args));
        tail = run.catch(() => undefined);
        return run;
      };
    },
  });
}

/**
 * Where intake resumes on `partition` of `topic`: the group's committed
 * offset, or the partition's first offset when the group has none. An answer
 * that lacks the partition is an error (retriable), never "no commit": a
 * guess of "from the start" replays every intent still retained.
 */
export async function startOffset(admin: Admin, groupId: string, topic: string, partition: number): Promise<bigint> {
  const committed = await admin.fetchOffsets({ groupId, topics: [topic] });
  const entry = committed.find((t) => t.topic === topic)?.partitions.find((p) => p.partition === partition);
  if (entry === undefined) throw incomplete(`the committed offsets of group ${groupId}`, topic, partition);
  const offset = BigInt(entry.offset);
  if (offset >= 0n) return offset;
  const bounds = await admin.fetchTopicOffsets(topic);
  const low = bounds.find((b) => b.partition === partition)?.low;
  if (low === undefined) throw incomplete("the partition bounds", topic, partition);
  return BigInt(low);
}

function incomplete(what: string, topic: string, partition: number): WritError {
  return new WritError("kafka_failed", `${what} came back without ${topic}-${partition}`, { retriable: true, context: { topic, partition } });
}
