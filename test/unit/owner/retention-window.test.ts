// The ledger's retention against admission's `stale` cutoff: an intent's entry is swept a retention after the
// owner's clock dated it, and its bytes must be refused `stale` by then, or a redelivery (a replay of signed bytes,
// a copy left on a topic) is taken for a new intent and written again. An agent's clock may run up to
// MAX_CLOCK_SKEW_MS ahead of the owner's: its `createdAt` then says the intent is younger than its entry.
import type { KafkaMessage } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { PartitionLedger } from "../../../src/ledger/ledger-state.ts";
import { type AdmissionDeps, MAX_CLOCK_SKEW_MS, admit } from "../../../src/owner/admission.ts";
import { type ExecContext, IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import { LEDGER_MIN_COMPACTION_LAG_MS } from "../../../src/topics.ts";
import { type AdmittedTool, admitTools } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTagIntentJson } from "./partition-owner-harness.ts";
import { addTag, commit } from "./pipeline-fixtures.ts";

const HOUR = 3_600_000;
const OWNER_NOW = Date.parse("2025-06-01T12:00:00.000Z");
const REPLY_TO = "writ.replies.agent-1"; // addTagIntentJson's
const T1 = { type: "ticket", id: "T-1" };
const SOURCE = { topic: "writ.intents", partition: 0, offset: "7" };
const ctx: ExecContext = { mayWrite: () => true, durable: async () => undefined, headers: { "x-writ-owner": "owner-test" } };

/** The bytes of an intent tagging T-1 "vip", created at `createdAt` by the agent's clock. */
function intentRecord(createdAt: number): KafkaMessage {
  const value = { ...(JSON.parse(addTagIntentJson("s1")) as object), createdAt: new Date(createdAt).toISOString() };
  return { key: Buffer.from("ticket:T-1"), value: Buffer.from(JSON.stringify(value)), timestamp: "0", attributes: 0, offset: "7", headers: {} } as KafkaMessage;
}

/** Admission with `retentionHours` of ledger retention, its clock `now` (ms). */
function admissionDeps(tools: ReadonlyMap<string, AdmittedTool>, retentionHours: number, now: () => number): AdmissionDeps {
  return {
    config: { maxIntentBytes: 262_144, maxJsonDepth: 32, replyTopicPrefix: "writ.replies.", ledgerRetentionHours: retentionHours, topics: { intents: "writ.intents" } },
    codec: new WireCodec({}),
    tools,
    replyTopics: { exists: async (t) => t === REPLY_TO },
    now: () => new Date(now()),
    partitions: 1,
  };
}

/** The sweep's keys at owner time `now` (ms), as the commit loop computes its cutoff. */
function swept(ledger: PartitionLedger, now: number, retentionHours: number): string[] {
  return ledger.expired(new Date(now - retentionHours * HOUR), 1000);
}

describe("an intent's entry outlives its bytes' stale cutoff, whatever the agent's clock (within the allowed skew)", () => {
  it("a redelivery right after the sweep took the entry is refused stale, not written again (1 h of retention, the agent's clock 4 min ahead)", async () => {
    const retentionHours = LEDGER_MIN_COMPACTION_LAG_MS / HOUR;
    const sor = new FakeSystem("helpdesk");
    sor.seed(T1, { tags: [] });
    const tools = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 });
    let now = OWNER_NOW;
    const deps = admissionDeps(tools, retentionHours, () => now);
    const pipeline = new IntentPipeline({ config: { unknownRounds: 3 }, log: pino({ level: "silent" }), now: () => new Date(now) });
    const ledger = new PartitionLedger(0);
    const bytes = intentRecord(OWNER_NOW + 4 * 60_000);

    /** What the owner does with the bytes at `now`: admit, classify, write, commit. True when it wrote. */
    async function handle(): Promise<boolean> {
      const a = await admit(bytes, SOURCE, deps);
      if (a.kind !== "admitted") return false;
      const plan = pipeline.classify(a.admitted, ledger);
      if (plan.kind !== "write") return false;
      commit(ledger, plan.pending);
      const step = await pipeline.execute(a.admitted, plan.pending, plan.state, ctx);
      if (step.kind === "settled") commit(ledger, step.effects.ledger);
      return true;
    }

    expect(await handle()).toBe(true);
    expect(sor.patchCount(T1)).toBe(1);
    expect(ledger.get(JSON.parse(bytes.value!.toString()).intentKey)?.status).toBe("done");

    // The first sweep that takes the entry: a retention after the owner's clock dated it.
    now = OWNER_NOW + retentionHours * HOUR + 1;
    const keys = swept(ledger, now, retentionHours);
    expect(keys).toHaveLength(1);
    for (const key of keys) ledger.tombstone(key);
    ledger.takeStaged();
    ledger.committedSending();

    // The same bytes again: the entry is gone, so only their age can keep them from being written twice.
    await handle();
    expect(sor.patchCount(T1)).toBe(1);
  });

  it("for every retention allowed and every skew admission lets through, the stale cutoff comes before the sweep", async () => {
    const sor = new FakeSystem("helpdesk");
    const tools = admitTools([addTag], [sor], { sorTimeoutMs: 1_000 });
    for (const retentionHours of [1, 1.5, 2, 3, 4, 6, 24, 240]) {
      for (const skew of [-10 * 60_000, 0, 60_000, MAX_CLOCK_SKEW_MS - 1, MAX_CLOCK_SKEW_MS]) {
        // The entry is dated when the owner wrote it (its clock), the earliest it can be: when the intent arrived.
        const entryAt = OWNER_NOW;
        const sweptAt = entryAt + retentionHours * HOUR + 1;
        const bytes = intentRecord(OWNER_NOW + skew);
        expect((await admit(bytes, SOURCE, admissionDeps(tools, retentionHours, () => entryAt))).kind).toBe("admitted");
        const late = await admit(bytes, SOURCE, admissionDeps(tools, retentionHours, () => sweptAt));
        expect({ retentionHours, skew, late: late.kind === "answered" ? late.reason : late.kind }).toEqual({ retentionHours, skew, late: "stale" });
      }
    }
  });
});
