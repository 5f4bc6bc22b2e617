import type { EntityRef, JsonPatchOp, Versioned } from "../schemas/common.ts";

/** What a PATCH came to. `unknown` means the request may have committed: reconcile, never replay blind. */
export type PatchOutcome =
  | { kind: "applied"; state: unknown; version: string }
  /** 412: the record's version is not the If-Match one (RFC 9110 §13.1.1). */
  | { kind: "precondition_failed"; current: Versioned | null }
  | { kind: "not_found" }
  /** The system refused the change itself (4xx other than 412): retrying cannot help. */
  | { kind: "rejected"; status: number; message: string }
  /**
   * Known not to have reached the system (connection refused, DNS, 408, 429): safe to try again.
   * `retryAfterMs`: the wait the answer's Retry-After asked for, if it gave one.
   */
  | { kind: "unavailable"; message: string; retryAfterMs?: number }
  /** Sent, and no answer that settles it (timeout, connection dropped, 5xx): reconcile; `retryAfterMs` as above. */
  | { kind: "unknown"; message: string; retryAfterMs?: number };

export type ReconcileResult = "applied" | "not_applied" | "unknown";

export interface PatchOptions {
  /** The ETag the write is conditional on, sent as If-Match. */
  ifMatch: string;
  /** Sent as Idempotency-Key where the system honours it; always the intent key. */
  idempotencyKey: string;
  /** Deadline of the request in ms; past it the outcome is `unknown`. */
  timeoutMs: number;
  /** Extra request headers: `x-writ-owner` (the owner instance), and trace context. Never credentials. */
  headers?: Readonly<Record<string, string>>;
}

/** Options of a create by external id (see {@link SystemOfRecord.upsertByExternalId}). */
export interface CreateOptions {
  /**
   * The precondition: `*` creates only where no record has this external id
   * (sent as `If-None-Match: *`, RFC 9110 §13.1.2), so the write never
   * overwrites a record, whoever made it. writ's owner always sends `*`.
   */
  ifNoneMatch: "*";
  /** Sent as Idempotency-Key where the system honours it; always the intent key. */
  idempotencyKey: string;
  /** Deadline of the request in ms; past it the outcome is `unknown`. */
  timeoutMs: number;
  /** Extra request headers, as in {@link PatchOptions.headers}. */
  headers?: Readonly<Record<string, string>>;
}

export interface ReadOptions {
  timeoutMs: number;
  /** Extra request headers, as in {@link PatchOptions.headers}. */
  headers?: Readonly<Record<string, string>>;
}

/**
 * A system of record (CRM, ERP, helpdesk, billing API) as writ's owner sees it.
 * Only the partition owner calls `patch`; everything else reads.
 */
export interface SystemOfRecord {
  /** Name tools refer to in their declaration. */
  readonly name: string;
  /**
   * `idempotencyKeys`: the system dedupes writes by Idempotency-Key.
   * `idempotencyLookup`: it can say whether a key was applied, which gives
   * reconcile a path without a tool-specific query.
   */
  readonly capabilities: { readonly idempotencyKeys: boolean; readonly idempotencyLookup: boolean };
  /**
   * Reads the record and its version; null when it does not exist. Throws a
   * WritError: `sor_unavailable` (retriable) when the system cannot be reached
   * or answers 5xx/408/429 or times out: the owner pauses and tries again
   * (at least `context.retryAfterMs`, the answer's Retry-After, when it is set);
   * `sor_protocol` (not retriable) for an answer that breaks the contract
   * (401/403, no or weak ETag, not JSON): the intent is answered with the reason.
   */
  read(entity: EntityRef, opts: ReadOptions): Promise<Versioned | null>;
  patch(entity: EntityRef, ops: readonly JsonPatchOp[], opts: PatchOptions): Promise<PatchOutcome>;
  /**
   * Whether a write with this idempotency key was applied; only where
   * `capabilities.idempotencyLookup`. `unknown` is an answer that does not
   * settle it; an unreachable system throws `sor_unavailable` instead.
   */
  lookupIdempotencyKey?(entity: EntityRef, idempotencyKey: string, opts: ReadOptions): Promise<ReconcileResult>;
  /**
   * Writes `state` as the record whose external id is `entity.id`, under the
   * precondition `opts.ifNoneMatch` (`*`: only if no such record exists), so
   * that with writ it is a create-if-absent. Outcomes as for `patch`:
   * `applied` (created, with the record and its version), `precondition_failed`
   * (a record with this external id exists: with it when the answer carries
   * it, else null), `not_found` (the system has no place for such records),
   * `rejected`, `unavailable` (not sent), `unknown` (maybe created: reconcile).
   * Needed by tools that declare `create`.
   */
  upsertByExternalId?(entity: EntityRef, state: unknown, opts: CreateOptions): Promise<PatchOutcome>;
  close?(): Promise<void>;
}
