// Raw TCP sockets against writ's HTTP servers (src/listen.ts): what a client that opens connections and sends
// nothing, or dribbles, looks like; and a deadline-bounded poll that answers whether something happened, for
// the ablations that assert it did not.
import { connect, type Socket } from "node:net";

export type TrackedSocket = Socket & { got: string; isClosed: () => boolean };

/** A socket to 127.0.0.1:`port`, connected (from `localAddress` if given), remembering whether it closed and what it got. */
export async function openSocket(port: number, localAddress?: string): Promise<TrackedSocket> {
  const s = connect({ port, host: "127.0.0.1", ...(localAddress ? { localAddress } : {}) }) as TrackedSocket;
  let closed = false;
  s.got = "";
  s.isClosed = () => closed;
  s.setEncoding("latin1");
  s.on("data", (d: string) => (s.got += d));
  s.on("close", () => (closed = true));
  s.on("error", () => undefined);
  await new Promise<void>((resolve, reject) => {
    s.once("connect", resolve);
    s.once("error", reject);
  });
  return s;
}

/** `n` connected sockets that send nothing. */
export async function silentSockets(port: number, n: number): Promise<TrackedSocket[]> {
  const out: TrackedSocket[] = [];
  for (let i = 0; i < n; i++) out.push(await openSocket(port));
  return out;
}

/** Polls `check` every 20 ms: true once it holds, false if `deadlineMs` passes first. */
export async function becomes(check: () => boolean | Promise<boolean>, deadlineMs: number): Promise<boolean> {
  const end = Date.now() + deadlineMs;
  for (;;) {
    if (await check()) return true;
    if (Date.now() >= end) return false;
    await new Promise((r) => setTimeout(r, 20));
  }
}

/**
 * `probe`'s result, and whether every socket of `held` was still open and told nothing when it ended: only then did
 * it run while they held their slots. On a machine slow enough that a server's short test timeout closed some of
 * them first, there is nothing to assert about "full" (the tests' decisive checks come after). The server closes a
 * held socket (its 408, then FIN) before it can accept the probe's connection, so that socket was readable before the
 * probe's answer was: the check waits one turn of the event loop (`setImmediate`, after the poll phase that read
 * the answer has run every callback ready with it) and counts a socket that got bytes or its end as closed, not
 * only one whose `close` event (emitted later, after its handle closes) has run.
 */
export async function whileAllOpen<T>(held: readonly TrackedSocket[], probe: () => Promise<T>): Promise<{ value: T; allOpen: boolean }> {
  const value = await probe();
  await new Promise<void>((resolve) => setImmediate(resolve));
  return { value, allOpen: held.every((s) => !s.isClosed() && s.got === "" && !s.readableEnded) };
}
