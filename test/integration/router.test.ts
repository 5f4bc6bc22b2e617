import { CompressionTypes, Kafka, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { UNREADABLE_BATCH_HEADER } from "../../src/kafka/unreadable-batches.ts";
import type { AppliedReply, ConflictReply } from "../../src/schemas/reply.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { declareWriteTool } from "../../src/tools.ts";
import { startHoldingProxy } from "../helpers/holding-proxy.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, startHarness } from "../helpers/writ-harness.ts";

const run = () => `run-${Math.random().toString(36).slice(2, 10)}`;
const refund = (runId: string, version: string, amountCents = 500) => ({
  tool: refundPayment,
  entity: { type: "payment", id: "pay_1" },
  runId,
  stepId: "refund-step-1",
  baseVersion: version,
  delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "damaged" } }],
  params: { amountCents, reason: "damaged" },
});

describe("router core on a real broker", () => {
  it("duplicate-submission: one write, and the repeat gets the stored reply marked duplicate", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const runId = run();

    const first = await agent.submit(refund(runId, version));
    const second = await agent.submit(refund(runId, version));

    expect(first).toMatchObject({ status: "applied", duplicate: false });
    expect(second).toMatchObject({ status: "applied", duplicate: true, intentKey: first.intentKey });
    expect(second.intentId).not.toBe(first.intentId);
    expect((second as AppliedReply).version).toBe((first as AppliedReply).version);
    const after = await readVersion(h.records, "payment", "pay_1");
    expect(after.state.refunds).toHaveLength(1);
    expect(h.records.patchRequests(first.intentKey)).toHaveLength(1);
  });

  it("retry-after-fresh-read: a settled intent resubmitted from a new read is answered from the ledger, not written again", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("ticket", "T-5", { status: "open", tags: ["billing"] });
    await h.startRouter();
    const agent = await h.client("support-agent");
    const tag = async (runId: string) => {
      const read = await readVersion(h.records, "ticket", "T-5");
      return agent.submit({
        tool: tagTicket,
        entity: { type: "ticket", id: "T-5" },
        runId,
        stepId: "tag-1",
        baseVersion: read.version,
        delta: [{ op: "replace" as const, path: "/tags", value: [...read.state.tags, "vip"] }],
        params: { tag: "vip" },
      });
    };
    const runId = run();
    const first = await tag(runId);
    // A resumed harness reads the ticket again (now at the new version, tag included) and repeats the call.
    const again = await tag(runId);

    expect(first).toMatchObject({ status: "applied", duplicate: false });
    expect(again).toMatchObject({ status: "applied", duplicate: true, intentKey: first.intentKey });
    expect((await readVersion(h.records, "ticket", "T-5")).state.tags).toEqual(["billing", "vip"]);
  });

  it("key-reuse-with-different-params: rejected, nothing written", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const runId = run();
    const first = await agent.submit(refund(runId, version, 500));
    // The same intent key (same agent, run, step and intent fields) from the same base, with another change:
    // Stripe's rule says reject. (The key itself cannot be pinned: owners recompute it.)
    const other = refund(runId, version, 500);
    const reused = await agent.submit({ ...other, delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 900, reason: "damaged" } }] });

    expect(first.status).toBe("applied");
    expect(reused).toMatchObject({ status: "rejected", reason: "key_reused_with_different_params" });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([{ amountCents: 500, reason: "damaged" }]);
  });

  it("commit-then-timeout: the owner reconciles, exactly one refund exists, and a resubmit is a duplicate", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    h.records.setFaults([{ kind: "commit-then-delay", delayMs: 4000, times: 1, match: { type: "payment", id: "pay_1" } }]);
    const runId = run();

    const first = await agent.submit(refund(runId, version));
    const again = await agent.submit(refund(runId, version));

    expect(first).toMatchObject({ status: "applied", via: "reconcile" });
    expect(again).toMatchObject({ status: "applied", duplicate: true });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
    expect(h.records.history("payment", "pay_1").filter((e) => e.idempotencyKey === first.intentKey)).toHaveLength(1);
    expect(h.records.patchRequests(first.intentKey)).toHaveLength(1);
  });

  it("commit-then-drop: the dropped answer is reconciled to applied, written once", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    h.records.setFaults([{ kind: "commit-then-drop", times: 1 }]);

    const reply = await agent.submit(refund(run(), version));

    expect(reply).toMatchObject({ status: "applied", via: "reconcile" });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("unknown-then-lands-during-the-pause: a PATCH held on its way, the retry refused 429, the held one commits: reconciled, one refund", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    // Only writ may stop the duplicate here: the records server does not dedupe by Idempotency-Key.
    h.records.setConfig({ honourIdempotencyKey: false });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const proxy = await startHoldingProxy(h.records.url);
    const via = (name: string) => createHttpSystemOfRecord({ name, baseUrl: proxy.url, idempotencyLookupPath: "/idempotency-keys/{key}" });
    await h.startRouter({ systems: [via("billing"), via("helpdesk")] });
    const agent = await h.client("billing-agent");
    const input = refund(run(), (await readVersion(h.records, "payment", "pay_1")).version);
    const key = agent.buildIntent(input).intentKey;
    // PATCH 1 is held past the owner's deadline (unknown); reconcile finds it not applied; PATCH 2 (If-Match the
    // same version) is refused 429, and PATCH 1 reaches the server and commits just before that answer.
    proxy.watch(key, ["hold", "land-held-then-429"]);

    const reply = await agent.submit(input);

    expect(proxy.stepsLeft()).toBe(0);
    expect(proxy.landed).toEqual([200]);
    // Counted at the records server: the held request's commit only (before the fix, the owner's next try read
    // the record again, rebased the refund onto it and paid it a second time).
    expect(h.records.history("payment", "pay_1").filter((e) => e.idempotencyKey === key)).toHaveLength(1);
    expect(h.records.patchRequests(key).map((r) => r.outcome)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
    expect(reply).toMatchObject({ status: "applied", via: "reconcile", intentKey: key });
  });

  it("race-two-agents: one applied, one conflict carrying the current state, no lost update after deciding again", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("ticket", "T-1", { status: "open", tags: ["billing"] });
    await h.startRouter();
    const [a, b] = await Promise.all([h.client("agent-a"), h.client("agent-b")]);
    const read = await readVersion(h.records, "ticket", "T-1");
    const tagIntent = (tag: string, runId: string, base: { state: any; version: string }) => ({
      tool: tagTicket,
      entity: { type: "ticket", id: "T-1" },
      runId,
      stepId: "tag-1",
      baseVersion: base.version,
      delta: [{ op: "replace" as const, path: "/tags", value: [...base.state.tags, tag] }],
      params: { tag },
    });
    const runA = run();
    const runB = run();
    const [ra, rb] = await Promise.all([a.submit(tagIntent("vip", runA, read)), b.submit(tagIntent("urgent", runB, read))]);

    const statuses = [ra.status, rb.status].sort();
    expect(statuses).toEqual(["applied", "conflict"]);
    const conflict = (ra.status === "conflict" ? ra : rb) as ConflictReply;
    const winnerTag = ra.status === "applied" ? "vip" : "urgent";
    expect(conflict.cycle).toBe(1);
    expect(conflict.current.state).toEqual({ status: "open", tags: ["billing", winnerTag] });
    expect(conflict.your_change).toHaveLength(1);

    // The loser decides again from `current`: same intent key, new base.
    const loser = ra.status === "conflict" ? { client: a, tag: "vip", runId: runA } : { client: b, tag: "urgent", runId: runB };
    const retry = await loser.client.submit(tagIntent(loser.tag, loser.runId, conflict.current));
    expect(retry).toMatchObject({ status: "applied", intentKey: conflict.intentKey });

    const final = await readVersion(h.records, "ticket", "T-1");
    expect([...final.state.tags].sort()).toEqual(["billing", "urgent", "vip"]);
    expect(h.records.history("ticket", "T-1").filter((e) => e.kind !== "create")).toHaveLength(2);
  });

  it("conflict-cycles-exhausted: the third conflict escalates on writ.human with an escalated reply", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("ticket", "T-9", { status: "open", tags: [] });
    await h.startRouter();
    const agent = await h.client("agent-storm");
    const runId = run();
    const replies = [];
    let base = await readVersion(h.records, "ticket", "T-9");
    for (let i = 0; i < 3; i++) {
      // A writer outside writ touches the ticket after the agent read it, every time.
      h.records.seed("ticket", "T-9", { status: `touched-${i}`, tags: [] });
      const reply = await agent.submit({
        tool: tagTicket,
        entity: { type: "ticket", id: "T-9" },
        runId,
        stepId: "tag-1",
        baseVersion: base.version,
        // Each cycle the agent decides again from what it was shown: the tags it read, plus its own.
        delta: [{ op: "replace" as const, path: "/tags", value: [...(base.state.tags as string[]), "needs-human"] }],
        params: { tag: "needs-human" },
      });
      replies.push(reply);
      if (reply.status === "conflict") base = reply.current as typeof base;
    }
    expect(replies.map((r) => r.status)).toEqual(["conflict", "conflict", "escalated"]);
    expect((replies[1] as ConflictReply).cycle).toBe(2);
    const [escalation] = await h.readTopic(h.config.topics.human, "Escalation", 1);
    expect(escalation).toMatchObject({ reason: "conflict_cycles_exhausted", intent: { intentKey: replies[2]!.intentKey } });
    expect(h.records.history("ticket", "T-9").filter((e) => e.kind === "patch")).toHaveLength(0);
  });

  it("undecodable-record: lands on writ.dlq, and the next intent on that partition is still applied", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    await h.produceRaw("payment:pay_1", Buffer.from("{not json"));
    await h.produceRaw("payment:pay_1", Buffer.from(JSON.stringify({ intentId: "x-1", replyTo: "writ.replies.billing-agent." + h.id })));
    const { version } = await readVersion(h.records, "payment", "pay_1");

    const reply = await agent.submit(refund(run(), version));

    expect(reply.status).toBe("applied");
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 2);
    expect(dead.map((d) => d.reason)).toEqual(["undecodable", "schema_invalid"]);
    expect(Buffer.from(dead[0]!.valueBase64, "base64").toString()).toBe("{not json");
    const rejected = await h.readTopic("writ.replies.billing-agent." + h.id, "Reply", 2);
    expect(rejected.find((r) => r.intentId === "x-1")).toMatchObject({ status: "rejected", reason: "schema_invalid" });
  });

  it("deleted-reply-topic: an intent naming a reply topic deleted since the owner saw it is dead-lettered, and the partition goes on", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    h.records.seed("payment", "pay_2", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const gone = await h.client("gone-agent");
    const other = await h.client("other-agent");
    const onPay2 = async () => ({ ...refund(run(), (await readVersion(h.records, "payment", "pay_2")).version), entity: { type: "payment", id: "pay_2" } });
    // The owner has seen both reply topics (an applied reply went to each), then gone-agent's is deleted.
    expect((await gone.submit(refund(run(), (await readVersion(h.records, "payment", "pay_1")).version))).status).toBe("applied");
    expect((await other.submit(await onPay2())).status).toBe("applied");
    const admin = new Kafka({ clientId: `writ-test-${h.id}-admin`, brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    try {
      await admin.deleteTopics({ topics: [gone.replyTopic] });
      await waitFor(async () => !(await admin.listTopics()).includes(gone.replyTopic), { message: "the reply topic is deleted" });
    } finally {
      await admin.disconnect();
    }
    // Its next intent names the deleted topic; another agent's intent follows it on the same (only) partition.
    const lost = gone.submit(refund(run(), (await readVersion(h.records, "payment", "pay_1")).version), { timeoutMs: 5000 });
    const answered = await other.submit(await onPay2(), { timeoutMs: 60_000 });
    expect(answered.status).toBe("applied");
    const unanswered = await lost;
    expect(unanswered.status).toBe("unknown");
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead.map((d) => d.reason)).toEqual(["reply_topic_missing"]);
    // Its PATCH went out before the transaction carrying its reply failed: written once, never again.
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(2);
    expect(h.records.patchRequests(unanswered.intentKey)).toHaveLength(1);
    expect((await readVersion(h.records, "payment", "pay_2")).state.refunds).toHaveLength(2);
  });

  it("unreadable-batch: a gzip batch inflating past 64 MiB is one dead letter, and the next intent on that partition is still applied", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    await h.startRouter();
    const agent = await h.client("billing-agent");
    // About 80 KB on the wire; the broker accepts it (it validates a compressed batch as a stream, with no limit on what it inflates to).
    const bomb = Buffer.alloc(80 * 1024 * 1024);
    await h.produceBatch(
      [
        { key: "payment:pay_1", value: Buffer.from("{before") },
        { key: "payment:pay_1", value: bomb },
        { key: "payment:pay_1", value: Buffer.from("{after") },
      ],
      CompressionTypes.GZIP,
    );
    const { version } = await readVersion(h.records, "payment", "pay_1");

    const reply = await agent.submit(refund(run(), version));

    expect(reply.status).toBe("applied");
    const dead = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead).toHaveLength(1);
    expect(dead[0]).toMatchObject({ reason: "undecodable", key: null, originalBytes: 0, source: { offset: "2" } });
    expect(dead[0]!.message).toMatch(/^the record batch of offsets 0-2 could not be read \(KafkaCompressionError: gzip: refusing to decompress.*maxDecompressedBytes=67108864\)/);
    expect(dead[0]!.headers[UNREADABLE_BATCH_HEADER]).toMatch(/^0-2 KafkaCompressionError/);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toHaveLength(1);
  });

  it("every-intent-gets-a-reply: 60 intents over 12 entities from 3 agents, each answered, refunds counted at the records server", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    for (let i = 0; i < 12; i++) h.records.seed("payment", `pay_${i}`, { amountCents: 100_000, refunds: [] });
    await h.startRouter();
    const agents = await Promise.all(["a1", "a2", "a3"].map((n) => h.client(n)));
    const submissions = [];
    for (const [n, agent] of agents.entries()) {
      const intents = [];
      for (let i = 0; i < 20; i++) {
        const id = `pay_${i % 12}`;
        const { version } = await readVersion(h.records, "payment", id);
        const amountCents = 100 + n * 1000 + i;
        intents.push({
          tool: refundPayment,
          entity: { type: "payment", id },
          runId: `run-${n}`,
          stepId: `step-${i}`,
          baseVersion: version,
          delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents, reason: "goodwill" } }],
          params: { amountCents, reason: "goodwill" },
        });
      }
      submissions.push(agent.submitAll(intents));
    }
    const replies = (await Promise.all(submissions)).flat();
    expect(replies).toHaveLength(60);
    expect(replies.filter((r) => r.status === "applied")).toHaveLength(60);
    let refunds = 0;
    for (let i = 0; i < 12; i++) refunds += (await readVersion(h.records, "payment", `pay_${i}`)).state.refunds.length;
    expect(refunds).toBe(60);
  });

  it("large-submitAll: intents to one record, each within the owners' bounds and together over the brokers' 1 MB batch, are sent and each applied once", async () => {
    // A note kept in params (up to maxIntentBytes), the delta small: one record's partition gets all of them.
    const attachNote = declareWriteTool({
      name: "attach_note",
      recordType: "ticket",
      description: "Attach a long note to a ticket.",
      params: z.object({ slot: z.string(), note: z.string() }),
      intentFields: ["slot"],
      allowedPaths: [{ path: "/notes/-", ops: ["add"] }],
      keyScope: "run",
      versionPolicy: "rebase-commutative",
      system: "helpdesk",
      reconcile: "idempotency-key",
    });
    const h = await startHarness({ tools: [attachNote] });
    h.records.seed("ticket", "t_big", { notes: [] });
    await h.startRouter();
    const agent = await h.client("big-batch");
    const { version } = await readVersion(h.records, "ticket", "t_big");
    const note = "n".repeat(200_000);
    const intents = Array.from({ length: 6 }, (_, i) => ({
      tool: attachNote,
      entity: { type: "ticket", id: "t_big" },
      runId: "run-big",
      stepId: `note-${i}`,
      baseVersion: version,
      delta: [{ op: "add" as const, path: "/notes/-", value: i }],
      params: { slot: `s${i}`, note },
    }));

    const replies = await agent.submitAll(intents);

    expect(replies.map((r) => r.status)).toEqual(Array(6).fill("applied"));
    expect((await readVersion(h.records, "ticket", "t_big")).state.notes.sort()).toEqual([0, 1, 2, 3, 4, 5]);
    expect(h.records.patchRequests()).toHaveLength(6);
  });
});
