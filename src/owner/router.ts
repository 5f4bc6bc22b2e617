import type { Server } from "node:http";
import { Kafka, logLevel, type Admin, type Consumer } from "kafkajs";
import { WireCodec } from "../codec.ts";
import { checkAgentRegistryRequired, configWarnings, RouterConfig, parseConfig, type RouterConfigInput } from "../config.ts";
import { registerCompressionCodecs } from "../kafka/compression.ts";
import { keepStopped } from "../kafka/keep-stopped.ts";
import { kafkaLogging, OWNER_GROUPS_WATCH, type KafkaLogTap } from "../kafka-log.ts";
import { LedgerReader } from "../ledger/ledger-reader.ts";
import { componentLogger, createLogger, type Logger } from "../logger.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import { admitTools, type WriteToolDeclaration } from "../tools.ts";
import { type BatchLimit, batchLimitProblem, batchLimits, ensureTopics, routerTopics, topicNeeds, warnOnSingleReplicaTopics } from "../topics.ts";
import { HangWatch, type OffsetProbe, type TopicPartition } from "./hang-watch.ts";
import { HealthBoard, checkHealthAddress, healthListenError } from "./health.ts";
import { IntentPipeline } from "./intent-pipeline.ts";
import type { OwnerContext } from "./owner-context.ts";
import { PartitionOwner } from "./partition-owner.ts";
import { GroupMemory, holdingMessage, otherOwnerGroups, otherOwnersMessage, ownerAssigner, ownerGroupsGone, type OwnerGroupsLook } from "./single-writer.ts";
import { RecordEncoder } from "./records.ts";
import { TopicDirectory } from "./topic-directory.ts";
import { createOffsetProbe } from "./offset-probe.ts";
import { observeTools } from "../metrics/observed-system.ts";
import { RouterMetrics } from "../metrics/router-metrics.ts";
import { sorResponseBudget } from "../sor/response-budget.ts";
import { AgentRegistry } from "../security/agent-registry.ts";
import { WritError } from "../errors.ts";
import { retry, START_PATIENCE } from "../retry.ts";
import { kafkaConnection, transportWarnings } from "../security/transport.ts";
import { serialAdmin } from "../kafka/serial-admin.ts";
import { memberLease, type MemberLease, whenConfirmed } from "./member-lease.ts";
import { hideKafkajsTimeoutWarning } from "../node-warnings.ts";

export interface RouterOptions {
  config: RouterConfigInput | RouterConfig;
  tools: readonly WriteToolDeclaration<any>[];
  systems: readonly SystemOfRecord[];
  logger?: Logger;
  /**
   * Called when the owner cannot go on and a restart would help: its
   * consumer crashed and kafkajs will not restart it. A process should exit
   * and be restarted by its supervisor. Nothing an intent, a system of record
   * or the registry does leads here.
   */
  onFatal?: (err: Error) => void;
  /**
   * Who may submit intents: every intent must then be signed by the agent it
   * names (Ed25519, `writ-signature` header), may call only that agent's tools
   * and is answered only on its registered reply topic. Default: the file at
   * `agentRegistryPath` (`WRIT_AGENT_REGISTRY`), else none (any producer may
   * submit; for development only: the owner warns at start).
   */
  agents?: AgentRegistry;
}

/**
 * The consumer groups of a router process's two ledger readers, each a group of its own so that it is assigned
 * every ledger partition: read_committed restores, and the read_uncommitted scan for entries of aborted transactions.
 * Under `WRIT_GROUP_ID`'s prefix (its ACLs cover them).
 */
export function ledgerReaderGroups(config: Pick<RouterConfig, "groupId" | "instanceId">): { restore: string; scan: string } {
  return { restore: `${config.groupId}.ledger-reader.${config.instanceId}`, scan: `${config.groupId}.ledger-scan.${config.instanceId}` };
}

/** An admin connected at its first use; a connect that failed is tried again at the next. */
function connectedOnDemand(admin: Admin): () => Promise<Admin> {
  let connecting: Promise<void> | null = null;
  return () => {
    connecting ??= admin.connect().catch((err: unknown) => {
      connecting = null;
      throw err;
    });
    return connecting.then(() => admin);
  };
}

