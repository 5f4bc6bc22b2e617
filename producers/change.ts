import { randomUUID } from "node:crypto";
import { changeId, leaseIntentKey, type KeyedTool } from "../src/keys.ts";
import { backoffMs } from "../src/retry.ts";
import { entityKey, type EntityRef, type JsonPatchOp, type Versioned } from "../src/schemas/common.ts";
import type { Reply } from "../src/schemas/reply.ts";
import { MAX_TIMER_MS } from "../src/config.ts";
import { WritError } from "../src/errors.ts";
import { DEFAULT_LEASE_TTL_MS, LEASE_VERSION, MAX_LEASE_TTL_MS, MIN_LEASE_TTL_MS, type WriteIntent } from "../src/schemas/write-intent.ts";
import type { SubmitResult, WritClient } from "./writ-client.ts";
import { buildUndoIntent } from "./writ-client.ts";

/**
 * Changes that span records (docs/architecture.md §10): a saga whose
 * coordinator is the agent's own client, with leases held by the records'
 * owners so that no other write lands on a record between the change's steps.
 *
 * 1. Each record's lease is taken through its owner, in entity-key order (two
 *    changes over the same records never wait on each other in a cycle).
 * 2. Each step is an intent of its own (key from the change's run and step
 *    plus the step's name), built on the record as its lease acquire read it
 *    and marked as a step of the change: its owner refuses it unless the
 *    change holds the record's lease.
 * 3. A step that is not applied triggers the declared undos of the steps
 *    already applied, newest first, under the same leases.
 * 4. The leases are released; a lease the change does not release (its agent
 *    stalled or crashed) expires, and its owner counts it.
 *
 * Every intent of a change has a key derived from the change, so calling
 * `change()` again with the same run and step resumes it after a crash: the
 * leases are the change's own again, and applied steps are answered from the
 * ledger. A resumed change whose lease is not taken again does not end
 * `not_started` when it is known to have run (see {@link ChangeResult}): by
 * this client's memory, or by its owners (`heldBefore` on an acquire's answer: a
 * refusal's `details`, a grant's `lease`; the change held the record before,
 * while the record keeps that mark: 15 minutes from its release, or for a lapse
 * from the lease's latest acquire by the agent's clock, and only among the
 * record's latest 64 marks; counted also after one of the run's own acquires
 * of the record had no answer, and whatever its value but absent, null or
 * false: unsure, `incomplete`). This client's memory of its `not_started` runs
 * (also a run that threw before any step was built) overrides the owners' only
 * when `heldBefore` is said only of records those runs took (the marks are
 * their own releases), never a refusal `lease_hold_exceeded` or `lease_cooldown`
 * naming the change. A run known so to be a resume whose lease is lost (or its
 * read refused) before a step is sent ends `incomplete`, every step possibly
 * standing: compensating would undo only this run's steps, not the earlier
 * run's from that step on.
 */

/** One step: a write to one record, built on that record as the change's lease found it. */
export interface ChangeStep {
  /**
   * Unique within the change: part of the step's intent key, as `<change step id>/<name>`. No `/`: change
   * `a` with step `b/c` and change `a/b` with step `c` would share their steps' intent keys, and the second
   * change's write would be answered as the first's duplicate.
   */
  name: string;
  tool: KeyedTool;
  entity: EntityRef;
  params: Record<string, unknown>;
  /**
   * The delta, or a function of the record as it is when the step runs (under the lease). A record too large
   * for the owner to send back in a reply cannot be given to a function: that step is refused
   * `state_unavailable`, nothing written, and the change is compensated.
   */
  delta: JsonPatchOp[] | ((current: Versioned) => JsonPatchOp[]);
}

export interface ChangeInput {
  runId: string;
  /** The harness's step id of the whole change: with the run, it makes the change's id. */
  stepId: string;
  steps: ChangeStep[];
  /** Lease lifetime from each grant or renewal (ms; default 60 000). It must outlast an owner's failover. */
  leaseTtlMs?: number;
  /** How long to wait for a record another change holds before giving up with nothing written (ms; default 30 000). */
  waitForLeaseMs?: number;
  /** Deadline for each submission (ms; default the client's). */
  timeoutMs?: number;
  /** How long one intent of the change is asked again while its outcome is unknown (ms; default 120 000). */
  settleWithinMs?: number;
}

