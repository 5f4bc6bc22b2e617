import type { Server } from "node:http";

/**
 * Listens on `host:port` and keeps the server alive afterwards. Once listening, a server's "error"
 * events come from accepting connections (EMFILE, ENFILE when file descriptors run out); with no
 * listener Node throws them and the process dies, so a client that opens sockets until the limit
 * could stop an owner or a console. They are logged instead, and the server goes on accepting when
 * descriptors are free again. `maxConnections` bounds the open connections: past it, Node closes a
 * new connection at once.
 */
export async function listen(server: Server, opts: { port: number; host: string; maxConnections: number; log: { error(obj: object, msg: string): void }; what: string }): Promise<void> {
  server.maxConnections = opts.maxConnections;
  await new Promise<void>((resolve, reject) => {
    server.once("error", reject);
    server.listen(opts.port, opts.host, () => {
      server.off("error", reject);
      resolve();
    });
  });
  server.on("error", (err) => opts.log.error({ err }, `${opts.what}: a connection could not be accepted`));
}
