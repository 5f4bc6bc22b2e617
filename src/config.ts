import { z } from "zod";
import { DEFAULT_REGISTRY_LOOKUPS_PER_S } from "./codec.ts";
import { WritError } from "./errors.ts";
import { printable } from "./printable.ts";
import { Audience } from "./schemas/common.ts";
import { RESOLUTION_FIELDS_BYTES, resolutionBounds } from "./schemas/resolution.ts";
import { MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS } from "./schemas/write-intent.ts";
import { LEDGER_MIN_COMPACTION_LAG_MS } from "./topics.ts";
import { defaultResponseBudgetBytes } from "./sor/response-budget.ts";
import { KafkaSecurity, checkRegistryFields, registryFields, securityInputFromEnv, securityVariableOf } from "./security/transport.ts";

const brokers = z
  .union([z.string(), z.array(z.string())], {
    error: (issue) => (issue.input === undefined ? "not set: give the brokers as host:port[,…]" : "host:port[,…]: a comma-separated string or an array of strings"),
  })
  .transform((v) => (Array.isArray(v) ? v : v.split(",")).map((b) => b.trim()).filter((b) => b.length > 0))
  .pipe(z.array(z.string().regex(/^[^\s:]+:\d{1,5}$/, "host:port")).min(1, "at least one broker"));

/**
 * The longest delay Node's timers take (2^31 - 1 ms, about 24.8 days): a longer one fires after 1 ms with a
 * TimeoutOverflowWarning, so a deadline past it would expire at once and an interval past it would spin.
 */
export const MAX_TIMER_MS = 2_147_483_647;

/** A duration that becomes a timer. ms. */
export const timerMs = (min: number) => z.number().int().min(min).max(MAX_TIMER_MS, `at most ${MAX_TIMER_MS} (Node's longest timer)`);

/** A Kafka topic name. */
export const topicName = z.string().regex(/^[a-zA-Z0-9._-]{1,249}$/, "a Kafka topic name");

/** The start of reply topics' names: a topic name with room for at least one more character. */
export const replyTopicPrefix = z.string().regex(/^[a-zA-Z0-9._-]{1,248}$/, "the start of a Kafka topic name (letters, digits, . _ -)");

/** Largest intent value owners accept, bytes: a client refuses a larger one before sending. */
export const maxIntentBytes = z.number().int().min(1024);

/** Largest record writ produces, bytes: writ's topics take a record batch at least this large (writ topics check). */
export const maxMessageBytes = z.number().int().min(16_384);

/** Deepest JSON nesting owners accept in an intent: a client refuses a deeper one before sending. */
export const maxJsonDepth = z.number().int().min(4).max(128);

/** Replication factor of a topic writ creates: a 16-bit count in Kafka's CreateTopics request. */
export const replicationFactor = z.number().int().min(1).max(32_767);

/** A Kafka client or group id: no control characters, which would garble the logs and brokers' requests that carry it. */
export const kafkaId = z.string().regex(/^[^\x00-\x1f\x7f-\x9f]+$/, "at least one character, no control characters");

/**
 * A number in an environment variable: decimal only. Number() also takes "   " (0), "0x50" (80) and "0b1";
 * anything else stays a string, which the schema refuses naming the variable.
 */
export function envNumber(raw: string): number | string {
  return /^-?\d+(\.\d+)?(e[+-]?\d+)?$/i.test(raw) ? Number(raw) : raw;
}

/** Topic names; these are the defaults of the topic contract in the README. */
export const TopicsConfig = z
  .object({
    intents: topicName.default("writ.intents"),
    ledger: topicName.default("writ.ledger"),
    human: topicName.default("writ.human"),
    dlq: topicName.default("writ.dlq"),
  })
  .strict();
export type TopicsConfig = z.infer<typeof TopicsConfig>;

