// One intent's run in its partition owner (docs/architecture.md §3): classify
// against the ledger, `pending` durable before the write, the pipeline's read
// and PATCH, outages paused, unexpected failures tried again and then settled
// without a write; and a person's decision on an escalation, run the same way.
import { isRegistryOutage } from "../errors.ts";
import type { Logger } from "../logger.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { isLeaseOp } from "../schemas/write-intent.ts";
import type { AdmittedIntent } from "./admission.ts";
import { deadLetterOf, effects, rejectedReply, type Effects } from "./effects.ts";
import type { OwnerContext } from "./owner-context.ts";
import type { Session, Slot } from "./owner-session.ts";
import { type LeaseBounds, type LeaseGate, leaseRefusalOf, leaseRefusalReply, settleLeaseIntent } from "./record-leases.ts";
import { rememberRefusal, rememberResolutionRefusal, repeatedRefusal, resolutionInDoubt, type SignedIntent, submissionIn } from "./refusals.ts";
import type { Plan } from "./intent-pipeline.ts";
import type { Resolver } from "./resolution.ts";
import { sorResponseBudget } from "../sor/response-budget.ts";

/** What an intent's run needs of its partition owner. */
export interface RunHost {
  readonly ctx: OwnerContext;
  readonly log: Logger;
  readonly partition: number;
  readonly resolver: Resolver;
  /** Step 3: the `pending` entry into the partition's open transaction; resolves once the broker acknowledged it. */
  stagePending(session: Session, pending: LedgerIntentEntry, opts?: { resolution?: boolean }): Promise<void>;
  /** The intent's result goes into the next transaction. */
  settle(session: Session, slot: Slot, result: Effects): Promise<void>;
  /**
   * The outage backoff after `tries`, at least `retryAfterMs` (the system's Retry-After) up to
   * `sorRetryAfterMaxMs`; ends early when the session does.
   */
  pause(session: Session, tries: number, retryAfterMs?: number): Promise<void>;
  /**
   * The slot's pause for an outage, its `slot.outages`-th in a row, as {@link pause}: meanwhile its in-flight place
   * is given back (its keys stay held) and other intents of the partition start; it resolves once the slot has a
   * place again (or the session ended).
   */
  outagePause(session: Session, slot: Slot, retryAfterMs?: number): Promise<void>;
  /** The lease gate of an intent (an expired lease it finds is released). */
  leaseGate(session: Session, a: AdmittedIntent): LeaseGate;
}

/** The bounds of what one agent holds by leases, on this partition's ledger. */
function leaseBounds(host: RunHost, session: Session): LeaseBounds {
  const { config, observe } = host.ctx;
  return { ledger: session.ledger, maxHoldMs: config.leaseMaxHoldMs, maxPerAgent: config.maxLeasesPerAgent, refused: (reason) => observe?.leaseRefused?.(host.partition, reason) };
}

