// The deterministic hanging-transaction case. It reproduces, on purpose, the
// CI failure where a committed transaction left an agent's reply partition
// without its commit marker, and shows writ heal it with no manual step, by
// both of its healing paths:
//
// 1. The hang. An owner's transaction carries a reply to an agent whose reply
//    partition has ONE replica, on broker X. `beforeCommit` holds the
//    transaction after its records were sent; X is SIGKILLed and the controller
//    fences it (the partition has no leader: -1); then the commit goes on. The
//    transaction coordinator writes PREPARE_COMMIT and finds no leader for the
//    reply partition: Kafka 4.4's KRaftMetadataCache.getPartitionLeaderEndpoint
//    answers "none" for leader -1, and TransactionMarkerChannelManager
//    .addTxnMarkersToBrokerQueue then logs "Couldn't find leader endpoint for
//    partitions … these partitions are likely deleted already and hence can be
//    skipped", drops the partition from the transaction and completes it. When
//    X comes back it rebuilds the producer's state from its log (KIP-98: a
//    transaction stays open on a partition until a control marker of the same
//    producer id closes it), so the partition's last stable offset stays at
//    the reply for good: every later reply is invisible to read_committed
//    readers.
// 2. Round 1, the hang watch (src/owner/hang-watch.ts): the owner sees the last
//    stable offset stuck behind the high watermark for `hangHealAfterMs` and
//    adds a control record for the partition to its next transaction; that
//    transaction's commit marker (same producer id) closes the open one.
// 3. Round 2, the owner's restart: the watch cannot heal in time
//    (`hangHealAfterMs` 25 s), the router is stopped and a new one started;
//    the new owner's open() (InitProducerId bumps the epoch of the same
//    producer id) writes a control record to every reply partition its ledger
//    names, which closes the transaction left open there.
//
// Placement. Broker X is neither the transaction coordinator of the owner's
// transactional id nor the coordinator of the owners' group: killing the
// first hands the transaction to a new coordinator, which reloads it and
// sends its markers again; killing the second disturbs the group and the
// offset commit inside the transaction. Either would test something else. X
// also leads no partition of writ's own topics (the case creates them with X
// as the last replica): a kafkajs consumer heartbeats from its fetch loop, a
// fetch from a killed leader can stall it, and with a 6 s session the owners'
// membership lapsed in runs where X led an intents partition; the router then
// replaces every owner, whose open() heals the partition before the watch can.
//
// The hang watch is kept from seeing the reply partition until the hang is
// proven, and the ledger partition while the transaction is held (see
// hidingProbe and HangCaseOptions.watchHeldTransaction); heals are attributed
// from the routers' own log lines and the producer epoch at the coordinator.
//
// Library module: importing it has no side effects. It acts on the local
// three-node stack of scripts/local-stack.ts through its pid files, so
// WRIT_LOCAL_STACK_DIR (and the ports) must be set before this module is
// first imported; test/faults/run-hang-case.ts does that.
import { randomUUID } from "node:crypto";
import { appendFileSync, existsSync, mkdirSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Kafka, Partitioners, logLevel, type Admin } from "kafkajs";
import { pino } from "pino";
import { readRecord } from "../../examples/example-stack.ts";
import { refundPayment, systems as demoSystems, tools as demoTools } from "../../examples/demo-tools.ts";
import { createWritClient, type IntentInput, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { RUN_DIR, killBroker, leaderOf, startBroker } from "../../src/testing/local-stack.ts";
import { RouterConfig, parseConfig, type RouterConfigInput } from "../../src/config.ts";
import { WritError } from "../../src/errors.ts";
import { TxnAdmin, type PartitionOffsets, type TopicPartition } from "../../src/kafka/txn-admin.ts";
import { REDACT_PATHS, type Logger } from "../../src/logger.ts";
import type { OffsetProbe } from "../../src/owner/hang-watch.ts";
import { createOffsetProbe } from "../../src/owner/offset-probe.ts";
import { transactionalIdFor } from "../../src/owner/partition-owner.ts";
import { ledgerReaderGroups, startRouter, type Router } from "../../src/owner/router.ts";
import { entityKey } from "../../src/schemas/common.ts";
import { isControlRecord } from "../../src/schemas/control.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { routerTopics } from "../../src/topics.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

/** What {@link runHangCase} needs: a running three-broker cluster (the caller starts and stops it). */
export interface HangCaseOptions {
  brokers: string[];
  registryUrl?: string;
  /** Progress lines. */
  say: (line: string) => void;
  /** Suffix of every topic and group name of this run. */
  id: string;
  /** Where kafkajs's connection errors go (expected while a broker is down). */
  logDir: string;
  /**
   * Let round 1's hang watch see the ledger partition while the transaction
   * is held (default false: hidden then). A hold of several seconds is this
   * case's device; the watch takes the held transaction itself for a hang on
   * the ledger partition and asks for a heal there, and that heal fails
   * today: a heal record has no key, and the compacted ledger topic refuses
   * keyless records (INVALID_RECORD), so the owner's next transaction fails
   * and the owner reopens, which heals the reply partition instead of the
   * watch. True shows that.
   */
  watchHeldTransaction?: boolean;
}

/** What the case measured. It passed when `problems` is empty (see {@link hangCasePassed}). */
export interface HangCaseResult {
  /** Both rounds produced a reply partition whose last stable offset stayed behind its high watermark for at least 2 s. */
  reproduced: boolean;
  /** Round 1: ms from the moment the hang watch could see the partition until its last stable offset caught up; null if it never did. */
  healedByWatchMs: number | null;
  /** Round 2: ms from starting the new router until the partition's last stable offset caught up; null if it never did. */
  healedByRestartMs: number | null;
  /** Intents that got a reply (applied, conflict, rejected or escalated), over both rounds. */
  answered: number;
  expected: number;
  /** Every round's coordinator logged that it skipped the reply partition's marker ("Couldn't find leader endpoint"). */
  markerSkipLogged: boolean;
  problems: string[];
}

/** True when the case showed the hang and both heals with nothing wrong. */
export function hangCasePassed(r: HangCaseResult): boolean {
  return r.problems.length === 0 && r.reproduced && r.healedByWatchMs !== null && r.healedByRestartMs !== null && r.answered === r.expected;
}

// ---------------------------------------------------------------------------
// Where Kafka puts things

/** `java.lang.String#hashCode`: s[0]·31^(n−1) + … + s[n−1] over UTF-16 code units, in 32-bit two's complement. */
export function javaStringHashCode(s: string): number {
  let h = 0;
  for (let i = 0; i < s.length; i++) h = (Math.imul(h, 31) + s.charCodeAt(i)) | 0;
  return h;
}

/**
 * The partition of `__transaction_state` (for a transactional id) or of
 * `__consumer_offsets` (for a group id) whose leader is that id's coordinator:
 * `Utils.abs(id.hashCode()) % partitionCount`, as Kafka's
 * TransactionStateManager.partitionFor and the group coordinator's
 * partitionFor compute it (`Utils.abs` maps Integer.MIN_VALUE to 0).
 */
export function coordinatorPartition(id: string, partitionCount: number): number {
  const h = javaStringHashCode(id);
  return (h === -2147483648 ? 0 : Math.abs(h)) % partitionCount;
}

/**
 * The intents partition a key lands on: kafkajs's `Partitioners.DefaultPartitioner`
 * itself (the Java client's murmur2 partitioner, `toPositive(murmur2(key)) %
 * partitions`), which the writ client's producer uses.
 */
export function keyPartition(topic: string, key: string, partitionCount: number): number {
  const partitioner = Partitioners.DefaultPartitioner();
  return partitioner({
    topic,
    partitionMetadata: Array.from({ length: partitionCount }, (_, p) => ({ partitionId: p, leader: 0, replicas: [0], isr: [0], partitionErrorCode: 0 })),
    message: { key, value: null },
  });
}

// ---------------------------------------------------------------------------
// Test seams handed to the routers

/** One armed hold of `beforeCommit`: the first transaction that writes `topic` waits in it until released. */
class CommitHold {
  readonly topic: string;
  /** Resolves with the held transaction's intents partition and topics. */
  readonly held: Promise<{ partition: number; topics: string[] }>;
  private onHeld!: (info: { partition: number; topics: string[] }) => void;
  private releaseNow!: () => void;
  private readonly releasedPromise: Promise<void>;
  taken = false;
  released = false;

  constructor(topic: string) {
    this.topic = topic;
    this.held = new Promise((resolve) => (this.onHeld = resolve));
    this.releasedPromise = new Promise<void>((resolve) => (this.releaseNow = resolve));
  }

  /** The router's `beforeCommit`: holds the first matching transaction, lets every other one through. */
  async beforeCommit(info: { partition: number; topics: string[] }): Promise<void> {
    if (this.taken || !info.topics.includes(this.topic)) return;
    this.taken = true;
    this.onHeld({ partition: info.partition, topics: [...info.topics] });
    await this.releasedPromise;
  }

  release(): void {
    this.released = true;
    this.releaseNow();
  }
}

/**
 * The router's end-offset probe with some topics left out while they are in
 * `hidden`. Why, for the reply topic: the hang watch keeps a partition's
 * "stuck since" across rounds whose probe failed (HangWatch.check returns
 * before touching its watches when the probe throws, and a leaderless
 * partition fails the whole probe), so a watch that happened to probe the
 * reply partition while the transaction was held (records sent, not yet
 * committed: the last stable offset behind the high watermark for the few
 * hundred ms before the kill) would count the whole outage as stuck time and
 * heal at its first round after X returns, before the hang can be shown.
 * Left out, the partition is forgotten; shown again once the hang is proven,
 * the watch's clock starts from zero. For the ledger topic while the
 * transaction is held: see HangCaseOptions.watchHeldTransaction. The heals
 * themselves are entirely writ's.
 */
function hidingProbe(inner: OffsetProbe, hidden: ReadonlySet<string>): OffsetProbe {
  return {
    endOffsets: (partitions) => inner.endOffsets(partitions.filter((tp) => !hidden.has(tp.topic))),
    close: () => inner.close?.() ?? Promise.resolve(),
  };
}

/** A router log line the case attributes heals by. */
interface RouterEvent {
  at: number;
  instance: string;
  msg: string;
  topic?: string;
  partition?: number;
  healed?: number;
  /** An owner's transaction protocol, on "partition restored; owning it". */
  transactions?: string;
}

const ATTRIBUTING = new Set(["last stable offset stuck; healing", "partition restored; owning it"]);

/**
 * The routers' logger: pino at info, lines at `level` or above go to stderr
 * as usual, and the lines that say who healed what (the hang watch's
 * "last stable offset stuck; healing", an owner's "partition restored; owning
 * it" with its heal count) are kept in `sink`. kafkajs's connection errors,
 * which this case causes on purpose by killing a broker, go to `quietFile`
 * only: on stderr they would bury the case's own lines (and CI shows a tail).
 */
function capturingLogger(level: string, sink: RouterEvent[], quietFile: string): Logger {
  const threshold = pino.levels.values[level] ?? 50;
  return pino(
    { name: "hang-case", level: "info", redact: REDACT_PATHS },
    {
      write(line: string): void {
        let j: {
          level?: number;
          msg?: string;
          instance?: string;
          topic?: string;
          partition?: number;
          healed?: number;
          transactions?: string;
          component?: string;
          namespace?: string;
        };
        try {
          j = JSON.parse(line) as typeof j;
        } catch {
          process.stderr.write(line);
          return;
        }
        if (j.msg !== undefined && ATTRIBUTING.has(j.msg)) {
          sink.push({
            at: Date.now(),
            instance: j.instance ?? "",
            msg: j.msg,
            ...(j.topic === undefined ? {} : { topic: j.topic }),
            ...(j.partition === undefined ? {} : { partition: j.partition }),
            ...(j.healed === undefined ? {} : { healed: j.healed }),
            ...(j.transactions === undefined ? {} : { transactions: j.transactions }),
          });
        }
        if ((j.level ?? 0) < threshold) return;
        if (j.component === "kafkajs" && j.namespace === "Connection") appendFileSync(quietFile, line);
        else process.stderr.write(line);
      },
    },
  );
}

// ---------------------------------------------------------------------------
// The case

interface RoundSpec {
  name: string;
  agentId: string;
  replyTopic: string;
  entity: { type: string; id: string };
  runId: string;
}

interface Asked {
  reply: SubmitResult;
  submissions: number;
}

interface Reproduction {
  reproduced: boolean;
  transactionalId: string;
  /** When the hang was proven, and the transactional id's producer epoch then. */
  provenAt: number;
  epochAtProof: number | null;
  intentKey: string;
  /** Id of the first (and normally only) submission of the round's first intent. */
  intentId: string;
  input: IntentInput;
  client: WritClient;
  first: Promise<SubmitResult>;
  markerSkipLogged: boolean;
  tp: TopicPartition;
}

interface CoordinatorPlace {
  partition: number;
  leader: number;
  /** First replica: where a preferred-leader election puts the leader. */
  preferred: number;
}

interface Plan {
  partition: number;
  transactionalId: string;
  /** Broker X: killed in each round. */
  victim: number;
  nodes: Map<number, string>;
}

const REPLY_PARTITION = 0;
const HANG_PROOF_MS = 2_000;
const WATCH_HEAL_DEADLINE_MS = 60_000;
const ROUND2_HEAL_AFTER_MS = 25_000;
/** A restart's heal must come before a watch with `hangHealAfterMs` 25 s could act: then it was not the watch. */
const RESTART_HEAL_DEADLINE_MS = ROUND2_HEAL_AFTER_MS - 1_000;
/** Outlives a whole round, so the first intent is never resubmitted (a resubmission's duplicate reply would heal the partition). */
const FIRST_SUBMIT_TIMEOUT_MS = 240_000;
const EXTRA_INTENTS = 3;
/** After the heal, the agent's first reply is due within this; past it the agent asks again (same intent key). */
const FIRST_REPLY_AFTER_HEAL_MS = 15_000;

/**
 * Runs the hanging-transaction case on a running three-broker cluster (see
 * the top of this file): two rounds, each reproducing a hang on a fresh reply
 * topic and showing it healed, first by the owner's hang watch, then by a
 * restart of the owner. Cleans up what it started whatever happens.
 *
 * @example
 * const stack = await ensureStack({ brokers: 3 });
 * const result = await runHangCase({ brokers: stack.endpoints.brokers, say: console.log, id: "h1", logDir: ".writ" });
 * if (!hangCasePassed(result)) process.exitCode = 1;
 */
export async function runHangCase(opts: HangCaseOptions): Promise<HangCaseResult> {
  const run = new HangCase(opts);
  return run.run();
}

class HangCase {
  private readonly opts: HangCaseOptions;
  private readonly say: (line: string) => void;
  private readonly log: Logger;
  private readonly kafka: Kafka;
  private readonly admin: Admin;
  private readonly txn: TxnAdmin;
  private readonly topics: { intents: string; ledger: string; human: string; dlq: string };
  private readonly groupId: string;
  private readonly result: HangCaseResult;
  private readonly problems: string[] = [];
  private records: DemoRecordsServer | null = null;
  private readonly routers = new Set<Router>();
  private readonly clients = new Set<WritClient>();
  private readonly replyTopics: string[] = [];
  /** Broker ids this case killed and has not restarted yet. */
  private readonly down = new Set<number>();
  private hold: CommitHold | null = null;
  private readonly hidden = new Set<string>();
  private routerSeq = 0;
  private readonly skipLogged: boolean[] = [];
  private readonly closeLater: (() => Promise<void>)[] = [];
  /** What the routers logged about heals and restores (see capturingLogger). */
  private readonly events: RouterEvent[] = [];

  constructor(opts: HangCaseOptions) {
    this.opts = opts;
    this.say = opts.say;
    const quietFile = resolve(opts.logDir, `hang-${opts.id}-connections.log`);
    mkdirSync(opts.logDir, { recursive: true });
    this.log = capturingLogger(process.env.LOG_LEVEL ?? "error", this.events, quietFile);
    this.kafka = new Kafka({
      clientId: `hang-case-${opts.id}`,
      brokers: opts.brokers,
      logLevel: logLevel.NOTHING,
      connectionTimeout: 2000,
      retry: { retries: 8, initialRetryTime: 200, maxRetryTime: 3000 },
    });
    this.admin = this.kafka.admin();
    // Few attempts: the polls below have their own deadlines, and a leaderless partition should fail fast.
    this.txn = new TxnAdmin({ brokers: opts.brokers, clientId: `hang-case-${opts.id}-txn`, logLevel: logLevel.NOTHING, maxAttempts: 2 });
    this.topics = { intents: `writ.intents.hang${opts.id}`, ledger: `writ.ledger.hang${opts.id}`, human: `writ.human.hang${opts.id}`, dlq: `writ.dlq.hang${opts.id}` };
    this.groupId = `writ.owners.hang${opts.id}`;
    this.result = { reproduced: false, healedByWatchMs: null, healedByRestartMs: null, answered: 0, expected: 0, markerSkipLogged: false, problems: this.problems };
  }

  async run(): Promise<HangCaseResult> {
    const { id } = this.opts;
    const round1: RoundSpec = {
      name: "round 1",
      agentId: "hang-a",
      replyTopic: `writ.replies.hang-a.${id}`,
      entity: { type: "payment", id: `pay_hang_a_${id}` },
      runId: `hang-a-${id}`,
    };
    // Both rounds' entities on one intents partition: one transactional id, one coordinator, one broker X.
    const partition = keyPartition(this.topics.intents, entityKey(round1.entity), 3);
    let n = 0;
    while (keyPartition(this.topics.intents, entityKey({ type: "payment", id: `pay_hang_b_${id}_${n}` }), 3) !== partition) n++;
    const round2: RoundSpec = {
      name: "round 2",
      agentId: "hang-b",
      replyTopic: `writ.replies.hang-b.${id}`,
      entity: { type: "payment", id: `pay_hang_b_${id}_${n}` },
      runId: `hang-b-${id}`,
    };
    try {
      await this.admin.connect();
      this.records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
      for (const r of [round1, round2]) this.records.seed(r.entity.type, r.entity.id, { amountCents: 1_000_000, refunds: [] });
      const plan = await this.plan(partition);
      await this.createContractTopics(plan);

      // Round 1: the hang watch heals.
      this.say(`${round1.name}: the hang watch heals (hangHealAfterMs 3000)`);
      const router1 = await this.startOwner(plan, { hangHealAfterMs: 3_000 });
      const r1 = await this.reproduce(round1, plan);
      let healed1: number | null = null;
      if (r1.reproduced) {
        // The watch may see the partition from now on; its clock starts at zero.
        const shownAt = Date.now();
        this.hidden.delete(r1.tp.topic);
        healed1 = await this.waitHealed(r1, WATCH_HEAL_DEADLINE_MS, router1, shownAt);
        if (healed1 !== null) {
          // Who healed it: the watch's heal request in the same producer session, not a reopened owner (whose open() heals too).
          const instance = router1.config.instanceId;
          const asked = this.eventsOf(instance, "last stable offset stuck; healing", shownAt, healed1).filter((e) => e.topic === r1.tp.topic && e.partition === r1.tp.partition);
          const reopened = this.eventsOf(instance, "partition restored; owning it", r1.provenAt, healed1).filter((e) => e.partition === plan.partition);
          const epoch = await this.epochOf(r1.transactionalId);
          // Under transactions v2 every EndTxn bumps the epoch as InitProducerId does: the epoch then cannot
          // tell a new producer from the watch's heal transaction, and the router's log (no reopen) alone does.
          const protocol = this.eventsOf(instance, "partition restored; owning it", 0, healed1).filter((e) => e.partition === plan.partition).at(-1)?.transactions;
          const sameProducer = protocol === "v2" || epoch === r1.epochAtProof;
          const how = `watch heal requests ${asked.length}, owner reopened ${reopened.length} time(s), transactions ${protocol ?? "?"}, producer epoch ${r1.epochAtProof} → ${epoch}`;
          if (asked.length > 0 && reopened.length === 0 && sameProducer) {
            this.result.healedByWatchMs = healed1 - shownAt;
            this.say(`${round1.name}: healed by the hang watch ${this.result.healedByWatchMs} ms after it could see the partition (${how})`);
          } else {
            this.problems.push(`${round1.name}: healed ${healed1 - shownAt} ms after the watch could see it, but not by the watch alone (${how})`);
          }
        }
      }
      await this.settle(round1, r1, healed1 !== null);
      await this.stopOwner(router1);
      // Its reply topic lives on X too; an agent that is done does not read through the next outage.
      this.clients.delete(r1.client);
      await r1.client.close();

      // Round 2: the watch cannot heal in time; a restart of the owner does.
      this.say(`${round2.name}: a restart of the owner heals (hangHealAfterMs ${ROUND2_HEAL_AFTER_MS})`);
      const router2 = await this.startOwner(plan, { hangHealAfterMs: ROUND2_HEAL_AFTER_MS });
      const r2 = await this.reproduce(round2, plan);
      // Router 2's watch never sees this reply topic (hidden), and could not heal it within 25 s anyway.
      let healed2: number | null = null;
      if (r2.reproduced) {
        const stopStarted = Date.now();
        await this.stopOwner(router2);
        this.say(`${round2.name}: router stopped (${Date.now() - stopStarted} ms); starting a new one`);
        this.hidden.delete(r2.tp.topic);
        const restartedAt = Date.now();
        const router3 = await this.startOwner(plan, { hangHealAfterMs: ROUND2_HEAL_AFTER_MS });
        healed2 = await this.waitHealed(r2, RESTART_HEAL_DEADLINE_MS - (Date.now() - restartedAt), router3, restartedAt);
        if (healed2 !== null) {
          const instance = router3.config.instanceId;
          const asked = this.eventsOf(instance, "last stable offset stuck; healing", restartedAt, healed2).filter((e) => e.topic === r2.tp.topic);
          const opened = this.eventsOf(instance, "partition restored; owning it", restartedAt, healed2).filter((e) => e.partition === plan.partition && (e.healed ?? 0) > 0);
          const epoch = await this.epochOf(r2.transactionalId);
          const how = `new owner's open() healed ${opened[0]?.healed ?? 0} partition(s), watch heal requests ${asked.length}, producer epoch ${r2.epochAtProof} → ${epoch}`;
          if (opened.length > 0 && asked.length === 0) {
            this.result.healedByRestartMs = healed2 - restartedAt;
            this.say(`${round2.name}: healed by the new owner's open() ${this.result.healedByRestartMs} ms after the restart began (${how})`);
          } else {
            this.problems.push(`${round2.name}: healed ${healed2 - restartedAt} ms after the restart, but not shown to be by open() (${how})`);
          }
        }
      }
      await this.settle(round2, r2, healed2 !== null);

      this.result.reproduced = r1.reproduced && r2.reproduced;
      this.result.markerSkipLogged = this.skipLogged.length === 2 && this.skipLogged.every(Boolean);
      for (const router of this.routers) {
        const h = router.health();
        if (!h.ok) this.say(`router health at the end: ${h.problems.map((p) => p.message).join("; ")}`);
      }
    } catch (err) {
      this.problems.push(`case aborted: ${(err as Error).stack ?? String(err)}`);
    } finally {
      await this.cleanUp();
    }
    return this.result;
  }

  // -------------------------------------------------------------------------
  // Owners and agents

  /** The routers' configuration; `n` numbers the router (its client and instance ids). */
  private routerConfig(n: number, instanceId: string, extra: Partial<RouterConfigInput>): RouterConfigInput {
    return {
      brokers: this.opts.brokers,
      schemaRegistryUrl: this.opts.registryUrl,
      groupId: this.groupId,
      clientId: `writ-owner-hang-${n}`,
      instanceId,
      topics: this.topics,
      intentPartitions: 3,
      replicationFactor: 3,
      sessionTimeoutMs: 6_000,
      hangHealAfterMs: 3_000,
      lsoCheckIntervalMs: 500,
      transactionTimeoutMs: 30_000,
      ...extra,
    };
  }

  private async startOwner(plan: Plan, extra: Partial<RouterConfigInput>): Promise<Router> {
    const n = ++this.routerSeq;
    // The router's ledger readers are consumer groups of their own (`<group>.ledger-reader.<instance>` and
    // `<group>.ledger-scan.<instance>`): their coordinators, too, are kept off X, so that the kill does not disturb a restore.
    const instanceId = await this.instanceIdAvoiding(`hang-${this.opts.id}-owner-${n}`, plan.victim);
    const config = this.routerConfig(n, instanceId, extra);
    // Both groups' coordinators must serve first: right after a cluster starts, a group coordinator answers
    // COORDINATOR_LOAD_IN_PROGRESS, and the router's ledger reader does not survive that on its first join
    // (LedgerReader.connect pauses a consumer whose run() crashed: "Consumer group was not initialized").
    const readers = ledgerReaderGroups({ groupId: this.groupId, instanceId });
    const groups = [this.groupId, readers.restore, readers.scan];
    await waitFor(() => this.admin.describeGroups(groups).then(() => true), {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: `group coordinators of ${groups.join(", ")} serving`,
    });
    const probe = hidingProbe(createOffsetProbe({ brokers: this.opts.brokers, clientId: `writ-owner-hang-${n}-probe`, log: this.log }), this.hidden);
    const router = await startRouter(
      { config, tools: demoTools, systems: demoSystems({ RECORDS_URL: this.records!.url }), logger: this.log },
      { offsetProbe: probe, beforeCommit: (info) => this.hold?.beforeCommit(info) ?? Promise.resolve() },
    );
    this.routers.add(router);
    const started = Date.now();
    await waitFor(() => router.ready() && router.ownedPartitions().length === 3, {
      timeoutMs: 60_000,
      intervalMs: 100,
      message: () => `router ${n} owns ${JSON.stringify(router.ownedPartitions())} of 3 partitions`,
    });
    this.say(`router ${n} owns all 3 intents partitions (${Date.now() - started} ms)`);
    return router;
  }

  private async stopOwner(router: Router): Promise<void> {
    this.routers.delete(router);
    await router.stop();
  }

  private async client(spec: RoundSpec): Promise<WritClient> {
    const client = await createWritClient({
      brokers: this.opts.brokers,
      agentId: spec.agentId,
      replyTopic: spec.replyTopic,
      intentsTopic: this.topics.intents,
      schemaRegistryUrl: this.opts.registryUrl,
      logger: this.log,
    });
    this.clients.add(client);
    return client;
  }

  private refund(spec: RoundSpec, step: number, baseVersion: string): IntentInput {
    const amountCents = 100 + step;
    return {
      tool: refundPayment,
      entity: spec.entity,
      runId: spec.runId,
      stepId: `step-${step}`,
      baseVersion,
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents, reason: "goodwill", ref: `${spec.runId}-${step}` } }],
      params: { amountCents, reason: "goodwill", ref: `${spec.runId}-${step}` },
    };
  }

  /** Submits, and asks again with the same intent key after `unknown`/`blocked` until `deadlineAt`. */
  private async ask(client: WritClient, input: IntentInput, deadlineAt: number): Promise<Asked> {
    let submissions = 0;
    for (;;) {
      submissions++;
      const timeoutMs = Math.max(1_000, deadlineAt - Date.now());
      let reply: SubmitResult;
      try {
        reply = await client.submit(input, { timeoutMs });
      } catch (err) {
        if (Date.now() >= deadlineAt) throw err;
        this.say(`  submit failed (${(err as Error).message}); asking again`);
        await new Promise((r) => setTimeout(r, 500)); // retry backoff of a failed send, not synchronisation
        continue;
      }
      if ((reply.status === "unknown" || reply.status === "blocked") && Date.now() < deadlineAt) {
        this.say(`  ${reply.status}: ${reply.message}; asking again with the same intent key`);
        continue;
      }
      return { reply, submissions };
    }
  }

  // -------------------------------------------------------------------------
  // Steps 2-4: place the reply partition, hold, kill, commit, restart, prove

  private async reproduce(spec: RoundSpec, plan: Plan): Promise<Reproduction> {
    const { name } = spec;
    const { partition, transactionalId, victim } = plan;
    // The coordinators must not have moved onto X since the plan (a preferred-leader election could move them).
    const now = await this.coordinators(transactionalId);
    if (now.txn.leader === victim || now.group.leader === victim) {
      throw new Error(`${name}: a coordinator moved onto broker ${victim} (transaction coordinator ${now.txn.leader}, group coordinator ${now.group.leader})`);
    }
    const txnCoordinator = now.txn;
    this.say(
      `${name}: ${entityKey(spec.entity)} → ${this.topics.intents}-${partition}; transaction coordinator broker ${now.txn.leader}, group coordinator broker ${now.group.leader}; X = broker ${victim}`,
    );
    const tp: TopicPartition = { topic: spec.replyTopic, partition: REPLY_PARTITION };

    // Step 3: one replica, on X. min.insync.replicas 1: the stack's default of 2 would refuse acks=all writes to it.
    await createTopicsWithLeaders(this.admin, [{ topic: spec.replyTopic, replicaAssignment: [{ partition: REPLY_PARTITION, replicas: [victim] }], configEntries: [{ name: "min.insync.replicas", value: "1" }] }]);
    this.replyTopics.push(spec.replyTopic);
    await waitFor(async () => (await leaderOf(this.opts.brokers, spec.replyTopic, REPLY_PARTITION)) === victim, {
      timeoutMs: 30_000,
      intervalMs: 200,
      message: `${spec.replyTopic}-0 led by broker ${victim}`,
    });
    this.say(`${name}: reply topic ${spec.replyTopic} has one replica, on broker ${victim} (X)`);
    const client = await this.client(spec);

    // Connected before the outage and used through it: a kafkajs client's first metadata request asks for
    // every topic (an empty list is sent as null), and kafkajs throws on any partition error in the answer,
    // so no kafkajs client (nor a TxnAdmin) can connect while any partition of the cluster has no leader.
    // Its cached metadata stays fresh for 60 s (metadataMaxAge), longer than the outage. One quick
    // connection retry: kafkajs's default (5 retries, exponential from 300 ms) spends ~10 s on the dead
    // broker in every call, which once kept the transaction held for 26 s of its 30 s timeout.
    const outage = new TxnAdmin({
      brokers: this.opts.brokers,
      clientId: `hang-case-${this.opts.id}-outage`,
      logLevel: logLevel.NOTHING,
      maxAttempts: 2,
      connectionTimeout: 1_000,
      requestTimeout: 5_000,
      retry: { retries: 1, initialRetryTime: 100, maxRetryTime: 200 },
    });
    this.closeLater.push(() => outage.close());
    await outage.connect();

    // Hidden from this router's watch until the hang is proven (see hidingProbe); the ledger while the
    // transaction is held (see HangCaseOptions.watchHeldTransaction).
    this.hidden.add(spec.replyTopic);
    const hideLedger = this.opts.watchHeldTransaction !== true;
    if (hideLedger) this.hidden.add(this.topics.ledger);
    const hold = new CommitHold(spec.replyTopic);
    this.hold = hold;
    const base = await readRecord(this.records!.url, spec.entity.type, spec.entity.id);
    const input = this.refund(spec, 0, base.version);
    const intent = client.buildIntent(input);
    // One submission, waiting longer than the round lasts: a resubmission's duplicate reply is written to the
    // reply partition in a transaction of the same owner, which would heal the hang before it is shown.
    const first = client.submit(intent, { timeoutMs: FIRST_SUBMIT_TIMEOUT_MS });
    first.catch(() => undefined); // observed in settle()

    const held = await Promise.race([hold.held, first.then(() => null)]).then((h) =>
      h === null ? Promise.reject(new Error("the intent was answered before its transaction was held")) : h,
    );
    const heldAt = Date.now();
    if (held.partition !== partition) {
      this.problems.push(`${name}: the held transaction is the owner's of partition ${held.partition}, but the partitioner said ${partition}`);
    }
    this.say(`${name}: transaction of partition ${held.partition} held before its commit (topics ${held.topics.join(", ")})`);

    // Step 4: kill X while the transaction is open on its reply partition.
    await killBroker(victim);
    this.down.add(victim);
    this.say(`${name}: SIGKILLed broker ${victim} (${Date.now() - heldAt} ms after the hold)`);
    // The controller fences X after broker.session.timeout.ms (5 s; longer when X was the active KRaft
    // controller) and the partition, whose only replica X is, is left without a leader (isr [] in the
    // controller's log). Released before that, the coordinator would still find X's registration in its
    // metadata and queue the marker for X, to be delivered when X returns, instead of skipping it.
    // Bounded well inside the 30 s transaction timeout: past it the coordinator aborts the held transaction.
    await waitFor(() => leaderless(outage, tp), { timeoutMs: 20_000, intervalMs: 200, message: `${spec.replyTopic}-0 without a leader` });
    this.say(`${name}: ${spec.replyTopic}-0 has no leader (${Date.now() - heldAt} ms after the hold); releasing the commit`);

    hold.release();
    const committed = await waitFor(
      async () => {
        const [d] = await outage.describeTransactions([transactionalId]);
        return d && (d.state === "CompleteCommit" || d.state === "CompleteAbort") ? d : null;
      },
      { timeoutMs: 30_000, intervalMs: 100, message: `${transactionalId} completed at its coordinator` },
    );
    if (committed.state !== "CompleteCommit") {
      throw new Error(`${name}: the held transaction ended ${committed.state}, not committed (transaction timeout? abort?)`);
    }
    this.say(
      `${name}: coordinator completed the transaction (${committed.state}, producer ${committed.producerId}/${committed.producerEpoch}, ` +
        `partitions pending ${committed.topicPartitions.length}) while the reply partition had no leader`,
    );
    await outage.close().catch(() => undefined);
    // The transaction is over; its ledger partition's last stable offset has caught up.
    if (hideLedger) this.hidden.delete(this.topics.ledger);

    const restartStarted = Date.now();
    await startBroker({ nodeId: victim });
    this.down.delete(victim);
    await waitFor(async () => (await leaderOf(this.opts.brokers, spec.replyTopic, REPLY_PARTITION)) === victim, {
      timeoutMs: 60_000,
      intervalMs: 200,
      message: `${spec.replyTopic}-0 led by broker ${victim} again`,
    });
    this.say(`${name}: broker ${victim} restarted and leads ${spec.replyTopic}-0 again (${Date.now() - restartStarted} ms)`);

    const proof = await this.proveHang(tp);
    const provenAt = Date.now();
    const epochAtProof = await this.epochOf(transactionalId);
    const markerSkipLogged = await this.markerSkipLogged(txnCoordinator.leader, spec.replyTopic, transactionalId);
    this.skipLogged.push(markerSkipLogged);
    this.say(`${name}: coordinator (broker ${txnCoordinator.leader}) logged the skipped marker: ${markerSkipLogged ? "yes" : "no"}`);
    const evidence = await this.evidence(tp, transactionalId);
    if (proof.ok) {
      this.say(`${name}: HANG: ${describe(proof.offsets)} for ${proof.stuckMs} ms; ${evidence}`);
    } else {
      this.problems.push(`${name}: hang not reproduced: ${proof.diagnosis}; ${evidence}`);
      this.say(`${name}: hang NOT reproduced: ${proof.diagnosis}`);
    }
    return { reproduced: proof.ok, intentKey: intent.intentKey, intentId: intent.intentId, input, client, first, markerSkipLogged, tp, transactionalId, provenAt, epochAtProof };
  }

  /** The last stable offset stays behind the high watermark, at the same offset, for {@link HANG_PROOF_MS}. */
  private async proveHang(tp: TopicPartition): Promise<{ ok: true; offsets: PartitionOffsets; stuckMs: number } | { ok: false; diagnosis: string }> {
    const deadline = Date.now() + 30_000;
    let since: number | null = null;
    let last: PartitionOffsets | null = null;
    let lastError = "";
    while (Date.now() < deadline) {
      try {
        const [o] = await this.txn.listOffsets([tp]);
        if (o !== undefined) {
          if (o.lastStable >= o.highWatermark) {
            const diagnosis =
              last === null || since === null
                ? `${describe(o)} at the first reading: nothing is open on the partition, so the commit marker reached it (not skipped)`
                : `${describe(o)}: open at first (${describe(last)}) but closed after ${Date.now() - since} ms, before ${HANG_PROOF_MS} ms: something healed it early`;
            return { ok: false, diagnosis };
          }
          if (since === null || last === null || last.lastStable !== o.lastStable) since = Date.now();
          last = o;
          const stuckMs = Date.now() - since;
          if (stuckMs >= HANG_PROOF_MS) return { ok: true, offsets: o, stuckMs };
        }
      } catch (err) {
        lastError = (err as Error).message;
      }
      await new Promise((r) => setTimeout(r, 200)); // poll interval
    }
    return { ok: false, diagnosis: `no stable reading within 30 s (last ${last ? describe(last) : "none"}; last error ${lastError || "none"})` };
  }

  /** Producer state on the partition (DescribeProducers, KIP-664) and the transactional id at its coordinator. */
  private async evidence(tp: TopicPartition, transactionalId: string): Promise<string> {
    const parts: string[] = [];
    try {
      const [producers] = await this.txn.describeProducers([tp]);
      const open = (producers?.activeProducers ?? []).filter((p) => p.currentTxnStartOffset >= 0n);
      parts.push(
        open.length === 0
          ? "DescribeProducers: no open transaction"
          : `DescribeProducers: ${open.map((p) => `producer ${p.producerId}/${p.producerEpoch} open since offset ${p.currentTxnStartOffset}`).join(", ")}`,
      );
    } catch (err) {
      parts.push(`DescribeProducers failed: ${(err as Error).message}`);
    }
    try {
      const [d] = await this.txn.describeTransactions([transactionalId]);
      parts.push(d ? `coordinator: ${transactionalId} ${d.state}, producer ${d.producerId}/${d.producerEpoch}, partitions pending ${d.topicPartitions.length}` : `coordinator does not know ${transactionalId}`);
    } catch (err) {
      parts.push(`DescribeTransactions failed: ${(err as Error).message}`);
    }
    return parts.join("; ");
  }

  /** Whether the coordinator node's broker log (and its rolled files) has the marker-skip line for this topic and transactional id. */
  private async markerSkipLogged(nodeId: number, topic: string, transactionalId: string): Promise<boolean> {
    const base = join(RUN_DIR, `node-${nodeId}`, "broker.log");
    const files = [base, `${base}.1`, `${base}.2`].filter((f) => existsSync(f));
    if (files.length === 0) {
      this.say(`  broker log of node ${nodeId} not reachable at ${base}`);
      return false;
    }
    const found = (): boolean =>
      files.some((f) =>
        readFileSync(f, "utf8")
          .split("\n")
          .some((line) => line.includes("Couldn't find leader endpoint") && line.includes(topic) && line.includes(transactionalId)),
      );
    // The line is written when the markers are sent, long before this; the short wait only covers log buffering.
    return waitFor(found, { timeoutMs: 3_000, intervalMs: 250 }).catch(() => false);
  }

  // -------------------------------------------------------------------------
  // Step 5: healed, answered, exactly once

  /** Polls until the partition's last stable offset reaches its high watermark; returns when, or null (a problem) at the deadline. */
  private async waitHealed(r: Reproduction, timeoutMs: number, router: Router, since: number): Promise<number | null> {
    const { tp } = r;
    let last: PartitionOffsets | null = null;
    try {
      await waitFor(
        async () => {
          const [o] = await this.txn.listOffsets([tp]);
          if (o !== undefined) last = o;
          return o !== undefined && o.lastStable >= o.highWatermark;
        },
        { timeoutMs: Math.max(0, timeoutMs), intervalMs: 100 },
      );
      return Date.now();
    } catch {
      const evidence = await this.evidence(tp, r.transactionalId);
      const health = router.health();
      this.problems.push(
        `${tp.topic}-${tp.partition} not healed ${Date.now() - since} ms after the heal could start (${last ? describe(last) : "no reading"}); ${evidence}; ` +
          `router health: ${health.ok ? "ok" : health.problems.map((p) => p.message).join(" | ")}`,
      );
      return null;
    }
  }

  /** The first intent's reply (applied, once at the records server), then three more intents answered. */
  private async settle(spec: RoundSpec, r: Reproduction, healed: boolean): Promise<void> {
    const { name } = spec;
    this.result.expected += 1 + EXTRA_INTENTS;
    let reply: SubmitResult | null = null;
    let submissions = 1;
    try {
      // A healed partition shows the reply within seconds; an unhealed one never will, so it is not waited for long.
      reply = await within(r.first, healed ? FIRST_REPLY_AFTER_HEAL_MS : 5_000, `${name}: first intent`);
    } catch {
      reply = null;
    }
    if (healed && (reply === null || reply.status === "unknown" || reply.status === "blocked")) {
      // The partition is healed, so asking again cannot mask the hang any more; the client's contract for a
      // missing answer is to submit the same intent key again. Whether the first reply is readable tells a
      // client that missed it from an owner that never wrote it.
      const onTopic = await this.replyReadable(r.tp, r.intentId);
      this.say(
        `${name}: the first reply did not reach the agent within ${FIRST_REPLY_AFTER_HEAL_MS} ms of the heal ` +
          `(a fresh read_committed reader ${onTopic ? "finds" : "does not find"} it on ${r.tp.topic}-${r.tp.partition}); asking again with the same intent key`,
      );
      try {
        const asked = await this.ask(r.client, r.input, Date.now() + 60_000);
        reply = asked.reply;
        submissions += asked.submissions;
      } catch (err) {
        this.problems.push(`${name}: first intent, asked again: ${(err as Error).message}`);
      }
    }
    const patches = this.records!.patchRequests(r.intentKey);
    const applied = patches.filter((p) => p.outcome === "applied").length;
    this.say(`${name}: first intent answered ${reply?.status ?? "nothing"} after ${submissions} submission(s); PATCH requests for its key: ${patches.length}, applied: ${applied}`);
    if (reply !== null && reply.status !== "unknown" && reply.status !== "blocked") this.result.answered++;
    if (reply === null || reply.status !== "applied") this.problems.push(`${name}: first intent answered ${reply ? JSON.stringify(reply).slice(0, 300) : "nothing"}, not applied`);
    else if (reply.intentKey !== r.intentKey) this.problems.push(`${name}: reply for intent key ${reply.intentKey}, expected ${r.intentKey}`);
    if (applied !== 1) this.problems.push(`${name}: ${applied} applied PATCHes for intent key ${r.intentKey} (want exactly 1; ${patches.length} PATCH requests)`);

    const base = await readRecord(this.records!.url, spec.entity.type, spec.entity.id);
    const deadlineAt = Date.now() + 60_000;
    const extra = await Promise.allSettled(
      Array.from({ length: EXTRA_INTENTS }, (_, i) => this.ask(r.client, this.refund(spec, i + 1, base.version), deadlineAt)),
    );
    const statuses: string[] = [];
    for (const [i, e] of extra.entries()) {
      if (e.status === "rejected") {
        statuses.push("error");
        this.problems.push(`${name}: extra intent ${i + 1}: ${(e.reason as Error).message}`);
        continue;
      }
      const status = e.value.reply.status;
      statuses.push(status);
      if (status !== "unknown" && status !== "blocked") this.result.answered++;
      else this.problems.push(`${name}: extra intent ${i + 1} unanswered (${status})`);
      if (status !== "applied") this.problems.push(`${name}: extra intent ${i + 1} answered ${status}, not applied`);
    }
    this.say(`${name}: ${EXTRA_INTENTS} more intents: ${statuses.join(", ")}`);
  }

  // -------------------------------------------------------------------------

  /**
   * Step 2: the intents partition's transactional id, its transaction
   * coordinator and the owners' group coordinator, and broker X, which is
   * neither. The coordinator of a transactional id is the leader of
   * `__transaction_state` partition `abs(javaHashCode(id)) % partitions`
   * (Kafka's TransactionStateManager.partitionFor); a group's is the leader of
   * `__consumer_offsets` partition `abs(javaHashCode(group)) % partitions`.
   * Killing the transaction coordinator would move the transaction to a new
   * coordinator that completes it from the log (markers retried, none
   * skipped); killing the group coordinator would fail the transaction's
   * offset commit. X is also kept off the preferred (first) replica of both
   * partitions where possible, so that an automatic preferred-leader election
   * after X restarts cannot move either coordinator onto it.
   */
  private async plan(partition: number): Promise<Plan> {
    const transactionalId = transactionalIdFor(parseConfig(RouterConfig, this.routerConfig(0, "plan", {}), "router"), partition);
    // Both internal topics are created on first use of FindCoordinator; these calls retry until their coordinators serve.
    await waitFor(() => this.admin.describeGroups([this.groupId]).then(() => true), { timeoutMs: 60_000, intervalMs: 250, message: "group coordinator serving" });
    await waitFor(() => this.txn.describeTransactions([transactionalId]).then(() => true), {
      timeoutMs: 60_000,
      intervalMs: 250,
      message: "transaction coordinator serving",
    });
    const nodes = await this.liveBrokers();
    const { txn, group } = await this.coordinators(transactionalId);
    const ids = [...nodes.keys()].sort((a, b) => a - b);
    const strict = ids.filter((n) => ![txn.leader, txn.preferred, group.leader, group.preferred].includes(n));
    const loose = ids.filter((n) => n !== txn.leader && n !== group.leader);
    const victim = strict[0] ?? loose[0];
    this.say(
      `plan: transactional id ${transactionalId} → __transaction_state-${txn.partition} (leader ${txn.leader}); group ${this.groupId} → ` +
        `__consumer_offsets-${group.partition} (leader ${group.leader}); live brokers ${ids.join(",")}`,
    );
    if (victim === undefined) {
      throw new Error(
        `no broker to kill: the live brokers are ${ids.join(",")} and the transaction coordinator (${txn.leader}) and the group coordinator ` +
          `(${group.leader}) take them all; killing either would move or fail the transaction instead of skipping a marker (the case needs three brokers)`,
      );
    }
    if (nodes.size !== 3) throw new Error(`the case needs exactly three live brokers, found ${ids.join(",")}`);
    this.say(`plan: X = broker ${victim}${strict.includes(victim) ? "" : " (it is a preferred replica of a coordinator partition: no better choice)"}`);
    return { partition, transactionalId, victim, nodes };
  }

  /** The leader (and preferred replica) of the transactional id's `__transaction_state` partition and of the group's `__consumer_offsets` partition. */
  private async coordinators(transactionalId: string): Promise<{ txn: CoordinatorPlace; group: CoordinatorPlace }> {
    const { topics } = await this.admin.fetchTopicMetadata({ topics: ["__transaction_state", "__consumer_offsets"] });
    const place = (topic: string, id: string): CoordinatorPlace => {
      const meta = topics.find((t) => t.name === topic);
      if (meta === undefined || meta.partitions.length === 0) throw new Error(`no metadata for ${topic}`);
      const partition = coordinatorPartition(id, meta.partitions.length);
      const p = meta.partitions.find((x) => x.partitionId === partition);
      if (p === undefined || p.leader < 0) throw new Error(`${topic}-${partition} has no leader`);
      return { partition, leader: p.leader, preferred: p.replicas[0] ?? p.leader };
    };
    return { txn: place("__transaction_state", transactionalId), group: place("__consumer_offsets", this.groupId) };
  }

  /** `base`, or `base-<n>`, whose ledger readers' groups' coordinators are not broker `avoid`. */
  private async instanceIdAvoiding(base: string, avoid: number): Promise<string> {
    const { topics } = await this.admin.fetchTopicMetadata({ topics: ["__consumer_offsets"] });
    const partitions = topics[0]?.partitions ?? [];
    for (let n = 0; n < 100; n++) {
      const instanceId = n === 0 ? base : `${base}-${n}`;
      const readers = ledgerReaderGroups({ groupId: this.groupId, instanceId });
      const leaders = [readers.restore, readers.scan].map((g) => partitions.find((x) => x.partitionId === coordinatorPartition(g, partitions.length))?.leader);
      if (!leaders.includes(avoid)) return instanceId;
    }
    return base;
  }

  /**
   * The contract topics, created before any router (which then finds them):
   * replication factor 3 with X as the last replica of every partition, so X
   * is never a preferred leader and leads none of them. Why: kafkajs sends a
   * consumer's heartbeats from its fetch loop (consumer/runner.js), and a fetch
   * from a killed leader can stall it while kafkajs reconnects with backoff;
   * with a 6 s session the owners' membership lapses, and
   * the router then replaces every owner, whose open() heals the partition
   * before the hang can be shown (seen in a run of this case).
   */
  private async createContractTopics(plan: Plan): Promise<void> {
    const config = parseConfig(RouterConfig, this.routerConfig(0, "plan", {}), "router");
    const [a, b] = [...plan.nodes.keys()].filter((n) => n !== plan.victim).sort((x, y) => x - y);
    if (a === undefined || b === undefined) throw new Error("the case needs two brokers besides X");
    const topics = routerTopics(config).map((t) => ({
      topic: t.topic,
      configEntries: t.configEntries ?? [],
      replicaAssignment: Array.from({ length: t.numPartitions ?? 1 }, (_, partition) => ({ partition, replicas: partition % 2 === 0 ? [a, b, plan.victim] : [b, a, plan.victim] })),
    }));
    await createTopicsWithLeaders(this.admin, topics);
    this.say(`contract topics created with replicas on ${a},${b},${plan.victim}: broker ${plan.victim} (X) leads none of them`);
  }

  /** Whether a fresh read_committed reader finds the reply to `intentId` (replies are keyed by intent id) on the partition within 10 s. */
  private async replyReadable(tp: TopicPartition, intentId: string): Promise<boolean> {
    const consumer = this.kafka.consumer({ groupId: `hang-case-reader-${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 500 });
    let found = false;
    try {
      await consumer.connect();
      await consumer.subscribe({ topic: tp.topic, fromBeginning: true });
      await consumer.run({
        eachMessage: async ({ partition, message }) => {
          if (partition === tp.partition && !isControlRecord(message.headers) && message.key?.toString("utf8") === intentId) found = true;
        },
      });
      return await waitFor(() => found, { timeoutMs: 10_000, intervalMs: 100 }).catch(() => false);
    } catch {
      return false;
    } finally {
      await consumer.disconnect().catch(() => undefined);
    }
  }

  /** Router log events of one router instance with this message, between two times. */
  private eventsOf(instance: string, msg: string, from: number, to: number): RouterEvent[] {
    return this.events.filter((e) => e.instance === instance && e.msg === msg && e.at >= from && e.at <= to);
  }

  /** The transactional id's producer epoch at its coordinator: InitProducerId (an owner's open()) bumps it; the watch's heal does not under transactions v1 (under v2 every commit does). */
  private async epochOf(transactionalId: string): Promise<number | null> {
    try {
      const [d] = await this.txn.describeTransactions([transactionalId]);
      return d?.producerEpoch ?? null;
    } catch {
      return null;
    }
  }

  /** Live brokers by node id → host:port. */
  private async liveBrokers(): Promise<Map<number, string>> {
    const cluster = await this.admin.describeCluster();
    return new Map(cluster.brokers.map((b) => [b.nodeId, `${b.host}:${b.port}`] as const));
  }

  private async cleanUp(): Promise<void> {
    const step = async (what: string, fn: () => Promise<unknown>): Promise<void> => {
      try {
        await fn();
      } catch (err) {
        this.problems.push(`cleanup: ${what}: ${(err as Error).message}`);
      }
    };
    if (this.hold && !this.hold.released) this.hold.release();
    this.hold = null;
    // A cluster left with a dead node would break whatever runs next.
    for (const nodeId of [...this.down]) {
      await step(`restart broker ${nodeId}`, async () => {
        await startBroker({ nodeId });
        this.down.delete(nodeId);
      });
    }
    await Promise.all([...this.clients].map((c) => step("close client", () => c.close())));
    this.clients.clear();
    await Promise.all([...this.routers].map((r) => step("stop router", () => r.stop())));
    this.routers.clear();
    await step("delete topics", async () => {
      const existing = new Set(await this.admin.listTopics());
      const mine = [...Object.values(this.topics), ...this.replyTopics].filter((t) => existing.has(t));
      if (mine.length > 0) await this.admin.deleteTopics({ topics: mine, timeout: 10_000 });
    });
    await step("close admin", () => this.admin.disconnect());
    await step("close TxnAdmin", () => this.txn.close());
    for (const close of this.closeLater) await close().catch(() => undefined);
    if (this.records) await step("close records server", () => this.records!.close());
  }
}

/**
 * True when the cluster's metadata names no leader for `tp`. Asked through
 * TxnAdmin's own Metadata request for that topic alone: kafkajs's admin (and
 * so `leaderOf`/`partitionInfo` of local-stack.ts) cannot say -1 here, since
 * its metadata parser throws on any partition error (LEADER_NOT_AVAILABLE),
 * and a new kafkajs client asks for every topic's metadata when it connects.
 */
async function leaderless(txn: TxnAdmin, tp: TopicPartition): Promise<boolean> {
  try {
    await txn.listOffsets([tp]);
    return false;
  } catch (err) {
    const c = err instanceof WritError ? err.context : {};
    return c.api === "Metadata" && c.kafkaError === "LEADER_NOT_AVAILABLE" && c.topic === tp.topic && c.partition === tp.partition;
  }
}

function describe(o: PartitionOffsets): string {
  const rel = o.lastStable < o.highWatermark ? "<" : o.lastStable === o.highWatermark ? "=" : ">";
  return `${o.topic}-${o.partition} lastStable ${o.lastStable} ${rel} highWatermark ${o.highWatermark}`;
}

/** `p`, or a rejection naming `what` after `ms` (its timer cleared either way). */
function within<T>(p: Promise<T>, ms: number, what: string): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_, reject) => {
    timer = setTimeout(() => reject(new Error(`${what}: no answer within ${ms} ms`)), ms);
  });
  return Promise.race([p, late]).finally(() => clearTimeout(timer));
}
