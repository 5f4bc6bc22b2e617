// A Fetch answer's batches each inflate within maxDecompressedBytes, but a partition's 1 MiB of fetched bytes
// holds hundreds of them (zstd: 64 MiB in about 2 KB). kafkajs decodes the whole answer before handing any
// record on, so what one Fetch holds must be bounded too, not only each batch.
import { createRequire } from "node:module";
import { gzipSync } from "node:zlib";
import { describe, expect, it, onTestFinished, vi } from "vitest";
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

  // Every partition's first batch was read whatever the answer held: 12 partitions of one 64 KB gzip batch each
  // (64 MiB of zeros) made one answer of 784 KB hold 1 GB (measured), and an owner of 48 partitions 4 GB. Past
  // twice the budget, a partition's first batch waits for a later Fetch, and each answer reads one batch that
  // waited already: the partitions take turns, none starves.
  it("first batches stop at twice the budget; the partitions left take turns in the next answers, one each, so none starves", async () => {
    const partitions = 8;
    // Each partition holds bombs without end: what it is handed is consumed, and its next batch is fetched.
    const next = Array.from({ length: partitions }, (_, p) => p * 1000);
    const served = Array.from({ length: partitions }, () => 0);
    for (let answer = 0; answer < 3 * partitions; answer++) {
      const msgs = await fetchAnswer(...next.map((offset) => [big(offset), big(offset + 1)]));
      // At most twice the budget, and the batch that passes it, and one turn's batch.
      expect(msgs.reduce((n, m) => n + held(m), 0), `answer ${answer}`).toBeLessThanOrEqual(2 * LIMIT + 2 * Math.floor(LIMIT * 0.6));
      msgs.forEach((m, p) => {
        if (m.length === 0) return;
        served[p]!++;
        next[p] = Number(m.at(-1)!.offset) + 1;
      });
    }
    // Each partition was read again and again, the last ones too.
    // Five partitions left past twice the budget, 23 turns: four or five each, in turn.
    for (const [p, n] of served.entries()) expect(n, `partition ${p}`).toBeGreaterThanOrEqual(4);
  });

  // kafkajs runs one fetcher per broker, and an owner's restore and reply consumers fetch too: answers of several
  // fetchers interleave. A turn counted per answer (the wait the previous answer's batches had reached) let an answer
  // of another fetcher reset it: partitions 3 and 4 took every turn and 5-7 none in 24 answers. The turns are the
  // process's, first come first served, whatever answer a batch comes in.
  it("answers of other fetchers in between (under the ceiling, or past it themselves) take no partition's turn away", async () => {
    // The batches the test above left waiting are fetched no more (as a revoked partition's): past 5 s unseen they
    // give up their place, else they would hold the turns until then.
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 60_000);
    onTestFinished(() => void vi.useRealTimers());
    const partitions = 8;
    const streams = [0, 100_000].map((base) => ({
      next: Array.from({ length: partitions }, (_, p) => base + p * 1000),
      served: Array.from({ length: partitions }, () => 0),
    }));
    const other = { next: [900_000, 901_000, 902_000] };
    for (let round = 0; round < 4 * partitions; round++) {
      for (const [i, stream] of streams.entries()) {
        const msgs = await fetchAnswer(...stream.next.map((offset) => [big(offset), big(offset + 1)]));
        msgs.forEach((m, p) => {
          if (m.length === 0) return;
          stream.served[p]!++;
          stream.next[p] = Number(m.at(-1)!.offset) + 1;
        });
        // Between them, an answer of a third fetcher past the budget but under the ceiling (1.8 budgets).
        const quiet = await fetchAnswer(...other.next.map((offset) => [big(offset)]));
        quiet.forEach((m, p) => (other.next[p] = Number(m.at(-1)!.offset) + 1));
        if (i === 0 && round === 0) expect(msgs.some((m) => m.length === 0), "a first batch left past the ceiling").toBe(true);
      }
    }
    // Five partitions of each stream left past twice the budget, ten waiting in all: three or four turns each.
    for (const [i, stream] of streams.entries()) {
      for (const [p, n] of stream.served.entries()) expect(n, `stream ${i} partition ${p}: ${stream.served.join(",")}`).toBeGreaterThanOrEqual(3);
    }
  });

  it("a waiting batch read early in a later answer (under the budget) gives up its place: the next waiting batch gets the turn", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 120_000);
    onTestFinished(() => void vi.useRealTimers());
    // Past the ceiling, the fourth partition gets the turn and the fifth (offset 500) waits.
    const first = await fetchAnswer([big(100), big(101)], [big(200)], [big(300)], [big(400)], [big(500)]);
    expect(first.map((m) => m.length)).toEqual([2, 1, 1, 1, 0]);
    // Its partition fetched alone: read at once, under the budget.
    const [alone] = await fetchAnswer([big(500)]);
    expect(offsets(alone!)).toEqual(["500"]);
    // The next bombs: the batch at 1400 waits first now, and gets the turn (were 500 still at the head of the
    // waiting line, no batch would get one for 5 s).
    const next = await fetchAnswer([big(1100), big(1101)], [big(1200)], [big(1300)], [big(1400)]);
    expect(next.map((m) => m.length)).toEqual([2, 1, 1, 1]);
  });

  it("a batch of no records (one the log cleaner emptied) takes no turn: the partition's next batch does", async () => {
    vi.useFakeTimers({ toFake: ["Date"] });
    vi.setSystemTime(Date.now() + 180_000);
    onTestFinished(() => void vi.useRealTimers());
    const plain = encodeRecordBatch([{ key: null, value: Buffer.from("x") }], fields);
    const empty = Buffer.from(plain.subarray(0, HEADER));
    empty.writeBigInt64BE(500n, 0);
    empty.writeInt32BE(HEADER - 12, 8);
    empty.writeInt32BE(0, 57);
    const answer = await fetchAnswer([big(100), big(101)], [big(200)], [big(300)], [empty, big(501)]);
    expect(answer.map(offsets)).toEqual([["100", "101"], ["200"], ["300"], ["501"]]);
  });

  // Each partition's first batch is read whatever the answer holds, so what one batch may cost bounds the answer:
  // bytes by maxDecompressedBytes, and records by the same budget. At 1,000,000 records a batch (about 800 KB of
  // zstd, under the brokers' default message.max.bytes) one answer of 12 partitions held 12 million kafkajs
  // records, 2.7 GB of heap measured, from 10 MB on the wire: past a small container's heap, an owner that dies and
  // whose successor meets the same batches.
  it("a partition's first batch costs at most the budget in records too: more than it holds at 256 bytes each is one stand-in", async () => {
    const perBatch = LIMIT / 256;
    const empty = (offset: number, n: number) => gzipBatch(offset, Array.from({ length: n }, () => ({ key: null, value: null })));
    const answer = await fetchAnswer(...Array.from({ length: 4 }, (_, p) => [empty(p * 100_000, 5 * perBatch)]));
    for (const [p, msgs] of answer.entries()) {
      // One stand-in at the batch's last offset, saying why: the offsets are accounted for, nothing decoded.
      expect(offsets(msgs)).toEqual([String(p * 100_000 + 5 * perBatch - 1)]);
      expect((msgs[0] as unknown as { headers: Record<string, Buffer> }).headers["writ-unreadable-batch"]!.toString()).toContain(`at most ${perBatch} are read from one batch`);
    }
    // A batch at the bound is read whole.
    const [whole] = await fetchAnswer([empty(0, perBatch)]);
    expect(whole).toHaveLength(perBatch);
  });

  it("records count at their kafkajs objects too: many empty records stop an answer as bytes do", async () => {
    const [first] = await fetchAnswer([many(0), many(3000), many(6000)]);
    // 3,000 records at 256 bytes each: 768,000 per batch, so two batches reach the 1 MiB budget.
    expect(first!.length).toBe(6000);
    expect(first!.at(-1)!.offset).toBe("5999");
  });
});
