// Records from a foreign producer: the Kafka distribution's Java ConsoleProducer, with its default
// (murmur2) partitioner, a round-robin one that ignores keys, pinned partitions (scripts/kafka-cli.ts's
// consoleProduce), every compression codec, and a header with a null value (no kafkajs producer can
// send one). Valid signed intents among them count as valid: they must be applied exactly once.
import { consoleProduce, type ConsoleCompression } from "../../scripts/kafka-cli.ts";
import type { Attack } from "./attacks.ts";
import { type JavaCompression, type JavaRecord, javaProduce } from "./java-producer.ts";
import type { Role } from "./measure.ts";
import { type Ent, PARTITIONS, type World } from "./world.ts";
import { SIGNATURE_HEADER, sign } from "./wire.ts";

interface Sent extends JavaRecord {
  role: Role;
  label: string;
}

async function java(w: World, records: Sent[], compression: JavaCompression, partitioner: "murmur2" | "round-robin"): Promise<void> {
  for (const r of records) w.book.note(r.role, Buffer.from(r.value, "utf8"), r.headers ?? {}, r.label, r.key, true);
  await javaProduce({ brokers: w.brokers, topic: w.topics.intents, records, compression, partitioner });
}

const signedRefund = (w: World, e: Ent, step: string, label: string, role: Role = "valid", extraHeaders: Record<string, string | null> = {}): Sent => {
  const v = w.refund(w.billing, e, step);
  return { role, label, key: e.key, value: JSON.stringify(v), headers: { [SIGNATURE_HEADER]: sign(v, w.billing), ...extraHeaders } };
};
const garbage = (e: Ent, label: string, text: string): Sent => ({ role: "attack", label, key: e.key, value: text });

function f(kind: string, label: string, expect: string, send: Attack["send"]): Attack {
  return { kind, label, on: "payment", expect, send };
}

export const foreignAttacks: Attack[] = [
  f("foreign partitioner", "Java producer (murmur2): garbage beside two valid signed intents", "dlq:undecodable; the intents applied", async (w, e) => {
    await java(w, [garbage(e, "Java producer (murmur2): garbage beside two valid signed intents", "{\"intentId\": garbage"), signedRefund(w, e, "jm1", "Java producer (murmur2): garbage beside two valid signed intents"), signedRefund(w, e, "jm2", "Java producer (murmur2): garbage beside two valid signed intents")], "none", "murmur2");
  }),
  f("foreign partitioner", "Java producer (round-robin): one valid signed intent on all 6 partitions", "forwarded, applied once, 5 duplicates", async (w, e) => {
    const one = signedRefund(w, e, "jr1", "Java producer (round-robin): one valid signed intent on all 6 partitions");
    await java(w, Array.from({ length: PARTITIONS }, () => one), "none", "round-robin");
  }),
  f("foreign partitioner", "Java producer (round-robin): 6 garbage records keyed to one record", "dlq:undecodable ×6", async (w, e) => {
    await java(w, Array.from({ length: PARTITIONS }, (_, i) => garbage(e, "Java producer (round-robin): 6 garbage records keyed to one record", `garbage ${i} \u00e9\u4e2d`)), "gzip", "round-robin");
  }),
  f("foreign partitioner", "pinned partitions (consoleProduce, lz4): an unsigned intent on all 6 partitions, garbage on its own", "forwarded, dlq:unauthenticated ×6; dlq:undecodable", async (w, e) => {
    const v = w.refund(w.ops, e, "pin1");
    const records = [...Array.from({ length: PARTITIONS }, (_, p) => ({ key: e.key, value: JSON.stringify(v), partition: p })), { key: e.key, value: "pinned garbage", partition: e.home }];
    for (const r of records) w.book.note("attack", Buffer.from(r.value), undefined, "pinned partitions (consoleProduce, lz4): an unsigned intent on all 6 partitions, garbage on its own", r.key);
    await consoleProduce({ brokers: w.brokers, topic: w.topics.intents, compression: "lz4", records });
  }),
  f("null header", "null-valued header on a wrong partition: a valid signed intent, round-robin on all 6 partitions", "forwarded (with the null header), applied once, 5 duplicates", async (w, e) => {
    const one = signedRefund(w, e, "nh1", "null-valued header on a wrong partition: a valid signed intent, round-robin on all 6 partitions", "valid", { "x-trace": null });
    await java(w, Array.from({ length: PARTITIONS }, () => one), "none", "round-robin");
  }),
  f("null header", "null-valued header on a wrong partition: an unsigned intent, round-robin on all 6 partitions", "forwarded, dlq:unauthenticated ×6", async (w, e) => {
    const v = w.refund(w.billing, e, "nh0");
    const label = "null-valued header on a wrong partition: an unsigned intent, round-robin on all 6 partitions";
    await java(w, Array.from({ length: PARTITIONS }, () => ({ role: "attack" as const, label, key: e.key, value: JSON.stringify(v), headers: { "x-trace": null } })), "none", "round-robin");
  }),
  f("null header", "writ-signature header with a null value", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "nh2");
    await java(w, [{ role: "attack", label: "writ-signature header with a null value", key: e.key, value: JSON.stringify(v), headers: { [SIGNATURE_HEADER]: null } }], "none", "murmur2");
  }),
  ...(["lz4", "snappy", "zstd", "gzip"] as const).map((codec) =>
    f("compressed batch", `${codec} batch from the Java producer: garbage, broken JSON and a valid signed intent`, "dlq:undecodable ×2; the intent applied", async (w, e) => {
      const label = `${codec} batch from the Java producer: garbage, broken JSON and a valid signed intent`;
      await java(w, [garbage(e, label, `${codec} poison: not an intent`), garbage(e, label, "{\"intentId\":\"x\",\"entity\":{"), signedRefund(w, e, `c-${codec}`, label)], codec, "murmur2");
    }),
  ),
  f("compressed batch", "zstd batch via consoleProduce: deep JSON and a schema-invalid intent", "dlq:too_deep; dlq:unauthenticated or schema_invalid", async (w, e) => {
    const label = "zstd batch via consoleProduce: deep JSON and a schema-invalid intent";
    const records = [
      { key: e.key, value: "[".repeat(10_000) + "]".repeat(10_000) },
      { key: e.key, value: JSON.stringify({ ...w.refund(w.billing, e, "zc1"), createdAt: "yesterday" }) },
    ];
    for (const r of records) w.book.note("attack", Buffer.from(r.value), undefined, label, r.key);
    await consoleProduce({ brokers: w.brokers, topic: w.topics.intents, compression: "zstd" as ConsoleCompression, records });
  }),
];
