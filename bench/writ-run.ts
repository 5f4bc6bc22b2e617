// One writ scenario: one owner process (bench/owner-process.ts, the demo tools) on
// fresh topics, a demo records server that does NOT dedupe by Idempotency-Key
// (so dedupe measured here is writ's), and closed-loop submitters that each
// submit a refund with a unique ref against the last version they saw of the
// record, await the reply, next.
// Afterwards every claim is checked at the records server.
import { createWritClient, type IntentInput, type SubmitResult, type WritClient } from "../producers/writ-client.ts";
import type { ChildProcess } from "node:child_process";
import { refundPayment } from "../examples/demo-tools.ts";
import { readRecord } from "../examples/example-stack.ts";
import { Agent, request } from "undici";
import type { Logger } from "../src/logger.ts";
import type { DemoRecordsStats, HistoryEntry, PatchRequestRow } from "../src/testing/demo-records-server.ts";
import { callChild, startChild, startService, stopChild } from "./child.ts";
import { closedLoop, deleteTopics, entityId, JobQueue, onePerPartition, say, warmupEntityId, warmUpProcesses, type LoopResult, type Plan } from "./workload.ts";

export interface WritOptions {
  brokers: string[];
  registryUrl: string | undefined;
  /** Names this run's topics and groups. */
  tag: string;
  partitions: number;
  concurrency: number;
  sorLatencyMs: number;
  plan: Plan;
  logger: Logger;
  timeoutMs: number;
  keepTopics: boolean;
  /** The local broker's pid, for the CPU it spends (bench/cpu.ts); undefined for a broker elsewhere. */
  brokerPid?: number | undefined;
  /** Count the local broker's requests during the loop, by API (bench/broker-requests.ts). */
  countBrokerRequests?: boolean;
  /**
   * Untimed intents (over warmupEntityId's entities) through the same owner and records server before the clock
   * starts, at the same concurrency, so that the timed loop measures processes whose JIT has settled, as a
   * long-running owner's has; null: the timed loop starts right after the first intent of each partition.
   */
  processWarmup?: Plan | null;
}

/** What the records server says about the run. */
export interface WritChecks {
  /** Most PATCH requests that reached the records server for one intent key. */
  patchesPerIntentMax: number;
  /** Intents with exactly one applied PATCH and one committed write. */
  appliedOnce: number;
  /** Refunds of the run whose ref is in the final record exactly once. */
  presentOnce: number;
  /** Resubmits answered `applied`, `duplicate: true`, with no PATCH for their key after its first commit. */
  duplicatesAnswered: number;
  /** PATCH requests that reached the server for an intent key after that key's first committed write. */
  patchesAfterCommit: number;
  /** New intents whose reply was not `applied` (first answer, not a duplicate). */
  badReplies: number;
  /** Records whose version history is not one chain. */
  brokenChains: number;
  exact: boolean;
}

export interface WritResult extends LoopResult {
  checks: WritChecks;
  /** Per new intent: ms from submit to the owner's decision (the reply's `at`), and from there to the reply seen. */
  split: { toDecided: number[]; toReply: number[] };
}

interface Payment {
  refunds: { ref?: string }[];
}