/** The owner (router) process. Every default lives here and nowhere else. */
export const RouterConfig = z
  .object({
    brokers,
    /** SASL and TLS to the brokers (every client the owner builds: consumer, producers, admin, ledger reader, offset probe). */
    kafka: KafkaSecurity.optional(),
    clientId: kafkaId.default("writ-owner"),
    /**
     * Consumer group of the owners of `writ.intents`. Not with `.ledger-reader.` or `.ledger-scan.` in it (owners'
     * ledger readers): the check for other groups of owners (src/owner/single-writer.ts) takes such groups for what
     * their names say.
     */
    groupId: kafkaId
      .refine((g) => !/\.ledger-(reader|scan)\./.test(g), "must not contain .ledger-reader. or .ledger-scan. (owners' ledger reader groups)")
      .default("writ.owners"),
    topics: TopicsConfig.default(TopicsConfig.parse({})),
    /** Partitions of `writ.intents` and `writ.ledger` when writ creates them. Fixed for the topics' life. */
    intentPartitions: z.number().int().min(1).max(10_000).default(12),
    /** Replication factor when writ creates topics: 1 suits a single local broker; 3 (with min.insync.replicas 2) is the production default. */
    replicationFactor: replicationFactor.default(1),
    /** Reply topics must start with this; anything else is rejected. */
    replyTopicPrefix: replyTopicPrefix.default("writ.replies."),
    /** Confluent-API schema registry (unset means plain JSON values), its basic auth and TLS. */
    ...registryFields,
    /**
     * Ledger entries older than this are tombstoned. Hours. At least the ledger's min.compaction.lag.ms (1 h), the
     * time a partition may go without an owner and keep its in-doubt entries; at most ten years, so that the cutoff
     * `now - retention` stays a valid date (an Invalid Date would compare below every entry and expire them all).
     */
    ledgerRetentionHours: z.number().min(LEDGER_MIN_COMPACTION_LAG_MS / 3_600_000).max(87_600).default(24),
    /** How long a new owner may take to restore a ledger partition. ms. */
    restoreTimeoutMs: timerMs(1).default(120_000),
    /**
     * How often the consumed offset goes into an owner's transaction at most. ms. Like Kafka Streams'
     * commit.interval.ms under exactly-once (100): the offset lags, never leads; after a crash the
     * intents past it are read again and answered from the ledger.
     */
    offsetCommitIntervalMs: z.number().int().min(0).max(60_000).default(1000),
    /**
     * Group commit: how long a partition's next transaction may wait for intents still reading or writing,
     * so that it carries them too. ms. It never waits when nothing is at work.
     */
    commitLingerMs: z.number().int().min(0).max(1000).default(25),
    /**
     * How long `pending` entries alone keep a partition's open transaction open, waiting for the results that
     * follow them (usually their own intents', a PATCH later), before a commit takes them on their own. ms. Above
     * the system of record's usual PATCH time, an intent's `pending` entry and its result share one transaction;
     * an intent paused by an outage holds no transaction open longer, and read_committed readers of the ledger
     * (writ tail ledger, the hang watch) see its entry at most this late.
     */
    openPendingMaxMs: z.number().int().min(0).max(60_000).default(250),
    /** Intents of one partition being worked on at once (different records run concurrently; one record's run in offset order). */
    maxInFlightPerPartition: z.number().int().min(1).max(1024).default(16),
    /**
     * Intents of one partition and one system of record that wait out an outage (of that system, the registry)
     * without holding one of the `maxInFlightPerPartition` places, at most: other records of the partition run
     * meanwhile. Beyond it, an intent of that system that pauses keeps its place, and the system's intents not
     * started yet wait while its paused ones fill the bound; each system has a bound of its own, so a second
     * system's outage never takes the places a third needs. It also bounds the tries a down system gets from one partition.
     */
    maxPausedPerPartition: z.number().int().min(1).max(100_000).default(16),
    /** Fetched intents held per partition before its fetching pauses. */
    maxBufferedPerPartition: z.number().int().min(1).max(100_000).default(512),
    /** Largest intent value accepted, bytes; larger ones are dead-lettered `too_large`. */
    maxIntentBytes: maxIntentBytes.default(262_144),
    /** Deepest JSON nesting accepted in an intent; deeper ones are dead-lettered `too_deep`. */
    maxJsonDepth: maxJsonDepth.default(32),
    /** Largest record writ produces, bytes; keep it under the broker's `message.max.bytes` (default 1,048,588). */
    maxMessageBytes: maxMessageBytes.default(1_000_000),
    /**
     * Bytes of systems-of-record answers (their bodies, read and parsed) this process holds at once, over every
     * system and partition: maxResponseBytes bounds one answer, this their sum. Beyond it, answers wait (their bodies
     * not read, under their request's deadline; a wait past it is a request without an answer). The oldest answer
     * never waits, so the sum stays below this plus one answer. Default: a quarter of the heap limit, at most 256 MiB.
     */
    sorResponseBytesInFlight: z.number().int().min(1024 * 1024).max(64 * 1024 ** 3).default(() => defaultResponseBudgetBytes()),
    /** Deadline of one system-of-record request. ms. */
    sorTimeoutMs: timerMs(1).default(5_000),
    /** First pause after a system of record (or the registry) is unreachable. ms. */
    outageBackoffInitialMs: timerMs(1).default(200),
    /** Longest pause between tries while a system of record is unreachable. ms. */
    outageBackoffMaxMs: timerMs(1).default(10_000),
    /**
     * Longest wait a system of record's Retry-After (on a 429, 503 or other outage answer) imposes on the intent
     * that met it: its pause is the longer of the backoff and the Retry-After, this at most. ms. 0: Retry-After is
     * ignored. A cap, since the header is the other side's to set (an hour, a date next year).
     */
    sorRetryAfterMaxMs: z.number().int().min(0).max(3_600_000).default(60_000),
    /**
     * Schema registry lookups of schema ids this process has not seen, a second (as many saved up). Values framed
     * with an id already known take none; a flood of fresh ids (any producer can frame with any int32) reaches the
     * registry at this rate, and the records carrying them wait their turn.
     */
    registryLookupsPerSecond: z.number().int().min(1).max(10_000).default(DEFAULT_REGISTRY_LOOKUPS_PER_S),
    /**
     * Longest one agent may hold a record by leases at a stretch, from its grant (`acquiredAt`; a lease it takes again
     * within LEASE_COOLDOWN_MS of its last one ending continues that hold, unless its time to live would outrun it:
     * refused `lease_cooldown` then, the agent's next grant begins a new hold). ms. A renewal past it is refused
     * `lease_hold_exceeded` and the lease lapses at its expiry; then the record is kept from the agent for the cool-down
     * (`lease_cooldown`), so no agent holds a record longer than this and one time to live (at most 600 s) without
     * leaving it to others for 10 s. Generous: above the slowest change an agent should make, owner failovers
     * included. Below the longest time to live (600 s) one grant outlasts it: warned at start (configWarnings).
     */
    leaseMaxHoldMs: timerMs(MIN_LEASE_TTL_MS).default(900_000),
    /**
     * Leases one agent may hold at once (unexpired, unreleased) on the records of one intents partition; an acquire
     * past it is refused `lease_limit`. Per partition: a partition's leases are in its own ledger partition, which
     * whichever owner holds it restores and decides on alone (docs/architecture.md §10.3).
     */
    maxLeasesPerAgent: z.number().int().min(1).max(100_000).default(64),
    /** Rounds of PATCH → unknown → reconcile "not applied" → PATCH before escalating. */
    unknownRounds: z.number().int().min(1).max(20).default(3),
    /**
     * Failed transactions of a partition in a row (each reopens it from its committed state) after which the
     * partition is reported as not moving: a problem on `/healthz` and an error log, cleared by its next commit.
     */
    stuckAfterFailures: z.number().int().min(1).max(1000).default(5),
    /** Tries of an intent whose processing fails unexpectedly (a bug, a throwing reconcile function) before it is settled without a write. */
    maxProcessingAttempts: z.number().int().min(1).max(100).default(5),
    /** Consumer session timeout. ms. */
    sessionTimeoutMs: timerMs(6_000).default(30_000),
    /**
     * How long `writ owner` gives its clean stop (after SIGTERM or SIGINT: in-flight intents finish, producers close,
     * the group is left) before it exits with status 1 without one; what was in flight is then the next owner's to
     * reconcile, as after a crash. Keep it under the supervisor's own bound (Kubernetes' terminationGracePeriodSeconds,
     * Docker's stop grace period), so the owner says why it ends. ms. A program running startRouter bounds router.stop() itself.
     */
    stopTimeoutMs: timerMs(1).default(25_000),
    /**
     * Kafka transaction protocol of the owners' producers. `auto` speaks transactions v2 (KIP-890: Produce adds
     * its partitions, EndTxn bumps the epoch; two requests per transaction instead of three) when the cluster
     * has `transaction.version` 2 finalized, as Kafka 4.0+ does by default, and v1 (kafkajs's own) otherwise.
     */
    transactionProtocol: z.enum(["auto", "v1", "v2"]).default("auto"),
    /**
     * Under transactions v2, how long after its last transaction ended a partition's next one begins at the
     * earliest. ms. Sooner, the coordinator may still be writing the last one's markers, and the partition
     * leader then holds the first Produce for `add.partitions.to.txn.retry.backoff.ms` (20 ms by default).
     * 0: no spacing.
     */
    transactionSpacingMs: z.number().int().min(0).max(100).default(2),
    /** Transaction timeout. ms. */
    transactionTimeoutMs: timerMs(1_000).default(60_000),
    /** How often the owner checks the last stable offset of the partitions it writes. ms. */
    lsoCheckIntervalMs: timerMs(100).default(5_000),
    /** A partition this process writes whose last stable offset has not moved for this long, behind its high watermark, gets a healing transaction. ms. */
    hangHealAfterMs: timerMs(100).default(10_000),
    /** Port of the health endpoints (`/healthz`, `/readyz`) on 127.0.0.1 unless `healthHost` says otherwise; unset: no server. */
    healthPort: z.number().int().min(0).max(65_535).optional(),
    healthHost: z.string().min(1).default("127.0.0.1"),
    /**
     * How long a connection to the health endpoints may take to send its request's headers (from its opening or
     * its request's first byte) before it is closed: sockets that send nothing or dribble cannot hold the 64 slots
     * Prometheus and the probes need. ms. The whole request gets 30 s (or this, if longer), an idle keep-alive connection 5 s.
     */
    healthHeadersTimeoutMs: z.number().int().min(1).max(600_000).default(10_000),
    /**
     * Open connections to the health endpoints from one address at most (of 64): the endpoints need no token, so a
     * client making cheap requests on keep-alive connections could otherwise hold every slot Prometheus and the
     * probes need. 16 by default (a scraper and a kubelet use one or two each).
     */
    healthMaxConnectionsPerAddress: z.number().int().min(1).max(64).default(16),
    /** The agent registry file (JSON; see src/security/agent-registry.ts). Unset: no authentication (development only). */
    agentRegistryPath: z.string().min(1).optional(),
    /**
     * Refuse to start without an agent registry (`agentRegistryPath`, or `startRouter({ agents })`): without one,
     * signatures are not verified and any producer may write as any agent. False by default (the demo and
     * development run open, with a warning); true in production, so a registry left unset stops the owner.
     */
    requireAgentRegistry: z.boolean().default(false),
    /**
     * The audience this deployment's signed intents and resolutions must name (their `audience`, 1–128 of
     * A-Z a-z 0-9 . _ : / -): one without it, or with another, is refused `unauthenticated` as a bad signature is, so
     * bytes an agent signed for another deployment (staging, another region or tenant) that lists the same key cannot
     * be replayed here. Needs an agent registry (without one no signature is verified). Unset: any audience, or none.
     */
    signingAudience: Audience.optional(),
    /** Names this process in ledger markers, logs and the `x-writ-owner` header of its writes. */
    instanceId: z
      .string()
      .regex(/^[\x21-\x7e]{1,128}$/, "1 to 128 printable ASCII characters without spaces (it goes into an HTTP header)")
      .default(() => `owner-${process.pid}-${Math.random().toString(36).slice(2, 8)}`),
  })
  .strict()
  .superRefine((c, ctx) => {
    checkRegistryFields(c, ctx);
    if (c.maxInFlightPerPartition > c.maxBufferedPerPartition) {
      ctx.addIssue({ code: "custom", path: ["maxInFlightPerPartition"], message: "must not exceed maxBufferedPerPartition" });
    }
    if (c.openPendingMaxMs >= c.hangHealAfterMs) {
      ctx.addIssue({ code: "custom", path: ["openPendingMaxMs"], message: "must be below hangHealAfterMs (an open transaction holds the ledger partition's last stable offset, which the hang watch would take for a hang)" });
    }
    if (c.hangHealAfterMs >= c.transactionTimeoutMs) {
      ctx.addIssue({ code: "custom", path: ["hangHealAfterMs"], message: "must be below transactionTimeoutMs (a hang is reported once it outlives the transaction timeout)" });
    }
    if (c.outageBackoffInitialMs > c.outageBackoffMaxMs) {
      ctx.addIssue({ code: "custom", path: ["outageBackoffInitialMs"], message: "must not exceed outageBackoffMaxMs" });
    }
    // An intent is echoed in its escalation, and an operator's resolution carries it with a change as large: the
    // brokers (message.max.bytes, at least maxMessageBytes) must take every resolution owners admit.
    const resolution = resolutionBounds(c).maxBytes;
    if (resolution > c.maxMessageBytes) {
      const most = Math.floor((c.maxMessageBytes - RESOLUTION_FIELDS_BYTES) / 2);
      ctx.addIssue({
        code: "custom",
        path: ["maxIntentBytes"],
        message:
          `must leave room in maxMessageBytes (${c.maxMessageBytes}) for a resolution of such an intent, twice maxIntentBytes and ${RESOLUTION_FIELDS_BYTES} bytes ` +
          `(${resolution}): ${most >= 1024 ? `make it at most ${most}, or ` : ""}make maxMessageBytes at least ${resolution} (and the brokers' message.max.bytes)`,
      });
    }
    if (c.restoreTimeoutMs < c.sessionTimeoutMs) {
      ctx.addIssue({ code: "custom", path: ["restoreTimeoutMs"], message: "must be at least sessionTimeoutMs" });
    }
  });
