import { randomUUID } from "node:crypto";
import { Kafka, Partitioners, logLevel, type Consumer, type KafkaMessage, type Producer } from "kafkajs";
import { canonicalJson, jsonDepth } from "../src/canonical-json.ts";
import { RECORD_MAX_DEPTH, WireCodec } from "../src/codec.ts";
import { ClientConfig, MAX_TIMER_MS, parseConfig, type ClientConfigInput } from "../src/config.ts";
import { registerCompressionCodecs } from "../src/kafka/compression.ts";
import { REPLY_COMMIT_INTERVAL_MS, startIntervalCommit, type IntervalCommit } from "../src/kafka/interval-commit.ts";
import { type ConsumerStop, keepStopped } from "../src/kafka/keep-stopped.ts";
import { kafkaLogging, type KafkaLogTap } from "../src/kafka-log.ts";
import { intentKey } from "../src/keys.ts";
import { componentLogger, createLogger, type Logger } from "../src/logger.ts";
import { createOffsetProbe } from "../src/owner/offset-probe.ts";
import type { EndOffsets, OffsetProbe } from "../src/owner/hang-watch.ts";
import { Audience, entityKey, type EntityRef, type JsonPatchOp } from "../src/schemas/common.ts";
import { printable } from "../src/printable.ts";
import { isControlRecord } from "../src/schemas/control.ts";
import { partitionFor } from "../src/kafka/partition.ts";
import { prepareSigner, SIGNATURE_HEADER, signIntent, type IntentSigner } from "../src/security/signing.ts";
import { kafkaConnection, transportWarnings } from "../src/security/transport.ts";
import type { Reply } from "../src/schemas/reply.ts";
import type { WriteIntent } from "../src/schemas/write-intent.ts";
import { WritError } from "../src/errors.ts";
import { withDeadline } from "../src/deadline.ts";
import { WIRE_SCHEMAS } from "../src/schemas/index.ts";
import { retry, START_PATIENCE } from "../src/retry.ts";
import type { Escalation } from "../src/schemas/escalation.ts";
import { deltaOutOfBounds, KIND_HEADER, resolutionBounds, resolutionSubject, type IntentBounds, type Resolution } from "../src/schemas/resolution.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { TopicEnsurer } from "../src/topics.ts";
import { startSubmitSpan } from "../src/tracing/spans.ts";
import { SendCoalescer, type SendOutcome } from "./send-coalescer.ts";
import { backoffUntil, runChange, type ChangeInput, type ChangeResult } from "./change.ts";
import {
  buildUndoIntent,
  MAX_UNREAD_REPLIES,
  type BlockedOutcome,
  type IntentInput,
  type NoReplyReason,
  type SubmitOptions,
  type SubmitResult,
  type UndoTarget,
  type UnknownOutcome,
  type WritClient,
} from "./client-api.ts";

export * from "./client-api.ts";

/** The start of what a caller is told when no answer can be read any more. */
const noReplyBecause = (reason: NoReplyReason): string => (reason === "client_closed" ? "This client was closed" : "This client's reply consumer stopped");

/**
 * What owners answer before they have authenticated the record (src/owner/admission.ts: a failed decode,
 * the key checks, no canonical form, a failed signature check). The record need not be this client's: any
 * producer that can read writ.intents can send one naming this agent and an intent id in flight, and the
 * owner answers it on this agent's reply topic. So such a rejection does not settle a submit at once: the
 * submit waits on for another answer to its intent id until its deadline, and returns this one only then.
 */
export const PROVISIONAL_REASONS: ReadonlySet<string> = new Set([
  "undecodable",
  "schema_invalid",
  "schema_subject_mismatch",
  "too_deep",
  "key_missing",
  "key_mismatch",
  "not_canonical",
  "unauthenticated",
]);

/**
 * An `unauthenticated` refusal for the audience (`details.problem` `audience_missing` or `audience_mismatch`) is given
 * only once the signature verified (src/owner/admission.ts): the record is bytes this agent signed, with this intent id,
 * so it is this client's own submission, and the answer is final. Held to the deadline, it made every submit of a client
 * whose audience is not the owners' wait its whole deadline for an answer that never changes.
 */
const AUDIENCE_PROBLEMS: ReadonlySet<unknown> = new Set(["audience_missing", "audience_mismatch"]);
const audienceRefusal = (reply: Extract<Reply, { status: "rejected" }>): boolean =>
  reply.reason === "unauthenticated" && typeof reply.details === "object" && reply.details !== null && AUDIENCE_PROBLEMS.has((reply.details as { problem?: unknown }).problem);

const isProvisional = (reply: Reply): reply is Extract<Reply, { status: "rejected" }> => reply.status === "rejected" && PROVISIONAL_REASONS.has(reply.reason) && !audienceRefusal(reply);

/** A held provisional rejection, returned at the deadline because nothing else answered: its message says it may not answer this client's record. */
const heldAtDeadline = (provisional: Extract<Reply, { status: "rejected" }>, what: "intent" | "resolution"): Extract<Reply, { status: "rejected" }> => ({
  ...provisional,
  message:
    `${provisional.message} (answered before the owner had authenticated the record, and nothing else answered this ${what} id before the deadline: ` +
    `it may answer a record that was not this client's, sent by another producer naming this ${what} id)`,
});

/** Most bytes of intents one coalesced produce request carries: well under the brokers' default 1 MB per partition batch. */
const MAX_REQUEST_BYTES = 512 * 1024;


/** The owners' default `maxIntentBytes` (src/config.ts): an encoded intent value larger than this is dead-lettered `too_large`. */
export const DEFAULT_MAX_INTENT_BYTES = 262_144;
/** The owners' default `maxJsonDepth` (src/config.ts): an intent nested deeper than this is dead-lettered `too_deep`. */
export const DEFAULT_MAX_JSON_DEPTH = 32;