export async function runWrit(opts: WritOptions): Promise<WritResult> {
  const { brokers, registryUrl, tag, plan, logger, partitions } = opts;
  const topics = { intents: `writ.bench.${tag}.intents`, ledger: `writ.bench.${tag}.ledger`, human: `writ.bench.${tag}.human`, dlq: `writ.bench.${tag}.dlq` };
  const replyTopic = `writ.replies.bench.${tag}`;
  // The records server (the system of record) runs in a process of its own, as the owner does (bench/records-process.ts).
  const service = await startService("records-process.ts", { BENCH_RECORDS: JSON.stringify({ latencyMs: opts.sorLatencyMs }) }, `bench-records-${tag}.log`, {
    execArgv: nodeArgs("BENCH_RECORDS_NODE_ARGS"),
  });
  const records: Records = { process: service.child, url: (service.started as { url: string }).url };
  const warmIds = onePerPartition("warm_", partitions);
  const refund = (id: string, step: string, ref: string, baseVersion: string): IntentInput => ({
    tool: refundPayment,
    entity: { type: "payment", id },
    runId: `bench-${tag}`,
    stepId: step,
    baseVersion,
    delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 1, reason: "goodwill", ref } }],
    params: { amountCents: 1, reason: "goodwill", ref },
  });
  const refOf = (i: number) => `${tag}-r${i}`;
  const inputOf = (i: number, baseVersion: string) => refund(entityId(plan.entityOf[i]!), `s${i}`, refOf(i), baseVersion);
  // An owner that cannot go on fails the run at once instead of at every submitter's deadline.
  let fatal: (err: Error) => void = () => undefined;
  const died = new Promise<never>((_, reject) => (fatal = reject));
  died.catch(() => undefined);
  const orDied = <T>(p: Promise<T>): Promise<T> => Promise.race([p, died]);

  let owner: ChildProcess | null = null;
  let client: WritClient | null = null;
  const recordsGone = (code: number | null) => fatal(new Error(`the records server's process exited (${code}); see .writ/bench-records-${tag}.log`));
  records.process.once("exit", recordsGone);
  try {
    const seedState = { customer: "bench", amountCents: 1_000_000_000, currency: "EUR", refunds: [] };
    const warmupIds = opts.processWarmup ? Array.from({ length: opts.processWarmup.entities }, (_, e) => warmupEntityId(e)) : [];
    const ids = [...Array.from({ length: plan.entities }, (_, e) => entityId(e)), ...warmIds, ...warmupIds];
    await callChild(records.process, "seedMany", ["payment", ids.map((id) => ({ id, state: seedState }))]);
    // The owner runs in a process of its own, as in production (bench/child.ts): its event loop is not the submitters'.
    // BENCH_OWNER_EXTRA (JSON) overrides owner settings for an experiment, e.g. '{"offsetCommitIntervalMs":1000}';
    // the owner validates them as any configuration.
    const ownerConfig = { brokers, schemaRegistryUrl: registryUrl, groupId: `writ.bench.${tag}`, intentPartitions: partitions, topics, ...JSON.parse(process.env.BENCH_OWNER_EXTRA ?? "{}") };
    const ownerLog = `bench-owner-${tag}.log`;
    const execArgv = nodeArgs("BENCH_OWNER_NODE_ARGS");
    owner = await startChild("owner-process.ts", { BENCH_OWNER_CONFIG: JSON.stringify(ownerConfig), RECORDS_URL: records.url, WRIT_INSTANCE_ID: `bench-${tag}` }, ownerLog, { execArgv });
    owner.once("exit", (code) => fatal(new Error(`the owner process exited (${code}); see .writ/${ownerLog}`)));
    const writ = await createWritClient({ brokers, agentId: "bench", replyTopic, intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger });
    client = writ;

    // Warm-up: assignment, each partition's fence + ledger restore, schema registration, reply topic.
    const warm = await orDied(writ.submitAll(warmIds.map((id) => refund(id, `warm-${id}`, `warm-${id}`, SEEDED_VERSION)), { timeoutMs: 120_000 }));
    const notApplied = warm.filter((r) => r.status !== "applied");
    if (notApplied.length > 0) throw new Error(`writ warm-up: ${notApplied.length} intents answered ${notApplied[0]!.status}`);
    if (opts.processWarmup) {
      // As the timed loop: each refund against the last version a reply named for its record.
      const warmVersion = new Map<string, string>();
      await orDied(
        warmUpProcesses("writ", opts.concurrency, opts.processWarmup, async (id, job) => {
          const reply = await writ.submit(refund(id, `w${job.i}`, `${tag}-w${job.i}`, warmVersion.get(id) ?? SEEDED_VERSION), { timeoutMs: opts.timeoutMs });
          if (reply.status === "applied") warmVersion.set(id, reply.version);
          return reply.status === "applied";
        }),
      );
    }

    const split: [number, number][] = [];
    const firstReplies: (SubmitResult | undefined)[] = Array.from({ length: plan.intents });
    const resubmitReplies: { i: number; reply: SubmitResult }[] = [];
    const queue = new JobQueue(plan);
    const agentRead = process.env.BENCH_AGENT_READ === "1";
    const lastVersion = new Map<number, string>();
    const result = await orDied(
      closedLoop(
        opts.concurrency,
        queue,
        async (job) => {
          const entity = plan.entityOf[job.i]!;
          // The version the agent submits against: the last one a reply named for the entity (a refund appends, and
          // refund_payment rebases a commutative delta onto the record as it is); BENCH_AGENT_READ=1 reads it
          // fresh from the records server before each submit instead, at the records server's latency.
          const baseVersion = agentRead ? (await harnessRead(records.url, entityId(entity))).version : (lastVersion.get(entity) ?? SEEDED_VERSION);
          const t0 = performance.now();
          const wall0 = Date.now();
          const reply = await writ.submit(inputOf(job.i, baseVersion), { timeoutMs: opts.timeoutMs });
          const latencyMs = performance.now() - t0;
          if (reply.status === "applied") lastVersion.set(entity, reply.version);
          // Where the time went (ms, wall clock, one process): submit → the owner decided (`at`), decided → reply seen.
          const decided = "at" in reply && typeof reply.at === "string" ? Date.parse(reply.at) : NaN;
          if (job.kind === "new" && Number.isFinite(decided)) split.push([decided - wall0, Date.now() - decided]);
          if (job.kind === "new") firstReplies[job.i] = reply;
          else resubmitReplies.push({ i: job.i, reply });
          return { latencyMs, answered: reply.status === "applied" };
        },
        (done) => say(`  writ: ${done}/${queue.total}`),
        { broker: opts.brokerPid, owner: owner.pid, records: records.process.pid },
        opts.countBrokerRequests ?? false,
      ),
    );
    say(`  writ: ${queue.total} submissions in ${result.seconds.toFixed(1)} s`);
    const keyOf = (i: number) => writ.buildIntent(inputOf(i, SEEDED_VERSION)).intentKey;
    const checks = await check(records, plan, keyOf, refOf, firstReplies, resubmitReplies);
    return { ...result, checks, split: { toDecided: split.map((x) => x[0]), toReply: split.map((x) => x[1]) } };
  } finally {
    await (client as WritClient | null)?.close();
    if (owner) {
      owner.removeAllListeners("exit");
      await stopChild(owner);
    }
    records.process.off("exit", recordsGone);
    await stopChild(records.process);
    if (!opts.keepTopics) await deleteTopics(brokers, [...Object.values(topics), replyTopic]);
  }
}

