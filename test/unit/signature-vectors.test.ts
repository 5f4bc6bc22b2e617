// The golden vectors of intent signing (test/fixtures/signature-vectors.json),
// checked with the TypeScript implementation. The Python client runs the same
// file (python/tests/test_signing.py). A failure here means
// src/security/signing.ts or src/canonical-json.ts no longer give the bytes
// other clients were promised: a wire-contract change (docs/wire-contract.md §7;
// see scripts/generate-signature-vectors.ts before regenerating anything).
import { createPublicKey, generateKeyPairSync, sign, verify } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { canonicalJson } from "../../src/canonical-json.ts";
import { AgentRegistry } from "../../src/security/agent-registry.ts";
import { SIGNATURE_HEADER, prepareSigner, publicKeyFrom, signIntent, signedBytes, verifyIntentSignature, verifySignatureOver } from "../../src/security/signing.ts";
import { SIGNATURE_VECTORS_FILE, privateKeyFromSeed, render } from "../../scripts/generate-signature-vectors.ts";

interface Key {
  keyId: string;
  seedBase64: string;
  privateKeyPem: string;
  publicKeyPem: string;
  publicKeyBase64: string;
}

interface Vector {
  name: string;
  keyId: string;
  intentJson: string;
  expected: { canonical: string; header: string; error?: undefined } | { error: "not_canonical" };
}

interface SignatureVectorsFile {
  header: string;
  algorithm: string;
  rfc8032: { seedHex: string; publicKeyHex: string; messageHex: string; signatureHex: string };
  keys: Key[];
  vectors: Vector[];
}

const text = readFileSync(SIGNATURE_VECTORS_FILE, "utf8");
const file = JSON.parse(text) as SignatureVectorsFile;
const keyOf = (id: string) => {
  const k = file.keys.find((x) => x.keyId === id);
  if (!k) throw new Error(`no key ${id}`);
  return k;
};

