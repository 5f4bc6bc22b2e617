import type { KafkaMessage } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import { canonicalJson, sha256Hex } from "../canonical-json.ts";
import { type DeadLetterReason, type RejectReason, WritError } from "../errors.ts";
import { partitionFor } from "../kafka/partition.ts";
import { printable } from "../printable.ts";
import { unreadableBatchOf } from "../kafka/unreadable-batches.ts";
import { deltaFingerprint, intentKey, leaseIntentKey, paramsFingerprint, undoFingerprint, undoIntentKey } from "../keys.ts";
import type { AgentRegistry, RegisteredAgent } from "../security/agent-registry.ts";
import { SIGNATURE_HEADER, verifySignatureOver } from "../security/signing.ts";
import { entityKey } from "../schemas/common.ts";
import { isHealRecord } from "../schemas/control.ts";
import { ABSENT_VERSION, LEASE_VERSION, LEDGER_VERSION, MAX_LEASE_TTL_MS, isLeaseOp, type WriteIntent } from "../schemas/write-intent.ts";
import { deltaOutOfBounds, KIND_HEADER, resolutionBounds, resolutionSubject, type Resolution } from "../schemas/resolution.ts";
import type { AdmittedTool } from "../tools.ts";
import { scopeRefusal } from "./delta-check.ts";
import { type Effects, type SourceRef, deadLetterOf, effects, rejectedReply } from "./effects.ts";
import type { SignedIntent, SignedResolution } from "./refusals.ts";

/** An intent that passed the gate: decoded, bounded, its tool admitted and its change within the tool's paths. */
export interface AdmittedIntent {
  intent: WriteIntent;
  tool: AdmittedTool;
  /** `<type>:<id>`: intents of one record run one at a time, in offset order. */
  entityKey: string;
  /** sha256 over tool, entity and the non-free-text params. */
  fingerprint: string;
  /** sha256 over the delta with free-text values blanked. */
  deltaFingerprint: string;
  /** The params as the tool's schema gives them (defaults applied): what a delta is rebuilt from. */
  params: Record<string, unknown>;
  /**
   * sha256 of the canonical JSON its agent signed, once the signature checked out (with an agent registry only):
   * what a refusal of these very bytes is remembered under (refusals.ts). Absent without a registry.
   */
  signed?: string;
}

export type Admission =
  | { kind: "admitted"; admitted: AdmittedIntent }
  /**
   * A person's decision on an escalation (see src/schemas/resolution.ts), from an operator allowed to make it.
   * `signed`: its bytes, once the operator's signature checked out (with an agent registry only), as a refusal of
   * them is remembered (signedResolution).
   */
  | { kind: "resolution"; resolution: Resolution; tool: AdmittedTool; entityKey: string; replyTo: string; signed?: SignedResolution }
  /**
   * `signed`: a refusal of an authenticated intent, which the owner may remember for its bytes (refusals.ts);
   * `resolution`: of an authenticated resolution, as signedResolution gives it (refusals.ts answerRefusedResolution).
   */
  | { kind: "answered"; effects: Effects; reason: string; signed?: SignedIntent<WriteIntent>; resolution?: SignedResolution }
  /** Correctly keyed, on another partition than its key's (another client's partitioner): its owner partition gets it. */
  | { kind: "forward"; partition: number }
  /** A heal record (src/schemas/control.ts) an owner's transaction left here: no intent, nothing to answer; its offset passes. */
  | { kind: "control" };

/** Which reply topics exist; the owner never creates one because an intent names it. */
export interface ReplyTopicDirectory {
  exists(topic: string): Promise<boolean>;
}

export interface AdmissionDeps {
  config: Pick<RouterConfig, "maxIntentBytes" | "maxJsonDepth" | "replyTopicPrefix" | "ledgerRetentionHours"> &
    Partial<Pick<RouterConfig, "signingAudience">> & { topics: Pick<RouterConfig["topics"], "intents"> };
  codec: WireCodec;
  tools: ReadonlyMap<string, AdmittedTool>;
  replyTopics: ReplyTopicDirectory;
  now: () => Date;
  /** With a registry, every intent must be signed by the agent it names, call only its tools, and is answered only on its reply topic. */
  agents?: AgentRegistry | undefined;
  /** Partitions of the intents topic: an intent belongs on the murmur2 partition of its entity key. */
  partitions: number;
}

/** Header an owner adds when it forwards a record to its key's partition: `<partition>@<offset>`. */
export const FORWARDED_HEADER = "writ-forwarded-from";

