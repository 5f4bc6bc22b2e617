/**
 * Kafka's four compression codecs for kafkajs.
 *
 * Why this exists: kafkajs 2.2.4 implements only gzip. Its `CompressionCodecs`
 * entries for snappy, lz4 and zstd throw `KafkaJSNotImplemented` the moment a
 * fetched record batch carries one of those codecs in its attributes. A foreign
 * producer configured with `compression.type=lz4` (a common librdkafka and Java
 * setting), snappy or zstd therefore makes every kafkajs consumer of that
 * partition fail on the batch, and writ's owner crash-loops on it.
 * {@link registerCompressionCodecs} fills those entries in, and replaces
 * kafkajs's gzip codec with one whose decompression is bounded.
 *
 * Implementations:
 * - gzip: `node:zlib`, as kafkajs does, plus `maxOutputLength`.
 * - snappy: the `snappy` package (napi-rs, Rust `snap`). Kafka's Java client
 *   writes snappy-java's "xerial" framing (an 8-byte magic, two version ints,
 *   then length-prefixed raw snappy chunks of 32 KiB input); librdkafka and
 *   others may write one raw snappy block. Both are read; xerial framing with
 *   32 KiB chunks is written, exactly what the Java producer writes. (Not
 *   kafkajs-snappy: its snappyjs never returns on a 7-byte block whose literal
 *   length is negative, a hang any producer can cause.)
 * - lz4: Kafka uses the LZ4 *frame* format (record batch v2: the standard
 *   frame; message format v0: the same frame with the broken header checksum
 *   of KAFKA-3160, an xxh32 that also covered the 4 magic bytes). Blocks are
 *   (de)compressed by the `lz4-napi` package (napi-rs, Rust `lz4_flex`); the
 *   frame around them is scanned and written here: the scan enforces the size
 *   bound and accepts either header checksum, and what we write is what Kafka's
 *   `Lz4BlockOutputStream` writes (independent 64 KiB blocks, incompressible
 *   blocks stored, no checksums, no content size, the correct header checksum).
 * - zstd: `node:zlib` (libzstd inside Node >= 22.15 / 23.8). On an older Node
 *   decompression falls back to the pure-JS `fzstd`; compression then throws.
 *
 * Untrusted input: every decompression is capped at `maxDecompressedBytes` per
 * record batch (default {@link DEFAULT_MAX_DECOMPRESSED_BYTES}) and refused with
 * a {@link KafkaCompressionError} (reason `limit_exceeded`) before the memory is
 * allocated where the format declares sizes (snappy lengths, LZ4 block sizes,
 * zstd frame content sizes) and at the cap otherwise (zlib's `maxOutputLength`).
 * (LZ4's bound is the worst case of the blocks present, so it can refuse a
 * batch that is at most one block, 64 KiB in Kafka's framing, under the cap.)
 * Working memory besides the output stays bounded too: one LZ4 block (at most
 * 4 MiB), a zstd window of at most 128 MiB (libzstd's default windowLogMax,
 * also applied to fzstd). Corrupt input becomes a {@link KafkaCompressionError}
 * with reason `corrupt`. Both are non-retriable, since decoding the same bytes
 * again cannot succeed: kafkajs would neither retry the fetch nor restart its
 * consumer (its CRASH event would say `restart: false`), so the batch reader
 * {@link registerCompressionCodecs} installs puts a stand-in record in the
 * batch's place (src/kafka/unreadable-batches.ts).
 */
import { Buffer, constants as bufferConstants } from "node:buffer";
import { createRequire } from "node:module";
import { promisify } from "node:util";
import zlib from "node:zlib";
// kafkajs is CommonJS and its index spreads its errors into module.exports, so
// Node's ESM loader cannot see `CompressionCodecs` or the error classes as
// named exports: take them from the default export (the module.exports object).
import kafkajs from "kafkajs";
import { installUnreadableBatchGuard } from "./unreadable-batches.ts";

const require = createRequire(import.meta.url);

/** Per record batch; far above any batch writ produces, far below what exhausts a worker. */
export const DEFAULT_MAX_DECOMPRESSED_BYTES = 64 * 1024 * 1024;

export type KafkaCodecName = "gzip" | "snappy" | "lz4" | "zstd";

export interface CompressionCodecOptions {
  /**
   * Most bytes one compressed record batch (or legacy message set) may
   * decompress to; a batch that would exceed it is refused with a
   * `KafkaCompressionError` (reason `limit_exceeded`). Default 64 MiB.
   */
  maxDecompressedBytes?: number;
  /** Replace kafkajs's gzip codec, which inflates without a bound, by a bounded one (default true). */
  gzip?: boolean;
}