export type ChangeResult =
  /**
   * Every step applied; `steps` holds their replies in step order. A change this client saw applied, called again
   * when a lease cannot be taken, is answered from its memory: its steps' replies as repeats (`duplicate`, no state),
   * as they are answered when the leases are taken again. The memory does not see a step undone since (`writ undo`,
   * `client.undo()`): only owners do, when the leases are taken again (the change then ends `compensated`).
   */
  | { status: "applied"; change: string; steps: Reply[] }
  /**
   * A step was not applied, or was answered as undone since (`undoneBy`: the change was compensated before, by a run
   * this client does not remember); every step this run applied before it was undone. Nothing of the change remains.
   */
  | { status: "compensated"; change: string; failed: { step: string; result: SubmitResult }; undone: Reply[] }
  /**
   * A record stayed leased to another change (or kept from this agent, `lease_cooldown`) for `waitForLeaseMs`, or
   * could not be leased (`lease_limit`: the agent holds as many leases as owners allow); nothing was written. Never
   * the answer to a change known to have run: one whose lease is refused `lease_hold_exceeded` (it holds it), or
   * `lease_cooldown` after its own hold, or after `heldBefore` on an answer to its acquires (owners say it held a
   * record before: an earlier run, whose lease was released or lapsed), or that this client left `incomplete` before (or whose run threw
   * after a step was built to be sent), ends `incomplete`; one it saw `applied` is answered `applied`. One it saw
   * `compensated` has nothing standing: `not_started` is true of it; one it saw `not_started` (or whose run threw
   * before any step was built, no answer saying it ran before) too, unless `heldBefore` (any value but absent, null or
   * false) is said of a record none of those runs took (then an earlier run's mark: `incomplete`), or an acquire is
   * refused `lease_hold_exceeded` or `lease_cooldown` naming it. Owners keep what says a change
   * held a record for 15 minutes from its lease's end (its release, or its latest acquire when it lapsed, by the
   * agent's clock), the latest 64 such marks per record; an owner of an earlier writ version says nothing: a client
   * started anew that resumes a change later than that, whose lease another change took meanwhile, ends `not_started`
   * for this call, and the earlier run's steps may stand.
   */
  | { status: "not_started"; change: string; entity: EntityRef; result: SubmitResult }
  /**
   * Not settled: an intent's outcome stayed unknown, or an undo was not applied, or a resumed change could not take
   * its leases again, or lost one (or its read of a record) before a step was sent: compensating would undo only this
   * run's steps while the earlier run's from that step on may stand. Some steps may stand (`applied`: those known; all of them when a resume finds the change ran but
   * not which). Call `change()` again with the same input to resume it; its leases expire meanwhile.
   */
  | { status: "incomplete"; change: string; message: string; applied: string[]; result: SubmitResult };

const isApplied = (r: SubmitResult): r is Extract<Reply, { status: "applied" }> => r.status === "applied";
const isUnsettled = (r: SubmitResult) => r.status === "unknown" || r.status === "blocked";
/** A record another change holds, or owners keep from this agent for a while (`lease_cooldown`): waited out. */
const isHeldOff = (r: SubmitResult) => r.status === "rejected" && (r.reason === "leased" || r.reason === "lease_cooldown");
/** A renewal past the longest hold owners allow (WRIT_LEASE_MAX_HOLD_MS): the lease stays the change's until it lapses. */
const isHoldExceeded = (r: SubmitResult) => r.status === "rejected" && r.reason === "lease_hold_exceeded";
/**
 * Owners say the change held the record before: a refused acquire's `details.heldBefore`, a granted one's
 * `lease.heldBefore`. Any value but absent, null or false counts (bytes from Kafka are hostile; reading one as absent
 * would be the unsafe answer, `not_started`).
 */
const saysHeldBefore = (r: SubmitResult) => {
  const said = r.status === "rejected" ? r.details : r.status === "applied" ? r.lease : undefined;
  if (typeof said !== "object" || said === null) return false;
  const held = (said as Record<string, unknown>).heldBefore;
  return held !== undefined && held !== null && held !== false;
};
/** A field of a refusal's `details`, when it is a string. */
const detail = (r: SubmitResult, field: string): string | undefined => {
  const d = r.status === "rejected" ? (r.details as Record<string, unknown> | undefined) : undefined;
  return typeof d === "object" && d !== null && typeof d[field] === "string" ? d[field] : undefined;
};

/** Most changes one client remembers having run (the latest). */
const MAX_REMEMBERED = 10_000;
/** Most steps over those changes (a 50-step change kept 10,000 times would hold 500,000 replies). */
const MAX_REMEMBERED_STEPS = 100_000;

