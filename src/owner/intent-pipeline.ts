import { randomUUID } from "node:crypto";
import { canonicalJson } from "../canonical-json.ts";
import type { RouterConfig } from "../config.ts";
import { ESCALATION_REASONS, type EscalationReason, REJECT_REASONS, type RejectReason, WritError } from "../errors.ts";
import type { LedgerView } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import type { Versioned } from "../schemas/common.ts";
import type { LedgerIntentEntry, StoredOutcome } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import type { PatchOutcome, ReconcileResult } from "../sor/adapter.ts";
import { isCommutative } from "../tools.ts";
import type { AdmittedIntent } from "./admission.ts";
import { classifyAttempt } from "./classify.ts";
import { type Effects, effects, rejectedReply } from "./effects.ts";

/** Where one intent's write stands, carried across its tries (an outage pauses it; it resumes here). */
export interface WriteState {
  /** An earlier owner left this key pending: it may have written. */
  inherited: boolean;
  /** A PATCH of this intent, here or by an earlier owner, may have reached the system. */
  mayHaveWritten: boolean;
  /** Ask the system before writing: the intent was inherited, or a PATCH's outcome was unknown. */
  needsReconcile: boolean;
  /** PATCHes whose outcome was unknown. */
  unknownRounds: number;
}

/** What the ledger says to do with an admitted intent (step 2), decided once. */
export type Plan =
  | { kind: "settled"; effects: Effects; note: string }
  /** A repeat of an attempt that was answered `conflict`: it is answered again with the record as it is now. */
  | { kind: "repeat-conflict"; entry: LedgerIntentEntry; stored: Extract<StoredOutcome, { status: "conflict" }> }
  /** Record `pending` durably (step 3), then write. */
  | { kind: "write"; pending: LedgerIntentEntry; state: WriteState };

/** The result of working on an intent: settled, or to be tried again after a pause (the system was unreachable). */
export type Step = { kind: "settled"; effects: Effects; note: string } | { kind: "retry-later"; reason: string; notSent: boolean };

export interface ExecContext {
  /** False when this owner cannot be sure it still owns the partition: no PATCH may leave then. */
  mayWrite(): boolean;
  /**
   * Resolves once the intent's `pending` entry is durable (step 3). Reads and
   * reconcile run while it commits; only the PATCH waits for it.
   */
  durable(): Promise<void>;
  /** Headers for every request to the system of record (the owner instance, trace context). */
  headers: Readonly<Record<string, string>>;
}

export interface PipelineDeps {
  config: Pick<RouterConfig, "unknownRounds">;
  log: Logger;
  now?: () => Date;
  /**
   * Ablation control for the fault suite, never for production: every
   * submission gets a ledger key of its own, so the ledger dedupes nothing.
   * `npm run test:faults -- --ablate ledger` must then report duplicates.
   */
  ablateLedger?: boolean;
  /**
   * Ablation control, never for production: no version precondition at all
   * (no strict check, If-Match on whatever the record is at). `--ablate
   * if-match` must then report lost updates.
   */
  ablateVersionCheck?: boolean;
  /** Metrics hook: a conflict was met (a 412, or a strict tool's fresh read at another version than the base). */
  observe?: { conflict(a: AdmittedIntent, cause: "precondition_failed" | "version_mismatch"): void };
}

type Reconciled = { kind: "outage"; reason: string } | { kind: "answer"; result: ReconcileResult; current: Versioned | null };

/**
 * Steps 2–5 of "The owner, per intent" for one admitted intent: it
 * classifies the intent once against the ledger, and then reads, writes and
 * reconciles, returning a per-intent outcome. It never throws for a reason
 * that belongs to the intent or its system of record: those are outcomes
 * (settled, or retry-later while a system is unreachable). What it throws is
 * a bug, which the owner counts and settles after bounded tries.
 */
export class IntentPipeline {
  private readonly deps: PipelineDeps;
  private readonly now: () => Date;

  constructor(deps: PipelineDeps) {
    this.deps = deps;
    this.now = deps.now ?? (() => new Date());
  }

  /** The ledger key of an intent: its intent key (per submission under the ledger ablation). */
  ledgerKey(a: AdmittedIntent): string {
    return this.deps.ablateLedger ? `${a.intent.intentKey}#${a.intent.intentId}` : a.intent.intentKey;
  }

