// `npm run test:hostile [-- --cases N --seed N]`: the hostile-input suite (issue 9, part 7). One
// in-process owner with an agent registry of three agents meets 100+ hand-written poison and attack
// records, each followed by a valid signed intent on the same record key, then N fast-check mutations
// of valid signed intents with valid ones interleaved. Everything is measured from outside the owner.
// Progress goes to stderr; the last stdout line is the figures as JSON; exit 1 on any failure.
import { mkdirSync } from "node:fs";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { systems, tools } from "../../examples/demo-tools.ts";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";
import { startRouter, type Router } from "../../src/owner/router.ts";
import { ensureStack } from "../../src/testing/local-stack.ts";
import { runAttacks } from "./attacks.ts";
import { IntentsTail, pollUntil, recordsServerEffects, Taps } from "./measure.ts";
import { runMutations, type PoolEntry } from "./mutations.ts";
import { registryOf } from "./wire.ts";
import { createWorld, PARTITIONS } from "./world.ts";

const USAGE = `usage: npm run test:hostile [-- options]

The hostile-input suite: one in-process owner with an agent registry meets hand-written poison and attack
records, then fast-check mutations of valid signed intents, valid ones interleaved; measured from outside.
The last stdout line is the figures as JSON; exit 1 on any failure. Needs the dev stack (KAFKA_BROKERS and
SCHEMA_REGISTRY_URL, or npm run kafka:up's).

  --cases N         fast-check mutations (default 100000)
  --seed N          their seed (default: random; printed)
  --batch N         mutations produced per batch (default 2000)
  --valid-every N   a valid signed intent after every N mutations (default 500)
  --deadline-s N    how long to wait for the owner to pass every record (default 900)
  --stall-s N       stop waiting once no committed offset moved for N s while some are behind (default 90)
  --log-level L     the owner's log level, to .writ/hostile-<run>/owner.log (default error)
  --only TEXT       run only the attacks whose label or kind contains TEXT (repeatable)
  --skip TEXT       skip the attacks whose label or kind contains TEXT (repeatable)
  --ablate unsigned-owner
                    a second owner group without an agent registry on the same intents topic: the
                    measure must catch its effects (the run then exits 1 as it should)
  --help`;

