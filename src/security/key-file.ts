// A signing key's PEM file, read as a key file is read by whoever signs (the MCP server's WRIT_MCP_SIGNING_KEY_FILE,
// the writ commands' --signing-key): a regular file only, bounded, and no message quoting what it holds.
import { closeSync, constants, fstatSync, openSync, readSync, statSync } from "node:fs";

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
