import { z } from "zod";
import { timerMs } from "./config.ts";
import { WritError } from "./errors.ts";
import type { KeyScope } from "./keys.ts";
import type { JsonPatchOp, Versioned } from "./schemas/common.ts";
import type { WriteIntent } from "./schemas/write-intent.ts";
import type { ReconcileResult, SystemOfRecord } from "./sor/adapter.ts";

/**
 * `strict`: a record whose version is not the intent's `baseVersion` is a
 * conflict, decided by the agent. `rebase-commutative`: appends (`add` at
 * `…/-`), which commute, are applied on the fresh version; anything else is
 * handled as `strict`.
 */
export type VersionPolicy = "strict" | "rebase-commutative";

export interface ReconcileContext {
  /**
   * The intent whose outcome is unknown. For an undo (`intent.undo` set, its
   * key the undo's) the function is asked only where the system cannot look
   * the undo's key up; it must then tell the compensating change apart.
   */
  intent: WriteIntent;
  /** The record as read just now; null when it does not exist. */
  current: Versioned | null;
  /** Read-only use: look the write up (a reconcile never writes). */
  system: SystemOfRecord;
  /** Deadline of each request the reconcile makes. ms. */
  timeoutMs: number;
  /** Headers to pass on to the system's requests (the owner instance, trace context). */
  headers: Readonly<Record<string, string>>;
}

/**
 * Settles an unknown outcome from the record itself, e.g. "is a refund with
 * this intent key in the list?". Throw a `sor_unavailable` WritError (or let
 * the adapter's through) when the system cannot be asked: the owner then
 * pauses and asks again, instead of treating the outcome as unknown.
 */
export type ReconcileFn = (ctx: ReconcileContext) => ReconcileResult | Promise<ReconcileResult>;

/**
 * What a create tool creates: a record under an external id derived from the
 * params (the agent's order reference, a lead's email), exactly once. The
 * entity of its intents is `{type: recordType, id: externalId(params)}`; the
 * owner creates with `If-None-Match: *` (`upsertByExternalId`), so a record
 * someone else created under the id meanwhile is a `conflict` carrying it.
 */
export interface CreateDeclaration<P> {
  /** The external id of the record these params create: the entity's id. */
  externalId: (params: P) => string;
  /** The new record, from the params alone (a JSON object). */
  body: (params: P) => Record<string, unknown>;
  /**
   * A top-level member of the new record that the owner sets to the intent
   * key, so that reconcile tells its own create from one another agent made
   * under the same external id. Without it, reconcile asks the system for the
   * intent key (it is sent as Idempotency-Key: `reconcile: "idempotency-key"`)
   * or runs the tool's reconcile function.
   */
  intentKeyField?: string;
}

/** What an undo function gets besides the params: the undone intent's key. */
export interface UndoContext {
  /** The intent key of the write being undone (e.g. to tie a reversal to its refund). */
  intentKey: string;
}

/**
 * The compensating change of an applied write of the tool, from the write's
 * params and the record as the write left it (`applied`: the state at the
 * version the write produced). The owner applies it with If-Match on that
 * version, so it never undoes on top of a newer change (that is a conflict).
 */
export type UndoFn<P> = (params: P, applied: Versioned, ctx: UndoContext) => JsonPatchOp[];

/** What every write tool declares. */
interface ToolDeclarationBase<P extends Record<string, unknown>> {
  name: string;
  recordType: string;
  description?: string;
  /** The tool's structured intent fields. */
  params: z.ZodType<P>;
  /** The params that define the business intent; the intent key is built from them. */
  intentFields: readonly (keyof P & string)[];
  /** Params holding model-written text: left out of the key-reuse fingerprint. */
  freeTextParams?: readonly (keyof P & string)[];
  /** Patch paths whose values are free text (same patterns as `allowedPaths`). */
  freeTextPaths?: readonly string[];
  keyScope: KeyScope;
  /** Conflict replies before the case goes to a human. Default 2. */
  maxConflictCycles?: number;
  /** Name of the system-of-record adapter. */
  system: string;
  /**
   * How an unknown outcome is settled: `idempotency-key` asks the system by
   * key (needs `capabilities.idempotencyLookup`), or a function that looks at
   * the record. Required where the system keeps no idempotency keys.
   */
  reconcile?: "idempotency-key" | ReconcileFn;
  /** Deadline of this tool's PATCH. ms. Defaults to the router's `sorTimeoutMs`. */
  timeoutMs?: number;
  /**
   * The compensating change (refund ↔ reversal, add tag ↔ remove tag), which
   * `writ undo` and `client.undo()` submit once for an applied intent of this
   * tool. With it, the ledger keeps each intent's params (what the change is
   * built from) until the entry expires.
   */
  undo?: UndoFn<P>;
  /**
   * Where the undo's compensating change may write (patterns as `allowedPaths`), checked like any delta before it is
   * sent. An edit tool without it holds its undo to its `allowedPaths`; a create tool without it, to no narrower
   * scope than the record it created. Declared apart so that what only an undo writes (a refund's `/reversals`) is
   * no path an agent's change, or an operator's resolution of one, may take.
   */
  undoPaths?: readonly AllowedPath[];
}

