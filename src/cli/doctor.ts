// `writ doctor`: finds hanging Kafka transactions on writ's topics and, with
// --abort, aborts them. Usage: `writ doctor --help`. stdout: one line per
// finding and a summary (or, with --json, one JSON line); errors on stderr.
// Exit 0 = nothing hangs (or everything found was aborted and its partition's
// last stable offset moved), 1 = something hangs, 2 = bad usage or could not run. It also says who may write
// writ's trusted topics (src/doctor/acls.ts): a warning, with a reason code, that leaves the exit status alone.
import { logLevel } from "kafkajs";
import { topicName } from "../config.ts";
import { CONTRACT_TOPICS, DEFAULT_OLDER_THAN_MS, DEFAULT_REPLY_PREFIX, doctorExitCode, formatDoctorReport, runDoctor } from "../doctor/doctor.ts";
import { WritError } from "../errors.ts";
import { kafkaLogCreator } from "../kafka-log.ts";
import { createLogger, logLevelFromEnv } from "../logger.ts";
import { jsonLine } from "../printable.ts";
import { connectionSecurityFromEnv, kafkaConnection } from "../security/transport.ts";
import { DEFAULT_OWNER_PRINCIPAL } from "../doctor/acls.ts";
import { contractTopicsFromEnv, ownerPrincipalsFrom, parseOrExit, replyPrefixFromEnv, type Command } from "./common.ts";

const USAGE = `usage: writ doctor [options]

Finds hanging transactions on writ's topics: a partition whose last stable offset (LSO) is stuck behind
an open transaction that no transaction coordinator will ever finish (e.g. its markers were skipped while
the partition had no leader), so read_committed consumers of that partition stop. The rule is that of
kafka-transactions.sh find-hanging.

It also checks who may write writ's trusted topics (the ledger, writ.human, writ.dlq and the reply topics),
from the cluster's ACLs (DescribeAcls): a warning when the cluster has no authorizer (any client can forge
ledger entries, escalations and replies) or when a principal other than the owners may write one of them.

  --brokers <list>       Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --topics <a,b>         check exactly these topics (default: ${CONTRACT_TOPICS.join(", ")}, or their
                         $WRIT_*_TOPIC names, that exist, and every topic starting with the reply prefix)
  --prefix <prefix>      reply topic prefix (default $WRIT_REPLY_TOPIC_PREFIX or ${DEFAULT_REPLY_PREFIX})
  --older-than-ms <n>    only transactions whose last write is older than this (default ${DEFAULT_OLDER_THAN_MS});
                         keep it above the producers' transaction timeout
  --max-transaction-timeout-ms <n>
                         an open transaction whose producer no coordinator lists (ListTransactions leaves out the
                         transactional ids this principal may not Describe) counts only once its last write is
                         older than this (default: the brokers' transaction.max.timeout.ms, else 900000)
  --owner-principal <p>  the owners' Kafka principal(s), User:<name> or a bare SASL user name (repeatable or
                         comma-separated; default $WRIT_OWNER_PRINCIPALS or ${DEFAULT_OWNER_PRINCIPAL}); any other
                         principal allowed to write a trusted topic is a warning
  --abort                abort each hanging transaction (WriteTxnMarkers, as kafka-transactions.sh abort),
                         then check that the partition's LSO moved past it
  --json                 print one JSON report instead of text
  -h, --help             this text

The JSON report's "acls" carries the ACL check: "status" (ok, warning, unknown) and "reason" (owners_only,
foreign_writers, no_authorizer, acls_not_visible, acl_check_failed), the writers of each topic.

Exit status: 0 nothing hangs (or all were aborted), 1 something hangs, 2 bad usage or Kafka unreachable.
The ACL check's warnings do not change it: read "acls.reason" from --json.`;

const OPTIONS = {
  brokers: { type: "string" },
  topics: { type: "string", multiple: true },
  prefix: { type: "string" },
  "owner-principal": { type: "string", multiple: true },
  "older-than-ms": { type: "string" },
  "max-transaction-timeout-ms": { type: "string" },
  abort: { type: "boolean", default: false },
  json: { type: "boolean", default: false },
} as const;