/**
 * The gate every intent passes before anything else happens to it (step 1
 * of the owner; see docs/architecture.md §3.1), in this order:
 *
 * 1. bounds (size, then nesting depth, before any code walks the value; a
 *    resolution's are its own, see resolutionBounds), and decoding (a framed
 *    value's schema id must belong to the intents topic's subject);
 * 2. the record key must be the intent's entity key (one owner per record,
 *    whatever the producer), and the partition the key's murmur2 partition
 *    (else the record is forwarded there, in the owner's transaction);
 * 3. the whole value must have a canonical form (RFC 8785: no lone surrogate
 *    in a string or key, no number past the double range), since its key,
 *    fingerprints and signature are computed over it (`not_canonical`), within
 *    maxIntentBytes too (`too_large`);
 * 4. with an agent registry: the signature of the agent the intent names;
 * 5. without one: an allowed reply topic prefix;
 * 6. the reply topic must exist (with a registry: the agent's registered one);
 *    the intent's date (`stale`, `clock_skew`); with a registry, the intent's
 *    reply topic must be the agent's, and the tool one of its tools; the tool,
 *    record type, params and patch operations; the intent key, recomputed from
 *    the intent's own fields.
 *
 * Bad input is answered here, with a machine-readable reason and a dead letter
 * where the record itself is bad, and the partition moves on. Replies go only
 * to the reply topic the agent registered (without a registry: the intent's
 * own, when it is allowed and exists), never to a topic a forged record names.
 *
 * Throws only when the registry is unreachable (retriable): that says
 * nothing about the record, so the owner waits and asks again.
 */
