// A scriptable, in-memory system of record for the owner's unit tests:
// records with strong versions (`"1"`, `"2"`, … as quoted ETags; or, with
// `etags: "content"`, a hash of the record, which comes back when the record
// does), If-Match on every PATCH, a truthful idempotency-key lookup, and faults
// scripted per call. It counts what reached it (reads, PATCHes, commits per
// entity key and per idempotency key), so tests assert effects where they happen.
import jsonpatch from "fast-json-patch";
import type { Operation } from "fast-json-patch";
import { canonicalJson, sha256Hex } from "../../../src/canonical-json.ts";
import { WritError } from "../../../src/errors.ts";
import type { EntityRef, JsonPatchOp, Versioned } from "../../../src/schemas/common.ts";
import { entityKey } from "../../../src/schemas/common.ts";
import type { CreateOptions, PatchOptions, PatchOutcome, ReadOptions, ReconcileResult, SystemOfRecord } from "../../../src/sor/adapter.ts";

/** What one scripted read does: read as usual (`ok`, to reach a later fault), or throw. */
export type ReadFault = { kind: "ok" } | { kind: "throw"; error: unknown };

/** What one scripted PATCH does instead of the default (If-Match, apply, answer `applied`). */
export type PatchFault =
  /** Answers this outcome and leaves the record alone (after another writer's `changeFirst`, if given). */
  | { kind: "answer"; outcome: PatchOutcome; changeFirst?: JsonPatchOp[] }
  /** Applies the change (If-Match permitting), then the answer is lost: `unknown`. */
  | { kind: "commit-then-unknown" }
  /** Applies the change (If-Match permitting), then throws: an adapter that breaks the PatchOutcome contract. */
  | { kind: "commit-then-throw"; error: unknown }
  /**
   * The request is still on its way when the owner stops waiting (`unknown`), and arrives later: just before the
   * system's `after`-th next call (a read, lookup, PATCH or create), or, without `after`, when the test calls
   * {@link FakeSystem.landHeld}. It is checked when it arrives, like any request: If-Match, then applied.
   */
  | { kind: "lands-later"; after?: number }
  /**
   * Another writer changes the record just before this PATCH arrives; the PATCH then runs as usual.
   * With `idempotencyKey`, that writer was writ itself (an earlier owner's late request).
   */
  | { kind: "changed-first"; ops: JsonPatchOp[]; idempotencyKey?: string }
  | { kind: "throw"; error: unknown };

/** What one scripted create (`upsertByExternalId`) does instead of the default (create if absent, else 412 with the record). */
export type CreateFault =
  /** Answers this outcome and creates nothing. */
  | { kind: "answer"; outcome: PatchOutcome }
  /** Creates (if absent), then the answer is lost: `unknown`. */
  | { kind: "commit-then-unknown" }
  /** Another writer creates the record just before this request arrives (writ itself, with `idempotencyKey`). */
  | { kind: "created-first"; state: unknown; idempotencyKey?: string }
  | { kind: "throw"; error: unknown };

export interface CreateCall {
  entity: string;
  state: unknown;
  ifNoneMatch: string;
  idempotencyKey: string;
}

/** What one scripted idempotency-key lookup answers instead of the truth. */
export type LookupFault = { kind: "answer"; result: ReconcileResult } | { kind: "throw"; error: unknown };

export interface PatchCall {
  entity: string;
  ops: readonly JsonPatchOp[];
  ifMatch: string;
  idempotencyKey: string;
  headers: Readonly<Record<string, string>> | undefined;
}

interface StoredRecord {
  state: unknown;
  n: number;
}

/** A request that left and has not arrived yet (`lands-later`): it arrives before the call numbered `due`. */
interface HeldPatch {
  key: string;
  ops: readonly JsonPatchOp[];
  opts: PatchOptions;
  due: number;
}

/**
 * `counter`: the version is a counter of changes (never comes back). `content`: a hash of the record's state, as
 * APIs that compute the ETag from the body do: a record changed and changed back has its old version again.
 */
export type EtagKind = "counter" | "content";

/** `sor_unavailable`, retriable: the system cannot be reached. */
export function outage(message = "connection refused"): WritError {
  return new WritError("sor_unavailable", message, { retriable: true });
}

/** `sor_protocol`, not retriable: an answer that breaks the contract. */
export function protocolError(message = "weak ETag W/\"1\" on GET"): WritError {
  return new WritError("sor_protocol", message, { retriable: false });
}