/**
 * How a change this client ran ended, as far as it knows: `incomplete` (also a run that threw after a step was
 * built to be sent), with the steps that may stand; `applied`, with its steps' replies as repeats (`duplicate`, no
 * state: what a run that takes its leases again is answered); `compensated` or `not_started`, nothing of it standing.
 * A not_started run (also one that threw before any step was built, owners saying nothing of an earlier run) keeps
 * the records it took (`taken`, with those of this client's earlier not_started runs of the change): its releases,
 * or lapses, leave owners' marks that it held them, which speak of no step. Marks on other records may be an
 * earlier run's (a process that crashed), whose steps may stand.
 */
type RunBefore =
  | { ended: "incomplete"; standing: string[] }
  | { ended: "applied"; steps: Reply[] }
  | { ended: "compensated" }
  | { ended: "not_started"; taken: string[] };

/**
 * The changes each client ran: calling `change()` again runs one again (a resume, or a repeat of a settled one), and
 * an acquire refused then must not be answered `not_started` ("nothing was written") over steps that stand. In the
 * client's memory only: a client started anew does not know them.
 */
const runBefore = new WeakMap<object, { changes: Map<string, RunBefore>; steps: number }>();

/** What one remembered change weighs against MAX_REMEMBERED_STEPS: its steps kept, and itself. */
const weight = (r: RunBefore) => 1 + (r.ended === "applied" ? r.steps.length : r.ended === "incomplete" ? r.standing.length : r.ended === "not_started" ? r.taken.length : 0);

/** What a run got to, kept as it goes: when it throws, what it leaves is remembered from it, and its leases released. */
interface Progress {
  change?: string;
  /** A step or undo was built to be sent: from then on the change may have written. */
  stepSent: boolean;
  /** Steps built to be sent and not known to be unwritten (refused, or undone since). */
  standing: Set<string>;
  /** Steps undone by an applied undo. */
  undone: Set<string>;
  /** Releases the leases the run took. */
  releaseAll?: () => Promise<void>;
  /** Records (entity keys) whose lease this run was granted, or may have been (an acquire's outcome unknown). */
  taken: Set<string>;
  /**
   * Records whose answer to one of this run's acquires said `heldBefore` (owners: the change held it before). Counted
   * also after one of this run's acquires of the record came back unknown or blocked (its own lease may then have been
   * granted and lapsed, the mark its own: unsure, so `incomplete`).
   */
  heldBefore: Set<string>;
  /** An acquire was refused lease_hold_exceeded, or lease_cooldown naming this change: the change ran before. */
  ranBefore: boolean;
}

/** The records a remembered run of the change says it took, whose owners' marks then speak of no step. */
const cleanTaken = (r: RunBefore | undefined): Set<string> | undefined => (r?.ended === "not_started" ? new Set(r.taken) : undefined);

/** `heldBefore` was said of a record none of the remembered not_started runs took: an earlier run's mark. */
const heldBeforeElsewhere = (progress: Progress, known: RunBefore | undefined): boolean => {
  const clean = cleanTaken(known);
  return [...progress.heldBefore].some((k) => clean === undefined || !clean.has(k));
};

/**
 * What a not_started run leaves in memory: the records it took, with those of the change's remembered not_started
 * runs (their marks are this client's too). One remembered compensated stays so (nothing stands, whatever it took);
 * one remembered incomplete or applied too (a run of the change on this client that ended so meanwhile: its steps
 * stand, and a not_started over it would let a later refusal answer not_started).
 */
function rememberNotStarted(client: object, change: string, taken: Iterable<string>): void {
  const earlier = runBefore.get(client)?.changes.get(change);
  if (earlier !== undefined && earlier.ended !== "not_started") return remember(client, change, earlier);
  remember(client, change, { ended: "not_started", taken: [...new Set([...(cleanTaken(earlier) ?? []), ...taken])].sort() });
}

/** An applied reply as a repeat of it is answered: without the record's state (kept in memory, and stale). */
const asRepeat = (r: Reply): Reply =>
  r.status !== "applied"
    ? { ...r }
    : { status: "applied", intentId: r.intentId, intentKey: r.intentKey, duplicate: true, at: r.at, entity: { ...r.entity }, state: null, version: r.version, via: r.via, ...(r.tool !== undefined ? { tool: r.tool } : {}), ...(r.undoOf !== undefined ? { undoOf: r.undoOf } : {}) };

