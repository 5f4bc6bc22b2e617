import type { RejectReason } from "../errors.ts";
import { escalatedIntentDigest } from "../keys.ts";
import type { LedgerView } from "../ledger/ledger-state.ts";
import type { JsonPatchOp, Versioned } from "../schemas/common.ts";
import { escalationMayHaveWritten, type LedgerIntentEntry, type StoredOutcome } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import type { Resolution } from "../schemas/resolution.ts";
import { type AdmittedTool, isCommutative } from "../tools.ts";
import { intentFingerprints, parsedParams } from "./admission.ts";
import { deltaRefusal, scopeRefusal } from "./delta-check.ts";
import { type Effects, effects, rejectedReply } from "./effects.ts";
import { type ExecContext, isOutage, outageStep, type Step, unkeepableVersion, waitAsked } from "./intent-pipeline.ts";

/** What the ledger says about a resolution: nothing to do (answered), close the case without a write, or write. */
export type ResolvePlan =
  | { kind: "settled"; effects: Effects; note: string }
  /**
   * `entry`: the escalation as it stands open (what a refusal puts back);
   * `resumed`: an earlier attempt at this escalation's resolution staged its
   * `pending` entry and may have written before its owner stopped, so the
   * outcome is settled by reconciling first, never by writing again blind.
   */
  | { kind: "apply"; entry: LedgerIntentEntry; pending: LedgerIntentEntry; resumed: boolean };

/**
 * Carries out a person's decision on an escalation, as the record's owner:
 * the only one allowed to write it, and the one whose ledger says whether the
 * escalation is still open. See src/schemas/resolution.ts.
 */
export class Resolver {
  private readonly now: () => Date;
  private readonly retryAfterMaxMs: number | undefined;

  /** `retryAfterMaxMs`: the owner's `sorRetryAfterMaxMs` (0: a system's Retry-After is ignored; unset: honoured). */
  constructor(opts: { now?: () => Date; retryAfterMaxMs?: number } = {}) {
    this.now = opts.now ?? (() => new Date());
    this.retryAfterMaxMs = opts.retryAfterMaxMs;
  }

