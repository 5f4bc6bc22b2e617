import { createServer } from "node:http";
import { describe, expect, it } from "vitest";
import { listen } from "../../src/listen.ts";

describe("listen", () => {
  it("an accept error after listening (descriptors run out) is logged, not thrown; the server still answers", async () => {
    const logged: string[] = [];
    const server = createServer((_req, res) => res.end("ok"));
    await listen(server, { port: 0, host: "127.0.0.1", maxConnections: 8, log: { error: (_obj, msg) => void logged.push(msg) }, what: "test server" });
    try {
      expect(server.maxConnections).toBe(8);
      // What net.Server does when accept() fails with EMFILE: emit "error" on the server. Unheard, it would throw.
      const emfile = Object.assign(new Error("accept EMFILE"), { code: "EMFILE" });
      expect(() => server.emit("error", emfile)).not.toThrow();
      expect(() => server.emit("error", emfile)).not.toThrow();
      expect(logged).toEqual(["test server: a connection could not be accepted", "test server: a connection could not be accepted"]);
      const { port } = server.address() as { port: number };
      expect(await (await fetch(`http://127.0.0.1:${port}/`)).text()).toBe("ok");
    } finally {
      await new Promise((r) => server.close(r));
    }
  });

  it("a port in use is a rejected promise, with no listener left behind", async () => {
    const first = createServer();
    await listen(first, { port: 0, host: "127.0.0.1", maxConnections: 8, log: { error: () => undefined }, what: "first" });
    const second = createServer();
    try {
      const { port } = first.address() as { port: number };
      await expect(listen(second, { port, host: "127.0.0.1", maxConnections: 8, log: { error: () => undefined }, what: "second" })).rejects.toMatchObject({ code: "EADDRINUSE" });
      expect(second.listenerCount("error")).toBe(0);
    } finally {
      await new Promise((r) => first.close(r));
    }
  });
});
