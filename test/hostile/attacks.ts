// Hand-written poison and attack records on keys, partitions, agents, signatures, reply topics, intent
// keys, tools, patches and schema ids (the parser's are in attacks-parsing.ts, the foreign producer's in
// attacks-foreign.ts). Each attack gets a fresh record; the driver (runAttacks) follows every attack
// with a valid signed intent of a legitimate agent on the same record key, which must be applied.
import { generateKeyPairSync, randomUUID } from "node:crypto";
import { partitionFor } from "../../src/kafka/partition.ts";
import { type Attack, a, bad, clone, genuine, hdr, json, one, signedAs } from "./attack-kit.ts";
import { foreignAttacks } from "./attacks-foreign.ts";
import { parsingAttacks } from "./attacks-parsing.ts";
import type { PoolEntry } from "./mutations.ts";
import { type Ent, PARTITIONS, type World } from "./world.ts";
import { type Agent, type Json, frame, sign, SIGNATURE_HEADER } from "./wire.ts";

export type { Attack };

export const kafkajsAttacks: Attack[] = [
  // --- keys and partitions -------------------------------------------------------------------
  a("wrong key", "key names another payment (signed)", "payment", "dlq:key_mismatch", async (w, e) => {
    const other = w.entity("payment");
    await genuine(w, "key names another payment (signed)", e, w.refund(w.billing, other, "wk1"), w.billing);
  }),
  a("wrong key", "key names another ticket (signed)", "ticket", "dlq:key_mismatch", async (w, e) => {
    const other = w.entity("ticket");
    await genuine(w, "key names another ticket (signed)", e, w.tag(w.alice, other, "wk2"), w.alice);
  }),
  a("wrong key", "key of another type (unsigned)", "payment", "dlq:key_mismatch", async (w, e) => {
    await one(w, bad("key of another type (unsigned)", e, json(w, w.refund(w.billing, e, "wk3")), { key: `ticket:${e.id}`, partition: e.home }));
  }),
  a("wrong key", "key with invalid UTF-8 bytes", "payment", "dlq:key_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "wk4");
    await one(w, bad("key with invalid UTF-8 bytes", e, json(w, v), { key: Buffer.concat([Buffer.from(e.key), Buffer.from([0xff, 0xfe])]), headers: w.sig(v, w.billing), partition: e.home }));
  }),
  a("wrong key", "100,000-character key", "payment", "dlq:key_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "wk5");
    await one(w, bad("100,000-character key", e, json(w, v), { key: `${e.key}${"k".repeat(100_000)}`, headers: w.sig(v, w.billing), partition: e.home }));
  }),
  a("wrong key", "key with a NUL", "payment", "dlq:key_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "wk6");
    await one(w, bad("key with a NUL", e, json(w, v), { key: `${e.key}\u0000`, headers: w.sig(v, w.billing), partition: e.home }));
  }),
  a("null key", "null key (signed intent)", "payment", "dlq:key_missing", async (w, e) => {
    const v = w.refund(w.billing, e, "nk1");
    await one(w, bad("null key (signed intent)", e, json(w, v), { key: null, headers: w.sig(v, w.billing), partition: e.home }));
  }),
  a("null key", "null key (garbage)", "payment", "dlq:undecodable", async (w, e) => {
    await one(w, bad("null key (garbage)", e, Buffer.from("not an intent at all"), { key: null, partition: e.home }));
  }),
  a("wrong partition", "valid signed intent on a wrong partition (counted as valid)", "payment", "forwarded, applied once", async (w, e) => {
    const label = "valid signed intent on a wrong partition (counted as valid)";
    await w.send([w.valid(w.refund(w.billing, e, "wp0"), w.billing, label, { partition: (e.home + 2) % PARTITIONS, track: true })]);
  }),
  a("wrong partition", "one valid intent on two wrong partitions (counted as 2 valid)", "payment", "forwarded twice, applied once, 1 duplicate", async (w, e) => {
    const label = "one valid intent on two wrong partitions (counted as 2 valid)";
    const v = w.refund(w.ops, e, "wp00");
    await w.send([1, 4].map((d) => w.valid(v, w.ops, label, { partition: (e.home + d) % PARTITIONS, track: true })));
  }),
  a("wrong partition", "unsigned intent on a wrong partition", "payment", "dlq:unauthenticated (after forward)", async (w, e) => {
    await one(w, bad("unsigned intent on a wrong partition", e, json(w, w.refund(w.billing, e, "wp1")), { partition: (e.home + 3) % PARTITIONS }));
  }),
  a("wrong partition", "wrong partition + forged writ-forwarded-from header", "payment", "dlq:unauthenticated (after forward)", async (w, e) => {
    await one(w, bad("wrong partition + forged writ-forwarded-from header", e, json(w, w.refund(w.ops, e, "wp2")), { partition: (e.home + 1) % PARTITIONS, headers: { "writ-forwarded-from": `${e.home}@0` } }));
  }),
  a("control record", "writ heal control record on the intents topic", "payment", "skipped or dlq", async (w, e) => {
    await one(w, bad("writ heal control record on the intents topic", e, null, { key: "__writ_heal__", headers: { "writ-control": "heal" }, partition: e.home }));
  }),
  a("control record", "unsigned intent carrying writ-control: heal", "payment", "skipped or dlq:unauthenticated", async (w, e) => {
    await one(w, bad("unsigned intent carrying writ-control: heal", e, json(w, w.refund(w.billing, e, "cr2")), { headers: { "writ-control": "heal" } }));
  }),
  // --- spoofed agents ------------------------------------------------------------------------
  a("spoofed agent", "unsigned (billing-agent)", "payment", "dlq:unauthenticated + rejected on billing's topic", async (w, e) => {
    await one(w, bad("unsigned (billing-agent)", e, json(w, w.refund(w.billing, e, "sp1"))));
  }),
  a("spoofed agent", "unsigned (support-alice, naming the decoy topic)", "ticket", "dlq:unauthenticated", async (w, e) => {
    const v = w.tag(w.alice, e, "sp2");
    v.replyTo = w.decoyTopic;
    await one(w, bad("unsigned (support-alice, naming the decoy topic)", e, json(w, v)));
  }),
  a("spoofed agent", "billing-agent intent signed with support-alice's key", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp3");
    await signedAs(w, "billing-agent intent signed with support-alice's key", e, v, v, w.alice);
  }),
  a("spoofed agent", "billing-agent intent signed with ops-bot's key", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp4");
    await signedAs(w, "billing-agent intent signed with ops-bot's key", e, v, v, w.ops);
  }),
  a("spoofed agent", "unknown agent eve, signed with her own key", "payment", "dlq:unauthenticated, no reply", async (w, e) => {
    const eve: Agent = { ...w.ops, id: "eve", ...generateKeyPairSync("ed25519") };
    const v = w.refund(eve, e, "sp5");
    v.replyTo = w.billing.replyTopic;
    await genuine(w, "unknown agent eve, signed with her own key", e, v, eve);
  }),
  a("spoofed agent", "tampered amount after signing (key recomputed)", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp6");
    const t = { ...w.refund(w.billing, e, "sp6", 99_999), intentId: v.intentId, createdAt: v.createdAt };
    await signedAs(w, "tampered amount after signing (key recomputed)", e, v, t, w.billing);
  }),
  a("spoofed agent", "tampered delta after signing", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp7");
    const t = clone(v);
    t.delta[0].value.amountCents = 99_999;
    await signedAs(w, "tampered delta after signing", e, v, t, w.billing);
  }),
  a("spoofed agent", "tampered replyTo after signing", "ticket", "dlq:unauthenticated", async (w, e) => {
    const v = w.tag(w.alice, e, "sp8");
    await signedAs(w, "tampered replyTo after signing", e, v, { ...v, replyTo: w.billing.replyTopic }, w.alice);
  }),
  a("spoofed agent", "extra top-level field after signing", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp9");
    await signedAs(w, "extra top-level field after signing", e, v, { ...v, approvedBy: "cfo" }, w.billing);
  }),
  a("spoofed agent", "extra field in entity after signing", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp10");
    await signedAs(w, "extra field in entity after signing", e, v, { ...v, entity: { ...v.entity, tenant: "other" } }, w.billing);
  }),
  a("spoofed agent", "extra field in agent after signing", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "sp11");
    await signedAs(w, "extra field in agent after signing", e, v, { ...v, agent: { ...v.agent, toolCallId: "call-1" } }, w.billing);
  }),
  ...(
    [
      ["signature header: not base64", (s: string) => s.replace(/ [^ ]+$/, " !!!")],
      ["signature header: rsa scheme", (s: string) => s.replace(/^ed25519/, "rsa")],
      ["signature header: 300 characters", (s: string) => `${s}${"A".repeat(300)}`],
      ["signature header: empty", () => ""],
      ["signature header: unknown key id k9", (s: string) => s.replace(" k1 ", " k9 ")],
      ["signature header: 63-byte signature", (s: string) => { const p = s.split(" "); return `${p[0]} ${p[1]} ${Buffer.from(p[2]!, "base64").subarray(0, 63).toString("base64")}`; }],
      ["signature header: double space", (s: string) => s.replace(" k1 ", "  k1 ")],
      ["signature header: trailing newline", (s: string) => `${s}\n`],
    ] as const
  ).map(([label, f]) =>
    a("malformed signature", label, "payment", label.includes("newline") ? "applied (the genuine signature; base64 decoding skips the newline)" : "dlq:unauthenticated", async (w, e) => {
      const v = w.refund(w.billing, e, label);
      await one(w, bad(label, e, json(w, v), { headers: { [SIGNATURE_HEADER]: f(hdr(w, v, w.billing)) } }));
    }),
  ),
  a("malformed signature", "signature header twice (both genuine)", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "ms1");
    const s = hdr(w, v, w.billing);
    await one(w, bad("signature header twice (both genuine)", e, json(w, v), { headers: { [SIGNATURE_HEADER]: [s, s] } }));
  }),
  a("malformed signature", "signature header of invalid UTF-8 bytes", "payment", "dlq:unauthenticated", async (w, e) => {
    await one(w, bad("signature header of invalid UTF-8 bytes", e, json(w, w.refund(w.billing, e, "ms2")), { headers: { [SIGNATURE_HEADER]: Buffer.from([0x65, 0x64, 0xff, 0xfe, 0x20, 0xc0]) } }));
  }),
  a("malformed signature", "Writ-Signature (other case)", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "ms3");
    await one(w, bad("Writ-Signature (other case)", e, json(w, v), { headers: { "Writ-Signature": hdr(w, v, w.billing) } }));
  }),
  a("malformed signature", "signature of another intent (replayed)", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "ms4");
    await signedAs(w, "signature of another intent (replayed)", e, w.refund(w.billing, e, "ms4-other"), v, w.billing);
  }),
  a("malformed signature", "signature over the non-canonical JSON bytes", "payment", "dlq:unauthenticated", async (w, e) => {
    const v = w.refund(w.billing, e, "ms5");
    const text = JSON.stringify({ zz: 1, ...v });
    await one(w, bad("signature over the non-canonical JSON bytes", e, w.framed(text), { headers: { [SIGNATURE_HEADER]: sign(text, w.billing) } }));
  }),
  // --- authorization -------------------------------------------------------------------------
  a("reply topic", "replyTo another agent's topic (signed)", "payment", "rejected:reply_topic_not_registered on billing's topic", async (w, e) => {
    await genuine(w, "replyTo another agent's topic (signed)", e, { ...w.refund(w.billing, e, "rt1"), replyTo: w.alice.replyTopic }, w.billing);
  }),
  a("reply topic", "replyTo the unregistered decoy topic (signed)", "ticket", "rejected:reply_topic_not_registered", async (w, e) => {
    await genuine(w, "replyTo the unregistered decoy topic (signed)", e, { ...w.tag(w.alice, e, "rt2"), replyTo: w.decoyTopic }, w.alice);
  }),
  a("reply topic", "replyTo a missing topic (signed)", "payment", "rejected:reply_topic_not_registered", async (w, e) => {
    await genuine(w, "replyTo a missing topic (signed)", e, { ...w.refund(w.ops, e, "rt3"), replyTo: w.missingTopic }, w.ops);
  }),
  a("key squatting", "billing-agent presents the key computed for ops-bot", "payment", "rejected:intent_key_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "ks1");
    await genuine(w, "billing-agent presents the key computed for ops-bot", e, { ...v, intentKey: w.refund(w.ops, e, "ks1").intentKey }, w.billing);
  }),
  a("key reuse", "ops-bot reuses billing-agent's applied key", "payment", "rejected:intent_key_mismatch", async (w, e) => {
    const first = w.refund(w.billing, e, "kr1");
    await w.send([w.valid(first, w.billing, "valid intent whose key is reused")]);
    await genuine(w, "ops-bot reuses billing-agent's applied key", e, { ...w.refund(w.ops, e, "kr1"), intentKey: first.intentKey }, w.ops);
  }),
  a("key reuse", "same agent, same key, another delta", "payment", "rejected:key_reused_with_different_params", async (w, e) => {
    const first = w.refund(w.billing, e, "kr2");
    await w.send([w.valid(first, w.billing, "valid intent re-sent with another delta")]);
    const again = { ...clone(first), intentId: randomUUID() };
    again.delta[0].value.amountCents = 5;
    await genuine(w, "same agent, same key, another delta", e, again, w.billing);
  }),
  a("tools", "support-alice calls refund_payment", "payment", "rejected:tool_not_allowed", async (w, e) => {
    await genuine(w, "support-alice calls refund_payment", e, w.refund(w.alice, e, "tl1"), w.alice);
  }),
  a("tools", "unknown tool drop_tables", "payment", "rejected:unknown_tool", async (w, e) => {
    await genuine(w, "unknown tool drop_tables", e, { ...w.refund(w.ops, e, "tl2"), tool: "drop_tables" }, w.ops);
  }),
  a("tools", "tag_ticket on a payment", "payment", "rejected:entity_type_mismatch", async (w, e) => {
    const v = w.tag(w.ops, { ...e, type: "ticket" } as Ent, "tl3");
    await genuine(w, "tag_ticket on a payment", e, { ...v, entity: { type: "payment", id: e.id } }, w.ops);
  }),
  a("tools", "params invalid (negative amount, key recomputed)", "payment", "rejected:params_invalid", async (w, e) => {
    await genuine(w, "params invalid (negative amount, key recomputed)", e, w.refund(w.billing, e, "tl4", -5), w.billing);
  }),
  // --- patch paths and ops -------------------------------------------------------------------
  ...(
    [
      ["payment", "delta path not allowed: add /amountCents", { op: "add", path: "/amountCents", value: 0 }, "rejected:patch_path_not_allowed"],
      ["ticket", "delta path not allowed: replace /owner", { op: "replace", path: "/owner", value: "mallory" }, "rejected:patch_path_not_allowed"],
      ["ticket", "disallowed op: remove /tags (bare path)", { op: "remove", path: "/tags" }, "rejected:patch_op_not_allowed"],
      ["ticket", "disallowed op: move /tags to /status", { op: "move", from: "/tags", path: "/status" }, "rejected:patch_op_not_allowed"],
      ["ticket", "disallowed op: copy /status to /tags", { op: "copy", from: "/status", path: "/tags" }, "rejected:patch_op_not_allowed"],
      ["payment", "disallowed op: remove /refunds/-", { op: "remove", path: "/refunds/-" }, "rejected:patch_op_not_allowed"],
      ["payment", "delta path via ~1 escape: /refunds~1-", { op: "add", path: "/refunds~1-", value: 1 }, "rejected:patch_path_not_allowed"],
    ] as const
  ).map(([on, label, op, expect]) =>
    a("patch", label, on, expect, async (w, e) => {
      const v = on === "payment" ? w.refund(w.ops, e, label) : w.tag(w.ops, e, label);
      await genuine(w, label, e, { ...v, delta: [...v.delta, op] }, w.ops);
    }),
  ),
  a("patch", "refund delta says more than its params (123,456 cents vs 700)", "payment", "rejected:delta_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "pd1");
    v.delta[0].value.amountCents = 123_456;
    await genuine(w, "refund delta says more than its params (123,456 cents vs 700)", e, v, w.billing);
  }),
  a("patch", "refund delta with an extra field in its value", "payment", "rejected:delta_mismatch", async (w, e) => {
    const v = w.refund(w.ops, e, "pd2");
    v.delta[0].value.approved = true;
    await genuine(w, "refund delta with an extra field in its value", e, v, w.ops);
  }),
  a("patch", "two refunds in the delta of one", "payment", "rejected:delta_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "pd3");
    v.delta.push(v.delta[0]);
    await genuine(w, "two refunds in the delta of one", e, v, w.billing);
  }),
  a("patch", "tag delta writes another tag than its params", "ticket", "rejected:delta_mismatch", async (w, e) => {
    const v = w.tag(w.alice, e, "pd4", "vip");
    v.delta[0].value = ["admin"];
    await genuine(w, "tag delta writes another tag than its params", e, v, w.alice);
  }),
  a("patch", "tag delta sets /status beside the tags", "ticket", "rejected:delta_mismatch", async (w, e) => {
    const v = w.tag(w.alice, e, "pd5", "vip");
    v.delta.push({ op: "replace", path: "/status", value: "closed" });
    await genuine(w, "tag delta sets /status beside the tags", e, v, w.alice);
  }),
  // --- schema registry framing ---------------------------------------------------------------
  a("schema id", "framed with the DeadLetter subject's schema id", "payment", "dlq:schema_subject_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "si1");
    await one(w, bad("framed with the DeadLetter subject's schema id", e, frame(w.schemaIds.dlq, JSON.stringify(v)), { headers: w.sig(v, w.billing) }));
  }),
  a("schema id", "framed with a Reply subject's schema id", "payment", "dlq:schema_subject_mismatch", async (w, e) => {
    const v = w.refund(w.billing, e, "si2");
    await one(w, bad("framed with a Reply subject's schema id", e, frame(w.schemaIds.reply, JSON.stringify(v)), { headers: w.sig(v, w.billing) }));
  }),
  a("schema id", "unknown schema id 2147483632", "payment", "dlq:undecodable", async (w, e) => {
    await one(w, bad("unknown schema id 2147483632", e, frame(0x7ffffff0, JSON.stringify(w.refund(w.billing, e, "si3")))));
  }),
  a("schema id", "negative schema id -1", "payment", "dlq:undecodable", async (w, e) => {
    await one(w, bad("negative schema id -1", e, frame(-1, JSON.stringify(w.refund(w.billing, e, "si4")))));
  }),
  ...([[0], [0, 0, 0, 1], [0, 0, 0, 0, 1]] as const).map((bytes) =>
    a("schema id", `truncated wire-format header (${bytes.length} bytes)`, "payment", "dlq:undecodable", async (w, e) => {
      await one(w, bad(`truncated wire-format header (${bytes.length} bytes)`, e, Buffer.from(bytes)));
    }),
  ),
  a("schema id", "intents schema id, garbage body", "payment", "dlq:undecodable", async (w, e) => {
    await one(w, bad("intents schema id, garbage body", e, w.framed(Buffer.from([0xde, 0xad, 0xbe, 0xef]))));
  }),
  // --- bounds ---------------------------------------------------------------------------------
];