const splitList = (values: readonly string[] | string | undefined): string[] =>
  (Array.isArray(values) ? values : values === undefined ? [] : [values])
    .flatMap((v: string) => v.split(","))
    .map((v) => v.trim())
    .filter((v) => v !== "");

async function main(argv: string[]): Promise<number> {
  const fail = (message: string): number => {
    process.stderr.write(`writ doctor: ${message}\n`);
    return 2;
  };
  const parsed = parseOrExit("doctor", argv, OPTIONS, USAGE);
  if (typeof parsed === "number") return parsed;
  const args = parsed.values;

  const brokers = splitList(args.brokers ?? process.env.KAFKA_BROKERS);
  if (brokers.length === 0) return fail("no Kafka: give --brokers host:port (or set KAFKA_BROKERS)");
  const badBroker = brokers.find((b) => !/^[^\s:]+:\d{1,5}$/.test(b));
  if (badBroker !== undefined) return fail(`--brokers: ${badBroker} is not host:port`);

  const topics = splitList(args.topics);
  const badTopic = topics.find((t) => !topicName.safeParse(t).success);
  if (badTopic !== undefined) return fail(`--topics: ${badTopic} is not a Kafka topic name`);

  let prefix: string;
  let topicNames: { intents: string; ledger: string; human: string; dlq: string };
  let owners: string[];
  let level: string;
  try {
    level = logLevelFromEnv("silent");
    prefix = args.prefix ?? replyPrefixFromEnv();
    topicNames = contractTopicsFromEnv();
    owners = ownerPrincipalsFrom(args["owner-principal"]);
  } catch (err) {
    return fail((err as Error).message);
  }
  if (prefix === "") return fail("--prefix must not be empty");

  const olderThanRaw = args["older-than-ms"];
  const olderThanMs = olderThanRaw === undefined ? DEFAULT_OLDER_THAN_MS : Number(olderThanRaw);
  if (!/^\d+$/.test(olderThanRaw ?? "0") || !Number.isSafeInteger(olderThanMs)) return fail(`--older-than-ms must be a non-negative integer (ms), got ${olderThanRaw}`);
  const maxTimeoutRaw = args["max-transaction-timeout-ms"];
  const maxTransactionTimeoutMs = maxTimeoutRaw === undefined ? undefined : Number(maxTimeoutRaw);
  if (maxTimeoutRaw !== undefined && (!/^\d+$/.test(maxTimeoutRaw) || !Number.isSafeInteger(maxTransactionTimeoutMs))) {
    return fail(`--max-transaction-timeout-ms must be a non-negative integer (ms), got ${maxTimeoutRaw}`);
  }

  // The error that stops a run is reported on its own; kafkajs's logs (each failed connection attempt, …) go to
  // stderr as pino JSON lines only when $LOG_LEVEL asks for them.
  const logger = createLogger({ name: "writ-doctor", level });
  process.env.KAFKAJS_NO_PARTITIONER_WARNING ??= "1";

  try {
    // SASL and TLS from KAFKA_SSL*, KAFKA_SASL_* (a bad value is reported below, naming the variable)
    const connection = kafkaConnection(connectionSecurityFromEnv(process.env).kafka);
    const report = await runDoctor({
      brokers,
      ...connection,
      ...(topics.length > 0 ? { topics } : {}),
      contractTopics: [topicNames.intents, topicNames.ledger, topicNames.human, topicNames.dlq],
      topicNames,
      ownerPrincipals: owners,
      replyPrefix: prefix,
      olderThanMs,
      ...(maxTransactionTimeoutMs === undefined ? {} : { maxTransactionTimeoutMs }),
      abort: args.abort,
      logCreator: kafkaLogCreator(logger),
      logLevel: process.env.LOG_LEVEL ? logLevel.WARN : logLevel.NOTHING,
    });
    process.stdout.write(args.json ? `${jsonLine(report)}\n` : `${formatDoctorReport(report)}\n`);
    return doctorExitCode(report);
  } catch (err) {
    process.stderr.write(
      err instanceof WritError ? `writ doctor: ${err.message}\n` : `writ doctor: ${err instanceof Error ? (err.stack ?? err.message) : String(err)}\n`,
    );
    return 2;
  }
}

export const doctorCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main,
};
