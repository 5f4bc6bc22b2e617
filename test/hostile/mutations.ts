// fast-check mutations of valid signed intents: field deletions, replacements and additions with
// arbitrary JSON (and values chosen to reach the deeper checks: other agents, tools, topics, patch ops),
// byte flips, truncations and insertions, framing with other schema ids, forged or missing signature
// headers, random keys and partitions. Some mutated values are re-signed with the right agent's key,
// so they pass authentication and meet the checks behind it. A valid signed intent is interleaved every
// `validEvery` mutations; mutations derive only from valid intents sent in earlier batches.
import fc from "fast-check";
import { partitionFor } from "../../src/kafka/partition.ts";
import { type Ent, PARTITIONS, type World } from "./world.ts";
import { type Agent, type Json, frame, independentIntentKey, sign, SIGNATURE_HEADER } from "./wire.ts";
import type { SentHeaders } from "./measure.ts";

type JOp =
  | { t: "delete"; pick: number }
  | { t: "replace"; pick: number; value: unknown }
  | { t: "add"; pick: number; name: string; value: unknown };
type BOp = { t: "flip"; at: number; xor: number } | { t: "truncate"; at: number } | { t: "insert"; at: number; bytes: Uint8Array } | { t: "bignum" };

interface Case {
  base: number;
  json: JOp[];
  resign: boolean;
  /** With `resign`: the intent key recomputed from the mutated fields too, so the intent is new to the ledger and meets the pipeline's checks (delta, record, version). */
  rekey: boolean;
  bytes: BOp[];
  framing: "intents" | "plain" | "random-id" | "dlq-id";
  randomId: number;
  header: "keep" | "drop" | "other-agent" | "garbage" | "dup";
  garbage: string;
  key: "entity" | "mutated-entity" | "random" | "null" | "other";
  randomKey: string;
  other: number;
  partition: number | null;
}

interface PoolEntry {
  intent: Json;
  agent: Agent;
  key: string;
}

function caseArb(w: World): fc.Arbitrary<Case> {
  const interesting = fc.constantFrom<unknown>(
    null, "", 0, -1, 1.5, 2 ** 53, 1e308, "\u0000", "\ud800", [], {}, true, "*",
    ...w.agents.flatMap((a) => [a.id, a.replyTopic]), w.decoyTopic, w.missingTopic, "eve",
    "refund_payment", "tag_ticket", "drop_tables", "payment", "ticket",
    "/refunds/-", "/refunds/0", "/tags", "/tags/-", "/status", "/amountCents", "/", "",
    "add", "remove", "replace", "move", "copy", "test",
    { op: "remove", path: "/tags" }, { op: "move", from: "/tags", path: "/status" }, { op: "copy", from: "/status", path: "/tags" }, { op: "add", path: "/amountCents", value: 0 },
    { op: "add", path: "/refunds/-", value: { amountCents: 1 } }, { amountCents: 700, reason: "late" }, { tag: "vip" }, "\"v1\"", "2025-01-01T00:00:00Z",
    "0".repeat(64), "f".repeat(64), "x".repeat(300),
  );
  const value = fc.oneof({ weight: 3, arbitrary: interesting }, { weight: 2, arbitrary: fc.jsonValue({ maxDepth: 3 }) }, { weight: 1, arbitrary: fc.string({ unit: "binary", maxLength: 40 }) });
  const name = fc.oneof(fc.constantFrom("__proto__", "constructor", "prototype", "toString", "", "intentId", "agent", "id", "from", "value", SIGNATURE_HEADER), fc.string({ maxLength: 12 }));
  const jop: fc.Arbitrary<JOp> = fc.oneof(
    fc.record({ t: fc.constant("delete" as const), pick: fc.nat() }),
    fc.record({ t: fc.constant("replace" as const), pick: fc.nat(), value }),
    fc.record({ t: fc.constant("add" as const), pick: fc.nat(), name, value }),
  );
  const bop: fc.Arbitrary<BOp> = fc.oneof(
    { weight: 4, arbitrary: fc.record({ t: fc.constant("flip" as const), at: fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }), xor: fc.integer({ min: 1, max: 255 }) }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant("truncate" as const), at: fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }) }) },
    { weight: 1, arbitrary: fc.record({ t: fc.constant("insert" as const), at: fc.double({ min: 0, max: 1, noNaN: true, maxExcluded: true }), bytes: fc.uint8Array({ minLength: 1, maxLength: 8 }) }) },
    { weight: 1, arbitrary: fc.constant({ t: "bignum" as const }) },
  );
  return fc.record({
    base: fc.nat(),
    json: fc.array(jop, { maxLength: 3 }),
    resign: fc.oneof({ weight: 3, arbitrary: fc.constant(false) }, { weight: 2, arbitrary: fc.constant(true) }),
    rekey: fc.oneof({ weight: 3, arbitrary: fc.constant(false) }, { weight: 1, arbitrary: fc.constant(true) }),
    bytes: fc.oneof({ weight: 3, arbitrary: fc.constant([] as BOp[]) }, { weight: 2, arbitrary: fc.array(bop, { minLength: 1, maxLength: 3 }) }),
    framing: fc.constantFrom<Case["framing"]>("intents", "intents", "intents", "intents", "intents", "intents", "plain", "plain", "random-id", "dlq-id"),
    randomId: fc.integer({ min: -5, max: 5_000 }),
    header: fc.constantFrom<Case["header"]>("keep", "keep", "keep", "keep", "keep", "keep", "keep", "drop", "other-agent", "garbage", "dup"),
    garbage: fc.string({ maxLength: 300 }),
    key: fc.constantFrom<Case["key"]>("entity", "entity", "entity", "entity", "entity", "entity", "mutated-entity", "random", "null", "other"),
    randomKey: fc.string({ unit: "binary", maxLength: 40 }),
    other: fc.nat(),
    partition: fc.oneof({ weight: 4, arbitrary: fc.constant(null) }, { weight: 1, arbitrary: fc.integer({ min: 0, max: PARTITIONS - 1 }) }),
  });
}