export async function runIntent(host: RunHost, session: Session, slot: Slot): Promise<void> {
  if (slot.resolution) return runResolution(host, session, slot, slot.resolution);
  const a = slot.admitted!;
  const { pipeline, config } = host.ctx;
  // Counted as working (about to produce something to commit) throughout, but for its outage pauses: `durable`
  // waits for the broker's acknowledgement of the pending entry, not for a commit, so the commit loop may linger
  // for this intent's result.
  const signed = a.signed === undefined ? undefined : { digest: a.signed, intent: a.intent };
  const pending = new PendingEntry(host, session);
  const exec = {
    mayWrite: () => session.active && host.ctx.lease.confirmed(),
    durable: pending.wait,
    // Who writes: the instance, and which of its sessions (a fenced session must never write again).
    headers: { "x-writ-owner": `${config.instanceId} p${host.partition} s${session.seq}`, ...slot.trace?.headers },
  };
  while (session.active) {
    try {
      if (slot.result) return await host.settle(session, slot, slot.result);
      slot.plan ??= isLeaseOp(a.intent.lease) ? undefined : pipeline.classify(a, session.ledger);
      const plan = slot.plan;
      // The key's entry, looked up once per try (signed bytes only): the key's intents run one at a time, and this
      // run's own `pending` entry changes it only where the result writes the key's entry too, or it was pending
      // already (inherited).
      const keyEntry = signed === undefined ? undefined : session.ledger.get(pipeline.ledgerKey(a));
      // These signed bytes were refused before, on a state that may have passed: the same refusal, decided once. But
      // the key's own entry comes first: its outcome repeated, or its pending write taken up and reconciled when it
      // may be these bytes' (a write that stands is never answered "nothing written"); the memory answers all else,
      // a refusal decided now (key reuse, an undo's) and another submission's pending write included.
      const keyAnswers = signed !== undefined && plan !== undefined && keyEntryAnswers(plan, signed, keyEntry);
      const again = slot.gate === undefined && signed && !keyAnswers ? repeatedRefusal(session.ledger, signed, new Date()) : null;
      if (again) {
        slot.result = again;
        return await host.settle(session, slot, again);
      }
      // A record's lease, looked at once as the intent starts: the record's intents run one at a time.
      slot.gate ??= host.leaseGate(session, a);
      // Not for a write already under way (its `pending` entry durable: this run passed the gate). One an earlier run
      // left pending (its transaction did not commit) may have written too, but the gate is asked again: a restore
      // decides the record's lease intents afresh, so another change may hold the lease now. Refused outright, the
      // agent would hear "nothing was written" of a write that may stand, and the entry would stay pending; so it is
      // reconciled first, as every such write is, and the refusal is its answer only if it did not apply (never a
      // new write under another change's lease).
      const gateRefusal = plan && plan.kind !== "settled" && !slot.pendingDurable && !host.ctx.ablateLeases ? leaseRefusalOf(a, slot.gate) : null;
      const inherited = plan?.kind === "write" && plan.state.inherited;
      if (inherited && gateRefusal) plan.state.gateRefusal = gateRefusal;
      const refusal = gateRefusal && !inherited ? leaseRefusalReply(a, gateRefusal, new Date().toISOString()) : null;
      let step;
      if (!plan) step = await settleLeaseIntent(a, slot.gate, new Date(), exec.headers, leaseBounds(host, session));
      else if (plan.kind === "settled") step = plan;
      else if (refusal) step = { kind: "settled" as const, effects: refusal, note: "lease refused" };
      else if (plan.kind === "repeat-conflict") {
        const repeated = await pipeline.repeatConflict(a, plan, exec);
        // The record is at the version the attempt read: written after all, as a new attempt (the lease gate looked up
        // at the start decides it as it decides a write).
        if (repeated.kind === "write") {
          slot.plan = repeated;
          // The key's entry answered a repeat, so the memory was not asked; a write it does not answer: signed bytes
          // refused before (on a lease since gone, a grant since made) keep their refusal, never written later.
          const refused = signed ? repeatedRefusal(session.ledger, signed, new Date()) : null;
          if (refused) {
            slot.result = refused;
            return await host.settle(session, slot, refused);
          }
          continue;
        }
        step = repeated;
      } else {
        if (!slot.pendingDurable) {
          // Step 3 runs beside the read: only the PATCH waits for `pending` to be durable.
          pending.stage(plan.pending, {}, () => void (slot.times.durable = Date.now()));
          slot.pendingDurable = true;
        }
        step = await pipeline.execute(a, plan.pending, plan.state, exec);
        // Settling waits for the pending entry too: its transaction must not fail after the result is staged.
        await pending.wait();
      }
      if (!session.active) return;
      if (step.kind === "settled") {
        slot.result = rememberRefusal(signed, step.effects, new Date(), keyEntry);
        await host.settle(session, slot, slot.result);
        return;
      }
      if (slot.outages === 0) host.log.warn({ intentKey: a.intent.intentKey, entity: a.entityKey, reason: step.reason, retryAfterMs: step.retryAfterMs }, "system of record unavailable; pausing this intent");
      host.ctx.health.outage(a.tool.system.name, step.reason);
      // Nothing read is kept across a pause: its answers' bytes go back to the budget (the next try reads afresh).
      sorResponseBudget.letGo();
      await outagePause(host, session, slot, step.retryAfterMs);
    } catch (err) {
      if (!session.active) return;
      sorResponseBudget.letGo();
      if (pending.unstageIfFailed()) slot.pendingDurable = false;
      // A registry outage (also one a retry gave up on) is an outage: pause, never count it as a failure.
      if (isRegistryOutage(err)) {
        await outagePause(host, session, slot);
        continue;
      }
      slot.failures++;
      host.log.error({ err, intentKey: a.intent.intentKey, entity: a.entityKey, tool: a.tool.name, attempt: slot.failures }, "intent processing failed");
      if (slot.failures < config.maxProcessingAttempts) {
        await host.pause(session, slot.failures);
        continue;
      }
      // The result follows its key's `pending` entry onto the topic: a try that failed before awaiting it may have
      // left it on its way. One whose staging failed was not staged, and the result says no write was made.
      await pending.settled();
      if (!session.active) return;
      if (pending.unstageIfFailed()) slot.pendingDurable = false;
      const plan = slot.plan?.kind === "write" ? slot.plan : null;
      const step = host.ctx.pipeline.failed(a, plan && slot.pendingDurable ? plan.pending : null, plan?.state ?? null, err);
      const source = { topic: config.topics.intents, partition: host.partition, offset: slot.message.offset };
      if (step.kind === "settled") {
        step.effects.deadLetters.push(deadLetterOf(slot.message, source, "processing_failed", (err as Error)?.message ?? String(err), new Date().toISOString()));
        await host.settle(session, slot, step.effects).catch((e: unknown) => host.log.error({ err: e }, "could not settle a failed intent"));
      }
      return;
    }
  }
}

