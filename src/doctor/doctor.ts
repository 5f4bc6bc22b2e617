// `writ doctor`: finds hanging transactions on writ's topics (a partition whose
// last stable offset is stuck behind an open transaction that no coordinator
// will ever finish) and, when asked, aborts them and checks that the last
// stable offset moved. See src/cli/doctor.ts for the command line.
import { Kafka, logLevel as LogLevel, type Admin, type ConfigResourceTypes, type KafkaConfig, type logCreator } from "kafkajs";
import { WritError } from "../errors.ts";
import { printable } from "../printable.ts";
import { KAFKA_MAX_TRANSACTION_TIMEOUT_MS, TxnAdmin, type HangingTransaction, type PartitionOffsets, type PartitionProducers } from "../kafka/txn-admin.ts";
import { checkTopicAcls, DEFAULT_OWNER_PRINCIPAL, formatAclCheck, type AclCheck, type WritTopicNames } from "./acls.ts";

/** writ's topic contract: the topics `writ doctor` checks unless told otherwise (plus every reply topic). */
export const CONTRACT_TOPICS = ["writ.intents", "writ.ledger", "writ.human", "writ.dlq"] as const;
export const DEFAULT_REPLY_PREFIX = "writ.replies.";
/** ConfigResourceTypes.BROKER (kafkajs's enums are not named exports of its CommonJS module). */
const BROKER_RESOURCE = 4 as ConfigResourceTypes;
/** Above writ's default transaction timeout (60 s), so that transactions the coordinator is about to time out are not reported. */
export const DEFAULT_OLDER_THAN_MS = 60_000;

export interface DoctorOptions {
  brokers: string[];
  /** Check exactly these topics (each must exist). Default: `contractTopics` that exist plus every topic starting with `replyPrefix`. */
  topics?: string[];
  contractTopics?: readonly string[];
  replyPrefix?: string;
  /** The contract topics by role, for the ACL check (default writ.intents, writ.ledger, writ.human, writ.dlq). */
  topicNames?: Omit<WritTopicNames, "replyPrefix">;
  /** The owners' principals: any other that may write a trusted topic is a warning (default `User:writ-owner`). */
  ownerPrincipals?: readonly string[];
  /** Only open transactions whose last write is older than this count (ms). */
  olderThanMs?: number;
  /**
   * The longest transaction timeout the brokers allow (ms): an open transaction whose producer no coordinator lists
   * counts only past it (default: the brokers' transaction.max.timeout.ms, or Kafka's 900000 when they do not say).
   */
  maxTransactionTimeoutMs?: number;
  /** Abort every hanging transaction found, then check that each partition's last stable offset moved past it. */
  abort?: boolean;
  /** How long to wait for the last stable offset to move after an abort (ms, default 15000). */
  settleTimeoutMs?: number;
  clientId?: string;
  ssl?: KafkaConfig["ssl"];
  sasl?: KafkaConfig["sasl"];
  logCreator?: logCreator;
  logLevel?: LogLevel;
  now?: () => number;
}

/** One hanging transaction, JSON-ready (64-bit numbers as strings). */
export interface DoctorFinding {
  topic: string;
  partition: number;
  startOffset: string;
  producerId: string;
  producerEpoch: number;
  coordinatorEpoch: number;
  /** The transactional id that owns the producer id now, or null when no coordinator lists one. */
  transactionalId: string | null;
  /** That id's state at its coordinator, or null. */
  transactionState: string | null;
  lastTimestamp: number;
  /** ms since the producer's last write to the partition. */
  idleMs: number;
  hint: string;
  /** Present with --abort. */
  abort?: {
    ok: boolean;
    lastStableBefore: string;
    lastStableAfter: string;
    highWatermark: string;
    error?: string;
  };
}

export interface DoctorReport {
  /** Nothing hangs any more: none was found, or every one found was aborted and its partition's LSO moved. */
  ok: boolean;
  brokers: string[];
  olderThanMs: number;
  /** How old an open transaction of a producer that no coordinator lists must be to count (ms). */
  maxTransactionTimeoutMs: number;
  topics: string[];
  /** Contract topics that do not exist (not an error: writ creates them when an owner starts). */
  missingTopics: string[];
  partitions: number;
  findings: DoctorFinding[];
  /** Who may write writ's trusted topics (a warning does not change `ok`, which is about hanging transactions). */
  acls: AclCheck;
}

