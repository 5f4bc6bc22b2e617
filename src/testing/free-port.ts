import { createServer } from "node:net";

/** Listens on 127.0.0.1:`port` (0: the kernel's pick) and closes again; resolves the port it got, rejects when taken. */
function bindOnce(port: number): Promise<number> {
  return new Promise((resolve, reject) => {
    const server = createServer();
    server.once("error", reject);
    server.listen(port, "127.0.0.1", () => {
      const { port: bound } = server.address() as { port: number };
      server.close(() => resolve(bound));
    });
  });
}

/** A TCP port free on 127.0.0.1 just now (the kernel's pick for port 0), for a test or demo process to listen on. */
export function freePort(): Promise<number> {
  return bindOnce(0);
}

/** Whether 127.0.0.1:`port` could be listened on just now. */
export function isPortFree(port: number): Promise<boolean> {
  return bindOnce(port).then(
    () => true,
    () => false,
  );
}