/** The shape kafkajs expects behind `CompressionCodecs[type]()`. */
export interface KafkaCodec {
  /** `encoder` is kafkajs's Encoder; only its `buffer` is read. */
  compress(encoder: { buffer: Buffer }): Promise<Buffer>;
  decompress(buffer: Buffer): Promise<Buffer>;
}

export type CompressionErrorReason = "limit_exceeded" | "corrupt" | "unavailable";

/**
 * A batch that cannot be (de)compressed: over the size limit, corrupt, or the
 * codec's library cannot load here. A `KafkaJSNonRetriableError`, so kafkajs
 * neither retries it nor restarts its consumer for it, and writ's
 * `isRetriable()` says no.
 */
export class KafkaCompressionError extends kafkajs.KafkaJSNonRetriableError {
  override readonly name = "KafkaCompressionError";
  readonly codec: KafkaCodecName;
  readonly reason: CompressionErrorReason;
  /** The limit in force, for `limit_exceeded`. */
  readonly limit: number | undefined;

  constructor(codec: KafkaCodecName, reason: CompressionErrorReason, message: string, opts: { cause?: unknown; limit?: number } = {}) {
    super(`${codec}: ${message}`);
    this.codec = codec;
    this.reason = reason;
    this.limit = opts.limit;
    if (opts.cause !== undefined) Object.defineProperty(this, "cause", { value: opts.cause, configurable: true, writable: true });
  }
}

function limitError(codec: KafkaCodecName, limit: number, what: string): KafkaCompressionError {
  return new KafkaCompressionError(
    codec,
    "limit_exceeded",
    `refusing to decompress: ${what} exceeds maxDecompressedBytes=${limit}`,
    { limit },
  );
}

function corrupt(codec: KafkaCodecName, message: string, cause?: unknown): KafkaCompressionError {
  const detail = cause === undefined ? "" : `: ${cause instanceof Error ? cause.message : String(cause)}`;
  return new KafkaCompressionError(codec, "corrupt", `corrupt compressed data (${message})${detail}`, cause === undefined ? {} : { cause });
}

function normalizeLimit(value: number | undefined): number {
  const limit = value ?? DEFAULT_MAX_DECOMPRESSED_BYTES;
  if (!Number.isSafeInteger(limit) || limit <= 0 || limit > bufferConstants.MAX_LENGTH) {
    throw new RangeError(`maxDecompressedBytes must be an integer in 1..${bufferConstants.MAX_LENGTH}, got ${String(value)}`);
  }
  return limit;
}

/** zlib's `maxOutputLength` overflow, thrown as RangeError ERR_BUFFER_TOO_LARGE. */
function isZlibTooLarge(err: unknown): boolean {
  return typeof err === "object" && err !== null && (err as { code?: unknown }).code === "ERR_BUFFER_TOO_LARGE";
}

// ---------------------------------------------------------------------------
// Lazily loaded libraries: a missing native binding must not break writ for
// the codecs it does not meet; it surfaces as `unavailable` on first use.

type SnappyLib = typeof import("snappy");
type Lz4Lib = typeof import("lz4-napi");
type FzstdLib = typeof import("fzstd");

type Loaded<T> = { ok: true; lib: T } | { ok: false; error: Error };

function lazy<T>(name: string): () => Loaded<T> {
  let loaded: Loaded<T> | undefined;
  return () => {
    if (loaded === undefined) {
      try {
        loaded = { ok: true, lib: require(name) as T };
      } catch (err) {
        loaded = { ok: false, error: err instanceof Error ? err : new Error(String(err)) };
      }
    }
    return loaded;
  };
}

const loadSnappy = lazy<SnappyLib>("snappy");
const loadLz4 = lazy<Lz4Lib>("lz4-napi");
const loadFzstd = lazy<FzstdLib>("fzstd");

function need<T>(codec: KafkaCodecName, pkg: string, load: () => Loaded<T>): T {
  const loaded = load();
  if (loaded.ok) return loaded.lib;
  throw new KafkaCompressionError(
    codec,
    "unavailable",
    `cannot load ${pkg} on ${process.platform}-${process.arch} (${loaded.error.message}); reinstall dependencies with optional dependencies enabled`,
    { cause: loaded.error },
  );
}

// ---------------------------------------------------------------------------
// gzip

const gzipAsync = promisify(zlib.gzip);
const unzipAsync = promisify(zlib.unzip) as (buf: Buffer, opts: zlib.ZlibOptions) => Promise<Buffer>;

