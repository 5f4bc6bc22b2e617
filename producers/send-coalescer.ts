import type { Message } from "kafkajs";

/**
 * Sends of one producer, coalesced: while a produce request is in flight,
 * later sends queue, and the next request carries all of them (up to
 * `maxBytes`). The idempotent producer allows one request in flight, so
 * without this, concurrent submits wait in line one request each; with it,
 * they share requests as load grows and a lone submit still goes at once (no
 * linger). Each caller's promise settles with the request that carried its
 * messages.
 */
export class SendCoalescer {
  private readonly queue: { messages: Message[]; bytes: number; resolve: () => void; reject: (err: unknown) => void }[] = [];
  private draining = false;

  private readonly produce: (messages: Message[]) => Promise<unknown>;
  private readonly maxBytes: number;

  constructor(produce: (messages: Message[]) => Promise<unknown>, maxBytes: number) {
    this.produce = produce;
    this.maxBytes = maxBytes;
  }

  send(messages: Message[]): Promise<void> {
    return new Promise<void>((resolve, reject) => {
      this.queue.push({ messages, bytes: messages.reduce((n, m) => n + approximateBytes(m), 0), resolve, reject });
      if (!this.draining) void this.drain();
    });
  }

  private async drain(): Promise<void> {
    this.draining = true;
    try {
      while (this.queue.length > 0) {
        const batch = [this.queue.shift()!];
        let bytes = batch[0]!.bytes;
        while (this.queue.length > 0 && bytes + this.queue[0]!.bytes <= this.maxBytes) {
          const next = this.queue.shift()!;
          bytes += next.bytes;
          batch.push(next);
        }
        try {
          await this.produce(batch.flatMap((e) => e.messages));
          for (const e of batch) e.resolve();
        } catch (err) {
          for (const e of batch) e.reject(err);
        }
      }
    } finally {
      this.draining = false;
    }
  }
}

function approximateBytes(m: Message): number {
  const size = (v: unknown): number => (v === null || v === undefined ? 0 : typeof v === "string" ? Buffer.byteLength(v) : Buffer.isBuffer(v) ? v.length : 0);
  let n = 64 + size(m.key) + size(m.value);
  for (const [k, v] of Object.entries(m.headers ?? {})) for (const x of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(k) + size(x) + 8;
  return n;
}
