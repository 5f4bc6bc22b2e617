import { randomUUID } from "node:crypto";
import type { KafkaMessage } from "kafkajs";
import type { WireCodec } from "../codec.ts";
import { type RejectReason, WritError } from "../errors.ts";
import { deltaFingerprint, paramsFingerprint } from "../keys.ts";
import type { LedgerTransaction } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import { retry } from "../retry.ts";
import { entityKey, type Versioned } from "../schemas/common.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import type { PatchOutcome, ReconcileResult } from "../sor/adapter.ts";
import { type AdmittedTool, isCommutative } from "../tools.ts";
import { classifyAttempt, type LedgerVerdict } from "./classify.ts";
import type { BatchOutputs } from "./outputs.ts";

export interface ProcessorDeps {
  tools: ReadonlyMap<string, AdmittedTool>;
  codec: WireCodec;
  replyTopicPrefix: string;
  intentsTopic: string;
  log: Logger;
  now?: () => Date;
  /** Test hook: called after the PATCH answered and before the batch commits (crash-point injection). */
  afterPatch?: (intent: WriteIntent, outcome: PatchOutcome) => void | Promise<void>;
}

/** A decoded, admitted intent, ready for the ledger. */
export interface AcceptedIntent {
  kind: "accepted";
  intent: WriteIntent;
  tool: AdmittedTool;
  fingerprint: string;
  deltaFingerprint: string;
}

export type Decoded = AcceptedIntent | { kind: "answered" };

/** How many times a PATCH that never reached the system is tried again. */
const UNAVAILABLE_ATTEMPTS = 5;
/** Rounds of PATCH → unknown → reconcile "not applied" → PATCH before escalating. */
const UNKNOWN_ROUNDS = 3;

/**
 * Steps 1–5 of "The owner, per intent" (DESIGN.md), for one partition's
 * batch. It stages ledger changes and outputs; the caller commits them in one
 * Kafka transaction with the consumed offset (step 6).
 */
export class IntentProcessor {
  private readonly deps: ProcessorDeps;
  private readonly now: () => Date;

  constructor(deps: ProcessorDeps) {
    this.deps = deps;
    this.now = deps.now ?? (() => new Date());
  }

  /** Step 1: decode and validate. Bad input is answered here and the partition moves on. */
  async decode(message: KafkaMessage, partition: number, out: BatchOutputs): Promise<Decoded> {
    const decoded = await this.deps.codec.decode("WriteIntent", message.value);
    const source = { topic: this.deps.intentsTopic, partition, offset: message.offset };
    if (!decoded.ok) {
      const loose = (decoded.parsed ?? {}) as Partial<Record<"intentId" | "intentKey" | "replyTo", unknown>>;
      const replyTo = typeof loose.replyTo === "string" && this.replyTopicAllowed(loose.replyTo) ? loose.replyTo : null;
      this.deadLetter(message, source, decoded.reason, decoded.message, out);
      if (replyTo) {
        this.reply(out, replyTo, this.rejected(String(loose.intentId ?? ""), String(loose.intentKey ?? ""), decoded.reason, decoded.message));
      }
      this.deps.log.warn({ ...source, reason: decoded.reason, detail: decoded.message }, "intent rejected at decode");
      return { kind: "answered" };
    }
    const intent = decoded.value;
    if (!this.replyTopicAllowed(intent.replyTo)) {
      this.deadLetter(message, source, "reply_topic_not_allowed", `reply topic must start with ${this.deps.replyTopicPrefix}`, out);
      return { kind: "answered" };
    }
    const reject = (reason: RejectReason, msg: string, details?: unknown): Decoded => {
      this.reply(out, intent.replyTo, this.rejected(intent.intentId, intent.intentKey, reason, msg, details));
      return { kind: "answered" };
    };
    const tool = this.deps.tools.get(intent.tool);
    if (!tool) return reject("unknown_tool", `no write tool named ${intent.tool} is admitted`);
    if (tool.recordType !== intent.entity.type) {
      return reject("entity_type_mismatch", `tool ${tool.name} writes ${tool.recordType} records, not ${intent.entity.type}`);
    }
    const params = tool.declaration.params.safeParse(intent.params);
    if (!params.success) return reject("params_invalid", params.error.message, params.error.issues);
    const refused = intent.delta.flatMap((op) => ("from" in op ? [op.path, op.from] : [op.path])).filter((p) => !tool.isAllowedPath(p));
    if (refused.length > 0) return reject("patch_path_not_allowed", `tool ${tool.name} may not touch ${refused.join(", ")}`, { paths: refused });
    return {
      kind: "accepted",
      intent,
      tool,
      fingerprint: paramsFingerprint(tool.name, intent.entity, intent.params, tool.freeTextParams),
      deltaFingerprint: deltaFingerprint(intent.delta, tool.isFreeTextPath),
    };
  }

