// Writes test/fixtures/intent-key-vectors.json: the golden vectors of the
// intent key, computed by the TypeScript implementation (src/keys.ts), that
// every other client (python/, and whatever comes next) must reproduce byte
// for byte. Run: node scripts/generate-intent-key-vectors.ts [--check]
//
// CHANGING AN EXPECTED VALUE IS A WIRE-CONTRACT CHANGE. Owners recompute the
// intent key of every intent and refuse one whose key differs
// (`intent_key_mismatch`), so a key that moves breaks every deployed client in
// every other language and makes the ledger miss duplicates across the
// upgrade. Add vectors freely; change or remove one only together with a new
// key version (`v` in the hashed object) and the Python client's canonical
// JSON (python/src/writ_client/canonical.py, wire contract in python/README.md).
//
// One change was made within key version 2: canonical JSON became RFC 8785
// (JCS). It moved the keys of exactly the vectors with array-index-like object
// keys ("0", "9", "10": JSON.stringify had written them first, in numeric
// order; JCS sorts every key by UTF-16 code units), and the values that have
// no canonical form (a lone surrogate; 1e400 and other numbers past the double
// range, which had all collapsed to null) became refusals (`expected.error`).
// Every other expected value stayed byte for byte.
//
// `--check` writes nothing and exits 1 when the file differs from what this
// script would write (test/unit/intent-key-vectors.test.ts recomputes every
// vector on its own as well).
import { createHash } from "node:crypto";
import { readFileSync, writeFileSync } from "node:fs";
import { createRequire } from "node:module";
import { join } from "node:path";
import { canonicalJson } from "../src/canonical-json.ts";
import { changeId, intentKey, leaseIntentKey, paramsFingerprint, undoIntentKey, type KeyScope } from "../src/keys.ts";
import { partitionFor } from "../src/kafka/partition.ts";
import { entityKey, type EntityRef } from "../src/schemas/common.ts";

/** The partition count the partition expectations are for (the default of `writ.intents`). */
const PARTITIONS = 12;

export const VECTORS_FILE = join(import.meta.dirname, "..", "test", "fixtures", "intent-key-vectors.json");

interface VectorInput {
  name: string;
  tool: { name: string; keyScope: KeyScope; intentFields: string[]; freeTextParams: string[] };
  agentId: string;
  runId: string;
  stepId: string;
  entity: EntityRef;
  /**
   * The params as JSON text, parsed by each language's standard JSON parser
   * (JSON.parse, Python's json.loads): the text keeps what a JSON value
   * written by another language can hold and JSON.stringify cannot (100.0,
   * -0.0, integers past 2^53, key order, lone surrogates).
   */
  paramsJson: string;
  /**
   * Set on a vector whose params have no canonical form: computing its intent
   * key (and params fingerprint) must fail with this code, in every language.
   */
  error?: "not_canonical";
}

const refund = { name: "refund_payment", keyScope: "run" as const, intentFields: ["amountCents", "reason"], freeTextParams: ["note"] };
const tag = { name: "tag_ticket", keyScope: "run" as const, intentFields: ["tag"], freeTextParams: [] };
const pay = { type: "payment", id: "pay_1001" };

/** One value per intent field `v`, in a tool whose only intent field is `v`. */
function valueVector(name: string, valueJson: string, extra: Partial<VectorInput> = {}): VectorInput {
  return {
    name,
    tool: { name: "set_value", keyScope: "run", intentFields: ["v"], freeTextParams: [] },
    agentId: "agent-1",
    runId: "run-1",
    stepId: "step-1",
    entity: { type: "record", id: "r1" },
    paramsJson: `{"v":${valueJson}}`,
    ...extra,
  };
}

