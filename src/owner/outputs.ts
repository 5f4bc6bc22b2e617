import type { DeadLetter } from "../schemas/dead-letter.ts";
import type { Escalation } from "../schemas/escalation.ts";
import type { Reply } from "../schemas/reply.ts";

/** What processing a batch produces; all of it goes out in the batch's one transaction. */
export interface BatchOutputs {
  replies: { topic: string; key: string; value: Reply }[];
  escalations: { key: string; value: Escalation }[];
  deadLetters: { key: string | null; value: DeadLetter }[];
}

export function emptyOutputs(): BatchOutputs {
  return { replies: [], escalations: [], deadLetters: [] };
}
