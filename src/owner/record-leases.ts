import type { PartitionLedger } from "../ledger/ledger-state.ts";
import type { LedgerLeaseEntry } from "../schemas/ledger-entry.ts";
import type { Reply } from "../schemas/reply.ts";
import { DEFAULT_LEASE_TTL_MS } from "../schemas/write-intent.ts";
import { type AdmittedIntent, maxIntentAgeMs } from "./admission.ts";
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
   * No lease is held (an expired one is released first: `expired`; `released`: the entry its last change's
   * release left, with the acquires it refuses as replays).
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
  if (Date.parse(lease.expiresAt) <= now) return { kind: "free", expired: lease };
  if (a.intent.lease && lease.change === a.intent.lease.change && lease.agentId === a.intent.agent.id) return { kind: "mine", lease };
  return { kind: "held", lease };
}

/**
 * The answer for a write (or an undo) that would change a record the gate
 * does not let it change, or null when it may go on: another change's lease
 * is `leased`; a step of a change that does not hold the lease is
 * `lease_not_held`. Neither writes a ledger entry, so a later submission is
 * asked again.
 */
export function leaseRefusal(a: AdmittedIntent, gate: LeaseGate, at: string): Effects | null {
  const { intent } = a;
  if (gate.kind === "held") {
    const msg = `${a.entityKey.slice(0, 300)} is leased to a change that spans records until ${gate.lease.expiresAt} at the latest; nothing was written. Submit again once it ends.`;
    return effects({ replies: [{ topic: intent.replyTo, value: rejectedReply(intent.intentId, intent.intentKey, "leased", msg, at, { expiresAt: gate.lease.expiresAt }) }] });
  }
  if (intent.lease?.op === "step" && gate.kind !== "mine") {
    const why = gate.expired && gate.expired.change === intent.lease.change ? "it expired" : "it was never taken, or was released";
    const msg = `this change does not hold the lease of ${a.entityKey.slice(0, 300)} (${why}); nothing was written`;
    return effects({ replies: [{ topic: intent.replyTo, value: rejectedReply(intent.intentId, intent.intentKey, "lease_not_held", msg, at) }] });
  }
  return null;
}

/**
 * A lease intent (`acquire` or `release`), settled: an acquire reads the
 * record (its reply carries the state and version the change builds on) and
 * grants or renews the lease; a release gives it back. Both are idempotent:
 * a repeat of an acquire renews, a release of a lease not held is answered as
 * a repeat.
 */
export async function settleLeaseIntent(
  a: AdmittedIntent,
  gate: LeaseGate,
  now: Date,
  headers: Readonly<Record<string, string>>,
): Promise<Step> {
  const { intent, tool } = a;
  const lease = intent.lease!;
  const at = now.toISOString();
  const reply = (value: Reply, extra: Partial<Effects> = {}): Step => ({ kind: "settled", effects: effects({ ...extra, replies: [{ topic: intent.replyTo, value }] }), note: `lease ${lease.op}` });
  const base = { intentId: intent.intentId, intentKey: intent.intentKey, at, entity: intent.entity, via: "lease" as const, tool: tool.name };
  // The replay markers of the record's earlier releases still in force: kept by every entry that follows.
  const markers = liveMarkers(gate, now.getTime());
  if (lease.op === "release") {
    if (gate.kind !== "mine") return reply({ ...base, status: "applied", duplicate: true, state: null, version: "unknown", lease: { change: lease.change, released: true } });
    // Not a tombstone: the entry stays free, refusing this change's acquires made before its release (their signed
    // bytes produced again) for as long as admission would take them, then goes (the sweep). Keyed by the release's
    // createdAt, on the agent's own clock as its acquires are: a new acquire of the change, made after, is taken.
    const marker = { change: lease.change, agentId: intent.agent.id, before: intent.createdAt, until: new Date(Date.parse(intent.createdAt) + maxIntentAgeMs(intent, 0)).toISOString() };
    const kept = markers.filter((m) => m.change !== marker.change || m.agentId !== marker.agentId);
    const released: LedgerLeaseEntry = { ...gate.lease, expiresAt: at, updatedAt: at, releasedAt: at, released: [...kept, marker].slice(-MAX_RELEASE_MARKERS) };
    return reply({ ...base, status: "applied", duplicate: false, state: null, version: "unknown", lease: { change: lease.change, released: true } }, { lease: { entityKey: a.entityKey, entry: released } });
  }
  const refused = leaseRefusal(a, gate, at);
  if (refused) return { kind: "settled", effects: refused, note: "lease refused" };
  const replayed = markers.find((m) => m.change === lease.change && m.agentId === intent.agent.id && Date.parse(intent.createdAt) <= Date.parse(m.before));
  if (replayed) {
    const msg = `this acquire of ${a.entityKey.slice(0, 300)} was made before its change released the record (at ${replayed.before}): a replay of its bytes; nothing was taken. A change that needs the record again sends a new acquire`;
    return reply(rejectedReply(intent.intentId, intent.intentKey, "lease_replayed", msg, at));
  }
  let current;
  try {
    current = await tool.system.read(intent.entity, { timeoutMs: tool.timeoutMs, headers });
  } catch (err) {
    if (isOutage(err)) return { kind: "retry-later", reason: (err as Error).message, notSent: true };
    return reply(rejectedReply(intent.intentId, intent.intentKey, "sor_protocol", `the system of record broke the protocol: ${(err as Error)?.message ?? String(err)}`.slice(0, 2000), at));
  }
  if (current === null) return reply(rejectedReply(intent.intentId, intent.intentKey, "entity_not_found", `${a.entityKey.slice(0, 300)} does not exist; a change leases records that exist`, at));
  const badVersion = unkeepableVersion(current.version);
  if (badVersion !== null) return reply(rejectedReply(intent.intentId, intent.intentKey, "sor_protocol", `the system of record broke the protocol: ${badVersion}`, at));
  const expiresAt = new Date(now.getTime() + (lease.ttlMs ?? DEFAULT_LEASE_TTL_MS)).toISOString();
  const entry: LedgerLeaseEntry = {
    kind: "lease",
    entity: intent.entity,
    change: lease.change,
    agentId: intent.agent.id,
    replyTo: intent.replyTo,
    acquiredAt: gate.kind === "mine" ? gate.lease.acquiredAt : at,
    expiresAt,
    updatedAt: at,
    ...(markers.length > 0 ? { released: markers } : {}),
  };
  return reply(
    { ...base, status: "applied", duplicate: false, state: current.state, version: current.version, lease: { change: lease.change, expiresAt } },
    { lease: { entityKey: a.entityKey, entry } },
  );
}

/** Most release markers a record's lease entry keeps (the latest): releases of as many changes within an acquire's age. */
export const MAX_RELEASE_MARKERS = 32;

/** The release markers of the record's lease entry (held, released or lapsed) still in force at `now`. */
function liveMarkers(gate: LeaseGate, now: number): NonNullable<LedgerLeaseEntry["released"]> {
  const entry = gate.kind === "free" ? (gate.released ?? gate.expired) : gate.lease;
  return (entry?.released ?? []).filter((m) => Date.parse(m.until) > now);
}