/**
 * A tool that changes an existing record with a delta.
 *
 * @example
 * const tagTicket = declareWriteTool({
 *   name: "tag_ticket", recordType: "ticket", system: "helpdesk",
 *   params: z.object({ tag: z.string() }), intentFields: ["tag"],
 *   allowedPaths: ["/tags/-"], keyScope: "run", versionPolicy: "strict",
 *   reconcile: "idempotency-key",
 * });
 */
export interface EditToolDeclaration<P extends Record<string, unknown> = Record<string, unknown>> extends ToolDeclarationBase<P> {
  /**
   * JSON Pointer patterns a delta may touch (`*` is one segment, a trailing
   * `/**` any depth), with the operations allowed there. A bare pattern allows
   * `add`, `replace` and `test`; `remove`, `move` and `copy` must be named:
   * `{ path: "/tags/*", ops: ["remove"] }`.
   */
  allowedPaths: readonly AllowedPath[];
  versionPolicy: VersionPolicy;
  /**
   * How the tool's delta derives from its validated params and the record as
   * it is: the owner rebuilds it right before the PATCH and refuses an intent
   * whose delta differs (`delta_mismatch`), so a change can never say more
   * than its params (a refund of 1 cent in the params cannot write 99,999,999
   * from its delta). Required when owners run with an agent registry.
   */
  delta?: (params: P, current: Versioned) => JsonPatchOp[];
  create?: undefined;
}

/**
 * A tool that creates a record under an external id, at most once: its
 * intent's delta is `[{op: "add", path: "", value: body(params)}]` and its
 * base version `"absent"` (`ABSENT_VERSION`); the owner checks both against
 * the params. No delta function, paths or version policy: the body is the
 * whole change.
 *
 * @example
 * const openCase = declareWriteTool({
 *   name: "open_case", recordType: "case", system: "helpdesk",
 *   params: z.object({ orderRef: z.string(), subject: z.string() }), intentFields: ["orderRef"],
 *   create: { externalId: (p) => `order-${p.orderRef}`, body: (p) => ({ subject: p.subject, status: "open" }) },
 *   keyScope: "run", reconcile: "idempotency-key",
 * });
 */
export interface CreateToolDeclaration<P extends Record<string, unknown> = Record<string, unknown>> extends ToolDeclarationBase<P> {
  create: CreateDeclaration<P>;
  allowedPaths?: undefined;
  versionPolicy?: undefined;
  delta?: undefined;
}

/**
 * A write tool, declared once: an edit tool (a delta on an existing record)
 * or a create tool (`create`). The router admits it only with a key scope, a
 * version policy (edit tools) and a way to reconcile an unknown outcome.
 */
export type WriteToolDeclaration<P extends Record<string, unknown> = Record<string, unknown>> = EditToolDeclaration<P> | CreateToolDeclaration<P>;

export type PatchOpName = JsonPatchOp["op"];

/** A pattern a delta may touch, and the operations it may do there (a bare pattern: add, replace, test). */
export type AllowedPath = string | { path: string; ops: readonly PatchOpName[] };

const DEFAULT_OPS: readonly PatchOpName[] = ["add", "replace", "test"];

/** A tool the router admitted: defaults resolved, path matchers compiled. */
export interface AdmittedTool {
  readonly declaration: WriteToolDeclaration;
  readonly name: string;
  readonly recordType: string;
  readonly keyScope: KeyScope;
  readonly versionPolicy: VersionPolicy;
  readonly maxConflictCycles: number;
  readonly system: SystemOfRecord;
  readonly freeTextParams: readonly string[];
  /** The params the intent key is built from (owners recompute the key). */
  readonly intentFields: readonly string[];
  /** The delta the params give on `current` (see WriteToolDeclaration.delta); absent: not checked. */
  readonly deriveDelta?: (params: Record<string, unknown>, current: Versioned) => JsonPatchOp[];
  /** Set for a create tool: what it creates (see CreateToolDeclaration). */
  readonly create?: CreateDeclaration<Record<string, unknown>>;
  /** The compensating change of an applied intent; absent: the tool's writes cannot be undone. */
  readonly undo?: UndoFn<Record<string, unknown>>;
  /**
   * How an unknown outcome is settled. For a create: the declared function,
   * else the record's `intentKeyField`, else the system's idempotency-key lookup.
   */
  readonly reconcile: ReconcileFn;
  readonly timeoutMs: number;
  isAllowedPath(path: string): boolean;
  /** The operation is allowed where it acts (a move needs `move` on both paths, a copy `copy` on its target). */
  isAllowedOp(op: JsonPatchOp): boolean;
  isFreeTextPath(path: string): boolean;
  /** What the tool's undo may write (its `undoPaths`, else its `allowedPaths`); null: a create tool's undo, held to no narrower scope. */
  readonly undoScope: Pick<AdmittedTool, "name" | "isAllowedPath" | "isAllowedOp"> | null;
}

