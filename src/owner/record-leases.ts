import type { PartitionLedger } from "../ledger/ledger-state.ts";
import type { LedgerLeaseEntry } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import { DEFAULT_LEASE_TTL_MS, LEASE_COOLDOWN_MS } from "../schemas/write-intent.ts";
import { type AdmittedIntent, freshnessRefusal, LEASE_INTENT_MAX_AGE_MS } from "./admission.ts";
import { type Effects, effects, rejectedReply } from "./effects.ts";
import { isOutage, type Step, unkeepableVersion } from "./intent-pipeline.ts";

/**
 * Leases of changes that span records (docs/architecture.md §10), as the
 * record's owner keeps them: an entry in the record's ledger partition, with
 * an expiry, written in the owner's transactions like every ledger change.
 * The key scheduler runs a record's intents one at a time, so the lease a
 * record's intent sees cannot change under it.
 */

/** What a record's lease means for one of its intents, looked at when the intent starts. */
export type LeaseGate =
  /**
   * No lease is held. `released`: the entry the record's last lease left, with the acquires it refuses as
   * replays: freed by its change's release, or (`expired`: the lease as it was) found lapsed now, what takes its
   * place (absent when it keeps no mark: a tombstone).
   */
  | { kind: "free"; expired?: LedgerLeaseEntry; released?: LedgerLeaseEntry }
  /** Held by this intent's change, for this intent's agent. */
  | { kind: "mine"; lease: LedgerLeaseEntry }
  /** Held by another change (or by the same change id for another agent). */
  | { kind: "held"; lease: LedgerLeaseEntry };

export function leaseGate(ledger: Pick<PartitionLedger, "lease">, a: AdmittedIntent, now: number): LeaseGate {
  const lease = ledger.lease(a.entityKey);
  if (!lease) return { kind: "free" };
  if (lease.releasedAt !== undefined) return { kind: "free", released: lease };
  if (Date.parse(lease.expiresAt) <= now) {
    const freed = lapsedLease(lease, now);
    return { kind: "free", expired: lease, ...(freed ? { released: freed } : {}) };
  }
  if (a.intent.lease && lease.change === a.intent.lease.change && lease.agentId === a.intent.agent.id) return { kind: "mine", lease };
  return { kind: "held", lease };
}

/**
 * Why the gate does not let a write (or an undo) change its record, or null
 * when it may go on: another change's lease is `leased`; a step of a change
 * that does not hold the lease is `lease_not_held`.
 */
export function leaseRefusalOf(a: AdmittedIntent, gate: LeaseGate): { reason: "leased" | "lease_not_held"; message: string; details?: { expiresAt: string; heldBefore?: true } } | null {
  const { intent } = a;
  if (gate.kind === "held") {
    const message = `${a.entityKey.slice(0, 300)} is leased to a change that spans records until ${gate.lease.expiresAt} at the latest; nothing was written. Submit again once it ends.`;
    return { reason: "leased", message, details: { expiresAt: gate.lease.expiresAt } };
  }
  if (intent.lease?.op === "step" && gate.kind !== "mine") {
    const why = gate.expired && gate.expired.change === intent.lease.change ? "it expired" : "it was never taken, or was released";
    return { reason: "lease_not_held", message: `this change does not hold the lease of ${a.entityKey.slice(0, 300)} (${why}); nothing was written` };
  }
  return null;
}

/**
 * The answer for a write the gate refuses ({@link leaseRefusalOf}), or null. It writes no ledger entry, so a later
 * submission is asked again.
 */
export function leaseRefusal(a: AdmittedIntent, gate: LeaseGate, at: string): Effects | null {
  const why = leaseRefusalOf(a, gate);
  return why === null ? null : leaseRefusalReply(a, why, at);
}

/** The reply of a refusal {@link leaseRefusalOf} gave. */
export function leaseRefusalReply(a: AdmittedIntent, why: NonNullable<ReturnType<typeof leaseRefusalOf>>, at: string): Effects {
  const { intent } = a;
  return effects({ replies: [{ topic: intent.replyTo, value: rejectedReply(intent.intentId, intent.intentKey, why.reason, why.message, at, why.details) }] });
}

