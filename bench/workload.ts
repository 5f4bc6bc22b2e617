// The bench's workload, shared by the writ run and the echo run so both see
// the same keys in the same mix: scenarios, which entity each intent targets,
// the closed-loop submitters, percentiles, and small Kafka helpers.
import { Kafka, Partitioners, logLevel } from "kafkajs";
import { startRequestCount, type RequestCounts } from "./broker-requests.ts";
import { startCpuCount, type CpuPids } from "./cpu.ts";

export type ScenarioName = "c64" | "c8" | "c64-sor20" | "hot";

export interface Scenario {
  name: ScenarioName;
  /** Closed-loop submitters. */
  concurrency: number;
  /** Delay of every records-server request, ms. */
  sorLatencyMs: number;
  /** When > 0, half of the intents hit this many entities. */
  hotEntities: number;
  /** Whether the raw kafkajs echo runs too (its floor does not depend on the records server). */
  echo: boolean;
}

export const SCENARIOS: readonly Scenario[] = [
  { name: "c64", concurrency: 64, sorLatencyMs: 0, hotEntities: 0, echo: true },
  { name: "c8", concurrency: 8, sorLatencyMs: 0, hotEntities: 0, echo: true },
  { name: "c64-sor20", concurrency: 64, sorLatencyMs: 20, hotEntities: 0, echo: false },
  { name: "hot", concurrency: 64, sorLatencyMs: 0, hotEntities: 5, echo: true },
];

/** Share of resubmits of already-answered intents, on top of the new ones. */
export const RESUBMIT_FRACTION = 0.1;

export function entityId(index: number): string {
  return `pay_${index}`;
}

/**
 * The id of entity `index` of a process warm-up (`--process-warmup`): apart from the timed plan's entities, so
 * that the records server's checks of the timed run never see a warm-up's writes.
 */
export function warmupEntityId(index: number): string {
  return `wpay_${index}`;
}

/** The Kafka key of an entity, as writ's client builds it (`<type>:<id>`). */
export function entityKeyOf(id: string): string {
  return `payment:${id}`;
}

/** Seeded PRNG (mulberry32): the echo and writ runs of a scenario get the same job stream. */
export function rng(seed: number): () => number {
  let a = seed >>> 0;
  return () => {
    a = (a + 0x6d2b79f5) >>> 0;
    let t = a;
    t = Math.imul(t ^ (t >>> 15), t | 1);
    t ^= t + Math.imul(t ^ (t >>> 7), t | 61);
    return ((t ^ (t >>> 14)) >>> 0) / 4294967296;
  };
}

export interface Plan {
  intents: number;
  entities: number;
  resubmits: number;
  /** Entity index of intent i. */
  entityOf: number[];
  seed: number;
}

/**
 * Which entity each of `intents` targets: round-robin over `entities`
 * (shuffled); with `hotEntities`, a random half goes round-robin over the
 * first `hotEntities` instead.
 */
export function makePlan(intents: number, entities: number, hotEntities: number, seed: number): Plan {
  const random = rng(seed);
  const entityOf = Array.from({ length: intents }, (_, i) => i % entities);
  const order = shuffle(Array.from({ length: intents }, (_, i) => i), random);
  if (hotEntities > 0) {
    for (let k = 0; k < Math.floor(intents / 2); k++) entityOf[order[k]!] = k % hotEntities;
  }
  shuffle(entityOf, random);
  return { intents, entities, resubmits: Math.round(intents * RESUBMIT_FRACTION), entityOf, seed };
}

function shuffle<T>(xs: T[], random: () => number): T[] {
  for (let i = xs.length - 1; i > 0; i--) {
    const j = Math.floor(random() * (i + 1));
    [xs[i], xs[j]] = [xs[j]!, xs[i]!];
  }
  return xs;
}

export interface Job {
  kind: "new" | "resubmit";
  /** The intent: 0 ≤ i < plan.intents. A resubmit repeats an intent already answered. */
  i: number;
}

/**
 * Hands out the plan's intents in order, with resubmits of answered intents
 * mixed in at random so that they make up `plan.resubmits` of the jobs.
 */
export class JobQueue {
  private issuedNew = 0;
  private issuedResubmits = 0;
  private readonly answered: number[] = [];
  private readonly random: () => number;
  private readonly plan: Plan;

  constructor(plan: Plan) {
    this.plan = plan;
    this.random = rng(plan.seed ^ 0x5bd1e995);
  }

  get total(): number {
    return this.plan.intents + this.plan.resubmits;
  }

  markAnswered(i: number): void {
    this.answered.push(i);
  }

  async next(): Promise<Job | null> {
    for (;;) {
      const newLeft = this.plan.intents - this.issuedNew;
      const resLeft = this.plan.resubmits - this.issuedResubmits;
      if (newLeft === 0 && resLeft === 0) return null;
      if (resLeft > 0 && this.answered.length > 0 && (newLeft === 0 || this.random() < resLeft / (newLeft + resLeft))) {
        this.issuedResubmits++;
        return { kind: "resubmit", i: this.answered[Math.floor(this.random() * this.answered.length)]! };
      }
      if (newLeft > 0) return { kind: "new", i: this.issuedNew++ };
      // Only resubmits are left and nothing has been answered yet: wait for a first answer.
      await new Promise((r) => setTimeout(r, 5));
    }
  }
}

