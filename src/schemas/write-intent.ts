import { z } from "zod";
import { EntityRef, IsoTime, JsonPatch, Version } from "./common.ts";

/**
 * WriteIntent: what an agent's write tool publishes.
 *
 * Topic `writ.intents` (configurable); key `<recordType>:<id>` so that every
 * entity lands on one partition and has one writer. Compatibility rule:
 * BACKWARD: new optional fields only; owners accept intents from older clients,
 * and drop fields they do not know from newer ones.
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
        runId: z.string().min(1).max(256),
        stepId: z.string().min(1).max(256),
        toolCallId: z.string().min(1).max(256).optional(),
      }),
    /** The ETag the agent read; the harness carries it from the last read, the model never invents one. */
    baseVersion: Version,
    /** RFC 6902 operations: a delta, never a whole record. */
    delta: JsonPatch,
    /** The tool's structured intent fields. */
    params: z.record(z.string(), z.unknown()),
    /** The agent's reply topic; must start with the router's allowed prefix. */
    replyTo: z.string().min(1).max(249),
    createdAt: IsoTime,
  });
export type WriteIntent = z.infer<typeof WriteIntent>;