/** The ETag of a record the records server was just seeded with. */
const SEEDED_VERSION = '"v1"';

/**
 * The agent's read before each submit with BENCH_AGENT_READ=1: the workload's, not writ's, yet its CPU lands on
 * the machine the run shares, and its latency in each submitter's loop. undici's `request` on a keep-alive Agent
 * of its own, as the owner's HTTP adapter reads, rather than `fetch` (WHATWG streams and Request/Response objects
 * per call), so that the submitters' figure carries as little of the harness as it can.
 */
const harnessAgent = new Agent({ keepAliveTimeout: 30_000 });
async function harnessRead(recordsUrl: string, id: string): Promise<{ version: string }> {
  const res = await request(`${recordsUrl}/records/payment/${id}`, { dispatcher: harnessAgent });
  await res.body.dump();
  const etag = res.headers["etag"];
  if (res.statusCode !== 200 || typeof etag !== "string") throw new Error(`records server: GET payment/${id} answered ${res.statusCode}`);
  return { version: etag };
}

/** The records server's process and where it listens. */
interface Records {
  process: ChildProcess;
  url: string;
}

async function check(
  records: Records,
  plan: Plan,
  keyOf: (i: number) => string,
  refOf: (i: number) => string,
  firstReplies: (SubmitResult | undefined)[],
  resubmits: { i: number; reply: SubmitResult }[],
): Promise<WritChecks> {
  const byKey = new Map<string, PatchRequestRow[]>();
  for (const row of await callChild<PatchRequestRow[]>(records.process, "patchRequests", [])) {
    if (row.idempotencyKey === null) continue;
    const rows = byKey.get(row.idempotencyKey) ?? [];
    rows.push(row);
    byKey.set(row.idempotencyKey, rows);
  }
  const writesByKey = (await callChild<DemoRecordsStats>(records.process, "stats", [])).writesByKey;
  /** Seq of the first committed PATCH per key, and how many PATCHes came after it. */
  const afterCommit = (key: string): number => {
    const rows = byKey.get(key) ?? [];
    const first = rows.find((r) => r.outcome === "applied");
    return first === undefined ? 0 : rows.filter((r) => r.seq > first.seq).length;
  };

  let patchesPerIntentMax = 0;
  let appliedOnce = 0;
  let patchesAfterCommit = 0;
  let badReplies = 0;
  const keys: string[] = [];
  for (let i = 0; i < plan.intents; i++) {
    const key = keyOf(i);
    keys.push(key);
    const rows = byKey.get(key) ?? [];
    patchesPerIntentMax = Math.max(patchesPerIntentMax, rows.length);
    if (rows.filter((r) => r.outcome === "applied").length === 1 && writesByKey[key] === 1) appliedOnce++;
    patchesAfterCommit += afterCommit(key);
    const reply = firstReplies[i];
    if (reply?.status !== "applied" || reply.duplicate) badReplies++;
  }
  const duplicatesAnswered = resubmits.filter(
    ({ i, reply }) => reply.status === "applied" && reply.duplicate && afterCommit(keys[i]!) === 0,
  ).length;

  // Every refund of the run in its record exactly once, nothing else added; every history one chain.
  const expected = new Map<number, Set<string>>();
  for (let i = 0; i < plan.intents; i++) {
    const e = plan.entityOf[i]!;
    const set = expected.get(e) ?? new Set<string>();
    set.add(refOf(i));
    expected.set(e, set);
  }
  let presentOnce = 0;
  let strangers = 0;
  let brokenChains = 0;
  const histories = await callChild<HistoryEntry[][]>(records.process, "histories", ["payment", Array.from({ length: plan.entities }, (_, e) => entityId(e))]);
  for (let e = 0; e < plan.entities; e++) {
    const record = await readRecord<Payment>(records.url, "payment", entityId(e));
    const counts = new Map<string, number>();
    for (const r of record.state.refunds) counts.set(r.ref ?? "", (counts.get(r.ref ?? "") ?? 0) + 1);
    const mine = expected.get(e) ?? new Set<string>();
    for (const ref of mine) if (counts.get(ref) === 1) presentOnce++;
    for (const ref of counts.keys()) if (!mine.has(ref)) strangers++;
    const history = histories[e]!;
    if (history.some((h, k) => k > 0 && h.fromVersion !== history[k - 1]!.toVersion)) brokenChains++;
  }
  const exact =
    appliedOnce === plan.intents &&
    presentOnce === plan.intents &&
    strangers === 0 &&
    patchesAfterCommit === 0 &&
    badReplies === 0 &&
    brokenChains === 0 &&
    duplicatesAnswered === resubmits.length &&
    resubmits.length === plan.resubmits;
  return { patchesPerIntentMax, appliedOnce, presentOnce, duplicatesAnswered, patchesAfterCommit, badReplies, brokenChains, exact };
}

/**
 * Node options for a child process from the environment: BENCH_OWNER_NODE_ARGS for the owner, BENCH_RECORDS_NODE_ARGS
 * for the records server, e.g. "--cpu-prof --cpu-prof-dir=.writ/prof" for a profile.
 */
function nodeArgs(variable: string): string[] {
  return (process.env[variable] ?? "").split(" ").filter((a) => a !== "");
}
