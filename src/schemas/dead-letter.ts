import { z } from "zod";
import { IsoTime } from "./common.ts";

/**
 * DeadLetter: topic `writ.dlq`; key the original record's key. The original
 * bytes are kept whole (base64) with the reason, so nothing is lost.
 * Compatibility rule: BACKWARD.
 */
export const DeadLetter = z
  .object({
    reason: z.enum(["undecodable", "schema_invalid", "reply_topic_not_allowed"]),
    message: z.string(),
    source: z.object({ topic: z.string(), partition: z.number().int(), offset: z.string() }).strict(),
    key: z.string().nullable(),
    valueBase64: z.string(),
    headers: z.record(z.string(), z.string()),
    at: IsoTime,
  })
  .strict();
export type DeadLetter = z.infer<typeof DeadLetter>;