hideKafkajsTimeoutWarning();
const parsed = (() => {
  try {
    return parseOptions();
  } catch (err) {
    process.stderr.write(`test:hostile: ${(err as Error).message}\n(npm run test:hostile -- --help for the options)\n`);
    process.exit(2);
  }
})();
const { values: args } = parsed;
function parseOptions() {
  return parseArgs({
  options: {
    help: { type: "boolean", default: false },
    cases: { type: "string", default: "100000" },
    seed: { type: "string" },
    batch: { type: "string", default: "2000" },
    "valid-every": { type: "string", default: "500" },
    "deadline-s": { type: "string", default: "900" },
    "stall-s": { type: "string", default: "90" },
    "log-level": { type: "string", default: "error" },
    ablate: { type: "string" },
    only: { type: "string", multiple: true },
    skip: { type: "string", multiple: true },
  },
  strict: true,
  });
}
if (args.help) {
  console.log(USAGE);
  process.exit(0);
}
const int = (name: string, raw: string | undefined, min: number) => {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got ${raw}`);
  return n;
};
const cases = int("cases", args.cases, 0);
const seed = args.seed === undefined ? Math.floor(Math.random() * 0x7fffffff) : int("seed", args.seed, 0);
const deadlineMs = int("deadline-s", args["deadline-s"], 10) * 1000;
if (args.ablate !== undefined && args.ablate !== "unsigned-owner") throw new Error("--ablate takes unsigned-owner");
const say = (l: string) => process.stderr.write(`${l}\n`);
const started = Date.now();

// owner_crashes: the router's onFatal, and anything unhandled in this process.
const crashes: string[] = [];
const crash = (what: string) => {
  crashes.push(what);
  process.stderr.write(`CRASH ${what}\n`);
};
process.on("unhandledRejection", (err) => crash(`unhandled rejection: ${(err as Error)?.stack ?? String(err)}`));
process.on("uncaughtException", (err) => crash(`uncaught exception: ${err.stack ?? String(err)}`));

async function main(): Promise<number> {
  say(`hostile-input suite: ${cases} mutations, seed ${seed}${args.ablate ? `, ABLATION ${args.ablate}` : ""}`);
  const up = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
  if (!up.endpoints.registryUrl) throw new Error("the hostile suite needs a schema registry (set SCHEMA_REGISTRY_URL with KAFKA_BROKERS)");
  const w = await createWorld({ brokers: up.endpoints.brokers, registryUrl: up.endpoints.registryUrl });
  const logDir = resolve(import.meta.dirname, "..", "..", ".writ", `hostile-${w.id}`);
  mkdirSync(logDir, { recursive: true });
  let ownerErrors = 0;
  const logger = pino(
    { name: "writ-hostile-owner", level: args["log-level"], hooks: { logMethod(a, method, level) { if (level >= 50) ownerErrors++; method.apply(this, a); } } },
    pino.destination({ dest: join(logDir, "owner.log"), sync: true }),
  );
  say(`  run ${w.id}: intents ${w.topics.intents} (${PARTITIONS} partitions), records server ${w.records.url}, owner log ${join(logDir, "owner.log")}`);

  const config = { brokers: w.brokers, schemaRegistryUrl: w.registryUrl, groupId: w.groupId, clientId: `writ-hostile-${w.id}`, intentPartitions: PARTITIONS, topics: w.topics, sessionTimeoutMs: 15_000 };
  const routers: Router[] = [];
  // With the ablation, the honest owner's minute's watch only reports the second group (the hold would stop it
  // answering: the measure is what the second group's owner does), and the second starts once it owns its partitions
  // (else the honest owner's take-up check finds the second group and stops, as a misconfigured group must).
  const honest = args.ablate === "unsigned-owner" ? { ablateTakeUp: true } : {};
  routers.push(await startRouter({ config, tools, systems: systems({ RECORDS_URL: w.records.url }), agents: registryOf(w.agents), logger, onFatal: (err) => crash(`onFatal: ${err.stack ?? err.message}`) }, honest));
  if (args.ablate === "unsigned-owner") {
    // The deliberately broken owner: no agent registry, its own group, ledger, human and dead-letter topics, the same intents.
    const ab = `${w.groupId}.ablate`;
    say(`  ABLATION: a second owner without an agent registry on group ${ab}; the measure must catch its effects`);
    const first = await pollUntil(async () => routers[0]!.ownedPartitions().length === PARTITIONS, (ok) => ok, 120_000);
    if (!first.ok) throw new Error("the owner did not take up its 6 partitions within 120 s");
    const topics = { ...w.topics, ledger: `${w.topics.ledger}.ablate`, human: `${w.topics.human}.ablate`, dlq: `${w.topics.dlq}.ablate` };
    // Another group on the same intents topic on purpose: past the check that refuses one beside a running group.
    routers.push(await startRouter({ config: { ...config, groupId: ab, topics, clientId: `${config.clientId}-ablate` }, tools, systems: systems({ RECORDS_URL: w.records.url }), logger }, { ablateSingleWriter: true }));
  }
  const ready = await pollUntil(async () => routers.every((r) => r.ready() && r.ownedPartitions().length === PARTITIONS), (ok) => ok, 120_000);
  if (!ready.ok) throw new Error("the owner did not take up its 6 partitions within 120 s");
  say(`  owner ready in ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const taps = new Taps(w.kafka, w.codec, w.book, [...w.agents.map((a) => a.replyTopic), w.decoyTopic], w.topics.dlq);
  await taps.start();
  const tail = new IntentsTail(w.kafka, w.topics.intents);
  await tail.start();

  say("phase 1: hand-written poison and attack records, each followed by a valid signed intent on the same key");
  const pool: PoolEntry[] = [];
  const attacks = await runAttacks(w, say, pool, { only: args.only ?? [], skip: args.skip ?? [] });
  const attackInputs = w.book.inputs;
  say(`  ${attacks.length} attacks (${attackInputs} records) and ${w.book.valid.length} valid intents sent in ${((Date.now() - started) / 1000).toFixed(1)} s`);

  say(`phase 2: ${cases} fast-check mutations of valid signed intents (seed ${seed}), a valid intent every ${args["valid-every"]}`);
  const p2 = Date.now();
  await runMutations(w, { cases, seed, batch: int("batch", args.batch, 1), validEvery: int("valid-every", args["valid-every"], 1), pool, say });
  say(`  sent in ${((Date.now() - p2) / 1000).toFixed(1)} s; waiting for the owner (deadline ${deadlineMs / 1000} s)`);

  // stuck_partitions: every intents partition's committed offset must pass its last record, within the deadline.
  let lastReport = 0;
  // The wait ends at the deadline, or once no committed offset has moved for `stall-s` while some are behind.
  let progress = "";
  let movedAt = Date.now();
  const stallMs = int("stall-s", args["stall-s"], 5) * 1000;
  await pollUntil(
    async () => {
      const behind = await tail.behind(w.admin, w.groupId);
      const now = behind.map((b) => `${b.partition}:${b.committed}/${b.lastData}`).join(",");
      if (now !== progress) [progress, movedAt] = [now, Date.now()];
      else if (behind.length > 0 && Date.now() - movedAt > stallMs) {
        say(`  no committed offset moved for ${stallMs / 1000} s: giving up waiting`);
        return [];
      }
      if (Date.now() - lastReport > 15_000) {
        lastReport = Date.now();
        say(`  owner: ${behind.length} partition(s) behind: ${behind.map((b) => `p${b.partition} committed ${b.committed} of ${b.lastData}`).join(", ") || "none"}; replies rejected ${taps.rejected}, dlq ${taps.dlq}`);
      }
      return behind;
    },
    (b) => b.length === 0 || Date.now() - movedAt > stallMs,
    deadlineMs,
    500,
  );
  const stuck = (await tail.behind(w.admin, w.groupId)).length;
  if (stuck === 0) say(`  every intents partition's committed offset passed its last record ${((Date.now() - p2) / 1000).toFixed(1)} s after phase 2 began`);
  for (const b of stuck > 0 ? await tail.behind(w.admin, w.groupId) : []) say(`  STUCK partition ${b.partition}: committed ${b.committed}, last record ends at ${b.lastData}, high watermark ${b.high}`);

  const validIds = new Map<string, { n: number; topic: string; key: string; label: string }>();
  for (const v of w.book.valid) {
    const e = validIds.get(v.intentId);
    if (e) e.n++;
    else validIds.set(v.intentId, { n: 1, topic: w.agents.find((a) => a.id === v.agent)!.replyTopic, key: v.intentKey, label: v.label });
  }
  const answers = () => {
    let answered = 0;
    const notApplied: string[] = [];
    for (const [id, v] of validIds) {
      const rs = (taps.replies.get(id) ?? []).filter((r) => r.topic === v.topic && r.intentKey === v.key);
      answered += Math.min(v.n, rs.length);
      if (rs.length > 0 && !rs.some((r) => r.status === "applied")) notApplied.push(`${v.label}: ${rs.map((r) => `${r.status}${r.reason ? `:${r.reason}` : ""}`).join(", ")}`);
    }
    return { answered, notApplied };
  };
  const settled = await pollUntil(async () => (await taps.caughtUp(w.admin)) && answers().answered === w.book.valid.length, (ok) => ok, stuck === 0 ? 120_000 : 5_000, 500);
  if (!settled.ok) say("  the reply and dead-letter readers did not reach the topics' ends (or valid intents are unanswered)");

  // unauthorized_effects: at the records server, on reply topics, and a reply topic an intent named that owners must never create.
  const server = recordsServerEffects(w.records, w.book, w.seeds);
  const created = (await w.admin.listTopics()).includes(w.missingTopic) ? 1 : 0;
  const unauthorized = server.unauthorized.count + taps.unauthorizedReplies.length + created;
  const { answered, notApplied } = answers();
  const problems = [
    ...crashes,
    ...server.unauthorized.examples.map((x) => `unauthorized effect at the records server: ${x}`),
    ...taps.unauthorizedReplies.slice(0, 20).map((x) => `unauthorized reply: ${x}`),
    ...(created ? [`the owner created the topic ${w.missingTopic} an intent named`] : []),
    ...server.duplicates.map((x) => `valid intent key ${x} (must be once)`),
    ...notApplied.map((x) => `valid intent not applied: ${x}`),
    ...[...validIds].filter(([id, v]) => (taps.replies.get(id) ?? []).filter((r) => r.topic === v.topic).length === 0).slice(0, 20).map(([, v]) => `valid intent unanswered: ${v.label}`),
  ];

  say("attack outcomes (expected → observed):");
  const byKind = new Map<string, number>();
  for (const at of attacks) {
    byKind.set(at.kind, (byKind.get(at.kind) ?? 0) + 1);
    const seen = taps.attackOutcomes.get(at.label) ?? [];
    say(`  [${at.kind}] ${at.label}: ${at.expect} → ${seen.length ? [...new Set(seen)].join(", ") : "(no reply, no dead letter)"}`);
  }
  say(`attacks by kind: ${[...byKind].map(([k, n]) => `${k} ${n}`).join(", ")} (${attacks.length} attacks, ${attackInputs} records)`);
  say(`dead letters by reason: ${JSON.stringify(Object.fromEntries(taps.dlqReasons))}`);
  say(`replies by status: ${JSON.stringify(Object.fromEntries([...taps.tally].sort((x, y) => y[1] - x[1])))}`);
  say(`mutations that were genuinely signed intents (re-signed, still valid): ${w.book.oracleValidMutations}; owner error log lines: ${ownerErrors}`);
  for (const r of routers) if (!r.health().ok) say(`owner health: ${JSON.stringify(r.health()).slice(0, 600)}`);
  for (const p of problems.slice(0, 60)) say(`PROBLEM ${p}`);
  say(`run time ${((Date.now() - started) / 1000).toFixed(1)} s`);

  const line = {
    inputs: w.book.inputs,
    owner_crashes: crashes.length,
    stuck_partitions: stuck,
    unauthorized_effects: unauthorized,
    valid_sent: w.book.valid.length,
    valid_answered: answered,
    dlq: taps.dlq,
    rejected: taps.rejected,
  };
  await Promise.allSettled(routers.map((r) => r.stop()));
  await taps.stop();
  await tail.stop();
  await w.producer.disconnect().catch(() => undefined);
  const mine = (await w.admin.listTopics()).filter((t) => t.includes(`hostile.${w.id}`));
  await w.admin.deleteTopics({ topics: mine, timeout: 30_000 }).catch((err) => say(`  could not delete topics: ${(err as Error).message}`));
  await w.admin.disconnect().catch(() => undefined);
  await w.records.close();
  if (up.started) await up.stop();
  logger.flush();
  console.log(JSON.stringify(line));
  const failed = line.owner_crashes > 0 || line.stuck_partitions > 0 || line.unauthorized_effects > 0 || line.valid_answered !== line.valid_sent || problems.length > crashes.length;
  return failed ? 1 : 0;
}

// A failure of the harness itself (not of the owner) ends the run with exit 2.
process.exit(
  await main().catch((err: unknown) => {
    say(`hostile suite: harness error: ${(err as Error)?.stack ?? String(err)}`);
    return 2;
  }),
);