  /** Step 2: what the ledger says, decided once per intent. */
  classify(a: AdmittedIntent, ledger: LedgerView): Plan {
    const { intent } = a;
    const key = this.ledgerKey(a);
    const entry = ledger.get(key);
    const verdict = classifyAttempt(entry, { fingerprint: a.fingerprint, baseVersion: intent.baseVersion, deltaFingerprint: a.deltaFingerprint });
    if (verdict === "reused") {
      const msg = "this intent key was used for a different intent (tool, entity, params or change)";
      return this.settledReply(a, this.rejected(a, "key_reused_with_different_params", msg), "key reused");
    }
    if (verdict === "repeat" && entry?.outcome) {
      const stored = entry.outcome;
      if (stored.status === "conflict") return { kind: "repeat-conflict", entry, stored };
      return this.settledReply(a, this.replayed(a, stored), "repeat answered from the ledger");
    }
    const inherited = entry?.status === "pending";
    const attempt = { baseVersion: intent.baseVersion, deltaFingerprint: a.deltaFingerprint };
    const attempts = entry ? entry.attempts.filter((x) => x.baseVersion !== attempt.baseVersion || x.deltaFingerprint !== attempt.deltaFingerprint) : [];
    attempts.push(attempt);
    const pending: LedgerIntentEntry = {
      kind: "intent",
      intentKey: key,
      intentId: intent.intentId,
      status: "pending",
      entity: intent.entity,
      tool: a.tool.name,
      agentId: intent.agent.id,
      fingerprint: a.fingerprint,
      attempts: attempts.slice(-16),
      cycles: entry?.cycles ?? 0,
      replyTo: intent.replyTo,
      updatedAt: this.now().toISOString(),
    };
    return { kind: "write", pending, state: { inherited, mayHaveWritten: inherited, needsReconcile: inherited, unknownRounds: 0 } };
  }

  /** A repeat of a conflicted attempt: the same conflict, with the record as it is now. */
  async repeatConflict(a: AdmittedIntent, plan: Extract<Plan, { kind: "repeat-conflict" }>, ctx: ExecContext): Promise<Step> {
    let current: Versioned | null;
    try {
      current = await a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
    } catch (err) {
      if (isOutage(err)) return { kind: "retry-later", reason: describe(err), notSent: true };
      current = null;
    }
    const reply: Reply = {
      ...this.conflictReply(a, plan.stored.cycle, current ?? { state: null, version: plan.stored.version }),
      duplicate: true,
    };
    return { kind: "settled", effects: effects({ replies: [{ topic: a.intent.replyTo, value: reply }] }), note: "repeat of a conflicted attempt" };
  }