/** The owners' admission bounds given in `settings`, their defaults for the others. */
export function ownersIntentBounds(settings: { maxIntentBytes?: number | undefined; maxJsonDepth?: number | undefined } = {}): IntentBounds {
  return { maxIntentBytes: settings.maxIntentBytes ?? DEFAULT_MAX_INTENT_BYTES, maxJsonDepth: settings.maxJsonDepth ?? DEFAULT_MAX_JSON_DEPTH };
}

/** The owners' admission bounds, as the client checks them before sending: what owners dead-letter gets no reply. */
type AdmissionLimits = IntentBounds;


/**
 * The agent side of writ.
 *
 * @example
 * const writ = await createWritClient({ brokers: ["127.0.0.1:9092"], agentId: "billing-agent",
 *   replyTopic: "writ.replies.billing-agent" });
 * const reply = await writ.submit({ tool: refund, entity: { type: "payment", id: "pay_1" }, runId, stepId: "s1",
 *   baseVersion: '"v3"', delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 500 } }],
 *   params: { amountCents: 500 } }, { timeoutMs: 10_000 });
 */
export async function createWritClient(
  input: ClientConfigInput & {
    logger?: Logger;
    offsetProbe?: OffsetProbe;
    /** Signs every intent (Ed25519, `writ-signature` header): required where owners run with an agent registry. */
    signer?: IntentSigner;
    /**
     * The deployment this client signs for: its owners' `WRIT_SIGNING_AUDIENCE` (1–128 of A-Z a-z 0-9 . _ : / -). Put
     * in every intent and resolution it signs (lease and undo intents too), so owners of another deployment that lists
     * the same key refuse them. Needs `signer`: an audience nobody signs protects nothing.
     */
    audience?: string;
    /**
     * The owners' `maxIntentBytes` (default 262 144): a larger encoded intent is refused here, `too_large`,
     * since owners dead-letter it without a reply. Set it to the owners' value when they run with another.
     */
    maxIntentBytes?: number;
    /** The owners' `maxJsonDepth` (default 32): a deeper intent is refused here, `too_deep`, for the same reason. */
    maxJsonDepth?: number;
    /**
     * Called once if the reply consumer stops for good (a crash kafkajs does not restart from): every submit
     * fails from then on, so a long-lived process should create a new client, or exit for its supervisor.
     */
    onStopped?: (err: WritError) => void;
    /** Every kafkajs log entry of the client, of any level (`writ verify` records connection errors from it). */
    kafkaLogTap?: KafkaLogTap;
  },
): Promise<WritClient> {
  // kafkajs's harmless negative timer would print a TimeoutNegativeWarning in every program that uses a client.
  hideKafkajsTimeoutWarning();
  const { logger, offsetProbe, signer: rawSigner, audience: rawAudience, maxIntentBytes = DEFAULT_MAX_INTENT_BYTES, maxJsonDepth = DEFAULT_MAX_JSON_DEPTH, onStopped, kafkaLogTap, ...raw } = input;
  const config = parseConfig(ClientConfig, raw, "client");
  const limits: AdmissionLimits = { maxIntentBytes: positiveInteger("maxIntentBytes", maxIntentBytes), maxJsonDepth: positiveInteger("maxJsonDepth", maxJsonDepth) };
  // Checked and parsed once, here: a bad key fails the client's start, and no submit parses PEM again.
  const signer = rawSigner ? prepareSigner(rawSigner) : undefined;
  const audience = signingAudienceOf(rawAudience, rawSigner !== undefined);
  const log = componentLogger(logger ?? createLogger(), "writ-client", { agent: config.agentId });
  registerCompressionCodecs();
  const kafka = new Kafka({
    clientId: config.clientId ?? `writ-client-${config.agentId}`,
    brokers: config.brokers,
    ...kafkaConnection(config.kafka),
    ...kafkaLogging(log, logLevel.WARN, kafkaLogTap),
  });
  for (const warning of transportWarnings(config.kafka, config)) log.warn(warning);
  const admin = kafka.admin();
  await admin.connect();
  let replyPartitions: number;
  let ends: { partition: number; high: string }[];
  const groupId = `writ.client.${config.agentId}.${randomUUID()}`;
  try {
    // The agent provisions its own reply topic; owners never create one because an intent names it.
    const ensurer = new TopicEnsurer(admin, { numPartitions: config.replyTopicPartitions, replicationFactor: config.replicationFactor });
    // The reply consumer starts at the topic's current (read_committed) end, committed for its group before it
    // joins: a consumer that kafkajs restarts after a crash resumes there instead of at the end of the moment,
    // which would skip the replies written in between. One entry per partition: also the partition count.
    // Patient (START_PATIENCE), like the offset commit below: kafkajs's admin does not retry ListOffsets.
    ends = await retry(async () => {
      await ensurer.ensure([config.replyTopic]);
      return admin.fetchTopicOffsets(config.replyTopic);
    }, START_PATIENCE);
    replyPartitions = Math.max(1, ends.length);
  } finally {
    await admin.disconnect();
  }
  const probe = offsetProbe ?? createOffsetProbe({ brokers: config.brokers, clientId: `${config.clientId ?? "writ-client"}-probe`, log, security: config.kafka });
  const start = ends.map((e) => ({ partition: e.partition, offset: e.high }));
  if (probe.commitGroupOffsets) await probe.commitGroupOffsets(groupId, config.replyTopic, start);
  else {
    const setter = kafka.admin();
    await setter.connect();
    await setter.setOffsets({ groupId, topic: config.replyTopic, partitions: start }).finally(() => setter.disconnect());
  }
  const client = new KafkaWritClient(config, kafka, log, probe, replyPartitions, groupId, limits, signer, onStopped, audience);
  // A start that fails (a reply consumer that stops before it joins its group) leaves no connection behind.
  await client.start().catch(async (err: unknown) => {
    await client.close();
    throw err;
  });
  return client;
}