export interface LoopResult {
  seconds: number;
  /** Per request, submit → reply, ms. */
  latencies: number[];
  /** Requests that got no reply (or a failed check) before their deadline. */
  failures: number;
  /** CPU ms each process used during the loop (bench/cpu.ts): "harness" (this process) and the roles given. */
  cpuMs: Record<string, number | null>;
  /** The requests the local broker handled during the loop, by API (bench/broker-requests.ts); null when not counted. */
  brokerRequests: RequestCounts | null;
}

/**
 * `concurrency` submitters, each: take a job, run it, await its outcome, next.
 * `run` returns the request's latency (submit → reply) and whether it was answered.
 */
export async function closedLoop(
  concurrency: number,
  queue: JobQueue,
  run: (job: Job) => Promise<{ latencyMs: number; answered: boolean }>,
  progress?: (done: number) => void,
  cpuPids: CpuPids = {},
  countBrokerRequests = false,
): Promise<LoopResult> {
  const latencies: number[] = [];
  let failures = 0;
  let done = 0;
  // Read before the clock starts and after it stops: the probe is a JVM of its own, seconds of CPU.
  const requests = countBrokerRequests ? await startRequestCount(cpuPids.broker, say) : null;
  const started = performance.now();
  const cpu = startCpuCount(cpuPids);
  await Promise.all(
    Array.from({ length: concurrency }, async () => {
      for (let job = await queue.next(); job !== null; job = await queue.next()) {
        const r = await run(job);
        latencies.push(r.latencyMs);
        if (!r.answered) failures++;
        else if (job.kind === "new") queue.markAnswered(job.i);
        done++;
        if (progress && done % 500 === 0) progress(done);
      }
    }),
  );
  const seconds = (performance.now() - started) / 1000;
  const cpuMs = cpu();
  const brokerRequests = requests === null ? null : await requests();
  return { seconds, latencies, failures, cpuMs, brokerRequests };
}

/**
 * A process warm-up (`--process-warmup`): `plan`'s jobs through `submit`, `concurrency` at a time, untimed, on
 * warmupEntityId's entities; `submit` says whether the request was answered, and the warm-up throws unless every
 * one was.
 */
export async function warmUpProcesses(label: string, concurrency: number, plan: Plan, submit: (id: string, job: Job) => Promise<boolean>): Promise<void> {
  const warmed = await closedLoop(concurrency, new JobQueue(plan), async (job) => ({ latencyMs: 0, answered: await submit(warmupEntityId(plan.entityOf[job.i]!), job) }));
  if (warmed.failures > 0) throw new Error(`${label} process warm-up: ${warmed.failures} requests not answered`);
  say(`  ${label}: ${plan.intents + plan.resubmits} untimed requests through the same processes in ${warmed.seconds.toFixed(1)} s`);
}

/** Nearest-rank percentile of unsorted values; null when there are none. */
export function percentile(values: readonly number[], p: number): number | null {
  if (values.length === 0) return null;
  const sorted = [...values].sort((a, b) => a - b);
  return sorted[Math.min(sorted.length - 1, Math.max(0, Math.ceil((p / 100) * sorted.length) - 1))]!;
}

export function round(x: number | null, digits = 1): number | null {
  if (x === null || !Number.isFinite(x)) return null;
  const f = 10 ** digits;
  return Math.round(x * f) / f;
}

const partitioner = Partitioners.DefaultPartitioner();

/** The partition writ's client (Java-compatible murmur2) puts `key` on. */
export function partitionOf(key: string, partitions: number): number {
  return partitioner({
    topic: "any",
    partitionMetadata: Array.from({ length: partitions }, (_, partitionId) => ({ partitionId, leader: 0, replicas: [0], isr: [0], partitionErrorCode: 0 })),
    message: { key, value: null },
  });
}

/** One entity id per partition (`<prefix><n>`), for warm-ups that must reach every partition. */
export function onePerPartition(prefix: string, partitions: number): string[] {
  const ids: (string | undefined)[] = Array.from({ length: partitions });
  for (let n = 0; ids.some((x) => x === undefined); n++) {
    const id = `${prefix}${n}`;
    const p = partitionOf(entityKeyOf(id), partitions);
    ids[p] ??= id;
  }
  return ids as string[];
}

/** Deletes those of `topics` that exist. Errors are reported on stderr, not thrown. */
export async function deleteTopics(brokers: string[], topics: string[]): Promise<void> {
  const admin = new Kafka({ clientId: "writ-bench-cleanup", brokers, logLevel: logLevel.NOTHING }).admin();
  try {
    await admin.connect();
    const existing = new Set(await admin.listTopics());
    const mine = topics.filter((t) => existing.has(t));
    if (mine.length > 0) await admin.deleteTopics({ topics: mine, timeout: 30_000 });
  } catch (err) {
    process.stderr.write(`bench: could not delete topics ${topics.join(", ")}: ${String(err)}\n`);
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

export function say(line: string): void {
  process.stderr.write(`${line}\n`);
}
