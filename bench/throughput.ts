// `npm run bench`: writ and a raw kafkajs request-reply echo, side by side on
// one broker (the local one, reused or started). Per scenario, one JSON line on
// stdout; progress and a closing table on stderr. The default runs the four
// throughput scenarios and the transaction floor (bench/txn-floor.ts: the
// broker's back-to-back transactions with nothing else to do, one producer per
// partition as writ's owner has, in transactions v2 and v1, then one producer
// over all partitions); the memory line needs `--scenario memory` (or `all`).
// Untimed warm-up rounds (`--warmup` intents, C=64) come first, until the broker's JIT settles. Then each
// scenario's processes (the owner, records server and echo service, which start afresh per run) serve
// `--process-warmup` untimed submissions of the scenario's shape before the clock starts, until their own JIT
// has settled, as a long-running owner's has.
// It asserts nothing of the scenarios: `exact` says whether the records server
// saw every intent applied exactly once (a warm-up that was not exact fails
// the run, since no line would say so).
//
//   npm run bench [-- --scenario c64|c8|c64-sor20|hot|txn-floor|memory|throughput|all] [--intents 3000] [--entities 200]
//                 [--memory-entries 1000000] [--keep-topics] [--seed 1] [--warmup 3000] [--warmup-rounds 8]
//                 [--process-warmup 3000]
//
// writ_rps / echo_rps: answered submissions (new intents and the 10 %
// resubmits) per second of wall time, closed loop; the echo runs once right
// before and once right after writ, and its figures cover both runs.
// Latencies: per request, submit → reply. Checks: at the records server
// (see writ-run.ts). `cpu`: CPU ms per request of each process during the
// loop (owner, broker, records server, submitters; echo service, broker,
// submitters) and the cores busy on average (bench/cpu.ts); a second table on
// stderr sets them side by side.
import { randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { availableParallelism } from "node:os";
import { join, resolve } from "node:path";
import { parseArgs } from "node:util";
import { pino } from "pino";
import { RouterConfig } from "../src/config.ts";
import { brokerPid, ensureStack, LOCAL_BROKER } from "../src/testing/local-stack.ts";
import { REDACT_PATHS } from "../src/logger.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { perRequest, sumRequests } from "./broker-requests.ts";
import { cpuSummary, jvmCompileMs } from "./cpu.ts";
import { runEcho } from "./echo.ts";
import { runMemory, type MemoryResult } from "./memory.ts";
import { runTxnFloor, type TxnFloorResult } from "./txn-floor.ts";
import { makePlan, percentile, round, say, SCENARIOS, type Plan, type Scenario } from "./workload.ts";
import { runWrit } from "./writ-run.ts";
import { exitWhenWritten } from "../src/cli/exit.ts";

/** The owner's default spacing of its v2 transactions (WRIT_TRANSACTION_SPACING_MS), which the transaction floor uses too. */
const OWNER_SPACING_MS = RouterConfig.shape.transactionSpacingMs.parse(undefined);
/** The block of partitions per transaction of the txn-floor line between one per partition and all of them (docs/architecture.md §5.5). */
const FLOOR_BLOCK = 4;

/** How a floor line names its producer's protocol: v2 with its spacing. */
function floorProtocol(protocol: "v1" | "v2", spacingMs: number): string {
  return protocol === "v2" ? `transactions v2, ${spacingMs} ms apart` : `transactions ${protocol}`;
}

hideKafkajsTimeoutWarning();
const root = resolve(import.meta.dirname, "..");
const { values: args } = parseArgs({
  options: {
    scenario: { type: "string", default: "throughput" },
    intents: { type: "string", default: "3000" },
    entities: { type: "string", default: "200" },
    "memory-entries": { type: "string", default: "1000000" },
    "keep-topics": { type: "boolean", default: false },
    seed: { type: "string", default: "1" },
    warmup: { type: "string", default: "3000" },
    "warmup-rounds": { type: "string", default: "8" },
    "process-warmup": { type: "string", default: "3000" },
    help: { type: "boolean", short: "h", default: false },
  },
});
if (args.help) {
  say("npm run bench -- [--scenario c64|c8|c64-sor20|hot|txn-floor|memory|throughput|all] [--intents N] [--entities E] [--memory-entries M] [--keep-topics] [--seed S] [--warmup N] [--warmup-rounds R] [--process-warmup N]");
  process.exit(0);
}
const positive = (name: string, raw: string, least = 1): number => {
  const n = Number(raw);
  if (!Number.isInteger(n) || n < least) {
    say(`bench: --${name} must be ${least === 0 ? "a whole number (0 or more)" : "a positive integer"}, got ${raw}`);
    process.exit(2);
  }
  return n;
};
const INTENTS = positive("intents", args.intents);
const ENTITIES = positive("entities", args.entities);
const MEMORY_ENTRIES = positive("memory-entries", args["memory-entries"]);
const SEED = positive("seed", args.seed);
const WARMUP = positive("warmup", args.warmup, 0);
const WARMUP_ROUNDS = positive("warmup-rounds", args["warmup-rounds"]);
const PROCESS_WARMUP = positive("process-warmup", args["process-warmup"], 0);
/**
 * The broker is warm once its JIT compile time in a round (jstat's, the compilations' wall time, which counts a
 * compiler thread waiting for a core too) is at most this share of its CPU time; without jstat,
 * WARMUP_ROUNDS_BLIND rounds.
 */
const WARMUP_JIT_SHARE = 0.2;
const WARMUP_ROUNDS_BLIND = 6;
const PARTITIONS = 12;
const TIMEOUT_MS = 60_000;
const throughputNames: string[] = [...SCENARIOS.map((s) => s.name), "txn-floor"];
const names = [...throughputNames, "memory"];
if (!["all", "throughput", ...names].includes(args.scenario)) {
  say(`bench: --scenario must be one of ${names.join(", ")}, throughput (the default: all but memory) or all, got ${args.scenario}`);
  process.exit(2);
}
// The memory line writes about 1 GB to the broker and took over 2 minutes on the 2-core development
// machine, so the default run leaves it out: `--scenario memory` or `--scenario all`.
const selected = args.scenario === "all" ? names : args.scenario === "throughput" ? throughputNames : [args.scenario];

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
// The broker's CPU is counted when it is the local single-node stack's (a process on this machine).
const localBrokerPid = brokers.length === 1 && brokers[0] === LOCAL_BROKER ? brokerPid() : undefined;
// The clients' logs (kafkajs's #304 retries among them) go to a file, not between the progress lines; the owner and the
// echo service run in processes of their own (bench/child.ts), each logging to .writ/bench-owner-*.log, bench-echo-*.log.
mkdirSync(join(root, ".writ"), { recursive: true });
const logFile = join(root, ".writ", "bench.log");
const logger = pino({ name: "bench", level: process.env.LOG_LEVEL ?? "warn", redact: REDACT_PATHS }, pino.destination(logFile));
const run = randomUUID().slice(0, 8);
say(`writ bench ${run}: ${INTENTS} intents (+${Math.round(INTENTS * 0.1)} resubmits) on ${ENTITIES} entities, ${PARTITIONS} partitions, brokers ${brokers.join(",")}`);
say(`  client logs: ${logFile}; owner and echo service logs: .writ/bench-owner-*.log, .writ/bench-echo-*.log`);

interface Line {
  scenario: string;
  writ_rps: number | null;
  echo_rps: number | null;
  ratio: number | null;
  p50_ms: number | null;
  p99_ms: number | null;
  echo_p50_ms: number | null;
  echo_p99_ms: number | null;
  bound_rps: number | null;
  fraction_of_bound: number | null;
  patches_per_intent_max: number;
  duplicates_answered: number;
  exact: boolean;
  /** CPU ms per request by process, and cores busy on average during the loop (bench/cpu.ts); null figures where unreadable. */
  cpu: { writ: CpuLine; echo: CpuLine | null };
  /** The local broker's requests per request, by API, during each loop (bench/broker-requests.ts); null where not counted. */
  broker_requests: { writ: Record<string, number> | null; echo: Record<string, number> | null };
}
type CpuLine = ReturnType<typeof cpuSummary>;
const lines: Line[] = [];
let memory: MemoryResult | null = null;
const floors: TxnFloorResult[] = [];
let failed = false;

/** What the echo's and writ's closed loops share, for `concurrency` submitters over `plan`. */
function loopOptions(concurrency: number, plan: Plan) {
  return { brokers, brokerPid: localBrokerPid, partitions: PARTITIONS, concurrency, plan, logger, timeoutMs: TIMEOUT_MS, keepTopics: args["keep-topics"] };
}

async function scenario(s: Scenario): Promise<Line> {
  say(`\n[${s.name}] C=${s.concurrency}, records server latency ${s.sorLatencyMs} ms${s.hotEntities ? `, half of the intents on ${s.hotEntities} entities` : ""}`);
  const plan = makePlan(INTENTS, ENTITIES, s.hotEntities, SEED);
  // Each process's warm-up: the scenario's concurrency and key mix, on entities of its own (another seed).
  const processWarmup = PROCESS_WARMUP > 0 ? makePlan(PROCESS_WARMUP, ENTITIES, s.hotEntities, SEED + 1) : null;
  const common = { ...loopOptions(s.concurrency, plan), countBrokerRequests: true, processWarmup };
  // The echo runs right before and right after writ, and counts as one run of both halves: on a
  // noisy machine the floor then brackets the writ run instead of standing at one end of it.
  const before = s.echo ? await runEcho({ ...common, tag: `${run}.${s.name}.e1` }) : null;
  const writ = await runWrit({ ...common, registryUrl, tag: `${run}.${s.name}`, sorLatencyMs: s.sorLatencyMs });
  const after = s.echo ? await runEcho({ ...common, tag: `${run}.${s.name}.e2` }) : null;
  const echo =
    before && after
      ? {
          seconds: before.seconds + after.seconds,
          latencies: [...before.latencies, ...after.latencies],
          failures: before.failures + after.failures,
          cpuMs: Object.fromEntries(Object.keys(before.cpuMs).map((k) => [k, sumOrNull(before.cpuMs[k], after.cpuMs[k])])),
          brokerRequests: sumRequests(before.brokerRequests, after.brokerRequests),
        }
      : null;
  const q = (xs: number[], p: number) => round(percentile(xs, p), 0);
  say(
    `  writ split (new intents, p50/p99 ms): submit → owner decided ${q(writ.split.toDecided, 50)}/${q(writ.split.toDecided, 99)}, ` +
      `decided → reply seen ${q(writ.split.toReply, 50)}/${q(writ.split.toReply, 99)}`,
  );
  const requests = plan.intents + plan.resubmits;
  const writRps = (requests - writ.failures) / writ.seconds;
  const echoRps = echo ? (2 * requests - echo.failures) / echo.seconds : null;
  if (before && after) {
    say(`  echo before writ ${(requests / before.seconds).toFixed(0)} rps, after ${(requests / after.seconds).toFixed(0)} rps`);
  }
  const writCpu = cpuSummary(writ.cpuMs, requests, writ.seconds);
  const echoCpu = echo ? cpuSummary(echo.cpuMs, 2 * requests, echo.seconds) : null;
  const roles = (c: CpuLine) => Object.entries(c.per_request_ms).map(([role, ms]) => `${role} ${ms ?? "?"}`).join(", ");
  say(`  CPU ms per request: writ ${roles(writCpu)} (${writCpu.cores_busy} cores busy)${echoCpu ? `; echo ${roles(echoCpu)} (${echoCpu.cores_busy} cores busy)` : ""}`);
  const writRequests = perRequest(writ.brokerRequests, requests);
  const echoRequests = echo ? perRequest(echo.brokerRequests, 2 * requests) : null;
  const apis = (r: Record<string, number>) => Object.entries(r).map(([api, n]) => `${api} ${n}`).join(", ");
  if (writRequests) say(`  broker requests per request: writ ${apis(writRequests)}${echoRequests ? `; echo ${apis(echoRequests)}` : ""}`);
  const bound = s.sorLatencyMs > 0 ? Math.min(s.concurrency, ENTITIES) / ((2 * s.sorLatencyMs) / 1000) : null;
  return {
    scenario: s.name,
    writ_rps: round(writRps, 0),
    echo_rps: round(echoRps, 0),
    ratio: echoRps ? round(writRps / echoRps, 3) : null,
    p50_ms: round(percentile(writ.latencies, 50)),
    p99_ms: round(percentile(writ.latencies, 99)),
    echo_p50_ms: echo ? round(percentile(echo.latencies, 50)) : null,
    echo_p99_ms: echo ? round(percentile(echo.latencies, 99)) : null,
    bound_rps: bound === null ? null : round(bound, 0),
    fraction_of_bound: bound === null ? null : round(writRps / bound, 3),
    patches_per_intent_max: writ.checks.patchesPerIntentMax,
    duplicates_answered: writ.checks.duplicatesAnswered,
    exact: writ.checks.exact && writ.failures === 0 && (echo?.failures ?? 0) === 0,
    cpu: { writ: writCpu, echo: echoCpu },
    broker_requests: { writ: writRequests, echo: echoRequests },
  };
}

function sumOrNull(a: number | null | undefined, b: number | null | undefined): number | null {
  return a === null || a === undefined || b === null || b === undefined ? null : a + b;
}

/**
 * Untimed rounds of the echo and writ (C=64, `--warmup` intents each) before the first scenario or transaction
 * floor. A broker just started compiles its hot code for tens of seconds on the cores the bench measures: on
 * 2026-12-02, a fresh broker's JIT compile time came to 102 % of its CPU time in the first round of 3,000 intents,
 * 66, 46, 29 and 26 % in the next four, and 16 % in the sixth, when its CPU per writ request had come down from
 * 3.05 ms to 0.64 (0.61-0.83 in eight more rounds); the first full run after one round missed C=8's p99 target
 * that the run right after it met. So rounds repeat until the broker's JIT compile time in a round is at most
 * WARMUP_JIT_SHARE of its CPU time (`jstat -compiler`, a JDK tool), at most `--warmup-rounds`. A local broker
 * without jstat gets WARMUP_ROUNDS_BLIND rounds; a broker elsewhere, whose CPU cannot be read, one. Nothing of a
 * round is measured but that; a wrong answer in it still fails the bench.
 */
async function warmUp(): Promise<void> {
  say(`\n[warm-up] ${WARMUP} intents at C=64 through the echo and writ per round, until the broker's JIT settles (at most ${WARMUP_ROUNDS} rounds; --warmup 0 skips it)`);
  const plan = makePlan(WARMUP, ENTITIES, 0, SEED);
  const common = loopOptions(64, plan);
  const requests = plan.intents + plan.resubmits;
  let share: number | null = null;
  for (let round = 1; round <= WARMUP_ROUNDS; round++) {
    const compiledBefore = jvmCompileMs(localBrokerPid);
    const echo = await runEcho({ ...common, tag: `${run}.warmup${round}.e` });
    const writ = await runWrit({ ...common, registryUrl, tag: `${run}.warmup${round}`, sorLatencyMs: 0 });
    if (!writ.checks.exact || writ.failures > 0 || echo.failures > 0) {
      throw new Error(`warm-up round ${round}: writ exact ${writ.checks.exact}, writ failures ${writ.failures}, echo failures ${echo.failures}`);
    }
    const compiledAfter = jvmCompileMs(localBrokerPid);
    const brokerMs = sumOrNull(echo.cpuMs.broker, writ.cpuMs.broker);
    const jitMs = compiledBefore === null || compiledAfter === null ? null : compiledAfter - compiledBefore;
    share = jitMs === null || !brokerMs ? null : jitMs / brokerMs;
    say(
      `  round ${round}: echo ${(requests / echo.seconds).toFixed(0)} rps, writ ${(requests / writ.seconds).toFixed(0)} rps, ` +
        `broker CPU per writ request ${cpuSummary(writ.cpuMs, requests, writ.seconds).per_request_ms.broker ?? "?"} ms, ` +
        `JIT compile time ${share === null ? "?" : `${Math.round(share * 100)} %`} of the broker's CPU time`,
    );
    if (localBrokerPid === undefined || (share === null ? round >= WARMUP_ROUNDS_BLIND : share <= WARMUP_JIT_SHARE)) return;
  }
  if (share !== null) say(`  the broker was still compiling after ${WARMUP_ROUNDS} rounds; measuring anyway`);
}

try {
  // The transaction floor too: its first line, on a broker just started, ran at 1,174 transactions/s against
  // the control's 1,281 after it, and at 2,498 against 1,241 once the broker had run it; after this warm-up, on a
  // broker just started, 1,886 against 1,149.
  if (WARMUP > 0 && selected.some((name) => name === "txn-floor" || SCENARIOS.some((s) => s.name === name))) await warmUp();
  for (const name of selected) {
    if (name === "memory") {
      say(`\n[memory] ${MEMORY_ENTRIES.toLocaleString("en")} ledger entries, owner in a child process`);
      memory = await runMemory({ brokers, registryUrl, tag: `${run}.memory`, partitions: PARTITIONS, entries: MEMORY_ENTRIES, logger, keepTopics: args["keep-topics"] });
      console.log(
        JSON.stringify({
          scenario: "memory",
          ledger_entries: memory.entries,
          owner_rss_mb: memory.ownerRssMb,
          bytes_per_entry: memory.bytesPerEntry,
          baseline_rss_mb: memory.baselineRssMb,
          entry_value_bytes: memory.valueBytes,
          restore_s: memory.restoreSeconds,
          run_s: memory.seconds,
        }),
      );
      continue;
    }
    if (name === "txn-floor") {
      // The owner's producer in both protocols, v2 first (the one the owner picks on a Kafka 4 cluster), one per
      // partition as the owner has them, with the owner's default spacing; then v2 without it (the control); then
      // v2 producers whose transactions cover a block of partitions each: 4 (three producers for writ's 12), and all.
      const runs = [
        ["v2", 1, OWNER_SPACING_MS],
        ["v2", 1, 0],
        ["v1", 1, 0],
        ["v2", FLOOR_BLOCK, OWNER_SPACING_MS],
        ["v2", PARTITIONS, OWNER_SPACING_MS],
      ] as const;
      for (const [protocol, block, spacingMs] of runs) {
        const who = `${Math.ceil(PARTITIONS / block)} transactional producers × ${block} partitions per transaction`;
        say(`\n[txn-floor] ${who} (${floorProtocol(protocol, spacingMs)}), back-to-back transactions for 15 s, nothing else running`);
        const floor = await runTxnFloor({ brokers, brokerPid: localBrokerPid, partitions: PARTITIONS, seconds: 15, protocol, spacingMs, block, logger, keepTopics: args["keep-topics"] });
        floors.push(floor);
        console.log(
          JSON.stringify({
            scenario: "txn-floor",
            protocol: floor.protocol,
            spacing_ms: floor.spacingMs,
            producers: floor.producers,
            partitions_per_txn: floor.partitionsPerTxn,
            txn_per_s: floor.txnPerSecond,
            partition_txn_per_s: floor.partitionTxnPerSecond,
            txn_p50_ms: floor.p50Ms,
            txn_p99_ms: floor.p99Ms,
            transactions: floor.transactions,
            cpu_ms_per_txn: floor.cpuMsPerTxn,
            cpu_ms_per_partition_txn: floor.cpuMsPerPartitionTxn,
            broker_requests_per_txn: floor.brokerRequestsPerTxn,
          }),
        );
      }
      continue;
    }
    const line = await scenario(SCENARIOS.find((s) => s.name === name)!);
    lines.push(line);
    console.log(JSON.stringify(line));
  }
} catch (err) {
  failed = true;
  say(`bench failed: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}`);
}

// The closing table.
const fmt = (x: number | null | boolean, w: number) => String(x ?? "-").padStart(w);
if (lines.length > 0) {
  say("");
  say(`writ bench ${run}: ${INTENTS} intents + ${Math.round(INTENTS * 0.1)} resubmits, ${ENTITIES} entities, ${PARTITIONS} partitions, 1 owner; rps = answered submissions/s`);
  say(`${"scenario".padEnd(10)}${fmt("writ rps" as never, 9)}${fmt("echo rps" as never, 9)}${fmt("ratio" as never, 7)}${fmt("p50" as never, 8)}${fmt("p99" as never, 8)}${fmt("echo p50" as never, 9)}${fmt("echo p99" as never, 9)}${fmt("bound" as never, 7)}${fmt("of bound" as never, 9)}${fmt("patch/int" as never, 10)}${fmt("dups" as never, 6)}${fmt("exact" as never, 7)}`);
  for (const l of lines) {
    say(
      `${l.scenario.padEnd(10)}${fmt(l.writ_rps, 9)}${fmt(l.echo_rps, 9)}${fmt(l.ratio, 7)}${fmt(l.p50_ms, 8)}${fmt(l.p99_ms, 8)}${fmt(l.echo_p50_ms, 9)}${fmt(l.echo_p99_ms, 9)}${fmt(l.bound_rps, 7)}${fmt(l.fraction_of_bound, 9)}${fmt(l.patches_per_intent_max, 10)}${fmt(l.duplicates_answered, 6)}${fmt(l.exact, 7)}`,
    );
  }
  say("latencies in ms, per request (submit → reply); bound = min(C, entities) / (2 × records-server latency)");
}
if (lines.some((l) => l.cpu.writ.cores_busy > 0)) {
  // Where the cores went: with every process on one machine, a closed loop that keeps the cores busy answers
  // cores / (CPU ms per request) requests a second, so echo CPU ÷ writ CPU is the ratio this machine allows.
  const total = (c: CpuLine | null) => (c ? Object.values(c.per_request_ms).reduce<number>((a, b) => a + (b ?? 0), 0) : null);
  const ms = (c: CpuLine | null, role: string) => c?.per_request_ms[role] ?? null;
  say("");
  say(`CPU ms per request (${availableParallelism()} cores): writ = owner + broker + records server + submitters; echo = service + broker + submitters`);
  say(`${"scenario".padEnd(10)}${fmt("owner" as never, 7)}${fmt("broker" as never, 7)}${fmt("records" as never, 8)}${fmt("subm." as never, 7)}${fmt("total" as never, 7)}${fmt("cores" as never, 7)}${fmt("echo svc" as never, 9)}${fmt("broker" as never, 7)}${fmt("subm." as never, 7)}${fmt("total" as never, 7)}${fmt("cores" as never, 7)}${fmt("cpu ratio" as never, 10)}`);
  for (const l of lines) {
    const w = l.cpu.writ;
    const e = l.cpu.echo;
    const wt = total(w);
    const et = total(e);
    const r = (x: number | null) => (x === null ? null : Math.round(x * 100) / 100);
    say(
      `${l.scenario.padEnd(10)}${fmt(ms(w, "owner"), 7)}${fmt(ms(w, "broker"), 7)}${fmt(ms(w, "records"), 8)}${fmt(ms(w, "harness"), 7)}${fmt(r(wt), 7)}${fmt(w.cores_busy, 7)}${fmt(ms(e, "service"), 9)}${fmt(ms(e, "broker"), 7)}${fmt(ms(e, "harness"), 7)}${fmt(r(et), 7)}${fmt(e?.cores_busy ?? null, 7)}${fmt(wt && et ? Math.round((et / wt) * 1000) / 1000 : null, 10)}`,
    );
  }
  say("cpu ratio = echo's CPU per request ÷ writ's: the throughput ratio the cores allow when both runs keep them busy");
}
if (lines.some((l) => l.broker_requests.writ !== null)) {
  // What the broker is asked per request: a transaction is a Produce per partition's first records, the partition
  // leader's AddPartitionsToTxn to the coordinator (transactions v2), EndTxn and the coordinator's WriteTxnMarkers.
  const shown = ["Produce", "Fetch", "AddPartitionsToTxn", "EndTxn", "WriteTxnMarkers", "TxnOffsetCommit", "OffsetCommit"];
  const heads = ["Produce", "Fetch", "AddPart.", "EndTxn", "Markers", "TxnOffs.", "OffsCom.", "other", "total"];
  const row = (r: Record<string, number> | null) => {
    if (r === null) return heads.map(() => fmt(null, 9)).join("");
    const all = Object.values(r).reduce((a, b) => a + b, 0);
    const other = all - shown.reduce((a, api) => a + (r[api] ?? 0), 0);
    const cells = [...shown.map((api) => r[api] ?? 0), other, all].map((x) => Math.round(x * 100) / 100);
    return cells.map((x) => fmt(x, 9)).join("");
  };
  say("");
  say("Broker requests per request, by API (the broker's own RequestsPerSec counts; AddPart. and Markers are the broker's requests to itself)");
  say(`${"scenario".padEnd(16)}${heads.map((h) => fmt(h as never, 9)).join("")}`);
  for (const l of lines) {
    say(`${`${l.scenario} writ`.padEnd(16)}${row(l.broker_requests.writ)}`);
    if (l.broker_requests.echo) say(`${`${l.scenario} echo`.padEnd(16)}${row(l.broker_requests.echo)}`);
  }
}
for (const floor of floors) {
  say(
    `txn-floor (${floorProtocol(floor.protocol, floor.spacingMs)}): ${floor.producers} producers × ${floor.partitionsPerTxn} partitions per transaction, ` +
      `${floor.txnPerSecond} transactions/s back to back (p50 ${floor.p50Ms} ms, p99 ${floor.p99Ms} ms) = ${floor.partitionTxnPerSecond} partition-transactions/s; ` +
      `CPU per partition-transaction: broker ${floor.cpuMsPerPartitionTxn.broker ?? "?"} ms, producers ${floor.cpuMsPerPartitionTxn.producers} ms`,
  );
}
if (floors.length > 0) {
  say("writ spends one to two transaction slots per intent (its pending entry shares its result's transaction unless its PATCH outlasts 250 ms), shared by the intents a transaction carries;");
  say("the lines over blocks are the floor of one transaction per round over a block of an owner's partitions (docs/architecture.md §5.5), a design writ does not have yet");
}
if (memory) {
  say(
    `memory: ${memory.entries.toLocaleString("en")} ledger entries → owner RSS ${memory.ownerRssMb} MB (empty ledger ${memory.baselineRssMb} MB), ${memory.bytesPerEntry} bytes/entry; restore ${memory.restoreSeconds} s`,
  );
}

if (stack.started) await stack.stop();
// Its JSON lines are read through pipes (CI's tee and grep): out before the exit (src/cli/exit.ts).
await exitWhenWritten(failed ? 1 : 0);