export type RouterConfig = z.infer<typeof RouterConfig>;
export type RouterConfigInput = z.input<typeof RouterConfig>;

/** The agent-side client. */
export const ClientConfig = z
  .object({
    brokers,
    /** SASL and TLS to the brokers. */
    kafka: KafkaSecurity.optional(),
    agentId: z.string().min(1),
    /** This agent's reply topic; must start with `replyTopicPrefix`. */
    replyTopic: topicName,
    /**
     * The owners' `WRIT_REPLY_TOPIC_PREFIX`: owners answer only on topics that start with it and dead-letter every
     * other intent `reply_topic_not_allowed`, with no reply, so a client on another topic would only ever time out.
     */
    replyTopicPrefix: replyTopicPrefix.default("writ.replies."),
    intentsTopic: topicName.default("writ.intents"),
    clientId: kafkaId.optional(),
    ...registryFields,
    /** Partitions of the reply topic when the client creates it. */
    replyTopicPartitions: z.number().int().min(1).default(1),
    /** Replication factor of the reply topic when the client creates it: the owners' `WRIT_REPLICATION_FACTOR`. */
    replicationFactor: replicationFactor.default(1),
    /** Default deadline of `submit()`. ms. */
    submitTimeoutMs: timerMs(1).default(30_000),
    /**
     * Longest the reply consumer's fetch waits on a quiet reply topic. ms. A reply ends the wait at once, so this
     * never delays one; it bounds `close()`, which waits for the fetch in flight. Lower closes sooner (a CLI call,
     * a short-lived function) at more idle fetch requests to the brokers (one per this many ms).
     */
    replyFetchMaxWaitMs: z.number().int().min(10).max(10_000).default(1_000),
  })
  .strict()
  .superRefine((c, ctx) => {
    checkRegistryFields(c, ctx);
    if (!c.replyTopic.startsWith(c.replyTopicPrefix) || c.replyTopic.length === c.replyTopicPrefix.length) {
      ctx.addIssue({
        code: "custom",
        path: ["replyTopic"],
        message: `${c.replyTopic} does not start with the owners' reply prefix ${c.replyTopicPrefix} (replyTopicPrefix, their WRIT_REPLY_TOPIC_PREFIX): they would dead-letter every intent reply_topic_not_allowed, unanswered`,
      });
    }
  });
