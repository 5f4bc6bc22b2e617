// Hand-written attacks on the parser and the bounds: deep JSON, huge values, invalid UTF-8, duplicate
// keys, numbers beyond 2^53, `__proto__` keys, oversized ids, control characters, empty values, and
// values that are JSON but not an intent object.
import { CompressionTypes } from "kafkajs";
import { type Attack, a, bad, clone, deep, deepObj, genuine, json, one, splice } from "./attack-kit.ts";
import type { SentHeaders } from "./measure.ts";
import type { Ent, World } from "./world.ts";
import type { Json } from "./wire.ts";

export const parsingAttacks: Attack[] = [
  a("deep JSON", "10,000 nested arrays", "payment", "dlq:too_deep", async (w, e) => {
    await one(w, bad("10,000 nested arrays", e, Buffer.from(deep(10_000))));
  }),
  a("deep JSON", "10,000 nested objects in params of a signed intent", "payment", "dlq:too_deep", async (w, e) => {
    const v = w.refund(w.billing, e, "dj2");
    const text = JSON.stringify({ ...v, params: { ...v.params, x: "@@" } }).replace('"@@"', deepObj(10_000));
    await one(w, bad("10,000 nested objects in params of a signed intent", e, w.framed(text), { headers: w.sig(v, w.billing) }));
  }),
  a("deep JSON", "depth 200, genuinely signed", "payment", "dlq:too_deep", async (w, e) => {
    const v = w.refund(w.billing, e, "dj3");
    v.delta[0].value.note = JSON.parse(deep(200));
    await genuine(w, "depth 200, genuinely signed", e, v, w.billing);
  }),
  a("huge value", "900 KB of garbage", "payment", "dlq:too_large", async (w, e) => {
    await one(w, bad("900 KB of garbage", e, Buffer.alloc(900 * 1024, "poison-")));
  }),
  a("huge value", "900 KB signed intent (long delta value)", "payment", "dlq:too_large", async (w, e) => {
    const v = w.refund(w.billing, e, "hv2");
    v.delta[0].value.note = "n".repeat(900 * 1024);
    await genuine(w, "900 KB signed intent (long delta value)", e, v, w.billing);
  }),
  a("huge value", "900 KB of '[' (deep and large)", "payment", "dlq:too_large", async (w, e) => {
    await one(w, bad("900 KB of '[' (deep and large)", e, Buffer.alloc(900 * 1024, "[")));
  }),
  a("huge value", "gzip batch: 4 MB value compressed to a few KB", "payment", "dlq:too_large", async (w, e) => {
    const o = bad("gzip batch: 4 MB value compressed to a few KB", e, Buffer.alloc(4 << 20, "["));
    w.book.note(o.role, o.value, undefined, o.label, o.key);
    await w.producer.send({ topic: w.topics.intents, acks: -1, compression: CompressionTypes.GZIP, messages: [{ key: e.key, value: o.value }] });
  }),
  a("huge value", "gzip batch inflating past 64 MiB (80 MiB of zeros in about 80 KB)", "payment", "dlq:undecodable (one stand-in for the batch)", async (w, e) => {
    // Dead-lettered as a whole: no key and no value, the batch's offsets and reason in its writ-unreadable-batch header.
    w.book.note("attack", null, undefined, "gzip batch inflating past 64 MiB (80 MiB of zeros in about 80 KB)", null);
    await w.producer.send({ topic: w.topics.intents, acks: -1, compression: CompressionTypes.GZIP, messages: [{ key: e.key, value: Buffer.alloc(80 << 20) }] });
  }),
  a("huge value", "60,000 distinct headers on one record (about 500 KB)", "payment", "dlq:undecodable", async (w, e) => {
    // kafkajs's own record decoder folds headers in quadratic time: this record would hold its event loop for about 15 minutes (20,000 headers: 100 s).
    const headers = Object.fromEntries(Array.from({ length: 60_000 }, (_, i) => [`h${i}`, "v"]));
    const o = bad("60,000 distinct headers on one record (about 500 KB)", e, Buffer.from("headers, not an intent"), { headers });
    await one(w, o);
  }),
  // --- parsing -------------------------------------------------------------------------------
  ...(
    [
      ["invalid UTF-8 in intentId", "iu1", "intentId", Buffer.from([0x61, 0xff, 0x62])],
      ["invalid UTF-8 in entity id", "iu2", "entity.id", Buffer.from([0xc3, 0x28])],
      ["overlong UTF-8 in delta value", "iu3", "delta.0.value.reason", Buffer.from([0xc0, 0xaf])],
      ["CESU-8 surrogate bytes in runId", "iu4", "agent.runId", Buffer.from([0xed, 0xa0, 0x80])],
    ] as const
  ).map(([label, step, path, raw]) =>
    a("invalid UTF-8", label, "payment", "dlq:unauthenticated or schema_invalid", async (w, e) => {
      const v = w.refund(w.billing, e, step);
      const marked = clone(v);
      const parts = path.split(".");
      let at: Json = marked;
      for (const p of parts.slice(0, -1)) at = at[p];
      at[parts.at(-1)!] = `${at[parts.at(-1)!]}@MARK@`;
      const text = splice(marked, "@MARK@", raw);
      await one(w, bad(label, e, w.framed(text), { headers: w.sig(v, w.billing) }));
    }),
  ),
  a("invalid UTF-8", "invalid UTF-8 between JSON tokens", "payment", "dlq:undecodable", async (w, e) => {
    const v = w.refund(w.billing, e, "iu5");
    const text = JSON.stringify(v);
    await one(w, bad("invalid UTF-8 between JSON tokens", e, w.framed(Buffer.concat([Buffer.from(text.slice(0, 1)), Buffer.from([0xff]), Buffer.from(text.slice(1))])), { headers: w.sig(v, w.billing) }));
  }),
  ...(
    [
      ["duplicate key: replyTo (signed over the first)", "replyTo", (w: World) => w.alice.replyTopic],
      ["duplicate key: intentKey (signed over the first)", "intentKey", () => "f".repeat(64)],
      ["duplicate key: agent (signed over the first)", "agent", (w: World) => ({ id: w.ops.id, runId: "r", stepId: "s" })],
    ] as const
  ).map(([label, field, second]) =>
    a("duplicate keys", label, "payment", "dlq:unauthenticated", async (w, e) => {
      const v = w.refund(w.billing, e, label);
      const first = `${JSON.stringify(field)}:${JSON.stringify(v[field])}`;
      const dup = JSON.stringify(v).replace(first, `${first},${JSON.stringify(field)}:${JSON.stringify(second(w))}`);
      await one(w, bad(label, e, w.framed(dup), { headers: w.sig(v, w.billing) }));
    }),
  ),
  a("big numbers", "amountCents 9007199254740993 (signed as parsed)", "payment", "rejected:params_invalid", async (w, e) => {
    const v = w.refund(w.billing, e, "bn1", 2 ** 53);
    await one(w, bad("amountCents 9007199254740993 (signed as parsed)", e, w.framed(JSON.stringify(v).replaceAll("9007199254740992", "9007199254740993")), { headers: w.sig(v, w.billing) }));
  }),
  a("big numbers", "amountCents 1e400", "payment", "dlq or rejected", async (w, e) => {
    const v = w.refund(w.billing, e, "bn2", 77_777);
    await one(w, bad("amountCents 1e400", e, w.framed(JSON.stringify(v).replaceAll("77777", "1e400")), { headers: w.sig(v, w.billing) }));
  }),
  a("big numbers", "amountCents with 400 digits", "payment", "dlq or rejected", async (w, e) => {
    const v = w.refund(w.billing, e, "bn3", 88_888);
    await one(w, bad("amountCents with 400 digits", e, w.framed(JSON.stringify(v).replaceAll("88888", "9".repeat(400))), { headers: w.sig(v, w.billing) }));
  }),
  a("__proto__", "__proto__ at top level carrying agent and replyTo (unsigned)", "payment", "dlq:schema_invalid or unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "pr1");
    const { agent, replyTo, ...rest } = v;
    await one(w, bad("__proto__ at top level carrying agent and replyTo (unsigned)", e, w.framed(`{"__proto__":${JSON.stringify({ agent, replyTo })},${JSON.stringify(rest).slice(1)}`)));
  }),
  a("__proto__", "__proto__ in params holding the intent fields (signed)", "payment", "rejected:params_invalid", async (w, e) => {
    const v = w.refund(w.billing, e, "pr2");
    const raw = clone(v);
    raw.params = JSON.parse('{"__proto__":{"amountCents":700,"reason":"late"},"note":"x"}');
    await genuine(w, "__proto__ in params holding the intent fields (signed)", e, raw, w.billing);
  }),
  a("__proto__", "__proto__ in entity and agent (signed)", "payment", "applied (genuinely signed; the __proto__ keys are inert)", async (w, e) => {
    const v = w.refund(w.billing, e, "pr3");
    const raw = clone(v);
    raw.entity = JSON.parse(`{"__proto__":{"type":"ticket"},${JSON.stringify(v.entity).slice(1)}`);
    raw.agent = JSON.parse(`{"__proto__":{"id":"ops-bot"},${JSON.stringify(v.agent).slice(1)}`);
    await genuine(w, "__proto__ in entity and agent (signed)", e, raw, w.billing);
  }),
  a("__proto__", "__proto__ as a header name", "payment", "dlq:unauthenticated", async (w, e) => {
    await one(w, bad("__proto__ as a header name", e, json(w, w.refund(w.billing, e, "pr4")), { headers: { ["__proto__"]: "x", constructor: "y" } as SentHeaders }));
  }),
  ...(
    [
      ["oversized intentId (129)", (v: Json) => ({ ...v, intentId: "i".repeat(129) })],
      ["oversized entity id (257)", (v: Json) => ({ ...v, entity: { ...v.entity, id: "e".repeat(257) } })],
      ["oversized agent id (129)", (v: Json) => ({ ...v, agent: { ...v.agent, id: "a".repeat(129) } })],
      ["oversized runId (257)", (v: Json) => ({ ...v, agent: { ...v.agent, runId: "r".repeat(257) } })],
      ["oversized replyTo (250)", (v: Json) => ({ ...v, replyTo: `writ.replies.${"x".repeat(237)}` })],
      ["oversized tool name (129)", (v: Json) => ({ ...v, tool: "t".repeat(129) })],
      ["oversized baseVersion (257)", (v: Json) => ({ ...v, baseVersion: `"${"v".repeat(255)}"` })],
      ["257 delta operations", (v: Json) => ({ ...v, delta: Array.from({ length: 257 }, () => v.delta[0]) })],
    ] as const
  ).map(([label, f]) =>
    a("oversized ids", label, "payment", "dlq:schema_invalid", async (w, e) => {
      await genuine(w, label, e, f(w.refund(w.billing, e, label)), w.billing);
    }),
  ),
  ...(
    [
      ["control characters in intentId (signed)", (v: Json) => ({ ...v, intentId: "id\n\u001b[2J\u0000" }), "applied (a signed agent's own write)"],
      ["control characters in replyTo (signed)", (v: Json) => ({ ...v, replyTo: `${v.replyTo}\u0000` }), "rejected:reply_topic_not_registered"],
      ["control characters in the refund reason (signed)", (v: Json) => ({ ...v, params: { ...v.params, reason: "late\u0000\u0007" } }), "rejected:params_invalid"],
    ] as const
  ).map(([label, f, expect]) =>
    a("control characters", label, "payment", expect, async (w, e) => {
      await genuine(w, label, e, f(w.refund(w.billing, e, label)), w.billing);
    }),
  ),
  a("control characters", "NUL in entity id, record key matching it (signed)", "payment", "forwarded, then rejected:entity_not_found", async (w, e) => {
    const v = w.refund(w.billing, { ...e, id: `${e.id}\u0000` }, "cc4");
    await genuine(w, "NUL in entity id, record key matching it (signed)", e, v, w.billing, { key: `${e.key}\u0000`, partition: e.home });
  }),
  a("control characters", "escape sequences in the tag (unsigned)", "ticket", "dlq:unauthenticated", async (w, e) => {
    await one(w, bad("escape sequences in the tag (unsigned)", e, json(w, w.tag(w.alice, e, "cc5", "\u001b]0;pwned\u0007"))));
  }),
  a("empty", "empty value", "payment", "dlq:undecodable", async (w, e) => one(w, bad("empty value", e, Buffer.alloc(0)))),
  a("empty", "null value (tombstone)", "payment", "dlq:undecodable", async (w, e) => one(w, bad("null value (tombstone)", e, null))),
  ...(
    [
      ["UTF-8 BOM before the JSON", (t: string) => `\uFEFF${t}`],
      ["trailing garbage after the JSON", (t: string) => `${t}}garbage`],
      ["JSON array of the intent", (t: string) => `[${t}]`],
      ["JSON null", () => "null"],
      ["JSON string", (t: string) => JSON.stringify(t)],
    ] as const
  ).map(([label, f]) =>
    a("not an intent", label, "payment", "dlq:undecodable or schema_invalid", async (w, e) => {
      const v = w.refund(w.billing, e, label);
      await one(w, bad(label, e, w.framed(f(JSON.stringify(v))), { headers: w.sig(v, w.billing) }));
    }),
  ),
];