/** Every path into a JSON value (objects and arrays), up to a depth; `containers` only objects and arrays. */
function paths(v: unknown, containers: boolean): (string | number)[][] {
  const out: (string | number)[][] = containers ? [[]] : [];
  const stack: [unknown, (string | number)[]][] = [[v, []]];
  while (stack.length > 0) {
    const [x, p] = stack.pop()!;
    if (x === null || typeof x !== "object" || p.length > 6) continue;
    for (const [k, c] of Object.entries(x)) {
      const path = [...p, Array.isArray(x) ? Number(k) : k];
      const isContainer = c !== null && typeof c === "object";
      if (!containers || isContainer) out.push(path);
      stack.push([c, path]);
    }
  }
  return out;
}

function at(root: Json, path: (string | number)[]): Json {
  let x = root;
  for (const k of path) x = x[k];
  return x;
}

function define(target: Json, k: string | number, value: unknown): void {
  Object.defineProperty(target, k, { value, enumerable: true, writable: true, configurable: true });
}

function applyJson(root: Json, op: JOp): Json {
  if (op.t === "add") {
    const cs = paths(root, true);
    const path = cs[op.pick % cs.length]!;
    const target = at(root, path);
    if (Array.isArray(target)) target.splice(op.pick % (target.length + 1), 0, structuredClone(op.value));
    else define(target, op.name, structuredClone(op.value));
    return root;
  }
  const ps = paths(root, false);
  if (ps.length === 0) return op.t === "replace" ? structuredClone(op.value) : root;
  const path = ps[op.pick % ps.length]!;
  const parent = at(root, path.slice(0, -1));
  const k = path.at(-1)!;
  if (op.t === "delete") {
    if (Array.isArray(parent)) parent.splice(k as number, 1);
    else delete parent[k];
  } else define(parent, k, structuredClone(op.value));
  return root;
}

function applyBytes(b: Buffer, op: BOp): Buffer {
  if (b.length === 0) return b;
  if (op.t === "bignum") return Buffer.from(b.toString("latin1").replace(/:(\d+)/, ":9007199254740993123"), "latin1");
  const i = Math.floor(op.at * b.length);
  if (op.t === "flip") {
    const c = Buffer.from(b);
    c[i] = c[i]! ^ op.xor;
    return c;
  }
  if (op.t === "truncate") return b.subarray(0, i);
  return Buffer.concat([b.subarray(0, i), Buffer.from(op.bytes), b.subarray(i)]);
}

export interface Mutated {
  key: string | null;
  value: Buffer;
  headers: SentHeaders;
  partition?: number;
}

/**
 * One mutated record. The base is a valid intent sent earlier, resubmitted under a new intent id (as an
 * agent may resubmit an intent key), so that no mutation carries the id of a valid record: a valid
 * record's replies are its own.
 */
