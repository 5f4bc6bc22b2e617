import { intentKey } from "../../src/keys.ts";
import { LruMap } from "../../src/lru-map.ts";
import { entityKey, type EntityRef, type Versioned } from "../../src/schemas/common.ts";
import type { SubmitResult } from "../writ-client.ts";
import { DEFAULT_STEP_ID, VersionBook, checkRunIds, submitToolCall, type WritCallContext, type WritToolSpec } from "./tool-bridge.ts";

// Why bases are pinned per intent key: a call that waited for a person's
// approval, or is resumed from saved state, should be written against the
// version it was made (and approved) against. A strict tool then reports a
// change made meanwhile as a conflict for the agent to decide again, instead
// of applying a read-modify-write the approver never saw to a newer record.
// Repeats stay safe either way: the owner answers the same attempt, or a retry
// from a fresher read, from its ledger.
//
// A conflict moves the pin, to the `current` the owner returned (to a fresh
// read when the reply came without `current.state`: too large), for the calls
// made after it: a call under a new tool-call id is the agent deciding again.
// A call keeps the base it was first pinned at, by its tool-call id: a replay
// of the conflicting call itself (continued again from the same saved
// messages, a graph replayed from the older checkpoint) decided nothing anew,
// and written against the moved pin it would apply a change its approver saw
// on the older version. Sent against its own base it meets the same conflict,
// answered from the ledger, with nothing written. The pin remembers the last
// REMEMBERED_CALLS tool-call ids with their bases, as plain JSON (see
// IntentPin); calls without a tool-call id get the pin as it is.

/**
 * Where the base each intent was first submitted against is kept (per run,
 * session or process). A store keeps the {@link IntentPin} it is given whole
 * (it is plain JSON); one that kept only `state` and `version` would forget
 * which call was sent against which base.
 */
export interface IntentBases {
  get(intentKey: string): IntentPin | undefined;
  set(intentKey: string, base: IntentPin): void;
}

/**
 * An intent key's pin as stored, plain JSON: the base a call under a new
 * tool-call id is sent against (`state`, `version`), the ids of the calls
 * pinned at it (`calls`) and the calls pinned at bases a conflict moved the
 * pin from (`earlier`), the last {@link REMEMBERED_CALLS} ids in all. A bare
 * {@link Versioned} (as stored before) is a pin that remembers no call.
 */
export type IntentPin = Versioned & { calls?: string[]; earlier?: { base: Versioned; calls: string[] }[] };

/** How many tool-call ids (the latest) a pin remembers the bases of. */
export const REMEMBERED_CALLS = 8;

/**
 * Bases in memory, the least recently used dropped first past `maxEntries`
 * (default 10 000): reading a pin (a retry, a repeat, an approval asked for
 * again) counts as a use, so the pins dropped are those nobody asked for
 * longest, not merely the oldest ones set.
 * Enough for retries inside one process; a harness that resumes in another
 * process keeps them with its run state instead (see the OpenAI Agents adapter).
 */
export class MemoryIntentBases implements IntentBases {
  readonly #bases: LruMap<string, Versioned>;

  constructor(maxEntries = 10_000) {
    this.#bases = new LruMap(maxEntries);
  }

  get(key: string): Versioned | undefined {
    return this.#bases.get(key);
  }

  set(key: string, base: Versioned): void {
    this.#bases.set(key, base);
  }
}

/** Bases kept in a plain JSON object, e.g. inside a framework's serialized run context. */
export function recordIntentBases(store: Record<string, Versioned>): IntentBases {
  return {
    get: (key) => store[key],
    set: (key, base) => {
      store[key] = base;
    },
  };
}

/** The intent key a tool call will be submitted under (the same derivation as the client's). */
export function toolCallIntentKey<P extends Record<string, unknown>>(ctx: Pick<WritCallContext, "runId" | "stepId" | "client">, spec: WritToolSpec<P>, params: P): string {
  checkRunIds(ctx);
  return intentKey({ tool: spec.tool, agentId: ctx.client.agentId, runId: ctx.runId, stepId: ctx.stepId ?? DEFAULT_STEP_ID, entity: spec.entity(params), params });
}

/**
 * The base this tool call is (or will be) submitted against: the pinned one,
 * else the version the harness has seen, else a fresh read. Pins it.
 * Call it where a harness makes the call durable before executing it (an
 * approval request), so a resume from that saved state repeats the same attempt.
 */
export async function pinToolCallBase<P extends Record<string, unknown>>(
  ctx: WritCallContext,
  spec: WritToolSpec<P>,
  params: P,
  bases: IntentBases,
): Promise<Versioned> {
  const key = toolCallIntentKey(ctx, spec, params);
  const callId = ctx.toolCallId || undefined;
  const pinned = bases.get(key);
  if (pinned) {
    if (callId === undefined) return bareBase(pinned);
    const remembered = rememberedBase(pinned, callId);
    if (remembered) return remembered;
    bases.set(key, withCall(pinned, callId));
    return bareBase(pinned);
  }
  const entity = spec.entity(params);
  let base = ctx.versions.get(entity);
  if (!base) {
    base = await ctx.read(entity);
    ctx.versions.remember(entity, base);
  }
  bases.set(key, callId === undefined ? base : withCall(base, callId));
  return base;
}