/**
 * A client's `audience` checked (config_invalid, field `audience`): one of {@link Audience}, and only with a signer,
 * since owners check it only on signed records. Shared by every writ component that signs (the CLI, the console).
 */
export function signingAudienceOf(audience: unknown, hasSigner: boolean): string | undefined {
  if (audience === undefined) return undefined;
  const checked = Audience.safeParse(audience);
  if (!checked.success) {
    const got = typeof audience === "string" ? `, got ${JSON.stringify(printable(audience.slice(0, 64)))}${audience.length > 64 ? "…" : ""}` : `, got ${typeof audience}`;
    throw new WritError("config_invalid", `audience must be 1–128 of A-Z a-z 0-9 . _ : / -${got}`, { retriable: false, context: { field: "audience" } });
  }
  if (!hasSigner) {
    throw new WritError("config_invalid", "audience needs a signer (signer, or --signing-key and --key-id): owners check the audience of signed records only, so an unsigned one protects nothing", {
      retriable: false,
      context: { field: "audience" },
    });
  }
  return checked.data;
}

/** `work`'s result, or a retriable `not_sent` when `deadline` passes first (what it prepares was never sent). */
function notSentPast<T>(deadline: number, work: Promise<T>): Promise<T> {
  return withDeadline(work, deadline - Date.now(), () => {
    throw new WritError("not_sent", "the deadline passed while the intent was being encoded; nothing was sent: submit again", { retriable: true });
  });
}

/**
 * Refuses, non-retriably (`changed_by_validation`), a value that validating it with its wire schema would
 * change. The codec sends the schema's output, which leaves out fields the schema does not know (zod
 * objects strip them; a record drops an own `__proto__` key), while the signature and the intent key are
 * computed over the value given: owners would answer `unauthenticated` or `intent_key_mismatch`. A value
 * the schema refuses is left to the codec, which refuses it `codec_failed`.
 */
function unchangedByValidation(name: "WriteIntent" | "Resolution", value: WriteIntent | Resolution, intentKey: string): void {
  const checked = WIRE_SCHEMAS[name].safeParse(value);
  if (!checked.success || canonicalJson(checked.data) === canonicalJson(value)) return;
  throw new WritError(
    "changed_by_validation",
    `the ${name} has fields its wire schema does not keep (unknown fields, or an own "__proto__" key); what is sent would not be what is signed and keyed: remove them`,
    { retriable: false, context: { intentKey } },
  );
}

function positiveInteger(field: string, value: number): number {
  if (!Number.isSafeInteger(value) || value < 1) throw new WritError("config_invalid", `${field} must be a positive integer (it is ${value})`, { retriable: false, context: { field } });
  return value;
}

/**
 * A call's deadline, ms: an integer from 1 to Node's longest timer. Past that Node fires the timer after 1 ms
 * (and Infinity or NaN likewise), so the call would answer `unknown` at once while its intent is still written.
 */
export function callTimeoutMs(value: number | undefined, fallback: number): number {
  if (value === undefined) return fallback;
  if (!Number.isSafeInteger(value) || value < 1 || value > MAX_TIMER_MS) {
    throw new WritError("config_invalid", `timeoutMs must be an integer from 1 to ${MAX_TIMER_MS} ms (it is ${value})`, { retriable: false, context: { field: "timeoutMs" } });
  }
  return value;
}

/** Who waits for the reply to one intent or resolution. */
interface Waiter {
  /** The reply arrived. */
  answer(reply: Reply): void;
  /** No reply will be read: the reply consumer stopped for good, or the client was closed. */
  stopped(reason: NoReplyReason): void;
}

/**
 * Waiters keyed by intent id (several submissions of one intent id each wait for its reply); a reply
 * settles all of them and goes to every `replies()` listener.
 */
class KafkaWritClient implements WritClient {
  private readonly config: ClientConfig;
  private readonly log: Logger;
  private readonly codec: WireCodec;
  private readonly producer: Producer;
  private readonly consumer: Consumer;
  /** How the reply consumer is stopped for good at close() (keepStopped: a restart kafkajs has under way is waited for). */
  private readonly consumerStop: ConsumerStop;
  private commits: IntervalCommit | null = null;
  private readonly probe: OffsetProbe;
  private readonly waiting = new Map<string, Set<Waiter>>();
  /**
   * Set once the reply consumer stopped for good (a crash kafkajs does not restart from): every submit then
   * fails with it at once, before anything is sent, since no reply to it could be read.
   */
  private stopped: WritError | null = null;
  private readonly listeners = new Set<(reply: Reply) => void>();
  private readonly replyPartitions: number;
  readonly agentId: string;
  /** Record and tool of this client's recent submissions, by intent key (for `undo(intentKey)`). */
  private readonly submitted = new Map<string, { entity: EntityRef; tool: string }>();
  /** Ends of the reply partitions as last probed, shared by submits within a second. */
  private lastProbe: { at: number; ends: Promise<EndOffsets[] | null> } | null = null;

  private readonly signer: IntentSigner | undefined;
  /** Put in every intent and resolution this client signs (`createWritClient`'s `audience`). */
  private readonly audience: string | undefined;
  /** Concurrent submits share produce requests (see SendCoalescer). */
  private readonly sends: SendCoalescer;

  private readonly limits: AdmissionLimits;

  private readonly kafka: Kafka;
  private readonly groupId: string;

