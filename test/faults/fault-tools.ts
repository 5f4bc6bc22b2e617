// The fault suite's tools: the demo's two (reconciled by idempotency-key
// lookup) and one whose reconcile is a function that looks at the record
// itself, for a system that keeps no idempotency keys.
import { z } from "zod";
import { noteAccount, refundPayment, systems as demoSystems, tagTicket } from "../../examples/demo-tools.ts";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { declareWriteTool } from "../../src/tools.ts";

/**
 * Append a note to a ticket. Its system ("notes") has no idempotency
 * lookup, so an unknown outcome is settled by reading the ticket: the note
 * carries its ref, and it is applied exactly when a note with that ref is there.
 */
export const noteTicket = declareWriteTool({
  name: "note_ticket",
  recordType: "ticket",
  params: z.object({ ref: z.string().min(1).max(64), text: z.string().max(500) }),
  intentFields: ["ref"],
  freeTextParams: ["text"],
  allowedPaths: [{ path: "/notes/-", ops: ["add"] }],
  delta: (p) => [{ op: "add", path: "/notes/-", value: { ref: p.ref, text: p.text } }],
  freeTextPaths: [],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "notes",
  reconcile: ({ intent, current }) => {
    const ref = (intent.params as { ref?: unknown }).ref;
    const notes = ((current?.state as { notes?: { ref?: unknown }[] } | null)?.notes ?? []).filter((n) => n?.ref === ref);
    return notes.length > 0 ? "applied" : "not_applied";
  },
});

/** `note_account` (with its undo) is a step of the lease case's changes that span records. */
export const faultTools = [refundPayment, tagTicket, noteTicket, noteAccount];

export function systems(env: NodeJS.ProcessEnv = process.env): SystemOfRecord[] {
  const baseUrl = env.RECORDS_URL ?? "http://127.0.0.1:4010";
  return [...demoSystems(env), createHttpSystemOfRecord({ name: "notes", baseUrl })];
}