/** Declares a write tool; admission happens when the router starts. */
export function declareWriteTool<P extends Record<string, unknown>>(decl: EditToolDeclaration<P>): EditToolDeclaration<P>;
export function declareWriteTool<P extends Record<string, unknown>>(decl: CreateToolDeclaration<P>): CreateToolDeclaration<P>;
export function declareWriteTool<P extends Record<string, unknown>>(decl: WriteToolDeclaration<P>): WriteToolDeclaration<P>;
export function declareWriteTool<P extends Record<string, unknown>>(decl: WriteToolDeclaration<P>): WriteToolDeclaration<P> {
  return Object.freeze({ ...decl });
}

/** A declared value in an error message: short JSON, or what it is. */
function shown(v: unknown): string {
  if (typeof v === "function") return "a function";
  if (v === undefined) return "nothing";
  let text: string | undefined;
  try {
    text = JSON.stringify(v);
  } catch {
    text = undefined;
  }
  if (text === undefined) return typeof v;
  return text.length > 80 ? `${text.slice(0, 79)}…` : text;
}

/** The error of a field that takes `accepted`: what it takes, and what it got ("missing" when nothing). */
const expected = (accepted: string, missing = "missing") => ({
  error: (issue: { input?: unknown }) => (issue.input === undefined ? `${missing}: expected ${accepted}` : `expected ${accepted}, got ${shown(issue.input)}`),
});

const fn = (what: string) => z.custom<(...args: never[]) => unknown>((v) => typeof v === "function", expected(what));

const PATCH_OPS = ["add", "remove", "replace", "move", "copy", "test"] as const;
const listed = (values: readonly string[]) => values.map((v) => JSON.stringify(v)).join(", ");

const PathPatterns = z
  .array(
    z.union(
      [
        z.string().startsWith("/"),
        z.strictObject({ path: z.string().startsWith("/"), ops: z.array(z.enum(PATCH_OPS, expected(`one of ${listed(PATCH_OPS)}`))).min(1) }),
      ],
      expected(`a path pattern such as "/tags/-", or {path, ops} with ops among ${listed(PATCH_OPS)}`),
    ),
  )
  .min(1, "at least one allowed path")
  .optional();

const DeclarationShape = z.strictObject({
  name: z.string().regex(/^[a-zA-Z][a-zA-Z0-9_.-]{0,127}$/, "letters, digits, _ . -"),
  recordType: z.string().regex(/^[a-z][a-z0-9_-]{0,63}$/, "lower-case record type"),
  params: z.custom<z.ZodType>((v) => v instanceof Object && typeof (v as z.ZodType).safeParse === "function", expected("a zod schema")),
  intentFields: z.array(z.string()).min(1, "at least one intent field"),
  allowedPaths: PathPatterns,
  undoPaths: PathPatterns,
  freeTextPaths: z.array(z.string().startsWith("/")).optional(),
  freeTextParams: z.array(z.string()).optional(),
  keyScope: z.enum(["run", "global"], expected('"run" or "global"', "missing key scope")),
  versionPolicy: z.enum(["strict", "rebase-commutative"], expected('"strict" or "rebase-commutative"')).optional(),
  maxConflictCycles: z.number().int().min(0).max(20).default(2),
  system: z.string().min(1, "missing system-of-record adapter name"),
  timeoutMs: timerMs(1).optional(),
  description: z.string().optional(),
  reconcile: z.union([z.literal("idempotency-key"), z.custom<ReconcileFn>((v) => typeof v === "function")], expected('"idempotency-key" or a function')).optional(),
  delta: z.custom<(p: never, c: Versioned) => JsonPatchOp[]>((v) => typeof v === "function", expected("a function (params, current) => delta")).optional(),
  create: z
    .strictObject({
      externalId: fn("a function (params) => the external id"),
      body: fn("a function (params) => the new record"),
      intentKeyField: z.string().min(1).max(128).optional(),
    })
    .optional(),
  undo: fn("a function (params, applied, { intentKey }) => the compensating delta").optional(),
});