/** gzip as kafkajs does it (`zlib.gzip` / `zlib.unzip`), with the inflated size capped. */
export function createGzipCodec(opts: Pick<CompressionCodecOptions, "maxDecompressedBytes"> = {}): KafkaCodec {
  const limit = normalizeLimit(opts.maxDecompressedBytes);
  return {
    async compress(encoder) {
      return gzipAsync(encoder.buffer);
    },
    async decompress(buffer) {
      try {
        return await unzipAsync(buffer, { maxOutputLength: limit });
      } catch (err) {
        if (isZlibTooLarge(err)) throw limitError("gzip", limit, "the inflated batch");
        throw corrupt("gzip", "zlib", err);
      }
    },
  };
}

// ---------------------------------------------------------------------------
// snappy

/** snappy-java's stream header: 0x82 "SNAPPY" 0x00, then int32 version and int32 compatible version (big-endian). */
const XERIAL_MAGIC = Buffer.from([0x82, 0x53, 0x4e, 0x41, 0x50, 0x50, 0x59, 0x00]);
const XERIAL_HEADER_LENGTH = 16;
/** snappy-java's SnappyOutputStream default block size, which Kafka's Java producer uses. */
const XERIAL_BLOCK_SIZE = 32 * 1024;

/** A raw snappy block starts with its uncompressed length as a little-endian base-128 varint (at most 2^32 - 1). */
function snappyUncompressedLength(block: Buffer): number {
  let result = 0;
  for (let i = 0; i < 5; i++) {
    const byte = block[i];
    if (byte === undefined) throw corrupt("snappy", "truncated length preamble");
    result += (byte & 0x7f) * 2 ** (7 * i);
    if (byte < 0x80) {
      if (result > 0xffffffff) throw corrupt("snappy", "length preamble over 2^32");
      return result;
    }
  }
  throw corrupt("snappy", "length preamble longer than 5 bytes");
}

/** The raw snappy chunks of a xerial stream, or the whole buffer when it is one raw block. */
function snappyChunks(buffer: Buffer): Buffer[] {
  if (buffer.length < XERIAL_HEADER_LENGTH || !buffer.subarray(0, XERIAL_MAGIC.length).equals(XERIAL_MAGIC)) return [buffer];
  const chunks: Buffer[] = [];
  let pos = XERIAL_HEADER_LENGTH;
  while (pos < buffer.length) {
    // a concatenated stream repeats the header (snappy-java skips it too); no chunk length starts with 0x82
    if (buffer.length - pos >= XERIAL_HEADER_LENGTH && buffer.subarray(pos, pos + XERIAL_MAGIC.length).equals(XERIAL_MAGIC)) {
      pos += XERIAL_HEADER_LENGTH;
      continue;
    }
    if (pos + 4 > buffer.length) throw corrupt("snappy", "truncated xerial chunk length");
    const length = buffer.readUInt32BE(pos);
    pos += 4;
    if (length > buffer.length - pos) throw corrupt("snappy", `xerial chunk of ${length} bytes past the end of the batch`);
    chunks.push(buffer.subarray(pos, pos + length));
    pos += length;
  }
  return chunks;
}

/** snappy (raw or xerial-framed) via the `snappy` package; lengths are checked against the limit before anything is inflated. */
export function createSnappyCodec(opts: Pick<CompressionCodecOptions, "maxDecompressedBytes"> = {}): KafkaCodec {
  const limit = normalizeLimit(opts.maxDecompressedBytes);
  return {
    async compress(encoder) {
      const snappy = need("snappy", "snappy", loadSnappy);
      const input = encoder.buffer;
      const header = Buffer.alloc(XERIAL_HEADER_LENGTH);
      XERIAL_MAGIC.copy(header, 0);
      header.writeInt32BE(1, 8); // version
      header.writeInt32BE(1, 12); // minimum compatible version
      const parts: Buffer[] = [header];
      for (let offset = 0; offset < input.length; offset += XERIAL_BLOCK_SIZE) {
        const block = await snappy.compress(input.subarray(offset, Math.min(input.length, offset + XERIAL_BLOCK_SIZE)));
        const length = Buffer.alloc(4);
        length.writeUInt32BE(block.length, 0);
        parts.push(length, block);
      }
      return Buffer.concat(parts);
    },
    async decompress(buffer) {
      const chunks = snappyChunks(buffer);
      let total = 0;
      for (const chunk of chunks) {
        total += snappyUncompressedLength(chunk);
        if (total > limit) throw limitError("snappy", limit, `the declared uncompressed length (${total}+ bytes)`);
      }
      const snappy = need("snappy", "snappy", loadSnappy);
      const out: Buffer[] = [];
      for (const chunk of chunks) {
        try {
          out.push((await snappy.uncompress(chunk, { asBuffer: true })) as Buffer);
        } catch (err) {
          throw corrupt("snappy", "snappy block", err);
        }
      }
      return out.length === 1 && out[0] !== undefined ? out[0] : Buffer.concat(out, total);
    },
  };
}

