export { EntityRef, JsonPatchOp, JsonPatch, Version, Versioned, entityKey } from "./common.ts";
export { WriteIntent } from "./write-intent.ts";
export { Reply, AppliedReply, ConflictReply, RejectedReply, EscalatedReply } from "./reply.ts";
export { LedgerEntry, LedgerIntentEntry, LedgerMarker, LedgerProgress, StoredOutcome } from "./ledger-entry.ts";
export { CONTROL_HEADER, isControlRecord } from "./control.ts";
export { Escalation } from "./escalation.ts";
export { DeadLetter } from "./dead-letter.ts";
export { Resolution, KIND_HEADER } from "./resolution.ts";

import { DeadLetter } from "./dead-letter.ts";
import { Escalation } from "./escalation.ts";
import { LedgerEntry } from "./ledger-entry.ts";
import { Reply } from "./reply.ts";
import { Resolution } from "./resolution.ts";
import { WriteIntent } from "./write-intent.ts";

/** The wire schemas, by the file name of their JSON Schema in `schemas/`. */
export const WIRE_SCHEMAS = {
  WriteIntent,
  Reply,
  LedgerEntry,
  Escalation,
  DeadLetter,
  Resolution,
} as const;
export type WireSchemaName = keyof typeof WIRE_SCHEMAS;
