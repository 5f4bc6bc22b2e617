// A signing key's PEM file, read as a key file is read by whoever signs (the MCP server's WRIT_MCP_SIGNING_KEY_FILE,
// the writ commands' --signing-key): a regular file only, bounded, and no message quoting what it holds.
import { closeSync, constants, fstatSync, openSync, readSync, statSync } from "node:fs";
import { WritError } from "../errors.ts";
import { printable } from "../printable.ts";
import { Audience } from "../schemas/common.ts";
import { type IntentSigner, prepareSigner } from "./signing.ts";

/** Largest key file read: an Ed25519 PEM is about 120 bytes; a path to something else is refused unread. */
export const MAX_KEY_FILE_BYTES = 16 * 1024;

/**
 * The text of the key file at `path`, at most {@link MAX_KEY_FILE_BYTES}: a regular file only. A FIFO or a device,
 * whose size says nothing (/dev/zero has no end; /dev/stdin is the MCP stream under --stdio; opening some devices
 * does something), is refused unopened where stat tells, and in any case unread: the check that counts is made on
 * the open descriptor, which is read. A symlink to a regular file (a mounted secret) is followed. Throws an Error
 * whose message names the path and why, never anything of the file's content.
 */
export function readKeyFile(path: string): string {
  const notRegular = () => new Error(`${path} is not a regular file: a PEM file holding an Ed25519 private key is`);
  const tooLarge = () => new Error(`${path} is larger than ${MAX_KEY_FILE_BYTES} bytes: not an Ed25519 private key`);
  const unreadable = (err: unknown) => new Error(`${path} cannot be read (${(err as NodeJS.ErrnoException).code ?? "unreadable"})`);
  let fd: number;
  try {
    if (!statSync(path).isFile()) throw notRegular();
    // Non-blocking: a FIFO put in its place since the stat would otherwise wait for a writer (regular files ignore it).
    fd = openSync(path, constants.O_RDONLY | constants.O_NONBLOCK | constants.O_NOCTTY);
  } catch (err) {
    throw (err as NodeJS.ErrnoException).code === undefined ? err : unreadable(err);
  }
  try {
    const stat = fstatSync(fd);
    if (!stat.isFile()) throw notRegular();
    if (stat.size > MAX_KEY_FILE_BYTES) throw tooLarge();
    // Read to its end, never past the bound: a file whose size says 0 (/proc's) may hold more.
    const buffer = Buffer.alloc(MAX_KEY_FILE_BYTES + 1);
    let length = 0;
    for (let n; length < buffer.length && (n = readSync(fd, buffer, length, buffer.length - length, null)) > 0; ) length += n;
    if (length > MAX_KEY_FILE_BYTES) throw tooLarge();
    return buffer.subarray(0, length).toString("utf8");
  } catch (err) {
    throw (err as NodeJS.ErrnoException).code === undefined ? err : unreadable(err);
  } finally {
    try {
      closeSync(fd);
    } catch {
      // nothing to do: the file was read, or its error is the one that counts
    }
  }
}

/** How a signer's caller words a refusal of its inputs: flags for the writ commands, variables for the MCP server. */
export interface SigningRefusals {
  /** The key file and the key id go together: `missing` is the one not given. */
  pair(missing: "keyFile" | "keyId"): Error;
  /** An input refused; `detail` says why (for the key file it starts with the path), never quoting the key. */
  refused(input: "keyFile" | "keyId" | "audience", detail: string): Error;
}

/**
 * The signer of a key file (an Ed25519 PKCS#8 PEM, read by {@link readKeyFile}) and the key's id in the owners'
 * agent registry, given together or not at all (undefined: the caller does not sign). Checked before anything
 * connects; each refusal worded by the caller's `refusals`.
 */
export function signerOf(keyFile: string | undefined, keyId: string | undefined, refusals: SigningRefusals): IntentSigner | undefined {
  if ((keyFile === undefined) !== (keyId === undefined)) throw refusals.pair(keyId === undefined ? "keyId" : "keyFile");
  if (keyFile === undefined || keyId === undefined) return undefined;
  let pem: string;
  try {
    pem = readKeyFile(keyFile);
  } catch (err) {
    throw refusals.refused("keyFile", (err as Error).message);
  }
  try {
    return prepareSigner({ keyId, privateKey: pem });
  } catch (err) {
    if (!(err instanceof WritError)) throw err;
    throw err.context.field === "keyId" ? refusals.refused("keyId", err.message) : refusals.refused("keyFile", `${keyFile}: ${err.message}`);
  }
}

/** The audience a signer signs for, checked as the owners check theirs. */
export function audienceOf(value: string, refusals: SigningRefusals): string {
  const checked = Audience.safeParse(value);
  if (!checked.success) throw refusals.refused("audience", `1–128 of A-Z a-z 0-9 . _ : / -, got "${printable(value.slice(0, 128))}"`);
  return checked.data;
}
