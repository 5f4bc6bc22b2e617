import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { ConflictReply, Reply } from "../../src/schemas/reply.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, startHarness } from "../helpers/writ-harness.ts";

/** One sample of a Prometheus text exposition. */
interface Sample {
  name: string;
  labels: Record<string, string>;
  value: number;
}

function parseProm(text: string): Sample[] {
  const out: Sample[] = [];
  for (const line of text.split("\n")) {
    if (line === "" || line.startsWith("#")) continue;
    const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
    if (!m) throw new Error(`not a Prometheus sample: ${line}`);
    const labels: Record<string, string> = {};
    for (const l of (m[2] ?? "").matchAll(/(\w+)="((?:[^"\\]|\\.)*)"/g)) labels[l[1]!] = l[2]!;
    out.push({ name: m[1]!, labels, value: Number(m[3]) });
  }
  return out;
}

/** Sum of the samples of `name` whose labels include `match`. */
function sum(samples: Sample[], name: string, match: Record<string, string> = {}): number {
  return samples.filter((s) => s.name === name && Object.entries(match).every(([k, v]) => s.labels[k] === v)).reduce((n, s) => n + s.value, 0);
}

const run = () => `run-${Math.random().toString(36).slice(2, 10)}`;

describe("metrics on a real broker", () => {
  it("serves /metrics beside /healthz and /readyz, and every count matches the records server and the topics", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    h.records.seed("ticket", "T-1", { status: "open", tags: [] });
    h.records.seed("ticket", "T-9", { status: "open", tags: [] });
    // The owner's requests go through a recording proxy: reads and lookups are counted there, PATCHes at the records server.
    const proxy = await startRecordingProxy(h.records.url);
    const systems = [
      createHttpSystemOfRecord({ name: "billing", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    // Port 0: the health server takes the kernel's pick and keeps it (a port picked free and bound later can be taken between).
    const router = await h.startRouter({ config: { ...h.config, healthPort: 0 }, systems });
    const base = `http://127.0.0.1:${router.healthPort()}`;
    await waitFor(async () => (await fetch(`${base}/readyz`)).status === 200, { message: "readyz" });
    const agent = await h.client("metrics-agent");
    const replyTopic = `writ.replies.metrics-agent.${h.id}`;

    // One applied, one repeat of it.
    const pay = await readVersion(h.records, "payment", "pay_1");
    const refund = {
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: run(),
      stepId: "refund-1",
      baseVersion: pay.version,
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 500, reason: "damaged" } }],
      params: { amountCents: 500, reason: "damaged" },
    };
    const applied = await agent.submit(refund);
    const repeat = await agent.submit(refund);
    expect(applied).toMatchObject({ status: "applied", duplicate: false });
    expect(repeat).toMatchObject({ status: "applied", duplicate: true });

    // One conflict: T-1 changed after the agent read it (a strict version mismatch, no PATCH).
    const stale = await readVersion(h.records, "ticket", "T-1");
    h.records.seed("ticket", "T-1", { status: "pending", tags: [] });
    const conflict = await agent.submit({
      tool: tagTicket,
      entity: { type: "ticket", id: "T-1" },
      runId: run(),
      stepId: "tag-1",
      baseVersion: stale.version,
      delta: [{ op: "replace" as const, path: "/tags", value: ["vip"] }],
      params: { tag: "vip" },
    });
    expect(conflict).toMatchObject({ status: "conflict", cycle: 1 });

    // An escalation after conflicts on T-9: a 412, then a change made by a writer outside writ after the agent
    // read (a strict version mismatch), then a 412 again: the third conflict escalates (maxConflictCycles 2).
    const stormRun = run();
    const tagT9 = (base: { state: { tags: string[] }; version: string }) =>
      agent.submit({
        tool: tagTicket,
        entity: { type: "ticket", id: "T-9" },
        runId: stormRun,
        stepId: "tag-1",
        baseVersion: base.version,
        delta: [{ op: "replace" as const, path: "/tags", value: [...base.state.tags, "needs-human"] }],
        params: { tag: "needs-human" },
      });
    const storm: string[] = [];
    h.records.setFaults([{ kind: "412-storm", times: 1, match: { type: "ticket", id: "T-9" } }]);
    storm.push((await tagT9(await readVersion(h.records, "ticket", "T-9"))).status);
    h.records.seed("ticket", "T-9", { status: "open", tags: ["sla"] });
    const read2 = await readVersion(h.records, "ticket", "T-9");
    h.records.seed("ticket", "T-9", { status: "open", tags: ["sla", "sla-2"] });
    const second = await tagT9(read2);
    storm.push(second.status);
    h.records.setFaults([{ kind: "412-storm", times: 1, match: { type: "ticket", id: "T-9" } }]);
    storm.push((await tagT9((second as ConflictReply).current as { state: { tags: string[] }; version: string })).status);
    expect(storm).toEqual(["conflict", "conflict", "escalated"]);

    // One dead letter.
    await h.produceRaw("payment:pay_1", Buffer.from("{not json"));

    // What happened, counted where it happened: the topics and the records server.
    const replies = (await h.readTopic(replyTopic, "Reply", 6)) as Reply[];
    const escalations = await h.readTopic(h.config.topics.human, "Escalation", 1);
    const deadLetters = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    const patches = h.records.patchRequests();
    const fresh = replies.filter((r) => !r.duplicate);
    const count = <T>(xs: T[], f: (x: T) => boolean) => xs.filter(f).length;
    const expected = {
      applied: count(fresh, (r) => r.status === "applied"),
      repeats: count(replies, (r) => r.duplicate),
      conflicts: count(fresh, (r) => r.status === "conflict"),
      escalated: count(fresh, (r) => r.status === "escalated"),
      escalationsByReason: count(escalations, (e) => e.reason === "conflict_cycles_exhausted"),
      undecodable: count(deadLetters, (d) => d.reason === "undecodable"),
      http412: count(patches, (p) => p.status === 412 && p.type === "ticket"),
      billingPatches: count(patches, (p) => p.type === "payment"),
      helpdeskPatches: count(patches, (p) => p.type === "ticket"),
      billingReads: count(proxy.seen, (r) => r.method === "GET" && r.path.startsWith("/records/payment/")),
      helpdeskReads: count(proxy.seen, (r) => r.method === "GET" && r.path.startsWith("/records/ticket/")),
      lookups: count(proxy.seen, (r) => r.method === "GET" && r.path.startsWith("/idempotency-keys/")),
      intentKeys: new Set(replies.map((r) => r.intentKey)).size,
    };
    expect(expected).toMatchObject({ applied: 1, repeats: 1, conflicts: 3, escalated: 1, escalationsByReason: 1, undecodable: 1, http412: 2, billingPatches: 1, helpdeskPatches: 2, intentKeys: 3 });
    expect(h.records.history("payment", "pay_1").filter((e) => e.kind !== "create")).toHaveLength(1);
    // A strict mismatch is a conflict without a PATCH: every conflict met (replies and the escalating one) less the 412s.
    const mismatches = expected.conflicts + expected.escalationsByReason - expected.http412;

    // The group's committed offsets and the topic's ends, as the brokers report them.
    const kafka = new Kafka({ clientId: `metrics-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const admin = kafka.admin();
    await admin.connect();
    const lagAtBroker = async () => {
      const ends = await admin.fetchTopicOffsets(h.config.topics.intents);
      const [committed] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
      return new Map(ends.map((e) => [String(e.partition), Number(e.high) - Math.max(0, Number(committed?.partitions.find((p) => p.partition === e.partition)?.offset ?? "0"))]));
    };

    const scrape = async () => {
      const res = await fetch(`${base}/metrics`);
      expect(res.status).toBe(200);
      expect(res.headers.get("content-type")).toContain("text/plain");
      return parseProm(await res.text());
    };
    let samples: Sample[] = [];
    let brokerLag = new Map<string, number>();
    try {
      await waitFor(
        async () => {
          samples = await scrape();
          brokerLag = await lagAtBroker();
          const lagSettled = [...brokerLag].every(([p, lag]) => lag === 0 && sum(samples, "writ_consumer_lag_records", { partition: p }) === 0);
          return sum(samples, "writ_intents_total") === 7 && sum(samples, "writ_ledger_pending_entries") === 0 && lagSettled;
        },
        { timeoutMs: 20_000, intervalMs: 250, message: () => `metrics not settled: ${JSON.stringify(samples.filter((s) => s.name.startsWith("writ_intents") || s.name.startsWith("writ_consumer") || s.name.startsWith("writ_ledger")))} broker lag ${JSON.stringify([...brokerLag])}` },
      );
    } finally {
      await admin.disconnect();
    }

    // Intents by tool and outcome.
    expect(sum(samples, "writ_intents_total", { tool: "refund_payment", outcome: "applied" })).toBe(expected.applied);
    expect(sum(samples, "writ_intents_total", { tool: "refund_payment", outcome: "repeat" })).toBe(expected.repeats);
    expect(sum(samples, "writ_intents_total", { tool: "tag_ticket", outcome: "conflict" })).toBe(expected.conflicts);
    expect(sum(samples, "writ_intents_total", { tool: "tag_ticket", outcome: "escalated" })).toBe(expected.escalated);
    expect(sum(samples, "writ_intents_total", { tool: "none", outcome: "dead_lettered" })).toBe(expected.undecodable);
    expect(sum(samples, "writ_intents_total", { outcome: "rejected" })).toBe(0);
    expect(sum(samples, "writ_duplicates_answered_total", { tool: "refund_payment" })).toBe(expected.repeats);
    // Conflicts by tool, record type and cause.
    expect(sum(samples, "writ_conflicts_total", { tool: "tag_ticket", record_type: "ticket", cause: "precondition_failed" })).toBe(expected.http412);
    expect(sum(samples, "writ_conflicts_total", { tool: "tag_ticket", record_type: "ticket", cause: "version_mismatch" })).toBe(mismatches);
    expect(sum(samples, "writ_conflicts_total")).toBe(expected.http412 + mismatches);
    // Escalations and dead letters by reason.
    expect(sum(samples, "writ_escalations_total", { reason: "conflict_cycles_exhausted" })).toBe(expected.escalationsByReason);
    expect(sum(samples, "writ_escalations_total")).toBe(escalations.length);
    expect(sum(samples, "writ_dead_letters_total", { reason: "undecodable" })).toBe(expected.undecodable);
    expect(sum(samples, "writ_dead_letters_total")).toBe(deadLetters.length);
    // System-of-record calls by system and method, against what reached the server.
    const sor = (match: Record<string, string>) => sum(samples, "writ_sor_request_duration_seconds_count", match);
    expect(sor({ system: "billing", method: "patch" })).toBe(expected.billingPatches);
    expect(sor({ system: "billing", method: "patch", outcome: "applied" })).toBe(expected.billingPatches);
    expect(sor({ system: "helpdesk", method: "patch" })).toBe(expected.helpdeskPatches);
    expect(sor({ system: "helpdesk", method: "patch", outcome: "precondition_failed" })).toBe(expected.http412);
    expect(sor({ system: "billing", method: "read" })).toBe(expected.billingReads);
    expect(sor({ system: "helpdesk", method: "read" })).toBe(expected.helpdeskReads);
    expect(sor({ method: "lookup" })).toBe(expected.lookups);
    expect(sum(samples, "writ_sor_request_duration_seconds_sum")).toBeGreaterThan(0);
    // No record id in any label.
    for (const s of samples) for (const v of Object.values(s.labels)) expect(v).not.toMatch(/pay_1|T-1|T-9/);
    // Per partition: restore once each, ledger entries (one per intent key), nothing pending, no lag.
    const owned = router.ownedPartitions().map(String);
    expect(owned).toHaveLength(3);
    for (const p of owned) {
      expect(sum(samples, "writ_restore_duration_seconds_count", { partition: p })).toBe(1);
      expect(sum(samples, "writ_ledger_pending_entries", { partition: p })).toBe(0);
      expect(sum(samples, "writ_ledger_oldest_pending_age_seconds", { partition: p })).toBe(0);
      expect(samples.filter((s) => s.name === "writ_consumer_lag_records" && s.labels.partition === p)).toHaveLength(1);
      expect(sum(samples, "writ_consumer_lag_records", { partition: p })).toBe(brokerLag.get(p));
    }
    expect(sum(samples, "writ_ledger_entries")).toBe(expected.intentKeys);
    expect(sum(samples, "writ_transaction_duration_seconds_count")).toBeGreaterThanOrEqual(1);

    // One server: health and readiness beside the metrics; the same text as a library call.
    expect((await fetch(`${base}/healthz`)).status).toBe(200);
    expect((await fetch(`${base}/readyz`)).status).toBe(200);
    const text = await router.metrics();
    expect(sum(parseProm(text), "writ_intents_total")).toBe(7);
  });

  it("keeps one registry per router: two routers in one process count apart", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const a = await h.startRouter();
    const g = await startHarness({ tools: [refundPayment, tagTicket] });
    const b = await g.startRouter();
    const agent = await h.client("registry-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const reply = await agent.submit({
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: run(),
      stepId: "refund-1",
      baseVersion: version,
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 100, reason: "late" } }],
      params: { amountCents: 100, reason: "late" },
    });
    expect(reply.status).toBe("applied");
    await waitFor(async () => sum(parseProm(await a.metrics()), "writ_intents_total", { outcome: "applied" }) === 1, { message: "router a counts its intent" });
    expect(sum(parseProm(await b.metrics()), "writ_intents_total")).toBe(0);
  });
});
