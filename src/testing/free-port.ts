import { createServer } from "node:net";

/** A TCP port free on 127.0.0.1 just now (the kernel's pick for port 0), for a test or demo process to listen on. */
export function freePort(): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(0, "127.0.0.1", () => {
      const { port } = server.address() as { port: number };
      server.close(() => resolve(port));
    });
  });
}
