// The pieces of transactions v2 that need no broker: reading the cluster's finalized
// transaction.version from an ApiVersions v3 body (its tagged fields, the unknown ones
// skipped), the protocol choice from it, and the spacing of back-to-back transactions. The requests themselves are read by the
// real broker in test/integration/txn-v2.test.ts.
import { createRequire } from "node:module";
import { describe, expect, it } from "vitest";
import { WritError } from "../../../src/errors.ts";
import { decodeApiVersionsV3, spacingWaitMs } from "../../../src/kafka/txn-v2.ts";
import { chooseTransactionProtocol } from "../../../src/owner/transactions.ts";

const require = createRequire(import.meta.url);
const Encoder = require("kafkajs/src/protocol/encoder.js");
const Decoder = require("kafkajs/src/protocol/decoder.js");

/** An ApiVersions v3 response body as Kafka writes it (ApiVersionsResponse.json), with the given tagged fields. */
function body(tagged: { tag: number; bytes: Buffer }[]): Buffer {
  const e = new Encoder().writeInt16(0);
  e.writeUVarInt(3); // two api keys
  for (const [key, max] of [[0, 13], [26, 5]]) e.writeInt16(key).writeInt16(0).writeInt16(max).writeUVarInt(0);
  e.writeInt32(0); // throttle
  e.writeUVarInt(tagged.length);
  for (const t of tagged) e.writeUVarInt(t.tag).writeUVarInt(t.bytes.length).writeBuffer(t.bytes);
  return e.buffer;
}

function features(list: [string, number, number][]): Buffer {
  const e = new Encoder().writeUVarInt(list.length + 1);
  for (const [name, min, max] of list) e.writeUVarIntString(name).writeInt16(max).writeInt16(min).writeUVarInt(0);
  return e.buffer;
}

describe("ApiVersions v3: the finalized feature levels", () => {
  it("reads tagged field 2 and skips the others (supported features, the finalized epoch)", () => {
    const supported = features([["transaction.version", 0, 2], ["group.version", 0, 1]]);
    const epoch = new Encoder().writeInt64("17").buffer;
    const finalized = features([["metadata.version", 27, 27], ["transaction.version", 2, 2]]);
    const r = decodeApiVersionsV3(new Decoder(body([{ tag: 0, bytes: supported }, { tag: 1, bytes: epoch }, { tag: 2, bytes: finalized }])));
    expect(r.errorCode).toBe(0);
    expect(r.finalized.get("transaction.version")).toBe(2);
    expect(r.finalized.get("metadata.version")).toBe(27);
    expect(r.finalized.has("group.version")).toBe(false); // supported, not finalized
  });

  it("a broker that finalized nothing: no levels", () => {
    expect(decodeApiVersionsV3(new Decoder(body([]))).finalized.size).toBe(0);
  });
});

describe("the owner's transaction protocol", () => {
  it("auto takes v2 only where the cluster finalized transaction.version 2 and the broker serves its requests", () => {
    expect(chooseTransactionProtocol("auto", { level: 2, requests: true })).toBe("v2");
    expect(chooseTransactionProtocol("auto", { level: 1, requests: true })).toBe("v1");
    expect(chooseTransactionProtocol("auto", { level: 2, requests: false })).toBe("v1");
    expect(chooseTransactionProtocol("v1", { level: 2, requests: true })).toBe("v1");
  });

  it("v2 asked of a cluster without it is a configuration error naming the field", () => {
    expect(chooseTransactionProtocol("v2", { level: 2, requests: true })).toBe("v2");
    let err: unknown;
    try {
      chooseTransactionProtocol("v2", { level: 0, requests: false });
    } catch (e) {
      err = e;
    }
    expect(err).toBeInstanceOf(WritError);
    expect((err as WritError).code).toBe("config_invalid");
    expect((err as WritError).message).toContain("WRIT_TRANSACTION_PROTOCOL");
    expect((err as WritError).message).toContain("transaction.version 0");
  });
});

describe("spacing of a producer's transactions", () => {
  it("a transaction about to begin waits what is left of the spacing since the last one ended, in whole ms", () => {
    expect(spacingWaitMs(2, 1000, 1000)).toBe(2);
    expect(spacingWaitMs(2, 1000, 1000.4)).toBe(2);
    expect(spacingWaitMs(2, 1000, 1001.5)).toBe(1);
  });

  it("no wait once the spacing has passed, with spacing 0, or before any transaction ended", () => {
    expect(spacingWaitMs(2, 1000, 1002)).toBe(0);
    expect(spacingWaitMs(2, 1000, 5000)).toBe(0);
    expect(spacingWaitMs(0, 1000, 1000)).toBe(0);
    expect(spacingWaitMs(2, Number.NEGATIVE_INFINITY, 0)).toBe(0);
  });
});
