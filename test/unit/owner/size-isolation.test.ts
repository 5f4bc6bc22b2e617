// Regression (a review of this stop's merged changes): the one-record-per-request mode a size refusal starts was
// ended by any commit, so a faster intent's commit landing before the refused one ran again ended it; the oversize
// reply went out in a request of several records once more, was refused unnamed, and the partition reopened for
// good (on the old code: 6 refusals in 6 cycles, every refused request of 3 records, nothing learned). It now lasts
// until the partition's progress passes the refused transaction's intents. Counted at the fake producer.
import { setTimeout as sleep } from "node:timers/promises";
import { afterEach, expect, it, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { intentKey } from "../../../src/keys.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import type { SystemOfRecord } from "../../../src/sor/adapter.ts";
import { admitTools } from "../../../src/tools.ts";
import { FakeSystem, version } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";
import { intentRecord, ownerWith, until } from "./partition-owner-harness.ts";

const log = vi.hoisted(() => ({ txns: [] as { records: { topic: string; size: number }[]; committed: boolean; refused: boolean; rounds: number[] }[], opens: 0 }));
vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { PartitionLedger } = await import("../../../src/ledger/ledger-state.ts");
  return {
    transactionalIdFor: () => "test",
    restorePartition: async () => {
      log.opens++;
      const producer = {
        protocol: "v2" as const,
        async connect() {},
        async disconnect() {},
        async transaction() {
          const t = { records: [] as { topic: string; size: number }[], committed: false, refused: false, rounds: [] as number[] };
          log.txns.push(t);
          return {
            async send(round: { topic: string; messages: { value: Buffer | null }[] }[]) {
              const n = round.reduce((a, x) => a + x.messages.length, 0);
              t.rounds.push(n);
              for (const tm of round) for (const m of tm.messages) {
                if (tm.topic === "writ.replies.a" && (m.value?.length ?? 0) > 1500) {
                  t.refused = true;
                  throw Object.assign(new Error("too large"), { type: "MESSAGE_TOO_LARGE", code: 10 });
                }
              }
              for (const tm of round) for (const m of tm.messages) t.records.push({ topic: tm.topic, size: m.value?.length ?? 0 });
            },
            async sendOffset() {},
            async commit() { t.committed = true; },
            async abort() {},
          };
        },
      };
      return { producer, ledger: new PartitionLedger(0, []), next: 0n, groupOffset: 0n, healed: 0, inDoubt: 0 };
    },
  };
});

afterEach(() => vi.restoreAllMocks());

it("a faster intent's commit does not end the isolation: the oversize reply is named, learned, and written within its topic's limit", async () => {
  const sys = new FakeSystem("helpdesk");
  const T1 = { type: "ticket", id: "T-1" };
  const T2 = { type: "ticket", id: "T-2" };
  sys.seed(T1, { tags: [], blob: "x".repeat(5000) });
  sys.seed(T2, { tags: [] });
  const sor: SystemOfRecord = Object.assign(Object.create(sys), {
    name: "helpdesk",
    capabilities: sys.capabilities,
    read: (e: never, o: never) => sys.read(e, o),
    lookupIdempotencyKey: (e: never, k: never, o: never) => sys.lookupIdempotencyKey(e, k, o),
    patch: async (e: { id: string }, ops: never, o: never) => {
      if (e.id === "T-1") await sleep(60); // T-2's intent commits first
      return sys.patch(e as never, ops, o);
    },
  });
  const tools = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 });
  const tool = tools.get("add_tag")!;
  const mk = (id: string, entity: typeof T1) => {
    const params = { tag: "vip" };
    const key = intentKey({ tool, agentId: "a", runId: "r", stepId: id, entity, params });
    return JSON.stringify({ intentId: id, intentKey: key, entity, tool: "add_tag", agent: { id: "a", runId: "r", stepId: id }, baseVersion: version(1), delta: [{ op: "add", path: "/tags/-", value: "vip" }], params, replyTo: "writ.replies.a", createdAt: new Date().toISOString() });
  };
  const owner = ownerWith({ codec: new WireCodec({}), tools, config: { outageBackoffInitialMs: 5, outageBackoffMaxMs: 20 } });
  const limits = (owner as unknown as { ctx: { encoder: { limits: { of(t: string): number } } } }).ctx.encoder.limits;
  owner.start();
  const msgs = [intentRecord(0, mk("i1", T1), "ticket:T-1"), intentRecord(1, mk("i2", T2), "ticket:T-2")];
  let seenOpens = 0;
  for (let cycle = 0; cycle < 6; cycle++) {
    await until(() => owner.state === "running" && log.opens > seenOpens, () => `owner ${owner.state}`);
    seenOpens = log.opens;
    owner.accept(msgs, "1");
    // Each refusal reopens the partition; wait for the next open, or give up waiting once none comes.
    await until(() => log.opens > seenOpens, () => "no reopen", 3000).catch(() => undefined);
    if (log.opens === seenOpens) break;
  }
  await owner.close();
  const refused = log.txns.filter((t) => t.refused);
  expect(limits.of("writ.replies.a")).toBeLessThan(1_000_000);
  expect(refused.length).toBeLessThanOrEqual(3);
  expect(refused.at(-1)?.rounds.at(-1)).toBe(1);
});
