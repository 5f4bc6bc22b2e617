import { pino } from "pino";
import { afterEach, beforeEach, describe, expect, it, vi } from "vitest";
import { type EndOffsets, HANG_RUNBOOK, HangWatch, type OffsetProbe, type TopicPartition } from "../../../src/owner/hang-watch.ts";
import { HealthBoard } from "../../../src/owner/health.ts";

const HEAL_AFTER = 10_000;
const REPORT_AFTER = 60_000;
const T0 = new Date("2025-06-01T12:00:00.000Z").getTime();

/** End offsets the test sets per partition; the probe answers what is set now. */
class ScriptedProbe implements OffsetProbe {
  readonly ends = new Map<string, { lastStable: bigint; highWatermark: bigint }>();
  /** Topics the probe cannot read (deleted, leaderless): like TxnAdmin.listOffsets, a request naming one fails whole. */
  readonly unreadable = new Set<string>();
  calls = 0;
  set(tp: TopicPartition, lastStable: number, highWatermark: number): void {
    this.ends.set(`${tp.topic}:${tp.partition}`, { lastStable: BigInt(lastStable), highWatermark: BigInt(highWatermark) });
  }
  async endOffsets(partitions: readonly TopicPartition[]): Promise<EndOffsets[]> {
    this.calls++;
    const bad = partitions.find((tp) => this.unreadable.has(tp.topic));
    if (bad !== undefined) throw new Error(`ListOffsets failed for ${bad.topic}[${bad.partition}]: UNKNOWN_TOPIC_OR_PARTITION`);
    return partitions.map((tp) => {
      const e = this.ends.get(`${tp.topic}:${tp.partition}`) ?? { lastStable: 0n, highWatermark: 0n };
      return { ...tp, lastStable: e.lastStable.toString(), highWatermark: e.highWatermark.toString() };
    });
  }
}

const LEDGER_3 = { topic: "writ.ledger", partition: 3 };
const REPLIES_0 = { topic: "writ.replies.agent-1", partition: 0 };

let probe: ScriptedProbe;
let health: HealthBoard;
let watch: HangWatch;
let healed: string[];

const heal = (tp: TopicPartition) => healed.push(`${tp.topic}-${tp.partition}`) > 0;
const at = async (ms: number, partitions: TopicPartition[] = [LEDGER_3]) => {
  vi.setSystemTime(T0 + ms);
  return watch.check(partitions, heal);
};

beforeEach(() => {
  vi.useFakeTimers();
  vi.setSystemTime(T0);
  probe = new ScriptedProbe();
  health = new HealthBoard();
  watch = new HangWatch({ probe, health, log: pino({ level: "silent" }), healAfterMs: HEAL_AFTER, reportAfterMs: REPORT_AFTER });
  healed = [];
});

afterEach(() => {
  vi.useRealTimers();
});