  /**
   * `signedDigest`: the digest of the operator's signed bytes (admission.ts signedResolution), kept on the pending
   * entry an apply stages (`resolutionDigest`): whose apply is under way, which a refusal of other bytes is weighed by
   * (refusals.ts rememberResolutionRefusal).
   */
  plan(r: Resolution, tool: AdmittedTool, replyTo: string, ledger: LedgerView, signedDigest?: string): ResolvePlan {
    const entry = withoutApplier(ledger.get(r.intent.intentKey));
    const at = this.now().toISOString();
    const toOperator = (reason: RejectReason, message: string): ResolvePlan => ({
      kind: "settled",
      effects: effects({ replies: [{ topic: replyTo, value: rejectedReply(r.resolutionId, r.intent.intentKey, reason, message, at) }] }),
      note: `resolution refused: ${reason}`,
    });
    const ofThisEscalation = entry?.outcome?.status === "escalated" && entry.outcome.escalationId === r.escalationId;
    const open = entry?.status === "done" && ofThisEscalation;
    // Pending with the escalation still recorded: an `apply` was under way when its owner stopped (its result never
    // committed). The resolution record is read again from the committed offset and lands here: settle it.
    const resumed = entry?.status === "pending" && ofThisEscalation;
    if (!entry || !(open || resumed)) return toOperator("resolution_not_applicable", `escalation ${r.escalationId.slice(0, 128)} of intent ${r.intent.intentKey.slice(0, 64)} is not open (already resolved, or not this intent's)`);
    // The escalation's own intent, byte for byte as its owner wrote it to writ.human (free text and intent id too):
    // a copy forged under the real escalation id would otherwise have its text written and its intent id answered.
    // Entries of owners before the digest are checked by the fingerprints below only.
    const digest = entry.outcome?.status === "escalated" ? entry.outcome.intentDigest : undefined;
    if (digest !== undefined && !digestIs(r.intent, digest)) {
      return toOperator("resolution_not_applicable", "the resolution's intent is not the escalated intent: it differs from the one its escalation carried (a forged escalation record?)");
    }
    // The operator decides on the intent the ledger escalated, not on another one sent alongside.
    let prints: { fingerprint: string; deltaFingerprint: string };
    try {
      prints = intentFingerprints(tool, r.intent);
    } catch {
      return toOperator("resolution_not_applicable", "the resolution's intent has no canonical form: it is not the escalated one");
    }
    if (prints.fingerprint !== entry.fingerprint || entry.tool !== tool.name) {
      return toOperator("resolution_not_applicable", "the resolution's intent is not the escalated one");
    }
    // Its delta and base too: the intent is copied from a writ.human record, which any producer can forge under a
    // real escalation id, and an apply of an appending change writes that delta. It must be an attempt the ledger
    // holds for this key (free-text values aside, as the key's attempts record them).
    if (!entry.attempts.some((x) => x.baseVersion === r.intent.baseVersion && x.deltaFingerprint === prints.deltaFingerprint)) {
      return toOperator("resolution_not_applicable", "the resolution's intent is not the escalated one: its delta or base version is none the ledger holds for this intent key (a forged escalation record?)");
    }
    if (r.decision === "apply") {
      // A create or an undo is not a delta an operator can rebase onto the record as it is now.
      if (tool.create || r.intent.undo) return toOperator("resolution_not_applicable", `an escalated ${r.intent.undo ? "undo" : "create"} cannot be applied by an operator: discard it, or return it to its agent to decide again`);
      if (r.baseVersion === undefined) return toOperator("params_invalid", "apply needs the baseVersion the operator decided on");
      const pending: LedgerIntentEntry = { ...entry, status: "pending", updatedAt: at, ...(signedDigest === undefined ? {} : { resolutionDigest: signedDigest }) };
      return { kind: "apply", entry: { ...entry, status: "done" }, pending, resumed };
    }
    const reason: RejectReason = r.decision === "discard" ? "escalation_discarded" : "returned_by_operator";
    const message =
      r.message ??
      (r.decision === "discard" ? "A person decided this write will not be made." : "A person handed this write back to you: decide again from the current record.");
    // Discarding or returning an escalation whose apply was under way: that write may have happened, and only an apply
    // (which reconciles first) can tell. The operator hears so; the escalation stays as it is.
    if (resumed) return toOperator("resolution_not_applicable", "an apply of this escalation was under way when its owner stopped; apply it again (it reconciles first, never writes twice)");
    return this.close(r, entry, replyTo, reason, `${message}`.slice(0, 2000), at);
  }