// ---------------------------------------------------------------------------
// lz4 (frame format)

const LZ4_MAGIC = 0x184d2204;

const XXH_P1 = 0x9e3779b1;
const XXH_P2 = 0x85ebca77;
const XXH_P3 = 0xc2b2ae3d;
const XXH_P4 = 0x27d4eb2f;
const XXH_P5 = 0x165667b1;

function rotl32(x: number, r: number): number {
  return ((x << r) | (x >>> (32 - r))) >>> 0;
}

function xxhRound(acc: number, input: number): number {
  return Math.imul(rotl32((acc + Math.imul(input, XXH_P2)) >>> 0, 13), XXH_P1) >>> 0;
}

/** XXH32, the hash the LZ4 frame format uses for its header checksum. Exported for tests. */
export function xxhash32(data: Uint8Array, seed = 0): number {
  const view = new DataView(data.buffer, data.byteOffset, data.byteLength);
  const len = data.length;
  let i = 0;
  let h: number;
  if (len >= 16) {
    let v1 = (seed + XXH_P1 + XXH_P2) >>> 0;
    let v2 = (seed + XXH_P2) >>> 0;
    let v3 = seed >>> 0;
    let v4 = (seed - XXH_P1) >>> 0;
    for (; i <= len - 16; i += 16) {
      v1 = xxhRound(v1, view.getUint32(i, true));
      v2 = xxhRound(v2, view.getUint32(i + 4, true));
      v3 = xxhRound(v3, view.getUint32(i + 8, true));
      v4 = xxhRound(v4, view.getUint32(i + 12, true));
    }
    h = (rotl32(v1, 1) + rotl32(v2, 7) + rotl32(v3, 12) + rotl32(v4, 18)) >>> 0;
  } else {
    h = (seed + XXH_P5) >>> 0;
  }
  h = (h + len) >>> 0;
  for (; i + 4 <= len; i += 4) h = Math.imul(rotl32((h + Math.imul(view.getUint32(i, true), XXH_P3)) >>> 0, 17), XXH_P4) >>> 0;
  for (; i < len; i++) h = Math.imul(rotl32((h + Math.imul(data[i] ?? 0, XXH_P5)) >>> 0, 11), XXH_P1) >>> 0;
  h = Math.imul(h ^ (h >>> 15), XXH_P2) >>> 0;
  h = Math.imul(h ^ (h >>> 13), XXH_P3) >>> 0;
  return (h ^ (h >>> 16)) >>> 0;
}

/** What a scan of one LZ4 frame found, before any decompression. */
export interface Lz4FrameScan {
  /** Offset just past the frame's EndMark (and content checksum); bytes after it are ignored, as Kafka's Java client does. */
  frameEnd: number;
  /** Upper bound of the decompressed size: Σ (stored block ? its size : the frame's block maximum). */
  maxDecompressedBytes: number;
  /** Which header checksum matched: the standard one, or KAFKA-3160's (xxh32 over the magic too). */
  headerChecksum: "standard" | "kafka-legacy";
  /** Where the header checksum byte sits, and its standard value (to repair a legacy header). */
  headerChecksumOffset: number;
  standardHeaderChecksum: number;
  blockMaxSize: number;
  blockIndependent: boolean;
}

/**
 * Validates an LZ4 frame's header and walks its block headers (no
 * decompression), throwing `corrupt` on anything malformed and
 * `limit_exceeded` as soon as the worst-case output passes `limit`.
 */
