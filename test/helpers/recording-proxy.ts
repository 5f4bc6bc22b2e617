// A forwarding HTTP proxy in front of a server (the demo records server): every
// request is passed on unchanged and recorded (method, path, headers, status),
// so a test can count what an owner sent and see its headers (traceparent). Set `down` and it answers 503
// itself instead, passing nothing on: the system behind it is unavailable.
import { type IncomingHttpHeaders, createServer, request } from "node:http";
import { listenForTest } from "./listen.ts";

export interface ProxiedRequest {
  method: string;
  path: string;
  headers: IncomingHttpHeaders;
  status: number;
  /** When the request reached the proxy (performance.now(), ms). */
  at: number;
}

export interface RecordingProxy {
  url: string;
  seen: ProxiedRequest[];
  /** While true, every request is answered 503 by the proxy (recorded, not passed on). */
  down: boolean;
}

/** Starts the proxy on 127.0.0.1 in front of `target` (http://host:port); closed when the test finishes. */
export async function startRecordingProxy(target: string): Promise<RecordingProxy> {
  const to = new URL(target);
  const seen: ProxiedRequest[] = [];
  const proxy: RecordingProxy = { url: "", seen, down: false };
  const server = createServer((req, res) => {
    const at = performance.now();
    if (proxy.down) {
      seen.push({ method: req.method ?? "", path: req.url ?? "", headers: req.headers, status: 503, at });
      res.writeHead(503, { "content-type": "text/plain" }).end("unavailable");
      return;
    }
    const upstream = request(
      { host: to.hostname, port: to.port, method: req.method, path: req.url, headers: { ...req.headers, host: to.host } },
      (answer) => {
        seen.push({ method: req.method ?? "", path: req.url ?? "", headers: req.headers, status: answer.statusCode ?? 0, at });
        res.writeHead(answer.statusCode ?? 502, answer.headers);
        answer.pipe(res);
      },
    );
    upstream.on("error", () => {
      seen.push({ method: req.method ?? "", path: req.url ?? "", headers: req.headers, status: 0, at });
      res.destroy();
    });
    req.pipe(upstream);
  });
  proxy.url = `http://127.0.0.1:${await listenForTest(server)}`;
  return proxy;
}
