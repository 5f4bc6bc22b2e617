import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { encodeRecordBatch, type BatchRecord } from "../../../src/kafka/record-batch.ts";
import { installUnreadableBatchGuard, maxRecordsPerBatch, UNREADABLE_BATCH_HEADER, unreadableBatchOf } from "../../../src/kafka/unreadable-batches.ts";

const require = createRequire(import.meta.url);
const PATH = require.resolve("kafkajs/src/protocol/requests/fetch/v4/decodeMessages.js");
const Decoder = require("kafkajs/src/protocol/decoder.js") as new (b: Buffer) => unknown;
const decodeBatch = require("kafkajs/src/protocol/recordBatch/v0/decoder.js") as (d: unknown) => Promise<unknown>;
// kafkajs's own, taken before the guard replaces it in the module cache (this file runs in a process of its own).
const kafkajsDecodeMessages = require(PATH) as (d: unknown) => Promise<unknown[]>;
installUnreadableBatchGuard();
const decodeMessages = require(PATH) as (d: unknown) => Promise<Msg[]>;

interface Msg {
  offset: string;
  key: Buffer | null;
  value: Buffer | null;
  headers: Record<string, Buffer>;
  batchContext: { inTransaction: boolean; producerId: string };
}

const fields = { producerId: 4242n, producerEpoch: 3, firstSequence: 0, timestamp: 1_796_000_000_000, transactional: true };

/** A batch at `firstOffset` as a Fetch answer carries it. */
function batch(firstOffset: number, records: BatchRecord[]): Buffer {
  const buf = encodeRecordBatch(records, fields);
  buf.writeBigInt64BE(BigInt(firstOffset), 0);
  return buf;
}
const recs = (n: number, tag: string): BatchRecord[] => Array.from({ length: n }, (_, i) => ({ key: `${tag}${i}`, value: `v-${tag}${i}` }));

/** A partition's records field of a Fetch answer: its size, then the batches. */
function fetched(...batches: Buffer[]): unknown {
  const body = Buffer.concat(batches);
  const size = Buffer.alloc(4);
  size.writeInt32BE(body.length, 0);
  return new Decoder(Buffer.concat([size, body]));
}

/** Declares `count` records in the batch's header (the CRC is not checked by kafkajs, nor here). */
function lyingCount(buf: Buffer, count: number): Buffer {
  buf.writeInt32BE(count, 57);
  return buf;
}

