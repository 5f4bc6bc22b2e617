// The demo tools, with the verify fixture `writ verify` needs:
//   npm run verify -- --tools examples/verify-fixture.ts   (RECORDS_URL pointing at a records server)
//   npm run verify -- --demo                               (starts its own records server)
import type { Versioned } from "../src/schemas/common.ts";
import { verifyFixture, type VerifyFixtures } from "../src/verify/fixture.ts";
import { noteAccount, refundPayment, tagTicket } from "./demo-tools.ts";

export { tools, systems } from "./demo-tools.ts";

interface Payment {
  refunds: { amountCents: number; reason: string; ref?: string }[];
}
interface Ticket {
  tags: string[];
}
interface Account {
  notes: { ref: string; text: string }[];
}

/**
 * Creates the staging record unless it exists: PUT with `If-None-Match: *`
 * (RFC 9110 §13.1.2), so an existing record is left alone (412).
 */
async function createIfMissing(env: NodeJS.ProcessEnv, type: string, id: string, state: unknown): Promise<void> {
  // The same URL systems(env) uses (examples/demo-tools.ts).
  const base = (env.RECORDS_URL ?? "http://127.0.0.1:4010").replace(/\/+$/, "");
  const res = await fetch(`${base}/records/${encodeURIComponent(type)}/${encodeURIComponent(id)}`, {
    method: "PUT",
    headers: { "content-type": "application/json", "if-none-match": "*" },
    body: JSON.stringify(state),
  });
  if (!res.ok && res.status !== 412) throw new Error(`PUT ${type}/${id} answered ${res.status}`);
}

export const verify = {
  refund_payment: verifyFixture(refundPayment, {
    entityId: "pay_verify",
    prepare: ({ env, entity }) =>
      createIfMissing(env, entity.type, entity.id, { customer: "c-verify", amountCents: 100_000_000, currency: "EUR", refunds: [] }),
    // A 1.00 EUR goodwill refund whose reference is the mark: appends commute, so a rebase is safe.
    change: (_current, mark) => ({
      params: { amountCents: 100, reason: "goodwill" as const, note: `writ verify ${mark}`, ref: mark },
      delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 100, reason: "goodwill", ref: mark } }],
    }),
    effects: ({ current, mark }) => ((current?.state as Payment | undefined)?.refunds ?? []).filter((r) => r.ref === mark).length,
  }),

  tag_ticket: verifyFixture(tagTicket, {
    entityId: "T-verify",
    prepare: ({ env, entity }) =>
      createIfMissing(env, entity.type, entity.id, { subject: "writ verify", status: "open", tags: [] }),
    // The agent's read-modify-write: the tags it read, plus its own. Two of these from one read are the lost-update shape.
    change: (current: Versioned, mark) => {
      const tags = (current.state as Ticket).tags;
      return { params: { tag: mark }, delta: [{ op: "replace", path: "/tags", value: tags.includes(mark) ? tags : [...tags, mark] }] };
    },
    effects: ({ current, mark }) => ((current?.state as Ticket | undefined)?.tags ?? []).filter((t) => t === mark).length,
  }),

  note_account: verifyFixture(noteAccount, {
    entityId: "acc_verify",
    prepare: ({ env, entity }) => createIfMissing(env, entity.type, entity.id, { name: "writ verify", notes: [] }),
    // A note whose ref is the mark: appends commute, so a rebase is safe.
    change: (_current, mark) => ({
      params: { ref: mark, text: `writ verify ${mark}` },
      delta: [{ op: "add", path: "/notes/-", value: { ref: mark, text: `writ verify ${mark}` } }],
    }),
    effects: ({ current, mark }) => ((current?.state as Account | undefined)?.notes ?? []).filter((n) => n.ref === mark).length,
  }),
} satisfies VerifyFixtures;
