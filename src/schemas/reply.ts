import { z } from "zod";
import { ESCALATION_REASONS, REJECT_REASONS } from "../errors.ts";
import { EntityRef, IsoTime, JsonPatch, openReason, Version, Versioned } from "./common.ts";

const base = {
  intentId: z.string(),
  intentKey: z.string(),
  /** True when this is the stored answer re-sent for a repeated submission. */
  duplicate: z.boolean(),
  at: IsoTime,
};

export const AppliedReply = z
  .looseObject({
    status: z.literal("applied"),
    ...base,
    entity: EntityRef,
    /** The record after the write (null on a repeat, or when `truncated`), and its new ETag. */
    state: z.unknown(),
    version: Version,
    /**
     * How the outcome was established: the PATCH response, the create response (a tool that declares
     * `create`), or reconciling with the system of record.
     */
    via: z.enum(["patch", "create", "reconcile", "lease"]),
    /** The write tool, so that the write can be undone from its reply (`client.undo(reply)`). */
    tool: z.string().optional(),
    /** Set on the reply to an undo: the intent key of the write it compensated. */
    undoOf: z.string().optional(),
    /**
     * Set on a repeat (`duplicate`) of a write that an applied undo has compensated since: that undo's intent key.
     * The write is answered applied, as it was, but its effect no longer stands (a change compensated before).
     */
    undoneBy: z.string().optional(),
    /**
     * Set on the reply to a lease intent (`via: "lease"`: nothing was written; `state` and `version` are the
     * record as the owner read it): the change, and until when it holds the lease (absent once released).
     * `heldBefore` (on a granted acquire): the change and agent held the record before, within its replay mark's
     * life (an earlier run, whose lease was released or lapsed), as a refused acquire's `details.heldBefore` says.
     * Unchecked here, as `details` is: a reply whose `heldBefore` is not a boolean is still read (its lease granted,
     * and released); clients count any value but absent, null or false (read as absent, a hostile value would give
     * the unsafe answer, `not_started`).
     * Only an agent that sends lease intents gets one.
     */
    lease: z.looseObject({ change: z.string(), expiresAt: IsoTime.optional(), released: z.boolean().optional(), heldBefore: z.unknown().optional() }).optional(),
    /** Set when the state was left out because the reply would exceed the broker's message size. */
    truncated: z.boolean().optional(),
  });

export const ConflictReply = z
  .looseObject({
    status: z.literal("conflict"),
    ...base,
    entity: EntityRef,
    /** 1-based; past the tool's limit the intent is escalated instead. */
    cycle: z.number().int().min(1),
    message: z.string(),
    current: Versioned,
    your_change: JsonPatch,
    /** Set when `current.state` was left out because the reply would exceed the broker's message size. */
    truncated: z.boolean().optional(),
  });

export const RejectedReply = z
  .looseObject({
    status: z.literal("rejected"),
    ...base,
    reason: openReason(REJECT_REASONS),
    message: z.string(),
    details: z.unknown().optional(),
    /** Set when `details` was left out (and `message` cut to 2,000 characters) because the reply would exceed the broker's message size. */
    truncated: z.boolean().optional(),
  });

export const EscalatedReply = z
  .looseObject({
    status: z.literal("escalated"),
    ...base,
    entity: EntityRef,
    reason: openReason(ESCALATION_REASONS),
    message: z.string(),
    escalationId: z.string(),
  });

/**
 * Reply: the owner's answer on the agent's reply topic.
 *
 * Topic: the intent's `replyTo` (prefix `writ.replies.` by default); key the
 * intent id. Compatibility (docs/wire-contract.md §9, which also says which
 * registry levels accept each change): writers add optional members and
 * reasons only; readers tolerate members they do not know (objects are loose)
 * and reasons they do not know (a new reason reaches old readers as its
 * status); a new status is a breaking change. Records with the
 * `writ-control` header are not replies (see `control.ts`).
 */
export const Reply = z.discriminatedUnion("status", [AppliedReply, ConflictReply, RejectedReply, EscalatedReply]);
export type Reply = z.infer<typeof Reply>;
export type AppliedReply = z.infer<typeof AppliedReply>;
export type ConflictReply = z.infer<typeof ConflictReply>;
export type RejectedReply = z.infer<typeof RejectedReply>;
export type EscalatedReply = z.infer<typeof EscalatedReply>;