  private readonly onStopped: ((err: WritError) => void) | undefined;

  constructor(
    config: ClientConfig,
    kafka: Kafka,
    log: Logger,
    probe: OffsetProbe,
    replyPartitions: number,
    groupId: string,
    limits: AdmissionLimits,
    signer?: IntentSigner,
    onStopped?: (err: WritError) => void,
    audience?: string,
  ) {
    this.onStopped = onStopped;
    this.audience = audience;
    this.kafka = kafka;
    this.groupId = groupId;
    this.signer = signer;
    this.limits = limits;
    this.config = config;
    this.replyPartitions = replyPartitions;
    this.agentId = config.agentId;
    this.log = log;
    this.probe = probe;
    this.codec = new WireCodec({
      schemaRegistryUrl: config.schemaRegistryUrl,
      schemaRegistryAuth: config.schemaRegistryAuth,
      schemaRegistryTls: config.schemaRegistryTls,
      // Owners never register the subjects only clients write (intents, resolutions): a level there that refuses
      // writ's schema is seen here alone. The values go as plain JSON, which owners read; someone should know.
      onSchemaRefused: (subject, message) => {
        if (message === null) log.info({ subject }, "the schema registry accepted the schema again; values are framed again");
        else log.warn({ subject, reason: message }, "the schema registry refused a schema; values of this subject are written as plain JSON until it accepts it (check the subject's compatibility level: docs/operations.md §6.7)");
      },
    });
    // The producer's own retries stay on (they are safe: idempotent producer); it never re-sends at the writ layer.
    // The Java-compatible murmur2 partitioner: an entity key lands on the same partition from any Kafka client.
    this.producer = kafka.producer({
      idempotent: true,
      maxInFlightRequests: 1,
      allowAutoTopicCreation: false,
      createPartitioner: Partitioners.DefaultPartitioner,
    });
    this.sends = new SendCoalescer((messages) => this.producer.send({ topic: this.config.intentsTopic, messages, acks: -1 }), MAX_REQUEST_BYTES);
    this.consumer = kafka.consumer({
      groupId,
      readUncommitted: false,
      // Fetches return as soon as a reply arrives; this only bounds an idle wait, and so close().
      maxWaitTimeInMs: config.replyFetchMaxWaitMs,
      allowAutoTopicCreation: false,
    });
    this.consumerStop = keepStopped(this.consumer, { onUnsettled: () => this.log.warn("a restart of the reply consumer was still connecting when the client closed") });
  }

  async start(): Promise<void> {
    await this.producer.connect();
    await this.consumer.connect();
    await this.consumer.subscribe({ topic: this.config.replyTopic, fromBeginning: false });
    // Started once the consumer has joined its group (after a retriable crash, once it joined again). Not at its
    // first fetch: that is a long poll which, on a quiet reply topic, ends only after maxWaitTimeInMs (a second
    // of every client's start). No reply is missed meanwhile: the group's start offsets were committed before
    // it joined (createWritClient), and the first fetch resolves them, whenever it runs.
    let crashedBeforeJoin: (err: unknown) => void = () => undefined;
    const joined = new Promise<void>((resolve, reject) => {
      crashedBeforeJoin = reject;
      const off = this.consumer.on(this.consumer.events.GROUP_JOIN, () => {
        off();
        resolve();
      });
    });
    // Awaited below, once run() returns; a crash before then must not count as an unhandled rejection.
    joined.catch(() => undefined);
    // kafkajs restarts its consumer after a retriable crash; after any other (`restart: false`) it stays
    // stopped, and a submit would wait its whole deadline for a reply nobody reads. It is not recreated
    // here: kafkajs gives up only on an error that retrying does not cure, and a new consumer would start
    // at the committed position, on the same records, and stop again.
    this.consumer.on(this.consumer.events.CRASH, (event) => {
      if (event.payload.restart) return;
      this.replyConsumerStopped(event.payload.error);
      crashedBeforeJoin(this.stopped);
    });
    // Its position is committed once a second, not after every batch (src/kafka/interval-commit.ts).
    this.commits = startIntervalCommit(this.consumer, this.config.replyTopic, REPLY_COMMIT_INTERVAL_MS, this.log);
    await this.consumer.run({
      autoCommit: false,
      eachMessage: async ({ partition, message }) => {
        await this.handleReply(message);
        this.commits?.handled(partition, message.offset);
      },
    });
    await joined;
  }

  buildIntent(i: IntentInput): WriteIntent {
    return {
      intentId: randomUUID(),
      intentKey: intentKey({ tool: i.tool, agentId: this.config.agentId, runId: i.runId, stepId: i.stepId, entity: i.entity, params: i.params }),
      entity: i.entity,
      tool: i.tool.name,
      agent: { id: this.config.agentId, runId: i.runId, stepId: i.stepId, ...(i.toolCallId ? { toolCallId: i.toolCallId } : {}) },
      baseVersion: i.baseVersion,
      delta: i.delta,
      params: i.params,
      replyTo: this.config.replyTopic,
      createdAt: new Date().toISOString(),
      ...(this.audience !== undefined ? { audience: this.audience } : {}),
    };
  }

  /**
   * `intent` with this client's audience, as it is signed and sent: intents built elsewhere (lease and undo intents,
   * a whole intent given to submit) get it too. One that names another audience is refused (config_invalid): it
   * would be signed for a deployment this client is not configured for.
   */
  private withAudience(intent: WriteIntent): WriteIntent {
    if (this.audience === undefined || intent.audience === this.audience) return intent;
    if (intent.audience !== undefined) {
      throw new WritError("config_invalid", `the intent names audience ${JSON.stringify(printable((typeof intent.audience === "string" ? intent.audience : typeof intent.audience).slice(0, 128)))}, not this client's (${this.audience}); nothing was sent`, {
        retriable: false,
        context: { field: "audience", intentKey: intent.intentKey },
      });
    }
    return { ...intent, audience: this.audience };
  }

