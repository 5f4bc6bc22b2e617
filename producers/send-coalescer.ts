import type { Message } from "kafkajs";
import { WritError } from "../src/errors.ts";

/**
 * How a send ended for its caller: `sent`, its request was acknowledged; `unconfirmed`, its deadline
 * passed while its request was in flight, so its messages may or may not have been written.
 */
export type SendOutcome = "sent" | "unconfirmed";

interface Entry {
  messages: Message[];
  bytes: number;
  state: "queued" | "in_flight" | "settled";
  timer: NodeJS.Timeout | undefined;
  resolve: (outcome: SendOutcome) => void;
  reject: (err: unknown) => void;
}

/**
 * Sends of one producer, coalesced: while a produce request is in flight,
 * later sends queue, and the next request carries all of them (up to
 * `maxBytes`). The idempotent producer allows one request in flight, so
 * without this, concurrent submits wait in line one request each; with it,
 * they share requests as load grows and a lone submit still goes at once (no
 * linger). Each caller's promise settles with the request that carried its
 * messages, or at its deadline: a send still queued then is dropped and
 * rejected with a retriable `not_sent` (nothing of it was produced); one in
 * flight resolves `unconfirmed`. A send is never split to share a request,
 * but one larger than `maxBytes` by itself goes in several, in order, and
 * settles with the last (rejected with the first that fails, its earlier
 * requests written).
 */
export class SendCoalescer {
  private readonly queue: Entry[] = [];
  private draining = false;

  private readonly produce: (messages: Message[]) => Promise<unknown>;
  private readonly maxBytes: number;

  constructor(produce: (messages: Message[]) => Promise<unknown>, maxBytes: number) {
    this.produce = produce;
    this.maxBytes = maxBytes;
  }

  /** Sends `messages` in the next request; `deadline` (epoch ms) bounds how long the caller waits for it. */
  send(messages: Message[], deadline = Infinity): Promise<SendOutcome> {
    return new Promise<SendOutcome>((resolve, reject) => {
      const entry: Entry = { messages, bytes: messages.reduce((n, m) => n + approximateBytes(m), 0), state: "queued", timer: undefined, resolve, reject };
      if (Number.isFinite(deadline)) entry.timer = setTimeout(() => this.expire(entry), Math.max(0, deadline - Date.now()));
      this.queue.push(entry);
      if (!this.draining) void this.drain();
    });
  }

  /** The entry's deadline passed: dropped if still queued (never sent), `unconfirmed` if its request is in flight. */
  private expire(entry: Entry): void {
    if (entry.state === "queued") {
      this.queue.splice(this.queue.indexOf(entry), 1);
      this.settle(entry, () =>
        entry.reject(new WritError("not_sent", "the deadline passed while the send waited behind earlier produce requests; nothing of it was sent: submit again", { retriable: true })),
      );
    } else if (entry.state === "in_flight") {
      this.settle(entry, () => entry.resolve("unconfirmed"));
    }
  }

  private settle(entry: Entry, how: () => void): void {
    if (entry.state === "settled") return;
    entry.state = "settled";
    clearTimeout(entry.timer);
    how();
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
        for (const e of batch) e.state = "in_flight";
        try {
          // Only a lone send larger than maxBytes (a submitAll of large intents) has more than one chunk: in one
          // request the brokers would refuse it whole (MESSAGE_TOO_LARGE, their 1 MB per partition batch), every
          // time, though each intent is within bounds. Its chunks go in order; it settles with the last one.
          for (const chunk of chunks(batch.flatMap((e) => e.messages), this.maxBytes)) await this.produce(chunk);
          for (const e of batch) this.settle(e, () => e.resolve("sent"));
        } catch (err) {
          for (const e of batch) this.settle(e, () => e.reject(err));
        }
      }
    } finally {
      this.draining = false;
    }
  }
}

/** `messages` in order, in runs of at most `maxBytes` (a message larger than that alone). */
function chunks(messages: Message[], maxBytes: number): Message[][] {
  const out: Message[][] = [];
  let bytes = 0;
  for (const m of messages) {
    const size = approximateBytes(m);
    if (out.length === 0 || bytes + size > maxBytes) {
      out.push([]);
      bytes = 0;
    }
    out.at(-1)!.push(m);
    bytes += size;
  }
  return out;
}

function approximateBytes(m: Message): number {
  const size = (v: unknown): number => (v === null || v === undefined ? 0 : typeof v === "string" ? Buffer.byteLength(v) : Buffer.isBuffer(v) ? v.length : 0);
  let n = 64 + size(m.key) + size(m.value);
  for (const [k, v] of Object.entries(m.headers ?? {})) for (const x of Array.isArray(v) ? v : [v]) n += Buffer.byteLength(k) + size(x) + 8;
  return n;
}
