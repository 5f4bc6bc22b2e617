import { afterEach, describe, expect, it, vi } from "vitest";
import type { Message } from "kafkajs";
import { SendCoalescer } from "../../../producers/send-coalescer.ts";

const msg = (v: string): Message => ({ key: "k", value: Buffer.from(v) });

/** A produce function whose requests the test completes by hand. */
function gate() {
  const requests: { messages: string[]; done: (err?: Error) => void }[] = [];
  const produce = (messages: Message[]) =>
    new Promise<void>((resolve, reject) => requests.push({ messages: messages.map((m) => String(m.value)), done: (err) => (err ? reject(err) : resolve()) }));
  return { requests, produce };
}

const waitFor = async (cond: () => boolean) => {
  const deadline = Date.now() + 2000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error("condition not met");
    await new Promise((r) => setImmediate(r));
  }
};

describe("SendCoalescer", () => {
  it("sends a lone submit at once, and the submits that queue behind it in one request, in order", async () => {
    const g = gate();
    const c = new SendCoalescer(g.produce, 1_000_000);
    const first = c.send([msg("a")]);
    await waitFor(() => g.requests.length === 1);
    const rest = [c.send([msg("b")]), c.send([msg("c"), msg("d")]), c.send([msg("e")])];
    expect(g.requests).toHaveLength(1);
    g.requests[0]!.done();
    await first;
    await waitFor(() => g.requests.length === 2);
    expect(g.requests[1]!.messages).toEqual(["b", "c", "d", "e"]);
    g.requests[1]!.done();
    await Promise.all(rest);
  });

  it("fails exactly the submits whose request failed", async () => {
    const g = gate();
    const c = new SendCoalescer(g.produce, 1_000_000);
    const first = c.send([msg("a")]);
    await waitFor(() => g.requests.length === 1);
    const second = c.send([msg("b")]);
    g.requests[0]!.done(new Error("broker said no"));
    await expect(first).rejects.toThrow("broker said no");
    await waitFor(() => g.requests.length === 2);
    g.requests[1]!.done();
    await expect(second).resolves.toBe("sent");
  });

  it("splits queued submits at maxBytes, never splitting a submit that fits in one request", async () => {
    const g = gate();
    // 120 bytes of value and 64 of overhead: two messages fill a request.
    const c = new SendCoalescer(g.produce, 370);
    const first = c.send([msg("x")]);
    await waitFor(() => g.requests.length === 1);
    const big = "y".repeat(120);
    const queued = [c.send([msg(big)]), c.send([msg(big)]), c.send([msg(big), msg(big)])];
    g.requests[0]!.done();
    await first;
    for (const n of [2, 3]) {
      await waitFor(() => g.requests.length === n);
      g.requests[n - 1]!.done();
    }
    await Promise.all(queued);
    expect(g.requests.map((r) => r.messages.length)).toEqual([1, 2, 2]);
  });

  it("sends one submit larger than maxBytes by itself in requests of at most maxBytes, in order, settling with the last (brokers refuse an oversize batch whole)", async () => {
    const g = gate();
    const c = new SendCoalescer(g.produce, 500);
    const big = (n: number) => msg(String(n).repeat(150));
    const sent = c.send([big(1), big(2), big(3), big(4), big(5)]);
    let settled = false;
    void sent.then(() => (settled = true));
    for (const n of [1, 2, 3]) {
      await waitFor(() => g.requests.length === n);
      expect(settled).toBe(false);
      g.requests[n - 1]!.done();
    }
    await expect(sent).resolves.toBe("sent");
    // 150 bytes of value and 64 of overhead each: two messages a request.
    expect(g.requests.map((r) => r.messages.map((m) => m[0]))).toEqual([["1", "2"], ["3", "4"], ["5"]]);
  });

  it("rejects a split submit with its first failed request and sends none of the rest", async () => {
    const g = gate();
    const c = new SendCoalescer(g.produce, 500);
    const sent = c.send([msg("a".repeat(300)), msg("b".repeat(300)), msg("c".repeat(300))]);
    await waitFor(() => g.requests.length === 1);
    g.requests[0]!.done();
    await waitFor(() => g.requests.length === 2);
    g.requests[1]!.done(new Error("broker said no"));
    await expect(sent).rejects.toThrow("broker said no");
    expect(g.requests).toHaveLength(2);
  });

  describe("deadlines", () => {
    afterEach(() => vi.useRealTimers());

    it("drops a send still queued at its deadline (not_sent, never produced), and answers one in flight unconfirmed", async () => {
      vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
      const g = gate();
      const c = new SendCoalescer(g.produce, 1_000_000);
      const inFlight = c.send([msg("a")], Date.now() + 1000);
      await waitFor(() => g.requests.length === 1);
      const queued = c.send([msg("b")], Date.now() + 1000);
      // How each ended, kept as it settles: the check below waits for both, with the bound of waitFor.
      const ended: { inFlight?: unknown; queued?: unknown } = {};
      inFlight.then((v) => (ended.inFlight = v), (err: unknown) => (ended.inFlight = err));
      queued.then((v) => (ended.queued = v), (err: unknown) => (ended.queued = err));
      await vi.advanceTimersByTimeAsync(1000);
      await waitFor(() => "inFlight" in ended && "queued" in ended);
      expect(ended.queued).toMatchObject({ code: "not_sent", retriable: true });
      expect(ended.inFlight).toBe("unconfirmed");
      g.requests[0]!.done();
      const later = c.send([msg("c")]);
      await waitFor(() => g.requests.length === 2);
      expect(g.requests[1]!.messages).toEqual(["c"]);
      g.requests[1]!.done();
      await expect(later).resolves.toBe("sent");
    });
  });
});
