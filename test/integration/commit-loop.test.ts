import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { brokers, readVersion, refundIntent, startHarness, type Harness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";

const INTERVAL_MS = 300;
const INTENTS = 30;

/** Submits a refund of pay_1 against the version the records server holds now, and expects it applied. */
async function refundNow(h: Harness, agent: WritClient): Promise<void> {
  const { version } = await readVersion(h.records, "payment", "pay_1");
  expect(await agent.submit(refundIntent(`run-${randomUUID()}`, version, 100))).toMatchObject({ status: "applied", duplicate: false });
}

describe("the owner's commit loop", () => {
  it("the group's offset rides in the results' transactions while intents come, and goes in alone only once the partition is quiet", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 1_000_000, refunds: [] });
    // Every transaction the owner commits: when it reached its commit, which topics it wrote, whether it carried the offset.
    const commits: { at: number; topics: string[]; offset: boolean }[] = [];
    await h.startRouter(
      { config: { ...h.config, offsetCommitIntervalMs: INTERVAL_MS } },
      { beforeCommit: async ({ topics, offset }) => void commits.push({ at: Date.now(), topics, offset }) },
    );
    const agent = await h.client("billing-agent");
    for (let i = 0; i < INTENTS; i++) await refundNow(h, agent);

    // At the broker: the quiet partition's offset still goes in, after the last intent.
    const kafka = new Kafka({ clientId: `commit-loop-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await waitFor(
      async () => {
        const [group] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
        return Number(group?.partitions[0]?.offset) === INTENTS;
      },
      { timeoutMs: 20_000, message: "the group's offset never reached the last intent" },
    );

    // While intents came, results' transactions carried the offset (the first one after the partition opened does).
    expect(commits.filter((c) => c.offset && c.topics.includes(h.config.topics.ledger)).length).toBeGreaterThanOrEqual(1);
    // A transaction that writes no record carries the offset alone: each came at least an interval after the
    // transaction before it (a partition that committed more recently has its offset carried by the next
    // result's transaction instead). Whether the last offset rode in the last result's transaction or went in
    // alone after it depends on when the flow ended; either way it reached the broker (above).
    const alone = commits.flatMap((c, i) => (c.topics.length === 0 && i > 0 ? [{ offset: c.offset, after: c.at - commits[i - 1]!.at }] : []));
    expect(alone.filter((c) => !c.offset || c.after < INTERVAL_MS)).toEqual([]);
    // The last transaction carried the last offset (nothing was left for a later one).
    expect(commits.at(-1)?.offset).toBe(true);
    // Every intent's result committed: the flow was transactions that carried results, not offsets.
    expect(h.records.history("payment", "pay_1").filter((e) => e.kind !== "create")).toHaveLength(INTENTS);
  });

  // Each intent's `pending` entry is sent into the partition's open transaction before its PATCH. While results
  // are expected within WRIT_OPEN_PENDING_MAX_MS, the entry waits for its result's commit; past it, it commits alone.
  const transactionsPerIntent = async (openPendingMaxMs: number) => {
    // 300 ms for every request at the records server: the fresh read and the PATCH take 600 ms between them.
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1, recordsLatencyMs: 300 });
    h.records.seed("payment", "pay_1", { amountCents: 1_000_000, refunds: [] });
    const written: string[][] = [];
    await h.startRouter({ config: { ...h.config, openPendingMaxMs, sorTimeoutMs: 5_000 } }, { beforeCommit: async ({ topics }) => void (topics.length > 0 && written.push(topics)) });
    const agent = await h.client("billing-agent");
    // The first intent's answer comes after the partition's opening transactions (its heal records): not counted.
    await refundNow(h, agent);
    written.length = 0;
    for (let i = 0; i < 3; i++) await refundNow(h, agent);
    // Each intent's PATCH reached the records server once, and its result committed.
    expect(h.records.history("payment", "pay_1").filter((e) => e.kind !== "create")).toHaveLength(4);
    // Every transaction counted wrote the ledger (a `pending` entry, a result or both).
    expect(written.filter((topics) => !topics.includes(h.config.topics.ledger))).toEqual([]);
    return written.length / 3;
  };

  it("a `pending` entry waits for its result's transaction up to WRIT_OPEN_PENDING_MAX_MS, then commits alone", async () => {
    // Above the read and PATCH time: one transaction per intent (its `pending` entry and its result).
    expect(await transactionsPerIntent(3_000)).toBe(1);
    // Below it: the entry commits alone while the PATCH is under way, the result in a transaction of its own.
    expect(await transactionsPerIntent(100)).toBe(2);
  });

  // Group commit: a transaction waits up to WRIT_COMMIT_LINGER_MS from its oldest change, a `pending` entry too,
  // for the intents of its partition still at work, so that one transaction carries their results as well.
  const resultCommitsWith = async (commitLingerMs: number) => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    for (const id of ["pay_1", "pay_2"]) h.records.seed("payment", id, { amountCents: 1_000_000, refunds: [] });
    const replyTopic = `writ.replies.billing-agent.${h.id}`;
    /** For each transaction carrying replies: whether pay_2's refund had reached the records server by then. */
    const resultCommits: boolean[] = [];
    await h.startRouter(
      { config: { ...h.config, commitLingerMs } },
      {
        beforeCommit: async ({ topics }) => {
          if (topics.includes(replyTopic)) resultCommits.push(h.records.history("payment", "pay_2").some((e) => e.kind !== "create"));
        },
      },
    );
    const agent = await h.client("billing-agent");
    // The partition's opening transactions and the reply topic's creation are not what is looked at.
    expect(await agent.submit(refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_1")).version, 100))).toMatchObject({ status: "applied" });
    resultCommits.length = 0;
    const slow = { ...refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_2")).version, 200), entity: { type: "payment", id: "pay_2" } };
    const fast = refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_1")).version, 300);
    // pay_2's refund first: its `pending` entry opens the transaction, and the owner's fresh read of pay_2 takes
    // 500 ms, half the longest linger; then pay_1's refund, whose read and PATCH take moments.
    h.records.setFaults([{ kind: "slow-read", delayMs: 500, match: { type: "payment", id: "pay_2" } }]);
    const answers = await agent.submitAll([slow, fast]);
    expect(answers).toMatchObject([{ status: "applied" }, { status: "applied" }]);
    expect(h.records.faults()).toEqual([]);
    return resultCommits;
  };

  it("a result waits up to WRIT_COMMIT_LINGER_MS from the oldest change, a `pending` entry too, for intents still at work", async () => {
    // The longest linger: pay_1's result waits for pay_2's, and one transaction carries both.
    expect(await resultCommitsWith(1_000)).toEqual([true]);
    // Ablation control, no linger: pay_1's result commits while pay_2 is still reading, pay_2's after it.
    expect(await resultCommitsWith(0)).toEqual([false, true]);
  });

  it("a partition whose transactions keep failing is reported as not moving after WRIT_STUCK_AFTER_FAILURES, and its next commit clears it", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 1_000_000, refunds: [] });
    const replyTopic = `writ.replies.billing-agent.${h.id}`;
    /** Whether the partition was reported as not moving when each failing commit came: four fail. */
    const reported: boolean[] = [];
    const stuck = () => router.health().problems.some((p) => p.key === "partition-0");
    const router = await h.startRouter(
      { config: { ...h.config, stuckAfterFailures: 3, outageBackoffInitialMs: 50, outageBackoffMaxMs: 200 } },
      {
        // The transactions carrying the intent's result fail (a partition's opening ones, which write the human
        // and dead-letter topics' heal records, do not): each failure reopens the partition from its committed state.
        beforeCommit: async ({ topics }) => {
          if (reported.length === 4 || !topics.includes(replyTopic) || topics.includes(h.config.topics.human)) return;
          reported.push(stuck());
          throw new Error("test: this transaction fails");
        },
      },
    );
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    expect(await agent.submit(refundIntent(`run-${randomUUID()}`, version, 100))).toMatchObject({ status: "applied" });
    // Reported at the third failure in a row (so the fourth met it), not before.
    expect(reported).toEqual([false, false, false, true]);
    // The fifth try committed: the partition moves again.
    await waitFor(() => !stuck(), { timeoutMs: 10_000, message: "the problem stayed after a commit" });
    // Every retry after the first failure found the PATCH at the records server (the ledger's `pending` entry,
    // reconciled): one PATCH request, however many results failed to commit.
    expect(h.records.patchRequests()).toHaveLength(1);
    expect(h.records.history("payment", "pay_1").filter((e) => e.kind !== "create")).toHaveLength(1);
  });

  it("session-end-during-linger: router.stop() while the commit lingers, its deadline passed and its timer not fired, commits nothing; the next owner resumes at the first unanswered intent", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    for (const id of ["pay_1", "pay_2"]) h.records.seed("payment", id, { amountCents: 1_000_000, refunds: [] });
    /** Each router's log lines (the first one's at debug: the commit loop says when it lingers and what it commits). */
    const logOf = (level: string) => {
      const lines: { msg?: string; offset?: string; results?: number; pendings?: number }[] = [];
      return { lines, logger: pino({ level }, { write: (s: string) => void lines.push(JSON.parse(s)) }) };
    };
    const first = logOf("debug");
    const config = { ...h.config, commitLingerMs: 1_000, offsetCommitIntervalMs: 0, sorTimeoutMs: 10_000 };
    const router = await h.startRouter({ config, logger: first.logger });
    const agent = await h.client("billing-agent");
    // Offset 0: a refund answered and committed (the reply topic's schema known from here on).
    await refundNow(h, agent);
    // Offset 1: a refund of pay_2 whose fresh read takes 8 s, at work throughout. Its `pending` entry commits alone
    // once the linger is over: nothing is staged after that.
    const slow = { ...refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_2")).version, 200), entity: { type: "payment", id: "pay_2" } };
    const fast = refundIntent(`run-${randomUUID()}`, (await readVersion(h.records, "payment", "pay_1")).version, 300);
    h.records.setFaults([{ kind: "slow-read", delayMs: 8_000, match: { type: "payment", id: "pay_2" } }]);
    const slowAnswer = agent.submit(slow);
    await waitFor(() => first.lines.some((l) => l.msg === "transaction committed" && l.results === 0 && l.pendings === 1), {
      timeoutMs: 20_000,
      message: "the slow refund's pending entry never committed",
    });
    expect(h.records.faults()).toEqual([]);
    // The clock stands still from here: the commit loop's linger does not run out by itself.
    const frozen = Date.now();
    const clock = vi.spyOn(Date, "now").mockImplementation(() => frozen);
    onTestFinished(() => void vi.restoreAllMocks());
    // Offset 2: a refund of pay_1, applied at once: its result is staged and the commit loop lingers for offset 1.
    const seen = first.lines.length;
    const fastAnswer = agent.submit(fast);
    const fastKey = agent.buildIntent(fast).intentKey;
    await waitFor(() => h.records.patchRequests(fastKey).length === 1 && first.lines.slice(seen).some((l) => l.msg === "commit lingers for intents at work"), {
      message: "the commit loop never lingered with the second refund staged",
    });

    // The event loop late: the linger's deadline passed (the clock a second on), its timer not fired yet.
    clock.mockImplementation(() => frozen + 1_001);
    await router.stop();
    vi.restoreAllMocks();

    // At the broker: the group's offset stands at offset 1, the first intent not answered.
    const kafka = new Kafka({ clientId: `commit-loop-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    const [group] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
    expect(group?.partitions[0]?.offset).toBe("1");
    // The next owner resumes there (the ledger's progress entry, or the group's offset when further), and answers both.
    const second = logOf("info");
    await h.startRouter({ config, logger: second.logger });
    expect(await slowAnswer).toMatchObject({ status: "applied" });
    expect(await fastAnswer).toMatchObject({ status: "applied" });
    expect(second.lines.find((l) => l.msg === "partition restored; owning it")?.offset).toBe("1");
    expect(h.records.patchRequests(agent.buildIntent(slow).intentKey)).toHaveLength(1);
    expect(h.records.patchRequests(fastKey)).toHaveLength(1);
  });
});
