import { z } from "zod";
import { EntityRef, IsoTime, JsonPatch, Version } from "./common.ts";
import { WriteIntent } from "./write-intent.ts";

/** Header that marks a record on the intents topic as a {@link Resolution}, not a WriteIntent. */
export const KIND_HEADER = "writ-kind";

/**
 * Registry subject of resolutions on the intents topic (the topic-record-name
 * strategy): `<intents topic>-Resolution`, beside `<intents topic>-value` of
 * intents, so neither schema has to be compatible with the other.
 */
export function resolutionSubject(intentsTopic: string): string {
  return `${intentsTopic}-Resolution`;
}

/**
 * Resolution: a person's decision on an escalation, sent to the intents
 * topic keyed by the escalated intent's entity key (so the record's owner, its
 * single writer, carries it out) with the header `writ-kind: resolution`.
 *
 * - `apply`: write the escalated intent on the record as it is now. The
 *   operator read it at `baseVersion`; the change is the tool's delta rebuilt
 *   from the intent's params on that version (or `delta`, or the original
 *   append where it commutes). A record that changed since is a conflict back
 *   to the operator; nothing is written.
 * - `discard`: nothing is written; the agent is told, with `message`.
 * - `return`: nothing is written; the intent goes back to the agent with
 *   `message`, to decide again.
 *
 * The agent gets the outcome on its reply topic (with the escalated intent's
 * id), the ledger records it (a repeat of the intent is answered with it), and
 * the operator gets a reply on `replyTo` keyed by `resolutionId`.
 * Compatibility rule: FULL (loose objects).
 */
export const Resolution = z.looseObject({
  kind: z.literal("resolution"),
  resolutionId: z.string().min(1).max(128),
  escalationId: z.string().min(1).max(128),
  /** The escalated intent, as `writ.human` carries it; owners check it is the one their ledger escalated. */
  intent: WriteIntent,
  decision: z.enum(["apply", "discard", "return"]),
  /** `apply`: the version the operator decided on. */
  baseVersion: Version.optional(),
  /** `apply`: the change to write on `baseVersion`, where the tool cannot rebuild it (without it, such an apply is refused `resolution_delta_required`). */
  delta: JsonPatch.optional(),
  message: z.string().max(2000).optional(),
  operator: z.looseObject({ id: z.string().min(1).max(128) }),
  /** The operator's reply topic. */
  replyTo: z.string().min(1).max(249),
  entity: EntityRef,
  createdAt: IsoTime,
});
export type Resolution = z.infer<typeof Resolution>;
