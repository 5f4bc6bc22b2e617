import { z } from "zod";
import { Audience, EntityRef, IsoTime, JsonPatchOp, Version } from "./common.ts";

/**
 * The `baseVersion` of a create (a tool that declares `create`): the agent
 * read no record under this external id. The owner creates with
 * `If-None-Match: *`.
 */
export const ABSENT_VERSION = "absent";

/**
 * The `baseVersion` of an undo: the owner takes the version the undone write
 * produced from its ledger, and the undo applies only on that version.
 */
export const LEDGER_VERSION = "ledger";

/**
 * The `baseVersion` of a lease intent (`lease.op` `acquire` or `release`):
 * it writes nothing to the record, and the owner reads the record itself.
 */
export const LEASE_VERSION = "lease";

/** How long a lease lasts when its acquire names no `ttlMs`. */
export const DEFAULT_LEASE_TTL_MS = 60_000;

/** Longest lease an agent may ask for: a lease points at a running change, never a parking spot. */
export const MAX_LEASE_TTL_MS = 600_000;

/**
 * How long a record stays out of an agent's reach once that agent's lease of it ended past the owners' longest hold
 * (WRIT_LEASE_MAX_HOLD_MS), and how long after any of its leases of it ends a new grant to it continues that lease's
 * hold (docs/architecture.md §10.3). Over four times the longest wait between a client's asks for a leased record (2 s,
 * +20 %): every client waiting for the record asks again while the agent is kept off it. Fixed, not a setting: every
 * owner replaying a partition's ledger decides the same from the lease entry alone.
 */
export const LEASE_COOLDOWN_MS = 10_000;

/** Longest run id and step id an intent carries (its `agent.runId`, `agent.stepId`). */
export const MAX_RUN_ID_LENGTH = 256;

/** Shortest lease an agent may ask for. */
export const MIN_LEASE_TTL_MS = 1000;

/**
 * Set on the intents of a change that spans records (see `client.change()`
 * and docs/architecture.md §10): `acquire` takes the record's lease for the
 * change, `release` gives it back, and `step` marks a write (or an undo) made
 * under it. While a change holds a record's lease, the record's other writes
 * are answered `leased`; a step whose change does not hold it is answered
 * `lease_not_held`. A lease is bound to the change id and the agent.
 */
export const IntentLease = z.object({
  /** The change's id: `changeId()` of the agent, run and step that started the change. */
  change: z.string().regex(/^[0-9a-f]{64}$/, "64 hex chars from changeId()"),
  op: z.enum(["acquire", "release", "step"]),
  /** How long the lease lasts from its (re)grant, in ms; `acquire` only. */
  ttlMs: z.number().int().min(MIN_LEASE_TTL_MS).max(MAX_LEASE_TTL_MS).optional(),
});
export type IntentLease = z.infer<typeof IntentLease>;

/**
 * WriteIntent: what an agent's write tool publishes.
 *
 * Topic `writ.intents` (configurable); key `<recordType>:<id>` so that every
 * entity lands on one partition and has one writer. Compatibility
 * (docs/wire-contract.md §9): new optional fields only; owners accept intents
 * from older clients, and drop fields they do not know from newer ones (the
 * objects are closed: such a field is accepted at BACKWARD, not FORWARD/FULL).
 */
export const WriteIntent = z
  .object({
    /** Unique per submission; correlates the reply. */
    intentId: z.string().min(1).max(128),
    /** sha256 hex over the business intent (see `intentKey()`); stable across retries and resume. */
    intentKey: z.string().regex(/^[0-9a-f]{64}$/, "64 hex chars from intentKey()"),
    entity: EntityRef,
    tool: z.string().min(1).max(128),
    agent: z
      .object({
        id: z.string().min(1).max(128),
        runId: z.string().min(1).max(MAX_RUN_ID_LENGTH),
        stepId: z.string().min(1).max(MAX_RUN_ID_LENGTH),
        toolCallId: z.string().min(1).max(256).optional(),
      }),
    /**
     * The ETag the agent read; the harness carries it from the last read, the model never invents one.
     * A create carries {@link ABSENT_VERSION}, an undo {@link LEDGER_VERSION}.
     */
    baseVersion: Version,
    /**
     * RFC 6902 operations: a delta, never a whole record. A create's is one `add` of the new record at
     * `""`; an undo's is empty (the owner derives the compensating change); any other has at least one op.
     */
    delta: z.array(JsonPatchOp).max(256),
    /** The tool's structured intent fields. */
    params: z.record(z.string(), z.unknown()),
    /** The agent's reply topic; must start with the router's allowed prefix. */
    replyTo: z.string().min(1).max(249),
    createdAt: IsoTime,
    /**
     * Set on an undo: the intent whose applied change this one compensates. Its intent key is
     * `undoIntentKey(undo.intentKey)`, its tool and entity the undone intent's, its params `{}`.
     */
    undo: z.object({ intentKey: z.string().regex(/^[0-9a-f]{64}$/, "the undone intent's key") }).optional(),
    /**
     * Set on the intents of a change that spans records: its lease on this record. A lease intent
     * (`acquire`, `release`) has an empty delta, empty params, base version {@link LEASE_VERSION} and
     * the key `leaseIntentKey(change, op, entity)`.
     */
    lease: IntentLease.optional(),
    /**
     * The deployment the agent signed the intent for (its owners' `WRIT_SIGNING_AUDIENCE`). Owners that require an
     * audience refuse a signed intent without theirs (`unauthenticated`), so signed bytes read from one deployment's
     * topic cannot be replayed on another that lists the same agent key. Covered by the signature as every member is.
     */
    audience: Audience.optional(),
  })
  .refine((i) => (i.delta.length === 0) === (i.undo !== undefined || isLeaseOp(i.lease)), {
    message: "the delta must have at least one operation (only an undo, a lease acquire or a lease release has none)",
    path: ["delta"],
  });
export type WriteIntent = z.infer<typeof WriteIntent>;

/** A lease intent proper (it takes or gives back a lease, and writes nothing to the record). */
export function isLeaseOp(lease: IntentLease | undefined): lease is IntentLease & { op: "acquire" | "release" } {
  return lease !== undefined && lease.op !== "step";
}
