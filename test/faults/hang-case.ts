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
// Broker X is neither the transaction coordinator of the owner's
// transactional id nor the coordinator of the owners' group: killing either
// would abort or fence the transaction instead of skipping one marker.
//
// Library module: importing it has no side effects. It acts on the local
// three-node stack of scripts/local-stack.ts through its pid files, so
// WRIT_LOCAL_STACK_DIR (and the ports) must be set before this module is
// first imported; test/faults/run-hang-case.ts does that.
import { existsSync, readFileSync } from "node:fs";
import { join } from "node:path";
import { Kafka, Partitioners, logLevel, type Admin } from "kafkajs";
import { readRecord } from "../../examples/example-stack.ts";
import { refundPayment, systems as demoSystems, tools as demoTools } from "../../examples/demo-tools.ts";
import { createWritClient, type IntentInput, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { RUN_DIR, killBroker, leaderOf, startBroker } from "../../scripts/local-stack.ts";
import type { RouterConfigInput } from "../../src/config.ts";
import { WritError } from "../../src/errors.ts";
import { TxnAdmin, type PartitionOffsets, type TopicPartition } from "../../src/kafka/txn-admin.ts";
import { createLogger, type Logger } from "../../src/logger.ts";
import type { OffsetProbe } from "../../src/owner/hang-watch.ts";
import { createOffsetProbe } from "../../src/owner/offset-probe.ts";
import { transactionalIdFor } from "../../src/owner/partition-owner.ts";
import { startRouter, type Router } from "../../src/owner/router.ts";
import { entityKey } from "../../src/schemas/common.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/sor/demo-records-server.ts";
import { waitFor } from "../helpers/wait-for.ts";

/** What {@link runHangCase} needs: a running three-broker cluster (the caller starts and stops it). */
export interface HangCaseOptions {
  brokers: string[];
  registryUrl?: string;
  /** Progress lines. */
  say: (line: string) => void;
  /** Suffix of every topic and group name of this run. */
  id: string;
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
 * `hidden`. Why: the hang watch keeps a partition's "stuck since" across
 * rounds whose probe failed (a leaderless partition fails the whole round), so
 * a watch that happened to probe the reply partition while the transaction was
 * held (its records sent, not yet committed: the last stable offset behind the
 * high watermark, for a few hundred ms before the kill) would count the whole
 * outage as stuck time and heal at its first round after X returns, before
 * the hang can be shown. Leaving the partition out makes the watch forget it;
 * once the hang is proven it is shown to the watch again, whose clock then
 * starts from zero. The heal itself is entirely writ's.
 */
function hidingProbe(inner: OffsetProbe, hidden: ReadonlySet<string>): OffsetProbe {
  return {
    endOffsets: (partitions) => inner.endOffsets(partitions.filter((tp) => !hidden.has(tp.topic))),
    close: () => inner.close?.() ?? Promise.resolve(),
  };
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
  victim: number;
  coordinator: number;
  transactionalId: string;
  intentKey: string;
  client: WritClient;
  first: Promise<Asked>;
  markerSkipLogged: boolean;
  tp: TopicPartition;
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

/**
 * Runs the hanging-transaction case on a running three-broker cluster (see
 * the top of this file): two rounds, each reproducing a hang on a fresh reply
 * topic and showing it healed, first by the owner's hang watch, then by a
 * restart of the owner. Cleans up what it started whatever happens.
 *
 * @example
 * const stack = await ensureStack({ brokers: 3 });
 * const result = await runHangCase({ brokers: stack.endpoints.brokers, say: console.log, id: "h1" });
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

  constructor(opts: HangCaseOptions) {
    this.opts = opts;
    this.say = opts.say;
    this.log = createLogger({ level: process.env.LOG_LEVEL ?? "error", name: "hang-case" });
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
    const round2: RoundSpec = {
      name: "round 2",
      agentId: "hang-b",
      replyTopic: `writ.replies.hang-b.${id}`,
      entity: { type: "payment", id: `pay_hang_b_${id}` },
      runId: `hang-b-${id}`,
    };
    try {
      await this.admin.connect();
      this.records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
      for (const r of [round1, round2]) this.records.seed(r.entity.type, r.entity.id, { amountCents: 1_000_000, refunds: [] });

      // Round 1: the hang watch heals.
      this.say(`${round1.name}: the hang watch heals (hangHealAfterMs 3000)`);
      const router1 = await this.startOwner({ hangHealAfterMs: 3_000 });
      const r1 = await this.reproduce(round1, router1);
      let healed1: number | null = null;
      if (r1.reproduced) {
        // The watch may see the partition from now on; its clock starts at zero.
        const shownAt = Date.now();
        this.hidden.delete(r1.tp.topic);
        healed1 = await this.waitHealed(r1, WATCH_HEAL_DEADLINE_MS, router1, shownAt);
        if (healed1 !== null) {
          this.result.healedByWatchMs = healed1 - shownAt;
          this.say(`${round1.name}: healed by the hang watch ${this.result.healedByWatchMs} ms after it could see the partition`);
        }
      }
      await this.settle(round1, r1, healed1 !== null);
      await this.stopOwner(router1);

      // Round 2: the watch cannot heal in time; a restart of the owner does.
      this.say(`${round2.name}: a restart of the owner heals (hangHealAfterMs ${ROUND2_HEAL_AFTER_MS})`);
      const router2 = await this.startOwner({ hangHealAfterMs: ROUND2_HEAL_AFTER_MS });
      const r2 = await this.reproduce(round2, router2);
      // Router 2's watch never sees this reply topic (hidden), and could not heal it within 25 s anyway.
      let healed2: number | null = null;
      if (r2.reproduced) {
        const stopStarted = Date.now();
        await this.stopOwner(router2);
        this.say(`${round2.name}: router stopped (${Date.now() - stopStarted} ms); starting a new one`);
        this.hidden.delete(r2.tp.topic);
        const restartedAt = Date.now();
        const router3 = await this.startOwner({ hangHealAfterMs: ROUND2_HEAL_AFTER_MS });
        healed2 = await this.waitHealed(r2, RESTART_HEAL_DEADLINE_MS - (Date.now() - restartedAt), router3, restartedAt);
        if (healed2 !== null) {
          this.result.healedByRestartMs = healed2 - restartedAt;
          this.say(`${round2.name}: healed by the new owner's open() ${this.result.healedByRestartMs} ms after the restart began`);
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

  private async startOwner(extra: Partial<RouterConfigInput>): Promise<Router> {
    const n = ++this.routerSeq;
    const config: RouterConfigInput = {
      brokers: this.opts.brokers,
      schemaRegistryUrl: this.opts.registryUrl,
      groupId: this.groupId,
      clientId: `writ-owner-hang-${n}`,
      instanceId: `hang-${this.opts.id}-owner-${n}`,
      topics: this.topics,
      intentPartitions: 3,
      replicationFactor: 3,
      sessionTimeoutMs: 6_000,
      hangHealAfterMs: 3_000,
      lsoCheckIntervalMs: 500,
      transactionTimeoutMs: 30_000,
      ...extra,
    };
    // Both groups' coordinators must serve first: right after a cluster starts, a group coordinator answers
    // COORDINATOR_LOAD_IN_PROGRESS, and the router's ledger reader does not survive that on its first join
    // (LedgerReader.connect pauses a consumer whose run() crashed: "Consumer group was not initialized").
    const groups = [this.groupId, `${this.groupId}.ledger-reader.${config.instanceId}`];
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
      params: { amountCents, reason: "goodwill" },
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

  private async reproduce(spec: RoundSpec, router: Router): Promise<Reproduction> {
    const { name } = spec;
    const key = entityKey(spec.entity);
    const partition = keyPartition(this.topics.intents, key, 3);
    const transactionalId = transactionalIdFor(router.config, partition);
    const nodes = await this.liveBrokers();
    const internal = await this.admin.fetchTopicMetadata({ topics: ["__transaction_state", "__consumer_offsets"] });
    const leaderFor = (topic: string, id: string): { partition: number; leader: number } => {
      const meta = internal.topics.find((t) => t.name === topic);
      if (meta === undefined || meta.partitions.length === 0) throw new Error(`no metadata for ${topic}`);
      const p = coordinatorPartition(id, meta.partitions.length);
      const leader = meta.partitions.find((x) => x.partitionId === p)?.leader ?? -1;
      if (leader < 0) throw new Error(`${topic}-${p} has no leader`);
      return { partition: p, leader };
    };
    const txnCoordinator = leaderFor("__transaction_state", transactionalId);
    const groupCoordinator = leaderFor("__consumer_offsets", this.groupId);
    const candidates = [...nodes.keys()].filter((n) => n !== txnCoordinator.leader && n !== groupCoordinator.leader).sort((a, b) => a - b);
    this.say(
      `${name}: ${key} → ${this.topics.intents}-${partition}, transactional id ${transactionalId} → __transaction_state-${txnCoordinator.partition} ` +
        `(coordinator: broker ${txnCoordinator.leader}); group → __consumer_offsets-${groupCoordinator.partition} (broker ${groupCoordinator.leader})`,
    );
    const victim = candidates[0];
    if (victim === undefined) {
      throw new Error(
        `no broker to kill: the live brokers are ${[...nodes.keys()].join(",")} and the transaction coordinator (${txnCoordinator.leader}) and the ` +
          `group coordinator (${groupCoordinator.leader}) take them all; killing either would fence or abort the transaction instead of skipping a marker`,
      );
    }
    const tp: TopicPartition = { topic: spec.replyTopic, partition: REPLY_PARTITION };

    // Step 3: one replica, on X. min.insync.replicas 1: the stack's default of 2 would refuse acks=all writes to it.
    await this.admin.createTopics({
      waitForLeaders: true,
      topics: [{ topic: spec.replyTopic, replicaAssignment: [{ partition: REPLY_PARTITION, replicas: [victim] }], configEntries: [{ name: "min.insync.replicas", value: "1" }] }],
    });
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
    // Its cached metadata stays fresh for 60 s (metadataMaxAge), longer than the outage.
    const outage = new TxnAdmin({ brokers: this.opts.brokers, clientId: `hang-case-${this.opts.id}-outage`, logLevel: logLevel.NOTHING, maxAttempts: 2 });
    this.closeLater.push(() => outage.close());
    await outage.connect();

    // Hidden from this router's watch until the hang is proven (see hidingProbe).
    this.hidden.add(spec.replyTopic);
    const hold = new CommitHold(spec.replyTopic);
    this.hold = hold;
    const base = await readRecord(this.records!.url, spec.entity.type, spec.entity.id);
    const input = this.refund(spec, 0, base.version);
    const intentKey = client.buildIntent(input).intentKey;
    const first = this.ask(client, input, Date.now() + FIRST_SUBMIT_TIMEOUT_MS);
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
    // The controller fences X after broker.session.timeout.ms (5 s) and the partition, whose only replica X
    // is, is left without a leader. Released before that, the coordinator would find X in its metadata and
    // queue the marker for it instead of skipping the partition.
    await waitFor(() => leaderless(outage, tp), { timeoutMs: 30_000, intervalMs: 200, message: `${spec.replyTopic}-0 without a leader` });
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
    return { reproduced: proof.ok, victim, coordinator: txnCoordinator.leader, transactionalId, intentKey, client, first, markerSkipLogged, tp };
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
            const before = last ? ` (before: ${describe(last)})` : "";
            return { ok: false, diagnosis: `${describe(o)}: nothing is open on the partition${before}; the marker reached it` };
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
    let asked: Asked;
    try {
      // A healed partition shows the reply within seconds; an unhealed one never will, so it is not waited for long.
      asked = await within(r.first, healed ? 60_000 : 5_000, `${name}: first intent`);
    } catch (err) {
      this.problems.push(`${name}: first intent: ${(err as Error).message}`);
      return;
    }
    const { reply } = asked;
    const answered = reply.status !== "unknown" && reply.status !== "blocked";
    if (answered) this.result.answered++;
    const patches = this.records!.patchRequests(r.intentKey);
    const applied = patches.filter((p) => p.outcome === "applied").length;
    this.say(`${name}: first intent answered ${reply.status} after ${asked.submissions} submission(s); PATCH requests for its key: ${patches.length}, applied: ${applied}`);
    if (reply.status !== "applied") this.problems.push(`${name}: first intent answered ${reply.status}, not applied: ${JSON.stringify(reply).slice(0, 300)}`);
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