  /** `apply`: the change rebuilt on the record as the operator saw it, If-Match that version. */
  async apply(r: Resolution, tool: AdmittedTool, replyTo: string, plan: Extract<ResolvePlan, { kind: "apply" }>, ctx: ExecContext): Promise<Step> {
    const { entry } = plan;
    const at = () => this.now().toISOString();
    // A write of this intent may have happened (before the escalation, or by an earlier apply of it): reconcile
    // first, and an escalation put back open keeps saying so, whatever its reason.
    let mayHaveWritten = plan.resumed || escalationMayHaveWritten(entry.outcome);
    const reopen = (reason: RejectReason, message: string, current?: Versioned | null, refused?: object): Step => {
      // A record whose version writ cannot keep (a custom adapter's) is not carried.
      if (current && unkeepableVersion(current.version) !== null) current = null;
      // The record as read (the operator decides again on it; the console shows it), beside the refusal's own details.
      const details = current || refused ? { ...refused, ...(current ? { current } : {}) } : undefined;
      return {
        kind: "settled",
        // The escalation stays open: the entry goes back to what it was (marked when a write may have happened).
        effects: effects({
          ledger: { ...entry, ...(mayHaveWritten && entry.outcome?.status === "escalated" ? { outcome: { ...entry.outcome, mayHaveWritten: true } } : {}), updatedAt: at() },
          replies: [{ topic: replyTo, value: rejectedReply(r.resolutionId, r.intent.intentKey, reason, message, at(), details) }],
        }),
        note: `resolution not applied: ${reason}`,
      };
    };
    let current: Versioned | null;
    try {
      if (mayHaveWritten) {
        // The escalated write may have happened after all: never write it twice.
        const before = await tool.system.read(r.intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers });
        const settled = await tool.reconcile({ intent: r.intent, current: before, system: tool.system, timeoutMs: tool.timeoutMs, headers: ctx.headers });
        if (settled === "applied") return this.applied(r, entry, replyTo, before, "reconcile");
        if (settled === "unknown") return reopen("resolution_not_applicable", "the escalated write's outcome is still unknown at the system of record; check the record and discard or return it");
      }
      current = await tool.system.read(r.intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers });
    } catch (err) {
      if (isOutage(err)) return outageStep(err);
      return reopen("sor_protocol", `the system of record broke the protocol: ${(err as Error).message}`.slice(0, 2000));
    }
    if (current === null) return reopen("entity_not_found", `${r.intent.entity.type}:${r.intent.entity.id} does not exist`);
    const badVersion = unkeepableVersion(current.version);
    if (badVersion !== null) return reopen("sor_protocol", `the system of record broke the protocol: ${badVersion}`);
    if (current.version !== r.baseVersion) {
      return reopen("resolution_conflict", `the record changed since you decided (you saw ${r.baseVersion}, it is now ${current.version}); decide again`, current);
    }
    // The params as the tool's schema gives them (defaults, transforms), as the agent's own write is built and checked
    // from: the schema deployed now, which may refuse what it admitted before the escalation. The escalation stays open.
    const params = parsedParams(tool, r.intent.params);
    if (!params.ok) return reopen("params_invalid", `${params.message}: nothing was written, the escalation stays open; discard it, or return it to its agent`.slice(0, 2000), current, params.issues ? { issues: params.issues } : undefined);
    let delta: JsonPatchOp[] | null;
    try {
      delta = r.delta ?? (tool.deriveDelta ? tool.deriveDelta(params.data, current) : isCommutative(r.intent.delta) ? r.intent.delta : null);
    } catch (err) {
      // The tool's code on the record as it is now: a throw is an answer to the operator, never a retried failure.
      const why = err instanceof Error ? err.message : String(err);
      return reopen("delta_mismatch", `the tool's delta function failed on the intent's params and the current record: ${why}`.slice(0, 2000), current);
    }
    if (delta === null) {
      return reopen(
        "resolution_delta_required",
        `tool ${r.intent.tool} has no delta function to rebuild its change on the current record: send the change to apply as the resolution's delta (writ escalations resolve --apply --delta '<json patch>', or the clients' resolve(…, delta))`,
        current,
      );
    }
    // Whoever decides, and wherever the change comes from (the operator's delta, the tool's rebuilt on the record now,
    // the agent's append), it is written with writ's authority at the system of record: within the tool's scope, as
    // an agent's intent is at admission (the same check), or not at all.
    const outOfScope = scopeRefusal(tool, delta);
    if (outOfScope) {
      const next = r.delta ? "send a change within them" : "the change rebuilt for it goes beyond the tool's declaration: discard or return it";
      return reopen(outOfScope.reason, `${outOfScope.message} (its allowedPaths): nothing was written, the escalation stays open; ${next}`, current, outOfScope.details);
    }
    if (tool.deriveDelta && r.delta) {
      const refused = deltaRefusal(tool, params.data, current, r.delta, {
        notCanonical: "the delta the intent's params give on the current record cannot be compared: ",
        failed: "the tool's delta function failed on the intent's params: ",
        mismatch: "the delta is not the one the intent's params give on the current record",
      });
      if (refused) return reopen(refused.reason, refused.message);
    }
    await ctx.durable();
    if (!ctx.mayWrite()) return { kind: "retry-later", reason: "ownership of the partition is not confirmed; no write leaves", notSent: true };
    let outcome;
    try {
      outcome = await tool.system.patch(r.intent.entity, delta, { ifMatch: current.version, idempotencyKey: r.intent.intentKey, timeoutMs: tool.timeoutMs, headers: ctx.headers });
    } catch (err) {
      outcome = { kind: "unknown" as const, message: (err as Error).message };
    }
    switch (outcome.kind) {
      case "applied":
        return this.applied(r, entry, replyTo, { state: outcome.state, version: outcome.version }, "patch");
      case "precondition_failed": {
        // The operator decides again on the record as it is: the answer's, else a read (best effort: without it,
        // the refusal still stands).
        const now = outcome.current ?? (await tool.system.read(r.intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers }).catch(() => null));
        return reopen("resolution_conflict", "the record changed while the decision was being applied; decide again", now);
      }
      case "unavailable":
        return { kind: "retry-later", reason: outcome.message, notSent: true, ...waitAsked(outcome) };
      case "unknown": {
        // Settled the same way as any unknown outcome, but by the operator: never replayed blind.
        mayHaveWritten = true;
        // A 5xx that asked for a wait (Retry-After): the reconcile waits too, as an intent's does. The next try
        // reconciles first (the caller marks the plan resumed: a write may have happened).
        const wait = waitAsked(outcome);
        if (wait.retryAfterMs !== undefined && this.retryAfterMaxMs !== 0) return { kind: "retry-later", reason: outcome.message, notSent: false, ...wait };
        let after: Versioned | null = null;
        try {
          after = await tool.system.read(r.intent.entity, { timeoutMs: tool.timeoutMs, headers: ctx.headers });
          if ((await tool.reconcile({ intent: r.intent, current: after, system: tool.system, timeoutMs: tool.timeoutMs, headers: ctx.headers })) === "applied") {
            return this.applied(r, entry, replyTo, after, "reconcile");
          }
        } catch {
          // falls through: the operator is told the outcome is unknown
        }
        return reopen("resolution_not_applicable", `the write's outcome is unknown (${outcome.message}); check the record before deciding again`, after);
      }
      default:
        return reopen(outcome.kind === "not_found" ? "entity_not_found" : "sor_rejected", `the system of record refused the write (${outcome.kind})`);
    }
  }

  private applied(r: Resolution, entry: LedgerIntentEntry, replyTo: string, after: Versioned | null, via: "patch" | "reconcile"): Step {
    const at = this.now().toISOString();
    // Written, but answered with a version writ cannot keep (a custom adapter's): recorded as a write whose answer
    // gave none, so the escalation closes (reopened, its next apply would reconcile to the same answer for good).
    if (after !== null && unkeepableVersion(after.version) !== null) after = null;
    const version = after?.version ?? "unknown";
    const reply = (intentId: string): Reply => ({
      status: "applied",
      intentId,
      intentKey: r.intent.intentKey,
      duplicate: false,
      at,
      entity: r.intent.entity,
      state: after?.state ?? null,
      version,
      via,
      resolvedBy: r.operator.id,
    });
    return this.resolved(r, entry, replyTo, { status: "applied", version, via, at, resolvedBy: r.operator.id }, at, reply, "escalation resolved: applied");
  }

  private close(r: Resolution, entry: LedgerIntentEntry, replyTo: string, reason: RejectReason, message: string, at: string): ResolvePlan {
    const reply = (intentId: string): Reply => ({ ...rejectedReply(intentId, r.intent.intentKey, reason, message, at), resolvedBy: r.operator.id });
    return this.resolved(r, entry, replyTo, { status: "rejected", reason, message, at, resolvedBy: r.operator.id }, at, reply, `escalation resolved: ${r.decision}`);
  }

  /** The escalation closed with `outcome`: its entry done, and `reply` to the intent's agent and to the operator. */
  private resolved(
    r: Resolution,
    entry: LedgerIntentEntry,
    replyTo: string,
    outcome: StoredOutcome,
    at: string,
    reply: (intentId: string) => Reply,
    note: string,
  ): { kind: "settled"; effects: Effects; note: string } {
    return {
      kind: "settled",
      effects: effects({
        ledger: { ...entry, status: "done", outcome, updatedAt: at },
        replies: [
          // The escalated submission's id, as the ledger keeps it: never one a resolution's copy of the intent names.
          { topic: entry.replyTo, value: reply(entry.intentId) },
          { topic: replyTo, value: reply(r.resolutionId) },
        ],
      }),
      note,
    };
  }
}

/** `entry` without `resolutionDigest`: whose apply it was pending for is no part of what a resolution writes back. */
function withoutApplier(entry: LedgerIntentEntry | undefined): LedgerIntentEntry | undefined {
  if (entry?.resolutionDigest === undefined) return entry;
  const { resolutionDigest: _, ...rest } = entry;
  return rest;
}

function digestIs(intent: Resolution["intent"], digest: string): boolean {
  try {
    return escalatedIntentDigest(intent) === digest;
  } catch {
    return false;
  }
}