export function scanLz4Frame(buf: Buffer, limit: number): Lz4FrameScan {
  if (buf.length < 7) throw corrupt("lz4", `${buf.length}-byte frame is shorter than a frame header`);
  const magic = buf.readUInt32LE(0);
  if (magic !== LZ4_MAGIC) throw corrupt("lz4", `magic 0x${magic.toString(16)} is not an LZ4 frame's`);
  const flg = buf[4] ?? 0;
  const bd = buf[5] ?? 0;
  if (flg >> 6 !== 1) throw corrupt("lz4", `frame version ${flg >> 6}`);
  if (flg & 0x02) throw corrupt("lz4", "reserved FLG bit set");
  if (flg & 0x01) throw corrupt("lz4", "frame needs a dictionary (dictID), which Kafka never uses");
  if (bd & 0x8f) throw corrupt("lz4", "reserved BD bits set");
  const blockSizeId = (bd >> 4) & 0x07;
  if (blockSizeId < 4) throw corrupt("lz4", `block maximum size id ${blockSizeId}`);
  const blockMaxSize = 1 << (2 * blockSizeId + 8);
  const blockChecksum = (flg & 0x10) !== 0;
  const contentSize = (flg & 0x08) !== 0;
  const contentChecksum = (flg & 0x04) !== 0;
  let pos = 6;
  if (contentSize) {
    if (buf.length < pos + 9) throw corrupt("lz4", "truncated content size");
    const declared = buf.readBigUInt64LE(pos);
    if (declared > BigInt(limit)) throw limitError("lz4", limit, `the frame's declared content size (${declared} bytes)`);
    pos += 8;
  }
  const headerChecksumOffset = pos;
  const hc = buf[pos];
  pos += 1;
  const standardHeaderChecksum = (xxhash32(buf.subarray(4, headerChecksumOffset)) >>> 8) & 0xff;
  let headerChecksum: Lz4FrameScan["headerChecksum"];
  if (hc === standardHeaderChecksum) headerChecksum = "standard";
  else if (hc === ((xxhash32(buf.subarray(0, headerChecksumOffset)) >>> 8) & 0xff)) headerChecksum = "kafka-legacy";
  else throw corrupt("lz4", "frame header checksum mismatch");

  let maxDecompressedBytes = 0;
  for (;;) {
    if (pos + 4 > buf.length) throw corrupt("lz4", "truncated block header (no EndMark)");
    const word = buf.readUInt32LE(pos);
    pos += 4;
    if (word === 0) {
      if (contentChecksum) {
        if (pos + 4 > buf.length) throw corrupt("lz4", "truncated content checksum");
        pos += 4;
      }
      break;
    }
    const size = word & 0x7fffffff;
    const stored = word >>> 31 === 1;
    if (size > blockMaxSize) throw corrupt("lz4", `block of ${size} bytes exceeds the frame's maximum ${blockMaxSize}`);
    const next = pos + size + (blockChecksum ? 4 : 0);
    if (next > buf.length) throw corrupt("lz4", "truncated block");
    pos = next;
    maxDecompressedBytes += stored ? size : blockMaxSize;
    if (maxDecompressedBytes > limit) {
      throw limitError("lz4", limit, `the frame's blocks (up to ${maxDecompressedBytes}+ bytes at ${blockMaxSize} per block)`);
    }
  }
  return {
    frameEnd: pos,
    maxDecompressedBytes,
    headerChecksum,
    headerChecksumOffset,
    standardHeaderChecksum,
    blockMaxSize,
    blockIndependent: (flg & 0x20) !== 0,
  };
}

/** Kafka's Lz4BlockOutputStream block size (BD 4 = 64 KiB). */
const LZ4_BLOCK_SIZE = 64 * 1024;
const LZ4_STORED_BLOCK = 0x80000000;

/** The frame header Kafka's Java producer writes: magic, FLG 0x60 (version 1, independent blocks, no checksums, no content size), BD 0x40, HC. */
function kafkaLz4Header(): Buffer {
  const header = Buffer.from([0x04, 0x22, 0x4d, 0x18, 0x60, 0x40, 0x00]);
  header[6] = (xxhash32(header.subarray(4, 6)) >>> 8) & 0xff;
  return header;
}
const LZ4_HEADER = kafkaLz4Header();

/**
 * LZ4 frames via `lz4-napi`. Writing builds the frame here, block by block with
 * lz4-napi's block compressor, because its frame encoder picks the block size
 * from the input (4 MiB blocks for large batches); reading scans the frame with
 * {@link scanLz4Frame} first, which bounds the output, then lets lz4-napi decode it.
 */