export const version = (n: number): string => `"${n}"`;

export class FakeSystem implements SystemOfRecord {
  readonly name: string;
  readonly capabilities: { idempotencyKeys: boolean; idempotencyLookup: boolean };
  private readonly records = new Map<string, StoredRecord>();
  /** Idempotency keys of the PATCHes that committed, with the entity they changed. */
  private readonly appliedKeys = new Map<string, string>();

  readonly script = { read: [] as ReadFault[], patch: [] as PatchFault[], lookup: [] as LookupFault[], create: [] as CreateFault[] };
  readonly reads: string[] = [];
  readonly patches: PatchCall[] = [];
  readonly creates: CreateCall[] = [];
  readonly lookups: string[] = [];
  /** Changes that took effect, per entity key (writ's and other writers'). */
  private readonly commitLog: { entity: string; idempotencyKey: string | null }[] = [];
  private readonly etags: EtagKind;
  private readonly held: HeldPatch[] = [];
  /** Calls that reached the system (reads, lookups, PATCHes, creates): the clock of `lands-later`. */
  private calls = 0;

  constructor(name = "helpdesk", capabilities = { idempotencyKeys: false, idempotencyLookup: true }, opts: { etags?: EtagKind } = {}) {
    this.name = name;
    this.capabilities = capabilities;
    this.etags = opts.etags ?? "counter";
  }

  seed(entity: EntityRef, state: unknown, n = 1): string {
    const r = { state: structuredClone(state), n };
    this.records.set(entityKey(entity), r);
    return this.versionOf(r);
  }

  delete(entity: EntityRef): void {
    this.records.delete(entityKey(entity));
  }

  /**
   * Another writer changes the record (the version moves on), without a request
   * counted in {@link patches}. With `idempotencyKey` the change is a write of
   * writ's that took effect out of sight (an earlier owner's): the lookup knows it.
   */
  change(entity: EntityRef, ops: JsonPatchOp[], idempotencyKey?: string): string {
    const key = entityKey(entity);
    const r = this.records.get(key);
    if (!r) throw new Error(`no record ${key}`);
    r.state = jsonpatch.applyPatch(structuredClone(r.state), structuredClone(ops) as Operation[], true, false).newDocument;
    r.n++;
    if (idempotencyKey !== undefined) this.appliedKeys.set(idempotencyKey, key);
    this.commitLog.push({ entity: key, idempotencyKey: idempotencyKey ?? null });
    return this.versionOf(r);
  }

  current(entity: EntityRef): Versioned | null {
    const r = this.records.get(entityKey(entity));
    return r ? { state: structuredClone(r.state), version: this.versionOf(r) } : null;
  }

  /** Requests sent (`lands-later`) that have not arrived yet. */
  get inFlight(): number {
    return this.held.length;
  }

  /** The held requests arrive now, oldest first (each checked as it arrives); how many of them took effect. */
  landHeld(): number {
    let landed = 0;
    for (const h of this.held.splice(0)) if (this.apply(h.key, h.ops, h.opts).kind === "applied") landed++;
    return landed;
  }

  /** A call reaches the system: the held requests due by now arrive first. */
  private tick(): void {
    this.calls++;
    for (let i = 0; i < this.held.length; ) {
      const h = this.held[i]!;
      if (h.due > this.calls) {
        i++;
        continue;
      }
      this.held.splice(i, 1);
      this.apply(h.key, h.ops, h.opts);
    }
  }

  private versionOf(r: StoredRecord): string {
    return this.etags === "content" ? `"c${sha256Hex(canonicalJson(r.state)).slice(0, 16)}"` : version(r.n);
  }

  /** PATCH requests that reached the system for an entity. */
  patchCount(entity: EntityRef): number {
    const key = entityKey(entity);
    return this.patches.filter((p) => p.entity === key).length;
  }

  /** Changes writ's PATCHes made that took effect, for an idempotency key (the intent key). */
  commitsOf(idempotencyKey: string): number {
    return this.commitLog.filter((c) => c.idempotencyKey === idempotencyKey).length;
  }

  async read(entity: EntityRef, _opts: ReadOptions): Promise<Versioned | null> {
    this.tick();
    this.reads.push(entityKey(entity));
    const fault = this.script.read.shift();
    if (fault?.kind === "throw") throw fault.error;
    return this.current(entity);
  }

