import type { KafkaMessage } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import type { RouterConfig } from "../config.ts";
import type { DeadLetterReason, RejectReason } from "../errors.ts";
import { deltaFingerprint, paramsFingerprint } from "../keys.ts";
import { entityKey } from "../schemas/common.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import type { AdmittedTool } from "../tools.ts";
import { type Effects, type SourceRef, deadLetterOf, effects, rejectedReply } from "./effects.ts";

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
}

export type Admission = { kind: "admitted"; admitted: AdmittedIntent } | { kind: "answered"; effects: Effects; reason: string };

/** Which reply topics exist; the owner never creates one because an intent names it. */
export interface ReplyTopicDirectory {
  exists(topic: string): Promise<boolean>;
}

export interface AdmissionDeps {
  config: Pick<RouterConfig, "maxIntentBytes" | "maxJsonDepth" | "replyTopicPrefix">;
  codec: WireCodec;
  tools: ReadonlyMap<string, AdmittedTool>;
  replyTopics: ReplyTopicDirectory;
  now: () => Date;
}

/**
 * The gate every intent passes before anything else happens to it (step 1
 * of the owner): bounds first (size, then nesting depth, before any code
 * walks the value), then decode and validate, then the reply topic, then the
 * tool. Bad input is answered here, with a machine-readable reason and a
 * dead letter where the record itself is bad, and the partition moves on.
 *
 * Throws only when the registry is unreachable (retriable): that says
 * nothing about the record, so the owner waits and asks again.
 */
export async function admit(message: KafkaMessage, source: SourceRef, deps: AdmissionDeps): Promise<Admission> {
  const at = deps.now().toISOString();
  const value = message.value;
  const dead = (reason: DeadLetterReason, detail: string, reply?: { topic: string; intentId: string; intentKey: string; reason: RejectReason }): Admission => ({
    kind: "answered",
    reason,
    effects: effects({
      deadLetters: [deadLetterOf(message, source, reason, detail, at)],
      replies: reply ? [{ topic: reply.topic, value: rejectedReply(reply.intentId, reply.intentKey, reply.reason, detail, at) }] : [],
    }),
  });
  if (value && value.length > deps.config.maxIntentBytes) {
    return dead("too_large", `intent is ${value.length} bytes; the limit is ${deps.config.maxIntentBytes}`);
  }
  const decoded = await deps.codec.decode("WriteIntent", value, { maxDepth: deps.config.maxJsonDepth });
  if (!decoded.ok) {
    // A reply goes back only where the record names an allowed reply topic that exists.
    const loose = (decoded.parsed ?? {}) as Partial<Record<"intentId" | "intentKey" | "replyTo", unknown>>;
    const replyTo = typeof loose.replyTo === "string" && replyTopicAllowed(loose.replyTo, deps) && (await deps.replyTopics.exists(loose.replyTo)) ? loose.replyTo : null;
    const reason = decoded.reason;
    // Only strings are taken from a record that failed validation: anything else may throw when converted.
    const text = (v: unknown, max: number) => (typeof v === "string" ? v.slice(0, max) : "");
    return dead(reason, decoded.message, replyTo ? { topic: replyTo, intentId: text(loose.intentId, 128), intentKey: text(loose.intentKey, 64), reason } : undefined);
  }
  const intent = decoded.value;
  if (!replyTopicAllowed(intent.replyTo, deps)) {
    return dead("reply_topic_not_allowed", `reply topic must start with ${deps.config.replyTopicPrefix}`);
  }
  if (!(await deps.replyTopics.exists(intent.replyTo))) {
    return dead("reply_topic_missing", `reply topic ${intent.replyTo} does not exist; the agent's client (or an operator) creates it, owners never do`);
  }
  const reject = (reason: RejectReason, msg: string, details?: unknown): Admission => ({
    kind: "answered",
    reason,
    effects: effects({ replies: [{ topic: intent.replyTo, value: rejectedReply(intent.intentId, intent.intentKey, reason, msg, at, details) }] }),
  });
  const tool = deps.tools.get(intent.tool);
  if (!tool) return reject("unknown_tool", `no write tool named ${intent.tool.slice(0, 128)} is admitted`);
  if (tool.recordType !== intent.entity.type) {
    return reject("entity_type_mismatch", `tool ${tool.name} writes ${tool.recordType} records, not ${intent.entity.type}`);
  }
  const params = tool.declaration.params.safeParse(intent.params);
  if (!params.success) return reject("params_invalid", params.error.message.slice(0, 2000), params.error.issues.slice(0, 10));
  const refused = intent.delta.flatMap((op) => ("from" in op ? [op.path, op.from] : [op.path])).filter((p) => !tool.isAllowedPath(p));
  if (refused.length > 0) {
    return reject("patch_path_not_allowed", `tool ${tool.name} may not touch ${refused.slice(0, 10).join(", ")}`, { paths: refused.slice(0, 10) });
  }
  return {
    kind: "admitted",
    admitted: {
      intent,
      tool,
      entityKey: entityKey(intent.entity),
      fingerprint: paramsFingerprint(tool.name, intent.entity, intent.params, tool.freeTextParams),
      deltaFingerprint: deltaFingerprint(intent.delta, tool.isFreeTextPath),
    },
  };
}

function replyTopicAllowed(topic: string, deps: AdmissionDeps): boolean {
  return topic.startsWith(deps.config.replyTopicPrefix) && topic.length > deps.config.replyTopicPrefix.length && /^[a-zA-Z0-9._-]{1,249}$/.test(topic);
}