export type ClientConfig = z.infer<typeof ClientConfig>;
export type ClientConfigInput = z.input<typeof ClientConfig>;

/** Fields whose values a message never repeats: passwords, tokens, keys, credentials. */
const SECRET_FIELD = /pass|token|secret|key|auth|sasl|credential/i;

/** `, got "5s"` for a value a message may repeat (short, printable), else nothing. */
function got(issue: z.core.$ZodIssue): string {
  if (!("input" in issue) || issue.path.some((p) => SECRET_FIELD.test(String(p)))) return "";
  const input = issue.input;
  if (typeof input === "string") return `, got "${printable(input.length > 40 ? `${input.slice(0, 40)}…` : input)}"`;
  if (typeof input === "number" || typeof input === "boolean" || input === null) return `, got ${String(input)}`;
  return `, got ${Array.isArray(input) ? "an array" : typeof input}`;
}

/** What a numeric field takes, by its name's unit: `sorTimeoutMs` → "a whole number of milliseconds". */
function numberWanted(path: readonly PropertyKey[]): string {
  const field = String(path.at(-1) ?? "");
  if (/Hours$/.test(field)) return "a number of hours";
  if (/Ms$/.test(field)) return "a whole number of milliseconds";
  if (/Bytes$/.test(field)) return "a whole number of bytes";
  if (/Port$/.test(field)) return "a port number (a whole number)";
  return "a whole number";
}

