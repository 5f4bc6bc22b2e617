import { KeyObject, createPrivateKey, createPublicKey, sign, verify } from "node:crypto";
import { canonicalJson } from "../canonical-json.ts";
import { WritError } from "../errors.ts";

/**
 * Header carrying an intent's signature: `ed25519 <key id> <base64 signature>`.
 * The signature is Ed25519 (RFC 8032) over the UTF-8 bytes of the intent's
 * canonical JSON (RFC 8785 JCS, as the intent key's bytes are; see
 * {@link canonicalJson} and the wire contract): every field the intent carries
 * is covered, so a record whose value was changed, or that gained a field,
 * fails to verify.
 */
export const SIGNATURE_HEADER = "writ-signature";

/** A signing key of an agent: the key id the agent registry knows it by, and its private key. */
export interface IntentSigner {
  keyId: string;
  /** PEM (PKCS#8) text or a KeyObject. */
  privateKey: string | KeyObject;
}

/**
 * The bytes an intent's signature covers. Throws a non-retriable WritError
 * (`not_canonical`, `input_too_deep`) for a value with no canonical form: such
 * an intent cannot be signed, and owners refuse it.
 */
export function signedBytes(intent: unknown): Buffer {
  return Buffer.from(canonicalJson(intent), "utf8");
}

/**
 * `signer` checked, its key parsed once: a client prepares its signer at start, so a bad key id or key fails
 * there (config_invalid, naming the field), and each submit signs without parsing PEM again.
 */
export function prepareSigner(signer: IntentSigner): IntentSigner & { privateKey: KeyObject } {
  if (!/^[A-Za-z0-9._:-]{1,64}$/.test(signer.keyId)) {
    throw new WritError("config_invalid", "signing key id must be 1–64 of A-Z a-z 0-9 . _ : -", { retriable: false, context: { field: "keyId" } });
  }
  const refuse = (why: string): WritError =>
    new WritError("config_invalid", `signing key (privateKey) must be an Ed25519 private key (PEM, PKCS#8): ${why}`, { retriable: false, context: { field: "privateKey" } });
  let key: unknown = signer.privateKey;
  if (typeof key === "string") {
    try {
      key = createPrivateKey(key);
    } catch (err) {
      // Node's code only (ERR_OSSL_UNSUPPORTED, ERR_MISSING_PASSPHRASE): some of its messages quote the input.
      throw refuse(`Node could not read it as one (${(err as { code?: unknown }).code ?? "unreadable"})`);
    }
  }
  if (!(key instanceof KeyObject)) throw refuse(`got ${key === null ? "null" : typeof key}`);
  // A public key would pass here and fail every submit's signing instead.
  if (key.type !== "private" || key.asymmetricKeyType !== "ed25519") throw refuse(`got a ${key.type} ${key.asymmetricKeyType ?? "symmetric"} key`);
  return { keyId: signer.keyId, privateKey: key };
}

/** The header value for `intent`, signed with `signer`'s Ed25519 key. */
export function signIntent(intent: unknown, signer: IntentSigner): string {
  const { keyId, privateKey } = prepareSigner(signer);
  return `ed25519 ${keyId} ${sign(null, signedBytes(intent), privateKey).toString("base64")}`;
}