  async patch(entity: EntityRef, ops: readonly JsonPatchOp[], opts: PatchOptions): Promise<PatchOutcome> {
    this.tick();
    const key = entityKey(entity);
    this.patches.push({ entity: key, ops, ifMatch: opts.ifMatch, idempotencyKey: opts.idempotencyKey, headers: opts.headers });
    const fault = this.script.patch.shift();
    if (fault?.kind === "lands-later") {
      this.held.push({ key, ops: structuredClone(ops), opts: { ...opts }, due: this.calls + (fault.after ?? Number.POSITIVE_INFINITY) });
      return { kind: "unknown", message: `no answer within ${opts.timeoutMs} ms` };
    }
    if (fault?.kind === "answer") {
      if (fault.changeFirst) this.change(entity, fault.changeFirst);
      return fault.outcome;
    }
    if (fault?.kind === "throw") throw fault.error;
    if (fault?.kind === "changed-first") this.change(entity, fault.ops, fault.idempotencyKey);
    const outcome = this.apply(key, ops, opts);
    if (fault?.kind === "commit-then-unknown") return { kind: "unknown", message: "socket hang up after the request was sent" };
    if (fault?.kind === "commit-then-throw") throw fault.error;
    return outcome;
  }

  /** Create-if-absent (`If-None-Match: *`): a record under the id is `precondition_failed` carrying it. */
  async upsertByExternalId(entity: EntityRef, state: unknown, opts: CreateOptions): Promise<PatchOutcome> {
    this.tick();
    const key = entityKey(entity);
    this.creates.push({ entity: key, state: structuredClone(state), ifNoneMatch: opts.ifNoneMatch, idempotencyKey: opts.idempotencyKey });
    const fault = this.script.create.shift();
    if (fault?.kind === "answer") return fault.outcome;
    if (fault?.kind === "throw") throw fault.error;
    if (fault?.kind === "created-first") this.createRecord(key, fault.state, fault.idempotencyKey ?? null);
    const existing = this.records.get(key);
    if (existing) return { kind: "precondition_failed", current: { state: structuredClone(existing.state), version: this.versionOf(existing) } };
    const created = this.createRecord(key, state, opts.idempotencyKey);
    if (fault?.kind === "commit-then-unknown") return { kind: "unknown", message: "socket hang up after the request was sent" };
    return { kind: "applied", state: structuredClone(state), version: this.versionOf(created) };
  }

  /** Create requests that reached the system for an entity. */
  createCount(entity: EntityRef): number {
    const key = entityKey(entity);
    return this.creates.filter((c) => c.entity === key).length;
  }

  private createRecord(key: string, state: unknown, idempotencyKey: string | null): StoredRecord {
    const r = { state: structuredClone(state), n: 1 };
    this.records.set(key, r);
    if (idempotencyKey !== null) this.appliedKeys.set(idempotencyKey, key);
    this.commitLog.push({ entity: key, idempotencyKey });
    return r;
  }

  async lookupIdempotencyKey(entity: EntityRef, idempotencyKey: string, _opts: ReadOptions): Promise<ReconcileResult> {
    this.tick();
    this.lookups.push(idempotencyKey);
    const fault = this.script.lookup.shift();
    if (fault?.kind === "answer") return fault.result;
    if (fault?.kind === "throw") throw fault.error;
    return this.appliedKeys.get(idempotencyKey) === entityKey(entity) ? "applied" : "not_applied";
  }

  private apply(key: string, ops: readonly JsonPatchOp[], opts: PatchOptions): PatchOutcome {
    const r = this.records.get(key);
    if (!r) return { kind: "not_found" };
    if (opts.ifMatch !== this.versionOf(r)) return { kind: "precondition_failed", current: { state: structuredClone(r.state), version: this.versionOf(r) } };
    let next: unknown;
    try {
      next = jsonpatch.applyPatch(structuredClone(r.state), structuredClone(ops) as Operation[], true, false).newDocument;
    } catch (err) {
      return { kind: "rejected", status: 422, message: `patch does not apply: ${(err as Error).message}` };
    }
    r.state = next;
    r.n++;
    this.appliedKeys.set(opts.idempotencyKey, key);
    this.commitLog.push({ entity: key, idempotencyKey: opts.idempotencyKey });
    return { kind: "applied", state: structuredClone(r.state), version: this.versionOf(r) };
  }
}
