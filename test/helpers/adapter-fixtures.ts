// Fixtures of the framework-adapter tests (test/integration/adapters): a
// harness for the demo tools with its records seeded, what an adapter needs
// from the harness to read records, and the records server seen from outside
// writ (counting refunds, another integration writing).
import { Kafka, logLevel } from "kafkajs";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { VersionBook } from "../../producers/adapters/tool-bridge.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { RouterConfig, parseConfig } from "../../src/config.ts";
import type { EntityRef, Versioned } from "../../src/schemas/common.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { ensureTopics, routerTopics } from "../../src/topics.ts";
import { readVersion, startHarness, type Harness } from "./writ-harness.ts";

/** Options of {@link startDemoHarness}. */
export interface DemoHarnessOptions {
  /** Seed payment `pay_1`: `{ amountCents: 10_000, refunds: [] }`. Default false. */
  payment?: boolean;
  /** Seed ticket `T-1` with this state. Default: no ticket. */
  ticket?: Record<string, unknown>;
  /** Start one owner once the records are seeded. Default true; false leaves intents unanswered. */
  owner?: boolean;
}

/**
 * {@link startHarness} for the demo tools (`refund_payment`, `tag_ticket`),
 * with the records of `opts` seeded and, unless `owner: false`, one owner
 * running. Everything is stopped when the test finishes.
 *
 * @example
 * const h = await startDemoHarness({ payment: true });
 * const ctx = callContext(h, await h.client("billing-agent"), { runId: "conv-1" });
 */
export async function startDemoHarness(opts: DemoHarnessOptions = {}): Promise<Harness> {
  const h = await startHarness({ tools: [refundPayment, tagTicket] });
  if (opts.payment) h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
  if (opts.ticket) h.records.seed("ticket", "T-1", opts.ticket);
  if (opts.owner ?? true) await h.startRouter();
  return h;
}

/** An adapter's `read`: the harness's records server as a system of record (5 s deadline); a missing record throws. */
export function recordReader(h: Harness): (entity: EntityRef) => Promise<Versioned> {
  const sor = createHttpSystemOfRecord({ name: "records", baseUrl: h.records.url });
  return async (entity) => {
    const record = await sor.read(entity, { timeoutMs: 5_000 });
    if (!record) throw new Error(`${entity.type}:${entity.id} not found`);
    return record;
  };
}

/**
 * What a write-tool adapter needs from the harness for one process: the
 * client, a fresh version book, {@link recordReader}, and `extra` (a run id,
 * a deadline).
 */
export function callContext<E extends object = {}>(
  h: Harness,
  client: WritClient,
  extra?: E,
): { client: WritClient; versions: VersionBook; read: (entity: EntityRef) => Promise<Versioned> } & E {
  return { client, versions: new VersionBook(), read: recordReader(h), ...(extra as E) };
}

/** Refunds on `pay_1` at the records server now. */
export async function refundsAt(h: Harness): Promise<number> {
  return (await readVersion(h.records, "payment", "pay_1")).state.refunds.length;
}

/** Another integration changes a record: read, then PUT `change(state)` with If-Match. Resolves with the PUT's response. */
export async function putRecord(h: Harness, type: string, id: string, change: (state: any) => any): Promise<Response> {
  const current = await readVersion(h.records, type, id);
  return fetch(`${h.records.url}/records/${type}/${id}`, {
    method: "PUT",
    headers: { "content-type": "application/json", "if-match": current.version },
    body: JSON.stringify(change(current.state)),
  });
}

/** {@link putRecord} that throws unless the records server took the write. */
export async function outsideWrite(h: Harness, type: string, id: string, change: (state: any) => any): Promise<void> {
  const res = await putRecord(h, type, id, change);
  if (!res.ok) throw new Error(`outside write: ${res.status}`);
}

/** The router's topics, without a router: intents can be sent, nobody answers yet. */
export async function createRouterTopics(h: Harness): Promise<void> {
  const config = parseConfig(RouterConfig, h.config, "router");
  const admin = new Kafka({ clientId: `writ-test-topics-${h.id}`, brokers: config.brokers, logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    await ensureTopics(admin, routerTopics(config));
  } finally {
    await admin.disconnect();
  }
}