/** Whether the key's entry answers signed bytes as they run: a repeat of its outcome, or its in-doubt write theirs to take up. */
function keyEntryAnswers(plan: Plan, signed: SignedIntent, entry: LedgerIntentEntry | undefined): boolean {
  if (plan.kind === "settled") return plan.fromEntry === true;
  if (plan.kind === "repeat-conflict") return true;
  return plan.state.inherited && submissionIn(entry, signed) !== "other";
}

/** A person's decision on an escalation: planned against the ledger, and written like an intent (pending first). */
async function runResolution(host: RunHost, session: Session, slot: Slot, res: NonNullable<Slot["resolution"]>): Promise<void> {
  const { config } = host.ctx;
  // As for an intent: a pending entry that was not staged is staged again once its failure has surfaced.
  const pending = new PendingEntry(host, session);
  const exec = {
    mayWrite: () => session.active && host.ctx.lease.confirmed(),
    durable: pending.wait,
    headers: { "x-writ-owner": `${config.instanceId} p${host.partition} s${session.seq}` },
  };
  const key = res.resolution.intent.intentKey;
  // A refusal of its signed bytes is remembered for them (refusals.ts): whatever changes later (a grant, a deploy, the
  // record), they are answered so again, never carried out after the operator heard they were not. While the
  // escalation's pending apply may be theirs, no reply: dead-lettered, to be sent back and reconcile it.
  const settle = (out: Effects) => {
    const answer = rememberResolutionRefusal(res.signed, out, new Date(), out.ledger ?? session.ledger.get(key));
    if (answer.kind === "in_doubt") host.log.warn({ escalationId: res.resolution.escalationId, intentKey: key }, "resolution refused while its apply may be under way; dead-lettered outcome_unknown, no reply");
    const source = { topic: config.topics.intents, partition: host.partition, offset: slot.message.offset };
    slot.result = answer.kind === "answer" ? answer.effects : resolutionInDoubt(slot.message, source, out, new Date());
    return host.settle(session, slot, slot.result);
  };
  while (session.active) {
    try {
      if (slot.result) return await host.settle(session, slot, slot.result);
      // Refused before: that refusal again, asked before anything is decided for them.
      const again = res.plan === undefined && res.signed ? repeatedRefusal(session.ledger, res.signed, new Date(), res.replyTo) : null;
      if (again) {
        slot.result = again;
        return await host.settle(session, slot, again);
      }
      res.plan ??= host.resolver.plan(res.resolution, res.tool, res.replyTo, session.ledger, res.signed?.digest);
      const plan = res.plan;
      if (plan.kind === "settled") return await settle(plan.effects);
      if (!pending.staged) pending.stage(plan.pending, { resolution: true });
      const step = await host.resolver.apply(res.resolution, res.tool, res.replyTo, plan, exec);
      await pending.wait();
      if (!session.active) return;
      if (step.kind === "settled") {
        host.log.info({ escalationId: res.resolution.escalationId, decision: res.resolution.decision, note: step.note }, "escalation resolution carried out");
        return await settle(step.effects);
      }
      // A request that may have reached the system (an unknown outcome that asked for a wait): the next try
      // reconciles before anything, as a resumed apply does, and never writes blind.
      if (!step.notSent && !plan.resumed) res.plan = { ...plan, resumed: true };
      sorResponseBudget.letGo();
      await outagePause(host, session, slot, step.retryAfterMs);
    } catch (err) {
      if (!session.active) return;
      sorResponseBudget.letGo();
      pending.unstageIfFailed();
      if (isRegistryOutage(err)) {
        await outagePause(host, session, slot);
        continue;
      }
      slot.failures++;
      host.log.error({ err, escalationId: res.resolution.escalationId }, "resolution failed");
      if (slot.failures >= config.maxProcessingAttempts) {
        // As for an intent: the result follows the `pending` entry that may still be on its way.
        await pending.settled();
        if (!session.active) return;
        const at = new Date().toISOString();
        const reply = rejectedReply(res.resolution.resolutionId, res.resolution.intent.intentKey, "processing_failed", `the resolution failed: ${(err as Error).message}`.slice(0, 2000), at);
        // The escalation stays open: put the entry back if this resolution had reopened it.
        const back = res.plan?.kind === "apply" ? { ledger: { ...res.plan.entry, updatedAt: at } } : {};
        return await settle(effects({ ...back, replies: [{ topic: res.replyTo, value: reply }] }));
      }
      await host.pause(session, slot.failures);
    }
  }
}