export const allAttacks = (): Attack[] => [...kafkajsAttacks, ...parsingAttacks, ...foreignAttacks];

/** Sends every attack, each followed by a valid signed intent of a legitimate agent on the same record key. */
export async function runAttacks(w: World, say: (l: string) => void, pool: PoolEntry[], filter: { only: string[]; skip: string[] }): Promise<Attack[]> {
  const matches = (at: Attack, s: string) => at.label.includes(s) || at.kind.includes(s);
  const attacks = allAttacks().filter((at) => (filter.only.length === 0 || filter.only.some((s) => matches(at, s))) && !filter.skip.some((s) => matches(at, s)));
  let i = 0;
  for (const at of attacks) {
    const e = w.entity(at.on);
    try {
      await at.send(w, e);
    } catch (err) {
      throw new Error(`attack "${at.label}" could not be sent: ${(err as Error).message}`);
    }
    const agent = at.on === "payment" ? (i % 2 ? w.billing : w.ops) : i % 2 ? w.alice : w.ops;
    const follow = at.on === "payment" ? w.refund(agent, e, `follow-${i}`) : w.tag(agent, e, `follow-${i}`);
    await w.send([w.valid(follow, agent, `follower of: ${at.label}`, { partition: partitionFor(e.key, PARTITIONS) })]);
    pool.push({ intent: follow, agent, key: e.key });
    if (++i % 20 === 0) say(`  ${i} of ${attacks.length} attacks sent`);
  }
  return attacks;
}
