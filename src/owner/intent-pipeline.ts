import { randomUUID } from "node:crypto";
import { canonicalJson } from "../canonical-json.ts";
import type { RouterConfig } from "../config.ts";
import { type EscalationReason, type RejectReason, WritError } from "../errors.ts";
import { escalatedIntentDigest } from "../keys.ts";
import { type LedgerView, reopenable } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import { entityKey, JsonPatch, type JsonPatchOp, Version, type Versioned } from "../schemas/common.ts";
import type { LedgerIntentEntry, StoredOutcome } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import type { PatchOutcome, ReconcileResult } from "../sor/adapter.ts";
import { isCommutative } from "../tools.ts";
import { type AdmittedIntent, MAX_CLOCK_SKEW_MS } from "./admission.ts";
import { appliedUndoOf, classifyAttempt, mayHaveWritten } from "./classify.ts";
import { deltaRefusal, scopeRefusal } from "./delta-check.ts";
import { type Effects, effects, rejectedReply, replayedReply } from "./effects.ts";

/** The fields a log line about one intent's write carries. */
type LogBindings = Readonly<Record<string, string>>;

/** Refusals that say the key is in use by a request still running (Stripe's 409 for an Idempotency-Key in progress; 425). */
const IN_PROGRESS_STATUSES = new Set([409, 425]);

/** Where one intent's write stands, carried across its tries (an outage pauses it; it resumes here). */
export interface WriteState {
  /** An earlier owner left this key pending: it may have written. */
  inherited: boolean;
  /**
   * A request of this intent key (this attempt's, an earlier owner's, or one before a conflict the key's last
   * attempt was answered) may have reached the system, and may still arrive there. From then on every try
   * reconciles before it writes, and writes only on the record as that reconcile read it (§3.8); it stays set
   * until the intent settles.
   */
  mayHaveWritten: boolean;
  /** PATCHes whose outcome was unknown. */
  unknownRounds: number;
  /**
   * An inherited write (an earlier run's `pending`) that its record's lease no longer lets write: reconciled, it is
   * answered applied if it did apply, and refused with this if it did not (its entry left `pending`); never sent.
   */
  gateRefusal?: { reason: RejectReason; message: string; details?: unknown };
  /**
   * The refusal the last PATCH met while a write of this intent may have happened: reconciled before it is taken
   * for the answer (it may be about the earlier request's effect). Not kept when it says the key is in use (409,
   * 425: the earlier request still running): only more rounds settle that.
   */
  refusal?: { via: "patch" | "create"; outcome: Extract<PatchOutcome, { kind: "not_found" | "rejected" }> };
  /**
   * An undo's target, from the ledger: the undone intent's key, params and
   * the version its write produced. Absent for an undo only when an earlier
   * owner left the undo pending and the target's entry has expired since.
   */
  undo?: UndoTarget;
}

/** What an undo compensates: an applied intent of this record, as its ledger entry keeps it. */
export interface UndoTarget {
  intentKey: string;
  /** The version the undone write produced: the undo applies only on it (If-Match). */
  version: string;
  params: Record<string, unknown>;
}

/** What the ledger says to do with an admitted intent (step 2), decided once. */
export type Plan =
  /** `fromEntry`: a repeat answered from the key's entry (its stored outcome), not a refusal decided now. */
  | { kind: "settled"; effects: Effects; note: string; fromEntry?: boolean }
  /** A repeat of an attempt that was answered `conflict`: it is answered again with the record as it is now. */
  | {
      kind: "repeat-conflict";
      entry: LedgerIntentEntry;
      stored: Extract<StoredOutcome, { status: "conflict" }>;
      undo?: UndoTarget;
      /** The attempt written after all: when the record is back at, or still at, the very version it was built on. */
      write: () => WritePlan;
    }
  /** Record `pending` durably (step 3), then write. */
  | WritePlan;

/** Record `pending` durably (step 3), then write. */
export type WritePlan = { kind: "write"; pending: LedgerIntentEntry; state: WriteState };

/**
 * The result of working on an intent: settled, or to be tried again after a pause (the system was unreachable).
 * `retryAfterMs`: the system's Retry-After, which the pause waits out (up to `sorRetryAfterMaxMs`).
 */
export type Step = { kind: "settled"; effects: Effects; note: string } | RetryLater;
export type RetryLater = { kind: "retry-later"; reason: string; notSent: boolean; retryAfterMs?: number };

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
  /**
   * `sorRetryAfterMaxMs` unset: Retry-After is honoured (the owner's pause caps it). `maxIntentBytes` unset: an undo's
   * compensating change is carried in its conflict reply whatever its size (owners always pass theirs).
   */
  config: Pick<RouterConfig, "unknownRounds"> & Partial<Pick<RouterConfig, "sorRetryAfterMaxMs" | "maxIntentBytes">>;
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

type Reconciled = { kind: "outage"; step: RetryLater } | { kind: "answer"; result: ReconcileResult; current: Versioned | null };