/** Test-only switches of the fault suite's ablation controls; not part of the public API (src/index.ts does not export them). */
export interface RouterInternals {
  ablateLedger?: boolean;
  ablateVersionCheck?: boolean;
  /** Ablation control for the fault suite's lease case, never for production: owners grant every lease and honour none. */
  ablateLeases?: boolean;
  /**
   * Ablation control for the fault suite, never for production: a restore skips the read_uncommitted scan, so the
   * `pending` entries of an aborted transaction (a crashed owner's, whose PATCH may have gone out) are lost.
   */
  ablateInDoubtScan?: boolean;
  /**
   * Ablation control for tests, never for production: no check for another group of owners at the start, none when
   * a partition is restored (the ledger's progress entry, the take-up check), and the watch only reports other
   * groups of owners, never holds.
   */
  ablateSingleWriter?: boolean;
  /**
   * Ablation control for tests, never for production: a restore skips only the take-up check (other groups of owners
   * on the intents topic), not the ledger's, and the watch only reports other groups of owners, never holds.
   */
  ablateTakeUp?: boolean;
  /** Test seam: skips only the start's check for other groups of owners (as when they cannot be described), not the ledger's. */
  ablateOwnerGroupsCheck?: boolean;
  /** How often the owner looks for other groups of owners on its intents topic, ms (tests; 60 s otherwise). */
  ownerGroupsCheckMs?: number;
  /** Replaces the end-offset probe of the hang watch (tests). */
  offsetProbe?: OffsetProbe;
  /** Holds a transaction between its last send and its commit (the fault suite's hanging-transaction case). */
  beforeCommit?: (info: { partition: number; topics: string[]; offset: boolean }) => Promise<void>;
  /**
   * Test seam: topics' configs are not read (as for owners without DESCRIBE_CONFIGS on them): what a topic takes
   * is learned only from the broker's refusals.
   */
  ablateTopicLimits?: boolean;
  /** A retention window below the config's least hour, so that a test sees the sweep (tests). Hours. */
  ledgerRetentionHours?: number;
  /** Ablation control for tests, never for production: the answer budget counts but never makes an answer wait. */
  ablateResponseBudget?: boolean;
  /** Ablation control for tests, never for production: an answer's bytes go back once parsed, though its intent keeps the record. */
  ablateResponseChains?: boolean;
  /**
   * How long an idle fetch of the owners' consumer waits, ms (tests and `writ verify`'s short-lived owner; 500 otherwise). Intents that arrive while a
   * partition opens are read again by the first fetch after it opened, which starts only once the fetch in flight
   * ended: a test's first intent waited up to this long after every owner start, and every stop waited for it too.
   */
  fetchMaxWaitMs?: number;
  /** Every kafkajs log entry of the router's clients, of any level (`writ verify` records connection errors from it). */
  kafkaLogTap?: KafkaLogTap;
  /** The schema registry did not answer, or answered 5xx or 429 (`writ verify` records it as an outage). */
  onRegistryUnreachable?: (err: WritError) => void;
}

export interface Router {
  readonly config: RouterConfig;
  /** Partitions this process owns and has restored. */
  ownedPartitions(): number[];
  /** Nothing that needs a person (an unreadable ledger partition, a hanging transaction, a consumer that gave up). */
  health(): ReturnType<HealthBoard["health"]>;
  /** Every assigned partition is restored and running. */
  ready(): boolean;
  /** This router's metrics in Prometheus text format (as `/metrics` serves them; a registry of its own per router). */
  metrics(): Promise<string>;
  /** The port the health endpoints listen on (the kernel's pick when `healthPort` is 0); undefined without them. */
  healthPort(): number | undefined;
  stop(): Promise<void>;
}

/**
 * The router's logger (`component: "router"`, its instance id), under which its partition owners, ledger
 * readers, hang watch and kafkajs log, each line with its own component only.
 */
export function routerLogger(logger: Logger | undefined, instanceId: string): Logger {
  return componentLogger(logger ?? createLogger(), "router", { instance: instanceId });
}

/**
 * Starts an owner process: admits the tools (refusing to start otherwise),
 * creates the contract topics, and joins the owners' group on
 * `writ.intents`. Fetching is decoupled from processing: each partition's
 * fetched intents go to its {@link PartitionOwner}, whose buffer pauses the
 * partition's fetching when full; a slow record or partition never holds up
 * the others.
 *
 * @example
 * const router = await startRouter({ config: routerConfigFromEnv(), tools: [refund], systems: [billing] });
 */
