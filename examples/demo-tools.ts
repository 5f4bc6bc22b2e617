import { z } from "zod";
import type { SystemOfRecord } from "../src/sor/adapter.ts";
import { createHttpSystemOfRecord } from "../src/sor/http-adapter.ts";
import { declareWriteTool } from "../src/tools.ts";

/**
 * Refund a payment: appends to `/refunds`. Appends commute, so a refund made
 * on a record that changed meanwhile is rebased onto the fresh version.
 * The billing system answers "was key K applied?", which settles an unknown outcome.
 * Undo (`writ undo <key>`): a reversal appended to `/reversals`, naming the refund's intent key.
 */
export const refundPayment = declareWriteTool({
  name: "refund_payment",
  recordType: "payment",
  description: "Refund part or all of a payment.",
  params: z.object({
    amountCents: z.number().int().positive(),
    reason: z.enum(["damaged", "late", "duplicate_charge", "goodwill"]),
    note: z.string().max(500).optional(),
    /** The agent's own reference for the refund, kept on it. */
    ref: z.string().min(1).max(64).optional(),
  }),
  intentFields: ["amountCents", "reason"],
  freeTextParams: ["note"],
  // A refund only appends; its undo appends a reversal, checked against undoPaths before it is sent.
  allowedPaths: [{ path: "/refunds/-", ops: ["add"] }],
  undoPaths: [{ path: "/reversals", ops: ["add"] }, { path: "/reversals/-", ops: ["add"] }],
  delta: (p) => [{ op: "add", path: "/refunds/-", value: { amountCents: p.amountCents, reason: p.reason, ...(p.ref === undefined ? {} : { ref: p.ref }) } }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "billing",
  reconcile: "idempotency-key",
  undo: (p, applied, { intentKey }) => {
    const reversal = { reverses: intentKey, amountCents: p.amountCents, reason: p.reason };
    const reversals = (applied.state as { reversals?: unknown } | null)?.reversals;
    return Array.isArray(reversals) ? [{ op: "add", path: "/reversals/-", value: reversal }] : [{ op: "add", path: "/reversals", value: [reversal] }];
  },
});

/**
 * Set a ticket's tags: a read-modify-write of `/tags`, the classic lost-update
 * shape. Strict: a ticket that changed since the agent read it is a conflict
 * the agent decides again. Undo: the tag removed again.
 */
export const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  description: "Add a tag to a helpdesk ticket.",
  params: z.object({ tag: z.string().min(1).max(64) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags", "/tags/-", "/status"],
  // The tags as they are, plus this one (strict: the owner checks it against the version the agent read).
  delta: (p, current) => {
    const tags = ((current.state as { tags?: unknown } | null)?.tags ?? []) as unknown[];
    return [{ op: "replace", path: "/tags", value: tags.includes(p.tag) ? tags : [...tags, p.tag] }];
  },
  keyScope: "run",
  versionPolicy: "strict",
  maxConflictCycles: 2,
  system: "helpdesk",
  reconcile: "idempotency-key",
  undo: (p, applied) => {
    const tags = ((applied.state as { tags?: unknown } | null)?.tags ?? []) as unknown[];
    return [{ op: "replace", path: "/tags", value: tags.filter((t) => t !== p.tag) }];
  },
});

/**
 * Open a ticket for an order, at most once: the ticket's id is the agent's
 * order reference (its external id), created with `If-None-Match: *`. A ticket
 * another agent opened for the order first is a conflict carrying it.
 */
export const openTicket = declareWriteTool({
  name: "open_ticket",
  recordType: "ticket",
  description: "Open a helpdesk ticket for an order (once per order reference).",
  params: z.object({
    orderRef: z.string().regex(/^[A-Za-z0-9_-]{1,64}$/),
    subject: z.string().min(1).max(200),
  }),
  intentFields: ["orderRef"],
  freeTextParams: ["subject"],
  create: {
    externalId: (p) => p.orderRef,
    body: (p) => ({ subject: p.subject, status: "open", tags: [], orderRef: p.orderRef }),
  },
  keyScope: "run",
  system: "helpdesk",
  reconcile: "idempotency-key",
});

/**
 * Post a note on a customer account: appends to `/notes` (appends commute:
 * rebased onto a fresh version). The note's `ref` is the intent. Undo: the
 * note with that ref taken off `/notes`. The third record of the demo's
 * change that spans records (refund, tag the ticket, note the account).
 */
export const noteAccount = declareWriteTool({
  name: "note_account",
  recordType: "account",
  description: "Post a note on a customer account.",
  params: z.object({
    ref: z.string().regex(/^[A-Za-z0-9_.:-]{1,64}$/),
    text: z.string().min(1).max(500),
  }),
  intentFields: ["ref"],
  // An agent appends a note; only its undo may put the notes back without it.
  allowedPaths: [{ path: "/notes/-", ops: ["add"] }],
  undoPaths: [{ path: "/notes", ops: ["replace"] }],
  delta: (p) => [{ op: "add", path: "/notes/-", value: { ref: p.ref, text: p.text } }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "billing",
  reconcile: "idempotency-key",
  undo: (p, applied) => {
    const notes = ((applied.state as { notes?: unknown } | null)?.notes ?? []) as { ref?: unknown }[];
    return [{ op: "replace", path: "/notes", value: notes.filter((n) => n?.ref !== p.ref) }];
  },
});

export const tools = [refundPayment, tagTicket, openTicket, noteAccount];

/** The demo's two systems of record, both served by the demo records server at `RECORDS_URL`. */
export function systems(env: NodeJS.ProcessEnv = process.env): SystemOfRecord[] {
  const baseUrl = env.RECORDS_URL ?? "http://127.0.0.1:4010";
  return [
    createHttpSystemOfRecord({ name: "billing", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    createHttpSystemOfRecord({ name: "helpdesk", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
  ];
}