export function createLz4Codec(opts: Pick<CompressionCodecOptions, "maxDecompressedBytes"> = {}): KafkaCodec {
  const limit = normalizeLimit(opts.maxDecompressedBytes);
  return {
    async compress(encoder) {
      const lz4 = need("lz4", "lz4-napi", loadLz4);
      const input = encoder.buffer;
      const parts: Buffer[] = [LZ4_HEADER];
      for (let offset = 0; offset < input.length; offset += LZ4_BLOCK_SIZE) {
        const block = input.subarray(offset, Math.min(input.length, offset + LZ4_BLOCK_SIZE));
        // lz4-napi's block API prepends the uncompressed size (u32 LE); the frame format does not want it
        const compressed = (await lz4.compress(block)).subarray(4);
        const blockHeader = Buffer.alloc(4);
        if (compressed.length >= block.length) {
          // incompressible: store it, as Lz4BlockOutputStream does
          blockHeader.writeUInt32LE((block.length | LZ4_STORED_BLOCK) >>> 0, 0);
          parts.push(blockHeader, block);
        } else {
          blockHeader.writeUInt32LE(compressed.length, 0);
          parts.push(blockHeader, compressed);
        }
      }
      parts.push(Buffer.alloc(4)); // EndMark; no content checksum
      return Buffer.concat(parts);
    },
    async decompress(buffer) {
      const scan = scanLz4Frame(buffer, limit);
      let frame = scan.frameEnd === buffer.length ? buffer : buffer.subarray(0, scan.frameEnd);
      if (scan.headerChecksum === "kafka-legacy") {
        frame = Buffer.from(frame); // repair a copy: lz4_flex checks the standard header checksum
        frame[scan.headerChecksumOffset] = scan.standardHeaderChecksum;
      }
      const lz4 = need("lz4", "lz4-napi", loadLz4);
      let out: Buffer;
      try {
        out = await lz4.decompressFrame(frame);
      } catch (err) {
        throw corrupt("lz4", "lz4 block data", err);
      }
      if (out.length > limit) throw limitError("lz4", limit, `the decompressed frame (${out.length} bytes)`);
      return out;
    },
  };
}

// ---------------------------------------------------------------------------
// zstd

const ZSTD_MAGIC = 0xfd2fb528;
/** libzstd's default ZSTD_d_windowLogMax (27): frames asking for a larger window are refused, as libzstd would. */
const ZSTD_MAX_WINDOW = 2 ** 27;

export interface ZstdFrame {
  start: number;
  end: number;
  /** Declared Frame_Content_Size, when present. */
  contentSize: number | null;
  windowSize: number;
}

/** Splits a buffer into zstd frames by walking frame and block headers (skippable frames dropped). */
export function scanZstdFrames(buf: Buffer): ZstdFrame[] {
  const frames: ZstdFrame[] = [];
  let pos = 0;
  while (pos < buf.length) {
    if (pos + 4 > buf.length) throw corrupt("zstd", "trailing bytes after the last frame");
    const magic = buf.readUInt32LE(pos);
    if ((magic & 0xfffffff0) === 0x184d2a50) {
      if (pos + 8 > buf.length) throw corrupt("zstd", "truncated skippable frame");
      const end = pos + 8 + buf.readUInt32LE(pos + 4);
      if (end > buf.length) throw corrupt("zstd", "truncated skippable frame");
      pos = end;
      continue;
    }
    if (magic !== ZSTD_MAGIC) throw corrupt("zstd", `magic 0x${magic.toString(16)} is not a zstd frame's`);
    const start = pos;
    const fhd = buf[pos + 4];
    if (fhd === undefined) throw corrupt("zstd", "truncated frame header");
    const fcsFlag = fhd >> 6;
    const singleSegment = (fhd & 0x20) !== 0;
    if (fhd & 0x08) throw corrupt("zstd", "reserved frame header bit set");
    const checksum = (fhd & 0x04) !== 0;
    const dictIdBytes = [0, 1, 2, 4][fhd & 0x03] ?? 0;
    const fcsBytes = [singleSegment ? 1 : 0, 2, 4, 8][fcsFlag] ?? 0;
    let p = pos + 5;
    let windowSize = 0;
    if (!singleSegment) {
      const wd = buf[p++];
      if (wd === undefined) throw corrupt("zstd", "truncated window descriptor");
      const base = 2 ** (10 + (wd >> 3));
      windowSize = base + (base / 8) * (wd & 0x07);
    }
    if (p + dictIdBytes + fcsBytes > buf.length) throw corrupt("zstd", "truncated frame header");
    if (dictIdBytes > 0 && buf.readUIntLE(p, dictIdBytes) !== 0) throw corrupt("zstd", "frame needs a dictionary, which Kafka never uses");
    p += dictIdBytes;
    let contentSize: number | null = null;
    if (fcsBytes > 0) {
      const raw = fcsBytes === 8 ? buf.readBigUInt64LE(p) : BigInt(buf.readUIntLE(p, fcsBytes));
      const value = fcsBytes === 2 ? raw + 256n : raw;
      contentSize = value > BigInt(Number.MAX_SAFE_INTEGER) ? Number.MAX_SAFE_INTEGER : Number(value);
      p += fcsBytes;
    }
    if (singleSegment) windowSize = contentSize ?? 0;
    for (;;) {
      if (p + 3 > buf.length) throw corrupt("zstd", "truncated block header");
      const header = buf.readUIntLE(p, 3);
      p += 3;
      const type = (header >> 1) & 0x03;
      const size = header >>> 3;
      if (type === 3) throw corrupt("zstd", "reserved block type");
      p += type === 1 ? 1 : size; // RLE blocks store one byte
      if (p > buf.length) throw corrupt("zstd", "truncated block");
      if (header & 0x01) break;
    }
    if (checksum) p += 4;
    if (p > buf.length) throw corrupt("zstd", "truncated content checksum");
    frames.push({ start, end: p, contentSize, windowSize });
    pos = p;
  }
  return frames;
}

