// The console's open event streams (server.ts, GET /events): the frames go to each, and a page that does not
// read is dropped before it holds the console's memory.
import type { ServerResponse } from "node:http";

/** How far behind (bytes written, not read yet) a page may fall on the updates before it is dropped. */
export const STREAM_BEHIND_BYTES = 8 << 20;

/** What the streams need of a response (a test gives a stand-in). */
export interface StreamSink {
  readonly writableLength: number;
  write(text: string): unknown;
  destroy(): unknown;
}

/**
 * A page that does not read is dropped once 8 MiB of updates wait for it: its browser reconnects and starts from a
 * snapshot. The snapshot does not count. It is written whole on connect and may alone be past 8 MiB (500
 * escalations of escaped text made one of 20.8 MiB): counted, every page would be dropped at its first update and
 * reconnect for ever. Bounding the snapshot instead would hide escalations from the operator. What of the snapshot
 * still waits is at most the least that waited at any send since (it went first, and only drains), so the
 * allowance follows the page down as it reads, to the 8 MiB alone. A slow page holds what it held before: its
 * snapshot, and 8 MiB.
 */
export class EventStreams<S extends StreamSink = ServerResponse> {
  /** Each stream → at most what of its snapshot still waits. */
  private readonly streams = new Map<S, number>();

  get size(): number {
    return this.streams.size;
  }

  /** A stream whose opening frames (the snapshot among them) were just written. */
  add(res: S): void {
    this.streams.set(res, res.writableLength);
  }

  delete(res: S): void {
    this.streams.delete(res);
  }

  /** `text` to every stream; one that fell too far behind is dropped instead. */
  send(text: string): void {
    for (const [res, snapshotLeft] of this.streams) {
      const waiting = res.writableLength;
      const left = Math.min(snapshotLeft, waiting);
      if (waiting > left + STREAM_BEHIND_BYTES) {
        res.destroy();
        this.streams.delete(res);
        continue;
      }
      this.streams.set(res, left);
      res.write(text);
    }
  }

  /** A comment to every stream (keeps proxies from closing an idle one). */
  comment(text: string): void {
    for (const res of this.streams.keys()) res.write(`: ${text}\n\n`);
  }

  /**
   * Closes every stream (their pages reconnect and start from a snapshot). Destroyed, not ended: an ended response
   * keeps what its page has not read until it does, which may be never, and would no longer count against the
   * streams allowed (the server's maxStreams) once out of the set.
   */
  endAll(): void {
    for (const res of this.streams.keys()) res.destroy();
    this.streams.clear();
  }
}