export async function startRouter(opts: RouterOptions, internals: RouterInternals = {}): Promise<Router> {
  hideKafkajsTimeoutWarning();
  const parsed = parseConfig(RouterConfig, opts.config, "router");
  const config = internals.ledgerRetentionHours === undefined ? parsed : { ...parsed, ledgerRetentionHours: internals.ledgerRetentionHours };
  const log = routerLogger(opts.logger, config.instanceId);
  // Process-wide, as the heap it protects: the last owner started in a process sets it.
  sorResponseBudget.setLimit(config.sorResponseBytesInFlight);
  sorResponseBudget.enforce = internals.ablateResponseBudget !== true;
  sorResponseBudget.chaining = internals.ablateResponseChains !== true;
  const metrics = new RouterMetrics();
  // Each admitted tool's system of record, wrapped once: timed and traced (writ.read, writ.patch, writ.lookup).
  const agents = opts.agents ?? (config.agentRegistryPath ? AgentRegistry.fromFile(config.agentRegistryPath) : undefined);
  // Before anything connects: an owner required to verify signatures never runs open.
  checkAgentRegistryRequired(config, agents !== undefined);
  const health = new HealthBoard(log);
  // Every call a system answers (anything but an outage or a throw) ends its outage on /healthz, said once.
  const tools = observeTools(admitTools(opts.tools, opts.systems, { sorTimeoutMs: config.sorTimeoutMs, requireDelta: agents !== undefined }), (system, method, outcome, seconds) => {
    metrics.sorCall(system, method, outcome, seconds);
    if (outcome !== "unavailable" && outcome !== "error") health.answered(system);
  });
  if (config.healthPort !== undefined) await checkHealthAddress(config.healthHost, config.healthPort);
  registerCompressionCodecs();
  const kafkaClient = (clientId: string, client?: string) =>
    new Kafka({
      clientId,
      brokers: config.brokers,
      // SASL and TLS (config.kafka): the ledger reader and every producer and admin of this router come from these clients.
      ...kafkaConnection(config.kafka),
      ...kafkaLogging(log, logLevel.WARN, internals.kafkaLogTap, client),
      retry: { retries: 8, initialRetryTime: 200, maxRetryTime: 5000 },
    });
  const kafka = kafkaClient(config.clientId);
  for (const warning of transportWarnings(config.kafka, config)) log.warn(warning);
  for (const warning of configWarnings(config)) log.warn(warning);
  // A lookup that waited for the budget: someone frames values with ids this process has not seen, faster than
  // WRIT_REGISTRY_LOOKUPS_PER_S. Said at most once a minute, with how many waited since it was last said.
  const lookupWaits = {
    waited: 0,
    saidAt: Number.NEGATIVE_INFINITY,
    note(ms: number): void {
      this.waited += 1;
      const now = Date.now();
      if (now - this.saidAt < 60_000) return;
      log.warn(
        { lookupsWaited: this.waited, waitedMs: ms, registryLookupsPerSecond: config.registryLookupsPerSecond },
        "schema id lookups are waiting for their budget (WRIT_REGISTRY_LOOKUPS_PER_S): values framed with ids this owner has not seen arrive faster than it; the records carrying them wait their turn (writ_registry_id_lookups_total says how many were unknown)",
      );
      this.saidAt = now;
      this.waited = 0;
    },
  };
  const codec = new WireCodec({
    schemaRegistryUrl: config.schemaRegistryUrl,
    schemaRegistryAuth: config.schemaRegistryAuth,
    schemaRegistryTls: config.schemaRegistryTls,
    registryLookupsPerSecond: config.registryLookupsPerSecond,
    ...(internals.onRegistryUnreachable === undefined ? {} : { onUnreachable: internals.onRegistryUnreachable }),
    onLookup: (lookup) => {
      metrics.registryLookup(lookup);
      if (lookup.waitedMs > 0) lookupWaits.note(lookup.waitedMs);
    },
    // A refused schema must not stop a partition: its values go out as plain JSON, and a person is told.
    onSchemaRefused: (subject, message) => {
      if (message === null) {
        health.clear(`schema:${subject}`);
        log.info({ subject }, "the registry accepted the schema again; values are framed again");
        return;
      }
      health.problem(`schema:${subject}`, `the registry refused the schema (values go unframed meanwhile): ${message}`);
      log.error({ subject, reason: message }, "the schema registry refused a schema; values of this subject are written as plain JSON until it accepts it (check the subject's compatibility level)");
    },
    // Its login or URL refused: the work that writes there pauses (isRegistryOutage) until it is put right.
    onRegistryFault: (message) => {
      if (message === null) {
        health.clear("schema-registry");
        log.info("the schema registry registers writ's schemas again; paused work goes on");
        return;
      }
      health.problem("schema-registry", message);
      log.error({ reason: message }, "the schema registry refuses writ's requests (SCHEMA_REGISTRY_URL, SCHEMA_REGISTRY_USERNAME, SCHEMA_REGISTRY_PASSWORD); the work that writes a value waits until it accepts them");
    },
  });
  // Partition owners share this admin and open concurrently after a rebalance: its requests go one at a time.
  const admin: Admin = serialAdmin(kafka.admin());
  // Patient: an owner that starts while a broker is down or a leader is being elected (a replacement owner
  // usually does) meets retriable metadata errors that kafkajs's admin passes on; they must not stop it.
  const partitions = await retry(async () => {
    await admin.connect();
    await ensureTopics(admin, routerTopics(config));
    return contractPartitions(admin, config);
  }, START_PATIENCE);
  await warnOnSingleReplicaTopics(admin, routerTopics(config), log);
  // Another group of owners on this intents topic is not fenced by this one's transactional ids (docs/architecture.md
  // §5.2): its records would have two writers. A new group refuses to start beside a running one. A group that kept
  // rebalancing while described does not stop the start: the take-up check (after this owner's join) refuses the
  // partitions while it cannot be told. `groupMemory`: what this process learns of other consumer groups, for the
  // moments they rebalance (single-writer.ts).
  const groupMemory = new GroupMemory();
  if (!internals.ablateSingleWriter && !internals.ablateOwnerGroupsCheck) {
    const others = await otherOwnerGroups(admin, config, undefined, groupMemory).then(
      (look) => look.owners,
      (err: unknown) => {
        log.warn({ err }, "could not list the consumer groups to check for other owners of this intents topic (the owners need DESCRIBE on them); the ledger's and the take-up checks stay");
        return [];
      },
    );
    if (others.length > 0) {
      await admin.disconnect().catch(() => undefined);
      throw new WritError("config_invalid", otherOwnersMessage(config, others), { retriable: false, context: { field: "groupId", otherGroups: others.map((o) => o.group) } });
    }
  }
  if (!agents) log.warn("no agent registry: any producer may submit intents as any agent (set WRIT_AGENT_REGISTRY in production, and WRIT_REQUIRE_AGENT_REGISTRY=true so an owner without one refuses to start)");
  if (config.signingAudience !== undefined) {
    log.info({ signingAudience: config.signingAudience }, "signed intents and resolutions must name this deployment's audience (WRIT_SIGNING_AUDIENCE); others are dead-lettered unauthenticated");
  } else if (agents) {
    log.info("no signing audience (WRIT_SIGNING_AUDIENCE unset): a signed intent or resolution is admitted whatever audience it names, or none");
  }

  const encoder = new RecordEncoder(codec, config, { log, onSize: metrics.sizeRefusal });
  const topicDirectory = new TopicDirectory(admin, { ...(internals.ablateTopicLimits ? {} : { limits: encoder.limits }), log });
  // What writ's own topics take (one read of their configs): a record over it is trimmed or dead-lettered as for a
  // reply topic. Ledger entries cannot be trimmed: a ledger that takes less than the largest one would fail the
  // transactions of a partition writing it, which would stop. Refused here, as a ledger of another partition count
  // is (configs not readable, no DescribeConfigs: every limit, the ledger's too, is learned from a refusal instead).
  const ownLimits = await batchLimits(admin, Object.values(config.topics)).catch((err: unknown) => {
    log.warn({ err }, "could not read writ's topics' configs (the owners need DESCRIBE_CONFIGS on them) to check what they take, the ledger's largest entry among it");
    return new Map<string, BatchLimit>();
  });
  for (const [topic, limit] of internals.ablateTopicLimits ? [] : ownLimits) {
    encoder.limits.described(topic, limit.bytes);
    if (limit.bytes < config.maxMessageBytes) {
      log.warn({ topic, bytes: limit.bytes, maxMessageBytes: config.maxMessageBytes }, "a topic of writ's takes less than WRIT_MAX_MESSAGE_BYTES (its max.message.bytes or segment.bytes): raise it to at least WRIT_MAX_MESSAGE_BYTES");
    }
  }
  const ledgerLimit = ownLimits.get(config.topics.ledger);
  const ledgerProblem = ledgerLimit && batchLimitProblem(config.topics.ledger, "ledger", ledgerLimit, topicNeeds(config).ledger);
  if (ledgerProblem) {
    await admin.disconnect().catch(() => undefined);
    throw new WritError("config_invalid", ledgerProblem, { retriable: false, context: { field: "topics.ledger", bytes: ledgerLimit!.bytes, needed: topicNeeds(config).ledger } });
  }
  const readerOf = { kafka, admin, topic: config.topics.ledger, partitions: config.intentPartitions, codec, log };
  const readerGroups = ledgerReaderGroups(config);
  const reader = new LedgerReader({ ...readerOf, groupId: readerGroups.restore });
  // The same partitions read_uncommitted, after each restore: `pending` entries of aborted transactions (see
  // restorePartition in partition-restore.ts). A group of its own, so that its consumer is assigned every partition too.
  const inDoubtReader = new LedgerReader({ ...readerOf, groupId: readerGroups.scan, isolation: "read_uncommitted" });
  // Patient too: each reader's consumer subscribes, which reads the ledger's metadata.
  await retry(() => Promise.all([reader.start(), inDoubtReader.start()]), START_PATIENCE);

  const owners = new Map<number, PartitionOwner>();
  let consumer: Consumer | null = null;
  let lease: MemberLease = { confirmed: () => false };
  let stopped = false;
  /** Partitions of the intents topic the group assigned this member last. */
  let assignment = new Set<number>();
  /** Joins of this member so far: a take-up look from before its latest join is not used (single-writer.ts, checkTakeUp). */
  let joins = 0;
  let takeUpLook: { join: number; at: number; result: Promise<OwnerGroupsLook> } | null = null;
  // An admin of its own for looking at other consumer groups (the take-up looks): describing many groups must not
  // queue ahead of the partition owners' opens on the shared, one-request-at-a-time admin.
  const groupsAdmin = kafka.admin();
  const groupsAdminReady = connectedOnDemand(groupsAdmin);
  // The minute's watch, on a client of its own (OWNER_GROUPS_WATCH): ListGroups asks every broker in the metadata,
  // also ones that lead nothing of this owner's, and its log entries are named so that `writ verify` can tell a
  // broker the run never uses from an outage of the run's own (a failed round changes nothing; the next one retries).
  const watchAdmin = kafkaClient(`${config.clientId}-${OWNER_GROUPS_WATCH}`, OWNER_GROUPS_WATCH).admin();
  const watchAdminReady = connectedOnDemand(watchAdmin);
  /** Other groups of owners of this intents topic for a restore's take-up check: one look per join, for up to 5 s. */
  const ownerGroups = (): Promise<OwnerGroupsLook> => {
    const now = Date.now();
    if (takeUpLook !== null && takeUpLook.join === joins && now - takeUpLook.at < 5_000) return takeUpLook.result;
    const result = groupsAdminReady().then((a) => otherOwnerGroups(a, config, undefined, groupMemory));
    const look = { join: joins, at: now, result };
    takeUpLook = look;
    result.catch(() => {
      if (takeUpLook === look) takeUpLook = null;
    });
    return result;
  };
  /** Set while the watch finds another group of owners on this intents topic (see lookForOthers): every owner holds. */
  let holding = false;
  /** Set once a partition's take-up check met config_invalid: the router stops (once). */
  let steppingAside = false;
  /** This router, once startRouter returns it (a take-up check may fail while it starts). */
  let announceRouter: (router: Router) => void = () => undefined;
  const routerStarted = new Promise<Router>((resolve) => (announceRouter = resolve));
  const topic = config.topics.intents;
  const intakeCall = (what: string, partition: number, call: () => void): void => {
    try {
      call();
    } catch (err) {
      log.warn({ err, partition }, `intake ${what} refused by the consumer (restarting); its next join takes over`);
    }
  };
  const ctx: OwnerContext = {
    kafka,
    admin,
    config,
    codec,
    encoder,
    reader,
    inDoubtReader,
    pipeline: new IntentPipeline({ config, log, ablateLedger: internals.ablateLedger === true, ablateVersionCheck: internals.ablateVersionCheck === true, observe: metrics.pipeline }),
    admission: { config, codec, tools, replyTopics: topicDirectory, now: () => new Date(), agents, partitions },
    topicDirectory,
    // kafkajs throws from pause/resume/seek while its consumer restarts after a crash ("Consumer group was not
    // initialized"): that must not stop a partition owner, which calls these from its open and rewind paths. Nothing
    // is lost: the restarted consumer joins again and fetches from the committed offset, records of a partition that
    // is not running are dropped by its owner, and a running owner drops the offsets it has already taken.
    intake: {
      pause: (p) => intakeCall("pause", p, () => consumer?.pause([{ topic, partitions: [p] }])),
      // Held: stays paused (lookForOthers reopens the partitions when the hold ends).
      resume: (p) => {
        if (!holding) intakeCall("resume", p, () => consumer?.resume([{ topic, partitions: [p] }]));
      },
      seek: (p, offset) => intakeCall("seek", p, () => consumer?.seek({ topic, partition: p, offset })),
    },
    // The membership's lease, dated from when the coordinator's last good answer was asked for (member-lease.ts).
    lease: { confirmed: () => lease.confirmed() },
    health,
    observe: metrics.owner,
    ...(internals.beforeCommit ? { hooks: { beforeCommit: internals.beforeCommit } } : {}),
    ...(internals.ablateLeases ? { ablateLeases: true } : {}),
    ...(internals.ablateInDoubtScan ? { ablateInDoubtScan: true } : {}),
    ...(internals.ablateSingleWriter ? { ablateSingleWriter: true } : {}),
    ...(internals.ablateTakeUp ? { ablateTakeUp: true } : {}),
    ownerGroups,
    holding: () => holding,
    // The take-up check found another group of owners running (config_invalid): as at the start, this owner steps
    // aside; it stops (its consumer leaves the group, so the other group's watch does not take it for a writer) and
    // tells its supervisor.
    onConfigInvalid: (err) => {
      if (steppingAside) return;
      steppingAside = true;
      health.problem("other-owner-groups", err.message);
      log.error({ err }, "another group of owners runs on this intents topic; this owner stops");
      void routerStarted
        .then((router) => router.stop())
        .catch((e: unknown) => log.error({ err: e }, "stopping after the take-up check failed"))
        .then(() => opts.onFatal?.(err));
    },
    onFenced: (p) => {
      if (owners.get(p)?.state !== "fenced") return;
      owners.delete(p);
      // Fenced while the group still assigns the partition here: either a rebalance this member has not seen
      // yet (its next heartbeat rejoins and the partition goes), or an owner elsewhere that was leaving
      // fenced it on its way out. After a pause, a partition still assigned here gets a new owner, once the
      // coordinator has answered this member lately (whenConfirmed says why).
      whenConfirmed({ confirmed: () => lease.confirmed() }, Math.floor(config.sessionTimeoutMs / 2), () => !stopped && !owners.has(p) && assignment.has(p), () => {
        log.warn({ partition: p }, "partition still assigned here after being fenced; taking it up again");
        const owner = new PartitionOwner(p, ctx);
        owners.set(p, owner);
        owner.start();
      });
    },
    log,
  };
  health.setReadiness(() => {
    const states = [...owners].map(([p, o]) => ({ partition: p, state: o.state }));
    return { ready: consumer !== null && states.every((s) => s.state === "running"), detail: states };
  });

  const release = async (p: number) => {
    const owner = owners.get(p);
    owners.delete(p);
    await owner?.close();
  };
  const c: Consumer = kafka.consumer({
    groupId: config.groupId,
    readUncommitted: false,
    sessionTimeout: config.sessionTimeoutMs,
    heartbeatInterval: Math.floor(config.sessionTimeoutMs / 10),
    allowAutoTopicCreation: false,
    // kafkajs's round robin, whose membership also says "a writ owner of these topics" (otherOwnerGroups reads it).
    partitionAssigners: [ownerAssigner(config.topics)],
    maxBytesPerPartition: 1_048_576,
    // A fetch returns as soon as intents arrive; this bounds only an idle long poll, which
    // holds up a clean leave (shutdown) and this member's rejoin in a rebalance.
    maxWaitTimeInMs: internals.fetchMaxWaitMs ?? 500,
  });
  consumer = c;
  lease = memberLease(c, config.sessionTimeoutMs);
  let memberId: string | null = null;
  c.on(c.events.GROUP_JOIN, (event) => {
    if (stopped) return;
    const assigned = new Set(event.payload.memberAssignment[topic] ?? []);
    assignment = assigned;
    // A new member id means this process lost its membership (a pause past the session timeout, a
    // restart of the consumer): another owner may have fenced ours meanwhile, so none of the old owners
    // may write again, even for a partition assigned back. They are replaced by fresh ones (fence, restore).
    const lapsed = memberId !== null && memberId !== event.payload.memberId;
    joins++;
    memberId = event.payload.memberId;
    for (const p of [...owners.keys()]) if (lapsed || !assigned.has(p)) void release(p);
    for (const p of assigned) {
      const existing = owners.get(p);
      if (existing && existing.state !== "fenced" && existing.state !== "closed") continue;
      const owner = new PartitionOwner(p, ctx);
      owners.set(p, owner);
      owner.start();
    }
    log.info({ partitions: [...assigned].sort((a, b) => a - b), isLeader: event.payload.isLeader, memberId: event.payload.memberId }, "assignment");
  });
  // Stopped for good at the router's stop (a restart kafkajs has under way is waited for: src/kafka/keep-stopped.ts).
  const consumerStop = keepStopped(c, { onUnsettled: () => log.warn("a restart of the owner consumer was still connecting when the router stopped; it may join the group once Kafka answers") });
  c.on(c.events.CRASH, (event) => {
    const err = event.payload.error;
    if (event.payload.restart) {
      log.warn({ err }, "owner consumer restarting after a retriable error");
      return;
    }
    log.error({ err }, "owner consumer crashed and will not restart");
    health.problem("consumer", `owner consumer crashed: ${err.message}`);
    opts.onFatal?.(err);
  });
  // Patient too (see above): subscribing reads the topic's metadata.
  await retry(async () => {
    await c.connect();
    await c.subscribe({ topic, fromBeginning: true });
  }, START_PATIENCE);
  await c.run({
    autoCommit: false,
    eachBatchAutoResolve: false,
    partitionsConsumedConcurrently: Math.min(config.intentPartitions, 16),
    eachBatch: async ({ batch, resolveOffset, heartbeat, isStale }) => {
      // Fetched before a seek (an owner rewound its partition): the owner reads again from the seek.
      metrics.fetched(batch.partition, batch.highWatermark);
      if (isStale()) return;
      const owner = owners.get(batch.partition);
      if (owner?.state === "running") {
        owner.accept(batch.messages, batch.lastOffset());
        if (owner.load >= config.maxBufferedPerPartition) c.pause([{ topic, partitions: [batch.partition] }]);
      }
      // Offsets are committed in the owners' transactions; this only moves kafkajs's fetch position on.
      resolveOffset(batch.lastOffset());
      await heartbeat();
    },
  });
  log.info({ tools: [...tools.keys()], groupId: config.groupId, registry: config.schemaRegistryUrl !== undefined }, "router started");

  // Retention: idle partitions get their expired ledger entries tombstoned too.
  const sweepEveryMs = Math.max(250, Math.min(60_000, (config.ledgerRetentionHours * 3_600_000) / 4));
  const sweeper = setInterval(() => {
    for (const owner of owners.values()) owner.requestSweep();
  }, sweepEveryMs);
  sweeper.unref();

  const probe = internals.offsetProbe ?? createOffsetProbe({ brokers: config.brokers, clientId: `${config.clientId}-probe`, log, security: config.kafka });
  metrics.attach({
    partitions: () => [...owners].flatMap(([partition, o]) => {
      const s = o.stats();
      return s ? [{ partition, ...s }] : [];
    }),
    highWatermarks: async (ps) => {
      const ends = await probe.endOffsets(ps.map((partition) => ({ topic, partition })));
      return new Map(ends.filter((e) => e.topic === topic).map((e) => [e.partition, BigInt(e.highWatermark)]));
    },
  });
  const watch = new HangWatch({ probe, health, log, healAfterMs: config.hangHealAfterMs, reportAfterMs: config.transactionTimeoutMs });
  let watching = false;
  const watcher = setInterval(() => {
    if (watching) return;
    watching = true;
    void watchOnce().finally(() => {
      watching = false;
    });
  }, config.lsoCheckIntervalMs);
  watcher.unref();
  const watchOnce = async () => {
    const running = [...owners.values()].filter((o) => o.state === "running");
    // A ledger partition is watched from its assignment on: a transaction hanging there keeps its owner from
    // ever opening (the restore reads committed, up to its marker), and only the watch names the cause.
    const assigned = [...owners.values()].filter((o) => o.state !== "closed" && o.state !== "fenced");
    if (assigned.length === 0) return;
    const writers = new Map<string, PartitionOwner[]>();
    const add = (t: string, o: PartitionOwner) => writers.set(t, [...(writers.get(t) ?? []), o]);
    for (const o of running) {
      for (const t of o.replyTopics()) add(t, o);
      add(config.topics.human, o);
      add(config.topics.dlq, o);
    }
    try {
      // Every owner may forward to any intents partition but its own (§3.1).
      for (const o of running) add(config.topics.intents, o);
      const counts = await topicDirectory.partitionCounts(writers.keys());
      const tps: TopicPartition[] = assigned.map((o) => ({ topic: config.topics.ledger, partition: o.partition }));
      for (const [t, n] of counts) for (let p = 0; p < n; p++) tps.push({ topic: t, partition: p });
      await watch.check(tps, (tp) => {
        const healers =
          tp.topic === config.topics.ledger
            ? running.filter((o) => o.partition === tp.partition)
            : (writers.get(tp.topic) ?? []).filter((o) => tp.topic !== config.topics.intents || o.partition !== tp.partition);
        for (const o of healers) o.requestHeal(tp.topic, [tp.partition]);
        return healers.length > 0;
      });
    } catch (err) {
      log.debug({ err }, "last-stable-offset check failed; next round retries");
    }
  };

  // Owners of another group on this intents topic (started beside this one, where neither could see the other, or
  // where this one could not see them): said where a person looks, and this owner holds its partitions while they
  // run. Both groups hold when both see each other: the safe outcome for a misconfiguration (stop one of the groups).
  let othersSaid = "";
  let lookingForOthers = false;
  /** The other groups of owners the hold was started for: it ends once each is gone (ownerGroupsGone). */
  let heldAgainst: string[] = [];
  const enforce = !internals.ablateSingleWriter && !internals.ablateTakeUp;
  const lookForOthers = async () => {
    const groupsAdmin = await watchAdminReady();
    const { owners: others, undetermined } = await otherOwnerGroups(groupsAdmin, config, undefined, groupMemory);
    // A group that kept rebalancing while described neither starts a hold nor ends one; the next round tells.
    if (others.length === 0 && undetermined.length > 0) {
      log.debug({ undetermined }, "consumer groups kept rebalancing while described; whether they are owners of this intents topic is told next round");
      return;
    }
    const said = others.map((o) => o.group).sort().join(",");
    if (said === othersSaid) return;
    othersSaid = said;
    if (others.length === 0) {
      // A group rebalancing shows no owners for a moment: the hold ends only once each group it was started for is
      // gone (Empty, Dead, or Stable without owners); until then the next round looks again.
      if (holding && !(await ownerGroupsGone(groupsAdmin, heldAgainst, config.topics.intents))) {
        othersSaid = "";
        return;
      }
      health.clear("other-owner-groups");
      if (!holding) return log.info("no other group of owners consumes this intents topic any more");
      holding = false;
      heldAgainst = [];
      // Opened again from the topics, with their checks (a fresh take-up look): the other group may have written the ledger.
      takeUpLook = null;
      log.info({ partitions: [...owners.keys()].sort((a, b) => a - b) }, "no other group of owners consumes this intents topic any more; taking this owner's partitions up again");
      for (const o of owners.values()) o.reopen();
      return;
    }
    const message = enforce ? holdingMessage(config, others) : otherOwnersMessage(config, others);
    health.clear("other-owner-groups");
    health.problem("other-owner-groups", message);
    if (enforce) heldAgainst = [...new Set([...heldAgainst, ...others.map((o) => o.group)])];
    if (enforce && !holding) {
      holding = true;
      for (const p of owners.keys()) ctx.intake.pause(p);
    }
    log.error({ otherGroups: others, holding }, message);
  };
  const othersWatch = setInterval(() => {
    if (lookingForOthers || stopped) return;
    lookingForOthers = true;
    lookForOthers()
      .catch((err: unknown) => log.debug({ err }, "listing the consumer groups for other owners failed; next round retries"))
      .finally(() => {
        lookingForOthers = false;
      });
  }, internals.ownerGroupsCheckMs ?? 60_000);
  othersWatch.unref();

  let server: Server | null = null;

  const router: Router = {
    config,
    ownedPartitions: () => [...owners].filter(([, o]) => o.state === "running").map(([p]) => p).sort((a, b) => a - b),
    health: () => health.health(),
    ready: () => health.ready().ready,
    metrics: () => metrics.text(),
    healthPort: () => {
      const address = server?.address();
      return typeof address === "object" && address !== null ? address.port : undefined;
    },
    async stop() {
      if (stopped) return;
      stopped = true;
      clearInterval(sweeper);
      clearInterval(watcher);
      clearInterval(othersWatch);
      // Its background tries of refused subjects would outlive the router, and set its health.
      codec.close();
      await Promise.all([...owners.keys()].map(release));
      consumer = null;
      // Side by side: each waits for its fetch in flight, and with every owner closed no restore needs the readers.
      await Promise.all([consumerStop.disconnect(), reader.stop().catch(() => undefined), inDoubtReader.stop().catch(() => undefined)]);
      await probe.close?.().catch(() => undefined);
      await admin.disconnect().catch(() => undefined);
      await Promise.all([groupsAdmin.disconnect().catch(() => undefined), watchAdmin.disconnect().catch(() => undefined)]);
      await new Promise<void>((resolve) => (server ? server.close(() => resolve()) : resolve()));
      log.info("router stopped");
    },
  };
  if (config.healthPort !== undefined) {
    try {
      server = await health.serve({
        host: config.healthHost,
        port: config.healthPort,
        headersTimeoutMs: config.healthHeadersTimeoutMs,
        maxConnectionsPerAddress: config.healthMaxConnectionsPerAddress,
        log,
        metrics: async () => ({ contentType: metrics.contentType, body: await metrics.text() }),
      });
    } catch (err) {
      // Taken since the check at start: a rejected start leaves no owner consuming behind it.
      await router.stop();
      throw healthListenError(config.healthHost, config.healthPort, err);
    }
  }
  announceRouter(router);
  return router;
}

/**
 * Partitions of the intents topic as it is (it may predate this config), and
 * the refusal to run when the ledger's differ: partition p's ledger must be
 * ledger partition p.
 */
async function contractPartitions(admin: Admin, config: RouterConfig): Promise<number> {
  const { topics } = await admin.fetchTopicMetadata({ topics: [config.topics.intents, config.topics.ledger] });
  const count = (t: string) => topics.find((m) => m.name === t)?.partitions.length ?? 0;
  const intents = count(config.topics.intents);
  const ledger = count(config.topics.ledger);
  if (intents !== ledger || intents === 0) {
    throw new WritError("config_invalid", `${config.topics.intents} has ${intents} partitions and ${config.topics.ledger} ${ledger}; they must be equal (partition p's ledger is ledger partition p)`, {
      retriable: false,
      context: { field: "topics" },
    });
  }
  return intents;
}
