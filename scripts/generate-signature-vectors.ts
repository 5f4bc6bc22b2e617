// Writes test/fixtures/signature-vectors.json: golden vectors of intent signing
// (the `writ-signature` header, src/security/signing.ts), computed by the
// TypeScript implementation, that every other client (python/, and whatever
// comes next) must reproduce byte for byte. Ed25519 (RFC 8032) is
// deterministic: a fixed key and a fixed intent give a fixed signature.
// Run: node scripts/generate-signature-vectors.ts [--check]
//
// The keys here are TEST KEYS, published in this repository: never register
// them with a real deployment.
//
// CHANGING AN EXPECTED VALUE IS A WIRE-CONTRACT CHANGE (docs/wire-contract.md
// §7): owners verify every signature against the canonical JSON (RFC 8785) of
// the intent as it is on the wire, so a header that moves breaks every
// deployed signing client. Add vectors freely.
//
// `--check` writes nothing and exits 1 when the file differs from what this
// script would write (test/unit/signature-vectors.test.ts and
// python/tests/test_signing.py check every vector on their own as well).
import { createPrivateKey, createPublicKey, sign, type KeyObject } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { canonicalJson } from "../src/canonical-json.ts";
import { SIGNATURE_HEADER, signIntent } from "../src/security/signing.ts";

export const SIGNATURE_VECTORS_FILE = join(import.meta.dirname, "..", "test", "fixtures", "signature-vectors.json");

/** PKCS#8 DER prefix of an Ed25519 private key (RFC 8410): the 32-byte seed follows. */
const PKCS8_ED25519_PREFIX = Buffer.from("302e020100300506032b657004220420", "hex");

/** The Ed25519 private key whose RFC 8032 secret (the seed) is `seed`. */
export function privateKeyFromSeed(seed: Buffer): KeyObject {
  if (seed.length !== 32) throw new Error("an Ed25519 seed is 32 bytes");
  return createPrivateKey({ key: Buffer.concat([PKCS8_ED25519_PREFIX, seed]), format: "der", type: "pkcs8" });
}

/** RFC 8032 section 7.1, TEST 1 (the empty message): its secret key, as published. */
const RFC8032_TEST1_SEED = "9d61b19deffd5a60ba844af492ec2cc44449c5697b326919703bac031cae7f60";

const KEYS = [
  // RFC 8032's TEST 1 key, so the vectors' first key can be checked against the RFC as well.
  { keyId: "test-rfc8032-1", seedHex: RFC8032_TEST1_SEED },
  { keyId: "test-2026-11", seedHex: "000102030405060708090a0b0c0d0e0f101112131415161718191a1b1c1d1e1f" },
];

interface VectorInput {
  name: string;
  keyId: string;
  /** The intent as JSON text, parsed by each language's standard JSON parser (JSON.parse, Python's json.loads). */
  intentJson: string;
  /** Set on an intent with no canonical form: signing it must fail with this code, in every language. */
  error?: "not_canonical";
}

const refundIntent = {
  intentId: "7d0f2a4e-3a59-4c1b-9a52-2f7d6c1e8b10",
  intentKey: "5b1e0c7a2f4d6e8a9c0b1d2e3f405162738495a6b7c8d9eafb0c1d2e3f405162",
  entity: { type: "payment", id: "pay_1001" },
  tool: "refund_payment",
  agent: { id: "billing-agent", runId: "run-42", stepId: "once-per-run" },
  baseVersion: '"v3"',
  delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 5000, reason: "damaged" } }],
  params: { amountCents: 5000, reason: "damaged", note: "box crushed" },
  replyTo: "writ.replies.billing-agent",
  createdAt: "2026-11-05T10:15:30.123Z",
};

const json = (v: unknown) => JSON.stringify(v);

const INPUTS: VectorInput[] = [
  { name: "refund: a whole intent, no toolCallId", keyId: "test-2026-11", intentJson: json(refundIntent) },
  { name: "refund: the same intent signed with the RFC 8032 key", keyId: "test-rfc8032-1", intentJson: json(refundIntent) },
  {
    name: "refund: with toolCallId",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, agent: { ...refundIntent.agent, toolCallId: "call_abc123" } }),
  },
  {
    name: "text: non-ASCII, a surrogate pair, control characters, slash and U+2028 in free text",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, params: { ...refundIntent.params, note: "colis écrasé 漢字 😀 tab\there\nnew line \u0001 a/b \u2028 \"quoted\" back\\slash" } }),
  },
  {
    name: "numbers: 100.0, -0.0, 1e21, 1.5e-7, 2^53 + 1 and 0.1 as JSON text",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, params: { ...refundIntent.params, extra: "NUMBERS" } }).replace(
      '"NUMBERS"',
      '{"hundred":100.0,"minusZero":-0.0,"big":1e21,"small":1.5e-7,"beyond":9007199254740993,"tenth":0.1,"long":12345678901234567890}',
    ),
  },
  {
    name: "order: members in another order, keys that look like indices",
    keyId: "test-2026-11",
    intentJson:
      '{"params":{"reason":"damaged","amountCents":5000,"10":"ten","9":"nine","":"empty","ｚ":"fullwidth","😀":"emoji"},"tool":"refund_payment","createdAt":"2026-11-05T10:15:30.123Z",' +
      '"replyTo":"writ.replies.billing-agent","delta":[{"value":{"reason":"damaged","amountCents":5000},"path":"/refunds/-","op":"add"}],"baseVersion":"\\"v3\\"",' +
      '"agent":{"stepId":"once-per-run","runId":"run-42","id":"billing-agent"},"entity":{"id":"pay_1001","type":"payment"},' +
      '"intentKey":"5b1e0c7a2f4d6e8a9c0b1d2e3f405162738495a6b7c8d9eafb0c1d2e3f405162","intentId":"7d0f2a4e-3a59-4c1b-9a52-2f7d6c1e8b10"}',
  },
  {
    name: "unknown member: a member the schema does not declare is covered too",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, futureField: { hint: "kept", n: [1, 2, 3] } }),
  },
  {
    name: "refused: a lone surrogate in free text",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, params: { ...refundIntent.params, note: "LONE" } }).replace("LONE", "broken \\ud800 text"),
    error: "not_canonical",
  },
  {
    name: "refused: 1e400 (Infinity) in the delta",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, delta: [{ op: "replace", path: "/limit", value: "INF" }] }).replace('"INF"', "1e400"),
    error: "not_canonical",
  },
  {
    name: "audience: signed for one deployment (its owners' WRIT_SIGNING_AUDIENCE), the member covered as any other",
    keyId: "test-2026-11",
    intentJson: json({ ...refundIntent, audience: "acme:billing/prod-eu-1" }),
  },
];

