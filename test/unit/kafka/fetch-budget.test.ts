// A Fetch answer's batches each inflate within maxDecompressedBytes, but a partition's 1 MiB of fetched bytes
// holds hundreds of them (zstd: 64 MiB in about 2 KB). kafkajs decodes the whole answer before handing any
// record on, so what one Fetch holds must be bounded too, not only each batch.
import { createRequire } from "node:module";
import { gzipSync } from "node:zlib";
import { describe, expect, it } from "vitest";
import { registerCompressionCodecs } from "../../../src/kafka/compression.ts";
import { encodeRecordBatch, type BatchRecord } from "../../../src/kafka/record-batch.ts";

const require = createRequire(import.meta.url);
const LIMIT = 1024 * 1024;
registerCompressionCodecs({ maxDecompressedBytes: LIMIT });
const decodeMessages = require("kafkajs/src/protocol/requests/fetch/v4/decodeMessages.js") as (d: unknown) => Promise<Msg[]>;
const Decoder = require("kafkajs/src/protocol/decoder.js") as new (b: Buffer) => unknown;

interface Msg {
  offset: string;
  value: Buffer | null;
}

const fields = { producerId: 7n, producerEpoch: 0, firstSequence: 0, timestamp: 1_796_000_000_000, transactional: false };
/** RecordBatch v2 header length: the records (compressed or not) follow it. */
const HEADER = 61;

/** A gzip batch at `firstOffset`, as a foreign producer writes it. */
function gzipBatch(firstOffset: number, records: BatchRecord[]): Buffer {
  const plain = encodeRecordBatch(records, fields);
  const buf = Buffer.concat([plain.subarray(0, HEADER), gzipSync(plain.subarray(HEADER))]);
  buf.writeBigInt64BE(BigInt(firstOffset), 0);
  buf.writeInt32BE(buf.length - 12, 8);
  buf.writeInt16BE(buf.readInt16BE(21) | 1, 21);
  return buf;
}

/** One Fetch answer: the records field of each partition, all read through one decoder, as kafkajs reads them. */
async function fetchAnswer(...partitions: Buffer[][]): Promise<Msg[][]> {
  const parts = partitions.map((batches) => {
    const body = Buffer.concat(batches);
    const size = Buffer.alloc(4);
    size.writeInt32BE(body.length, 0);
    return Buffer.concat([size, body]);
  });
  const decoder = new Decoder(Buffer.concat(parts));
  const out: Msg[][] = [];
  for (let i = 0; i < partitions.length; i++) out.push(await decodeMessages(decoder));
  return out;
}

const held = (msgs: Msg[]): number => msgs.reduce((n, m) => n + (m.value?.length ?? 0), 0);
const offsets = (msgs: Msg[]): string[] => msgs.map((m) => m.offset);
/** Each inflates to 60 % of the limit: every one is allowed alone. */
const big = (offset: number): Buffer => gzipBatch(offset, [{ key: null, value: Buffer.alloc(Math.floor(LIMIT * 0.6)) }]);
/** 3,000 empty records: a few KB of gzip, some hundreds of bytes of heap each once kafkajs has decoded them. */
const many = (offset: number): Buffer => gzipBatch(offset, Array.from({ length: 3000 }, () => ({ key: null, value: null })));

describe("what one Fetch answer's records hold is bounded, not only each batch", () => {
  it("batches each within maxDecompressedBytes stop being read once the answer holds that much; the rest come with the next Fetch", async () => {
    const [first] = await fetchAnswer([big(0), big(1), big(2), big(3), big(4)]);
    // Past the budget by at most one batch; the rest is not lost: the consumer fetches again from the next offset.
    expect(held(first!)).toBeLessThanOrEqual(2 * LIMIT);
    expect(offsets(first!)).toEqual(["0", "1"]);
    const [next] = await fetchAnswer([big(2), big(3), big(4)]);
    expect(offsets(next!)).toEqual(["2", "3"]);
  });

  it("every partition of the answer still gets its first batch (no partition starves behind another's bombs)", async () => {
    const [a, b] = await fetchAnswer([big(0), big(1), big(2)], [big(10), big(11)]);
    expect(offsets(a!)).toEqual(["0", "1"]);
    expect(offsets(b!)).toEqual(["10"]);
  });

  it("records count at their kafkajs objects too: many empty records stop an answer as bytes do", async () => {
    const [first] = await fetchAnswer([many(0), many(3000), many(6000)]);
    // 3,000 records at 256 bytes each: 768,000 per batch, so two batches reach the 1 MiB budget.
    expect(first!.length).toBe(6000);
    expect(first!.at(-1)!.offset).toBe("5999");
  });
});