function runbookHint(t: HangingTransaction, brokers: readonly string[], olderThanMs: number, maxTransactionTimeoutMs: number): string {
  const start = t.startOffset.toString();
  const why =
    t.transactionalId === undefined
      ? `no transaction coordinator lists producer ${t.producerId} and its last write is older than the longest transaction timeout (${maxTransactionTimeoutMs} ms)`
      : `coordinator has ${t.transactionalId} in state ${t.transactionState ?? "unknown (not found)"}, without this partition`;
  return (
    `${why}, so no marker will ever close it and read_committed consumers of ${t.topic}[${t.partition}] stay stuck at offset ${start}; ` +
    `abort it: writ doctor --abort --topics ${t.topic}${olderThanMs === DEFAULT_OLDER_THAN_MS ? "" : ` --older-than-ms ${olderThanMs}`} ` +
    `(same as kafka-transactions.sh --bootstrap-server ${brokers[0] ?? "<broker>"} abort --topic ${t.topic} --partition ${t.partition} --start-offset ${start})`
  );
}

async function waitUntil<T>(deadlineMs: number, probe: () => Promise<T | undefined>): Promise<T | undefined> {
  for (;;) {
    const value = await probe();
    if (value !== undefined || Date.now() >= deadlineMs) return value;
    await new Promise((resolve) => setTimeout(resolve, 200));
  }
}

/**
 * Checks writ's topics for hanging transactions (the rule of
 * `kafka-transactions.sh find-hanging`, see
 * {@link TxnAdmin.findHangingTransactions}) and, with `abort`, aborts each and
 * waits until the partition's last stable offset has moved past it.
 */
export async function runDoctor(opts: DoctorOptions): Promise<DoctorReport> {
  const olderThanMs = opts.olderThanMs ?? DEFAULT_OLDER_THAN_MS;
  const replyPrefix = opts.replyPrefix ?? DEFAULT_REPLY_PREFIX;
  const contract = opts.contractTopics ?? CONTRACT_TOPICS;
  const now = opts.now ?? Date.now;
  const connection = {
    brokers: opts.brokers,
    clientId: opts.clientId ?? "writ-doctor",
    ...(opts.ssl === undefined ? {} : { ssl: opts.ssl }),
    ...(opts.sasl === undefined ? {} : { sasl: opts.sasl }),
    ...(opts.logCreator === undefined ? {} : { logCreator: opts.logCreator }),
    logLevel: opts.logLevel ?? LogLevel.WARN,
    retry: { retries: 3, initialRetryTime: 200 },
  };
  const admin = new Kafka(connection).admin();
  const txn = new TxnAdmin({ ...connection, maxAttempts: 4 });
  // kafkajs's admin errors (unreachable brokers and the like) become writ errors that name the brokers
  const kafka = async <T>(what: string, fn: () => Promise<T>): Promise<T> => {
    try {
      return await fn();
    } catch (err) {
      if (err instanceof WritError) throw err;
      const cause = err as { message?: string; cause?: { message?: string }; retriable?: unknown };
      const detail = [...new Set([cause.message, cause.cause?.message])].filter((m) => m !== undefined && m !== "").join(": ");
      throw new WritError("kafka_failed", `${what} on ${opts.brokers.join(",")} failed: ${detail || String(err)}`, {
        retriable: cause.retriable === true,
        cause: err,
      });
    }
  };
  try {
    await kafka("connecting to Kafka", () => admin.connect());
    // Who may write the trusted topics; a failure is the check's answer (no authorizer, ACLs not visible), not the run's.
    const [intents, ledger, human, dlq] = CONTRACT_TOPICS;
    const names = { intents, ledger, human, dlq, ...opts.topicNames, replyPrefix };
    const acls = await checkTopicAcls(admin, names, opts.ownerPrincipals ?? [DEFAULT_OWNER_PRINCIPAL]);
    const existing = new Set(await kafka("listing topics", () => admin.listTopics()));
    let topics: string[];
    let missingTopics: string[];
    if (opts.topics !== undefined && opts.topics.length > 0) {
      const unknown = opts.topics.filter((t) => !existing.has(t));
      if (unknown.length > 0) {
        throw new WritError("config_invalid", `no such topic: ${unknown.join(", ")}`, { retriable: false, context: { field: "topics", topic: unknown[0] } });
      }
      topics = [...new Set(opts.topics)];
      missingTopics = [];
    } else {
      const replies = [...existing].filter((t) => t.startsWith(replyPrefix)).sort();
      topics = [...new Set([...contract.filter((t) => existing.has(t)), ...replies])];
      missingTopics = contract.filter((t) => !existing.has(t));
    }

    const maxTransactionTimeoutMs = opts.maxTransactionTimeoutMs ?? (await brokersMaxTransactionTimeout(admin));
    const report: DoctorReport = { ok: true, brokers: opts.brokers, olderThanMs, maxTransactionTimeoutMs, topics, missingTopics, partitions: 0, findings: [], acls };
    if (topics.length === 0) return report;
    const metadata = await kafka("reading topic metadata", () => admin.fetchTopicMetadata({ topics }));
    report.partitions = metadata.topics.reduce((sum, t) => sum + t.partitions.length, 0);

    const hanging = await txn.findHangingTransactions({ topics, olderThanMs, maxTransactionTimeoutMs, now });
    const checkedAt = now();
    for (const t of hanging) {
      const finding: DoctorFinding = {
        topic: t.topic,
        partition: t.partition,
        startOffset: t.startOffset.toString(),
        producerId: t.producerId.toString(),
        producerEpoch: t.producerEpoch,
        coordinatorEpoch: t.coordinatorEpoch,
        transactionalId: t.transactionalId ?? null,
        transactionState: t.transactionState ?? null,
        lastTimestamp: t.lastTimestamp,
        idleMs: Math.max(0, checkedAt - t.lastTimestamp),
        hint: runbookHint(t, opts.brokers, olderThanMs, maxTransactionTimeoutMs),
      };
      if (opts.abort) finding.abort = await abortHangingTransaction(txn, t, opts.settleTimeoutMs ?? 15_000);
      report.findings.push(finding);
    }
    report.ok = report.findings.every((f) => f.abort?.ok === true);
    return report;
  } finally {
    await txn.close().catch(() => undefined);
    await admin.disconnect().catch(() => undefined);
  }
}