const INPUTS: VectorInput[] = [
  { name: "refund: basic", tool: refund, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"paymentId":"pay_1001","amountCents":5000,"reason":"damaged","note":"box arrived crushed"}' },
  { name: "refund: other free text and params outside the intent fields (same key as basic)", tool: refund, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged","note":"Customer says the box was crushed.","paymentId":"pay_1001","extra":{"b":[1,2]}}' },
  { name: "refund: params in another key order (same key as basic)", tool: refund, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"note":"box arrived crushed","reason":"damaged","amountCents":5000,"paymentId":"pay_1001"}' },
  { name: "refund: intent fields declared in another order (same key as basic)", tool: { ...refund, intentFields: ["reason", "amountCents"] }, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"paymentId":"pay_1001","amountCents":5000,"reason":"damaged"}' },
  { name: "refund: 5000.0 is the number 5000 (same key as basic)", tool: refund, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000.0,"reason":"damaged"}' },
  { name: "refund: another agent", tool: refund, agentId: "billing-agent-2", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged"}' },
  { name: "refund: another run", tool: refund, agentId: "billing-agent", runId: "conv-8b4c", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged"}' },
  { name: "refund: another step", tool: refund, agentId: "billing-agent", runId: "conv-7f3a", stepId: "refund-2", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged"}' },
  { name: "refund: scope global (agent and run left out: null)", tool: { ...refund, keyScope: "global" }, agentId: "billing-agent", runId: "conv-7f3a", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged"}' },
  { name: "refund: scope global, another agent and run (same key as the previous)", tool: { ...refund, keyScope: "global" }, agentId: "other-agent", runId: "conv-0000", stepId: "once-per-run", entity: pay,
    paramsJson: '{"amountCents":5000,"reason":"damaged"}' },
  { name: "tag: no free text", tool: tag, agentId: "support-alice", runId: "conv-42", stepId: "call_abc123", entity: { type: "ticket", id: "T-42" },
    paramsJson: '{"ticketId":"T-42","tag":"chargeback-risk"}' },
  { name: "no intent fields", tool: { name: "close_ticket", keyScope: "run", intentFields: [], freeTextParams: ["comment"] }, agentId: "support-bob", runId: "conv-1", stepId: "s1", entity: { type: "ticket", id: "T-43" },
    paramsJson: '{"comment":"done","ticketId":"T-43"}' },
  { name: "non-ASCII ids and text: é, 漢字, emoji", tool: { name: "rename", keyScope: "run", intentFields: ["title"], freeTextParams: [] },
    agentId: "agent-é", runId: "run-漢字-😀", stepId: "étape-1", entity: { type: "ticket", id: "T-é漢字😀" },
    paramsJson: '{"title":"Café 漢字 😀 🇫🇷"}' },
  valueVector("string: precomposed é (U+00E9)", '"\u00e9"'),
  valueVector("string: e + combining acute (U+0065 U+0301), no normalization: another key", '"e\u0301"'),
  valueVector("string: escapes (quote, backslash, slash, controls, U+007F, U+2028)", '"q\\" b\\\\ s/ \\u0000\\u0001\\b\\t\\n\\u000b\\f\\r\\u001f \\u007f \\u2028\\u2029"'),
  valueVector("string: a lone high surrogate has no canonical form (refused)", '"x\\ud800y"', { error: "not_canonical" }),
  valueVector("string: a lone low surrogate has no canonical form (refused)", '"\\udc00x"', { error: "not_canonical" }),
  valueVector("string: a reversed surrogate pair is two lone surrogates (refused)", '"\\ude00\\ud83d"', { error: "not_canonical" }),
  valueVector("string: a lone surrogate deep inside a value (refused)", '{"a":[1,{"b":"ok","c":"\\ud800"}]}', { error: "not_canonical" }),
  valueVector("keys: a key with a lone surrogate (refused)", '{"k\\udbff":1}', { error: "not_canonical" }),
  valueVector("string: a surrogate pair written escaped is the emoji", '"\\ud83d\\ude00"'),
  valueVector("number: 0.1", "0.1"),
  valueVector("number: 1e21", "1e21"),
  valueVector("number: 1e20", "1e20"),
  valueVector("number: 123456789012345680000", "123456789012345680000"),
  valueVector("number: -0.0 is 0", "-0.0"),
  valueVector("number: 0", "0"),
  valueVector("number: 1.5e-7", "1.5e-7"),
  valueVector("number: 1e-7", "1e-7"),
  valueVector("number: 0.000001", "0.000001"),
  valueVector("number: 100.0", "100.0"),
  valueVector("number: 100", "100"),
  valueVector("number: 1E2 is 100", "1E2"),
  valueVector("number: -12.5e3", "-12.5e3"),
  valueVector("number: 5e-324 (smallest subnormal)", "5e-324"),
  valueVector("number: 1.7976931348623157e308 (largest double)", "1.7976931348623157e308"),
  valueVector("number: 2^53 + 1 rounds to 2^53", "9007199254740993"),
  valueVector("number: -2^53 - 1 rounds to -2^53", "-9007199254740993"),
  valueVector("number: 12345678901234567890 (a double: 12345678901234567000)", "12345678901234567890"),
  valueVector("number: 1e400 is Infinity, which has no canonical form (refused)", "1e400", { error: "not_canonical" }),
  valueVector("number: -1e400 is -Infinity (refused)", "-1e400", { error: "not_canonical" }),
  valueVector("number: an integer beyond the double range is Infinity (refused)", "1" + "0".repeat(310), { error: "not_canonical" }),
  valueVector("number: 1e-400 underflows to 0", "1e-400"),
  valueVector("number: 0.30000000000000004", "0.30000000000000004"),
  valueVector("number: 4.35", "4.35"),
  valueVector("number: 1/3", "0.3333333333333333"),
  valueVector("null", "null"),
  valueVector("true", "true"),
  valueVector("false", "false"),
  valueVector("empty object and array", '{"a":{},"b":[],"c":""}'),
  valueVector("nested objects and arrays (arrays keep their order)", '{"items":[{"sku":"B-2","qty":2,"opts":{"z":1,"a":[3,2,1]}},{"sku":"A-1","qty":1.5,"opts":null}],"meta":{"y":{"x":{"w":[[],[{}],[[true,false,null]]]}}}}'),
  valueVector("keys: UTF-16 order, not code point order (😀 U+1F600 before ｚ U+FF5A)", '{"ｚ":1,"😀":2,"a":3,"B":4,"é":5,"":6,"_":7,"~":8,"\u007f":9,"Z":10}'),
  valueVector("keys: array-index-like keys sort by UTF-16 code units like any other (\"10\" before \"9\")", '{"b":1,"10":2,"9":3,"a":4,"01":5,"-1":6,"1.5":7,"4294967294":8,"4294967295":9,"0":10}'),
  valueVector("keys: the empty key before \"4\"", '{"4":2,"":1}'),
  // RFC 8785 section 3.2.3: its own sorting example (the published order is "\r", "1", U+0080, U+00F6, U+20AC, U+1F600, U+FB33).
  valueVector("keys: RFC 8785 section 3.2.3 sorting example", '{"\\u20ac":"Euro Sign","\\r":"Carriage Return","\\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\\ud83d\\ude00":"Emoji: Grinning Face","\\u0080":"Control","\\u00f6":"Latin Small Letter O With Diaeresis"}'),
  // RFC 8785 section 3.2.2: its example of value serialization (numbers, string escapes, literals).
  valueVector("RFC 8785 section 3.2.2 example", '{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\\u20ac$\\u000F\\u000aA\'\\u0042\\u0022\\u005c\\\\\\"\\/","literals":[null,true,false]}'),
  valueVector("keys: __proto__ inside a value is an ordinary key", '{"__proto__":{"x":1},"constructor":2}'),
  valueVector("keys: duplicate keys in the text, the last wins", '{"a":1,"a":2}'),
  valueVector("deep nesting (40 levels)", "[".repeat(40) + "1" + "]".repeat(40)),
  { name: "intent field names: non-ASCII and index-like, in UTF-16 order", tool: { name: "multi", keyScope: "run", intentFields: ["😀", "ｚ", "10", "9", "é"], freeTextParams: [] },
    agentId: "agent-1", runId: "run-1", stepId: "step-1", entity: { type: "record", id: "r1" },
    paramsJson: '{"é":"e-acute","ｚ":"fullwidth","😀":"emoji","9":"nine","10":"ten"}' },
];

/** Keys whose murmur2 partitions are pinned beside the vectors' entity keys: tails of 0-3 bytes, UTF-8, intent ids. */
const EXTRA_PARTITION_KEYS = [
  "a", "ab", "abc", "abcd", "abcde",
  "payment:pay_1001", "payment:pay_1002", "ticket:T-42", "ticket:T-43",
  "ticket:T-é漢字😀", "payment:" + "x".repeat(300),
  "0b9a3e4c-5d6f-4a7b-8c9d-0e1f2a3b4c5d", "f47ac10b-58cc-4372-a567-0e02b2c3d479",
];

const kafkajsRequire = createRequire(import.meta.url);
/** kafkajs's murmur2 (Java's Utils.murmur2), signed 32-bit: what its DefaultPartitioner hashes. */
const murmur2 = kafkajsRequire("kafkajs/src/producer/partitioners/default/murmur2.js") as (key: string | Buffer) => number;

/**
 * The object whose canonical JSON is hashed, as src/keys.ts builds it. The
 * vectors carry its canonical text so another language can compare bytes, not
 * just hashes; `build()` fails when it no longer hashes to intentKey().
 */
function keyMaterial(v: VectorInput, params: Record<string, unknown>): unknown {
  const fields: Record<string, unknown> = {};
  for (const name of v.tool.intentFields) Object.defineProperty(fields, name, { value: params[name], enumerable: true, writable: true, configurable: true });
  const run = v.tool.keyScope === "run";
  return { v: 2, scope: v.tool.keyScope, agent: run ? v.agentId : null, run: run ? v.runId : null, step: v.stepId, tool: v.tool.name, target: entityKey(v.entity), fields };
}

const sha256 = (text: string) => createHash("sha256").update(text, "utf8").digest("hex");

/** The code `fn` throws with (a WritError's), or null when it returns. */
function errorCode(fn: () => unknown): string | null {
  try {
    fn();
    return null;
  } catch (err) {
    return (err as { code?: string }).code ?? String(err);
  }
}

export function build(): unknown {
  const vectors = INPUTS.map((v) => {
    const params = JSON.parse(v.paramsJson) as Record<string, unknown>;
    if (v.error !== undefined) {
      // A refusal: the intent key, the params fingerprint and the canonical text all fail, with this code.
      const codes = [
        errorCode(() => intentKey({ tool: v.tool, agentId: v.agentId, runId: v.runId, stepId: v.stepId, entity: v.entity, params })),
        errorCode(() => paramsFingerprint(v.tool.name, v.entity, params, v.tool.freeTextParams)),
        errorCode(() => canonicalJson(keyMaterial(v, params))),
      ];
      if (codes.some((c) => c !== v.error)) throw new Error(`vector "${v.name}": expected every computation to fail with ${v.error}, got ${codes.join(", ")}`);
      const { error, ...input } = v;
      return { ...input, expected: { error } };
    }
    const key = intentKey({ tool: v.tool, agentId: v.agentId, runId: v.runId, stepId: v.stepId, entity: v.entity, params });
    const canonical = canonicalJson(keyMaterial(v, params));
    if (sha256(canonical) !== key) {
      throw new Error(`vector "${v.name}": the canonical text rebuilt here does not hash to intentKey(); src/keys.ts changed how the key is built: update keyMaterial() (and bump the version) before regenerating`);
    }
    const ek = entityKey(v.entity);
    return {
      ...v,
      expected: {
        canonical,
        intentKey: key,
        paramsFingerprint: paramsFingerprint(v.tool.name, v.entity, params, v.tool.freeTextParams),
        entityKey: ek,
        partition: partitionFor(ek, PARTITIONS),
      },
    };
  });
  // Undos: the key of an undo is built from the undone key only (wire contract §5.7).
  const undone = [...new Set(vectors.flatMap((v) => (v.expected.intentKey === undefined ? [] : [v.expected.intentKey])))].slice(0, 4);
  const undo = [...undone, "0".repeat(64), "f".repeat(64)].map((key) => {
    const canonical = canonicalJson({ v: 2, undo: key });
    if (sha256(canonical) !== undoIntentKey(key)) throw new Error("undoIntentKey() no longer hashes {v, undo}: update this script (and bump the version) before regenerating");
    return { undoneKey: key, expected: { canonical, intentKey: undoIntentKey(key) } };
  });
  // Changes that span records: the change's id from agent, run and step; a lease intent's key from the change, the op and the record (§5.8).
  const changes = [
    { agentId: "billing-agent", runId: "conv-7f3a", stepId: "resolve-T-44", entities: [{ type: "ticket", id: "T-44" }, pay] },
    { agentId: "agent-é", runId: "run-漢字-😀", stepId: "étape/1", entities: [{ type: "ticket", id: "T-é漢字😀" }] },
    { agentId: "billing-agent", runId: "conv-7f3a", stepId: "resolve-T-45", entities: [{ type: "account", id: "c-81" }] },
  ].map((c) => {
    const canonical = canonicalJson({ v: 2, change: { agent: c.agentId, run: c.runId, step: c.stepId } });
    const change = changeId(c);
    if (sha256(canonical) !== change) throw new Error("changeId() no longer hashes {v, change}: update this script (and bump the version) before regenerating");
    const leases = c.entities.flatMap((entity) =>
      (["acquire", "release"] as const).map((op) => {
        const text = canonicalJson({ v: 2, lease: change, op, target: entityKey(entity) });
        if (sha256(text) !== leaseIntentKey(change, op, entity)) throw new Error("leaseIntentKey() no longer hashes {v, lease, op, target}: update this script first");
        return { op, entity, expected: { canonical: text, intentKey: leaseIntentKey(change, op, entity) } };
      }),
    );
    return { agentId: c.agentId, runId: c.runId, stepId: c.stepId, expected: { canonical, changeId: change }, leases };
  });
  const seen = new Set<string>();
  const vectorKeys = vectors.flatMap((v) => (v.expected.entityKey === undefined ? [] : [v.expected.entityKey]));
  const partitionKeys = [...vectorKeys, ...EXTRA_PARTITION_KEYS].filter((k) => !seen.has(k) && seen.add(k));
  return {
    about:
      "Golden vectors of writ's intent key (key version 2), computed by src/keys.ts. The canonical JSON is RFC 8785 (JCS). Every client must reproduce expected.canonical (the exact text hashed, UTF-8) and expected.intentKey (its sha256, lower-case hex) from the inputs; paramsJson is JSON text for each language's standard parser. A vector with expected.error (\"not_canonical\") has params with no canonical form: computing its intent key and params fingerprint must fail. Changing an expected value is a wire-contract change. Regenerate: node scripts/generate-intent-key-vectors.ts",
    generatedBy: "scripts/generate-intent-key-vectors.ts",
    keyVersion: 2,
    partitioner: {
      about: "Java's DefaultPartitioner for keyed records, as kafkajs's DefaultPartitioner implements it and librdkafka's murmur2_random partitioner does: (murmur2(UTF-8 key bytes) & 0x7fffffff) % partitions. murmur2 is signed 32-bit.",
      partitions: PARTITIONS,
      keys: partitionKeys.map((key) => ({ key, murmur2: murmur2(Buffer.from(key, "utf8")), partition: partitionFor(key, PARTITIONS) })),
    },
    vectors,
    undo: {
      about: "The intent key of an undo (wire contract §5.7): sha256 (lower-case hex) of the canonical JSON of {\"undo\": <the undone intent's key>, \"v\": 2}: the same for every submission of one undo, by any agent, run or retry.",
      vectors: undo,
    },
    change: {
      about: "Changes that span records (wire contract §5.8): a change's id is sha256 (lower-case hex) of the canonical JSON of {\"change\": {\"agent\", \"run\", \"step\"}, \"v\": 2}; a lease intent's key of {\"lease\": <change id>, \"op\": \"acquire\" | \"release\", \"target\": <entity key>, \"v\": 2}.",
      vectors: changes,
    },
  };
}

export function render(): string {
  return `${JSON.stringify(build(), null, 2)}\n`;
}

if (import.meta.main) {
  const text = render();
  if (process.argv.includes("--check")) {
    let current = "";
    try {
      current = readFileSync(VECTORS_FILE, "utf8");
    } catch {
      // missing: differs
    }
    if (current !== text) {
      console.error(`${VECTORS_FILE} is not what scripts/generate-intent-key-vectors.ts writes (a changed vector is a wire-contract change)`);
      process.exit(1);
    }
    console.log(`${VECTORS_FILE} is up to date`);
  } else {
    writeFileSync(VECTORS_FILE, text);
    console.log(`wrote ${VECTORS_FILE}`);
  }
}
