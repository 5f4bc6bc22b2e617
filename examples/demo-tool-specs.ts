// The demo tools as an agent sees them: which record a call targets and the
// delta it makes. The model names the record (`paymentId`, `ticketId`), so the
// agent-side declaration adds that param to the owner's; the owner validates
// the params it declares and ignores the extra one. Used by the framework
// adapters' examples and by `npm run mcp` (its default WRIT_TOOL_SPECS_MODULE).
import { z } from "zod";
import type { WritToolSpec } from "../producers/adapters/tool-bridge.ts";
import { declareWriteTool, type WriteToolDeclaration } from "../src/tools.ts";
import { createHttpRecordReader, type RecordReader } from "../src/sor/record-reader.ts";
import { refundPayment, tagTicket } from "./demo-tools.ts";

/**
 * The agent side's read-only view of the demo's two systems, from read-only
 * configuration (the demo records server has no credentials; a real system
 * gets a read-only token here, never the owners' write credentials).
 */
export function readers(env: NodeJS.ProcessEnv = process.env): RecordReader[] {
  const baseUrl = env.RECORDS_URL ?? "http://127.0.0.1:4010";
  return [createHttpRecordReader({ name: "billing", baseUrl }), createHttpRecordReader({ name: "helpdesk", baseUrl })];
}

/** `decl` with a required string param naming the target record, for models that pick the record. */
function withTargetParam<P extends Record<string, unknown>, K extends string>(
  decl: WriteToolDeclaration<P>,
  name: K,
  description: string,
): WriteToolDeclaration<P & Record<K, string>> {
  const params: unknown = decl.params;
  if (!(params instanceof z.ZodObject)) throw new TypeError(`tool ${decl.name}: params must be a zod object`);
  const extended = z.object({ [name]: z.string().min(1).max(256).describe(description) }).extend(params.shape);
  return declareWriteTool({ ...decl, params: extended as unknown as z.ZodType<P & Record<K, string>> });
}

// Each spec's delta is its declaration's own: owners rebuild the delta from the params with it and refuse
// one that differs (`delta_mismatch`), so a copy that drifts (a param it leaves out, tags it filters) loses the write.

/** Refund a payment: appends `{amountCents, reason}` (and the agent's `ref`) to `/refunds` (the note is free text and stays out of the delta). */
export const refundPaymentSpec: WritToolSpec<z.output<typeof refundPayment.params> & { paymentId: string }> = {
  tool: withTargetParam(refundPayment, "paymentId", "The payment to refund, e.g. pay_1001"),
  entity: (p) => ({ type: "payment", id: p.paymentId }),
  delta: (p, current) => refundPayment.delta!(p, current),
};

/** Add a tag to a ticket: replaces `/tags` with the tags as read plus the new one (strict: a changed ticket is a conflict). */
export const tagTicketSpec: WritToolSpec<z.output<typeof tagTicket.params> & { ticketId: string }> = {
  tool: withTargetParam(tagTicket, "ticketId", "The ticket to tag, e.g. T-42"),
  entity: (p) => ({ type: "ticket", id: p.ticketId }),
  delta: (p, current) => tagTicket.delta!(p, current),
};

export const specs: WritToolSpec<any>[] = [refundPaymentSpec, tagTicketSpec];