/**
 * A zod issue as a person fixing a setting reads it: what the field takes and, where that is safe, the value it
 * got (`a whole number of milliseconds, got "5s"`; never a secret's). Messages the schemas word themselves stand.
 */
export function readableIssue(issue: z.core.$ZodIssue): string {
  // Only zod's own wording is replaced; a schema's message ("host:port", "a Kafka topic name") says it already.
  if (!/^(Invalid input|Invalid option|Too small|Too big)/.test(issue.message)) return issue.message;
  const set = "input" in issue && issue.input !== undefined;
  switch (issue.code) {
    case "invalid_type":
      if (!set) return "not set";
      if (issue.expected === "number" || issue.expected === "int") return `${numberWanted(issue.path)}${got(issue)}`;
      if (issue.expected === "boolean") return `true or false${got(issue)}`;
      if (issue.expected === "string") return `text${got(issue)}`;
      return issue.message;
    case "invalid_union":
      return !set ? "not set" : issue.message;
    case "invalid_value":
      return `one of ${issue.values.map((v) => String(v)).join(", ")}${got(issue)}`;
    case "too_small":
      if (issue.origin === "number" || issue.origin === "int") return `${issue.inclusive ? "at least" : "more than"} ${String(issue.minimum)}${got(issue)}`;
      return issue.message;
    case "too_big":
      if (issue.origin === "number" || issue.origin === "int") return `${issue.inclusive ? "at most" : "less than"} ${String(issue.maximum)}${got(issue)}`;
      return issue.message;
    default:
      return issue.message;
  }
}

