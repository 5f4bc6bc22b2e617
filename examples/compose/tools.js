// The demo tools as a plain JavaScript tools module (`writ owner --tools
// <this file>`): what docker-compose.yml's `demo` profile mounts at
// /tools/tools.js, and what test/integration/cli.test.ts runs the built CLI
// with. The same declarations as examples/demo-tools.ts (the CLI test checks
// they agree), written as a user of the installed package writes them:
// imports from "writ" and "zod" only.
import { createHttpSystemOfRecord, declareWriteTool } from "writ";
import { z } from "zod";

/** Refund a payment: appends to `/refunds` (appends commute: rebased onto a fresh version). */
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
  // Undo: a reversal appended to /reversals, naming the refund's intent key.
  undo: (p, applied, { intentKey }) => {
    const reversal = { reverses: intentKey, amountCents: p.amountCents, reason: p.reason };
    return Array.isArray(applied.state?.reversals) ? [{ op: "add", path: "/reversals/-", value: reversal }] : [{ op: "add", path: "/reversals", value: [reversal] }];
  },
});

/** Set a ticket's tags: a read-modify-write of `/tags`; strict, so a changed ticket is a conflict. */
export const tagTicket = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  description: "Add a tag to a helpdesk ticket.",
  params: z.object({ tag: z.string().min(1).max(64) }),
  intentFields: ["tag"],
  allowedPaths: ["/tags", "/tags/-", "/status"],
  // The tags as they are, plus this one (strict: the owner checks it against the version the agent read).
  delta: (p, current) => {
    const tags = current.state?.tags ?? [];
    return [{ op: "replace", path: "/tags", value: tags.includes(p.tag) ? tags : [...tags, p.tag] }];
  },
  keyScope: "run",
  versionPolicy: "strict",
  maxConflictCycles: 2,
  system: "helpdesk",
  reconcile: "idempotency-key",
  // Undo: the tag removed again.
  undo: (p, applied) => [{ op: "replace", path: "/tags", value: (applied.state?.tags ?? []).filter((t) => t !== p.tag) }],
});

/** Open a ticket for an order, at most once: its id is the order reference (the external id), created with If-None-Match: *. */
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
    const notes = applied.state?.notes ?? [];
    return [{ op: "replace", path: "/notes", value: notes.filter((n) => n?.ref !== p.ref) }];
  },
});

export const tools = [refundPayment, tagTicket, openTicket, noteAccount];

/** Both systems of record are served by the demo records server at `RECORDS_URL`. */
export function systems(env = process.env) {
  const baseUrl = env.RECORDS_URL ?? "http://127.0.0.1:4010";
  return [
    createHttpSystemOfRecord({ name: "billing", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    createHttpSystemOfRecord({ name: "helpdesk", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
  ];
}
