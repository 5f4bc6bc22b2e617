// The test relay (test/helpers/kafka-relay.ts) stands for one broker and parses Metadata before v9: any other
// answer is refused with a clear error instead of being rewritten into a wrong or corrupt one.
import { describe, expect, it } from "vitest";
import { rewriteMetadata } from "../helpers/kafka-relay.ts";

/** A Metadata v1 response: correlation id, brokers (node id, host, port, null rack), then an empty rest. */
function metadataV1(brokers: [number, string, number][]): Buffer {
  const parts: Buffer[] = [Buffer.alloc(4), Buffer.alloc(4)];
  parts[1]!.writeInt32BE(brokers.length, 0);
  for (const [nodeId, host, port] of brokers) {
    const b = Buffer.alloc(4 + 2 + host.length + 4 + 2);
    b.writeInt32BE(nodeId, 0);
    b.writeInt16BE(host.length, 4);
    b.write(host, 6);
    b.writeInt32BE(port, 6 + host.length);
    b.writeInt16BE(-1, 10 + host.length);
    parts.push(b);
  }
  const body = Buffer.concat(parts);
  const size = Buffer.alloc(4);
  size.writeInt32BE(body.length, 0);
  return Buffer.concat([size, body]);
}

describe("the Kafka test relay's Metadata rewrite", () => {
  it("puts a single broker at the relay's address", () => {
    const out = rewriteMetadata(metadataV1([[1, "kafka", 9092]]), 1, "127.0.0.1", 4000);
    expect(out.equals(metadataV1([[1, "127.0.0.1", 4000]]))).toBe(true);
  });

  it("throws on a cluster of more than one broker, naming them, instead of sending them all to one relay", () => {
    expect(() => rewriteMetadata(metadataV1([[1, "kafka-1", 9092], [2, "kafka-2", 9092]]), 1, "127.0.0.1", 4000)).toThrow(/2 brokers \(kafka-1:9092, kafka-2:9092\).*one broker only/);
  });

  it("throws on Metadata v9 or later (flexible), instead of corrupting it", () => {
    expect(() => rewriteMetadata(metadataV1([[1, "kafka", 9092]]), 9, "127.0.0.1", 4000)).toThrow(/Metadata v9 is flexible/);
  });
});
