// A forwarding HTTP proxy in front of the records server that can hold a write on its way: the PATCH is taken in
// whole and not passed on (its client's deadline passes: an unknown outcome), and reaches the server later, when a
// later PATCH of the same intent arrives: the held one is passed on first and its answer awaited, and the later one
// is refused with a 429 without reaching the server (a rate limit: known not taken). The request that was still on
// its way thus commits while its owner pauses for the 429. Everything else is passed on unchanged.
import { createServer, type IncomingHttpHeaders, type IncomingMessage, request } from "node:http";
import { listenForTest } from "./listen.ts";

/** What the proxy does with the next PATCH of the watched intent: `hold` it, or `land-held-then-429`. */
export type HeldPatchStep = "hold" | "land-held-then-429";

export interface HoldingProxy {
  url: string;
  /** The steps for the PATCHes carrying this Idempotency-Key, in order; later ones are passed on. */
  watch(idempotencyKey: string, steps: HeldPatchStep[]): void;
  /** The server's statuses for the held requests it was given, in order. */
  landed: number[];
  /** Steps not taken yet. */
  stepsLeft(): number;
}

interface Held {
  path: string;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

/** Starts the proxy on 127.0.0.1 in front of `target` (http://host:port); closed when the test finishes. */
export async function startHoldingProxy(target: string): Promise<HoldingProxy> {
  const to = new URL(target);
  let key: string | null = null;
  let steps: HeldPatchStep[] = [];
  const held: Held[] = [];
  const landed: number[] = [];

  const forward = (method: string, path: string, headers: IncomingHttpHeaders, body: Buffer): Promise<IncomingMessage> =>
    new Promise((resolve, reject) => {
      const upstream = request({ host: to.hostname, port: to.port, method, path, headers: { ...headers, host: to.host, "content-length": String(body.length) } }, resolve);
      upstream.on("error", reject);
      upstream.end(body);
    });

  const server = createServer(async (req, res) => {
    res.on("error", () => undefined);
    const chunks: Buffer[] = [];
    for await (const chunk of req) chunks.push(chunk as Buffer);
    const body = Buffer.concat(chunks);
    const method = req.method ?? "GET";
    const path = req.url ?? "/";
    const step = method === "PATCH" && key !== null && req.headers["idempotency-key"] === key ? steps.shift() : undefined;
    try {
      if (step === "hold") {
        // Never answered: the client's deadline passes while the request is "still on its way".
        held.push({ path, headers: req.headers, body });
        return;
      }
      if (step === "land-held-then-429") {
        for (const h of held.splice(0)) {
          const answer = await forward("PATCH", h.path, h.headers, h.body);
          answer.resume();
          landed.push(answer.statusCode ?? 0);
        }
        res.writeHead(429, { "content-type": "application/problem+json", connection: "close" });
        res.end(JSON.stringify({ title: "Too Many Requests" }));
        return;
      }
      const answer = await forward(method, path, req.headers, body);
      res.writeHead(answer.statusCode ?? 502, answer.headers);
      answer.pipe(res);
    } catch {
      res.destroy();
    }
  });
  const port = await listenForTest(server);
  return {
    url: `http://127.0.0.1:${port}`,
    watch(idempotencyKey, next) {
      key = idempotencyKey;
      steps = [...next];
    },
    landed,
    stepsLeft: () => steps.length,
  };
}
