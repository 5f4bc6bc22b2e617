// A test's own HTTP server: listening on an ephemeral port of 127.0.0.1, closed (with its open connections, also
// ones a test holds unanswered) when the test finishes.
import type { Server } from "node:http";
import type { AddressInfo } from "node:net";
import { onTestFinished } from "vitest";

/** Listens on 127.0.0.1:0 until the test finishes; the port. */
export async function listenForTest(server: Server): Promise<number> {
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(
    () =>
      new Promise<void>((resolve) => {
        server.close(() => resolve());
        server.closeAllConnections();
      }),
  );
  return (server.address() as AddressInfo).port;
}
