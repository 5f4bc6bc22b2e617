import type { Consumer, Kafka } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import { WritError } from "../errors.ts";
import type { Logger } from "../logger.ts";
import { PartitionLedger } from "./ledger-state.ts";

/** Key of the marker a new owner writes to ledger partition p. */
export function markerKey(partition: number): string {
  return `__marker__:${partition}`;
}

/**
 * Reads `writ.ledger` (read_committed) into per-partition views. A new owner
 * of partition p fences the old one, writes a marker to ledger partition p in
 * a transaction, and waits here until the marker is read: every entry before
 * it has then been applied. The marker avoids reasoning about control records
 * and last-stable offsets.
 */
export class LedgerReader {
  private readonly partitions = new Map<number, PartitionLedger>();
  private readonly seenMarkers = new Map<number, string>();
  private readonly waiters = new Map<number, { nonce: string; resolve: () => void }[]>();
  private consumer: Consumer | null = null;
  private readonly kafka: Kafka;
  private readonly topic: string;
  private readonly codec: WireCodec;
  private readonly log: Logger;
  private readonly groupId: string;

  constructor(opts: { kafka: Kafka; topic: string; codec: WireCodec; log: Logger; groupId: string }) {
    this.kafka = opts.kafka;
    this.topic = opts.topic;
    this.codec = opts.codec;
    this.log = opts.log.child({ component: "ledger-reader", topic: opts.topic });
    this.groupId = opts.groupId;
  }

  partition(p: number): PartitionLedger {
    let ledger = this.partitions.get(p);
    if (!ledger) {
      ledger = new PartitionLedger(p);
      this.partitions.set(p, ledger);
    }
    return ledger;
  }

  async start(): Promise<void> {
    // A group of its own with no committed offsets: every process reads the whole ledger.
    const consumer = this.kafka.consumer({
      groupId: this.groupId,
      readUncommitted: false,
      allowAutoTopicCreation: false,
      // Markers must be seen promptly; an idle long poll also delays shutdown.
      maxWaitTimeInMs: 500,
    });
    this.consumer = consumer;
    await consumer.connect();
    await consumer.subscribe({ topic: this.topic, fromBeginning: true });
    await consumer.run({
      autoCommit: false,
      eachBatch: async ({ batch, resolveOffset, heartbeat }) => {
        const ledger = this.partition(batch.partition);
        for (const message of batch.messages) {
          const key = message.key?.toString("utf8") ?? "";
          if (message.value === null) {
            ledger.applyRead(key, null);
          } else {
            const decoded = await this.codec.decode("LedgerEntry", message.value);
            if (!decoded.ok) {
              this.log.error({ partition: batch.partition, offset: message.offset, reason: decoded.message }, "skipping unreadable ledger entry");
            } else if (decoded.value.kind === "marker") {
              this.markerSeen(decoded.value.partition, decoded.value.nonce);
            } else {
              ledger.applyRead(key, decoded.value);
            }
          }
          resolveOffset(message.offset);
        }
        await heartbeat();
      },
    });
  }

  private markerSeen(partition: number, nonce: string): void {
    this.seenMarkers.set(partition, nonce);
    const list = this.waiters.get(partition) ?? [];
    const remaining = list.filter((w) => {
      if (w.nonce !== nonce) return true;
      w.resolve();
      return false;
    });
    this.waiters.set(partition, remaining);
  }

  /** Resolves once the marker `nonce` of `partition` has been read. */
  waitForMarker(partition: number, nonce: string, timeoutMs: number, signal?: AbortSignal): Promise<void> {
    if (this.seenMarkers.get(partition) === nonce) return Promise.resolve();
    return new Promise((resolve, reject) => {
      const timer = setTimeout(() => {
        done();
        reject(
          new WritError("ledger_restore_timeout", `ledger partition ${partition} not restored within ${timeoutMs} ms`, {
            retriable: true,
            context: { topic: this.topic, partition },
          }),
        );
      }, timeoutMs);
      const waiter = {
        nonce,
        resolve: () => {
          clearTimeout(timer);
          resolve();
        },
      };
      const done = () => {
        clearTimeout(timer);
        this.waiters.set(partition, (this.waiters.get(partition) ?? []).filter((w) => w !== waiter));
      };
      signal?.addEventListener("abort", () => {
        done();
        reject(signal.reason);
      });
      const list = this.waiters.get(partition) ?? [];
      list.push(waiter);
      this.waiters.set(partition, list);
    });
  }

  async stop(): Promise<void> {
    await this.consumer?.disconnect();
    this.consumer = null;
  }
}