/** An Ed25519 public key from PEM (SPKI) text or the 32 raw bytes in base64. */
export function publicKeyFrom(text: string): KeyObject {
  const trimmed = text.trim();
  // createPublicKey takes a private key too, deriving its public half: the registry would then quietly hold an
  // agent's signing key, and whoever reads it (owners' hosts, a ConfigMap) could sign as that agent.
  if (/-----BEGIN [A-Z0-9 ]*PRIVATE KEY-----/.test(trimmed)) {
    throw new WritError("config_invalid", "holds a private key: give the agent's public key (PEM, -----BEGIN PUBLIC KEY-----, or its 32 raw bytes in base64); the private key stays with the agent", { retriable: false });
  }
  if (trimmed.startsWith("-----BEGIN")) {
    const key = createPublicKey(trimmed);
    // Another type's key would verify other signatures (a weak RSA key's 64-byte ones), or make verify throw.
    if (key.asymmetricKeyType !== "ed25519") {
      throw new WritError("config_invalid", `an agent's public key must be Ed25519, not ${key.asymmetricKeyType ?? "an unknown type"}`, { retriable: false });
    }
    return key;
  }
  const raw = Buffer.from(trimmed, "base64");
  if (raw.length !== 32) throw new WritError("config_invalid", "an Ed25519 public key is PEM or 32 raw bytes in base64", { retriable: false });
  // SPKI DER prefix for Ed25519 (RFC 8410): SEQUENCE { SEQUENCE { OID 1.3.101.112 } BIT STRING }.
  const der = Buffer.concat([Buffer.from("302a300506032b6570032100", "hex"), raw]);
  return createPublicKey({ key: der, format: "der", type: "spki" });
}

export type SignatureCheck = { ok: true; keyId: string } | { ok: false; reason: string };

/**
 * Checks a record's signature header against an agent's keys (several during
 * a rotation). The header is parsed with bounds: it is hostile input.
 */
export function verifyIntentSignature(rawIntent: unknown, header: string | undefined, keys: ReadonlyMap<string, KeyObject>): SignatureCheck {
  const parsed = parseSignatureHeader(header, keys);
  if (!parsed.ok) return parsed;
  let bytes: Buffer;
  try {
    bytes = signedBytes(rawIntent);
  } catch (err) {
    return { ok: false, reason: `the intent has no canonical form, so no signature can cover it: ${(err as Error).message}`.slice(0, 1000) };
  }
  return verifyParsed(bytes, parsed);
}

/**
 * {@link verifyIntentSignature} over bytes already computed: `bytes` must be
 * {@link signedBytes} of the record (the UTF-8 of its canonical JSON), for a
 * caller that canonicalised the record already and need not do it again.
 */
export function verifySignatureOver(bytes: Buffer, header: string | undefined, keys: ReadonlyMap<string, KeyObject>): SignatureCheck {
  const parsed = parseSignatureHeader(header, keys);
  return parsed.ok ? verifyParsed(bytes, parsed) : parsed;
}

type ParsedSignature = { ok: true; keyId: string; key: KeyObject; sig: Buffer };

function parseSignatureHeader(header: string | undefined, keys: ReadonlyMap<string, KeyObject>): ParsedSignature | { ok: false; reason: string } {
  if (header === undefined) return { ok: false, reason: "the intent is not signed (no writ-signature header)" };
  if (header.length > 256) return { ok: false, reason: "the signature header is too long" };
  const parts = header.split(" ");
  if (parts.length !== 3 || parts[0] !== "ed25519") return { ok: false, reason: "the signature header is not `ed25519 <key id> <base64>`" };
  const keyId = parts[1]!;
  const key = keys.get(keyId);
  if (!key) return { ok: false, reason: `key ${keyId.slice(0, 64)} is not registered for this agent` };
  // Strict: Buffer.from(…, "base64") skips characters it does not know, so one signature would have many spellings.
  if (!/^[A-Za-z0-9+/]{86}==$/.test(parts[2]!)) return { ok: false, reason: "an Ed25519 signature is 64 bytes in padded base64" };
  return { ok: true, keyId, key, sig: Buffer.from(parts[2]!, "base64") };
}

function verifyParsed(bytes: Buffer, { keyId, key, sig }: ParsedSignature): SignatureCheck {
  // A throw here would read as the registry being unreachable and hold the partition's intake on this record.
  if (key.asymmetricKeyType !== "ed25519") return { ok: false, reason: `key ${keyId.slice(0, 64)} is not an Ed25519 key` };
  try {
    return verify(null, bytes, key, sig) ? { ok: true, keyId } : { ok: false, reason: "the signature does not match the intent" };
  } catch (err) {
    return { ok: false, reason: `the signature could not be checked: ${(err as Error).message}`.slice(0, 500) };
  }
}
