// The Host names `writ console` answers (src/console/auth.ts): the ones it is bound to, the bare name on port 80
// (browsers leave that port out), and the ones named with --allowed-host, which must be what a Host header carries.
import type { IncomingMessage } from "node:http";
import { describe, expect, it, vi } from "vitest";
import { allowedHostFault, allowedHostsFor, refusedOrigin } from "../../src/console/auth.ts";
import { consoleCommand } from "../../src/console/command.ts";
import { startConsole } from "../../src/console/server.ts";

const request = (headers: Record<string, string>) => ({ headers }) as unknown as IncomingMessage;

describe("the console's allowed hosts", () => {
  it("on port 80 the bare name is allowed (browsers send Host and Origin without it); on another port it is not", () => {
    const on80 = allowedHostsFor("127.0.0.1", 80);
    for (const host of ["127.0.0.1", "localhost", "[::1]", "localhost:80"]) expect(refusedOrigin(request({ host, origin: `http://${host}` }), on80)).toBeNull();
    expect(refusedOrigin(request({ host: "localhost" }), allowedHostsFor("127.0.0.1", 39200))).toBe("host not allowed");
    // a host bound to, and a name given with port 80 (a proxy passes the browser's Host on)
    const named = allowedHostsFor("10.0.0.5", 80, ["Console.example.com:80", "[fe80::1]:80", "other.example:8443"]);
    for (const host of ["10.0.0.5", "console.example.com", "[fe80::1]", "other.example:8443"]) expect(refusedOrigin(request({ host }), named)).toBeNull();
    expect(refusedOrigin(request({ host: "other.example" }), named)).toBe("host not allowed");
    // a request without a Host header is never let through
    expect(refusedOrigin(request({}), named)).toBe("host not allowed");
  });

  it("an --allowed-host entry is name[:port] or [IPv6][:port]: a URL, a bare IPv6 address, an empty one (matched a request without Host) or a bad port is refused", () => {
    for (const ok of ["console.example.com", "console.example.com:8443", "proxy", "my_service:80", "10.0.0.5:39200", "[fe80::1]", "[::1]:39200"]) expect(allowedHostFault(ok), ok).toBeNull();
    for (const [bad, why] of [
      ["http://console.example.com", /not a URL/],
      ["fe80::1", /in brackets.*\[fe80::1\]/],
      ["", /empty/],
      ["console.example.com:99999", /port from 1 to 65535/],
      ["console.example.com:0", /port from 1 to 65535/],
      ["console.example.com/", /not name\[:port\]/],
      ["[not-v6]:80", /not name\[:port\]/],
      ["a b", /not name\[:port\]/],
      ["-lead.example", /not name\[:port\]/],
    ] as const) {
      expect(allowedHostFault(bad), bad).toMatch(why);
    }
  });

  it("an --allowed-host entry spelled otherwise than browsers send it (upper-case or uncompressed IPv6, IPv4-mapped, a zone id, an IPv4 address as a number) never matches: refused, naming the form they send", () => {
    for (const [bad, why] of [
      ["[FE80:0::1]", /browsers send this host as \[fe80::1\].*give \[fe80::1\]$/],
      ["[::ffff:127.0.0.1]:8443", /browsers send this host as \[::ffff:7f00:1\].*give \[::ffff:7f00:1\]:8443$/],
      ["[fe80::1%eth0]", /zone id \(%eth0\)/],
      ["2130706433", /browsers send this host as 127\.0\.0\.1.*give 127\.0\.0\.1$/],
      ["0x7f.1:80", /give 127\.0\.0\.1:80$/],
      ["10.1", /give 10\.0\.0\.1$/],
      ["999.1.1.1", /not a host a browser sends/],
    ] as const) {
      expect(allowedHostFault(bad), bad).toMatch(why);
    }
    // as a browser sends them (a name in any case: Host is matched without it)
    for (const ok of ["[fe80::1]", "[::ffff:7f00:1]:8443", "127.0.0.1", "Console.Example.com:8443", "[FE80::1]"]) expect(allowedHostFault(ok), ok).toBeNull();
  });

  it("writ console refuses a bad --allowed-host with a usage error naming it, before anything connects (exit 2); startConsole refuses it config_invalid", async () => {
    const written: string[] = [];
    const stderr = vi.spyOn(process.stderr, "write").mockImplementation((chunk: string | Uint8Array) => (written.push(String(chunk)), true));
    try {
      for (const [entry, shown] of [
        ["http://console.example.com", '"http://console.example.com"'],
        ["fe80::1", '"fe80::1"'],
        ["", '""'],
        ["evil\u202e.example", '"evil\\u202e.example"'],
        ["[FE80:0::1]", '"[FE80:0::1]"'],
      ]) {
        written.length = 0;
        // 127.0.0.1:9 refuses: a console that connected first would retry there instead of answering
        expect(await consoleCommand.main(["--brokers", "127.0.0.1:9", "--token", "t".repeat(16), "--port", "0", "--allowed-host", "console.example.com", "--allowed-host", entry!])).toBe(2);
        const out = written.join("");
        expect(out).toMatch(new RegExp(`^writ console: --allowed-host ${shown!.replace(/[\\.*+?()[\]{}|^$/]/g, "\\$&")}: `));
        expect(out, "nothing connected").not.toMatch(/Kafka|ECONNREFUSED|listening/);
      }
    } finally {
      stderr.mockRestore();
    }
    await expect(startConsole({ brokers: ["127.0.0.1:9"], topics: { intents: "i", human: "h", dlq: "d" }, token: "t".repeat(16), allowedHosts: ["fe80::1"] })).rejects.toMatchObject({
      code: "config_invalid",
      context: { field: "allowedHosts" },
    });
  });
});