  get replyTopic(): string {
    return this.config.replyTopic;
  }

  async submit(i: IntentInput | WriteIntent, opts?: SubmitOptions): Promise<SubmitResult> {
    const [result] = await this.submitAll([i], opts);
    return result!;
  }

  change(input: ChangeInput): Promise<ChangeResult> {
    return runChange(this, input);
  }

  async submitAll(list: (IntentInput | WriteIntent)[], opts?: SubmitOptions): Promise<SubmitResult[]> {
    const timeoutMs = callTimeoutMs(opts?.timeoutMs, this.config.submitTimeoutMs);
    const deadline = Date.now() + timeoutMs;
    const intents = list.map((i) => ("intentId" in i ? i : this.buildIntent(i)));
    const out = await this.sendAndWait(intents, deadline);
    if (opts?.onLeased === "answer") return out;
    // A record leased to a change: nothing was written; ask again (a new submission of the same key) until the deadline.
    for (let round = 0; ; round++) {
      const again = out.flatMap((r, i) => (r.status === "rejected" && r.reason === "leased" && !intents[i]!.lease ? [i] : []));
      const left = deadline - Date.now();
      if (again.length === 0 || left <= 0) return out;
      await backoffUntil(round, deadline);
      const resent = again.map((i) => ({ ...intents[i]!, intentId: randomUUID(), createdAt: new Date().toISOString() }));
      let answers: SubmitResult[];
      try {
        answers = await this.sendAndWait(resent, Math.max(Date.now() + 1, deadline));
      } catch (err) {
        // The deadline passed before a resend left (nothing of it sent): the answers so far stand, the leased
        // ones still `leased`. Throwing would lose the replies of intents already applied.
        if (err instanceof WritError && err.code === "not_sent") return out;
        throw err;
      }
      again.forEach((i, j) => {
        intents[i] = resent[j]!;
        out[i] = answers[j]!;
      });
    }
  }

  /**
   * The reply consumer stopped for good: later submits fail at once with `reply_consumer_stopped`, and every
   * waiting one is settled now as `unknown` with that reason (its intent may have been written).
   */
  private replyConsumerStopped(cause: unknown): void {
    if (this.stopped) return;
    this.stopped = new WritError(
      "reply_consumer_stopped",
      `the reply consumer of ${this.config.replyTopic} stopped and kafkajs will not restart it: no reply can be read; close this client and create a new one`,
      { retriable: false, cause, context: { topic: this.config.replyTopic } },
    );
    this.log.error({ err: cause, topic: this.config.replyTopic, waiting: this.waiting.size }, "reply consumer stopped for good; failing every submit");
    this.endWaiting("reply_consumer_stopped");
    try {
      this.onStopped?.(this.stopped);
    } catch (err) {
      this.log.error({ err }, "the onStopped callback threw");
    }
  }

  /** Settles every waiting submit and resolution now: no reply to them will be read. */
  private endWaiting(reason: NoReplyReason): void {
    const all = [...this.waiting.values()].flatMap((set) => [...set]);
    this.waiting.clear();
    for (const waiter of all) waiter.stopped(reason);
  }

  /**
   * Waits for the reply to `id` alongside any other waiter for it; returns what removes this waiter, and
   * only it: a submission that ends never takes another's waiter of the same intent id with it.
   */
  private wait(id: string, waiter: Waiter): () => void {
    let set = this.waiting.get(id);
    if (!set) this.waiting.set(id, (set = new Set()));
    set.add(waiter);
    return () => {
      const current = this.waiting.get(id);
      if (!current?.delete(waiter)) return;
      if (current.size === 0) this.waiting.delete(id);
    };
  }