function remember(client: object, change: string, what: RunBefore): void {
  let known = runBefore.get(client);
  if (!known) runBefore.set(client, (known = { changes: new Map(), steps: 0 }));
  const earlier = known.changes.get(change);
  if (earlier) known.steps -= weight(earlier);
  known.changes.delete(change);
  known.changes.set(change, what);
  known.steps += weight(what);
  // The oldest go first; the latest is kept whatever it weighs.
  while (known.changes.size > 1 && (known.changes.size > MAX_REMEMBERED || known.steps > MAX_REMEMBERED_STEPS)) {
    const [oldest, r] = known.changes.entries().next().value!;
    known.changes.delete(oldest);
    known.steps -= weight(r);
  }
}

/** The WriteIntent that takes (`acquire`) or gives back (`release`) a record's lease for a change. */
export function buildLeaseIntent(i: {
  change: string;
  op: "acquire" | "release";
  entity: EntityRef;
  tool: string;
  agentId: string;
  runId: string;
  stepId: string;
  replyTo: string;
  ttlMs?: number;
}): WriteIntent {
  return {
    intentId: randomUUID(),
    intentKey: leaseIntentKey(i.change, i.op, i.entity),
    entity: i.entity,
    tool: i.tool,
    agent: { id: i.agentId, runId: i.runId, stepId: i.stepId },
    baseVersion: LEASE_VERSION,
    delta: [],
    params: {},
    replyTo: i.replyTo,
    createdAt: new Date().toISOString(),
    lease: { change: i.change, op: i.op, ...(i.op === "acquire" && i.ttlMs !== undefined ? { ttlMs: i.ttlMs } : {}) },
  };
}

/** Runs a change for `client` (see `WritClient.change`). */
export async function runChange(client: WritClient & { readonly replyTopic: string }, input: ChangeInput): Promise<ChangeResult> {
  const progress: Progress = { stepSent: false, standing: new Set(), undone: new Set(), taken: new Set(), heldBefore: new Set(), ranBefore: false };
  let result: ChangeResult;
  try {
    result = await runChangeOnce(client, input, progress);
  } catch (err) {
    // Thrown (a delta function; a submit not sent, too large, or its reply consumer stopped): before any step, nothing
    // of this run was written, and its leases are released as a change not started releases them; remembered as a
    // not_started run with the records it took (their marks are its own) when nothing says the change ran before.
    // After, steps may stand: the change is remembered as left incomplete, its leases left to expire as an incomplete
    // change's are (a resume takes them again), so calling change() again never answers not_started over them.
    if (!progress.stepSent) {
      await progress.releaseAll?.();
      if (progress.change !== undefined) rememberClean(client, progress.change, progress);
    } else if (progress.change !== undefined) rememberThrown(client, progress.change, input, progress);
    throw err;
  }
  if (result.status === "incomplete") remember(client, result.change, { ended: "incomplete", standing: [...result.applied] });
  else if (result.status === "applied") remember(client, result.change, { ended: "applied", steps: result.steps.map(asRepeat) });
  else if (result.status === "compensated") remember(client, result.change, { ended: "compensated" });
  // not_started: true of the change (nothing known of it, or compensated): nothing stands; the marks its leases left are its own.
  else rememberNotStarted(client, result.change, progress.taken);
  return result;
}

/**
 * A run that threw before any step was built wrote nothing: remembered as not_started, with the records it took,
 * when this client remembers nothing else of the change (or only not_started runs) and no owner said it ran before:
 * not when an acquire was refused lease_hold_exceeded (or lease_cooldown naming it), nor when `heldBefore` was said
 * of a record no remembered run of this client took (an earlier run's mark: its steps may stand).
 */
function rememberClean(client: object, change: string, progress: Progress): void {
  const earlier = runBefore.get(client)?.changes.get(change);
  if ((earlier !== undefined && earlier.ended !== "not_started") || progress.taken.size === 0 || progress.ranBefore) return;
  const clean = cleanTaken(earlier) ?? new Set();
  if ([...progress.heldBefore].some((k) => !clean.has(k))) return;
  rememberNotStarted(client, change, progress.taken);
}

/** What a run that threw after a step was built leaves: the steps that may stand, with those an earlier run left. */
function rememberThrown(client: object, change: string, input: ChangeInput, progress: Progress): void {
  const earlier = runBefore.get(client)?.changes.get(change);
  // An applied change run again is answered from the ledger: it stays applied unless this run undid a step.
  if (earlier?.ended === "applied" && progress.undone.size === 0) return;
  const before = new Set(earlier?.ended === "incomplete" ? earlier.standing : earlier?.ended === "applied" ? input.steps.map((s) => s.name) : []);
  const standing = input.steps.map((s) => s.name).filter((n) => (before.has(n) || progress.standing.has(n)) && !progress.undone.has(n));
  remember(client, change, { ended: "incomplete", standing });
}

