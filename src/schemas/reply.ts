import { z } from "zod";
import { REJECT_REASONS } from "../errors.ts";
import { EntityRef, IsoTime, JsonPatch, Version, Versioned } from "./common.ts";

const base = {
  intentId: z.string(),
  intentKey: z.string(),
  /** True when this is the stored answer re-sent for a repeated submission. */
  duplicate: z.boolean(),
  at: IsoTime,
};

export const AppliedReply = z
  .object({
    status: z.literal("applied"),
    ...base,
    entity: EntityRef,
    /** The record after the write, and its new ETag. */
    state: z.unknown(),
    version: Version,
    /** How the outcome was established: the PATCH response, or reconciling with the system of record. */
    via: z.enum(["patch", "reconcile"]),
  })
  .strict();

export const ConflictReply = z
  .object({
    status: z.literal("conflict"),
    ...base,
    entity: EntityRef,
    /** 1-based; past the tool's limit the intent is escalated instead. */
    cycle: z.number().int().min(1),
    message: z.string(),
    current: Versioned,
    your_change: JsonPatch,
  })
  .strict();

export const RejectedReply = z
  .object({
    status: z.literal("rejected"),
    ...base,
    reason: z.enum(REJECT_REASONS),
    message: z.string(),
    details: z.unknown().optional(),
  })
  .strict();

export const EscalatedReply = z
  .object({
    status: z.literal("escalated"),
    ...base,
    entity: EntityRef,
    reason: z.enum(["conflict_cycles_exhausted", "outcome_unknown"]),
    message: z.string(),
    escalationId: z.string(),
  })
  .strict();

/**
 * Reply: the owner's answer on the agent's reply topic.
 *
 * Topic: the intent's `replyTo` (prefix `writ.replies.` by default); key the
 * intent id. Compatibility rule: BACKWARD; a new status is a breaking change.
 */
export const Reply = z.discriminatedUnion("status", [AppliedReply, ConflictReply, RejectedReply, EscalatedReply]);
export type Reply = z.infer<typeof Reply>;
export type AppliedReply = z.infer<typeof AppliedReply>;
export type ConflictReply = z.infer<typeof ConflictReply>;
export type RejectedReply = z.infer<typeof RejectedReply>;
export type EscalatedReply = z.infer<typeof EscalatedReply>;