type ZstdOptions = zlib.ZlibOptions & { params?: Record<number, number> };
interface NodeZstd {
  compress: (buf: Buffer, opts: ZstdOptions) => Promise<Buffer>;
  decompress: (buf: Buffer, opts: ZstdOptions) => Promise<Buffer>;
  levelParam: number;
}

function nodeZstd(): NodeZstd | null {
  const z = zlib as unknown as Record<string, unknown>;
  const constants = zlib.constants as unknown as Record<string, number | undefined>;
  const level = constants["ZSTD_c_compressionLevel"];
  if (typeof z["zstdCompress"] !== "function" || typeof z["zstdDecompress"] !== "function" || level === undefined) return null;
  return {
    compress: promisify(z["zstdCompress"] as (b: Buffer, o: ZstdOptions, cb: (e: Error | null, r: Buffer) => void) => void),
    decompress: promisify(z["zstdDecompress"] as (b: Buffer, o: ZstdOptions, cb: (e: Error | null, r: Buffer) => void) => void),
    levelParam: level,
  };
}

/** Whether this Node can write zstd (node:zlib zstd, Node >= 22.15 / 23.8); reading works everywhere. */
export function zstdCompressionAvailable(): boolean {
  return nodeZstd() !== null;
}

/** Kafka's default zstd level (compression.zstd.level). */
const ZSTD_LEVEL = 3;

export interface ZstdCodecOptions extends Pick<CompressionCodecOptions, "maxDecompressedBytes"> {
  /** `node` = node:zlib, `fzstd` = the pure-JS decoder (decompression only), `auto` (default) = node:zlib when this Node has it. */
  implementation?: "auto" | "node" | "fzstd";
}

/** zstd via node:zlib (or fzstd for reading on an older Node), frame by frame, each capped by what is left of the limit. */
export function createZstdCodec(opts: ZstdCodecOptions = {}): KafkaCodec {
  const limit = normalizeLimit(opts.maxDecompressedBytes);
  const impl = opts.implementation ?? "auto";
  const native = impl === "fzstd" ? null : nodeZstd();
  if (impl === "node" && native === null) {
    throw new KafkaCompressionError("zstd", "unavailable", `node:zlib has no zstd in Node ${process.version} (needs >= 22.15 or >= 23.8)`);
  }

  async function decompressFrame(frame: Buffer, info: ZstdFrame, budget: number): Promise<Buffer> {
    if (info.contentSize !== null && info.contentSize > budget) {
      throw limitError("zstd", limit, `a frame's declared content size (${info.contentSize} bytes, with earlier frames)`);
    }
    if (info.windowSize > ZSTD_MAX_WINDOW) {
      throw corrupt("zstd", `the frame needs a ${info.windowSize}-byte window, more than the ${ZSTD_MAX_WINDOW} libzstd decodes by default`);
    }
    if (native !== null) {
      try {
        return await native.decompress(frame, { maxOutputLength: Math.max(1, budget) });
      } catch (err) {
        if (isZlibTooLarge(err)) throw limitError("zstd", limit, "the decompressed batch");
        throw corrupt("zstd", "libzstd", err);
      }
    }
    // fzstd allocates its window (the content size for single-segment frames) up front: bounded above
    const { Decompress } = need("zstd", "fzstd", loadFzstd);
    const chunks: Buffer[] = [];
    let produced = 0;
    const tooLarge = limitError("zstd", limit, "the decompressed batch");
    const stream = new Decompress((chunk) => {
      produced += chunk.length;
      if (produced > budget) throw tooLarge;
      chunks.push(Buffer.from(chunk));
    });
    try {
      stream.push(frame, true);
    } catch (err) {
      if (err === tooLarge) throw err;
      throw corrupt("zstd", "fzstd", err);
    }
    return Buffer.concat(chunks, produced);
  }

  return {
    async compress(encoder) {
      if (native === null) {
        throw new KafkaCompressionError(
          "zstd",
          "unavailable",
          `cannot compress: node:zlib has no zstd in Node ${process.version} (needs >= 22.15 or >= 23.8); fzstd only decompresses`,
        );
      }
      return native.compress(encoder.buffer, { params: { [native.levelParam]: ZSTD_LEVEL } });
    },
    async decompress(buffer) {
      const frames = scanZstdFrames(buffer);
      const out: Buffer[] = [];
      let total = 0;
      for (const info of frames) {
        const frame = info.start === 0 && info.end === buffer.length ? buffer : buffer.subarray(info.start, info.end);
        const part = await decompressFrame(frame, info, limit - total);
        total += part.length;
        if (total > limit) throw limitError("zstd", limit, "the decompressed batch");
        out.push(part);
      }
      return out.length === 1 && out[0] !== undefined ? out[0] : Buffer.concat(out, total);
    },
  };
}