describe("HangWatch", () => {
  it("never heals a partition whose last stable offset keeps moving, even behind the high watermark", async () => {
    for (let i = 0; i <= 20; i++) {
      probe.set(LEDGER_3, 100 + i, 200 + i);
      expect(await at(i * HEAL_AFTER)).toEqual([]);
    }
    expect(healed).toEqual([]);
    expect(health.health().ok).toBe(true);
    expect(probe.calls).toBe(21);
  });

  it("never heals a partition whose last stable offset is at the high watermark", async () => {
    probe.set(LEDGER_3, 500, 500);
    for (let i = 0; i <= 10; i++) expect(await at(i * REPORT_AFTER)).toEqual([]);
    expect(healed).toEqual([]);
    expect(health.health().ok).toBe(true);
  });

  it("heals a partition stuck behind the high watermark once healAfterMs passed, and again every healAfterMs while stuck", async () => {
    probe.set(LEDGER_3, 42, 50);
    expect(await at(0)).toEqual([]);
    expect(await at(HEAL_AFTER - 1)).toEqual([]);
    expect(healed).toEqual([]);
    expect(await at(HEAL_AFTER)).toEqual([{ ...LEDGER_3, lastStable: "42", highWatermark: "50" }]);
    expect(healed).toEqual(["writ.ledger-3"]);
    // still stuck, but healed just now
    expect(await at(HEAL_AFTER + 1_000)).toHaveLength(1);
    expect(healed).toEqual(["writ.ledger-3"]);
    await at(2 * HEAL_AFTER - 1);
    expect(healed).toHaveLength(1);
    await at(2 * HEAL_AFTER);
    expect(healed).toHaveLength(2);
    await at(3 * HEAL_AFTER);
    expect(healed).toEqual(["writ.ledger-3", "writ.ledger-3", "writ.ledger-3"]);
  });

  it("says so when no running owner could take the heal (a ledger partition whose owner cannot open), and still reports it", async () => {
    const lines: { msg: string }[] = [];
    const log = pino({ level: "warn" }, { write: (l: string) => void lines.push(JSON.parse(l) as { msg: string }) });
    watch = new HangWatch({ probe, health, log, healAfterMs: HEAL_AFTER, reportAfterMs: REPORT_AFTER });
    probe.set(LEDGER_3, 42, 50);
    const none = () => false;
    await watch.check([LEDGER_3], none);
    vi.setSystemTime(T0 + HEAL_AFTER);
    await watch.check([LEDGER_3], none);
    expect(lines.map((l) => l.msg)).toEqual(["last stable offset stuck; no running owner here writes it, nothing to heal it with (reported past the transaction timeout)"]);
    vi.setSystemTime(T0 + REPORT_AFTER);
    await watch.check([LEDGER_3], none);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.ledger:3"]);
    expect(lines.some((l) => l.msg === "last stable offset stuck; healing")).toBe(false);
  });

  it("reports a partition stuck past reportAfterMs once, naming topic-partition, offset and the runbook", async () => {
    const problem = vi.spyOn(health, "problem");
    probe.set(LEDGER_3, 42, 50);
    await at(0);
    await at(REPORT_AFTER - 1);
    expect(health.health().ok).toBe(true);
    await at(REPORT_AFTER);
    const h = health.health();
    expect(h.ok).toBe(false);
    expect(h.problems).toHaveLength(1);
    expect(h.problems[0]!.key).toBe("hang:writ.ledger:3");
    expect(h.problems[0]!.message).toContain("writ.ledger-3");
    expect(h.problems[0]!.message).toContain("offset 42");
    expect(h.problems[0]!.message).toContain(HANG_RUNBOOK);
    await at(REPORT_AFTER + HEAL_AFTER);
    await at(REPORT_AFTER + 5 * HEAL_AFTER);
    expect(problem).toHaveBeenCalledTimes(1);
    // and it keeps healing meanwhile: at REPORT_AFTER - 1, then every check at least HEAL_AFTER after the last heal
    expect(healed).toHaveLength(3);
  });

  it("clears the problem when the last stable offset moves again, and starts counting anew", async () => {
    probe.set(LEDGER_3, 42, 50);
    await at(0);
    await at(REPORT_AFTER);
    expect(health.health().ok).toBe(false);
    probe.set(LEDGER_3, 43, 50);
    expect(await at(REPORT_AFTER + 1)).toEqual([]);
    expect(health.health().ok).toBe(true);
    const before = healed.length;
    await at(REPORT_AFTER + HEAL_AFTER);
    expect(healed).toHaveLength(before);
    await at(REPORT_AFTER + 1 + HEAL_AFTER);
    expect(healed).toHaveLength(before + 1);
  });

  it("clears the problem when the transaction closes (last stable offset reaches the high watermark)", async () => {
    probe.set(LEDGER_3, 42, 50);
    await at(0);
    await at(REPORT_AFTER);
    expect(health.health().ok).toBe(false);
    probe.set(LEDGER_3, 50, 50);
    await at(REPORT_AFTER + 1);
    expect(health.health().ok).toBe(true);
  });

  it("forgets (and clears) a partition it is no longer asked about", async () => {
    probe.set(LEDGER_3, 42, 50);
    probe.set(REPLIES_0, 7, 9);
    await at(0, [LEDGER_3, REPLIES_0]);
    await at(REPORT_AFTER, [LEDGER_3, REPLIES_0]);
    expect(health.health().problems.map((p) => p.key).sort()).toEqual(["hang:writ.ledger:3", "hang:writ.replies.agent-1:0"]);
    await at(REPORT_AFTER + 1, [REPLIES_0]);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.replies.agent-1:0"]);
    // asked about again, it starts from scratch
    await at(REPORT_AFTER + 2, [LEDGER_3, REPLIES_0]);
    healed = [];
    await at(REPORT_AFTER + 2 + HEAL_AFTER - 1, [LEDGER_3]);
    expect(healed).toEqual([]);
  });

  it("tracks partitions separately: only the stuck one is healed", async () => {
    probe.set(LEDGER_3, 42, 50);
    probe.set(REPLIES_0, 7, 9);
    await at(0, [LEDGER_3, REPLIES_0]);
    probe.set(REPLIES_0, 9, 9);
    expect(await at(HEAL_AFTER, [LEDGER_3, REPLIES_0])).toEqual([{ ...LEDGER_3, lastStable: "42", highWatermark: "50" }]);
    expect(healed).toEqual(["writ.ledger-3"]);
  });

  it("still heals and reports a stuck ledger partition while a reply topic of the same round cannot be read (deleted, leaderless)", async () => {
    probe.set(LEDGER_3, 42, 50);
    probe.unreadable.add(REPLIES_0.topic);
    await at(0, [LEDGER_3, REPLIES_0]);
    expect(await at(HEAL_AFTER, [LEDGER_3, REPLIES_0])).toEqual([{ ...LEDGER_3, lastStable: "42", highWatermark: "50" }]);
    expect(healed).toEqual(["writ.ledger-3"]);
    await at(REPORT_AFTER, [LEDGER_3, REPLIES_0]);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.ledger:3"]);
  });

  it("keeps a reported hang (and how long it has been stuck) through a round that cannot read its topic", async () => {
    probe.set(LEDGER_3, 50, 50);
    probe.set(REPLIES_0, 7, 9);
    await at(0, [LEDGER_3, REPLIES_0]);
    await at(REPORT_AFTER, [LEDGER_3, REPLIES_0]);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.replies.agent-1:0"]);
    probe.unreadable.add(REPLIES_0.topic);
    await at(REPORT_AFTER + 1, [LEDGER_3, REPLIES_0]);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.replies.agent-1:0"]);
    probe.unreadable.clear();
    healed = [];
    // still stuck: healed again on the timer it had, not one started anew
    await at(REPORT_AFTER + HEAL_AFTER, [LEDGER_3, REPLIES_0]);
    expect(healed).toEqual(["writ.replies.agent-1-0"]);
  });

  it("asks topics that failed alone last, so two unreadable topics ahead of the ledger blind it for one round only", async () => {
    const gone = [
      { topic: "writ.replies.gone-1", partition: 0 },
      { topic: "writ.replies.gone-2", partition: 0 },
    ];
    for (const tp of gone) probe.unreadable.add(tp.topic);
    probe.set(LEDGER_3, 42, 50);
    const round = [...gone, LEDGER_3];
    // The first round cannot tell two deleted topics from an outage: it ends after them.
    await expect(at(0, round)).rejects.toThrow(/UNKNOWN_TOPIC_OR_PARTITION/);
    await at(1, round);
    expect(await at(HEAL_AFTER + 1, round)).toEqual([{ ...LEDGER_3, lastStable: "42", highWatermark: "50" }]);
    expect(healed).toEqual(["writ.ledger-3"]);
    await at(REPORT_AFTER + 1, round);
    expect(health.health().problems.map((p) => p.key)).toEqual(["hang:writ.ledger:3"]);
  });

  it("fails the round, after two topics asked alone, when nothing can be read (an outage: not one request per topic)", async () => {
    const others = Array.from({ length: 50 }, (_, i) => ({ topic: `writ.replies.agent-${i + 2}`, partition: 0 }));
    for (const tp of [LEDGER_3, REPLIES_0, ...others]) probe.unreadable.add(tp.topic);
    await expect(at(0, [LEDGER_3, REPLIES_0, ...others])).rejects.toThrow(/UNKNOWN_TOPIC_OR_PARTITION/);
    expect(probe.calls).toBe(3);
  });
});