/**
 * One more outage pause of the slot's: the backoff grows with the outages in a row; a Retry-After may lengthen
 * it. The slot gives its in-flight place back meanwhile: an outage of one system stops no other record.
 */
async function outagePause(host: RunHost, session: Session, slot: Slot, retryAfterMs?: number): Promise<void> {
  slot.outages++;
  await host.outagePause(session, slot, retryAfterMs);
}

/**
 * The `pending` entry of one run (step 3). Its staging may fail (its encoding met a registry outage): once the
 * failure has surfaced (the write waits for the entry, so nothing was sent), the next try stages it again. A
 * failed transaction ends the session instead.
 */
class PendingEntry {
  private readonly host: RunHost;
  private readonly session: Session;
  private durable: Promise<void> | null = null;
  private failed = false;

  constructor(host: RunHost, session: Session) {
    this.host = host;
    this.session = session;
  }

  get staged(): boolean {
    return this.durable !== null;
  }

  /** Sends the entry into the partition's open transaction; `onDurable` runs once the broker acknowledged it. */
  stage(entry: LedgerIntentEntry, opts: { resolution?: boolean }, onDurable?: () => void): void {
    const staging = this.host.stagePending(this.session, entry, opts).then(() => onDurable?.());
    staging.catch(() => void (this.failed = true));
    this.durable = staging;
  }

  /** Resolves once the entry staged is durable (at once when none is). */
  readonly wait = async (): Promise<void> => {
    if (this.durable) await this.durable;
  };

  /**
   * Resolves once the entry staged is durable or its staging failed (at once when none is); never rejects. It
   * cannot hang: a staging ends with the session at the latest (an ended session refuses its entries).
   */
  readonly settled = async (): Promise<void> => {
    await this.durable?.catch(() => undefined);
  };

  /** After a failed try: whether the staging had failed (the entry is then staged again by the next try). */
  unstageIfFailed(): boolean {
    if (!this.failed) return false;
    this.failed = false;
    this.durable = null;
    return true;
  }
}