function errorCode(fn: () => unknown): string | null {
  try {
    fn();
    return null;
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
}

export function build(): unknown {
  const keys = KEYS.map((k) => {
    const privateKey = privateKeyFromSeed(Buffer.from(k.seedHex, "hex"));
    const publicKey = createPublicKey(privateKey);
    const raw = publicKey.export({ format: "der", type: "spki" }).subarray(-32);
    return {
      keyId: k.keyId,
      seedBase64: Buffer.from(k.seedHex, "hex").toString("base64"),
      privateKeyPem: privateKey.export({ format: "pem", type: "pkcs8" }).toString(),
      publicKeyPem: publicKey.export({ format: "pem", type: "spki" }).toString(),
      publicKeyBase64: raw.toString("base64"),
      privateKey,
    };
  });
  const byId = new Map(keys.map((k) => [k.keyId, k]));
  const vectors = INPUTS.map((v) => {
    const key = byId.get(v.keyId);
    if (!key) throw new Error(`vector "${v.name}": no key ${v.keyId}`);
    const intent = JSON.parse(v.intentJson) as unknown;
    if (v.error !== undefined) {
      const codes = [errorCode(() => canonicalJson(intent)), errorCode(() => signIntent(intent, { keyId: key.keyId, privateKey: key.privateKey }))];
      if (codes.some((c) => c !== v.error)) throw new Error(`vector "${v.name}": expected signing to fail with ${v.error}, got ${codes.join(", ")}`);
      const { error, ...input } = v;
      return { ...input, expected: { error } };
    }
    return { ...v, expected: { canonical: canonicalJson(intent), header: signIntent(intent, { keyId: key.keyId, privateKey: key.privateKey }) } };
  });
  const rfc = privateKeyFromSeed(Buffer.from(RFC8032_TEST1_SEED, "hex"));
  return {
    about:
      "Golden vectors of intent signing (docs/wire-contract.md §7), computed by src/security/signing.ts. The header writ-signature is `ed25519 <key id> <base64 signature>`, the signature Ed25519 (RFC 8032, deterministic) over the UTF-8 of the canonical JSON (RFC 8785) of the intent as sent. Every client must reproduce expected.canonical and expected.header from intentJson (JSON text for each language's standard parser) and the key; a vector with expected.error has no canonical form and must not be signed. The keys are TEST KEYS, published here: never register them anywhere real. Changing an expected value is a wire-contract change. Regenerate: node scripts/generate-signature-vectors.ts",
    generatedBy: "scripts/generate-signature-vectors.ts",
    header: SIGNATURE_HEADER,
    algorithm: "ed25519",
    rfc8032: {
      about: "RFC 8032 section 7.1 TEST 1 (the empty message), signed here with Node's Ed25519",
      seedHex: RFC8032_TEST1_SEED,
      publicKeyHex: createPublicKey(rfc).export({ format: "der", type: "spki" }).subarray(-32).toString("hex"),
      messageHex: "",
      signatureHex: sign(null, Buffer.alloc(0), rfc).toString("hex"),
    },
    keys: keys.map(({ privateKey: _, ...k }) => k),
    vectors,
  };
}

export function render(): string {
  return `${JSON.stringify(build(), null, 2)}\n`;
}

if (import.meta.main) {
  const text = render();
  if (process.argv.includes("--check")) {
    let current = "";
    try {
      current = readFileSync(SIGNATURE_VECTORS_FILE, "utf8");
    } catch {
      // missing: differs
    }
    if (current !== text) {
      console.error(`${SIGNATURE_VECTORS_FILE} is not what scripts/generate-signature-vectors.ts writes (a changed vector is a wire-contract change)`);
      process.exit(1);
    }
    console.log(`${SIGNATURE_VECTORS_FILE} is up to date`);
  } else {
    writeFileSync(SIGNATURE_VECTORS_FILE, text);
    console.log(`wrote ${SIGNATURE_VECTORS_FILE}`);
  }
}
