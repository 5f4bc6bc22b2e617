import { createRequire } from "node:module";
import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { encodeRecordBatch } from "../../../src/kafka/record-batch.ts";
import type { BatchFields, BatchRecord } from "../../../src/kafka/record-batch.ts";

// kafkajs's own encoders and decoder: the reference writ's batches must match byte for byte.
const require = createRequire(import.meta.url);
const { RecordBatch } = require("kafkajs/src/protocol/recordBatch/v0/index.js") as {
  RecordBatch: (opts: Record<string, unknown>) => Promise<{ buffer: Buffer }>;
};
const Record = require("kafkajs/src/protocol/recordBatch/record/v0/index.js") as (opts: Record<string, unknown>) => unknown;
const Decoder = require("kafkajs/src/protocol/decoder.js") as new (b: Buffer) => unknown;
const decodeBatch = require("kafkajs/src/protocol/recordBatch/v0/decoder.js") as (d: unknown) => Promise<{
  records: { key: Buffer | null; value: Buffer | null; headers: Record<string, Buffer | Buffer[]>; offset: string }[];
  inTransaction: boolean;
  producerId: string;
}>;

async function kafkajsBatch(records: readonly BatchRecord[], f: BatchFields): Promise<Buffer> {
  const encoded = records.map((r, i) => Record({ key: r.key, value: r.value, headers: r.headers ?? {}, offsetDelta: i, timestampDelta: 0 }));
  const batch = await RecordBatch({
    records: encoded,
    firstTimestamp: f.timestamp,
    maxTimestamp: f.timestamp,
    producerId: f.producerId,
    producerEpoch: f.producerEpoch,
    firstSequence: f.firstSequence,
    transactional: f.transactional,
    lastOffsetDelta: records.length - 1,
  });
  return batch.buffer;
}

const bytes = fc.oneof(
  fc.constant(null),
  fc.string({ unit: "binary", maxLength: 300 }),
  fc.uint8Array({ maxLength: 300 }).map((b) => Buffer.from(b)),
);
const headerValue = fc.oneof(fc.string({ unit: "binary", maxLength: 40 }), fc.uint8Array({ maxLength: 40 }).map((b) => Buffer.from(b)));
const record: fc.Arbitrary<BatchRecord> = fc.record(
  {
    key: bytes,
    value: fc.oneof(bytes, fc.string({ minLength: 9000, maxLength: 20000 })),
    headers: fc.dictionary(fc.string({ unit: "binary", minLength: 1, maxLength: 20 }), fc.oneof(headerValue, fc.array(headerValue, { maxLength: 3 })), { maxKeys: 4 }),
  },
  { requiredKeys: ["key", "value"] },
);
const fields: fc.Arbitrary<BatchFields> = fc.record({
  producerId: fc.bigInt({ min: 0n, max: 2n ** 63n - 1n }),
  producerEpoch: fc.integer({ min: 0, max: 32767 }),
  firstSequence: fc.integer({ min: 0, max: 2 ** 31 - 1 }),
  timestamp: fc.integer({ min: 0, max: 2 ** 47 }),
  transactional: fc.boolean(),
});

describe("record batch encoding", () => {
  it("writes what kafkajs's Record and RecordBatch encoders write, byte for byte, CRC included", async () => {
    await fc.assert(
      fc.asyncProperty(fc.array(record, { minLength: 1, maxLength: 12 }), fields, async (records, f) => {
        expect(encodeRecordBatch(records, f).equals(await kafkajsBatch(records, f))).toBe(true);
      }),
      { numRuns: 300 },
    );
  });

  it("offset deltas past one varint byte, and a batch kafkajs's decoder reads back", async () => {
    const records: BatchRecord[] = Array.from({ length: 200 }, (_, i) => ({
      key: `k${i}`,
      value: i % 50 === 0 ? null : JSON.stringify({ i, text: "é€😀" }),
      headers: i % 3 === 0 ? { "writ-control": "heal", multi: ["a", Buffer.from([0, 255])] } : undefined,
    }));
    const f: BatchFields = { producerId: 4242n, producerEpoch: 7, firstSequence: 2 ** 31 - 100, timestamp: 1764806400000, transactional: true };
    const ours = encodeRecordBatch(records, f);
    expect(ours.equals(await kafkajsBatch(records, f))).toBe(true);
    const decoded = await decodeBatch(new Decoder(ours) as never);
    expect(decoded.inTransaction).toBe(true);
    expect(decoded.records).toHaveLength(200);
    expect(decoded.records[199]?.key?.toString()).toBe("k199");
    expect(decoded.records[1]?.value?.toString()).toBe(JSON.stringify({ i: 1, text: "é€😀" }));
    expect(decoded.records[50]?.value).toBeNull();
    expect(decoded.records[3]?.headers).toEqual({ "writ-control": Buffer.from("heal"), multi: [Buffer.from("a"), Buffer.from([0, 255])] });
  });
});