/** Parses config with `schema`, throwing one error that names every bad field. */
export function parseConfig<S extends z.ZodType>(
  schema: S,
  input: unknown,
  what: string,
  fieldName: (path: PropertyKey[]) => string = (p) => p.map(String).join("."),
): z.infer<S> {
  const result = schema.safeParse(input, { reportInput: true });
  if (result.success) return result.data;
  const problems = result.error.issues.map((i) => `${fieldName(i.path) || "(root)"}: ${readableIssue(i)}`);
  throw new WritError("config_invalid", `invalid ${what} configuration: ${problems.join("; ")}`, {
    retriable: false,
    context: { field: fieldName(result.error.issues[0]?.path ?? []) },
  });
}

/** Environment variables of the owner process, by config field. */
export const ROUTER_ENV = {
  brokers: "KAFKA_BROKERS",
  schemaRegistryUrl: "SCHEMA_REGISTRY_URL",
  groupId: "WRIT_GROUP_ID",
  clientId: "WRIT_CLIENT_ID",
  "topics.intents": "WRIT_INTENTS_TOPIC",
  "topics.ledger": "WRIT_LEDGER_TOPIC",
  "topics.human": "WRIT_HUMAN_TOPIC",
  "topics.dlq": "WRIT_DLQ_TOPIC",
  intentPartitions: "WRIT_INTENT_PARTITIONS",
  replicationFactor: "WRIT_REPLICATION_FACTOR",
  replyTopicPrefix: "WRIT_REPLY_TOPIC_PREFIX",
  ledgerRetentionHours: "WRIT_LEDGER_RETENTION_HOURS",
  restoreTimeoutMs: "WRIT_RESTORE_TIMEOUT_MS",
  offsetCommitIntervalMs: "WRIT_OFFSET_COMMIT_INTERVAL_MS",
  commitLingerMs: "WRIT_COMMIT_LINGER_MS",
  openPendingMaxMs: "WRIT_OPEN_PENDING_MAX_MS",
  maxInFlightPerPartition: "WRIT_MAX_IN_FLIGHT_PER_PARTITION",
  maxPausedPerPartition: "WRIT_MAX_PAUSED_PER_PARTITION",
  maxBufferedPerPartition: "WRIT_MAX_BUFFERED_PER_PARTITION",
  maxIntentBytes: "WRIT_MAX_INTENT_BYTES",
  maxJsonDepth: "WRIT_MAX_JSON_DEPTH",
  maxMessageBytes: "WRIT_MAX_MESSAGE_BYTES",
  sorTimeoutMs: "WRIT_SOR_TIMEOUT_MS",
  sorResponseBytesInFlight: "WRIT_SOR_RESPONSE_BYTES_IN_FLIGHT",
  outageBackoffInitialMs: "WRIT_OUTAGE_BACKOFF_INITIAL_MS",
  outageBackoffMaxMs: "WRIT_OUTAGE_BACKOFF_MAX_MS",
  sorRetryAfterMaxMs: "WRIT_SOR_RETRY_AFTER_MAX_MS",
  registryLookupsPerSecond: "WRIT_REGISTRY_LOOKUPS_PER_S",
  leaseMaxHoldMs: "WRIT_LEASE_MAX_HOLD_MS",
  maxLeasesPerAgent: "WRIT_MAX_LEASES_PER_AGENT",
  unknownRounds: "WRIT_UNKNOWN_ROUNDS",
  maxProcessingAttempts: "WRIT_MAX_PROCESSING_ATTEMPTS",
  stuckAfterFailures: "WRIT_STUCK_AFTER_FAILURES",
  sessionTimeoutMs: "WRIT_SESSION_TIMEOUT_MS",
  stopTimeoutMs: "WRIT_STOP_TIMEOUT_MS",
  transactionProtocol: "WRIT_TRANSACTION_PROTOCOL",
  transactionSpacingMs: "WRIT_TRANSACTION_SPACING_MS",
  transactionTimeoutMs: "WRIT_TRANSACTION_TIMEOUT_MS",
  lsoCheckIntervalMs: "WRIT_LSO_CHECK_INTERVAL_MS",
  hangHealAfterMs: "WRIT_HANG_HEAL_AFTER_MS",
  healthPort: "WRIT_HEALTH_PORT",
  healthHost: "WRIT_HEALTH_HOST",
  healthHeadersTimeoutMs: "WRIT_HEALTH_HEADERS_TIMEOUT_MS",
  healthMaxConnectionsPerAddress: "WRIT_HEALTH_MAX_CONNECTIONS_PER_ADDRESS",
  agentRegistryPath: "WRIT_AGENT_REGISTRY",
  requireAgentRegistry: "WRIT_REQUIRE_AGENT_REGISTRY",
  signingAudience: "WRIT_SIGNING_AUDIENCE",
  instanceId: "WRIT_INSTANCE_ID",
} as const;