  /**
   * Steps 4–5 for an intent whose `pending` entry is durable: fresh read,
   * version check, If-Match PATCH, reconcile on an unknown outcome. `state`
   * carries over between tries.
   */
  async execute(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<Step> {
    const { intent, tool } = a;
    const log = this.deps.log.child({ intentKey: intent.intentKey, entity: a.entityKey, tool: tool.name });
    for (;;) {
      if (state.needsReconcile) {
        // An earlier owner, or an earlier PATCH of ours, may have written: only a proven "not applied" writes again.
        const settled = await this.reconcile(a, ctx);
        if (settled.kind === "outage") return { kind: "retry-later", reason: settled.reason, notSent: true };
        if (settled.result === "applied") return this.applied(a, pending, settled.current, "reconcile");
        if (settled.result === "unknown") return this.escalate(a, pending, "outcome_unknown", settled.current);
        if (state.unknownRounds >= this.deps.config.unknownRounds) return this.escalate(a, pending, "outcome_unknown", settled.current);
        state.needsReconcile = false;
      }
      let current: Versioned | null;
      try {
        current = await tool.system.read(intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers });
      } catch (err) {
        if (isOutage(err)) return { kind: "retry-later", reason: describe(err), notSent: true };
        return this.protocolFailure(a, pending, state, err);
      }
      if (current === null) return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
      let ifMatch = intent.baseVersion;
      if (this.deps.ablateVersionCheck) ifMatch = current.version;
      else if (current.version !== intent.baseVersion) {
        if (tool.versionPolicy === "rebase-commutative" && isCommutative(intent.delta)) ifMatch = current.version;
        else {
          this.deps.observe?.conflict(a, "version_mismatch");
          return this.conflict(a, pending, state, current, ctx);
        }
      }
      if (tool.deriveDelta) {
        // The change may say no more than its params: rebuilt from them on the record as it is now.
        let expected: string;
        try {
          expected = canonicalJson(tool.deriveDelta(a.params, current));
        } catch (err) {
          return this.rejectedDone(a, pending, "delta_mismatch", `the tool's delta function failed on these params: ${describe(err)}`.slice(0, 2000));
        }
        if (expected !== canonicalJson(intent.delta)) {
          return this.rejectedDone(a, pending, "delta_mismatch", "the delta is not the one the params give on the current record; nothing was written");
        }
      }
      await ctx.durable();
      if (!ctx.mayWrite()) return { kind: "retry-later", reason: "ownership of the partition is not confirmed; no write leaves", notSent: true };
      let outcome: PatchOutcome;
      try {
        outcome = await tool.system.patch(intent.entity, intent.delta, { ifMatch, idempotencyKey: intent.intentKey, timeoutMs: tool.timeoutMs, headers: ctx.headers });
      } catch (err) {
        // An adapter that throws instead of answering an outcome: the request may have gone out.
        outcome = { kind: "unknown", message: `the adapter threw: ${describe(err)}` };
      }
      switch (outcome.kind) {
        case "applied":
          return this.applied(a, pending, { state: outcome.state, version: outcome.version }, "patch");
        case "precondition_failed": {
          this.deps.observe?.conflict(a, "precondition_failed");
          let fresh = outcome.current;
          if (fresh === null) {
            try {
              fresh = await tool.system.read(intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers });
            } catch (err) {
              if (isOutage(err)) return { kind: "retry-later", reason: describe(err), notSent: true };
              return this.protocolFailure(a, pending, state, err);
            }
          }
          return this.conflict(a, pending, state, fresh, ctx);
        }
        case "not_found":
          return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
        case "rejected": {
          const reason = outcome.status === 409 || outcome.status === 422 ? "patch_not_applicable" : "sor_rejected";
          return this.rejectedDone(a, pending, reason, outcome.message.slice(0, 2000), { status: outcome.status });
        }
        case "unavailable":
          // Provably never reached the system: nothing to reconcile; try again after a pause.
          return { kind: "retry-later", reason: outcome.message, notSent: true };
        case "unknown":
          log.warn({ detail: outcome.message, round: state.unknownRounds + 1 }, "write outcome unknown; reconciling");
          state.unknownRounds++;
          state.mayHaveWritten = true;
          state.needsReconcile = true;
      }
    }
  }

  /**
   * Settles an intent whose processing kept failing for a reason that is not
   * an outage (a bug, a reconcile function that throws): escalated when it
   * may have written, rejected otherwise. Never a silent drop.
   */
  failed(a: AdmittedIntent, pending: LedgerIntentEntry | null, state: WriteState | null, err: unknown): Step {
    const message = `processing failed: ${describe(err)}`.slice(0, 2000);
    if (pending && state?.mayHaveWritten) return this.escalate(a, pending, "processing_failed", null, message);
    if (pending) return this.rejectedDone(a, pending, "processing_failed", message);
    return this.settledReply(a, this.rejected(a, "processing_failed", message), "processing failed");
  }

  private async reconcile(a: AdmittedIntent, ctx: ExecContext): Promise<Reconciled> {
    let current: Versioned | null = null;
    try {
      current = await a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
      const result = await a.tool.reconcile({ intent: a.intent, current, system: a.tool.system, timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
      return { kind: "answer", result, current };
    } catch (err) {
      if (isOutage(err)) return { kind: "outage", reason: describe(err) };
      this.deps.log.warn({ err, intentKey: a.intent.intentKey }, "reconcile failed; the outcome stays unknown");
      return { kind: "answer", result: "unknown", current };
    }
  }

  private async conflict(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, current: Versioned | null, ctx: ExecContext): Promise<Step> {
    if (state.mayHaveWritten) {
      // The change may be our own: written by an owner that died or lost the partition mid-flight, or by
      // a request of ours whose outcome was unknown (a request still in flight can commit after reconcile
      // said "not applied").
      const settled = await this.reconcile(a, ctx);
      if (settled.kind === "outage") return { kind: "retry-later", reason: settled.reason, notSent: true };
      if (settled.result === "applied") return this.applied(a, pending, settled.current, "reconcile");
      // Not provably unapplied: a conflict would invite the agent to write again, maybe a second time.
      if (settled.result === "unknown") return this.escalate(a, pending, "outcome_unknown", settled.current ?? current);
      current = settled.current ?? current;
    }
    if (current === null) return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
    const cycle = pending.cycles + 1;
    if (cycle > a.tool.maxConflictCycles) return this.escalate(a, { ...pending, cycles: cycle }, "conflict_cycles_exhausted", current);
    const reply = this.conflictReply(a, cycle, current);
    const entry: LedgerIntentEntry = {
      ...pending,
      status: "conflicted",
      cycles: cycle,
      outcome: { status: "conflict", cycle, version: current.version, at: reply.at },
      updatedAt: reply.at,
    };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: "conflict" };
  }

  private conflictReply(a: AdmittedIntent, cycle: number, current: Versioned): Extract<Reply, { status: "conflict" }> {
    return {
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
  }

  private protocolFailure(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, err: unknown): Step {
    const message = `the system of record broke the protocol: ${describe(err)}`.slice(0, 2000);
    if (state.mayHaveWritten) return this.escalate(a, pending, "sor_protocol", null, message);
    return this.rejectedDone(a, pending, "sor_protocol", message);
  }

  private applied(a: AdmittedIntent, pending: LedgerIntentEntry, after: Versioned | null, via: "patch" | "reconcile"): Step {
    const at = this.now().toISOString();
    const version = after?.version ?? "unknown";
    const reply: Reply = {
      status: "applied",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at,
      entity: a.intent.entity,
      state: after?.state ?? null,
      version,
      via,
    };
    const entry: LedgerIntentEntry = { ...pending, status: "done", outcome: { status: "applied", version, via, at }, updatedAt: at };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: `applied via ${via}` };
  }

  private rejectedDone(a: AdmittedIntent, pending: LedgerIntentEntry, reason: RejectReason, message: string, details?: unknown): Step {
    const reply = this.rejected(a, reason, message, details);
    const entry: LedgerIntentEntry = { ...pending, status: "done", outcome: { status: "rejected", reason, message, at: reply.at }, updatedAt: reply.at };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: `rejected: ${reason}` };
  }

  private escalate(a: AdmittedIntent, pending: LedgerIntentEntry, reason: EscalationReason, current: Versioned | null, detail?: string): Step {
    const at = this.now().toISOString();
    const escalationId = randomUUID();
    const message =
      detail ??
      (reason === "conflict_cycles_exhausted"
        ? `Still conflicting after ${a.tool.maxConflictCycles} cycles; a person will decide.`
        : "The write's outcome could not be established; a person will check the record. Do not retry.");
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
    const entry: LedgerIntentEntry = { ...pending, status: "done", outcome: { status: "escalated", reason, message, escalationId, at }, updatedAt: at };
    return {
      kind: "settled",
      effects: effects({
        ledger: entry,
        replies: [{ topic: a.intent.replyTo, value: reply }],
        escalations: [{ key: a.entityKey, value: { escalationId, reason, message, intent: a.intent, cycles: pending.cycles, current, at } }],
      }),
      note: `escalated: ${reason}`,
    };
  }

  private rejected(a: AdmittedIntent, reason: RejectReason, message: string, details?: unknown): Reply {
    return rejectedReply(a.intent.intentId, a.intent.intentKey, reason, message, this.now().toISOString(), details);
  }

  private settledReply(a: AdmittedIntent, reply: Reply, note: string): Plan & Step {
    return { kind: "settled", effects: effects({ replies: [{ topic: a.intent.replyTo, value: reply }] }), note };
  }

  /** The reply a repeat gets from a stored outcome: the same answer, marked duplicate, without record state. */
  private replayed(a: AdmittedIntent, stored: Exclude<StoredOutcome, { status: "conflict" }>): Reply {
    const base = { intentId: a.intent.intentId, intentKey: a.intent.intentKey, duplicate: true, at: this.now().toISOString() };
    switch (stored.status) {
      case "applied":
        return { ...base, status: "applied", entity: a.intent.entity, state: null, version: stored.version, via: stored.via === "patch" ? "patch" : "reconcile" };
      case "rejected": {
        const reason = (REJECT_REASONS as readonly string[]).includes(stored.reason) ? (stored.reason as RejectReason) : "sor_rejected";
        return { ...base, status: "rejected", reason, message: stored.message };
      }
      case "escalated": {
        const reason = ESCALATION_REASONS.find((r) => r === stored.reason) ?? "outcome_unknown";
        return { ...base, status: "escalated", entity: a.intent.entity, reason, message: stored.message, escalationId: stored.escalationId };
      }
    }
  }
}

/** An error that says the system of record could not be reached: pause and try again, never settle on it. */
export function isOutage(err: unknown): boolean {
  return err instanceof WritError && err.code === "sor_unavailable" && err.retriable;
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}
