import { z } from "zod";
import { ESCALATION_REASONS } from "../errors.ts";
import { IsoTime, openReason, Versioned } from "./common.ts";
import { WriteIntent } from "./write-intent.ts";

/**
 * Escalation: a case for a human.
 *
 * Topic `writ.human`; key the entity key. Written in the owner's batch
 * transaction with the `escalated` reply. Compatibility (docs/wire-contract.md §9, with the registry levels that
 * accept each change): optional members and reasons only; readers tolerate members and reasons they do not know.
 */
export const Escalation = z
  .looseObject({
    escalationId: z.string(),
    reason: openReason(ESCALATION_REASONS),
    message: z.string(),
    intent: WriteIntent,
    /** Conflict cycles seen for this intent key. */
    cycles: z.number().int().min(0),
    /** The record as last read, when it could be read. */
    current: Versioned.nullable(),
    at: IsoTime,
    /**
     * The escalated write may have reached the system of record (a PATCH whose outcome was unknown came
     * before the escalation, whatever its reason): check the record before deciding; an owner carrying out
     * `apply` reconciles first. Absent: no write of this intent left the owner. Optional: older records parse.
     */
    mayHaveWritten: z.boolean().optional(),
    /** Set when `current.state` was left out because the escalation would exceed the broker's message size. */
    truncated: z.boolean().optional(),
  });
export type Escalation = z.infer<typeof Escalation>;