const NUMERIC = new Set([
  "intentPartitions",
  "replicationFactor",
  "ledgerRetentionHours",
  "restoreTimeoutMs",
  "offsetCommitIntervalMs",
  "commitLingerMs",
  "openPendingMaxMs",
  "maxInFlightPerPartition",
  "maxPausedPerPartition",
  "maxBufferedPerPartition",
  "maxIntentBytes",
  "maxJsonDepth",
  "maxMessageBytes",
  "sorTimeoutMs",
  "sorResponseBytesInFlight",
  "outageBackoffInitialMs",
  "outageBackoffMaxMs",
  "sorRetryAfterMaxMs",
  "registryLookupsPerSecond",
  "leaseMaxHoldMs",
  "maxLeasesPerAgent",
  "unknownRounds",
  "maxProcessingAttempts",
  "stuckAfterFailures",
  "sessionTimeoutMs",
  "stopTimeoutMs",
  "transactionSpacingMs",
  "transactionTimeoutMs",
  "lsoCheckIntervalMs",
  "hangHealAfterMs",
  "healthPort",
  "healthHeadersTimeoutMs",
  "healthMaxConnectionsPerAddress",
]);

/** Router config from environment variables; errors name the variable. */
export function routerConfigFromEnv(env: NodeJS.ProcessEnv = process.env): RouterConfig {
  const input: Record<string, unknown> = { topics: {} };
  for (const [field, name] of Object.entries(ROUTER_ENV)) {
    const raw = env[name];
    if (raw === undefined || raw === "") continue;
    const value = NUMERIC.has(field) ? envNumber(raw) : BOOLEAN.has(field) ? envBoolean(raw) : raw;
    if (field.startsWith("topics.")) (input.topics as Record<string, unknown>)[field.slice(7)] = value;
    else input[field] = value;
  }
  // KAFKA_SSL*, KAFKA_SASL_*, SCHEMA_REGISTRY_USERNAME/PASSWORD/CA_FILE (src/security/transport.ts)
  Object.assign(input, securityInputFromEnv(env));
  const byField = new Map<string, string>(Object.entries(ROUTER_ENV));
  const config = parseConfig(RouterConfig, input, "router", (path) => {
    const dotted = path.map(String).join(".");
    const key = [...byField.keys()].find((f) => dotted === f || dotted.startsWith(`${f}.`));
    const variable = key ? byField.get(key) : securityVariableOf(dotted);
    return variable ? `${variable} (${dotted})` : dotted;
  });
  checkAgentRegistryRequired(config, config.agentRegistryPath !== undefined);
  return config;
}