/**
 * {@link submitToolCall}, safe to repeat: a retry, a resume from an older
 * saved state or a re-plan with a new tool-call id is sent against the base
 * of the first attempt, so the owner answers it from its ledger
 * (`duplicate: true`) instead of refusing it as a reused key. After a
 * conflict the pin moves to the owner's `current` (or to a fresh read when
 * the reply was truncated), so deciding again (a call under a new tool-call
 * id) writes; the conflicting call itself, replayed, keeps its base and meets
 * the same conflict.
 *
 * @example
 * const reply = await submitRepeatableToolCall(ctx, refundSpec, params, new MemoryIntentBases());
 */
export async function submitRepeatableToolCall<P extends Record<string, unknown>>(
  ctx: WritCallContext,
  spec: WritToolSpec<P>,
  params: P,
  bases: IntentBases,
): Promise<SubmitResult> {
  const key = toolCallIntentKey(ctx, spec, params);
  const base = await pinToolCallBase(ctx, spec, params, bases);
  const result = await submitToolCall({ ...ctx, versions: new PinnedVersionBook(ctx.versions, spec.entity(params), base) }, spec, params);
  if (result.status !== "conflict") return result;
  // A call sent against a base the pin has moved from (a replay of a call that met its conflict before) meets
  // the ledger's old answer, which the pin has moved past already.
  const pinned = bases.get(key) ?? (ctx.toolCallId ? withCall(base, ctx.toolCallId) : base);
  if (pinned.version !== base.version) return result;
  if (!result.truncated) bases.set(key, movedPin(pinned, result.current));
  else {
    // A conflict reply too large for the broker carries the new version without the record: pinned, the
    // next attempt would build its delta from nothing at a matching version and drop what the record holds.
    // The record is read afresh instead. A read that fails leaves the old pin: the next attempt meets the
    // same conflict, with nothing written, and reads again.
    const entity = spec.entity(params);
    const fresh = await ctx.read(entity).catch(() => undefined);
    if (fresh) {
      bases.set(key, movedPin(pinned, fresh));
      ctx.versions.remember(entity, fresh);
    }
  }
  return result;
}

/** The base a pin gives, without the calls it remembers. */
function bareBase(pin: IntentPin): Versioned {
  const { calls: _calls, earlier: _earlier, ...base } = pin;
  return base;
}

/** The base the call `callId` was pinned at, if the pin remembers it. */
function rememberedBase(pin: IntentPin, callId: string): Versioned | undefined {
  if (pin.calls?.includes(callId)) return bareBase(pin);
  return pin.earlier?.find((e) => e.calls.includes(callId))?.base;
}

/** The pin, remembering that the call `callId` (not remembered yet) is pinned at its base. */
function withCall(pin: IntentPin, callId: string): IntentPin {
  return latestCalls({ ...pin, calls: [...(pin.calls ?? []), callId] });
}

/** The pin moved to `next`: the calls pinned at its base keep that base. */
function movedPin(pin: IntentPin, next: Versioned): IntentPin {
  const earlier = [...(pin.earlier ?? []), ...(pin.calls?.length ? [{ base: bareBase(pin), calls: pin.calls }] : [])];
  return earlier.length > 0 ? { ...bareBase(next), earlier } : bareBase(next);
}

/** The pin without the oldest calls past {@link REMEMBERED_CALLS}. */
function latestCalls(pin: IntentPin): IntentPin {
  let excess = (pin.calls?.length ?? 0) + (pin.earlier ?? []).reduce((n, e) => n + e.calls.length, 0) - REMEMBERED_CALLS;
  if (excess <= 0) return pin;
  const earlier: { base: Versioned; calls: string[] }[] = [];
  for (const e of pin.earlier ?? []) {
    const dropped = Math.min(excess, e.calls.length);
    excess -= dropped;
    if (dropped < e.calls.length) earlier.push({ base: e.base, calls: e.calls.slice(dropped) });
  }
  const calls = (pin.calls ?? []).slice(excess);
  return { ...bareBase(pin), ...(calls.length > 0 ? { calls } : {}), ...(earlier.length > 0 ? { earlier } : {}) };
}

/** The harness's book, except that the call's own entity reads as the pinned base. */
class PinnedVersionBook extends VersionBook {
  readonly #inner: VersionBook;
  readonly #entityKey: string;
  readonly #base: Versioned;

  constructor(inner: VersionBook, entity: EntityRef, base: Versioned) {
    super();
    this.#inner = inner;
    this.#entityKey = entityKey(entity);
    this.#base = base;
  }

  override get(entity: EntityRef): Versioned | undefined {
    return entityKey(entity) === this.#entityKey ? this.#base : this.#inner.get(entity);
  }

  override remember(entity: EntityRef, record: Versioned): void {
    this.#inner.remember(entity, record);
  }
}