  /**
   * Step 3, planned for the whole batch: the `pending` entry to write before
   * the system of record is called, or null when this intent needs no write.
   */
  planPending(a: AcceptedIntent, ledger: LedgerTransaction): LedgerIntentEntry | null {
    const entry = ledger.get(a.intent.intentKey);
    const verdict = this.classify(a, entry);
    if (verdict !== "write") return null;
    const attempt = { baseVersion: a.intent.baseVersion, deltaFingerprint: a.deltaFingerprint };
    const attempts = entry ? [...entry.attempts] : [];
    if (!attempts.some((x) => x.baseVersion === attempt.baseVersion && x.deltaFingerprint === attempt.deltaFingerprint)) attempts.push(attempt);
    return {
      kind: "intent",
      intentKey: a.intent.intentKey,
      intentId: a.intent.intentId,
      status: "pending",
      entity: a.intent.entity,
      tool: a.tool.name,
      fingerprint: a.fingerprint,
      attempts: attempts.slice(-16),
      cycles: entry?.cycles ?? 0,
      replyTo: a.intent.replyTo,
      updatedAt: this.now().toISOString(),
    };
  }

  /** Step 2: what the ledger says to do with this intent. */
  private classify(a: AcceptedIntent, entry: LedgerIntentEntry | undefined): LedgerVerdict {
    return classifyAttempt(entry, { fingerprint: a.fingerprint, baseVersion: a.intent.baseVersion, deltaFingerprint: a.deltaFingerprint });
  }

  /**
   * Steps 2–5 for one intent, in partition order. `inherited` names keys that
   * were pending before this batch: an earlier owner may have written them.
   */
  async process(a: AcceptedIntent, ledger: LedgerTransaction, inherited: ReadonlySet<string>, out: BatchOutputs): Promise<void> {
    const { intent, tool } = a;
    const log = this.deps.log.child({ intentKey: intent.intentKey, entity: entityKey(intent.entity), tool: tool.name });
    const entry = ledger.get(intent.intentKey);
    const verdict = this.classify(a, entry);
    if (verdict === "reused" || (verdict === "repeat" && !entry?.reply)) {
      const msg = "this intent key was used for a different intent (tool, entity, params or change)";
      this.reply(out, intent.replyTo, this.rejected(intent.intentId, intent.intentKey, "key_reused_with_different_params", msg));
      return;
    }
    if (verdict === "repeat") {
      this.reply(out, intent.replyTo, { ...entry!.reply!, intentId: intent.intentId, duplicate: true, at: this.now().toISOString() });
      log.debug("repeat answered from the ledger");
      return;
    }
    const pending = entry!;
    if (pending.status !== "pending") throw new Error(`ledger: ${intent.intentKey} should be pending, is ${pending.status}`);

    if (inherited.has(intent.intentKey)) {
      // An earlier owner recorded pending and may have written: only a proven "not applied" may write again.
      const settled = await this.reconcile(a);
      if (settled.result === "applied") return this.finishApplied(a, pending, ledger, out, settled.current, "reconcile");
      if (settled.result === "unknown") return this.escalate(a, pending, ledger, out, "outcome_unknown", settled.current);
    }

    // An earlier owner, or an earlier round whose outcome was unknown, may have written after all: a
    // conflict is then checked against the system before it is reported (a request still in flight can
    // commit after reconcile said "not applied").
    const mayHaveWritten = (round: number) => round > 1 || inherited.has(intent.intentKey);
    for (let round = 1; ; round++) {
      const current = await this.read(a);
      if (current === null) return this.finishRejected(a, pending, ledger, out, "entity_not_found", `${entityKey(intent.entity)} does not exist`);
      let ifMatch = intent.baseVersion;
      if (current.version !== intent.baseVersion) {
        if (tool.versionPolicy === "rebase-commutative" && isCommutative(intent.delta)) ifMatch = current.version;
        else return this.conflict(a, pending, ledger, out, current, mayHaveWritten(round));
      }
      const outcome = await this.patch(a, ifMatch);
      await this.deps.afterPatch?.(intent, outcome);
      switch (outcome.kind) {
        case "applied":
          return this.finishApplied(a, pending, ledger, out, { state: outcome.state, version: outcome.version }, "patch");
        case "precondition_failed":
          return this.conflict(a, pending, ledger, out, outcome.current ?? (await this.read(a)), mayHaveWritten(round));
        case "not_found":
          return this.finishRejected(a, pending, ledger, out, "entity_not_found", `${entityKey(intent.entity)} does not exist`);
        case "rejected":
          return this.finishRejected(a, pending, ledger, out, outcome.status === 409 || outcome.status === 422 ? "patch_not_applicable" : "sor_rejected", outcome.message, {
            status: outcome.status,
          });
        case "unavailable":
          throw new WritError("sor_unavailable", outcome.message, { retriable: true, context: { intentKey: intent.intentKey } });
        case "unknown": {
          log.warn({ detail: outcome.message, round }, "write outcome unknown; reconciling");
          const settled = await this.reconcile(a);
          if (settled.result === "applied") return this.finishApplied(a, pending, ledger, out, settled.current, "reconcile");
          if (settled.result === "unknown" || round >= UNKNOWN_ROUNDS) {
            return this.escalate(a, pending, ledger, out, "outcome_unknown", settled.current);
          }
          // Proven not applied: this layer, and only this one, writes again.
        }
      }
    }
  }

