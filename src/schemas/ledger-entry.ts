import { z } from "zod";
import { EntityRef, IsoTime, Version } from "./common.ts";
import { Reply } from "./reply.ts";

/** One attempt at an intent key: the base version it was made from and a fingerprint of its delta. */
export const Attempt = z.object({ baseVersion: Version, deltaFingerprint: z.string() }).strict();

/**
 * The ledger's record of one intent key: absent → pending → conflicted ↺ → done.
 */
export const LedgerIntentEntry = z
  .object({
    kind: z.literal("intent"),
    intentKey: z.string(),
    intentId: z.string(),
    status: z.enum(["pending", "conflicted", "done"]),
    entity: EntityRef,
    tool: z.string(),
    /** sha256 over tool, entity and the non-free-text params. */
    fingerprint: z.string(),
    attempts: z.array(Attempt).min(1),
    /** Conflict cycles seen so far. */
    cycles: z.number().int().min(0),
    /** The answer to re-send on a repeat (absent while pending). */
    reply: Reply.optional(),
    replyTo: z.string(),
    updatedAt: IsoTime,
  })
  .strict();
export type LedgerIntentEntry = z.infer<typeof LedgerIntentEntry>;

/**
 * Written by a new owner of partition p right after it fenced the previous one;
 * once the restore reader sees it, every earlier entry of p has been read.
 */
export const LedgerMarker = z
  .object({
    kind: z.literal("marker"),
    partition: z.number().int().min(0),
    nonce: z.string(),
    owner: z.string(),
    at: IsoTime,
  })
  .strict();
export type LedgerMarker = z.infer<typeof LedgerMarker>;

/**
 * LedgerEntry: topic `writ.ledger`, compacted; key the intent key (markers:
 * `__marker__:<p>`); partition p holds the ledger of intents partition p and is
 * produced with an explicit partition, in the owner's transactions only.
 * Entries past the retention window are tombstoned. Compatibility rule: FULL.
 */
export const LedgerEntry = z.discriminatedUnion("kind", [LedgerIntentEntry, LedgerMarker]);
export type LedgerEntry = z.infer<typeof LedgerEntry>;