/** The declared fields, for "did you mean" on an unknown one. */
const DECLARATION_FIELDS = Object.keys(DeclarationShape.shape);

/** The field `key` most likely stands for: one at most two edits away (a typo), else undefined. */
function nearestField(key: string): string | undefined {
  let best: { field: string; d: number } | undefined;
  for (const field of DECLARATION_FIELDS) {
    const d = editDistance(key.toLowerCase(), field.toLowerCase());
    if (d <= 2 && (best === undefined || d < best.d)) best = { field, d };
  }
  return best?.field;
}

function editDistance(a: string, b: string): number {
  let prev = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const row = [i];
    for (let j = 1; j <= b.length; j++) row[j] = Math.min(prev[j]! + 1, row[j - 1]! + 1, prev[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    prev = row;
  }
  return prev[b.length]!;
}

/** One problem per zod issue of a declaration: the field, then what is wrong with it. */
function shapeProblems(label: string, issues: readonly z.core.$ZodIssue[]): string[] {
  return issues.flatMap((issue) => {
    if (issue.code === "unrecognized_keys") {
      return issue.keys.map((key) => {
        const near = nearestField(key);
        return `${label}: ${key}: not a field of a tool declaration${near ? ` (did you mean ${near}?)` : ""}`;
      });
    }
    return [`${label}: ${issue.path.map(String).join(".") || "declaration"}: ${issue.message}`];
  });
}

function compilePatterns(patterns: readonly AllowedPath[]): (path: string) => Set<PatchOpName> {
  const compiled = patterns.map((entry) => {
    const pattern = typeof entry === "string" ? entry : entry.path;
    const ops = typeof entry === "string" ? DEFAULT_OPS : entry.ops;
    const parts = pattern.split("/").slice(1);
    const deep = parts.at(-1) === "**";
    return { parts: deep ? parts.slice(0, -1) : parts, deep, ops };
  });
  return (path) => {
    const segs = path.split("/").slice(1);
    const allowed = new Set<PatchOpName>();
    for (const { parts, deep, ops } of compiled) {
      if (deep ? segs.length < parts.length : segs.length !== parts.length) continue;
      if (parts.every((p, i) => p === "*" || p === segs[i])) for (const op of ops) allowed.add(op);
    }
    return allowed;
  };
}

function pathMatcher(patterns: readonly AllowedPath[]): (path: string) => boolean {
  const ops = compilePatterns(patterns);
  return (path) => ops(path).size > 0;
}

/**
 * Admits declared tools against the configured systems of record. Throws one
 * `tool_not_admitted` error naming each tool and what it lacks.
 */
export function admitTools(
  declarations: readonly WriteToolDeclaration<any>[],
  systems: readonly SystemOfRecord[],
  defaults: { sorTimeoutMs: number; requireDelta?: boolean },
): Map<string, AdmittedTool> {
  const problems: string[] = [];
  const admitted = new Map<string, AdmittedTool>();
  const byName = new Map(systems.map((s) => [s.name, s]));
  for (const decl of declarations) {
    const label = `tool ${JSON.stringify((decl as { name?: unknown } | null | undefined)?.name ?? "(unnamed)")}`;
    const shape = DeclarationShape.safeParse(decl);
    if (!shape.success) {
      problems.push(...shapeProblems(label, shape.error.issues));
      continue;
    }
    const d = shape.data;
    if (admitted.has(d.name)) problems.push(`${label}: declared twice`);
    const system = byName.get(d.system);
    if (!system) {
      problems.push(`${label}: system: "${d.system}" is not configured (have: ${[...byName.keys()].map((n) => `"${n}"`).join(", ") || "none"})`);
      continue;
    }
    const create = decl.create as CreateDeclaration<Record<string, unknown>> | undefined;
    if (create) {
      if (decl.delta !== undefined) problems.push(`${label}: delta: a create tool's change is its create.body; it declares no delta function`);
      if (decl.allowedPaths !== undefined) problems.push(`${label}: allowedPaths: a create tool writes its whole body; it declares no allowed paths`);
      if (decl.versionPolicy !== undefined) problems.push(`${label}: versionPolicy: a create tool has no base version; it declares no version policy`);
      if (typeof system.upsertByExternalId !== "function") problems.push(`${label}: create needs system "${system.name}" to create by external id (upsertByExternalId), and it cannot`);
    } else {
      if (d.allowedPaths === undefined) problems.push(`${label}: allowedPaths: at least one allowed path`);
      if (d.versionPolicy === undefined) problems.push(`${label}: versionPolicy: missing version policy: expected "strict" or "rebase-commutative"`);
    }
    if (d.undoPaths !== undefined && typeof decl.undo !== "function") problems.push(`${label}: undoPaths: declared without an undo function`);
    let reconcile: ReconcileFn | undefined;
    if (typeof decl.reconcile === "function") reconcile = decl.reconcile;
    else if (create?.intentKeyField !== undefined && decl.reconcile === undefined) {
      // The create stamped the record with its intent key: a record under the external id is ours only if it carries it.
      const field = create.intentKeyField;
      reconcile = ({ intent, current }) => {
        if (current === null) return "not_applied";
        const state = current.state;
        if (typeof state !== "object" || state === null || Array.isArray(state)) return "unknown";
        return Object.hasOwn(state, field) && (state as Record<string, unknown>)[field] === intent.intentKey ? "applied" : "not_applied";
      };
    } else if (decl.reconcile === "idempotency-key" || (decl.reconcile === undefined && system.capabilities.idempotencyLookup)) {
      if (system.capabilities.idempotencyLookup && system.lookupIdempotencyKey) {
        reconcile = ({ intent, system: s, timeoutMs, headers }) => s.lookupIdempotencyKey!(intent.entity, intent.intentKey, { timeoutMs, headers });
      } else {
        problems.push(`${label}: reconcile "idempotency-key" needs system "${system.name}" to look up idempotency keys, and it cannot`);
      }
    } else if (decl.reconcile !== undefined) {
      problems.push(`${label}: reconcile: expected "idempotency-key" or a function, got ${shown(decl.reconcile)}`);
    } else {
      problems.push(
        `${label}: missing reconcile: system "${system.name}" keeps no idempotency keys, so an unknown outcome needs a reconcile function` +
          (create ? " (or create.intentKeyField)" : ""),
      );
    }
    const shape2 = (d.params as { shape?: Record<string, unknown> }).shape;
    if (shape2) {
      for (const f of d.intentFields) if (!(f in shape2)) problems.push(`${label}: intent field "${f}" is not a param`);
    }
    if (defaults.requireDelta && !create && typeof decl.delta !== "function") {
      problems.push(`${label}: missing delta: with an agent registry every tool declares how its delta derives from its params`);
    }
    if (!reconcile) continue;
    const isAllowedPath = pathMatcher(d.allowedPaths ?? []);
    const isAllowedOp = opMatcher(d.allowedPaths ?? []);
    admitted.set(d.name, {
      declaration: decl,
      name: d.name,
      recordType: d.recordType,
      keyScope: d.keyScope,
      versionPolicy: d.versionPolicy ?? "strict",
      maxConflictCycles: d.maxConflictCycles,
      system,
      freeTextParams: d.freeTextParams ?? [],
      intentFields: d.intentFields,
      ...(typeof decl.delta === "function" ? { deriveDelta: decl.delta as (p: Record<string, unknown>, c: Versioned) => JsonPatchOp[] } : {}),
      ...(create ? { create } : {}),
      ...(typeof decl.undo === "function" ? { undo: decl.undo as UndoFn<Record<string, unknown>> } : {}),
      reconcile,
      timeoutMs: d.timeoutMs ?? defaults.sorTimeoutMs,
      isAllowedPath,
      isAllowedOp,
      isFreeTextPath: pathMatcher(d.freeTextPaths ?? []),
      undoScope: d.undoPaths ? { name: d.name, isAllowedPath: pathMatcher(d.undoPaths), isAllowedOp: opMatcher(d.undoPaths) } : create ? null : { name: d.name, isAllowedPath, isAllowedOp },
    });
  }
  if (problems.length > 0) {
    throw new WritError("tool_not_admitted", `write tools not admitted: ${problems.join("; ")}`, {
      retriable: false,
      context: { problems },
    });
  }
  return admitted;
}

function opMatcher(patterns: readonly AllowedPath[]): (op: JsonPatchOp) => boolean {
  const ops = compilePatterns(patterns);
  return (op) => {
    if (!ops(op.path).has(op.op)) return false;
    if (op.op === "move") return ops(op.from).has("move");
    if (op.op === "copy") return ops(op.from).size > 0;
    return true;
  };
}

/** True when every op appends to an array, so it commutes with other appends. */
export function isCommutative(delta: readonly JsonPatchOp[]): boolean {
  return delta.every((op) => op.op === "add" && op.path.endsWith("/-"));
}
