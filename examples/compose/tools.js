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
  allowedPaths: [{ path: "/refunds/-", ops: ["add"] }],
  delta: (p) => [{ op: "add", path: "/refunds/-", value: { amountCents: p.amountCents, reason: p.reason, ...(p.ref === undefined ? {} : { ref: p.ref }) } }],
  keyScope: "run",
  versionPolicy: "rebase-commutative",
  system: "billing",
  reconcile: "idempotency-key",
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
});

export const tools = [refundPayment, tagTicket];

/** Both systems of record are served by the demo records server at `RECORDS_URL`. */
export function systems(env = process.env) {
  const baseUrl = env.RECORDS_URL ?? "http://127.0.0.1:4010";
  return [
    createHttpSystemOfRecord({ name: "billing", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    createHttpSystemOfRecord({ name: "helpdesk", baseUrl, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
  ];
}