/**
 * Steps 2–5 of the owner's pipeline for one admitted intent (see
 * docs/architecture.md §3.2 to §3.8): it
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
  ledgerKey(a: { intent: Pick<WriteIntent, "intentKey" | "intentId"> }): string {
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
      return this.keeping(a, entry, this.settledReply(a, this.rejected(a, "key_reused_with_different_params", msg), "key reused"));
    }
    const target = intent.undo ? this.undoTarget(a, ledger) : undefined;
    if (verdict === "repeat" && entry?.outcome) {
      const stored = entry.outcome;
      if (stored.status === "conflict") {
        if (target?.kind === "refused") return this.settledReply(a, this.rejected(a, target.reason, target.message, target.details), `undo refused: ${target.reason}`);
        return { kind: "repeat-conflict", entry, stored, ...(target?.kind === "target" ? { undo: target.target } : {}), write: () => this.writePlan(a, entry, target, false) };
      }
      // Only here, on a repeat of an applied write, is its undo looked up: an ordinary write costs nothing more.
      const settled = { ...this.keeping(a, entry, this.settledReply(a, this.replayed(a, stored, appliedUndoOf(ledger, intent, entry)), "repeat answered from the ledger")), fromEntry: true };
      if (entry.intentId === intent.intentId) settled.effects.redelivered = true;
      return settled;
    }
    const inherited = entry?.status === "pending";
    // An undo of nothing undoable is answered without a ledger entry (a later submission is asked again), unless
    // an earlier owner left this undo pending: then it may have written, and it is settled like any write.
    if (target?.kind === "refused" && !inherited) {
      return this.settledReply(a, this.rejected(a, target.reason, target.message, target.details), `undo refused: ${target.reason}`);
    }
    return this.writePlan(a, entry, target, inherited);
  }

  /** Steps 3–5 ahead: the `pending` entry this attempt of the key is recorded under, and its write's state. */
  private writePlan(a: AdmittedIntent, entry: LedgerIntentEntry | undefined, target: ReturnType<IntentPipeline["undoTarget"]> | undefined, inherited: boolean): WritePlan {
    const { intent } = a;
    const key = this.ledgerKey(a);
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
      // The very bytes this entry answers at admission (refusals.ts); a later submission of the key replaces it.
      ...(a.signed !== undefined ? { signedDigest: a.signed } : {}),
      attempts: attempts.slice(-16),
      cycles: entry?.cycles ?? 0,
      replyTo: intent.replyTo,
      updatedAt: this.now().toISOString(),
      // What an undo of this write will be built from; an undo itself names what it undoes instead.
      ...(a.tool.undo && !intent.undo ? { params: a.params } : {}),
      ...(intent.undo ? { undoOf: intent.undo.intentKey } : {}),
    };
    const state: WriteState = { inherited, mayHaveWritten: mayHaveWritten(entry), unknownRounds: 0 };
    if (target?.kind === "target") state.undo = target.target;
    return { kind: "write", pending, state };
  }

  /**
   * The write an undo compensates, from this record's ledger: it must be an
   * applied intent of the same tool on the same record, not itself an undo,
   * with its params kept (its tool declared an undo when it was written).
   */
  private undoTarget(a: AdmittedIntent, ledger: LedgerView): { kind: "target"; target: UndoTarget } | { kind: "refused"; reason: RejectReason; message: string; details?: unknown } {
    const key = a.intent.undo!.intentKey;
    const entry = ledger.get(key);
    const refused = (reason: RejectReason, message: string, details?: unknown) => ({ kind: "refused" as const, reason, message, ...(details === undefined ? {} : { details }) });
    if (!entry) {
      return refused("undo_target_unknown", `no write with intent key ${key} is in the ledger of ${a.entityKey.slice(0, 300)}: it was never submitted for this record, or it is older than the ledger's retention`);
    }
    if (entry.undoOf !== undefined) return refused("undo_not_declared", `intent ${key} is itself an undo; an undo is not undone`);
    if (entry.tool !== a.tool.name || entityKey(entry.entity) !== a.entityKey) {
      return refused("undo_target_mismatch", `intent ${key} was a ${entry.tool} on ${entityKey(entry.entity).slice(0, 300)}, not a ${a.tool.name} on ${a.entityKey.slice(0, 300)}`);
    }
    const outcome = entry.outcome;
    if (entry.status !== "done" || outcome?.status !== "applied") {
      const status = entry.status === "pending" ? "pending" : (outcome?.status ?? entry.status);
      const reason = outcome && "reason" in outcome ? { reason: outcome.reason } : {};
      return refused("undo_target_not_applied", `intent ${key} was not applied (${status}${"reason" in reason ? `: ${reason.reason}` : ""}); there is nothing to undo`, { status, ...reason });
    }
    if (entry.params === undefined) {
      return refused("undo_not_declared", `intent ${key} was written before ${a.tool.name} declared an undo (its params were not kept); it cannot be undone by writ`);
    }
    return { kind: "target", target: { intentKey: key, version: outcome.version, params: entry.params } };
  }

  /**
   * A repeat of a conflicted attempt: the same conflict, with the record as it is now; or, when the record is now at
   * the very version the attempt was built on, its write plan (the caller stages `pending` and writes).
   */
  async repeatConflict(a: AdmittedIntent, plan: Extract<Plan, { kind: "repeat-conflict" }>, ctx: ExecContext): Promise<Step | WritePlan> {
    let current: Versioned | null;
    try {
      current = await a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
    } catch (err) {
      if (isOutage(err)) return outageStep(err);
      current = null;
    }
    // A version writ cannot keep (a custom adapter's) is not repeated to the agent: the stored one is.
    if (current !== null && unkeepableVersion(current.version) !== null) current = null;
    // The conflict no longer describes the record: it is at the version this attempt read. Answered "conflict" with
    // it, the agent, deciding again from `current`, would build this very attempt and be answered so for ever (an
    // attempt of the key may sit in the entry's attempts without having been the one the stored conflict answered:
    // a repeat can never be told apart from that). The attempt is written instead, as a new one would be: pending,
    // reconciled first when a request of the key may still land, If-Match on this version; another conflict counts
    // a cycle, so the key still escalates after its last one. Not for an undo or a create: their base is not the
    // record's version.
    if (current !== null && !a.intent.undo && !a.tool.create && current.version === a.intent.baseVersion) return plan.write();
    const now = current ?? { state: null, version: plan.stored.version };
    const change = this.yourChange(a, plan.undo, now);
    if ("error" in change) return this.settledReply(a, this.rejected(a, "undo_failed", change.error, change.details), "undo failed");
    const reply: Reply = { ...this.conflictReply(a, plan.stored.cycle, now, change.delta), duplicate: true };
    return this.keeping(a, plan.entry, { kind: "settled" as const, effects: effects({ replies: [{ topic: a.intent.replyTo, value: reply }] }), note: "repeat of a conflicted attempt" });
  }

  /**
   * Steps 4–5 for an intent whose `pending` entry is durable: fresh read,
   * version check, If-Match PATCH, reconcile on an unknown outcome. `state`
   * carries over between tries.
   */
  async execute(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<Step> {
    if (a.intent.undo) return this.executeUndo(a, pending, state, ctx);
    if (a.tool.create) return this.executeCreate(a, pending, state, ctx);
    const { intent, tool } = a;
    // What a log line of this intent's write names (bindings, not a child logger: pino serialises a child's
    // bindings when it is made, a cost each intent would pay for a line only an unknown outcome writes).
    const about = { intentKey: intent.intentKey, entity: a.entityKey, tool: tool.name };
    for (;;) {
      const fresh = await this.reconcileThenRead(a, pending, state, ctx);
      if ("kind" in fresh) return fresh;
      const { current } = fresh;
      let ifMatch = intent.baseVersion;
      if (this.deps.ablateVersionCheck) ifMatch = current.version;
      else if (current.version !== intent.baseVersion) {
        if (tool.versionPolicy === "rebase-commutative" && isCommutative(intent.delta)) ifMatch = current.version;
        else {
          this.deps.observe?.conflict(a, "version_mismatch");
          return this.conflict(a, pending, state, current, ctx);
        }
      }
      // The ablation control removes every check of the write against the record as it is now: If-Match, and the
      // delta rebuilt from the params on the current record (for a read-modify-write that check alone also stops a
      // stale delta, so the suite's lost-update check could not fail without removing it too).
      if (tool.deriveDelta && !this.deps.ablateVersionCheck) {
        // The change may say no more than its params: rebuilt from them on the record as it is now.
        const refused = deltaRefusal(tool, a.params, current, intent.delta, {
          notCanonical: "the delta these params give on the current record cannot be compared: ",
          failed: "the tool's delta function failed on these params: ",
          mismatch: "the delta is not the one the params give on the current record; nothing was written",
        });
        if (refused) return this.rejectedDone(a, pending, refused.reason, refused.message);
      }
      const sent = await this.send(a, pending, state, ctx, about, "patch", () =>
        tool.system.patch(intent.entity, intent.delta, { ifMatch, idempotencyKey: intent.intentKey, timeoutMs: tool.timeoutMs, headers: ctx.headers }),
      );
      if (sent) return sent;
    }
  }

  /**
   * Step 5 for every kind of write, once the fresh read (if any) allowed it:
   * waits for `pending` to be durable and for the partition to be ours, sends
   * the write and settles on its outcome. Null when the outcome is unknown:
   * the caller reconciles, and writes again only on a proven "not applied".
   */
  private async send(
    a: AdmittedIntent,
    pending: LedgerIntentEntry,
    state: WriteState,
    ctx: ExecContext,
    about: LogBindings,
    via: "patch" | "create",
    request: () => Promise<PatchOutcome>,
  ): Promise<Step | null> {
    await ctx.durable();
    if (!ctx.mayWrite()) return { kind: "retry-later", reason: "ownership of the partition is not confirmed; no write leaves", notSent: true };
    let outcome: PatchOutcome;
    try {
      outcome = await request();
    } catch (err) {
      // An adapter that throws instead of answering an outcome: the request may have gone out.
      outcome = { kind: "unknown", message: `the adapter threw: ${describe(err)}` };
    }
    switch (outcome.kind) {
      case "applied":
        return this.applied(a, pending, state, { state: outcome.state, version: outcome.version }, via);
      case "precondition_failed": {
        // The version moved on; for a create, a record with this external id exists (another agent's, or, reconcile tells, ours).
        this.deps.observe?.conflict(a, "precondition_failed");
        const fresh = await this.readAfterConflict(a, pending, state, outcome.current, ctx);
        if ("kind" in fresh) return fresh;
        return this.conflict(a, pending, state, fresh.current, ctx);
      }
      case "not_found":
      case "rejected":
        // After a request whose outcome was unknown, a refusal may be about that request's own effect (a 409 "this
        // Idempotency-Key is in progress", a 422 for a change already made, a 404 for a record it moved): a
        // refusal of this request says nothing of the earlier one. Reconciled like an unknown outcome.
        if (state.mayHaveWritten) {
          this.unknownOutcome(about, state, `refused after an unknown outcome: ${outcome.kind === "rejected" ? `${outcome.status} ${outcome.message}` : "404"}`.slice(0, 2000));
          if (!(outcome.kind === "rejected" && IN_PROGRESS_STATUSES.has(outcome.status))) state.refusal = { via, outcome };
          return null;
        }
        return this.refused(a, pending, via, outcome);
      case "unavailable":
        // Provably never reached the system: nothing to reconcile; try again after a pause.
        return { kind: "retry-later", reason: outcome.message, notSent: true, ...waitAsked(outcome) };
      case "unknown": {
        this.unknownOutcome(about, state, outcome.message);
        // A 5xx that asked for a wait (Retry-After): the reconcile it needs waits too, the next try's first step.
        const wait = waitAsked(outcome);
        if (wait.retryAfterMs !== undefined && this.deps.config.sorRetryAfterMaxMs !== 0) return { kind: "retry-later", reason: outcome.message, notSent: false, ...wait };
        return null;
      }
    }
  }

  /** A write the system refused (404, or a 4xx that is no precondition): settled rejected. */
  private refused(a: AdmittedIntent, pending: LedgerIntentEntry, via: "patch" | "create", outcome: Extract<PatchOutcome, { kind: "not_found" | "rejected" }>): Step {
    if (outcome.kind === "rejected") {
      const reason = outcome.status === 409 || outcome.status === 422 ? "patch_not_applicable" : "sor_rejected";
      return this.rejectedDone(a, pending, reason, outcome.message.slice(0, 2000), { status: outcome.status });
    }
    if (via === "create") return this.rejectedDone(a, pending, "sor_rejected", `${a.tool.system.name} has no place to create ${a.intent.entity.type} records (404); nothing was created`);
    return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
  }

  /**
   * A create (a tool that declares `create`): `upsertByExternalId` with
   * `If-None-Match: *` and the intent key as Idempotency-Key (and in the
   * record's `intentKeyField`, if declared). The record's existence is the
   * precondition: a record under the external id is a conflict carrying it,
   * unless reconcile proves it is this intent's own create. An unknown
   * outcome is reconciled by looking the external id up, never replayed blind.
   */
  private async executeCreate(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<Step> {
    const { intent, tool } = a;
    const create = tool.create!;
    const about = { intentKey: intent.intentKey, entity: a.entityKey, tool: tool.name };
    // Admission checked that the delta is exactly the add of the params' body at "".
    const body = (intent.delta[0] as { value: Record<string, unknown> }).value;
    const record = create.intentKeyField === undefined ? body : { ...body, [create.intentKeyField]: intent.intentKey };
    for (;;) {
      if (state.mayHaveWritten) {
        const settled = await this.reconcileFirst(a, pending, state, ctx);
        if ("kind" in settled) return settled;
      }
      const sent = await this.send(a, pending, state, ctx, about, "create", () =>
        tool.system.upsertByExternalId!(intent.entity, record, { ifNoneMatch: "*", idempotencyKey: intent.intentKey, timeoutMs: tool.timeoutMs, headers: ctx.headers }),
      );
      if (sent) return sent;
    }
  }

  /**
   * An undo: the tool's compensating change, built from the undone intent's
   * params on the record as that write left it, PATCHed with If-Match on the
   * version the write produced (from the ledger). A record that changed since
   * is a conflict carrying its current state: nothing is undone on top of a
   * newer change.
   */
  private async executeUndo(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<Step> {
    const { intent, tool } = a;
    const target = state.undo;
    if (!target) {
      // Only an inherited pending undo gets here: it may have written, and its target's entry is gone.
      return this.escalate(a, pending, state, "outcome_unknown", null, "This undo was left pending and the undone write's ledger entry has expired since: whether the undo was applied cannot be established. A person will check the record. Do not retry.");
    }
    const about = { intentKey: intent.intentKey, entity: a.entityKey, tool: tool.name, undoOf: target.intentKey };
    for (;;) {
      const fresh = await this.reconcileThenRead(a, pending, state, ctx);
      if ("kind" in fresh) return fresh;
      const { current } = fresh;
      if (current.version !== target.version) {
        this.deps.observe?.conflict(a, "version_mismatch");
        return this.conflict(a, pending, state, current, ctx);
      }
      const change = this.undoChange(a, target, current);
      if ("error" in change) return this.rejectedDone(a, pending, "undo_failed", change.error, change.details);
      const sent = await this.send(a, pending, state, ctx, about, "patch", () =>
        tool.system.patch(intent.entity, change.delta, { ifMatch: target.version, idempotencyKey: intent.intentKey, timeoutMs: tool.timeoutMs, headers: ctx.headers }),
      );
      if (sent) return sent;
    }
  }

  /**
   * The compensating change the tool's undo gives on `current`, checked to be a JSON Patch of at least one op within
   * the tool's scope like any delta: the function builds it from params and the record, which can reach any path.
   */
  private undoChange(a: AdmittedIntent, target: UndoTarget, current: Versioned): { delta: JsonPatchOp[]; bytes: number } | { error: string; details?: unknown } {
    let raw: unknown;
    try {
      raw = a.tool.undo!(target.params, current, { intentKey: target.intentKey });
    } catch (err) {
      return { error: `the tool's undo function failed: ${describe(err)}`.slice(0, 2000) };
    }
    const parsed = JsonPatch.safeParse(raw);
    if (!parsed.success) return { error: `the tool's undo function gave no JSON Patch of at least one operation: ${parsed.error.issues[0]?.message ?? "invalid"}`.slice(0, 2000) };
    // Its `undoPaths`, else its `allowedPaths`; a create tool without `undoPaths` declares no paths (its change is a
    // whole record, `create.body`): the record its undo changes is the one it created, no narrower scope to hold it to.
    const outOfScope = a.tool.undoScope && scopeRefusal(a.tool.undoScope, parsed.data);
    if (outOfScope) return { error: `the tool's undo gave a change outside its undo paths: ${outOfScope.message}`.slice(0, 2000), details: { reason: outOfScope.reason, ...outOfScope.details } };
    let bytes: number;
    try {
      bytes = Buffer.byteLength(canonicalJson(parsed.data));
    } catch (err) {
      return { error: `the tool's undo function gave a change with no canonical form: ${describe(err)}`.slice(0, 2000) };
    }
    return { delta: parsed.data, bytes };
  }

  /**
   * What a conflict reply shows as `your_change`: the intent's delta, or for
   * an undo the compensating change as it would be built on the record now.
   * That change is the tool's, from a record of any size (an undo that puts a
   * list back copies it): one past what an intent's change may take
   * (maxIntentBytes) is not carried, since a reply without the record's state
   * must still fit the broker (and an escalation of the undo is sized by it).
   * The undo is answered `undo_failed` then: on a record changed since, it can
   * never apply anyway.
   */
  private yourChange(a: AdmittedIntent, target: UndoTarget | undefined, current: Versioned): { delta: JsonPatchOp[] } | { error: string; details: unknown } {
    if (!a.intent.undo) return { delta: a.intent.delta };
    if (!target) return { error: "the undone write's ledger entry is gone", details: { current } };
    const change = this.undoChange(a, target, current);
    if ("error" in change) return { error: change.error, details: { ...(change.details as object | undefined), current } };
    const max = this.deps.config.maxIntentBytes ?? Number.POSITIVE_INFINITY;
    if (change.bytes > max) {
      const error =
        `The record changed since the write you undo (it is now ${current.version}); nothing was undone. The undo's change on it is ${change.bytes} bytes as JSON, ` +
        `over the ${max} a change may take (WRIT_MAX_INTENT_BYTES): too large to carry in a reply. Decide again from the record.`;
      return { error, details: { version: current.version, changeBytes: change.bytes, maxBytes: max } };
    }
    return { delta: change.delta };
  }

  /**
   * Step 4's start for a change to an existing record: reconcile first where
   * a write may have happened (an earlier owner's, or an earlier request of
   * ours whose outcome was unknown: only a proven "not applied" writes again,
   * on the record reconcile read), else the fresh read. A Step when either
   * settles the intent (an absent record is `entity_not_found`).
   */
  private async reconcileThenRead(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<{ current: Versioned } | Step> {
    // Once a request of this key may have left without an outcome, every try reconciles, and what reconcile read is
    // the fresh read: until it arrives, that request can still commit after a "not applied" (the lookup speaks only
    // of the past). What keeps it harmless is the write's If-Match on the version reconcile read, the one the late
    // request can still land on: whichever of the two lands first, the other meets a 412, and a 412 after an unknown
    // outcome is reconciled again (conflict()). A second read, in this try or the next (after a pause: a 429, a
    // refused connection, an unconfirmed ownership), could take the record with the late change in it for the one
    // to write on, and a rebase-commutative tool, which writes on whatever version it read, would make it twice.
    const fresh = state.mayHaveWritten ? await this.reconcileFirst(a, pending, state, ctx) : await this.readRecord(a, pending, state, ctx);
    if ("kind" in fresh) return fresh;
    if (fresh.current === null) return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
    // Before any write: an If-Match on such a version would carry it, and the write's outcome could not be kept.
    const bad = unkeepableVersion(fresh.current.version);
    if (bad !== null) return this.protocolFailure(a, pending, state, bad);
    return { current: fresh.current };
  }

  /**
   * Reconciles before a write (an inherited pending, or an unknown outcome): a Step when that settles it, else
   * the record as reconcile read it (null: absent), to write on.
   */
  private async reconcileFirst(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<{ current: Versioned | null } | Step> {
    const settled = await this.reconcile(a, ctx, state.undo);
    if (settled.kind === "outage") return settled.step;
    if (settled.result === "applied") return this.applied(a, pending, state, settled.current, "reconcile");
    if (settled.result === "unknown") return this.escalate(a, pending, state, "outcome_unknown", settled.current);
    // Refused as the gate refuses any write, with no ledger entry: the key stays `pending` (the earlier request may
    // still land, so the next try of this key reconciles first too), and a later submission is gated again (a change
    // that takes its lease again, resumed, writes it then).
    if (state.gateRefusal) return this.settledReply(a, this.rejected(a, state.gateRefusal.reason, state.gateRefusal.message, state.gateRefusal.details), "lease refused after reconcile");
    // A refusal, then "not applied" from the reconcile after it: had the refusal been about the earlier request's
    // effect (a change already made), that effect would be there now. It stands as the answer.
    if (state.refusal) return this.refused(a, pending, state.refusal.via, state.refusal.outcome);
    if (state.unknownRounds >= this.deps.config.unknownRounds) return this.escalate(a, pending, state, "outcome_unknown", settled.current);
    return { current: settled.current };
  }

  private unknownOutcome(about: LogBindings, state: WriteState, detail: string): void {
    this.deps.log.warn({ ...about, detail, round: state.unknownRounds + 1 }, "write outcome unknown; reconciling");
    state.refusal = undefined;
    state.unknownRounds++;
    state.mayHaveWritten = true;
  }

  /** The record after a 412: as the answer carried it, else read; a Step when the read cannot be made. */
  private async readAfterConflict(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, carried: Versioned | null, ctx: ExecContext): Promise<{ current: Versioned | null } | Step> {
    return carried !== null ? { current: carried } : this.readRecord(a, pending, state, ctx);
  }

  /** A fresh read (step 4): the record (null: absent), or the Step an outage or a protocol break comes to. */
  private async readRecord(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, ctx: ExecContext): Promise<{ current: Versioned | null } | Step> {
    try {
      return { current: await a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs, headers: ctx.headers }) };
    } catch (err) {
      if (isOutage(err)) return outageStep(err);
      return this.protocolFailure(a, pending, state, err);
    }
  }

  /**
   * Settles an intent whose processing kept failing for a reason that is not
   * an outage (a bug, a reconcile function that throws): escalated when it
   * may have written, rejected otherwise. Never a silent drop.
   */
  failed(a: AdmittedIntent, pending: LedgerIntentEntry | null, state: WriteState | null, err: unknown): Step {
    const message = `processing failed: ${describe(err)}`.slice(0, 2000);
    if (pending && state?.mayHaveWritten) return this.escalate(a, pending, state, "processing_failed", null, message);
    if (pending) return this.rejectedDone(a, pending, "processing_failed", message);
    return this.settledReply(a, this.rejected(a, "processing_failed", message), "processing failed");
  }

  private async reconcile(a: AdmittedIntent, ctx: ExecContext, undo?: UndoTarget): Promise<Reconciled> {
    let current: Versioned | null = null;
    try {
      current = await a.tool.system.read(a.intent.entity, { timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
      const result = a.intent.undo ? await this.reconcileUndo(a, current, undo, ctx) : await a.tool.reconcile({ intent: a.intent, current, system: a.tool.system, timeoutMs: a.tool.timeoutMs, headers: ctx.headers });
      return { kind: "answer", result, current };
    } catch (err) {
      if (isOutage(err)) return { kind: "outage", step: outageStep(err) };
      this.deps.log.warn({ err, intentKey: a.intent.intentKey }, "reconcile failed; the outcome stays unknown");
      return { kind: "answer", result: "unknown", current };
    }
  }

  /**
   * Whether an undo was applied. The record still at the version the undone
   * write produced says "not applied" for certain (the undo is conditional on
   * it); past it, the system's idempotency-key lookup for the undo's key, else
   * the tool's reconcile function (which sees `intent.undo`), else unknown.
   */
  private async reconcileUndo(a: AdmittedIntent, current: Versioned | null, target: UndoTarget | undefined, ctx: ExecContext): Promise<ReconcileResult> {
    if (target && current !== null && current.version === target.version) return "not_applied";
    const { system, timeoutMs } = a.tool;
    if (system.capabilities.idempotencyLookup && system.lookupIdempotencyKey) {
      return system.lookupIdempotencyKey(a.intent.entity, a.intent.intentKey, { timeoutMs, headers: ctx.headers });
    }
    if (typeof a.tool.declaration.reconcile === "function") return a.tool.reconcile({ intent: a.intent, current, system, timeoutMs, headers: ctx.headers });
    return "unknown";
  }

  private async conflict(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, current: Versioned | null, ctx: ExecContext): Promise<Step> {
    if (state.mayHaveWritten) {
      // The change may be our own: written by an owner that died or lost the partition mid-flight, or by
      // a request of ours whose outcome was unknown (a request still in flight can commit after reconcile
      // said "not applied").
      const settled = await this.reconcile(a, ctx, state.undo);
      if (settled.kind === "outage") return settled.step;
      if (settled.result === "applied") return this.applied(a, pending, state, settled.current, "reconcile");
      // Not provably unapplied: a conflict would invite the agent to write again, maybe a second time.
      if (settled.result === "unknown") return this.escalate(a, pending, state, "outcome_unknown", settled.current ?? current);
      current = settled.current ?? current;
    }
    const bad = current === null ? null : unkeepableVersion(current.version);
    if (bad !== null) return this.protocolFailure(a, pending, state, bad);
    if (current === null) {
      if (a.tool.create && !a.intent.undo) {
        return this.rejectedDone(a, pending, "sor_rejected", "the system answered that a record with this external id exists, but reading it finds none; nothing was created");
      }
      return this.rejectedDone(a, pending, "entity_not_found", `${a.entityKey} does not exist`);
    }
    const change = this.yourChange(a, state.undo, current);
    if ("error" in change) return this.rejectedDone(a, pending, "undo_failed", change.error, change.details);
    const cycle = pending.cycles + 1;
    if (cycle > a.tool.maxConflictCycles) return this.escalate(a, { ...pending, cycles: cycle }, state, "conflict_cycles_exhausted", current);
    const reply = this.conflictReply(a, cycle, current, change.delta);
    // The reconcile above said "not applied", but that speaks only of the past: a request of this key still on its
    // way can land later on the version it names. Only that version being gone for good proves it never will: the
    // record moved past it (the 412, or a read at another version than the base) and versions never come back.
    // Neither is known here: an earlier owner's request named a version this owner never saw, and an ETag hashed
    // from the record comes back when the record does (a field changed and changed back; RFC 9110 asks a strong
    // validator to change with the record, not never to repeat). So the entry keeps that a request may still
    // arrive, and the key's next attempt reconciles before it writes (classify), as this attempt did.
    const marked = state.mayHaveWritten ? { mayHaveWritten: true } : {};
    const entry: LedgerIntentEntry = {
      ...pending,
      status: "conflicted",
      cycles: cycle,
      outcome: { status: "conflict", cycle, version: current.version, at: reply.at, ...marked },
      updatedAt: reply.at,
    };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: "conflict" };
  }

  private conflictReply(a: AdmittedIntent, cycle: number, current: Versioned, yourChange: JsonPatchOp[]): Extract<Reply, { status: "conflict" }> {
    const message = a.intent.undo
      ? `The record changed since the write you undo (it is now ${current.version}); nothing was undone. Decide again from current.`
      : a.tool.create
        ? `A record with external id ${a.intent.entity.id} already exists (at ${current.version}); it was not created by this intent. Decide again from current.`
        : `Record changed since you read it (you read ${a.intent.baseVersion}, it is now ${current.version}). Decide again from current.`;
    return {
      status: "conflict",
      intentId: a.intent.intentId,
      intentKey: a.intent.intentKey,
      duplicate: false,
      at: this.now().toISOString(),
      entity: a.intent.entity,
      cycle,
      message,
      current,
      your_change: yourChange,
    };
  }

  private protocolFailure(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, err: unknown): Step {
    const message = `the system of record broke the protocol: ${describe(err)}`.slice(0, 2000);
    if (state.mayHaveWritten) return this.escalate(a, pending, state, "sor_protocol", null, message);
    return this.rejectedDone(a, pending, "sor_protocol", message);
  }

  private applied(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, after: Versioned | null, via: "patch" | "create" | "reconcile"): Step {
    const bad = after === null ? null : unkeepableVersion(after.version);
    if (bad !== null) {
      // Written, with a version the ledger and the reply cannot carry: a person settles it (the write happened).
      state.mayHaveWritten = true;
      return this.protocolFailure(a, pending, state, `the write was applied, but ${bad}`);
    }
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
      tool: a.tool.name,
      ...(a.intent.undo ? { undoOf: a.intent.undo.intentKey } : {}),
    };
    const entry: LedgerIntentEntry = { ...pending, status: "done", outcome: { status: "applied", version, via, at }, updatedAt: at };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: `applied via ${via}` };
  }

  private rejectedDone(a: AdmittedIntent, pending: LedgerIntentEntry, reason: RejectReason, message: string, details?: unknown): Step {
    const reply = this.rejected(a, reason, message, details);
    const entry: LedgerIntentEntry = { ...pending, status: "done", outcome: { status: "rejected", reason, message, at: reply.at }, updatedAt: reply.at };
    return { kind: "settled", effects: effects({ ledger: entry, replies: [{ topic: a.intent.replyTo, value: reply }] }), note: `rejected: ${reason}` };
  }

  /** `state` says whether a write of the intent may have happened: the ledger keeps that for an operator's apply (§8). */
  private escalate(a: AdmittedIntent, pending: LedgerIntentEntry, state: WriteState, reason: EscalationReason, current: Versioned | null, detail?: string): Step {
    // An escalation carries the record only with a version it can keep (a custom adapter's may be any string).
    if (current !== null && unkeepableVersion(current.version) !== null) current = null;
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
    const marked = state.mayHaveWritten ? { mayHaveWritten: true } : {};
    // The intent exactly as the escalation carries it: a resolution must send back this one, not a forged copy.
    const digest = intentDigestOf(a.intent);
    const entry: LedgerIntentEntry = {
      ...pending,
      status: "done",
      outcome: { status: "escalated", reason, message, escalationId, at, ...marked, ...(digest ? { intentDigest: digest } : {}) },
      updatedAt: at,
    };
    return {
      kind: "settled",
      effects: effects({
        ledger: entry,
        replies: [{ topic: a.intent.replyTo, value: reply }],
        escalations: [{ key: a.entityKey, value: { escalationId, reason, message, intent: a.intent, cycles: pending.cycles, current, at, ...marked } }],
      }),
      note: `escalated: ${reason}`,
    };
  }

  private rejected(a: AdmittedIntent, reason: RejectReason, message: string, details?: unknown): Reply {
    return rejectedReply(a.intent.intentId, a.intent.intentKey, reason, message, this.now().toISOString(), details);
  }

  /**
   * `settled` (an answer from `entry`, which it leaves as it is) with the entry dated again when the intent's bytes
   * would outlive it. The sweep takes an entry a retention after its `updatedAt`; admission acts on bytes for the
   * retention less a margin of at least twice the clock skew it allows, from their `createdAt`. Bytes created more
   * than that skew after the entry was dated (a later submission of the key: an agent's run resumed, a key reused)
   * could come again after the sweep took it, and be written as new: re-dated now (at least their `createdAt` less
   * the skew), the entry outlives them. Entries that never expire (pending, open escalations) are left alone.
   */
  private keeping<T extends { effects: Effects }>(a: AdmittedIntent, entry: LedgerIntentEntry | undefined, settled: T): T {
    if (entry === undefined || entry.status === "pending" || reopenable(entry)) return settled;
    if (!(Date.parse(a.intent.createdAt) - Date.parse(entry.updatedAt) > MAX_CLOCK_SKEW_MS)) return settled;
    settled.effects.kept = { ...entry, updatedAt: this.now().toISOString() };
    return settled;
  }

  private settledReply(a: AdmittedIntent, reply: Reply, note: string): Plan & Step {
    return { kind: "settled", effects: effects({ replies: [{ topic: a.intent.replyTo, value: reply }] }), note };
  }

  /** The reply a repeat gets from a stored outcome: the same answer, marked duplicate, without record state. */
  private replayed(a: AdmittedIntent, stored: Exclude<StoredOutcome, { status: "conflict" }>, undoneBy?: string): Reply {
    return replayedReply(a.intent, a.tool.name, stored, this.now().toISOString(), undoneBy);
  }
}

/** An error that says the system of record could not be reached: pause and try again, never settle on it. */
export function isOutage(err: unknown): err is WritError {
  return err instanceof WritError && err.code === "sor_unavailable" && err.retriable;
}

/** The pause an outage error asks for: with the wait its answer's Retry-After gave, if any. */
export function outageStep(err: WritError): RetryLater {
  return { kind: "retry-later", reason: err.message, notSent: true, ...waitAsked(err.context) };
}

/** `{ retryAfterMs }` of an outcome or error context that carries a usable one (another adapter's too), else nothing. */
export function waitAsked(from: { retryAfterMs?: unknown }): { retryAfterMs?: number } {
  const ms = from.retryAfterMs;
  return typeof ms === "number" && Number.isFinite(ms) && ms >= 0 ? { retryAfterMs: ms } : {};
}

/**
 * Why a version a system of record answered cannot be kept, or null: the ledger, replies and escalations carry at
 * most 256 characters of it (the wire's Version). The HTTP adapter cuts an ETag there; a custom adapter may answer
 * any string, and writ would otherwise write an entry every schema refuses, or one without bound.
 */
export function unkeepableVersion(version: unknown): string | null {
  if (Version.safeParse(version).success) return null;
  const what = typeof version === "string" ? `a version of ${version.length} characters` : `a version that is no string (${typeof version})`;
  return `it answered ${what}; writ keeps versions of 1 to 256 characters (ETags)`;
}

function describe(err: unknown): string {
  if (err instanceof Error) return err.message;
  return String(err);
}

/** The escalated intent's digest; undefined for a value with no canonical form (admission refuses those: never here). */
function intentDigestOf(intent: AdmittedIntent["intent"]): string | undefined {
  try {
    return escalatedIntentDigest(intent);
  } catch {
    return undefined;
  }
}
