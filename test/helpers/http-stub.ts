// A hand-written HTTP(S) endpoint for unit tests of the HTTP adapter: every
// request is recorded (method, path, headers, body) and answered by a handler.
import { createServer } from "node:http";
import type { IncomingHttpHeaders, IncomingMessage, Server, ServerResponse } from "node:http";
import { createServer as createHttpsServer } from "node:https";
import type { ServerOptions as HttpsServerOptions } from "node:https";
import { listenForTest } from "./listen.ts";

export interface SeenRequest {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  body: string;
}

export type StubHandler = (req: SeenRequest, res: ServerResponse, raw: IncomingMessage) => void;

export interface Stub {
  url: string;
  seen: SeenRequest[];
}

/** Starts the endpoint on 127.0.0.1 (HTTPS with `tls`); closed when the test finishes. */
export async function startStub(handler: StubHandler, tls?: HttpsServerOptions): Promise<Stub> {
  const seen: SeenRequest[] = [];
  const listener = (raw: IncomingMessage, res: ServerResponse) => {
    const chunks: Buffer[] = [];
    raw.on("data", (c: Buffer) => chunks.push(c));
    raw.on("end", () => {
      const req: SeenRequest = { method: raw.method ?? "", path: raw.url ?? "", headers: raw.headers, body: Buffer.concat(chunks).toString("utf8") };
      seen.push(req);
      try {
        handler(req, res, raw);
      } catch (err) {
        res.writeHead(500, { "content-type": "text/plain" }).end(String(err));
      }
    });
  };
  const server: Server = tls === undefined ? createServer(listener) : createHttpsServer(tls, listener);
  const port = await listenForTest(server);
  const scheme = tls === undefined ? "http" : "https";
  return { url: `${scheme}://127.0.0.1:${port}`, seen };
}

/** Writes a JSON answer. */
export function json(res: ServerResponse, status: number, body: unknown, headers: Record<string, string> = {}): void {
  res.writeHead(status, { "content-type": "application/json", ...headers }).end(JSON.stringify(body));
}