export async function admit(message: KafkaMessage, source: SourceRef, deps: AdmissionDeps): Promise<Admission> {
  const at = deps.now().toISOString();
  const value = message.value;
  const answered: Answer = (reason, parts, detail) => ({
    kind: "answered",
    reason,
    effects: effects({
      // With no reply to carry the answer (its reply topic is not there), the record is dead-lettered instead:
      // an answer that produces nothing would tell no one, and its offset would wait for other traffic.
      deadLetters: parts.dead
        ? [deadLetterOf(message, source, parts.dead, detail, at)]
        : parts.reply
          ? []
          : [deadLetterOf(message, source, "reply_topic_missing", `${detail}; no reply was sent: the reply topic does not exist`, at)],
      replies: parts.reply ? [{ topic: parts.reply.topic, value: rejectedReply(parts.reply.intentId, parts.reply.intentKey, parts.reply.reason, detail, at, parts.reply.details) }] : [],
    }),
  });
  // Owners write heal records to intents partitions they forward to (§6.1): skipped, never dead-lettered.
  if (isHealRecord(message)) return { kind: "control" };
  const unreadable = value === null || value === undefined ? unreadableBatchOf(message.headers) : null;
  if (unreadable) {
    // Stands for a batch that could not be read (src/kafka/unreadable-batches.ts): its records have no key or
    // value to answer, only offsets to account for. Its bytes stay on the topic until its retention.
    return answered(
      "undecodable",
      { dead: "undecodable" },
      `the record batch of offsets ${unreadable.firstOffset}-${unreadable.lastOffset} could not be read (${unreadable.reason}); it is skipped, and stays on ${source.topic} until the topic's retention`,
    );
  }
  // A resolution carries an intent whole, one level down, and may carry a change as large: its own bounds.
  const isResolution = headerText(message.headers?.[KIND_HEADER]) === "resolution";
  const maxBytes = isResolution ? resolutionBounds(deps.config).maxBytes : deps.config.maxIntentBytes;
  if (value && value.length > maxBytes) {
    return answered("too_large", { dead: "too_large" }, `${isResolution ? "resolution" : "intent"} is ${value.length} bytes; the limit is ${maxBytes}`);
  }
  if (isResolution) return admitResolution(message, source, deps, answered);
  const decoded = await deps.codec.decode("WriteIntent", value, { maxDepth: deps.config.maxJsonDepth, subject: `${deps.config.topics.intents}-value` });
  if (!decoded.ok) {
    const loose = looseObject(decoded.parsed);
    const reply = await claimedReply(deps, decoded, { agent: textAt(loose, "agent", "id"), replyTo: textAt(loose, "replyTo"), id: textAt(loose, "intentId"), intentKey: textAt(loose, "intentKey") });
    return answered(decoded.reason, { dead: decoded.reason, ...reply }, decoded.message);
  }
  const intent = decoded.value;
  const agent = deps.agents?.get(intent.agent.id);
  const replyTarget = await replyTopicOf(deps, agent, intent.replyTo);
  const reply = (reason: RejectReason, details?: unknown) =>
    replyTarget ? { topic: replyTarget, intentId: intent.intentId, intentKey: intent.intentKey, reason, details } : undefined;

  // One owner per record: the key must name the intent's record, and the record must be on the key's partition.
  const key = entityKey(intent.entity);
  const recordKey = message.key === null || message.key === undefined ? null : message.key.toString("utf8");
  if (recordKey === null) return answered("key_missing", { dead: "key_missing", reply: reply("key_missing") }, `the record has no key; intents are keyed by their entity (${key.slice(0, 300)})`);
  if (recordKey !== key) {
    return answered("key_mismatch", { dead: "key_mismatch", reply: reply("key_mismatch") }, `the record key ${recordKey.slice(0, 300)} is not the intent's entity ${key.slice(0, 300)}`);
  }
  const home = partitionFor(recordKey, deps.partitions);
  if (home !== source.partition) return { kind: "forward", partition: home };
  const canonical = canonicalText(decoded.raw);
  if ("problem" in canonical) return answered("not_canonical", { dead: "not_canonical", reply: reply("not_canonical") }, `intent refused: ${canonical.problem}`);
  // Owners write the intent again (in an escalation) and operators send it back (in a resolution), as JSON with
  // numbers as JavaScript writes them, which the canonical form is: `1e20` takes 21 bytes there. Bounded here, what
  // is admitted fits both (see resolutionBounds).
  const canonicalBytes = Buffer.byteLength(canonical.text);
  if (canonicalBytes > deps.config.maxIntentBytes) {
    return answered("too_large", { dead: "too_large" }, `intent is ${canonicalBytes} bytes as canonical JSON (RFC 8785: numbers as JavaScript writes them); the limit is ${deps.config.maxIntentBytes}`);
  }

  // The bytes an agent signed, once the signature is checked: what a refusal of them is remembered under.
  let signed: string | undefined;
  if (deps.agents) {
    if (!agent) return answered("unauthenticated", { dead: "unauthenticated" }, `agent ${intent.agent.id.slice(0, 128)} is not in the agent registry`);
    const header = headerText(message.headers?.[SIGNATURE_HEADER]);
    const check = verifySignatureOver(Buffer.from(canonical.text, "utf8"), header, agent.keys);
    if (!check.ok) return answered("unauthenticated", { dead: "unauthenticated", reply: reply("unauthenticated") }, `not signed by agent ${agent.id}: ${check.reason}`);
    // Only once the signature holds: a producer without the agent's key learns nothing of the audience required.
    const audience = audienceRefusal(intent.audience, deps.config.signingAudience, "intent");
    if (audience) return answered("unauthenticated", { dead: "unauthenticated", reply: reply("unauthenticated", audience.details) }, `agent ${agent.id}: ${audience.message}`);
    signed = sha256Hex(canonical.text);
  } else if (!replyTopicAllowed(intent.replyTo, deps)) {
    return answered("reply_topic_not_allowed", { dead: "reply_topic_not_allowed" }, `reply topic must start with ${deps.config.replyTopicPrefix}`);
  }
  if (!replyTarget) {
    return answered("reply_topic_missing", { dead: "reply_topic_missing" }, `reply topic ${(agent?.replyTopic ?? intent.replyTo).slice(0, 249)} does not exist; the agent's client (or an operator) creates it, owners never do`);
  }

  // A refusal of signed bytes carries them: the owner remembers it when the state it was decided on may change (refusals.ts).
  const reject = (reason: RejectReason, msg: string, details?: unknown): Admission => {
    const out = answered(reason, { reply: reply(reason, details) }, msg);
    return signed !== undefined && out.kind === "answered" ? { ...out, signed: { digest: signed, intent } } : out;
  };
  const admitted = (a: Admission): Admission => (signed !== undefined && a.kind === "admitted" ? { kind: "admitted", admitted: { ...a.admitted, signed } } : a);
  // Its date first: a refusal remembered for these bytes (any below) is kept from it, so bytes dated past the allowed
  // clock skew are refused clock_skew before anything else, remembered dated at the skew's end (refusals.ts).
  const unfresh = freshnessRefusal(intent, deps.now().getTime(), deps.config.ledgerRetentionHours);
  if (unfresh) return reject(unfresh.reason, unfresh.message);
  // Answered on the registered topic (a registry registers the intent's own later: remembered, as refusals after it).
  if (agent && intent.replyTo !== agent.replyTopic) {
    return reject("reply_topic_not_registered", `agent ${agent.id} answers on ${agent.replyTopic}, not ${intent.replyTo.slice(0, 249)}`);
  }
  const tool = deps.tools.get(intent.tool);
  if (!tool) return reject("unknown_tool", `no write tool named ${intent.tool.slice(0, 128)} is admitted`);
  if (agent && !agent.mayCall(tool.name)) return reject("tool_not_allowed", `agent ${agent.id} may not call ${tool.name}`);
  if (tool.recordType !== intent.entity.type) {
    return reject("entity_type_mismatch", `tool ${tool.name} writes ${tool.recordType} records, not ${intent.entity.type}`);
  }
  if (isLeaseOp(intent.lease)) return admitted(admitLease(intent, tool, key, reject));
  if (intent.undo !== undefined) return admitted(admitUndo(intent, tool, key, reject));
  const params = parsedParams(tool, intent.params);
  if (!params.ok) return reject("params_invalid", params.message, params.issues);
  if (tool.create) {
    const refusal = createRefusal(intent, tool.create, params.data);
    if (refusal) return reject(refusal.reason, refusal.message);
  } else {
    const outOfScope = scopeRefusal(tool, intent.delta);
    if (outOfScope) return reject(outOfScope.reason, outOfScope.message, outOfScope.details);
  }
  // Nothing computed from the intent may throw out of admission (a throw pauses the partition's intake):
  // a refusal of the key's inputs (a missing intent field; no canonical form) is an answer.
  let expected: string;
  let fingerprint: string;
  let deltaPrint: string;
  try {
    expected = intentKey({ tool, agentId: intent.agent.id, runId: intent.agent.runId, stepId: intent.agent.stepId, entity: intent.entity, params: intent.params });
    ({ fingerprint, deltaFingerprint: deltaPrint } = intentFingerprints(tool, intent));
  } catch (err) {
    const reason = err instanceof WritError && err.code === "not_canonical" ? "not_canonical" : "params_invalid";
    return reject(reason, (err as Error).message.slice(0, 2000));
  }
  if (expected !== intent.intentKey) {
    return reject("intent_key_mismatch", "the intent key is not the one its agent, run, step, tool, record and intent fields give (see intentKey())");
  }
  return {
    kind: "admitted",
    admitted: {
      intent,
      tool,
      entityKey: key,
      fingerprint,
      deltaFingerprint: deltaPrint,
      params: params.data,
      ...(signed !== undefined ? { signed } : {}),
    },
  };
}

