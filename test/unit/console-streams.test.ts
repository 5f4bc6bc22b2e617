// The console's event streams (src/console/streams.ts): a page that does not read is dropped once 8 MiB of
// updates wait for it; its snapshot, however large, does not count.
import { createServer, request, type IncomingMessage, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it, onTestFinished } from "vitest";
import { EventStreams, STREAM_BEHIND_BYTES } from "../../src/console/streams.ts";
import { waitFor } from "../helpers/wait-for.ts";

const MiB = 1 << 20;

/** A response whose page reads when told to: what is written waits in `writableLength` until then. */
class Page {
  writableLength = 0;
  destroyed = false;
  write(text: string): boolean {
    this.writableLength += text.length;
    return true;
  }
  read(bytes: number): void {
    this.writableLength -= Math.min(bytes, this.writableLength);
  }
  end(): this {
    return this;
  }
  destroy(): this {
    this.destroyed = true;
    return this;
  }
}

/** `page` opened on `streams` with a snapshot of `bytes`, written whole as the server writes it. */
function opened(streams: EventStreams<Page>, bytes: number): Page {
  const page = new Page();
  page.write("x".repeat(bytes));
  streams.add(page);
  return page;
}

/**
 * A real event stream on `streams`, `snapshot` written to it, whose reader takes the headers and then reads nothing.
 * Nothing written after the headers leaves the process (the socket corked): what the kernel's socket buffers would
 * take of it (tens of MiB where they are tuned large) is not taken, and all of it waits.
 */
async function unreadStream(streams: EventStreams, snapshot: string): Promise<ServerResponse> {
  let response: ServerResponse | undefined;
  const server = createServer((_req, res) => {
    res.writeHead(200, { "content-type": "text/event-stream" });
    res.flushHeaders();
    res.socket!.cork();
    res.write(snapshot);
    streams.add(res);
    response = res;
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => {
    server.closeAllConnections();
    server.close();
  });
  const reader = request({ host: "127.0.0.1", port: (server.address() as AddressInfo).port, path: "/events" });
  const answered = new Promise<IncomingMessage>((resolve) => reader.on("response", (r) => (r.pause(), resolve(r))));
  reader.on("error", () => undefined);
  reader.end();
  (await answered).on("error", () => undefined);
  return waitFor(() => response, { message: "the stream opened" });
}

describe("the console's event streams", () => {
  it("a snapshot past 8 MiB alone does not drop its page (it reconnected for ever); a page 8 MiB further behind is dropped", () => {
    const streams = new EventStreams<Page>();
    const update = "u".repeat(MiB);
    const big = opened(streams, 20 * MiB);
    const reading = opened(streams, 20 * MiB);
    const small = opened(streams, 1000);
    // 8 MiB of updates on top of the snapshot: no page dropped
    for (let i = 0; i < 8; i++) streams.send(update);
    expect([big.destroyed, reading.destroyed, small.destroyed, streams.size]).toEqual([false, false, false, 3]);
    // one page reads its snapshot and what came since; the others do not
    reading.read(28 * MiB);
    streams.send(update);
    streams.send(update);
    // more than 8 MiB behind past what their snapshot left: dropped; the reading page is not
    expect([big.destroyed, reading.destroyed, small.destroyed, streams.size]).toEqual([true, false, true, 1]);
  });

  it("the snapshot's allowance follows the page down as it reads: one that read its snapshot, then falls 8 MiB behind, is dropped", () => {
    const streams = new EventStreams<Page>();
    const page = opened(streams, 20 * MiB);
    page.read(20 * MiB);
    for (let i = 0; i < 8; i++) streams.send("u".repeat(MiB));
    expect(page.destroyed).toBe(false);
    // 8 MiB waiting: the next update is written; past it, dropped (not at 20 MiB more)
    streams.send("u");
    streams.send("u");
    expect([page.destroyed, streams.size]).toEqual([true, 0]);
  });

  it("a real response whose reader does not read: its 20 MiB snapshot buffered, kept through 7 MiB of updates, dropped past 8 MiB more", async () => {
    const streams = new EventStreams();
    const res = await unreadStream(streams, `event: snapshot\ndata: "${"s".repeat(20 * MiB)}"\n\n`);
    // the whole snapshot waits: more than the whole allowance for updates
    expect(res.writableLength).toBeGreaterThan(20 * MiB);
    const update = `event: update\ndata: "${"u".repeat(MiB - 32)}"\n\n`;
    for (let i = 0; i < 7; i++) streams.send(update);
    expect([res.destroyed, streams.size]).toEqual([false, 1]);
    let sent = 7;
    while (!res.destroyed && sent < 64) {
      streams.send(update);
      sent++;
    }
    expect([res.destroyed, streams.size]).toEqual([true, 0]);
    // nothing drained: dropped as soon as more than 8 MiB of updates wait past the snapshot (with each chunk's framing)
    expect((sent - 1) * update.length).toBeGreaterThan(STREAM_BEHIND_BYTES - update.length);
    expect((sent - 2) * update.length).toBeLessThanOrEqual(STREAM_BEHIND_BYTES);
  });

  it("endAll destroys the streams, not only ends them: an ended one whose page does not read keeps its buffers, and no longer counts against the streams allowed", async () => {
    const streams = new EventStreams<Page>();
    const pages = [opened(streams, 20 * MiB), opened(streams, 0)];
    streams.endAll();
    expect([pages.map((p) => p.destroyed), streams.size]).toEqual([[true, true], 0]);
    // a real response: destroyed, what waited for its page let go
    const real = new EventStreams();
    const res = await unreadStream(real, `data: "${"s".repeat(MiB)}"\n\n`);
    expect(res.writableLength).toBeGreaterThan(MiB);
    real.endAll();
    expect([res.destroyed, res.socket?.destroyed ?? true, real.size]).toEqual([true, true, 0]);
  });
});