  /**
   * Sends the intents in one request and resolves each reply, or its outcome at `deadline` (epoch ms), by
   * then whatever the producer or the offset probe does: rejects with a retriable `not_sent` when the
   * deadline passed before the intents were produced; resolves `unknown` when it passed with their
   * request in flight, or before a reply.
   */
  private async sendAndWait(given: WriteIntent[], deadline: number): Promise<SubmitResult[]> {
    // No reply can be read: nothing is sent (the caller hears why now, not at its deadline).
    if (this.stopped) throw this.stopped;
    // Signed for this client's deployment (its audience), whoever built the intent.
    const intents = given.map((intent) => this.withAudience(intent));
    // Owners dead-letter an intent nested too deep without a reply: the caller hears it now, nothing is sent.
    for (const intent of intents) this.checkDepth(intent, intent.intentKey);
    // Owners refuse an intent with no canonical form anywhere in it (`not_canonical`): the caller hears it now, nothing is sent.
    for (const intent of intents) canonicalJson(intent);
    // Owners check the signature and the key against what is sent: refused here when that is not what was given.
    for (const intent of intents) unchangedByValidation("WriteIntent", intent, intent.intentKey);
    for (const intent of intents) this.remember(intent);
    // One `writ.submit` span per intent, until its reply or its deadline; its trace context travels in the record's headers.
    const spans = intents.map((intent) => startSubmitSpan(intent, this.config.intentsTopic));
    // The reply partitions' ends as the wait begins: at the deadline, an end that has not moved tells a blocked topic from a slow owner.
    const before = this.ends();
    // Registered before the send: a reply may be read before the producer's acknowledgement. The first outcome of each intent wins (a provisional rejection aside: held to the deadline).
    const settlers: ((result: SubmitResult) => void)[] = [];
    const forgets: (() => void)[] = [];
    const held: (Extract<Reply, { status: "rejected" }> | undefined)[] = [];
    const results = intents.map(
      (intent, i) =>
        new Promise<SubmitResult>((resolve) => {
          let settled = false;
          const settle = (result: SubmitResult) => {
            if (settled) return;
            settled = true;
            forget();
            spans[i]!.answered(result);
            resolve(result);
          };
          settlers.push(settle);
          const forget = this.wait(intent.intentId, {
            // A rejection given before the owner authenticated the record is held until the deadline; any other answer wins.
            answer: (reply) => (isProvisional(reply) ? (held[i] ??= reply) : settle(reply)),
            stopped: (reason) =>
              settle({
                status: "unknown",
                intentId: intent.intentId,
                intentKey: intent.intentKey,
                reason,
                message: `${noReplyBecause(reason)}, so no reply can be read. The write may or may not have happened: submit the same intent key again with a new client to ask.`,
              }),
          });
          forgets.push(forget);
        }),
    );
    let sent: SendOutcome;
    try {
      // Encoding may wait for the schema registry: bounded by the deadline too (nothing is sent yet).
      const messages = await notSentPast(
        deadline,
        Promise.all(
          intents.map(async (intent) => ({
            key: entityKey(intent.entity),
            value: await this.codec.encode(this.config.intentsTopic, "WriteIntent", intent),
            ...(this.signer ? { headers: { [SIGNATURE_HEADER]: signIntent(intent, this.signer) } } : {}),
          })),
        ),
      );
      // As for depth: an intent larger than owners accept is dead-lettered without a reply.
      for (const [i, m] of messages.entries()) this.checkSize(m.value, intents[i]!.intentKey);
      for (const [i, m] of messages.entries()) spans[i]!.stamp(m);
      sent = await this.sends.send(messages, deadline);
    } catch (err) {
      for (const span of spans) span.failed(err);
      // Nothing is waited for when the send failed: drop the waiters.
      for (const forget of forgets) forget();
      throw err;
    }
    if (sent === "unconfirmed") {
      const message = "The deadline passed before the intent's produce request was acknowledged. The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.";
      intents.forEach((intent, i) => settlers[i]!({ status: "unknown", intentId: intent.intentId, intentKey: intent.intentKey, message }));
      return Promise.all(results);
    }
    // The reply partitions' ends are probed again shortly before the deadline, not at it: at the deadline the
    // outcome is given from what the probes said by then, so a slow probe cannot hold the caller past it.
    const known: { start: EndOffsets[] | null; late: EndOffsets[] | null } = { start: null, late: null };
    void before.then((ends) => (known.start = ends));
    const lead = Math.min(1000, Math.floor((deadline - Date.now()) / 4));
    const probeTimer = setTimeout(() => void this.ends(true).then((ends) => (known.late = ends)), Math.max(0, deadline - lead - Date.now()));
    const deadlineTimer = setTimeout(() => {
      clearTimeout(probeTimer);
      intents.forEach((intent, i) => {
        const provisional = held[i];
        settlers[i]!(provisional ? heldAtDeadline(provisional, "intent") : this.timedOut(intent, known.start, known.late));
      });
    }, Math.max(0, deadline - Date.now()));
    return Promise.all(results).finally(() => {
      clearTimeout(probeTimer);
      clearTimeout(deadlineTimer);
    });
  }

  async undo(target: UndoTarget, opts?: { timeoutMs?: number; runId?: string; stepId?: string; toolCallId?: string }): Promise<SubmitResult> {
    const undone = this.undoneOf(target);
    const intent = buildUndoIntent({
      undone,
      agentId: this.config.agentId,
      runId: opts?.runId ?? "undo",
      stepId: opts?.stepId ?? `undo-${undone.intentKey.slice(0, 16)}`,
      replyTo: this.config.replyTopic,
      ...(opts?.toolCallId !== undefined ? { toolCallId: opts.toolCallId } : {}),
    });
    return this.submit(intent, opts?.timeoutMs !== undefined ? { timeoutMs: opts.timeoutMs } : undefined);
  }

  /** The undone write's key, record and tool, from what the caller gave and what this client remembers. */
  private undoneOf(target: UndoTarget): { intentKey: string; entity: EntityRef; tool: string } {
    const unknown = (why: string) =>
      new WritError("config_invalid", `undo: ${why}; pass the write's applied reply, or { intentKey, entity, tool } (writ undo <key> looks a key up in the ledger)`, {
        retriable: false,
        context: { field: "target" },
      });
    if (typeof target === "string") {
      const known = this.submitted.get(target);
      if (!known) throw unknown(`intent key ${target.slice(0, 64)} was not submitted by this client`);
      return { intentKey: target, ...known };
    }
    const entity = "entity" in target ? (target.entity as EntityRef | undefined) : undefined;
    const named: unknown = "tool" in target ? target.tool : undefined;
    const toolName = typeof named === "string" ? named : typeof named === "object" && named !== null && "name" in named ? named.name : undefined;
    const tool = typeof toolName === "string" ? toolName : this.submitted.get(target.intentKey)?.tool;
    const record = entity ?? this.submitted.get(target.intentKey)?.entity;
    if (!record || !tool) throw unknown(`the reply of ${target.intentKey.slice(0, 64)} does not name its ${record ? "tool" : "record"}`);
    return { intentKey: target.intentKey, entity: { type: record.type, id: record.id }, tool };
  }

  private remember(intent: WriteIntent): void {
    this.submitted.delete(intent.intentKey);
    this.submitted.set(intent.intentKey, { entity: { type: intent.entity.type, id: intent.entity.id }, tool: intent.tool });
    if (this.submitted.size > 10_000) this.submitted.delete(this.submitted.keys().next().value!);
  }

