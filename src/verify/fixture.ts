import type { EntityRef, JsonPatchOp, Versioned } from "../schemas/common.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import type { WriteToolDeclaration } from "../tools.ts";

/**
 * The verify fixture contract: what `writ verify` needs, per write tool, to
 * exercise the tool against a STAGING system of record and to count what it
 * did there. A tools module for verify exports, next to `tools` and
 * `systems(env)` (the `WRIT_TOOLS_MODULE` contract), a `verify` object keyed
 * by tool name.
 *
 * Every change verify makes carries a **mark**: a short unique string
 * (`[a-z0-9-]`, at most 40 characters, e.g. `wv-k3j9a1-race-a`). `change`
 * puts it where the tool writes (a tag, a refund's reference, a note) and
 * `effects` counts it in the record, so each change can be found again:
 * 0 = absent, 1 = applied once, 2+ = applied twice (a duplicate).
 *
 * @example
 * export const verify = {
 *   tag_ticket: verifyFixture(tagTicket, {
 *     entityId: "T-verify",
 *     change: (current, mark) => ({
 *       params: { tag: mark },
 *       delta: [{ op: "replace", path: "/tags", value: [...current.state.tags, mark] }],
 *     }),
 *     effects: ({ current, mark }) => current?.state.tags.filter((t: string) => t === mark).length ?? 0,
 *   }),
 * } satisfies VerifyFixtures;
 */
export interface ToolVerifyFixture<P extends Record<string, unknown> = Record<string, unknown>> {
  /**
   * Id of a record of the tool's `recordType` on staging. It must exist when
   * verify starts (or `prepare` creates it); verify writes a handful of
   * marked changes to it on every run.
   */
  entityId: string;
  /**
   * The tool call an agent makes after reading `current`: its params and its
   * JSON Patch delta, carrying `mark`. Make it the read-modify-write the agent
   * really does (e.g. replace `/tags` with the list read plus one tag): the
   * race scenario shows what happens when two of those meet. Called again
   * with the fresh record when an agent decides again after a conflict, so
   * it must not add the mark twice.
   */
  change(current: Versioned, mark: string): { params: P; delta: JsonPatchOp[] };
  /**
   * Effects of the change marked `mark`, a count (0, 1, 2, …; a boolean fails
   * the scenario: it would hide a duplicate), counted by reading the system of
   * record: how many times it is in `current` (the entity as read directly,
   * not through writ), or, for a tool that creates records elsewhere, how
   * many records with that mark exist (read them with `system`).
   */
  effects(ctx: EffectsContext): number | Promise<number>;
  /**
   * The change another integration makes in the race scenario, written
   * directly to the system of record (not through writ) with If-Match.
   * Default: `change(current, mark).delta`.
   */
  outsideChange?(current: Versioned, mark: string): JsonPatchOp[];
  /** Runs once before the tool's scenarios, e.g. to create the staging record when it is missing. */
  prepare?(ctx: PrepareContext): void | Promise<void>;
}

export interface EffectsContext {
  entity: EntityRef;
  /** The entity as read directly from the system of record; null when it does not exist. */
  current: Versioned | null;
  mark: string;
  /** The tool's system of record, not through the fault proxy. */
  system: SystemOfRecord;
}

export interface PrepareContext {
  entity: EntityRef;
  /** The tool's system of record, not through the fault proxy. */
  system: SystemOfRecord;
  /** The environment `systems(env)` was given, e.g. to find the system's URL. */
  env: NodeJS.ProcessEnv;
}

/** The `verify` export of a tools module: one fixture per write tool, by tool name. */
export type VerifyFixtures = Record<string, ToolVerifyFixture<any>>;

/** What `writ verify --tools <module>` imports. */
export interface VerifyModule {
  tools: readonly WriteToolDeclaration<any>[];
  systems(env: NodeJS.ProcessEnv): SystemOfRecord[] | Promise<SystemOfRecord[]>;
  verify: VerifyFixtures;
}

/** Ties a fixture to its tool so `change` is checked against the tool's params. */
export function verifyFixture<P extends Record<string, unknown>>(
  _tool: WriteToolDeclaration<P>,
  fixture: ToolVerifyFixture<NoInfer<P>>,
): ToolVerifyFixture<P> {
  return fixture;
}