/**
 * Why a create intent is not the one its params give, or null when it is:
 * its base version must be `"absent"`, its entity id the external id the
 * params give, and its delta exactly one `add` of the params' body at `""`
 * (the tool's functions run here on the validated params; a throw is a refusal).
 */
/**
 * An intent's params as the tool's schema gives them (defaults applied, transforms run): what its delta is built and
 * checked from, at admission and when an operator's apply rebuilds it (resolution.ts). The schema is the tool's code
 * run on bytes from Kafka: a transform or refinement that throws (safeParse passes that on) is a refusal of these
 * params, never a throw out of the caller (the owner would take it for an outage).
 */
export function parsedParams(
  tool: Pick<AdmittedTool, "name" | "declaration">,
  params: unknown,
): { ok: true; data: Record<string, unknown> } | { ok: false; message: string; issues?: unknown[] } {
  let parsed: ReturnType<typeof tool.declaration.params.safeParse>;
  try {
    parsed = tool.declaration.params.safeParse(params);
  } catch (err) {
    const why = err instanceof Error ? err.message : "it threw";
    return { ok: false, message: `the tool's params schema failed on these params: ${why}`.slice(0, 2000) };
  }
  if (!parsed.success) return { ok: false, message: paramsProblem(tool.name, parsed.error.issues), issues: parsed.error.issues.slice(0, 10) };
  return { ok: true, data: parsed.data as Record<string, unknown> };
}

/** Longest `params_invalid` message: the model reads it; the issues themselves are in the reply's `details`. */
export const PARAMS_PROBLEM_MAX_CHARS = 500;

/**
 * The params' problems as one line the model can act on, `tag: Invalid input: expected string, received number;
 * amountCents: Too small: expected number to be >0` (at most five issues, {@link PARAMS_PROBLEM_MAX_CHARS}), not
 * zod's pretty-printed JSON of them.
 */
export function paramsProblem(tool: string, issues: readonly { path: readonly PropertyKey[]; message: string }[]): string {
  const shown = issues.slice(0, 5).map((i) => `${i.path.length === 0 ? "params" : i.path.map(String).join(".")}: ${i.message.replace(/\s+/g, " ")}`);
  const more = issues.length > shown.length ? `; and ${issues.length - shown.length} more` : "";
  const text = `params do not fit tool ${tool}: ${shown.join("; ")}${more}`;
  return text.length <= PARAMS_PROBLEM_MAX_CHARS ? text : `${text.slice(0, PARAMS_PROBLEM_MAX_CHARS - 1)}…`;
}