  async resolve(
    escalation: Escalation,
    d: { decision: "apply" | "discard" | "return"; baseVersion?: string; delta?: JsonPatchOp[]; message?: string },
    opts?: { timeoutMs?: number },
  ): Promise<SubmitResult> {
    const baseVersion = d.baseVersion ?? escalation.current?.version;
    const resolution: Resolution = {
      kind: "resolution",
      resolutionId: randomUUID(),
      escalationId: escalation.escalationId,
      intent: escalation.intent,
      decision: d.decision,
      ...(d.decision === "apply" && baseVersion !== undefined ? { baseVersion } : {}),
      ...(d.delta ? { delta: d.delta } : {}),
      ...(d.message ? { message: d.message } : {}),
      operator: { id: this.config.agentId },
      replyTo: this.config.replyTopic,
      // The record's type and id only: what else the intent's entity carries is in the intent already.
      entity: { type: escalation.intent.entity.type, id: escalation.intent.entity.id },
      createdAt: new Date().toISOString(),
      ...(this.audience !== undefined ? { audience: this.audience } : {}),
    };
    this.checkDepth(resolution, resolution.intent.intentKey, "resolution");
    const unbounded = deltaOutOfBounds(resolution.delta, resolutionBounds(this.limits).delta);
    if (unbounded) {
      throw new WritError(unbounded.reason, `the resolution is refused: ${unbounded.message}; nothing was sent`, { retriable: false, context: { intentKey: resolution.intent.intentKey } });
    }
    canonicalJson(resolution); // as for an intent: one with no canonical form throws here, before anything waits or is sent
    unchangedByValidation("Resolution", resolution, resolution.intent.intentKey);
    if (this.stopped) throw this.stopped;
    const timeoutMs = callTimeoutMs(opts?.timeoutMs, this.config.submitTimeoutMs);
    const deadline = Date.now() + timeoutMs;
    let timer: NodeJS.Timeout | undefined;
    let forget: () => void = () => undefined;
    // As for an intent: a rejection given before the owner authenticated the record may answer a forged one naming this resolution id, so it is held until the deadline.
    let held: Extract<Reply, { status: "rejected" }> | undefined;
    const answer = new Promise<SubmitResult>((resolve) => {
      timer = setTimeout(() => {
        forget();
        resolve(
          held
            ? heldAtDeadline(held, "resolution")
            : { status: "unknown", intentId: resolution.resolutionId, intentKey: resolution.intent.intentKey, message: "No answer to the resolution before the deadline; look at writ.human and the record before deciding again." },
        );
      }, timeoutMs);
      const settle = (result: SubmitResult) => {
        clearTimeout(timer);
        forget();
        resolve(result);
      };
      forget = this.wait(resolution.resolutionId, {
        answer: (reply) => (isProvisional(reply) ? (held ??= reply) : settle(reply)),
        stopped: (reason) =>
          settle({
            status: "unknown",
            intentId: resolution.resolutionId,
            intentKey: resolution.intent.intentKey,
            reason,
            message: `${noReplyBecause(reason)}, so no answer to the resolution can be read; look at writ.human and the record before deciding again.`,
          }),
      });
    });
    try {
      const value = await notSentPast(deadline, this.codec.encode(this.config.intentsTopic, "Resolution", resolution, { subject: resolutionSubject(this.config.intentsTopic) }));
      this.checkSize(value, resolution.intent.intentKey, "resolution");
      const headers: Record<string, string> = { [KIND_HEADER]: "resolution" };
      if (this.signer) headers[SIGNATURE_HEADER] = signIntent(resolution, this.signer);
      // At the deadline a send still queued is dropped (not_sent); one in flight leaves the answer to the timer (unknown).
      await this.sends.send([{ key: entityKey(resolution.intent.entity), value, headers }], deadline);
    } catch (err) {
      // Nothing was sent: no answer to wait for, and no timer left running until the deadline.
      clearTimeout(timer);
      forget();
      throw err;
    }
    return answer;
  }

  /**
   * Refuses, non-retriably, a value nested deeper than owners accept (`too_deep`): they dead-letter it without a
   * reply. A resolution's bound is its intent's one level more (resolutionBounds).
   */
  private checkDepth(value: WriteIntent | Resolution, intentKey: string, kind: "intent" | "resolution" = "intent"): void {
    const resolution = kind === "resolution";
    const max = resolution ? resolutionBounds(this.limits).maxDepth : this.limits.maxJsonDepth;
    if (jsonDepth(value, max) <= max) return;
    throw new WritError("too_deep", `the ${kind} is nested deeper than ${max} levels, which owners refuse (maxJsonDepth${resolution ? " and one level" : ""}); nothing was sent: make it shallower`, {
      retriable: false,
      context: { intentKey, limit: max },
    });
  }

  /** Refuses, non-retriably, an encoded value larger than owners accept (`too_large`): they dead-letter it without a reply. */
  private checkSize(value: Buffer, intentKey: string, kind: "intent" | "resolution" = "intent"): void {
    const resolution = kind === "resolution";
    const max = resolution ? resolutionBounds(this.limits).maxBytes : this.limits.maxIntentBytes;
    if (value.length <= max) return;
    const bound = resolution ? "twice maxIntentBytes and the resolution's own fields" : "maxIntentBytes";
    throw new WritError("too_large", `the ${kind} is ${value.length} bytes encoded; owners refuse more than ${max} (${bound}); nothing was sent: make it smaller`, {
      retriable: false,
      context: { intentKey, bytes: value.length, limit: max },
    });
  }