/**
 * Throws `config_invalid` naming WRIT_AGENT_REGISTRY when the config requires an agent registry
 * (WRIT_REQUIRE_AGENT_REGISTRY) and the owner has none (`hasRegistry`): it would verify no signature; and naming
 * WRIT_SIGNING_AUDIENCE and WRIT_AGENT_REGISTRY when an audience is set without one, since no signature would bind it.
 */
export function checkAgentRegistryRequired(config: Pick<RouterConfig, "requireAgentRegistry" | "signingAudience">, hasRegistry: boolean): void {
  if (hasRegistry) return;
  if (config.signingAudience !== undefined) {
    throw new WritError(
      "config_invalid",
      "invalid router configuration: WRIT_SIGNING_AUDIENCE (signingAudience) needs an agent registry, WRIT_AGENT_REGISTRY (agentRegistryPath): without one owners verify no signature, and an audience nobody signed protects nothing",
      { retriable: false, context: { field: "WRIT_SIGNING_AUDIENCE" } },
    );
  }
  if (!config.requireAgentRegistry) return;
  throw new WritError(
    "config_invalid",
    "invalid router configuration: WRIT_AGENT_REGISTRY (agentRegistryPath): required, since WRIT_REQUIRE_AGENT_REGISTRY (requireAgentRegistry) is true; without an agent registry owners verify no signature and any producer may write as any agent",
    { retriable: false, context: { field: "WRIT_AGENT_REGISTRY" } },
  );
}

/**
 * What in a valid router config is likely a mistake, one line each naming the fields, logged at start (not refused:
 * tests and demos bound holds to seconds). A longest hold below the longest lease time to live an agent may ask
 * (`lease.ttlMs` of an acquire: a client's leaseTtlMs or lease_ttl, up to 600 s) does not bound a lease to it: one
 * grant lasts its whole time to live.
 */
export function configWarnings(config: Pick<RouterConfig, "leaseMaxHoldMs">): string[] {
  const out: string[] = [];
  if (config.leaseMaxHoldMs < MAX_LEASE_TTL_MS) {
    out.push(
      `WRIT_LEASE_MAX_HOLD_MS (leaseMaxHoldMs, ${config.leaseMaxHoldMs} ms) is below the longest lease time to live an agent may ask (an acquire's lease.ttlMs, up to ${MAX_LEASE_TTL_MS} ms): one grant holds a record for its whole time to live, past the longest hold, and a change renewing past half of it may be refused its first renewal (lease_hold_exceeded). Keep it at or above ${MAX_LEASE_TTL_MS} ms, or your changes' leaseTtlMs well below it`,
    );
  }
  return out;
}

/** `true`/`1`/`yes`, `false`/`0`/`no` (any case); anything else is left for the schema to refuse, naming the variable. */
function envBoolean(raw: string): boolean | string {
  if (/^(true|1|yes)$/i.test(raw)) return true;
  if (/^(false|0|no)$/i.test(raw)) return false;
  return raw;
}

const BOOLEAN = new Set(["requireAgentRegistry"]);
