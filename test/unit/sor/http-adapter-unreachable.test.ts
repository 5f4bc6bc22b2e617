// An unreachable host or network is "not sent" (safe to try again) only when the connect failed: the same
// codes arrive on a kept-alive connection after the request went out (an ICMP unreachable from a router),
// and then the system may have committed the write. undici is replaced here by an Agent whose request
// fails as Node's sockets fail: `connect EHOSTUNREACH …` (syscall connect, what an unroutable address
// gives) or `read EHOSTUNREACH` on an established socket, which no test can make a real kernel produce.
import { describe, expect, it, vi } from "vitest";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";

const failure: { current: NodeJS.ErrnoException | null } = { current: null };
const sent: string[] = [];

type Handler = { onRequestStart?: (controller: unknown, context: unknown) => void };
type Dispatch = (opts: object, handler: Handler) => boolean;

vi.mock("undici", () => ({
  Agent: class {
    // The adapter's interceptor learns from onRequestStart that undici began writing the request: it does so on a
    // connected socket, so only a failure on an established connection (syscall read) comes after it.
    compose(interceptor: (dispatch: Dispatch) => Dispatch) {
      const dispatch = interceptor((_opts, handler) => {
        if (failure.current?.syscall !== "connect") handler.onRequestStart?.({}, {});
        return true;
      });
      return {
        async request(opts: { method: string; path: string }): Promise<never> {
          dispatch(opts, {});
          sent.push(`${opts.method} ${opts.path}`);
          throw failure.current;
        },
        async close(): Promise<void> {},
      };
    }
  },
}));

function systemError(code: string, syscall: string): NodeJS.ErrnoException {
  return Object.assign(new Error(`${syscall} ${code} 10.1.2.3:443`), { code, syscall, errno: -113 });
}

const T1 = { type: "ticket", id: "T-1" };
const patch = () =>
  createHttpSystemOfRecord({ name: "crm", baseUrl: "https://crm.example" }).patch(T1, [{ op: "add", path: "/tags/-", value: "vip" }], {
    ifMatch: '"v1"',
    idempotencyKey: "k-1",
    timeoutMs: 5000,
  });

describe("an unreachable host or network", () => {
  for (const code of ["EHOSTUNREACH", "ENETUNREACH"]) {
    it(`${code} while connecting: not sent, unavailable (tried again after the outage)`, async () => {
      failure.current = systemError(code, "connect");
      expect(await patch()).toMatchObject({ kind: "unavailable" });
    });

    it(`${code} on an established connection: the PATCH may have landed, unknown (reconciled, never blindly sent again)`, async () => {
      failure.current = systemError(code, "read");
      const outcome = await patch();
      expect(outcome).toMatchObject({ kind: "unknown", message: expect.stringContaining(code) });
    });
  }

  it("connection refused is not sent whatever the call (a refusal only answers a connect)", async () => {
    failure.current = systemError("ECONNREFUSED", "connect");
    expect(await patch()).toMatchObject({ kind: "unavailable" });
    expect(sent.length).toBeGreaterThan(0);
  });
});