async function runChangeOnce(client: WritClient & { readonly replyTopic: string }, input: ChangeInput, progress: Progress): Promise<ChangeResult> {
  const change = changeId({ agentId: client.agentId, runId: input.runId, stepId: input.stepId });
  progress.change = change;
  // Checked before anything is sent: a NaN deadline never runs out (asked again without end), and a time to live
  // owners do not admit would end the change at its first acquire.
  const ttlMs = wholeMs("leaseTtlMs", input.leaseTtlMs ?? DEFAULT_LEASE_TTL_MS, MIN_LEASE_TTL_MS, MAX_LEASE_TTL_MS);
  const waitForLeaseMs = wholeMs("waitForLeaseMs", input.waitForLeaseMs ?? 30_000, 0, MAX_TIMER_MS);
  const settleWithinMs = wholeMs("settleWithinMs", input.settleWithinMs ?? 120_000, 0, MAX_TIMER_MS);
  const submitOpts = input.timeoutMs !== undefined ? { timeoutMs: input.timeoutMs } : undefined;
  const names = new Set<string>();
  for (const s of input.steps) {
    if (typeof s.name !== "string" || s.name.length === 0 || s.name.length > 64 || s.name.includes("/")) {
      throw new Error(`change: step name ${JSON.stringify(String(s.name).slice(0, 80))} must be 1 to 64 characters without "/"`);
    }
    if (names.has(s.name)) throw new Error(`change: step name ${s.name} is used twice`);
    names.add(s.name);
  }
  // One lease per record, taken in entity-key order, named by the first step's tool on that record.
  // `current`: the record as the change last read or wrote it (unknown after a repeat, or a reply too large for the broker);
  // `lastVersion`: the version it last saw; `holdEnded`: a renewal was refused lease_hold_exceeded (never renewed again).
  const records = new Map<string, { entity: EntityRef; tool: string; current?: Versioned; grantedAt?: number; lastVersion?: string; holdEnded?: boolean }>();
  for (const s of input.steps) if (!records.has(entityKey(s.entity))) records.set(entityKey(s.entity), { entity: s.entity, tool: s.tool.name });
  const order = [...records.keys()].sort();
  const lease = (key: string, op: "acquire" | "release") => {
    const r = records.get(key)!;
    return buildLeaseIntent({ change, op, entity: r.entity, tool: r.tool, agentId: client.agentId, runId: input.runId, stepId: `${input.stepId}/${op}`, replyTo: client.replyTopic, ttlMs });
  };
  /** Submits (a fresh id each time) until the result is settled or `within` ms passed; `again` asks for one more round. */
  const settle = async (build: () => WriteIntent, within: number, again: (r: SubmitResult) => boolean = isUnsettled): Promise<SubmitResult> => {
    const deadline = Date.now() + within;
    for (let round = 0; ; round++) {
      const result = await client.submit(build(), submitOpts);
      if (!again(result) || Date.now() >= deadline) return result;
      await backoffUntil(round, deadline);
    }
  };
  /**
   * Owners said, answering one of this run's acquires (granted or refused), that the change held that record before
   * (an earlier run): kept per record in `progress.heldBefore`. A grant says it too: the refused record's mark may be
   * gone (a record keeps its latest marks only) while the granted one's lives. Also after an acquire of the record
   * came back unknown or blocked (this run's own lease may have been granted then and lapsed, leaving the mark; an
   * earlier run's may live too: unsure, so counted).
   */
  const acquire = async (key: string, within: number): Promise<SubmitResult> => {
    const result = await settle(() => lease(key, "acquire"), within, (r) => {
      if (isUnsettled(r)) progress.taken.add(key);
      else if (saysHeldBefore(r)) progress.heldBefore.add(key);
      if (isHoldExceeded(r) || (r.status === "rejected" && r.reason === "lease_cooldown" && detail(r, "change") === change)) progress.ranBefore = true;
      return isUnsettled(r) || isHeldOff(r);
    });
    if (isApplied(result)) {
      progress.taken.add(key);
      const r = records.get(key)!;
      // A reply too large for the broker carries the version without the record (`truncated`): taken as the
      // record, its null would be what a step's delta function builds on, and the step would drop the rest.
      r.current = result.truncated ? undefined : { state: result.state, version: result.version };
      r.grantedAt = Date.now();
      r.lastVersion ??= result.version;
    }
    if (isHoldExceeded(result)) records.get(key)!.holdEnded = true;
    return result;
  };
  /**
   * Renews every lease past half its life (its acquire again, which also reads the record). A record whose
   * version moved past the last one the change saw there was written by someone else while the lease had
   * lapsed: the change no longer holds it as it was, and stops (null: all held, nothing moved). A lease held
   * as long as owners allow is not renewed (lease_hold_exceeded, returned once the others are renewed): it
   * stays the change's until it lapses, and the change stops going forward; its undos may still run under it.
   */
  const renew = async (): Promise<SubmitResult | null> => {
    let holdEnded: SubmitResult | null = null;
    for (const key of order) {
      const r = records.get(key)!;
      if (r.grantedAt === undefined || r.holdEnded || Date.now() - r.grantedAt <= ttlMs / 2) continue;
      const seen = r.lastVersion;
      const renewed = await acquire(key, settleWithinMs);
      if (isHoldExceeded(renewed)) {
        holdEnded ??= renewed;
        continue;
      }
      if (!isApplied(renewed)) return renewed;
      if (seen !== undefined && renewed.version !== seen) {
        const message = `the lease of ${key} lapsed and the record was written meanwhile (${seen} → ${renewed.version}); the change no longer holds it as it left it`;
        return { status: "rejected", intentId: renewed.intentId, intentKey: renewed.intentKey, duplicate: false, at: new Date().toISOString(), reason: "lease_not_held", message };
      }
    }
    return holdEnded;
  };
  const releaseAll = async () => {
    // All at once, each asked again while its outcome is unknown: a lease left behind expires, and reads as a stalled agent.
    const held = order.filter((k) => records.get(k)!.grantedAt !== undefined);
    await Promise.all(held.map((k) => settle(() => lease(k, "release"), 30_000).catch(() => undefined)));
  };
  progress.releaseAll = releaseAll;

  /**
   * How the change ends when a record's lease is not taken before its first step. `not_started` says nothing of the
   * change was written: not when it is known to have run. A refusal `lease_hold_exceeded` says the change holds the
   * lease (a resume: its earlier run took it, and its steps may stand); `lease_cooldown` naming this change, that it
   * held the record lately; `heldBefore` on any answer to this run's acquires (a refusal's `details`, a grant's
   * `lease`), that it held that record before (its leases are all taken before its first step, so an earlier run may
   * have written); this client's memory, that it left the change `incomplete` (or threw in it). Each ends it
   * `incomplete`. A change this client saw `applied` is answered so again, as taking its leases again would answer it
   * (its steps repeats); one it saw `compensated` has nothing standing, so `not_started` is true of it; one it saw
   * `not_started` too, unless `heldBefore` was said of a record none of its remembered not_started runs took (that
   * mark is not theirs: an earlier run's, whose steps may stand), or an acquire was refused `lease_hold_exceeded` or
   * `lease_cooldown` naming the change (in this round or an earlier one).
   */
  const notTaken = (key: string, got: SubmitResult): ChangeResult => {
    const known = runBefore.get(client)?.changes.get(change);
    if (known?.ended === "applied") return { status: "applied", change, steps: known.steps.map(asRepeat) };
    const earlier = known?.ended === "incomplete" ? [...known.standing] : undefined;
    const cooledOwn = got.status === "rejected" && got.reason === "lease_cooldown" && detail(got, "change") === change;
    const ranBefore = known?.ended !== "compensated" && (isHoldExceeded(got) || cooledOwn || progress.ranBefore || heldBeforeElsewhere(progress, known));
    if (!isUnsettled(got) && !ranBefore && earlier === undefined) return { status: "not_started", change, entity: records.get(key)!.entity, result: got };
    // Which steps may stand: those this client knows of, else (it ran, nobody here knows how far) every one.
    const applied = earlier ?? (ranBefore ? input.steps.map((s) => s.name) : []);
    const standing = applied.length > 0 ? `steps ${applied.join(", ")} may stand` : "no step is known to stand";
    let message: string;
    if (isUnsettled(got)) message = `no answer to the lease acquire of ${key}${earlier === undefined ? "" : ` (a change left incomplete before: ${standing})`}`;
    else if (isHoldExceeded(got)) message = `this change has held the lease of ${key} as long as owners allow (WRIT_LEASE_MAX_HOLD_MS), so it ran before and ${standing}; the lease is not renewed and lapses at ${detail(got, "expiresAt") ?? "its expiry"}: call change() again after then to resume`;
    else if (cooledOwn) message = `this change held ${key} as long as owners allow, so it ran before and ${standing}; the record is kept from this agent until ${detail(got, "until") ?? "the cool-down ends"}: call change() again after then to resume`;
    else if (ranBefore && earlier === undefined) message = `owners say this change held its records before (an earlier run, whose lease ended${progress.ranBefore ? ", or that it held a lease as long as they allow" : ""}), so it may have written and ${standing}; the lease of ${key} was not taken now (${got.status === "rejected" ? got.reason : got.status}): call change() again to resume`;
    else message = `this change was left incomplete before (${standing}), and the lease of ${key} was not taken now (${got.status === "rejected" ? got.reason : got.status}): call change() again to resume`;
    return { status: "incomplete", change, message, applied, result: got };
  };
  for (const key of order) {
    const got = await acquire(key, waitForLeaseMs);
    if (!isApplied(got)) {
      await releaseAll();
      return notTaken(key, got);
    }
  }

  const applied: { step: ChangeStep; reply: Extract<Reply, { status: "applied" }> }[] = [];
  // Known, with every lease taken, to be a resume: an earlier run may have written steps this one has not sent yet.
  const resumedFrom = (() => {
    const known = runBefore.get(client)?.changes.get(change);
    if (known?.ended === "incomplete" || known?.ended === "applied") return `this client left it ${known.ended}`;
    if (known?.ended === "compensated") return undefined;
    if (progress.ranBefore) return "owners refused a lease as this change's own (lease_cooldown naming it)";
    if (heldBeforeElsewhere(progress, known)) return "owners say it held its records before";
    return undefined;
  })();
  /**
   * A resume whose lease is lost (or whose read of a record is not answered applied) before step `name` is sent: an
   * earlier run's steps from this one on may stand, so compensating (undoing this run's steps only) would answer
   * `compensated` over them. Ends `incomplete`, every step possibly standing. Its leases are released: nothing of
   * this run is in flight, and a resume finds the marks they leave for the 15 minutes they live (held on, they would only keep other changes off
   * the records until they expire, and read as a stalled agent). Known to be a resume when the leases were taken, or
   * by this client's memory now: another run of the change on this client may have ended since (`applied` or
   * `incomplete`). Null when the run is not known to be a resume.
   */
  const stopResumed = async (name: string, result: SubmitResult): Promise<ChangeResult | null> => {
    const now = runBefore.get(client)?.changes.get(change);
    const from = resumedFrom ?? (now?.ended === "incomplete" || now?.ended === "applied" ? `another run of it on this client ended ${now.ended} meanwhile` : undefined);
    if (from === undefined) return null;
    await releaseAll();
    const why = result.status === "rejected" ? `${result.reason}: ${result.message}` : result.status;
    const all = input.steps.map((s) => s.name);
    const message = `this change ran before (${from}), and before step ${name} was sent the run lost its lease or its read of the record (${why}); undoing only this run's steps would leave an earlier run's from ${name} on, so nothing is undone: steps ${all.join(", ")} may stand; call change() again to resume`;
    return { status: "incomplete", change, message, applied: all, result };
  };
  const stepIntent = (s: ChangeStep, current: Versioned): WriteIntent => {
    const delta = typeof s.delta === "function" ? s.delta(current) : s.delta;
    const intent = client.buildIntent({ tool: s.tool, entity: s.entity, runId: input.runId, stepId: `${input.stepId}/${s.name}`, baseVersion: current.version, delta, params: s.params });
    progress.stepSent = true;
    progress.standing.add(s.name);
    return { ...intent, lease: { change, op: "step" } };
  };
  for (const s of input.steps) {
    const key = entityKey(s.entity);
    const r = records.get(key)!;
    const lapsed = await renew();
    if (lapsed) return (await stopResumed(s.name, lapsed)) ?? compensate(s.name, lapsed);
    // After a repeat (a resumed change), or a reply too large for the broker, the record's state is not known:
    // its acquire again reads it.
    let base = r.current;
    if (base === undefined) {
      const read = await acquire(key, settleWithinMs);
      if (!isApplied(read)) return (await stopResumed(s.name, read)) ?? compensate(s.name, read);
      if (read.truncated && typeof s.delta === "function") {
        // Still too large to come back: the change has no reader of its own, and a delta function built on
        // nothing would drop what the record holds. The step is not written; the change is compensated.
        const message = `the state of ${key} is too large to come back in a reply (truncated), so step ${s.name}'s delta function has no record to be built on; nothing was written`;
        const unavailable: SubmitResult = { status: "rejected", intentId: read.intentId, intentKey: read.intentKey, duplicate: false, at: new Date().toISOString(), reason: "state_unavailable", message };
        return (await stopResumed(s.name, unavailable)) ?? compensate(s.name, unavailable);
      }
      // A fixed delta needs only the version the lease read.
      base = r.current ?? { state: null, version: read.version };
    }
    const result = await settle(() => stepIntent(s, base!), settleWithinMs);
    // Refused or in conflict: not written (an unknown or escalated one may be).
    if (result.status === "rejected" || result.status === "conflict") progress.standing.delete(s.name);
    if (!isApplied(result)) return compensate(s.name, result);
    if (result.undoneBy !== undefined) {
      // A repeat of a step an applied undo compensated: this change was compensated before (by a run this client
      // does not remember). Going on would write the later steps without this one; nothing of it stands instead.
      progress.standing.delete(s.name);
      return compensate(s.name, result);
    }
    applied.push({ step: s, reply: result });
    r.lastVersion = result.version;
    r.current = result.state === null || result.duplicate ? undefined : { state: result.state, version: result.version };
  }
  await releaseAll();
  return { status: "applied", change, steps: applied.map((x) => x.reply) };

  async function compensate(failedStep: string, result: SubmitResult): Promise<ChangeResult> {
    if (isUnsettled(result) || result.status === "escalated") {
      // The step may have been applied (an unknown outcome; an escalation a person may still apply): undoing
      // around it would guess. Resuming the change asks again; an escalation is settled on writ.human first.
      const why = result.status === "escalated" ? `was escalated (${result.reason}): a person settles it on writ.human` : "has no known outcome";
      return { status: "incomplete", change, message: `step ${failedStep} ${why}; call change() again to resume`, applied: applied.map((x) => x.step.name), result };
    }
    const undone: Reply[] = [];
    for (const { step, reply } of [...applied].reverse()) {
      // A lease past its longest hold is still the change's until it lapses: its undo runs under it (refused
      // lease_not_held, nothing written, once it has lapsed).
      const lapsed = await renew();
      if (lapsed && !isHoldExceeded(lapsed)) {
        const left = applied.filter((x) => !undone.some((u) => u.status === "applied" && u.undoOf === x.reply.intentKey)).map((x) => x.step.name);
        return { status: "incomplete", change, message: `compensating: ${lapsed.status === "rejected" ? lapsed.message : `a lease could not be renewed (${lapsed.status})`}; steps ${left.join(", ")} stand`, applied: left, result: lapsed };
      }
      const undo = () => ({
        ...buildUndoIntent({
          undone: { intentKey: reply.intentKey, entity: step.entity, tool: step.tool.name },
          agentId: client.agentId,
          runId: input.runId,
          stepId: `${input.stepId}/${step.name}/undo`,
          replyTo: client.replyTopic,
        }),
        lease: { change, op: "step" as const },
      });
      const got = await settle(undo, settleWithinMs);
      if (isApplied(got)) {
        progress.undone.add(step.name);
        progress.standing.delete(step.name);
      }
      if (!isApplied(got)) {
        const left = applied.filter((x) => !undone.some((u) => u.status === "applied" && u.undoOf === x.reply.intentKey)).map((x) => x.step.name);
        return { status: "incomplete", change, message: `the undo of step ${step.name} was not applied (${got.status}); steps ${left.join(", ")} stand`, applied: left, result: got };
      }
      undone.push(got);
    }
    await releaseAll();
    return { status: "compensated", change, failed: { step: failedStep, result }, undone };
  }
}

/** `value` when it is a whole number of ms from `min` to `max`; else config_invalid naming the field. */
function wholeMs(field: string, value: number, min: number, max: number): number {
  if (Number.isSafeInteger(value) && value >= min && value <= max) return value;
  throw new WritError("config_invalid", `change: ${field} must be an integer from ${min} to ${max} ms (it is ${value})`, { retriable: false, context: { field } });
}

const ROUND_BACKOFF = { initialDelayMs: 100, maxDelayMs: 2000 };

/** Backoff between rounds of asking again (a change's intents; a write answered `leased`): 100 ms doubling to 2 s, ±20 %, never past the deadline. */
export function backoffUntil(round: number, deadline: number): Promise<void> {
  const ms = Math.max(0, Math.min(deadline - Date.now(), backoffMs(round + 1, ROUND_BACKOFF)));
  return new Promise((r) => setTimeout(r, ms));
}