/**
 * The largest transaction.max.timeout.ms of the brokers, or Kafka's default when one does not say (DescribeConfigs
 * needs DescribeConfigs on the cluster): no coordinator keeps a transaction open longer.
 */
async function brokersMaxTransactionTimeout(admin: Admin): Promise<number> {
  try {
    const { brokers } = await admin.describeCluster();
    const { resources } = await admin.describeConfigs({
      includeSynonyms: false,
      resources: brokers.map((b) => ({ type: BROKER_RESOURCE, name: String(b.nodeId), configNames: ["transaction.max.timeout.ms"] })),
    });
    const values = resources.map((r) => Number(r.configEntries.find((e) => e.configName === "transaction.max.timeout.ms")?.configValue));
    if (values.length === 0 || !values.every((v) => Number.isSafeInteger(v) && v > 0)) return KAFKA_MAX_TRANSACTION_TIMEOUT_MS;
    return Math.max(...values);
  } catch {
    return KAFKA_MAX_TRANSACTION_TIMEOUT_MS;
  }
}

/**
 * Aborts one transaction `findHangingTransactions` found, if it is still as found, and waits until the partition's
 * last stable offset moves past it.
 */
export async function abortHangingTransaction(txn: TxnAdmin, t: HangingTransaction, settleTimeoutMs: number): Promise<NonNullable<DoctorFinding["abort"]>> {
  const tp = { topic: t.topic, partition: t.partition };
  // A failure is this finding's answer, not the run's: the report of the aborts before it must still be printed.
  const failed = (err: unknown, what: string, offsets: { lastStableBefore?: string; lastStableAfter?: string } = {}) => ({
    ok: false,
    lastStableBefore: offsets.lastStableBefore ?? "?",
    lastStableAfter: offsets.lastStableAfter ?? "?",
    highWatermark: "?",
    error: `${what}: ${err instanceof Error ? err.message : String(err)}`,
  });
  let before: PartitionOffsets | undefined;
  let state: PartitionProducers | undefined;
  try {
    [before] = await txn.listOffsets([tp]);
    // As `kafka-transactions.sh abort --start-offset` does: abort only if that producer's transaction is still the
    // one open at that offset, with the epochs the partition reports now.
    [state] = await txn.describeProducers([tp]);
  } catch (err) {
    return failed(err, "not aborted");
  }
  const lastStableBefore = before?.lastStable.toString() ?? "?";
  const current = state?.activeProducers.find((p) => p.producerId === t.producerId && p.currentTxnStartOffset === t.startOffset);
  if (current === undefined) {
    const closed = before !== undefined && before.lastStable > t.startOffset;
    return {
      ok: closed,
      lastStableBefore,
      lastStableAfter: lastStableBefore,
      highWatermark: before?.highWatermark.toString() ?? "?",
      ...(closed ? {} : { error: `producer ${t.producerId} no longer has a transaction open at offset ${t.startOffset}; not aborted` }),
    };
  }
  // Written to since it was found (a new epoch, a new batch): its producer is alive, and its transaction on the
  // partition may be one its coordinator tracks now (an owner's heal joins it); an ABORT marker would drop records
  // whose commit the producer is then told succeeded. The sequence moves with every batch; a timestamp is the
  // client's and need not.
  if (current.producerEpoch !== t.producerEpoch || current.lastSequence !== t.lastSequence || current.lastTimestamp !== t.lastTimestamp) {
    return {
      ok: false,
      lastStableBefore,
      lastStableAfter: lastStableBefore,
      highWatermark: before?.highWatermark.toString() ?? "?",
      error:
        `producer ${t.producerId} wrote to the partition since it was found (epoch ${t.producerEpoch} -> ${current.producerEpoch}, ` +
        `last sequence ${t.lastSequence} -> ${current.lastSequence}, last write ${t.lastTimestamp} -> ${current.lastTimestamp}): ` +
        "it may be live; not aborted, run writ doctor again",
    };
  }
  try {
    await txn.abortTransaction({ ...tp, producerId: current.producerId, producerEpoch: current.producerEpoch, coordinatorEpoch: current.coordinatorEpoch });
  } catch (err) {
    return { ok: false, lastStableBefore, lastStableAfter: lastStableBefore, highWatermark: before?.highWatermark.toString() ?? "?", error: err instanceof Error ? err.message : String(err) };
  }
  // The marker is in the log once WriteTxnMarkers answers; the LSO follows when the high watermark covers it.
  let latest = before;
  let moved: PartitionOffsets | undefined;
  try {
    moved = await waitUntil(Date.now() + settleTimeoutMs, async () => {
      [latest] = await txn.listOffsets([tp]);
      return latest !== undefined && latest.lastStable > t.startOffset ? latest : undefined;
    });
  } catch (err) {
    return failed(err, "the ABORT marker was written, but reading the last stable offset failed", { lastStableBefore });
  }
  return {
    ok: moved !== undefined,
    lastStableBefore,
    lastStableAfter: latest?.lastStable.toString() ?? "?",
    highWatermark: latest?.highWatermark.toString() ?? "?",
    ...(moved === undefined ? { error: `the last stable offset did not move past ${t.startOffset} within ${settleTimeoutMs} ms` } : {}),
  };
}