// ---------------------------------------------------------------------------
// registration

/** What {@link registerCompressionCodecs} installed, for a start-up log line. */
export interface RegisteredCompressionCodecs {
  maxDecompressedBytes: number;
  implementations: Record<KafkaCodecName, string>;
  /** Codecs whose library cannot load here (the codec then throws `unavailable` when a batch needs it). */
  unavailable: Partial<Record<KafkaCodecName, string>>;
}

type CodecFactory = () => KafkaCodec;
type CodecTable = Record<number, CodecFactory | undefined>;

const codecTable = kafkajs.CompressionCodecs as unknown as CodecTable;
const Types = kafkajs.CompressionTypes;

let installed: { key: string; factories: Map<number, CodecFactory>; result: RegisteredCompressionCodecs } | undefined;

/**
 * Registers snappy, lz4 and zstd (and, unless `gzip: false`, a bounded gzip)
 * into kafkajs's process-wide `CompressionCodecs`, so every kafkajs client in
 * this process (owner, producers, test tools) can read batches that foreign
 * producers compressed with any of Kafka's codecs, and write them. It also
 * installs writ's reader of Fetch answers' record batches
 * ({@link installUnreadableBatchGuard}): a batch that cannot be read (over the
 * limit, corrupt) becomes one stand-in record, not a consumer that stops.
 *
 * Call it once at start-up, before the first fetch. It is idempotent: calling
 * it again with the same options changes nothing; with other options the last
 * call wins. It patches the `kafkajs` module this file resolves; a second copy
 * of kafkajs elsewhere in node_modules would keep its own table.
 */
export function registerCompressionCodecs(opts: CompressionCodecOptions = {}): RegisteredCompressionCodecs {
  const maxDecompressedBytes = normalizeLimit(opts.maxDecompressedBytes);
  const gzip = opts.gzip ?? true;
  installUnreadableBatchGuard({ maxBytesPerFetch: maxDecompressedBytes });
  const key = JSON.stringify({ maxDecompressedBytes, gzip });
  if (installed !== undefined && installed.key === key) {
    // same options: put back any entry someone replaced since, keep the rest as they are
    for (const [type, factory] of installed.factories) if (codecTable[type] !== factory) codecTable[type] = factory;
    return installed.result;
  }

  const limitOpts = { maxDecompressedBytes };
  const codecs = new Map<number, KafkaCodec>([
    [Types.Snappy, createSnappyCodec(limitOpts)],
    [Types.LZ4, createLz4Codec(limitOpts)],
    [Types.ZSTD, createZstdCodec(limitOpts)],
  ]);
  if (gzip) codecs.set(Types.GZIP, createGzipCodec(limitOpts));
  const factories = new Map<number, CodecFactory>();
  for (const [type, codec] of codecs) {
    const factory: CodecFactory = () => codec;
    factories.set(type, factory);
    codecTable[type] = factory;
  }

  const unavailable: RegisteredCompressionCodecs["unavailable"] = {};
  const snappy = loadSnappy();
  if (!snappy.ok) unavailable.snappy = snappy.error.message;
  const lz4 = loadLz4();
  if (!lz4.ok) unavailable.lz4 = lz4.error.message;
  const zstdNative = zstdCompressionAvailable();
  if (!zstdNative && !loadFzstd().ok) unavailable.zstd = "neither node:zlib zstd nor fzstd is available";

  const result: RegisteredCompressionCodecs = {
    maxDecompressedBytes,
    implementations: {
      gzip: gzip ? "node:zlib (bounded)" : "kafkajs built-in (unbounded)",
      snappy: "snappy (napi-rs), xerial framing",
      lz4: "lz4-napi (lz4_flex), LZ4 frame",
      zstd: zstdNative ? "node:zlib (libzstd)" : "fzstd (decompression only)",
    },
    unavailable,
  };
  installed = { key, factories, result };
  return result;
}
