// The HTTP adapter's `tls` option against a local HTTPS server whose
// certificates are made at test time by the openssl CLI (node:crypto cannot
// issue X.509 certificates): a private CA, a server certificate for
// 127.0.0.1, and a client certificate for mutual TLS. No broker.
import { execFileSync } from "node:child_process";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import type { TLSSocket } from "node:tls";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { afterAll, beforeAll, describe, expect, it } from "vitest";
import { WritError } from "../../../src/errors.ts";
import type { JsonPatchOp } from "../../../src/schemas/common.ts";
import { createHttpSystemOfRecord } from "../../../src/sor/http-adapter.ts";
import type { HttpSystemOfRecordOptions } from "../../../src/sor/http-adapter.ts";
import { json, startStub } from "../../helpers/http-stub.ts";

interface Pki {
  dir: string;
  ca: string;
  serverCert: string;
  serverKey: string;
  clientCert: string;
  clientKey: string;
}

const REQ_CONFIG = `[req]
distinguished_name = dn
prompt = no
[dn]
CN = placeholder
[ca]
basicConstraints = critical,CA:TRUE
keyUsage = critical,keyCertSign,cRLSign
[server]
basicConstraints = CA:FALSE
subjectAltName = IP:127.0.0.1,DNS:localhost
extendedKeyUsage = serverAuth
[client]
basicConstraints = CA:FALSE
extendedKeyUsage = clientAuth
`;

function hasOpenssl(): boolean {
  try {
    execFileSync("openssl", ["version"], { stdio: "pipe" });
    return true;
  } catch {
    return false;
  }
}

/** A CA, and a server and a client certificate it signed; P-256 keys, valid two days. */
function makePki(): Pki {
  const dir = mkdtempSync(join(tmpdir(), "writ-tls-"));
  const openssl = (...args: string[]) => execFileSync("openssl", args, { cwd: dir, stdio: "pipe" });
  writeFileSync(join(dir, "req.cnf"), REQ_CONFIG);
  const newKey = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"];
  openssl("req", "-x509", "-config", "req.cnf", "-extensions", "ca", ...newKey, "-keyout", "ca.key", "-out", "ca.crt", "-days", "2", "-subj", "/CN=writ test CA");
  let serial = 2;
  for (const [leaf, cn] of [["server", "127.0.0.1"], ["client", "writ-owner"]] as const) {
    openssl("req", "-new", "-config", "req.cnf", ...newKey, "-keyout", `${leaf}.key`, "-out", `${leaf}.csr`, "-subj", `/CN=${cn}`);
    openssl("x509", "-req", "-in", `${leaf}.csr`, "-CA", "ca.crt", "-CAkey", "ca.key", "-set_serial", String(serial++), "-out", `${leaf}.crt`, "-days", "2", "-extfile", "req.cnf", "-extensions", leaf);
  }
  const read = (f: string) => readFileSync(join(dir, f), "utf8");
  return { dir, ca: read("ca.crt"), serverCert: read("server.crt"), serverKey: read("server.key"), clientCert: read("client.crt"), clientKey: read("client.key") };
}

const T1 = { type: "ticket", id: "T-1" };
const quick = { timeoutMs: 5000 };
const addTag = (tag: string): JsonPatchOp[] => [{ op: "add", path: "/tags/-", value: tag }];
const write = (ifMatch: string) => ({ ifMatch, idempotencyKey: "k-1", timeoutMs: 5000 });

function sor(baseUrl: string, opts: Partial<HttpSystemOfRecordOptions> = {}) {
  const system = createHttpSystemOfRecord({ name: "helpdesk", baseUrl, ...opts });
  return system;
}

describe("http adapter: tls options (validation)", () => {
  it("refuses tls on an http baseUrl, a cert without a key, unknown keys and PEMs that do not load", () => {
    const attempt = (opts: Partial<HttpSystemOfRecordOptions>) => () => createHttpSystemOfRecord({ name: "crm", baseUrl: "https://127.0.0.1:1", ...opts } as HttpSystemOfRecordOptions);
    expect(attempt({ baseUrl: "http://127.0.0.1:1", tls: { rejectUnauthorized: true } })).toThrow(/option "tls": needs an https baseUrl/);
    expect(attempt({ tls: { cert: "x" } })).toThrow(/option "tls": cert and key go together/);
    expect(attempt({ tls: { ca: "x", passphrase: "p" } as never })).toThrow(/option "tls": Unrecognized key: "passphrase"/);
    expect(attempt({ tls: { ca: 42 } as never })).toThrow(/option "tls.ca": must be a PEM string or a Buffer/);
    // node:tls would take it and trust nothing.
    expect(attempt({ tls: { ca: "not a certificate" } })).toThrow(/option "tls.ca": holds no PEM certificate/);
    expect(attempt({ tls: { ca: "-----BEGIN CERTIFICATE-----\nAAAA\n-----END CERTIFICATE-----" } })).toThrow(/option "tls.ca": a certificate could not be parsed/);
    const secretKey = "-----BEGIN PRIVATE KEY-----\nTUlJRXZRSUJBREFOQmdrcWhraUc5dzBCQVFFRkFBU0NCS2N3Z2dTakFnRUFBb0lCQVFD\n-----END PRIVATE KEY-----";
    let err: unknown;
    try {
      attempt({ tls: { cert: "not a certificate", key: secretKey } })();
    } catch (e) {
      err = e;
    }
    expect(err).toMatchObject({ code: "config_invalid", context: { field: "tls" } });
    expect(JSON.stringify((err as WritError).toJSON()) + (err as Error).message).not.toContain("TUlJRXZRSUJB");
  });
});