function createRefusal(
  intent: WriteIntent,
  create: NonNullable<AdmittedTool["create"]>,
  params: Record<string, unknown>,
): { reason: RejectReason; message: string } | null {
  if (intent.baseVersion !== ABSENT_VERSION) return { reason: "params_invalid", message: `a create's baseVersion is "${ABSENT_VERSION}" (it read no record)` };
  let externalId: unknown;
  let body: unknown;
  try {
    externalId = create.externalId(params);
    body = create.body(params);
  } catch (err) {
    return { reason: "params_invalid", message: `the tool's create functions failed on these params: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000) };
  }
  if (typeof externalId !== "string" || externalId.length === 0 || externalId.length > 256) {
    return { reason: "params_invalid", message: "the tool's create.externalId gave no id (a string of 1 to 256 characters)" };
  }
  if (externalId !== intent.entity.id) {
    return { reason: "external_id_mismatch", message: `the record to create is ${intent.entity.type}:${externalId.slice(0, 256)} (the external id these params give), not ${intent.entity.type}:${intent.entity.id.slice(0, 256)}` };
  }
  if (typeof body !== "object" || body === null || Array.isArray(body)) return { reason: "params_invalid", message: "the tool's create.body gave no JSON object" };
  let expected: string;
  try {
    expected = canonicalJson([{ op: "add", path: "", value: body }]);
  } catch (err) {
    return { reason: "not_canonical", message: `the record these params give has no canonical form: ${(err as Error).message}`.slice(0, 2000) };
  }
  // The intent's own delta has a canonical form: the whole value was checked before.
  if (expected !== canonicalJson(intent.delta)) {
    return { reason: "delta_mismatch", message: 'a create\'s delta is [{"op":"add","path":"","value":<the record its params give>}]; this one is not' };
  }
  return null;
}

/**
 * An intent's params fingerprint, and the one its attempts are recorded under in the ledger: its delta's, but for
 * a create (its delta is its params' body, free text and all) and an undo (no delta of its own), whose params
 * fingerprint stands for it. Admission and a resolution's check against the ledger must agree on both.
 * Throws `not_canonical` for a value with no canonical form.
 */
export function intentFingerprints(
  tool: Pick<AdmittedTool, "name" | "create" | "freeTextParams" | "isFreeTextPath">,
  intent: Pick<WriteIntent, "entity" | "params" | "delta" | "undo">,
): { fingerprint: string; deltaFingerprint: string } {
  if (intent.undo) {
    const fingerprint = undoFingerprint(tool.name, intent.entity, intent.undo.intentKey);
    return { fingerprint, deltaFingerprint: fingerprint };
  }
  const fingerprint = paramsFingerprint(tool.name, intent.entity, intent.params, tool.freeTextParams);
  return { fingerprint, deltaFingerprint: tool.create ? fingerprint : deltaFingerprint(intent.delta, tool.isFreeTextPath) };
}

/**
 * An undo (`intent.undo` set) names the intent it compensates: its key must
 * be `undoIntentKey(undone key)`, its base version `"ledger"` and its params
 * empty, and its tool must declare an undo. Whether the undone intent was
 * applied, on this record, by this tool, is the owner's to check, with its ledger.
 */
function admitUndo(intent: WriteIntent, tool: AdmittedTool, key: string, reject: (reason: RejectReason, msg: string) => Admission): Admission {
  const undone = intent.undo!.intentKey;
  if (!tool.undo) return reject("undo_not_declared", `tool ${tool.name} declares no undo: its writes cannot be undone by writ`);
  if (intent.baseVersion !== LEDGER_VERSION) return reject("params_invalid", `an undo's baseVersion is "${LEDGER_VERSION}": the owner takes the version the undone write produced from its ledger`);
  if (Object.keys(intent.params).length > 0) return reject("params_invalid", "an undo carries no params: the owner takes the undone intent's from its ledger");
  if (intent.intentKey !== undoIntentKey(undone)) return reject("intent_key_mismatch", "an undo's intent key is undoIntentKey(<the undone intent's key>) (see keys.ts)");
  return { kind: "admitted", admitted: { intent, tool, entityKey: key, ...intentFingerprints(tool, intent), params: {} } };
}

/**
 * A lease intent (`lease.op` `acquire` or `release`) writes nothing: empty
 * params, base version `"lease"`, and the key `leaseIntentKey(change, op,
 * entity)`. It names the tool the change will write the record with, so the
 * agent's right to take a record's lease is its right to call that tool on it.
 */
function admitLease(intent: WriteIntent, tool: AdmittedTool, key: string, reject: (reason: RejectReason, msg: string) => Admission): Admission {
  const lease = intent.lease!;
  if (intent.undo !== undefined) return reject("params_invalid", "an undo is a step of a change (lease op \"step\"), never a lease acquire or release");
  if (intent.baseVersion !== LEASE_VERSION) return reject("params_invalid", `a lease intent's baseVersion is "${LEASE_VERSION}": it writes nothing, and the owner reads the record itself`);
  if (Object.keys(intent.params).length > 0) return reject("params_invalid", "a lease intent carries no params");
  if (lease.op === "release" && lease.ttlMs !== undefined) return reject("params_invalid", "only a lease acquire carries ttlMs");
  if (intent.intentKey !== leaseIntentKey(lease.change, lease.op as "acquire" | "release", intent.entity)) {
    return reject("intent_key_mismatch", "a lease intent's key is leaseIntentKey(<change>, <op>, <entity>) (see keys.ts)");
  }
  const fingerprint = paramsFingerprint(tool.name, intent.entity, { lease: lease.change, op: lease.op }, []);
  return { kind: "admitted", admitted: { intent, tool, entityKey: key, fingerprint, deltaFingerprint: fingerprint, params: {} } };
}

/** Most characters of a received audience a refusal quotes (the schema bounds it to as many; hostile bytes all the same). */
const AUDIENCE_QUOTED = 128;

/**
 * Why a signed intent or resolution is not for this deployment, or null: its `audience` (signed with it) must be the
 * owners' `WRIT_SIGNING_AUDIENCE` (`required`) exactly, when they set one. Unset, any audience or none is accepted.
 * `details` is the reply's machine-readable part: `problem` `audience_missing` or `audience_mismatch`, and on a
 * mismatch the audience received (bounded and printable); never the one required.
 */
export function audienceRefusal(
  audience: unknown,
  required: string | undefined,
  of: "intent" | "resolution",
): { message: string; details: { problem: "audience_missing" } | { problem: "audience_mismatch"; received: string } } | null {
  if (required === undefined || audience === required) return null;
  if (audience === undefined) {
    return {
      message: `audience_missing: the ${of} is signed for no audience, and this deployment admits only signed records that name its own (WRIT_SIGNING_AUDIENCE); set the signer's audience`,
      details: { problem: "audience_missing" },
    };
  }
  const text = typeof audience === "string" ? audience : String(typeof audience);
  const received = printable(text.length > AUDIENCE_QUOTED ? `${text.slice(0, AUDIENCE_QUOTED)}…` : text);
  return {
    message: `audience_mismatch: the ${of} is signed for audience ${JSON.stringify(received)}, another deployment's (this one requires its own, WRIT_SIGNING_AUDIENCE); signed bytes are not replayed across deployments`,
    details: { problem: "audience_mismatch", received },
  };
}

/** How far ahead of the owner's clock an intent's `createdAt` may be. ms. */
export const MAX_CLOCK_SKEW_MS = 300_000;

/** The oldest lease intent an owner acts on (its `createdAt`): a lease's longest life and the clock margin. ms. */
export const LEASE_INTENT_MAX_AGE_MS = MAX_LEASE_TTL_MS + MAX_CLOCK_SKEW_MS;

/**
 * The oldest intent an owner acts on, by its `createdAt` (signed with the rest of it): one a little younger than the
 * ledger's retention, since past the retention a repeat of it could not be recognized and would write again (a
 * replay of signed bytes, or a copy left on a topic); a lease intent, a lease's longest life. ms.
 */
export function maxIntentAgeMs(intent: Pick<WriteIntent, "lease">, ledgerRetentionHours: number): number {
  if (isLeaseOp(intent.lease)) return LEASE_INTENT_MAX_AGE_MS;
  const retention = ledgerRetentionHours * 3_600_000;
  // The intent's entry is dated by the owner's clock, which an agent's may lead by MAX_CLOCK_SKEW_MS: its bytes go
  // stale by their `createdAt` that much later than the sweep takes the entry, so the margin must exceed the skew
  // (a 24th of a short retention does not: 2.5 minutes of 1 h). At most half the retention, which only a test's
  // retention of seconds (below the configuration's least hour) reaches.
  return retention - Math.min(Math.max(retention / 24, 2 * MAX_CLOCK_SKEW_MS), retention / 2);
}

/**
 * Why an intent (or a resolution, `of`) is too old, or dated ahead of the owner's clock (`now`, ms), to act on; null
 * when it is neither. A resolution is dated as an intent is: a refusal remembered for its bytes outlives them.
 */
export function freshnessRefusal(
  intent: Pick<WriteIntent, "createdAt" | "lease">,
  now: number,
  ledgerRetentionHours: number,
  of: "intent" | "resolution" = "intent",
): { reason: "stale" | "clock_skew"; message: string } | null {
  const created = Date.parse(intent.createdAt);
  const who = of === "intent" ? "agent" : "operator";
  if (created - now > MAX_CLOCK_SKEW_MS) {
    return { reason: "clock_skew", message: `the ${of} was created at ${intent.createdAt}, more than ${MAX_CLOCK_SKEW_MS / 60_000} minutes after the owner's clock (${new Date(now).toISOString()}): check the ${who}'s clock` };
  }
  const limit = maxIntentAgeMs(intent, ledgerRetentionHours);
  if (now - created <= limit) return null;
  const what = isLeaseOp(intent.lease) ? "a lease lasts at most" : "the owners' ledger keeps an intent (WRIT_LEDGER_RETENTION_HOURS) less a margin:";
  const again = of === "intent" ? "Submit it again (a new submission) if the write still holds" : "Decide again (a new resolution) if the escalation is still open";
  return {
    reason: "stale",
    message: `the ${of} was created at ${intent.createdAt}, longer ago than ${what} ${Math.round(limit / 60_000)} minutes; past that a repeat of it could not be recognized, so it is not acted on. ${again}`,
  };
}

/**
 * `raw`'s canonical JSON (a record's value as parsed; what its signature
 * covers, computed once per record), or why it has none. RFC 8785 has none
 * for a string or key with a lone surrogate or
 * for a non-finite number (JSON text such as `1e400` parses to Infinity): a
 * value holding one can be neither keyed, fingerprinted nor signed, so it is
 * refused whole, before anything computes over it. (Its depth was bounded by
 * the decoder, far below the canonical limit.)
 */
function canonicalText(raw: unknown): { text: string } | { problem: string } {
  try {
    return { text: canonicalJson(raw) };
  } catch (err) {
    return { problem: (err as Error).message.slice(0, 2000) };
  }
}

/** The tool operators name to be allowed to resolve escalations (agent registry: `tools: ["writ.resolve"]`). */
export const RESOLVE_TOOL = "writ.resolve";

type Answer = (
  reason: string,
  parts: { dead?: DeadLetterReason; reply?: { topic: string; intentId: string; intentKey: string; reason: RejectReason; details?: unknown } },
  detail: string,
) => Admission;

/**
 * A resolution passes the same gate as an intent (bounds, framing, key and
 * partition, canonical form, signature of the operator it names, its date), and
 * the operator must be allowed the `writ.resolve` tool and answer on its
 * registered reply topic. Refusals after the signature carry its bytes, which
 * the owner remembers them for (refusals.ts).
 * Whether the escalation is open is the owner's to check, with its ledger.
 */
async function admitResolution(message: KafkaMessage, source: SourceRef, deps: AdmissionDeps, answered: Answer): Promise<Admission> {
  const bounds = resolutionBounds(deps.config);
  const decoded = await deps.codec.decode("Resolution", message.value, { maxDepth: bounds.maxDepth, subject: resolutionSubject(deps.config.topics.intents) });
  if (!decoded.ok) {
    // Answered as an intent that fails to decode is (the same gate): on the topic of the operator it names, by its resolution id.
    const loose = looseObject(decoded.parsed);
    const reply = await claimedReply(deps, decoded, { agent: textAt(loose, "operator", "id"), replyTo: textAt(loose, "replyTo"), id: textAt(loose, "resolutionId"), intentKey: textAt(loose, "intent", "intentKey") });
    return answered(decoded.reason, { dead: decoded.reason, ...reply }, `resolution: ${decoded.message}`);
  }
  const r = decoded.value;
  const unbounded = deltaOutOfBounds(r.delta, bounds.delta);
  if (unbounded) return answered(unbounded.reason, { dead: unbounded.reason }, `resolution: ${unbounded.message}`);
  const operator = deps.agents?.get(r.operator.id);
  const replyTarget = await replyTopicOf(deps, operator, r.replyTo);
  const reply = (reason: RejectReason, details?: unknown) =>
    replyTarget ? { topic: replyTarget, intentId: r.resolutionId, intentKey: r.intent.intentKey, reason, ...(details === undefined ? {} : { details }) } : undefined;
  const key = entityKey(r.intent.entity);
  const recordKey = message.key === null || message.key === undefined ? null : message.key.toString("utf8");
  if (recordKey === null) return answered("key_missing", { dead: "key_missing", reply: reply("key_missing") }, "a resolution is keyed by the escalated intent's entity; the record has no key");
  if (recordKey !== key || entityKey(r.entity) !== key) return answered("key_mismatch", { dead: "key_mismatch", reply: reply("key_mismatch") }, "a resolution is keyed by the escalated intent's entity");
  const home = partitionFor(recordKey, deps.partitions);
  if (home !== source.partition) return { kind: "forward", partition: home };
  const canonical = canonicalText(decoded.raw);
  if ("problem" in canonical) return answered("not_canonical", { dead: "not_canonical", reply: reply("not_canonical") }, `resolution refused: ${canonical.problem}`);
  // The bytes the operator signed, once the signature is checked: what a refusal of them is remembered under.
  let signed: SignedResolution | undefined;
  if (deps.agents) {
    if (!operator) return answered("unauthenticated", { dead: "unauthenticated" }, `operator ${r.operator.id.slice(0, 128)} is not in the agent registry`);
    const check = verifySignatureOver(Buffer.from(canonical.text, "utf8"), headerText(message.headers?.[SIGNATURE_HEADER]), operator.keys);
    if (!check.ok) return answered("unauthenticated", { dead: "unauthenticated", reply: reply("unauthenticated") }, `not signed by operator ${operator.id}: ${check.reason}`);
    const audience = audienceRefusal(r.audience, deps.config.signingAudience, "resolution");
    if (audience) return answered("unauthenticated", { dead: "unauthenticated", reply: reply("unauthenticated", audience.details) }, `operator ${operator.id}: ${audience.message}`);
    signed = signedResolution(r, sha256Hex(canonical.text));
  } else if (!replyTopicAllowed(r.replyTo, deps)) {
    return answered("reply_topic_not_allowed", { dead: "reply_topic_not_allowed" }, `reply topic must start with ${deps.config.replyTopicPrefix}`);
  }
  if (!replyTarget) return answered("reply_topic_missing", { dead: "reply_topic_missing" }, `operator reply topic ${(operator?.replyTopic ?? r.replyTo).slice(0, 249)} does not exist`);
  // A refusal of signed bytes carries them: the owner remembers it for them (refusals.ts rememberResolutionRefusal).
  const reject = (reason: RejectReason, msg: string): Admission => {
    const out = answered(reason, { reply: reply(reason) }, msg);
    return signed !== undefined && out.kind === "answered" ? { ...out, resolution: signed } : out;
  };
  // Its date first, as an intent's: a refusal remembered for these bytes is kept until they are stale.
  const unfresh = freshnessRefusal({ createdAt: r.createdAt }, deps.now().getTime(), deps.config.ledgerRetentionHours, "resolution");
  if (unfresh) return reject(unfresh.reason, unfresh.message);
  if (operator && !operator.tools.has(RESOLVE_TOOL)) return reject("tool_not_allowed", `${operator.id} may not resolve escalations (${RESOLVE_TOOL})`);
  if (operator && r.replyTo !== operator.replyTopic) return reject("reply_topic_not_registered", `operator ${operator.id} answers on ${operator.replyTopic}`);
  const tool = deps.tools.get(r.intent.tool);
  if (!tool) return reject("unknown_tool", `no write tool named ${r.intent.tool.slice(0, 128)} is admitted`);
  return { kind: "resolution", resolution: r, tool, entityKey: key, replyTo: replyTarget, ...(signed ? { signed } : {}) };
}

/**
 * A signed resolution as a refusal of it is remembered (refusals.ts): under its resolution id, on the escalated
 * intent's key, tool and record, the operator's, answered on the operator's reply topic; with its decision (an apply
 * stages the escalation's pending entry, under its digest). Its canonical JSON (`kind: "resolution"` in it) is never
 * an intent's: the digests do not meet.
 */
function signedResolution(r: Resolution, digest: string): SignedResolution {
  const { intentKey, entity, tool } = r.intent;
  const intent = { intentId: r.resolutionId, intentKey, entity, tool, agent: { id: r.operator.id }, baseVersion: r.baseVersion ?? r.intent.baseVersion, createdAt: r.createdAt, replyTo: r.replyTo, decision: r.decision };
  return { digest, intent };
}

/** A parsed value's members, or none: what a record that failed validation claims is read from this. */
function looseObject(parsed: unknown): Record<string, unknown> {
  return typeof parsed === "object" && parsed !== null && !Array.isArray(parsed) ? (parsed as Record<string, unknown>) : {};
}

/** The string at `path` in a record that failed validation, or "": only strings are taken (anything else may throw when converted). */
function textAt(value: Record<string, unknown>, ...path: string[]): string {
  let at: unknown = value;
  for (const name of path) at = typeof at === "object" && at !== null && Object.hasOwn(at, name) ? (at as Record<string, unknown>)[name] : undefined;
  return typeof at === "string" ? at : "";
}

/**
 * The reply to a record that failed to decode, from what it claims: on the registered reply topic of the agent (or
 * operator) it names with a registry, else on its own allowed `replyTo`, when that topic exists; none otherwise.
 */
async function claimedReply(
  deps: AdmissionDeps,
  decoded: { reason: RejectReason },
  claims: { agent: string; replyTo: string; id: string; intentKey: string },
): Promise<{ reply?: { topic: string; intentId: string; intentKey: string; reason: RejectReason } }> {
  const topic = await replyTopicOf(deps, deps.agents ? deps.agents.get(claims.agent.slice(0, 128)) : undefined, claims.replyTo.slice(0, 249));
  return topic ? { reply: { topic, intentId: claims.id.slice(0, 128), intentKey: claims.intentKey.slice(0, 64), reason: decoded.reason } } : {};
}

/**
 * Where an answer to this record may go: the registered reply topic of the
 * agent it names (with a registry), else its own `replyTo` if allowed; in
 * both cases only if the topic exists. Null: nowhere (dead letter only).
 */
async function replyTopicOf(deps: AdmissionDeps, agent: RegisteredAgent | undefined, replyTo: string): Promise<string | null> {
  const topic = deps.agents ? agent?.replyTopic : replyTopicAllowed(replyTo, deps) ? replyTo : undefined;
  if (!topic) return null;
  return (await deps.replyTopics.exists(topic)) ? topic : null;
}

/**
 * Whether owners may have replied on `topic`: within the reply prefix, or an agent's registered reply topic. A ledger
 * entry naming another topic was written by no owner of this deployment (any producer with write access to the ledger
 * can write one), and a heal there (an internal topic, one the owners may not write) would fail every open.
 */
export function mayHaveRepliedOn(topic: string, deps: Pick<AdmissionDeps, "config" | "agents">): boolean {
  return replyTopicAllowed(topic, deps) || deps.agents?.hasReplyTopic(topic) === true;
}

function replyTopicAllowed(topic: string, deps: Pick<AdmissionDeps, "config">): boolean {
  return topic.startsWith(deps.config.replyTopicPrefix) && topic.length > deps.config.replyTopicPrefix.length && /^[a-zA-Z0-9._-]{1,249}$/.test(topic);
}

function headerText(v: unknown): string | undefined {
  if (Buffer.isBuffer(v)) return v.toString("utf8");
  if (typeof v === "string") return v;
  if (Array.isArray(v) && v.length === 1) return headerText(v[0]);
  return undefined;
}