/** What bounds what one agent holds by leases (WRIT_LEASE_MAX_HOLD_MS and its cool-down, WRIT_MAX_LEASES_PER_AGENT). */
export interface LeaseBounds {
  /** The record's ledger partition: its agents' leases, counted. */
  ledger: Pick<PartitionLedger, "leasesHeldBy" | "claimLease">;
  /** Longest an agent holds one record at a stretch, from its grant: past it, no renewal, and a cool-down. ms. */
  maxHoldMs: number;
  /** Most leases one agent holds at once on the partition's records. */
  maxPerAgent: number;
  /** An acquire refused by a bound. */
  refused?(reason: LeaseBoundReason): void;
}

/** Why an acquire was refused by a bound. */
export type LeaseBoundReason = "lease_limit" | "lease_hold_exceeded" | "lease_cooldown";

/**
 * A lease intent (`acquire` or `release`), settled: an acquire reads the
 * record (its reply carries the state and version the change builds on) and
 * grants or renews the lease, within `bounds`; a release gives it back. Both
 * are idempotent: a repeat of an acquire renews, a release of a lease not held
 * is answered as a repeat.
 */
export async function settleLeaseIntent(
  a: AdmittedIntent,
  gate: LeaseGate,
  now: Date,
  headers: Readonly<Record<string, string>>,
  bounds?: LeaseBounds,
): Promise<Step> {
  const { intent, tool } = a;
  const lease = intent.lease!;
  const at = now.toISOString();
  const reply = (value: Reply, extra: Partial<Effects> = {}, note = `lease ${lease.op}`): Step => ({ kind: "settled", effects: effects({ ...extra, replies: [{ topic: intent.replyTo, value }] }), note });
  const base = { intentId: intent.intentId, intentKey: intent.intentKey, at, entity: intent.entity, via: "lease" as const, tool: tool.name };
  if (lease.op === "acquire") {
    // Admitted in time, it may have waited past its own deadline (behind its record's intents, an outage): refused
    // as admission would refuse it now. The marks that refuse replays are kept only while admission could take one
    // (`until`, the latest such acquire's deadline), so an acquire past its deadline may find its mark gone. (A lease
    // intent's window is not the ledger's retention: no retention is passed.)
    const late = freshnessRefusal(intent, now.getTime(), 0);
    if (late?.reason === "stale") return reply(rejectedReply(intent.intentId, intent.intentKey, "stale", late.message, at));
  }
  // The replay marks of the record's earlier leases still in force: kept by every entry that follows.
  const markers = liveMarks(gate.kind === "free" ? gate.released : gate.lease, now.getTime());
  // An acquire or release of this change made before one of its earlier leases of the record ended: a replay.
  const replayed = markers.find((m) => m.change === lease.change && m.agentId === intent.agent.id && Date.parse(intent.createdAt) <= Date.parse(m.before));
  // A mark of this change and agent in force: the change held the record before (its lease released, or lapsed), and
  // its leases are all taken before its first step, so an earlier run of it may have written. A refused acquire says
  // so (`details.heldBefore`): its client, started anew, must not answer "nothing was written". Never another agent's.
  const heldBefore = lease.op === "acquire" && markers.some((m) => m.change === lease.change && m.agentId === intent.agent.id);
  /** An acquire's refusal, `details.heldBefore` added when the change held the record before. */
  const refuse = (value: Reply, note?: string): Step => reply(heldBefore && value.status === "rejected" ? { ...value, details: { ...(value.details as object | undefined), heldBefore: true } } : value, {}, note);
  if (lease.op === "release") {
    if (gate.kind !== "mine") return reply({ ...base, status: "applied", duplicate: true, state: null, version: "unknown", lease: { change: lease.change, released: true } });
    // The release that ended an earlier lease, its bytes produced again: the lease the change holds now (taken
    // again, made after) is not the one it ended, and stays.
    if (replayed) {
      const msg = `this release of ${a.entityKey.slice(0, 300)} was made before its change's earlier lease of the record ended (the mark: ${replayed.before}): a replay of its bytes; the lease its change holds now stays`;
      return reply(rejectedReply(intent.intentId, intent.intentKey, "lease_replayed", msg, at));
    }
    // Not a tombstone: the entry stays free, refusing this change's acquires made before its release (their signed
    // bytes produced again) for as long as admission would take them, then goes (the sweep). Keyed by the release's
    // createdAt, on the agent's own clock as its acquires are: a new acquire of the change, made after, is taken.
    const released = freedLease(gate.lease, replayMark(lease.change, intent.agent.id, intent.createdAt), now.getTime());
    return reply({ ...base, status: "applied", duplicate: false, state: null, version: "unknown", lease: { change: lease.change, released: true } }, { lease: { entityKey: a.entityKey, entry: released } });
  }
  const held = leaseRefusalOf(a, gate);
  if (held) return refuse(rejectedReply(intent.intentId, intent.intentKey, held.reason, held.message, at, held.details), "lease refused");
  if (replayed) {
    // The mark is this change's and agent's, so the change held the record before: said as on every refused acquire
    // (a client started anew whose clock is behind its earlier run's makes acquires the mark takes for replays).
    const msg = `this acquire of ${a.entityKey.slice(0, 300)} was made before its change released the record, or its lease lapsed (the mark: ${replayed.before}): a replay of its bytes; nothing was taken. A change that needs the record again sends a new acquire`;
    return refuse(rejectedReply(intent.intentId, intent.intentKey, "lease_replayed", msg, at));
  }
  // The agent's own lease of the record that ended within the cool-down: a new grant continues its hold.
  const earlier = gate.kind === "free" ? heldLately(gate.released, intent.agent.id, now.getTime()) : null;
  const bound = bounds && leaseBoundRefusal(a, gate, bounds, now.getTime(), earlier);
  if (bound) return refuse(bound);
  let current;
  try {
    current = await tool.system.read(intent.entity, { timeoutMs: tool.timeoutMs, headers });
  } catch (err) {
    if (isOutage(err)) return { kind: "retry-later", reason: (err as Error).message, notSent: true };
    return refuse(rejectedReply(intent.intentId, intent.intentKey, "sor_protocol", `the system of record broke the protocol: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000), at));
  }
  if (current === null) return refuse(rejectedReply(intent.intentId, intent.intentKey, "entity_not_found", `${a.entityKey.slice(0, 300)} does not exist; a change leases records that exist`, at));
  const badVersion = unkeepableVersion(current.version);
  if (badVersion !== null) return refuse(rejectedReply(intent.intentId, intent.intentKey, "sor_protocol", `the system of record broke the protocol: ${badVersion}`, at));
  const expiresAt = new Date(now.getTime() + (lease.ttlMs ?? DEFAULT_LEASE_TTL_MS)).toISOString();
  if (bounds && gate.kind !== "mine") {
    // Asked again, the grant counted at once: the agent's other acquires of the partition ran while this one read.
    const over = leaseBoundRefusal(a, gate, bounds, now.getTime(), earlier);
    if (over) return refuse(over);
    bounds.ledger.claimLease(a.entityKey, intent.agent.id, Date.parse(expiresAt));
  }
  const entry: LedgerLeaseEntry = {
    kind: "lease",
    entity: intent.entity,
    change: lease.change,
    agentId: intent.agent.id,
    replyTo: intent.replyTo,
    // A renewal keeps its grant's; a grant soon after the agent's own lease of the record ended continues that hold
    // (released and taken again at once, the hold would start anew and never reach the bound).
    acquiredAt: gate.kind === "mine" ? gate.lease.acquiredAt : (earlier?.acquiredAt ?? at),
    expiresAt,
    updatedAt: at,
    // The latest acquire's createdAt (a replayed older one renewing it moves nothing back): if the lease lapses,
    // the change's acquires up to it are marked as replays.
    lastAcquireCreatedAt: gate.kind === "mine" && gate.lease.lastAcquireCreatedAt !== undefined && Date.parse(gate.lease.lastAcquireCreatedAt) > Date.parse(intent.createdAt) ? gate.lease.lastAcquireCreatedAt : intent.createdAt,
    ...(markers.length > 0 ? { released: markers } : {}),
  };
  // Granted while a mark of the change and agent is in force: said too (`lease.heldBefore`), as a refusal says it. Its
  // other records' marks may be gone (a record keeps the latest marks only), so a refusal there need not say it.
  return reply(
    { ...base, status: "applied", duplicate: false, state: current.state, version: current.version, lease: { change: lease.change, expiresAt, ...(heldBefore ? { heldBefore: true } : {}) } },
    { lease: { entityKey: a.entityKey, entry } },
  );
}

/**
 * The agent's own lease of the record (`released`: the entry its last lease left) if it ended less than
 * {@link LEASE_COOLDOWN_MS} before `now`: its hold's start, its end (`releasedAt`: a release, or a lapse's expiry) and
 * its change. Null for another agent's, an older one, or none.
 */
function heldLately(released: LedgerLeaseEntry | undefined, agentId: string, now: number): { acquiredAt: string; until: number; change: string } | null {
  if (released?.releasedAt === undefined || released.agentId !== agentId) return null;
  const until = Date.parse(released.releasedAt) + LEASE_COOLDOWN_MS;
  return now < until ? { acquiredAt: released.acquiredAt, until, change: released.change } : null;
}

/**
 * The refusal of an acquire past a bound (before its record is read, so it costs the system nothing), or null. A
 * renewal (the lease is the change's) past `maxHoldMs` from its grant is `lease_hold_exceeded`: not renewed, the lease
 * stays the change's until it lapses, so the change can still undo its steps under it (docs/architecture.md §10.3).
 * A new grant that would continue the agent's hold of the record (`earlier`: its own lease of it ended within the
 * cool-down) past `maxHoldMs` within its time to live is `lease_cooldown`: the record is kept from it until the
 * cool-down after that end, then a grant begins a new hold. So a continuation granted is never refused at a renewal
 * within its first time to live.
 * A new grant to an agent holding `maxPerAgent` live leases on the partition's records is `lease_limit`.
 */
function leaseBoundRefusal(a: AdmittedIntent, gate: LeaseGate, bounds: LeaseBounds, now: number, earlier: ReturnType<typeof heldLately>): Reply | null {
  const { intent } = a;
  const at = new Date(now).toISOString();
  if (gate.kind === "mine") {
    const { acquiredAt, expiresAt } = gate.lease;
    if (!(now > Date.parse(acquiredAt) + bounds.maxHoldMs)) return null;
    bounds.refused?.("lease_hold_exceeded");
    const msg = `this change has held the lease of ${a.entityKey.slice(0, 300)} since ${acquiredAt} (with its agent's leases of it taken again within ${LEASE_COOLDOWN_MS} ms of the last one's end), the longest owners let one agent hold a record (WRIT_LEASE_MAX_HOLD_MS, ${bounds.maxHoldMs} ms): not renewed. It stays the change's until ${expiresAt}, then lapses; end the change before then`;
    return rejectedReply(intent.intentId, intent.intentKey, "lease_hold_exceeded", msg, at, { acquiredAt, maxHoldMs: bounds.maxHoldMs, expiresAt });
  }
  // A continuation granted must live its whole first time to live within the hold: granted nearer the bound, its
  // first renewal would be refused lease_hold_exceeded and its change compensated after holding the record seconds.
  // Refused instead, the agent waits out the cool-down (at most LEASE_COOLDOWN_MS) and begins a new hold.
  if (earlier !== null && now + (intent.lease?.ttlMs ?? DEFAULT_LEASE_TTL_MS) > Date.parse(earlier.acquiredAt) + bounds.maxHoldMs) {
    bounds.refused?.("lease_cooldown");
    const until = new Date(earlier.until).toISOString();
    const msg = `agent ${intent.agent.id.slice(0, 128)} has held ${a.entityKey.slice(0, 300)} since ${earlier.acquiredAt}: a lease granted now would run past the longest hold owners allow (WRIT_LEASE_MAX_HOLD_MS, ${bounds.maxHoldMs} ms) within its time to live, so it is kept from the agent until ${until}, and other agents' writes and changes get it; nothing was taken. Acquire it again after then`;
    return rejectedReply(intent.intentId, intent.intentKey, "lease_cooldown", msg, at, { acquiredAt: earlier.acquiredAt, maxHoldMs: bounds.maxHoldMs, until, change: earlier.change });
  }
  const held = bounds.ledger.leasesHeldBy(intent.agent.id, now);
  if (held < bounds.maxPerAgent) return null;
  bounds.refused?.("lease_limit");
  const msg = `agent ${intent.agent.id.slice(0, 128)} holds ${held} leases on records of the partition of ${a.entityKey.slice(0, 300)}, the most owners let one agent hold there (WRIT_MAX_LEASES_PER_AGENT, ${bounds.maxPerAgent}); nothing was taken. Its other changes must end first`;
  return rejectedReply(intent.intentId, intent.intentKey, "lease_limit", msg, at, { held, max: bounds.maxPerAgent });
}

/** Most replay marks a record's lease entry keeps (the latest): releases or lapses of as many changes within an acquire's age. */
export const MAX_RELEASE_MARKERS = 64;

type ReplayMark = NonNullable<LedgerLeaseEntry["released"]>[number];

/**
 * What a lease the owner finds past its end (at `now`) becomes: a held lease that lapsed is freed as its release
 * would free it, its change's acquires up to its latest (`lastAcquireCreatedAt`; an entry of an owner before it:
 * `updatedAt`, the owner's clock at its last grant) marked as replays; a released one keeps the marks still in
 * force. Null (a tombstone) when none is.
 */
export function lapsedLease(lease: LedgerLeaseEntry, now: number): LedgerLeaseEntry | null {
  const mark = lease.releasedAt === undefined ? replayMark(lease.change, lease.agentId, lease.lastAcquireCreatedAt ?? lease.updatedAt) : null;
  return freedLease(lease, mark, now);
}

/**
 * The entry a lease leaves when it ends (released, or lapsed): free (`releasedAt`, when it ended: its release, or its
 * own expiry for a lapse found later; `expiresAt` now, so an older owner sees it lapsed), its agent, change and
 * `acquiredAt` kept (what the cool-down after it is decided on, §10.3), with `mark` for its change (replacing an
 * earlier one of the change and agent) and the marks it carried still in force at `now`, the latest
 * {@link MAX_RELEASE_MARKERS}. Null (a tombstone) when no mark is in force and its cool-down is past: no acquire one
 * refuses can be admitted any more, and no grant to its agent continues its hold.
 */
function freedLease(lease: LedgerLeaseEntry, mark: ReplayMark | null, now: number): LedgerLeaseEntry | null {
  const kept = liveMarks(lease, now).filter((m) => mark === null || m.change !== mark.change || m.agentId !== mark.agentId);
  const marks = (mark !== null && Date.parse(mark.until) >= now ? [...kept, mark] : kept).slice(-MAX_RELEASE_MARKERS);
  const ended = lease.releasedAt ?? new Date(Math.min(now, Date.parse(lease.expiresAt))).toISOString();
  if (marks.length === 0 && !(Date.parse(ended) + LEASE_COOLDOWN_MS > now)) return null;
  const at = new Date(now).toISOString();
  const { released: _carried, ...rest } = lease;
  return { ...rest, expiresAt: at, updatedAt: at, releasedAt: ended, ...(marks.length > 0 ? { released: marks } : {}) };
}

/**
 * The mark refusing `agentId`'s acquires of `change` created at or before `before` (that agent's clock) as replays,
 * until `until`: the deadline of the latest of them, past which admission refuses them `stale`.
 */
function replayMark(change: string, agentId: string, before: string): ReplayMark {
  return { change, agentId, before, until: new Date(Date.parse(before) + LEASE_INTENT_MAX_AGE_MS).toISOString() };
}

/**
 * The replay marks of a record's lease entry (held, released or lapsed) still in force at `now`: each until every
 * acquire it refuses is past its own deadline (`until` at or after `now`; the sweep takes an entry once all of its
 * are before).
 */
function liveMarks(entry: LedgerLeaseEntry | undefined, now: number): ReplayMark[] {
  return (entry?.released ?? []).filter((m) => Date.parse(m.until) >= now);
}