export function mutate(w: World, pool: PoolEntry[], c: Case, id: string): Mutated {
  const entry = pool[c.base % pool.length]!;
  const base = { ...entry, intent: { ...structuredClone(entry.intent), intentId: id } };
  let v: Json = structuredClone(base.intent);
  for (const op of c.json) v = applyJson(v, op);
  const named = w.agents.find((a) => a.id === v?.agent?.id);
  const signer = named ?? base.agent;
  if (c.resign && c.rekey && v !== null && typeof v === "object" && !Array.isArray(v)) {
    const key = independentIntentKey(v, signer.id);
    if (key !== null) v.intentKey = key;
  }
  let signature: string;
  try {
    signature = c.resign ? sign(v, signer) : sign(base.intent, base.agent);
  } catch {
    signature = sign(base.intent, base.agent);
  }
  const text = JSON.stringify(v) ?? "undefined";
  let value =
    c.framing === "intents" ? w.framed(text) : c.framing === "plain" ? Buffer.from(text) : frame(c.framing === "dlq-id" ? w.schemaIds.dlq : c.randomId, text);
  for (const op of c.bytes) value = applyBytes(value, op);
  const other = w.agents[(w.agents.indexOf(signer) + 1) % w.agents.length]!;
  let headers: SentHeaders;
  if (c.header === "keep") headers = { [SIGNATURE_HEADER]: signature };
  else if (c.header === "drop") headers = {};
  else if (c.header === "other-agent") headers = { [SIGNATURE_HEADER]: (() => { try { return sign(v, other); } catch { return "x"; } })() };
  else if (c.header === "garbage") headers = { [SIGNATURE_HEADER]: c.garbage };
  else headers = { [SIGNATURE_HEADER]: [signature, signature] };
  const e = v?.entity;
  const key =
    c.key === "entity" ? base.key
    : c.key === "mutated-entity" ? (typeof e?.type === "string" && typeof e?.id === "string" ? `${e.type}:${e.id}` : base.key)
    : c.key === "random" ? c.randomKey
    : c.key === "null" ? null
    : pool[c.other % pool.length]!.key;
  return { key, value, headers, ...(c.partition === null ? (key === null ? { partition: partitionFor(base.key, PARTITIONS) } : {}) : { partition: c.partition }) };
}

const dump = new Set((process.env.HOSTILE_DUMP_IDS ?? "").split(",").filter(Boolean));

/** Sends `cases` mutations in batches (sendBatch, acks -1), with a valid signed intent every `validEvery`. */
export async function runMutations(
  w: World,
  opts: { cases: number; seed: number; batch: number; validEvery: number; pool: PoolEntry[]; say: (l: string) => void },
): Promise<void> {
  const payments: Ent[] = Array.from({ length: 4 * PARTITIONS }, () => w.entity("payment"));
  const arb = caseArb(w);
  const pool = opts.pool;
  const started = Date.now();
  let sent = 0;
  let validN = 0;
  let nextReport = 10_000;
  for (let batchNo = 0; sent < opts.cases; batchNo++) {
    const n = Math.min(opts.batch, opts.cases - sent);
    const cases = fc.sample(arb, { numRuns: n, seed: opts.seed + batchNo });
    const messages: { key: string | Buffer | null; value: Buffer | null; headers?: SentHeaders; partition?: number }[] = [];
    const fresh: PoolEntry[] = [];
    for (let i = 0; i < n; i++) {
      if ((sent + i) % opts.validEvery === 0) {
        const which = validN++ % 4;
        const agent = [w.billing, w.alice, w.ops, w.ops][which]!;
        const ticket = which === 1 || which === 3;
        const e = ticket ? w.entity("ticket") : payments[validN % payments.length]!;
        const intent = ticket ? w.tag(agent, e, `m-valid-${validN}`) : w.refund(agent, e, `m-valid-${validN}`, 100 + validN);
        const out = w.valid(intent, agent, `interleaved valid ${validN}`);
        w.book.note(out.role, out.value, out.headers, out.label);
        messages.push(out);
        fresh.push({ intent, agent, key: e.key });
      }
      const m = mutate(w, pool, cases[i]!, `m-${opts.seed}-${sent + i}`);
      w.book.note("mutation", m.value, m.headers, "mutation");
      if (dump.has(`m-${opts.seed}-${sent + i}`)) opts.say(`DUMP m-${opts.seed}-${sent + i}: ${JSON.stringify({ case: cases[i], key: m.key, partition: m.partition, headers: m.headers, value: m.value.toString("base64") })}`);
      messages.push(m);
    }
    if (process.env.HOSTILE_DEBUG) opts.say(`  batch ${batchNo}: ${messages.length} messages, ${messages.reduce((s, m) => s + (m.value?.length ?? 0), 0)} bytes, max ${Math.max(...messages.map((m) => m.value?.length ?? 0))}`);
    await w.producer.sendBatch({
      acks: -1,
      topicMessages: [{ topic: w.topics.intents, messages: messages.map((m) => ({ key: m.key, value: m.value, headers: m.headers as never, ...(m.partition === undefined ? {} : { partition: m.partition }) })) }],
    });
    pool.push(...fresh);
    sent += n;
    if (sent >= nextReport || sent === opts.cases) {
      nextReport += 10_000;
      opts.say(`  ${sent} of ${opts.cases} mutations sent (${validN} valid interleaved) in ${((Date.now() - started) / 1000).toFixed(1)} s`);
    }
  }
}

export type { PoolEntry };
