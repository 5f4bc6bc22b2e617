import { intentKey } from "../../src/keys.ts";
import { LruMap } from "../../src/lru-map.ts";
import { entityKey, type EntityRef, type Versioned } from "../../src/schemas/common.ts";
import type { SubmitResult } from "../writ-client.ts";
import { DEFAULT_STEP_ID, VersionBook, submitToolCall, type WritCallContext, type WritToolSpec } from "./tool-bridge.ts";

// Why bases are pinned per intent key: a call that waited for a person's
// approval, or is resumed from saved state, should be written against the
// version it was made (and approved) against. A strict tool then reports a
// change made meanwhile as a conflict for the agent to decide again, instead
// of applying a read-modify-write the approver never saw to a newer record.
// Repeats stay safe either way: the owner answers the same attempt, or a retry
// from a fresher read, from its ledger. Only a conflict moves the pin, to the
// `current` the owner returned, because that is the agent deciding again (to
// a fresh read when the reply came without `current.state`: too large).

/** Where the base each intent was first submitted against is kept (per run, session or process). */
export interface IntentBases {
  get(intentKey: string): Versioned | undefined;
  set(intentKey: string, base: Versioned): void;
}

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
  const pinned = bases.get(key);
  if (pinned) return pinned;
  const entity = spec.entity(params);
  let base = ctx.versions.get(entity);
  if (!base) {
    base = await ctx.read(entity);
    ctx.versions.remember(entity, base);
  }
  bases.set(key, base);
  return base;
}

/**
 * {@link submitToolCall}, safe to repeat: a retry, a resume from an older
 * saved state or a re-plan with a new tool-call id is sent against the base
 * of the first attempt, so the owner answers it from its ledger
 * (`duplicate: true`) instead of refusing it as a reused key. After a
 * conflict the pin moves to the owner's `current` (or to a fresh read when
 * the reply was truncated), so deciding again writes.
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
  if (result.status === "conflict" && !result.truncated) bases.set(key, result.current);
  else if (result.status === "conflict") {
    // A conflict reply too large for the broker carries the new version without the record: pinned, the
    // next attempt would build its delta from nothing at a matching version and drop what the record holds.
    // The record is read afresh instead. A read that fails leaves the old pin: the next attempt meets the
    // same conflict, with nothing written, and reads again.
    const entity = spec.entity(params);
    const fresh = await ctx.read(entity).catch(() => undefined);
    if (fresh) {
      bases.set(key, fresh);
      ctx.versions.remember(entity, fresh);
    }
  }
  return result;
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