describe("a record batch kafkajs cannot read becomes one stand-in record", () => {
  it("a batch whose record count lies stands in as one record at its last offset; the batches around it are read", async () => {
    const bad = lyingCount(batch(12, recs(3, "b")), 1000);
    const out = await decodeMessages(fetched(batch(10, recs(2, "a")), bad, batch(15, recs(1, "c"))));
    expect(out.map((m) => [m.offset, m.key?.toString() ?? null])).toEqual([
      ["10", "a0"],
      ["11", "a1"],
      ["14", null],
      ["15", "c0"],
    ]);
    const standIn = out[2]!;
    expect(standIn.value).toBeNull();
    // kafkajs's read_committed filter needs the batch's producer and transaction flag.
    expect(standIn.batchContext).toMatchObject({ inTransaction: true, producerId: "4242" });
    expect(unreadableBatchOf(standIn.headers)).toMatchObject({ firstOffset: "12", lastOffset: "14" });
    expect(unreadableBatchOf(standIn.headers)!.reason).toMatch(/^RangeError: /);
  });

  it("ablation: kafkajs's own reader throws on that batch, which stops its consumer", async () => {
    const bad = lyingCount(batch(12, recs(3, "b")), 1000);
    await expect(kafkajsDecodeMessages(fetched(batch(10, recs(2, "a")), bad))).rejects.toThrow();
    await expect(decodeBatch(new Decoder(lyingCount(batch(12, recs(3, "b")), 1000)))).rejects.toThrow();
  });

  it("a batch declaring more than maxRecordsPerBatch() records is not decoded at all", async () => {
    const MAX_RECORDS_PER_BATCH = maxRecordsPerBatch();
    expect(MAX_RECORDS_PER_BATCH).toBe(262_144); // the default 64 MiB budget at 256 bytes a record
    const out = await decodeMessages(fetched(lyingCount(batch(0, recs(2, "a")), MAX_RECORDS_PER_BATCH + 1), batch(2, recs(1, "c"))));
    expect(out.map((m) => m.offset)).toEqual(["1", "2"]);
    expect(unreadableBatchOf(out[0]!.headers)!.reason).toBe(`TooManyRecords: the batch declares ${MAX_RECORDS_PER_BATCH + 1} records; at most ${MAX_RECORDS_PER_BATCH} are read from one batch`);
  });

  it("a batch cut short by the Fetch size limit is left for the next Fetch, with no stand-in", async () => {
    const whole = batch(2, recs(3, "b"));
    const out = await decodeMessages(fetched(batch(0, recs(2, "a")), whole.subarray(0, whole.length - 5)));
    expect(out.map((m) => m.offset)).toEqual(["0", "1"]);
    // cut short with a count over the bound: still left for the next Fetch
    const lying = lyingCount(batch(2, recs(3, "b")), maxRecordsPerBatch() + 1);
    expect((await decodeMessages(fetched(batch(0, recs(1, "a")), lying.subarray(0, lying.length - 5)))).map((m) => m.offset)).toEqual(["0"]);
  });

  it("a control batch the brokers wrote is never stood in for", async () => {
    const control = lyingCount(batch(5, recs(1, "m")), 1000);
    control.writeInt16BE(control.readInt16BE(21) | 0x20, 21);
    await expect(decodeMessages(fetched(control))).rejects.toThrow();
  });

  it("150,000 records of one batch are read (kafkajs's push(...records) overflows the stack there)", async () => {
    const many = Array.from({ length: 150_000 }, () => ({ key: null, value: null }));
    const out = await decodeMessages(fetched(batch(0, many)));
    expect(out).toHaveLength(150_000);
    expect(out[149_999]!.offset).toBe("149999");
    await expect(kafkajsDecodeMessages(fetched(batch(0, many)))).rejects.toThrow(RangeError);
  });

  it("installing again changes nothing; a record that only claims the header says what it says", () => {
    installUnreadableBatchGuard();
    expect(require(PATH)).toBe(decodeMessages);
    expect(unreadableBatchOf({ [UNREADABLE_BATCH_HEADER]: Buffer.from("not offsets") })).toEqual({ firstOffset: "?", lastOffset: "?", reason: "not offsets" });
    expect(unreadableBatchOf({})).toBeNull();
  });
});

describe("a record's headers are gathered in linear time", () => {
  const withHeaders = (n: number, name = (i: number) => `h${i}`) =>
    batch(0, [{ key: "k", value: "v", headers: Object.fromEntries(Array.from({ length: n }, (_, i) => [name(i), `v${i}`])) }]);

  it("100,000 distinct headers in one record are read (kafkajs's fold spreads the object so far for each: quadratic)", async () => {
    const out = await decodeMessages(fetched(withHeaders(100_000)));
    expect(Object.keys(out[0]!.headers)).toHaveLength(100_000);
    expect(out[0]!.headers["h99999"]!.toString()).toBe("v99999");
  });

  it("repeated names give an array of their values in order, as kafkajs's do; __proto__ and toString are own values", async () => {
    const buf = batch(0, [{ key: "k", value: "v", headers: { a: ["1", "2", "3"], b: "4", ["__proto__"]: "5", toString: "6" } as never }]);
    const [record] = await decodeMessages(fetched(buf));
    const h = record!.headers as unknown as Record<string, Buffer | Buffer[]>;
    expect((h["a"] as Buffer[]).map(String)).toEqual(["1", "2", "3"]);
    expect(String(h["b"])).toBe("4");
    expect(Object.getOwnPropertyDescriptor(h, "__proto__")?.value?.toString()).toBe("5");
    expect(String(h["toString"])).toBe("6");
    expect(Object.getPrototypeOf(h)).toBe(Object.prototype);
  });
});