/** The human-readable report: one line per finding (and one per abort), a summary, then who may write the trusted topics. */
export function formatDoctorReport(report: DoctorReport): string {
  const lines: string[] = [];
  const scope = report.topics.length === 0 ? "no writ topics found" : `${report.partitions} partition(s) of ${report.topics.join(", ")}`;
  lines.push(`writ doctor: ${scope} on ${report.brokers.join(",")}; open transactions idle > ${report.olderThanMs} ms`);
  if (report.missingTopics.length > 0) lines.push(`  (not created yet: ${report.missingTopics.join(", ")})`);
  for (const f of report.findings) {
    const owner = f.transactionalId === null ? "no transactional id" : `transactional id ${f.transactionalId} (${f.transactionState ?? "not found"})`;
    lines.push(
      `HANGING ${f.topic}[${f.partition}] start offset ${f.startOffset}, producer ${f.producerId} epoch ${f.producerEpoch}, ${owner}, idle ${(f.idleMs / 60_000).toFixed(1)} min; runbook: ${f.hint}`,
    );
    if (f.abort !== undefined) {
      lines.push(
        f.abort.ok
          ? `ABORTED ${f.topic}[${f.partition}] producer ${f.producerId} epoch ${f.producerEpoch}: last stable offset ${f.abort.lastStableBefore} -> ${f.abort.lastStableAfter} (high watermark ${f.abort.highWatermark})`
          : `ABORT FAILED ${f.topic}[${f.partition}] producer ${f.producerId} epoch ${f.producerEpoch}: ${f.abort.error ?? "unknown error"}`,
      );
    }
  }
  const aborted = report.findings.filter((f) => f.abort?.ok === true).length;
  if (report.findings.length === 0) lines.push("writ doctor: no hanging transactions");
  else lines.push(`writ doctor: ${report.findings.length} hanging transaction(s)${report.findings.some((f) => f.abort) ? `, ${aborted} aborted` : "; run with --abort to abort them"}`);
  lines.push(...formatAclCheck(report.acls));
  // Transactional ids and errors are whatever the brokers (and the producers that named them) say.
  return lines.map(printable).join("\n");
}

/** 0 when nothing hangs (or everything found was aborted and healed), 1 otherwise. The ACL check's warnings do not count. */
export function doctorExitCode(report: DoctorReport): 0 | 1 {
  return report.ok ? 0 : 1;
}