  private async read(a: AcceptedIntent): Promise<Versioned | null> {
    return retry(() => a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs }), { maxAttempts: 4, initialDelayMs: 200 });
  }

  private async patch(a: AcceptedIntent, ifMatch: string): Promise<PatchOutcome> {
    // Only `unavailable` (never reached the system) is retried here; anything sent is settled by reconcile.
    let outcome: PatchOutcome = { kind: "unavailable", message: "not tried" };
    for (let attempt = 1; attempt <= UNAVAILABLE_ATTEMPTS; attempt++) {
      outcome = await a.tool.system.patch(a.intent.entity, a.intent.delta, {
        ifMatch,
        idempotencyKey: a.intent.intentKey,
        timeoutMs: a.tool.timeoutMs,
      });
      if (outcome.kind !== "unavailable") return outcome;
      await new Promise((r) => setTimeout(r, Math.min(2000, 100 * 2 ** attempt)));
    }
    return outcome;
  }

  private async reconcile(a: AcceptedIntent): Promise<{ result: ReconcileResult; current: Versioned | null }> {
    let current: Versioned | null = null;
    try {
      current = await this.read(a);
      const result = await a.tool.reconcile({ intent: a.intent, current, system: a.tool.system });
      return { result, current };
    } catch (err) {
      this.deps.log.warn({ err, intentKey: a.intent.intentKey }, "reconcile failed");
      return { result: "unknown", current };
    }
  }

  private async conflict(
    a: AcceptedIntent,
    pending: LedgerIntentEntry,
    ledger: LedgerTransaction,
    out: BatchOutputs,
    current: Versioned | null,
    mayHaveWritten: boolean,
  ): Promise<void> {
    if (mayHaveWritten) {
      // The change may be our own: written by an owner that died or lost the partition mid-flight, or by
      // a request of ours whose outcome was unknown.
      const settled = await this.reconcile(a);
      if (settled.result === "applied") return this.finishApplied(a, pending, ledger, out, settled.current, "reconcile");
      current = settled.current ?? current;
    }
    if (current === null) return this.finishRejected(a, pending, ledger, out, "entity_not_found", `${entityKey(a.intent.entity)} does not exist`);
    const cycle = pending.cycles + 1;
    if (cycle > a.tool.maxConflictCycles) return this.escalate(a, { ...pending, cycles: cycle }, ledger, out, "conflict_cycles_exhausted", current);
    const reply: Reply = {
      status: "conflict",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at: this.now().toISOString(),
      entity: a.intent.entity,
      cycle,
      message: `Record changed since you read it (you read ${a.intent.baseVersion}, it is now ${current.version}). Decide again from current.`,
      current,
      your_change: a.intent.delta,
    };
    ledger.put({ ...pending, status: "conflicted", cycles: cycle, reply, updatedAt: reply.at });
    this.reply(out, a.intent.replyTo, reply);
  }

  private finishApplied(
    a: AcceptedIntent,
    pending: LedgerIntentEntry,
    ledger: LedgerTransaction,
    out: BatchOutputs,
    after: Versioned | null,
    via: "patch" | "reconcile",
  ): void {
    const reply: Reply = {
      status: "applied",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at: this.now().toISOString(),
      entity: a.intent.entity,
      state: after?.state ?? null,
      version: after?.version ?? "unknown",
      via,
    };
    ledger.put({ ...pending, status: "done", reply, updatedAt: reply.at });
    this.reply(out, a.intent.replyTo, reply);
  }

  private finishRejected(
    a: AcceptedIntent,
    pending: LedgerIntentEntry,
    ledger: LedgerTransaction,
    out: BatchOutputs,
    reason: RejectReason,
    message: string,
    details?: unknown,
  ): void {
    const reply = this.rejected(a.intent.intentId, a.intent.intentKey, reason, message, details);
    ledger.put({ ...pending, status: "done", reply, updatedAt: reply.at });
    this.reply(out, a.intent.replyTo, reply);
  }

  private escalate(
    a: AcceptedIntent,
    pending: LedgerIntentEntry,
    ledger: LedgerTransaction,
    out: BatchOutputs,
    reason: "conflict_cycles_exhausted" | "outcome_unknown",
    current: Versioned | null,
  ): void {
    const at = this.now().toISOString();
    const escalationId = randomUUID();
    const message =
      reason === "conflict_cycles_exhausted"
        ? `Still conflicting after ${a.tool.maxConflictCycles} cycles; a person will decide.`
        : "The write's outcome could not be established; a person will check the record. Do not retry.";
    out.escalations.push({
      key: entityKey(a.intent.entity),
      value: { escalationId, reason, message, intent: a.intent, cycles: pending.cycles, current, at },
    });
    const reply: Reply = {
      status: "escalated",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at,
      entity: a.intent.entity,
      reason,
      message,
      escalationId,
    };
    ledger.put({ ...pending, status: "done", reply, updatedAt: at });
    this.reply(out, a.intent.replyTo, reply);
  }

  private rejected(intentId: string, intentKey: string, reason: RejectReason, message: string, details?: unknown): Reply {
    return {
      status: "rejected",
      intentId,
      intentKey,
      duplicate: false,
      at: this.now().toISOString(),
      reason,
      message,
      ...(details === undefined ? {} : { details }),
    };
  }

  private reply(out: BatchOutputs, topic: string, value: Reply): void {
    out.replies.push({ topic, key: value.intentId, value });
  }

  private deadLetter(
    message: KafkaMessage,
    source: { topic: string; partition: number; offset: string },
    reason: "undecodable" | "schema_invalid" | "reply_topic_not_allowed",
    detail: string,
    out: BatchOutputs,
  ): void {
    const headers: Record<string, string> = {};
    for (const [k, v] of Object.entries(message.headers ?? {})) if (v !== undefined) headers[k] = Array.isArray(v) ? v.map(String).join(",") : String(v);
    out.deadLetters.push({
      key: message.key?.toString("utf8") ?? null,
      value: {
        reason,
        message: detail,
        source,
        key: message.key?.toString("utf8") ?? null,
        valueBase64: (message.value ?? Buffer.alloc(0)).toString("base64"),
        headers,
        at: this.now().toISOString(),
      },
    });
  }

  private replyTopicAllowed(topic: string): boolean {
    return topic.startsWith(this.deps.replyTopicPrefix) && /^[a-zA-Z0-9._-]{1,249}$/.test(topic);
  }
}