describe("intent signature golden vectors", () => {
  it("names the header and the algorithm", () => {
    expect(file.header).toBe(SIGNATURE_HEADER);
    expect(file.algorithm).toBe("ed25519");
    expect(file.vectors.filter((v) => v.expected.error === undefined).length).toBeGreaterThanOrEqual(6);
    expect(file.vectors.filter((v) => v.expected.error !== undefined).length).toBeGreaterThanOrEqual(2);
  });

  it("signs RFC 8032's TEST 1 as the RFC prints it (section 7.1)", () => {
    // The values as published in the RFC, not computed here.
    const published = {
      seedHex: "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60",
      publicKeyHex: "d75a980182b10ab7d54bfed3c964073a0ee172f3daa62325af021a68f707511a",
      signatureHex: "e5564300c360ac729086e2cc806e828a84877f1eb8e5d974d873e065224901555fb8821590a33bacc61e39701cf9b46bd25bf5f0595bbe24655141438e7a100b",
    };
    expect(file.rfc8032).toMatchObject({ ...published, messageHex: "" });
    const key = privateKeyFromSeed(Buffer.from(published.seedHex, "hex"));
    expect(sign(null, Buffer.alloc(0), key).toString("hex")).toBe(published.signatureHex);
    expect(keyOf("test-rfc8032-1").publicKeyBase64).toBe(Buffer.from(published.publicKeyHex, "hex").toString("base64"));
  });

  it("each key's seed, PKCS#8 PEM, SPKI PEM and raw public key are the same key", () => {
    for (const k of file.keys) {
      const fromSeed = privateKeyFromSeed(Buffer.from(k.seedBase64, "base64"));
      expect(fromSeed.export({ format: "pem", type: "pkcs8" }).toString(), k.keyId).toBe(k.privateKeyPem);
      expect(createPublicKey(fromSeed).export({ format: "pem", type: "spki" }).toString(), k.keyId).toBe(k.publicKeyPem);
      expect(publicKeyFrom(k.publicKeyBase64).export({ format: "pem", type: "spki" }).toString(), k.keyId).toBe(k.publicKeyPem);
    }
  });

  it.each(file.vectors.map((v) => [v.name, v] as const))("%s", (_name, v) => {
    const k = keyOf(v.keyId);
    const intent = JSON.parse(v.intentJson) as Record<string, unknown>;
    if (v.expected.error !== undefined) {
      const refusal = { name: "WritError", code: v.expected.error, retriable: false };
      expect(() => signIntent(intent, { keyId: k.keyId, privateKey: k.privateKeyPem })).toThrow(expect.objectContaining(refusal));
      expect(verifyIntentSignature(intent, `ed25519 ${k.keyId} ${"A".repeat(86)}==`, new Map([[k.keyId, publicKeyFrom(k.publicKeyPem)]]))).toMatchObject({ ok: false });
      return;
    }
    expect(canonicalJson(intent)).toBe(v.expected.canonical);
    expect(signedBytes(intent).equals(Buffer.from(v.expected.canonical, "utf8"))).toBe(true);
    // from the PEM and from the seed: the same (deterministic) signature
    expect(signIntent(intent, { keyId: k.keyId, privateKey: k.privateKeyPem })).toBe(v.expected.header);
    expect(signIntent(intent, { keyId: k.keyId, privateKey: privateKeyFromSeed(Buffer.from(k.seedBase64, "base64")) })).toBe(v.expected.header);
    // as a client signs: its signer prepared once at start (PEM parsed there)
    expect(signIntent(intent, prepareSigner({ keyId: k.keyId, privateKey: k.privateKeyPem }))).toBe(v.expected.header);
    const [scheme, keyId, signature] = v.expected.header.split(" ");
    expect([scheme, keyId]).toEqual(["ed25519", k.keyId]);
    expect(signature).toMatch(/^[A-Za-z0-9+/]{86}==$/);
    expect(verify(null, Buffer.from(v.expected.canonical, "utf8"), publicKeyFrom(k.publicKeyBase64), Buffer.from(signature!, "base64"))).toBe(true);
    // as owners check it: by key id, against the intent as parsed
    for (const pub of [k.publicKeyPem, k.publicKeyBase64]) {
      expect(verifyIntentSignature(intent, v.expected.header, new Map([[k.keyId, publicKeyFrom(pub)]]))).toEqual({ ok: true, keyId: k.keyId });
    }
    const changed = { ...intent, baseVersion: '"v4"' };
    expect(verifyIntentSignature(changed, v.expected.header, new Map([[k.keyId, publicKeyFrom(k.publicKeyPem)]]))).toMatchObject({ ok: false });
    // as admission checks it: over the canonical bytes it computed once
    const keys = new Map([[k.keyId, publicKeyFrom(k.publicKeyPem)]]);
    expect(verifySignatureOver(Buffer.from(v.expected.canonical, "utf8"), v.expected.header, keys)).toEqual({ ok: true, keyId: k.keyId });
    expect(verifySignatureOver(signedBytes(changed), v.expected.header, keys)).toEqual(verifyIntentSignature(changed, v.expected.header, keys));
    expect(verifySignatureOver(signedBytes(intent), undefined, keys)).toEqual(verifyIntentSignature(intent, undefined, keys));
  });

  it("the same intent under two keys, or with one member more, has another signature", () => {
    const header = (name: string) => {
      const v = file.vectors.find((x) => x.name === name);
      if (!v || v.expected.error !== undefined) throw new Error(`no vector ${name}`);
      return v.expected.header;
    };
    const base = header("refund: a whole intent, no toolCallId");
    expect(header("refund: the same intent signed with the RFC 8032 key")).not.toBe(base);
    expect(header("refund: with toolCallId")).not.toBe(base);
    expect(header("unknown member: a member the schema does not declare is covered too")).not.toBe(base);
  });

  it("the audience vector: the audience is signed, so the same bytes for another deployment (or none) do not verify", () => {
    const v = file.vectors.find((x) => x.name.startsWith("audience:"));
    if (!v || v.expected.error !== undefined) throw new Error("no audience vector");
    const intent = JSON.parse(v.intentJson) as Record<string, unknown>;
    expect(intent.audience).toBe("acme:billing/prod-eu-1");
    const keys = new Map([[v.keyId, publicKeyFrom(keyOf(v.keyId).publicKeyPem)]]);
    expect(verifyIntentSignature(intent, v.expected.header, keys)).toMatchObject({ ok: true });
    expect(verifyIntentSignature({ ...intent, audience: "acme:billing/staging" }, v.expected.header, keys)).toMatchObject({ ok: false });
    const { audience: _, ...without } = intent;
    expect(verifyIntentSignature(without, v.expected.header, keys)).toMatchObject({ ok: false });
  });

  it("a signer is refused at preparation for a bad key id or a key that is not Ed25519, naming the field", () => {
    const k = file.keys[0]!;
    expect(() => prepareSigner({ keyId: "bad key id", privateKey: k.privateKeyPem })).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "keyId" } }));
    const rsa = generateKeyPairSync("rsa", { modulusLength: 1024 }).privateKey;
    expect(() => prepareSigner({ keyId: "k1", privateKey: rsa })).toThrow(expect.objectContaining({ code: "config_invalid", context: { field: "privateKey" } }));
    expect(prepareSigner({ keyId: k.keyId, privateKey: k.privateKeyPem }).privateKey.asymmetricKeyType).toBe("ed25519");
  });

  it("a signer whose key is not a private key (a file of something else, the public key, an encrypted PEM) is refused config_invalid naming privateKey, never quoting it", () => {
    const k = file.keys[0]!;
    const pair = generateKeyPairSync("ed25519");
    const encrypted = pair.privateKey.export({ format: "pem", type: "pkcs8", cipher: "aes-256-cbc", passphrase: "pass-phrase-1" }).toString();
    const wrong = ["TOPSECRET-not-a-pem-0123456789", pair.publicKey.export({ format: "pem", type: "spki" }).toString(), encrypted, pair.publicKey, 12345 as never];
    for (const privateKey of wrong) {
      let thrown: unknown;
      try {
        prepareSigner({ keyId: k.keyId, privateKey });
      } catch (err) {
        thrown = err;
      }
      expect(thrown, String(privateKey)).toMatchObject({ code: "config_invalid", context: { field: "privateKey" } });
      const message = (thrown as Error).message;
      expect(message).toMatch(/^signing key \(privateKey\) must be an Ed25519 private key/);
      for (const secret of ["TOPSECRET", "12345", "MC4CAQ", "MIGb"]) expect(message).not.toContain(secret);
    }
  });

  it("a registry key that is not Ed25519 is refused when loaded, and one that slipped in refuses every signature without throwing", () => {
    const rsa = generateKeyPairSync("rsa", { modulusLength: 512 });
    const x25519 = generateKeyPairSync("x25519");
    for (const { publicKey } of [rsa, x25519]) {
      expect(() => publicKeyFrom(publicKey.export({ type: "spki", format: "pem" }).toString())).toThrow(/must be Ed25519/);
    }
    // A 64-byte RSA-512 signature has the header's shape: with the key accepted, it verified.
    const intent = { intentId: "i-1" };
    const sig = sign("sha256", Buffer.from(canonicalJson(intent), "utf8"), rsa.privateKey).toString("base64");
    expect(sig).toMatch(/^[A-Za-z0-9+/]{86}==$/);
    expect(verifyIntentSignature(intent, `ed25519 k1 ${sig}`, new Map([["k1", rsa.publicKey]]))).toMatchObject({ ok: false });
    // An X25519 key made verify throw, which held the partition's intake on the record.
    expect(verifyIntentSignature(intent, `ed25519 k1 ${sig}`, new Map([["k1", x25519.publicKey]]))).toMatchObject({ ok: false });
  });

  it("a registry key that is the agent's private key (PKCS#8, encrypted, OpenSSH) is refused, naming the field, never quoting it: owners hold public keys only", () => {
    const pair = generateKeyPairSync("ed25519");
    const pkcs8 = pair.privateKey.export({ format: "pem", type: "pkcs8" }).toString();
    const encrypted = pair.privateKey.export({ format: "pem", type: "pkcs8", cipher: "aes-256-cbc", passphrase: "pass-phrase-1" }).toString();
    const openssh = "-----BEGIN OPENSSH PRIVATE KEY-----\nb3BlbnNzaC1rZXktdjEAAAAA\n-----END OPENSSH PRIVATE KEY-----";
    const registry = (publicKey: string) => ({ agents: { a: { keys: [{ id: "k1", publicKey }], tools: ["t"], replyTopic: "writ.replies.a" } } });
    for (const key of [pkcs8, encrypted, openssh]) {
      let thrown: unknown;
      try {
        AgentRegistry.from(registry(key));
      } catch (err) {
        thrown = err;
      }
      expect(thrown, key.split("\n")[0]).toMatchObject({ code: "config_invalid" });
      const message = (thrown as Error).message;
      expect(message).toContain("agents.a.keys.0.publicKey: holds a private key");
      expect(message).not.toContain(key.split("\n")[1]!.slice(0, 16));
    }
    // its public half is the registry's
    expect(() => AgentRegistry.from(registry(pair.publicKey.export({ format: "pem", type: "spki" }).toString()))).not.toThrow();
  });

  // A rotation adds the new key under a new id. Listed under the id of the key it replaces, the later key took the id's
  // place silently: agents still signing with the old key were dead-lettered `unauthenticated` at the owners' roll.
  it("a key id listed twice under one agent is refused, naming the field: one id, one key", () => {
    const [older, newer] = [generateKeyPairSync("ed25519"), generateKeyPairSync("ed25519")].map((p) => p.publicKey.export({ format: "pem", type: "spki" }).toString());
    const registry = (ids: string[]) => ({ agents: { a: { keys: [{ id: ids[0]!, publicKey: older! }, { id: ids[1]!, publicKey: newer! }], tools: ["t"], replyTopic: "writ.replies.a" } } });
    expect(() => AgentRegistry.from(registry(["2026-11", "2026-11"]))).toThrow(/agents\.a\.keys\.1\.id: key id 2026-11 is listed twice/);
    expect(AgentRegistry.from(registry(["2026-11", "2027-02"])).get("a")!.keys.size).toBe(2);
  });

  it("is the file scripts/generate-signature-vectors.ts writes", () => {
    expect(text).toBe(render());
  });
});