  /**
   * The deadline passed: `blocked` when the intent's reply partition is held by an open transaction (its
   * last stable offset the same at the start and near the deadline, below its high watermark), else `unknown`.
   */
  private timedOut(intent: WriteIntent, start: EndOffsets[] | null, now: EndOffsets[] | null): SubmitResult {
    const unknown: UnknownOutcome = {
      status: "unknown",
      intentId: intent.intentId,
      intentKey: intent.intentKey,
      message: "No reply before the deadline. The write may or may not have happened: do not assume it failed; submit the same intent key again to ask.",
    };
    // The owner keys its reply by intent id: the same murmur2 partitioner finds its partition.
    const partition = partitionFor(intent.intentId, this.replyPartitions);
    const was = start?.find((e) => e.partition === partition);
    const is = now?.find((e) => e.partition === partition);
    if (!was || !is || was.lastStable !== is.lastStable || BigInt(is.lastStable) >= BigInt(is.highWatermark)) return unknown;
    const message =
      `reply topic blocked by an open transaction at offset ${is.lastStable} (${this.config.replyTopic}-${partition}, high watermark ${is.highWatermark}): ` +
      "replies past it are invisible to read_committed readers. The write may or may not have happened; ask again once it is healed (writ doctor).";
    this.log.warn({ topic: this.config.replyTopic, partition, offset: is.lastStable, highWatermark: is.highWatermark }, "reply partition blocked");
    return { status: "blocked", intentId: intent.intentId, intentKey: intent.intentKey, topic: this.config.replyTopic, partition, offset: is.lastStable, message };
  }

  /** Both ends of every reply partition; probes at most once a second unless `fresh`. */
  private ends(fresh = false): Promise<EndOffsets[] | null> {
    if (!fresh && this.lastProbe && Date.now() - this.lastProbe.at < 1000) return this.lastProbe.ends;
    const tps = Array.from({ length: this.replyPartitions }, (_, p) => ({ topic: this.config.replyTopic, partition: p }));
    const ends = this.probe.endOffsets(tps).catch(() => null);
    this.lastProbe = { at: Date.now(), ends };
    return ends;
  }

  replies(opts?: { signal?: AbortSignal }): AsyncIterable<Reply> {
    const listeners = this.listeners;
    const log = this.log;
    const signal = opts?.signal;
    return {
      // Listening starts with the iteration, not with this call: an iterable never iterated holds nothing.
      async *[Symbol.asyncIterator]() {
        if (signal?.aborted) return;
        const queue: Reply[] = [];
        let dropped = 0;
        let wake: (() => void) | null = null;
        const listener = (r: Reply) => {
          queue.push(r);
          // A reader that stopped reading without returning or aborting costs this bound, never more.
          if (queue.length > MAX_UNREAD_REPLIES) {
            queue.shift();
            if (dropped++ % MAX_UNREAD_REPLIES === 0) log.warn({ dropped, unread: MAX_UNREAD_REPLIES }, "replies() reader is not keeping up; oldest unread replies dropped");
          }
          wake?.();
        };
        // An abort stops listening at once, even while the reader holds the iterator paused at a reply.
        const onAbort = () => {
          listeners.delete(listener);
          queue.length = 0;
          wake?.();
        };
        listeners.add(listener);
        signal?.addEventListener("abort", onAbort);
        try {
          while (!signal?.aborted) {
            const next = queue.shift();
            if (next) {
              yield next;
              continue;
            }
            await new Promise<void>((r) => (wake = r));
            wake = null;
          }
        } finally {
          listeners.delete(listener);
          signal?.removeEventListener("abort", onAbort);
        }
      },
    };
  }

  private async handleReply(message: KafkaMessage): Promise<void> {
    if (isControlRecord(message.headers) || message.value === null) return;
    // A reply may hold the record's state: the codec's default (64) would read an applied write as unreadable.
    const decoded = await this.codec.decode("Reply", message.value, { maxDepth: RECORD_MAX_DEPTH });
    if (!decoded.ok) {
      this.log.warn({ reason: decoded.message, offset: message.offset }, "unreadable reply skipped");
      return;
    }
    const reply = decoded.value;
    for (const waiter of [...(this.waiting.get(reply.intentId) ?? [])]) waiter.answer(reply);
    for (const l of this.listeners) l(reply);
  }

  async close(): Promise<void> {
    // Submits still waiting hear it now, not at their deadlines: nothing will read their replies.
    this.stopped ??= new WritError("client_closed", "this client was closed; create a new one", { retriable: false });
    this.endWaiting("client_closed");
    this.commits?.stop();
    // No more background tries of a refused subject: they would go on for the life of the process.
    this.codec.close();
    await this.consumerStop.disconnect();
    await this.deleteGroup();
    await this.producer.disconnect().catch(() => undefined);
    await this.probe.close?.().catch(() => undefined);
  }

  /**
   * The reply consumer's group goes with the client: one group per client (a fresh id each start), so one left
   * behind per process (an MCP server per conversation, a CLI call) would stay on the brokers until offset
   * retention. Best effort, within CLOSE_GROUP_MS: a broker out of reach does not hold up close().
   */
  private async deleteGroup(): Promise<void> {
    const admin = this.kafka.admin();
    const deleting = admin.connect().then(() => admin.deleteGroups([this.groupId]));
    try {
      await withDeadline(deleting, CLOSE_GROUP_MS, () => {
        throw new Error(`no answer within ${CLOSE_GROUP_MS} ms`);
      });
    } catch (err) {
      this.log.debug({ err, groupId: this.groupId }, "could not delete the reply consumer's group; offset retention removes it");
    } finally {
      await admin.disconnect().catch(() => undefined);
    }
  }
}

/** How long close() tries to delete the reply consumer's group. ms. */
const CLOSE_GROUP_MS = 5000;