describe.skipIf(!hasOpenssl())("http adapter: tls against a local HTTPS server (openssl-made certificates)", () => {
  let pki: Pki;
  beforeAll(() => {
    pki = makePki();
  });
  afterAll(() => {
    if (pki) rmSync(pki.dir, { recursive: true, force: true });
  });

  async function https(requestCert = false) {
    const peers: unknown[] = [];
    const api = await startStub(
      (req, res, raw) => {
        const peer = (raw.socket as TLSSocket).getPeerCertificate();
        peers.push(peer && "subject" in peer ? peer.subject?.CN : undefined);
        if (req.method === "GET") return json(res, 200, { data: { tags: [] } }, { etag: '"1"' });
        json(res, 200, { data: { tags: ["a"] } }, { etag: '"2"' });
      },
      { key: pki.serverKey, cert: pki.serverCert, ...(requestCert ? { requestCert: true, rejectUnauthorized: true, ca: pki.ca } : {}) },
    );
    return { ...api, peers };
  }

  it("a private CA in tls.ca: reads and writes go through, with headers and body intact", async () => {
    const api = await https();
    let calls = 0;
    const system = sor(api.url, {
      tls: { ca: pki.ca },
      state: { pointer: "/data" },
      patchBody: { kind: "wrapped", field: "ops" },
      headers: () => ({ authorization: `Bearer t-${++calls}` }),
    });
    try {
      expect(await system.read(T1, quick)).toEqual({ state: { tags: [] }, version: '"1"' });
      expect(await system.patch(T1, addTag("a"), write('"1"'))).toEqual({ kind: "applied", state: { tags: ["a"] }, version: '"2"' });
      expect(api.seen.map((r) => [r.method, r.headers.authorization])).toEqual([
        ["GET", "Bearer t-1"],
        ["PATCH", "Bearer t-2"],
      ]);
      expect(JSON.parse(api.seen[1]!.body)).toEqual({ ops: addTag("a") });
      expect(api.seen[1]!.headers).toMatchObject({ "if-match": '"1"', "idempotency-key": "k-1", "content-type": "application/json" });
    } finally {
      await system.close();
    }
  });

  it("the same CA as Buffers works too, typed as Node's Buffer (docs/http-adapter.md: string | Buffer)", async () => {
    const api = await https();
    // Node's `Buffer` is Buffer<ArrayBufferLike>: the option's type must take it, not only Buffer.from's Buffer<ArrayBuffer>.
    const ca: Buffer = Buffer.from(pki.ca);
    const system = sor(api.url, { tls: { ca } });
    try {
      expect(await system.read(T1, quick)).toMatchObject({ version: '"1"' });
    } finally {
      await system.close();
    }
  });

  it("without the CA the server is refused before anything is sent: read sor_unavailable, patch unavailable", async () => {
    const api = await https();
    for (const system of [sor(api.url), sor(api.url, { tls: { rejectUnauthorized: true } })]) {
      await expect(system.read(T1, quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true, message: /UNABLE_TO_VERIFY_LEAF_SIGNATURE/ });
      expect(await system.patch(T1, addTag("a"), write('"1"'))).toMatchObject({ kind: "unavailable" });
      await system.close();
    }
    expect(api.seen).toHaveLength(0);
  });

  it("rejectUnauthorized: false accepts the server without the CA", async () => {
    const api = await https();
    const system = sor(api.url, { tls: { rejectUnauthorized: false } });
    try {
      expect(await system.read(T1, quick)).toMatchObject({ version: '"1"' });
    } finally {
      await system.close();
    }
  });

  it("mutual TLS: the client certificate is presented; without it the server refuses", async () => {
    const api = await https(true);
    const withCert = sor(api.url, { tls: { ca: pki.ca, cert: pki.clientCert, key: Buffer.from(pki.clientKey) } });
    const without = sor(api.url, { tls: { ca: pki.ca } });
    try {
      expect(await withCert.read(T1, quick)).toMatchObject({ version: '"1"' });
      expect(api.peers).toEqual(["writ-owner"]);
      await expect(without.read(T1, quick)).rejects.toMatchObject({ code: "sor_unavailable", retriable: true });
      expect(api.seen).toHaveLength(1);
    } finally {
      await withCert.close();
      await without.close();
    }
  });

  it("close() ends the agent, and later requests are refused without being sent; closing twice, or a system that never sent, is fine", async () => {
    const api = await https();
    const system = sor(api.url, { tls: { ca: pki.ca } });
    await system.read(T1, quick);
    await system.close();
    await system.close();
    await expect(system.read(T1, quick)).rejects.toMatchObject({ code: "sor_protocol", message: /closed/ });
    expect(await system.patch(T1, addTag("a"), write('"1"'))).toMatchObject({ kind: "unavailable", message: expect.stringMatching(/closed/) });
    expect(api.seen).toHaveLength(1);
    await sor(api.url, { tls: { ca: pki.ca } }).close();
    await sor(api.url).close();
  });
});
