// Changes that span records, under leases held by the records' owners, on the
// real broker, against the demo records server with its own Idempotency-Key
// dedupe off: every effect is counted at the records server (PATCH requests
// per intent key, the records' final state), never taken from writ's replies.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it } from "vitest";
import { noteAccount, refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { buildLeaseIntent, type ChangeInput } from "../../producers/change.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { changeId, undoIntentKey } from "../../src/keys.ts";
import type { AppliedReply } from "../../src/schemas/reply.ts";
import { brokers, readVersion, startHarness } from "../helpers/writ-harness.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { produceAgain, recordedIntent } from "../helpers/intent-replay.ts";

const TOOLS = [refundPayment, tagTicket, noteAccount];
const run = () => `run-${randomUUID().slice(0, 8)}`;

async function harness() {
  const h = await startHarness({ tools: TOOLS });
  h.records.setConfig({ honourIdempotencyKey: false });
  return h;
}

type Records = Awaited<ReturnType<typeof harness>>["records"];

/** The `writ_leases_held` gauge summed over the router's partitions. */
const leasesHeld = (metrics: string): number =>
  [...metrics.matchAll(/^writ_leases_held\{[^}]*\} (\d+)$/gm)].reduce((n, m) => n + Number(m[1]), 0);

function seedThree(records: Records, n: string) {
  records.seed("payment", `pay_${n}`, { amountCents: 100_000, refunds: [] });
  records.seed("ticket", `T-${n}`, { status: "open", tags: ["damaged"] });
  records.seed("account", `acc_${n}`, { name: "Ada", notes: [] });
}

/** Refund the payment, tag the ticket `refunded`, note the account: the demo's change over three records. */
function resolveDamagedOrder(n: string, runId: string, extra: Partial<ChangeInput> = {}): ChangeInput {
  return {
    runId,
    stepId: "resolve-damaged-order",
    steps: [
      { name: "refund", tool: refundPayment, entity: { type: "payment", id: `pay_${n}` }, params: { amountCents: 2500, reason: "damaged", ref: `chg-${n}` }, delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 2500, reason: "damaged", ref: `chg-${n}` } }] },
      {
        name: "tag",
        tool: tagTicket,
        entity: { type: "ticket", id: `T-${n}` },
        params: { tag: "refunded" },
        delta: (current) => [{ op: "replace", path: "/tags", value: [...((current.state as { tags: string[] }).tags ?? []), "refunded"] }],
      },
      { name: "note", tool: noteAccount, entity: { type: "account", id: `acc_${n}` }, params: { ref: `chg-${n}`, text: "Refunded 25.00 for a damaged order" }, delta: [{ op: "add", path: "/notes/-", value: { ref: `chg-${n}`, text: "Refunded 25.00 for a damaged order" } }] },
    ],
    leaseTtlMs: 30_000,
    ...extra,
  };
}

/** PATCH requests at the records server for each intent key, by outcome. */
const patches = (records: Records, key: string) => records.patchRequests(key).map((r) => r.outcome);

const leaseIntent = (client: WritClient, change: string, op: "acquire" | "release", entity: { type: string; id: string }, tool: string, ttlMs?: number) =>
  buildLeaseIntent({ change, op, entity, tool, agentId: client.agentId, runId: "r", stepId: `s/${op}`, replyTo: client.replyTopic, ...(ttlMs === undefined ? {} : { ttlMs }) });

/**
 * Intent `intentId` as the client produced it (value and headers, its signature among them), copied off the
 * intents topic by anyone who may read it, and produced again with a raw producer: the same bytes. Resolves with
 * the replay's answer on `replyTopic` (the first answer to the intent id is the original's own).
 */
async function replayed(h: Awaited<ReturnType<typeof harness>>, replyTopic: string, intentId: string): Promise<string> {
  const bytes = await recordedIntent(h, intentId);
  const kafka = new Kafka({ brokers: brokers(), clientId: `replayer-${h.id}`, logLevel: logLevel.NOTHING });
  // An idle fetch ends after 500 ms, not kafkajs's 5 s: disconnect() waits for the fetch in flight.
  const replies = kafka.consumer({ groupId: `writ.test-replies.${randomUUID()}`, maxWaitTimeInMs: 100 });
  const answers: string[] = [];
  await replies.connect();
  try {
    await replies.subscribe({ topic: replyTopic, fromBeginning: true });
    await replies.run({ eachMessage: async ({ message }) => void (message.value?.includes(intentId) ? answers.push(message.value.toString("latin1")) : undefined) });
    await produceAgain(h, bytes);
    return await waitFor(() => answers[1], { timeoutMs: 30_000, message: () => `the replayed intent's answer (${answers.length} seen)` });
  } finally {
    await replies.disconnect();
  }
}

/** Records `n` seeded, a router, the agents "resolver" (with a change id) and "support", and ticket T-`n`. */
async function resolverAndSupport(n: string) {
  const h = await harness();
  seedThree(h.records, n);
  const router = await h.startRouter();
  const [resolver, support] = await Promise.all([h.client("resolver"), h.client("support")]);
  return { h, router, resolver, support, change: changeId({ agentId: "resolver", runId: run(), stepId: "c" }), ticket: { type: "ticket", id: `T-${n}` } };
}

describe("changes that span records on a real broker", () => {
  it("a three-record change applies each step once under leases; a write racing it on the same record waits and is applied too (no lost update)", async () => {
    const h = await harness();
    seedThree(h.records, "1");
    await h.startRouter();
    const [resolver, billing] = await Promise.all([h.client("resolver"), h.client("billing-agent")]);
    const { version } = await readVersion(h.records, "payment", "pay_1");

    const [result, racing] = await Promise.all([
      resolver.change(resolveDamagedOrder("1", run())),
      billing.submit({ tool: refundPayment, entity: { type: "payment", id: "pay_1" }, runId: run(), stepId: "goodwill", baseVersion: version, delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 700, reason: "goodwill" } }], params: { amountCents: 700, reason: "goodwill" } }),
    ]);

    expect(result.status).toBe("applied");
    expect(racing).toMatchObject({ status: "applied" });
    const steps = result.status === "applied" ? result.steps : [];
    expect(steps.map((s) => [s.status, s.duplicate])).toEqual([["applied", false], ["applied", false], ["applied", false]]);
    // At the records server: one PATCH per step, every change present once, the racing refund too.
    for (const s of steps) expect(patches(h.records, s.intentKey)).toEqual(["applied"]);
    expect(patches(h.records, racing.intentKey)).toEqual(["applied"]);
    const payment = await readVersion(h.records, "payment", "pay_1");
    expect(payment.state.refunds).toHaveLength(2);
    expect(payment.state.refunds).toEqual(expect.arrayContaining([{ amountCents: 2500, reason: "damaged", ref: "chg-1" }, { amountCents: 700, reason: "goodwill" }]));
    expect((await readVersion(h.records, "ticket", "T-1")).state.tags).toEqual(["damaged", "refunded"]);
    expect((await readVersion(h.records, "account", "acc_1")).state.notes).toEqual([{ ref: "chg-1", text: "Refunded 25.00 for a damaged order" }]);

    // The leases were released: a write to the ticket now is applied at once, never answered `leased`.
    const ticket = await readVersion(h.records, "ticket", "T-1");
    const after = await billing.submit({ tool: tagTicket, entity: { type: "ticket", id: "T-1" }, runId: run(), stepId: "vip", baseVersion: ticket.version, delta: [{ op: "replace", path: "/tags", value: [...ticket.state.tags, "vip"] }], params: { tag: "vip" } }, { onLeased: "answer" });
    expect(after).toMatchObject({ status: "applied" });
  });

  it("while a change holds a record, another agent's write is answered `leased` with nothing sent; after the release it is applied", async () => {
    const { h, router, resolver, support, change, ticket } = await resolverAndSupport("2");

    const granted = await resolver.submit(leaseIntent(resolver, change, "acquire", ticket, "tag_ticket"));
    expect(granted).toMatchObject({ status: "applied", via: "lease", version: '"v1"', state: { status: "open", tags: ["damaged"] }, lease: { change } });
    expect(leasesHeld(await router.metrics())).toBe(1);
    const input = { tool: tagTicket, entity: ticket, runId: run(), stepId: "vip", baseVersion: '"v1"', delta: [{ op: "replace" as const, path: "/tags", value: ["damaged", "vip"] }], params: { tag: "vip" } };
    const refused = await support.submit(input, { onLeased: "answer" });
    expect(refused).toMatchObject({ status: "rejected", reason: "leased", details: { expiresAt: (granted as AppliedReply & { lease: { expiresAt: string } }).lease.expiresAt } });
    // The same change id from another agent does not hold the lease either.
    const spoofed = await support.submit({ ...support.buildIntent(input), lease: { change, op: "step" } }, { onLeased: "answer" });
    expect(spoofed).toMatchObject({ status: "rejected", reason: "leased" });
    expect(patches(h.records, refused.intentKey)).toEqual([]);

    const released = await resolver.submit(leaseIntent(resolver, change, "release", ticket, "tag_ticket"));
    expect(released).toMatchObject({ status: "applied", via: "lease", duplicate: false, lease: { change, released: true } });
    const releasedAgain = await resolver.submit(leaseIntent(resolver, change, "release", ticket, "tag_ticket"));
    expect(releasedAgain).toMatchObject({ status: "applied", via: "lease", duplicate: true });
    expect(leasesHeld(await router.metrics())).toBe(0);

    const applied = await support.submit(input, { onLeased: "answer" });
    expect(applied).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, applied.intentKey)).toEqual(["applied"]);
  });

  it("lease-replay: the bytes of a released lease's acquire produced again are refused `lease_replayed`; another agent's write is then applied", async () => {
    const { h, router: first, resolver, support, change, ticket } = await resolverAndSupport("9");
    const acquire = leaseIntent(resolver, change, "acquire", ticket, "tag_ticket", 60_000);
    expect(await resolver.submit(acquire)).toMatchObject({ status: "applied", via: "lease" });
    expect(await resolver.submit(leaseIntent(resolver, change, "release", ticket, "tag_ticket"))).toMatchObject({ status: "applied", via: "lease", duplicate: false });
    // Another owner takes over: what it knows of the release, it restores from the ledger.
    await first.stop();
    await h.startRouter();

    expect(await replayed(h, resolver.replyTopic, acquire.intentId)).toContain('"lease_replayed"');

    // The record is free: another agent's write is applied at once, never answered `leased`.
    const { version, state } = await readVersion(h.records, "ticket", "T-9");
    const write = await support.submit({ tool: tagTicket, entity: ticket, runId: run(), stepId: "vip", baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [...(state.tags as string[]), "vip"] }], params: { tag: "vip" } }, { onLeased: "answer" });
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, write.intentKey)).toEqual(["applied"]);
  });

  it("release-replay: the bytes of a change's earlier release produced again while the change holds the record anew release nothing: another agent's write is still answered `leased`", async () => {
    const { h, resolver, support, change, ticket } = await resolverAndSupport("12");
    expect(await resolver.submit(leaseIntent(resolver, change, "acquire", ticket, "tag_ticket", 60_000))).toMatchObject({ status: "applied", via: "lease" });
    const release = leaseIntent(resolver, change, "release", ticket, "tag_ticket");
    expect(await resolver.submit(release)).toMatchObject({ status: "applied", via: "lease", duplicate: false });
    // The change takes the record again (a resumed change: a new acquire, made after its release).
    expect(await resolver.submit(leaseIntent(resolver, change, "acquire", ticket, "tag_ticket", 60_000))).toMatchObject({ status: "applied", via: "lease", duplicate: false });

    const answer = await replayed(h, resolver.replyTopic, release.intentId);

    // The change still holds the record: another agent's write is answered `leased`, nothing sent.
    const { version, state } = await readVersion(h.records, "ticket", "T-12");
    const write = await support.submit({ tool: tagTicket, entity: ticket, runId: run(), stepId: "vip", baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [...(state.tags as string[]), "vip"] }], params: { tag: "vip" } }, { onLeased: "answer" });
    expect(write).toMatchObject({ status: "rejected", reason: "leased" });
    expect(patches(h.records, write.intentKey)).toEqual([]);
    expect((await readVersion(h.records, "ticket", "T-12")).state.tags).toEqual(["damaged"]);
    expect(answer).toContain('"lease_replayed"');
  });

  it("lease-lapse-replay: a lease left to lapse keeps a mark: its acquire's bytes produced again are refused `lease_replayed`; another agent's writes are applied", async () => {
    const { h, router: first, resolver, support, change, ticket } = await resolverAndSupport("10");
    const acquire = leaseIntent(resolver, change, "acquire", ticket, "tag_ticket", 1000);
    expect(await resolver.submit(acquire)).toMatchObject({ status: "applied", via: "lease" });
    // Never released. Another agent's write waits it out (onLeased: wait); the owner frees the lapsed lease.
    const tag = async (t: string) => {
      const { version, state } = await readVersion(h.records, "ticket", "T-10");
      return { tool: tagTicket, entity: ticket, runId: run(), stepId: t, baseVersion: version, delta: [{ op: "replace" as const, path: "/tags", value: [...(state.tags as string[]), t] }], params: { tag: t } };
    };
    const waited = await support.submit(await tag("vip"), { timeoutMs: 30_000 });
    expect(waited).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, waited.intentKey)).toEqual(["applied"]);
    await waitFor(async () => /writ_leases_expired_total\{record_type="ticket"\} 1/.test(await first.metrics()), { timeoutMs: 10_000, message: "writ_leases_expired_total did not count the lapsed lease" });
    // Another owner takes over: what it knows of the lapse, it restores from the ledger.
    await first.stop();
    await h.startRouter();

    expect(await replayed(h, resolver.replyTopic, acquire.intentId)).toContain('"lease_replayed"');

    // Nothing was taken: the other agent's next write is applied at once, never answered `leased`.
    const write = await support.submit(await tag("urgent"), { onLeased: "answer" });
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, write.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "ticket", "T-10")).state.tags).toEqual(["damaged", "vip", "urgent"]);
  });

  it("lease-limit: an agent holding WRIT_MAX_LEASES_PER_AGENT leases on a partition is refused lease_limit, nothing taken, also by the next owner; its change() ends not_started, releasing what it took; another agent's acquire and writes go on", async () => {
    // One partition: every record's lease is counted on the same ledger partition.
    const h = await startHarness({ tools: TOOLS, intentPartitions: 1 });
    h.records.setConfig({ honourIdempotencyKey: false });
    const ids = ["a", "b", "c", "d", "e", "f"];
    for (const n of ids) h.records.seed("ticket", `T-cap-${n}`, { status: "open", tags: ["damaged"] });
    const config = { ...h.config, maxLeasesPerAgent: 2 };
    const first = await h.startRouter({ config });
    const [hoarder, support] = await Promise.all([h.client("hoarder"), h.client("support")]);
    const change = changeId({ agentId: "hoarder", runId: run(), stepId: "hold" });
    const ticket = (n: string) => ({ type: "ticket", id: `T-cap-${n}` });
    const acquire = (client: WritClient, chg: string, n: string) => client.submit(leaseIntent(client, chg, "acquire", ticket(n), "tag_ticket", 60_000));
    const tag = async (n: string, t: string) => {
      const { version, state } = await readVersion(h.records, "ticket", `T-cap-${n}`);
      return support.submit({ tool: tagTicket, entity: ticket(n), runId: run(), stepId: t, baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [...(state.tags as string[]), t] }], params: { tag: t } }, { onLeased: "answer" });
    };

    expect(await acquire(hoarder, change, "a")).toMatchObject({ status: "applied", via: "lease" });
    expect(await acquire(hoarder, change, "b")).toMatchObject({ status: "applied", via: "lease" });
    const refused = await acquire(hoarder, change, "c");
    expect(refused).toMatchObject({ status: "rejected", reason: "lease_limit", details: { held: 2, max: 2 } });
    // Nothing was taken: another agent's write of the record is applied at once, written once; a leased one waits.
    const write = await tag("c", "vip");
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, write.intentKey)).toEqual(["applied"]);
    expect(await tag("a", "vip")).toMatchObject({ status: "rejected", reason: "leased" });
    // The limit is each agent's: another agent's acquire is granted.
    expect(await acquire(support, changeId({ agentId: "support", runId: run(), stepId: "hold" }), "d")).toMatchObject({ status: "applied", via: "lease" });
    expect(await first.metrics()).toMatch(/^writ_leases_refused_total\{reason="lease_limit"\} 1$/m);

    // Another owner takes over: the count is restored with the partition's ledger.
    await first.stop();
    await h.startRouter({ config });
    expect(await acquire(hoarder, change, "c")).toMatchObject({ status: "rejected", reason: "lease_limit", details: { held: 2, max: 2 } });

    // One lease given back, a change over two more records: the first taken, the second refused, the first released.
    expect(await hoarder.submit(leaseIntent(hoarder, change, "release", ticket("b"), "tag_ticket"))).toMatchObject({ status: "applied", duplicate: false });
    const steps = ["e", "f"].map((n) => ({ name: n, tool: tagTicket, entity: ticket(n), params: { tag: "hoarded" }, delta: [{ op: "replace" as const, path: "/tags", value: ["damaged", "hoarded"] }] }));
    const result = await hoarder.change({ runId: run(), stepId: "more", steps, leaseTtlMs: 60_000 });
    expect(result).toMatchObject({ status: "not_started", entity: ticket("f"), result: { status: "rejected", reason: "lease_limit" } });
    const other = await tag("e", "vip");
    expect(other).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, other.intentKey)).toEqual(["applied"]);
    expect(h.records.patchRequests().filter((r) => r.id === "T-cap-e" || r.id === "T-cap-f").map((r) => r.outcome)).toEqual(["applied"]);
  });

  it("lease-max-hold: renewals of a lease past WRIT_LEASE_MAX_HOLD_MS from its grant are refused lease_hold_exceeded; it lapses at its expiry and another agent's write waiting for it is applied", async () => {
    const h = await harness();
    h.records.seed("ticket", "T-hold", { status: "open", tags: ["damaged"] });
    const router = await h.startRouter({ config: { ...h.config, leaseMaxHoldMs: 1000 } });
    const [holder, support] = await Promise.all([h.client("holder"), h.client("support")]);
    const change = changeId({ agentId: "holder", runId: run(), stepId: "hold" });
    const ticket = { type: "ticket", id: "T-hold" };
    const acquire = () => holder.submit(leaseIntent(holder, change, "acquire", ticket, "tag_ticket", 2000));
    let last = (await acquire()) as AppliedReply;
    expect(last).toMatchObject({ status: "applied", via: "lease" });

    // The agent renews for as long as it likes: owners stop renewing a second after the grant.
    const refused = await waitFor(
      async () => {
        const r = await acquire();
        if (r.status === "applied") last = r;
        return r.status === "rejected" ? r : undefined;
      },
      { timeoutMs: 20_000, message: "no renewal was refused: the lease is held as long as its agent renews it" },
    );
    expect(refused).toMatchObject({ status: "rejected", reason: "lease_hold_exceeded", details: { maxHoldMs: 1000, expiresAt: last.lease!.expiresAt } });

    // Not renewed, it lapses at its expiry: the other agent's write, waiting it out, is applied, written once.
    const { version, state } = await readVersion(h.records, "ticket", "T-hold");
    const write = await support.submit({ tool: tagTicket, entity: ticket, runId: run(), stepId: "vip", baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [...(state.tags as string[]), "vip"] }], params: { tag: "vip" } }, { timeoutMs: 30_000 });
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, write.intentKey)).toEqual(["applied"]);
    const metrics = await router.metrics();
    expect(metrics).toMatch(/^writ_leases_refused_total\{reason="lease_hold_exceeded"\} [1-9]/m);
    expect(metrics).toMatch(/^writ_leases_expired_total\{record_type="ticket"\} 1$/m);
  });

  it("lease-cooldown: an agent whose hold of a record passed WRIT_LEASE_MAX_HOLD_MS cannot take it straight back, by a new acquire once it lapsed nor by releasing and acquiring again: refused lease_cooldown, another agent's write is applied meanwhile; after the cool-down it may", async () => {
    const h = await harness();
    for (const id of ["T-cool-a", "T-cool-b"]) h.records.seed("ticket", id, { status: "open", tags: ["damaged"] });
    // A hold longer than B's time to live: B's leases taken again continue the hold while theirs ends within it.
    const router = await h.startRouter({ config: { ...h.config, leaseMaxHoldMs: 3000 } });
    const [holder, support] = await Promise.all([h.client("holder"), h.client("support")]);
    const ticket = (id: string) => ({ type: "ticket", id });
    const newChange = () => changeId({ agentId: "holder", runId: run(), stepId: "hold" });
    const acquire = (change: string, id: string, ttlMs = 2000) => holder.submit(leaseIntent(holder, change, "acquire", ticket(id), "tag_ticket", ttlMs));
    const tag = async (id: string, t: string) => {
      const { version, state } = await readVersion(h.records, "ticket", id);
      return support.submit({ tool: tagTicket, entity: ticket(id), runId: run(), stepId: t, baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [...(state.tags as string[]), t] }], params: { tag: t } }, { onLeased: "answer" });
    };

    // A: held and renewed until a renewal is refused; once the lease lapsed, a new change of the same agent asks
    // for the record again (a raw acquire loop: every answer but `leased` ends it).
    const first = newChange();
    expect(await acquire(first, "T-cool-a")).toMatchObject({ status: "applied", via: "lease" });
    await waitFor(async () => (await acquire(first, "T-cool-a")).status === "rejected", { timeoutMs: 20_000, message: "no renewal was refused lease_hold_exceeded" });
    const again = newChange();
    const retaken = await waitFor(
      async () => {
        const r = await acquire(again, "T-cool-a");
        return r.status === "rejected" && r.reason === "leased" ? undefined : r;
      },
      { intervalMs: 0, timeoutMs: 20_000, message: "the lapsed lease was never let go" },
    );
    // Without the cool-down: granted at once, and the agent holds the record again for as long again.
    expect(retaken).toMatchObject({ status: "rejected", reason: "lease_cooldown", details: { maxHoldMs: 3000, change: first } });
    // Nothing was taken: the other agent's write is applied at once, written once.
    const write = await tag("T-cool-a", "vip");
    expect(write).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, write.intentKey)).toEqual(["applied"]);

    // B: released and acquired again at once by a new change, and again: the hold goes on across the agent's
    // leases, so once a lease taken again would outlive the longest hold the acquire is refused (without it,
    // granted every time).
    let last = newChange();
    expect(await acquire(last, "T-cool-b", 1000)).toMatchObject({ status: "applied", via: "lease" });
    const cooled = await waitFor(
      async () => {
        expect(await holder.submit(leaseIntent(holder, last, "release", ticket("T-cool-b"), "tag_ticket"))).toMatchObject({ status: "applied", duplicate: false });
        last = newChange();
        const r = await acquire(last, "T-cool-b", 1000);
        return r.status === "rejected" ? r : undefined;
      },
      { timeoutMs: 20_000, message: "an agent releasing and acquiring again was granted the record without end" },
    );
    expect(cooled).toMatchObject({ status: "rejected", reason: "lease_cooldown", details: { maxHoldMs: 3000 } });
    const other = await tag("T-cool-b", "vip");
    expect(other).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, other.intentKey)).toEqual(["applied"]);
    expect(await router.metrics()).toMatch(/^writ_leases_refused_total\{reason="lease_cooldown"\} [1-9]/m);

    // The cool-down ends: from its `until`, the agent is granted the record again.
    const until = Date.parse((retaken as { details: { until: string } }).details.until);
    const granted = await waitFor(
      async () => {
        if (Date.now() < until) return undefined;
        const r = await acquire(newChange(), "T-cool-a");
        return r.status === "applied" ? r : undefined;
      },
      { timeoutMs: 30_000, message: "the record stayed kept from the agent past the cool-down" },
    );
    expect(granted).toMatchObject({ status: "applied", via: "lease" });
  });

  it("a step the system refuses: the steps applied before it are undone, newest first, and nothing of the change remains", async () => {
    const h = await harness();
    seedThree(h.records, "3");
    await h.startRouter();
    const resolver = await h.client("resolver");
    h.records.setFaults([{ kind: "refuse-write", match: { type: "account", id: "acc_3" }, problem: "account-frozen" }]);

    const result = await resolver.change(resolveDamagedOrder("3", run()));

    expect(result.status).toBe("compensated");
    if (result.status !== "compensated") return;
    expect(result.failed).toMatchObject({ step: "note", result: { status: "rejected", reason: "patch_not_applicable" } });
    expect(result.undone.map((u) => u.status)).toEqual(["applied", "applied"]);
    // Newest first: the ticket's tag, then the refund.
    const [undoTag, undoRefund] = result.undone as AppliedReply[];
    const payment = await readVersion(h.records, "payment", "pay_3");
    const refundKey = undoRefund!.undoOf!;
    expect(undoIntentKey(refundKey)).toBe(undoRefund!.intentKey);
    expect(patches(h.records, refundKey)).toEqual(["applied"]);
    expect(patches(h.records, undoTag!.intentKey)).toEqual(["applied"]);
    expect(patches(h.records, undoRefund!.intentKey)).toEqual(["applied"]);
    expect(payment.state.reversals).toEqual([{ reverses: refundKey, amountCents: 2500, reason: "damaged" }]);
    expect((await readVersion(h.records, "ticket", "T-3")).state.tags).toEqual(["damaged"]);
    expect((await readVersion(h.records, "account", "acc_3")).state.notes).toEqual([]);
    expect(h.records.patchRequests().filter((r) => r.type === "account").map((r) => r.outcome)).toEqual(["refused"]);
  });

  it("a step without its lease is refused `lease_not_held`; a lease left to expire is released, counted, and the record's writes go on", async () => {
    const h = await harness();
    seedThree(h.records, "4");
    const router = await h.startRouter();
    const [stalled, support] = await Promise.all([h.client("stalled-agent"), h.client("support")]);
    const change = changeId({ agentId: "stalled-agent", runId: run(), stepId: "c" });
    const ticket = { type: "ticket", id: "T-4" };
    const input = { tool: tagTicket, entity: ticket, runId: run(), stepId: "vip", baseVersion: '"v1"', delta: [{ op: "replace" as const, path: "/tags", value: ["damaged", "vip"] }], params: { tag: "vip" } };

    const orphan = await stalled.submit({ ...stalled.buildIntent(input), lease: { change, op: "step" } });
    expect(orphan).toMatchObject({ status: "rejected", reason: "lease_not_held" });
    expect(patches(h.records, orphan.intentKey)).toEqual([]);

    // The agent takes a 1 s lease and never comes back. The other agent's write waits it out (onLeased: wait).
    expect(await stalled.submit(leaseIntent(stalled, change, "acquire", ticket, "tag_ticket", 1000))).toMatchObject({ status: "applied", via: "lease" });
    const applied = await support.submit(input, { timeoutMs: 30_000 });
    expect(applied).toMatchObject({ status: "applied", via: "patch" });
    expect(patches(h.records, applied.intentKey)).toEqual(["applied"]);
    await waitFor(async () => /writ_leases_expired_total\{record_type="ticket"\} 1/.test(await router.metrics()), { timeoutMs: 10_000, message: () => "writ_leases_expired_total did not count the expired lease" });
  });

  /**
   * One partition (the aborted transaction reopens the partition the step is on, in the same router), a 1 s lease on
   * pay_<n>, and a step of its change whose transaction carrying the `pending` entry fails before its commit once
   * `before()` holds and the lease is past its end (an owner stopping there): aborted, the entry is in doubt.
   */
  async function stepInDoubt(n: string, before: (h: Awaited<ReturnType<typeof startHarness>>) => Promise<unknown>) {
    const h = await startHarness({ tools: TOOLS, intentPartitions: 1 });
    h.records.setConfig({ honourIdempotencyKey: false });
    seedThree(h.records, n);
    let armed = false;
    let expiresAt = Number.POSITIVE_INFINITY;
    const router = await h.startRouter(
      {},
      {
        beforeCommit: async ({ topics }) => {
          if (!armed || !topics.includes(h.config.topics.ledger)) return;
          armed = false;
          await before(h);
          await waitFor(() => Date.now() > expiresAt, { timeoutMs: 20_000, message: "the lease never lapsed" });
          throw new Error("injected: the transaction fails before its commit");
        },
      },
    );
    const resolver = await h.client("resolver");
    const change = changeId({ agentId: "resolver", runId: run(), stepId: "c" });
    const payment = { type: "payment", id: `pay_${n}` };
    const granted = await resolver.submit(leaseIntent(resolver, change, "acquire", payment, "refund_payment", 1000));
    expect(granted).toMatchObject({ status: "applied", via: "lease" });
    expiresAt = Date.parse((granted as AppliedReply).lease!.expiresAt!);
    const { version } = await readVersion(h.records, "payment", payment.id);
    const refund = { amountCents: 2500, reason: "damaged", ref: `chg-${n}` };
    const step = { ...resolver.buildIntent({ tool: refundPayment, entity: payment, runId: run(), stepId: "c/refund", baseVersion: version, delta: [{ op: "add", path: "/refunds/-", value: refund }], params: refund }), lease: { change, op: "step" as const } };
    const arm = () => (armed = true);
    const pendingSettled = async () => {
      let text = "";
      await waitFor(async () => /^writ_ledger_pending_entries\{[^}]*\} 0$/m.test((text = await router.metrics())), { timeoutMs: 30_000, message: () => text.split("\n").filter((l) => l.includes("pending_entries")).join("\n") });
    };
    return { h, resolver, change, payment, step, refund, arm, pendingSettled };
  }

  it("lease-lapse-in-doubt: a step whose PATCH went out before its owner's transaction failed, its lease lapsing meanwhile, is reconciled and answered applied, never refused as unwritten", async () => {
    // The transaction waits until the step's PATCH has reached the records server.
    const { h, resolver, step, refund, arm, pendingSettled } = await stepInDoubt("11", (h) =>
      waitFor(() => h.records.patchRequests().length >= 1, { timeoutMs: 20_000, message: "the step's PATCH never reached the records server" }),
    );
    arm();

    const answer = await resolver.submit(step);

    // The refund is in the record, written once: the answer must say so (a `lease_not_held` "nothing was written"
    // would have the change compensate around a step that stands), and the ledger's `pending` entry is settled.
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_11")).state.refunds).toEqual([refund]);
    expect(answer).toMatchObject({ status: "applied", intentKey: step.intentKey });
    await pendingSettled();
    expect(await resolver.submit({ ...step, intentId: randomUUID() })).toMatchObject({ status: "applied", duplicate: true });
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
  });

  it("lease-lapse-in-doubt, not written: a step left pending by a failed transaction before its PATCH, its lease lapsed, is reconciled and refused lease_not_held, never written without its lease; once its change holds the lease again it is written once", async () => {
    // The step's `pending` entry commits alone while its fresh read is held past the failed commit: its PATCH never
    // leaves in that session.
    const { h, resolver, change, payment, step, arm, pendingSettled } = await stepInDoubt("12", async () => {});
    h.records.setFaults([{ kind: "slow-read", delayMs: 8_000, times: 1, match: { type: "payment", id: "pay_12" } }]);
    arm();

    const answer = await resolver.submit(step, { timeoutMs: 60_000 });

    // Taken up again, the step is reconciled (not applied) and its lapsed lease refuses it: nothing written. Not
    // gated again, it would be written without the lease (one PATCH).
    expect(h.records.patchRequests(step.intentKey)).toEqual([]);
    expect((await readVersion(h.records, "payment", "pay_12")).state.refunds ?? []).toEqual([]);
    expect(answer).toMatchObject({ status: "rejected", reason: "lease_not_held", intentKey: step.intentKey });
    // The refusal is not kept as the key's outcome: the change, resumed, takes its lease again and the same step is
    // written, once (reconciled first: its key stayed pending), and its entry settled.
    expect(await resolver.submit(leaseIntent(resolver, change, "acquire", payment, "refund_payment", 30_000))).toMatchObject({ status: "applied", via: "lease" });
    expect(await resolver.submit({ ...step, intentId: randomUUID() }, { timeoutMs: 60_000 })).toMatchObject({ status: "applied", intentKey: step.intentKey });
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
    await pendingSettled();
  });

  it("a change whose agent crashed after its first step is resumed by calling change() again: each step is written once", async () => {
    const h = await harness();
    seedThree(h.records, "5");
    await h.startRouter();
    const input = resolveDamagedOrder("5", run());
    // The first life of the agent: it took the three leases, applied the refund, and died.
    const first = await h.client("resolver");
    const change = changeId({ agentId: "resolver", runId: input.runId, stepId: input.stepId });
    const [refund, tag, note] = input.steps;
    for (const s of [note!, refund!, tag!].sort((a, b) => `${a.entity.type}:${a.entity.id}`.localeCompare(`${b.entity.type}:${b.entity.id}`))) {
      expect(await first.submit(leaseIntent(first, change, "acquire", s.entity, s.tool.name, 30_000))).toMatchObject({ status: "applied", via: "lease" });
    }
    const payment = await readVersion(h.records, "payment", "pay_5");
    const step = { ...first.buildIntent({ tool: refundPayment, entity: refund!.entity, runId: input.runId, stepId: `${input.stepId}/refund`, baseVersion: payment.version, delta: refund!.delta as never, params: refund!.params }), lease: { change, op: "step" as const } };
    expect(await first.submit(step)).toMatchObject({ status: "applied", via: "patch" });
    await first.close();

    // Its second life resumes the change: its own leases again, the refund answered from the ledger.
    const resumed = await (await h.client("resolver")).change(input);

    expect(resumed.status).toBe("applied");
    if (resumed.status !== "applied") return;
    expect(resumed.steps.map((s) => s.duplicate)).toEqual([true, false, false]);
    expect(resumed.steps[0]!.intentKey).toBe(step.intentKey);
    for (const s of resumed.steps) expect(patches(h.records, s.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_5")).state.refunds).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-5")).state.tags).toEqual(["damaged", "refunded"]);
    expect((await readVersion(h.records, "account", "acc_5")).state.notes).toHaveLength(1);
  });
  it("resume-held-before: a change whose agent crashed after its first step, another change holding its first record when a new client (no memory) resumes it, ends incomplete, never not_started (owners: details.heldBefore); the step is written once", async () => {
    const h = await harness();
    seedThree(h.records, "13");
    await h.startRouter();
    // A change of two records: refund the payment, tag the ticket.
    const input = { ...resolveDamagedOrder("13", run()), waitForLeaseMs: 1_000 };
    input.steps = input.steps.slice(0, 2);
    const [refund, tag] = input.steps;
    const payment = refund!.entity;
    // The first life of the agent: it took both leases (entity-key order, a short time to live), applied the refund,
    // and died without releasing them.
    const first = await h.client("resolver");
    const change = changeId({ agentId: "resolver", runId: input.runId, stepId: input.stepId });
    for (const s of [refund!, tag!]) expect(await first.submit(leaseIntent(first, change, "acquire", s.entity, s.tool.name, 2_000))).toMatchObject({ status: "applied", via: "lease" });
    const before = await readVersion(h.records, "payment", "pay_13");
    const step = { ...first.buildIntent({ tool: refundPayment, entity: payment, runId: input.runId, stepId: `${input.stepId}/refund`, baseVersion: before.version, delta: refund!.delta as never, params: refund!.params }), lease: { change, op: "step" as const } };
    expect(await first.submit(step)).toMatchObject({ status: "applied", via: "patch" });
    await first.close();

    // Another agent's change takes the payment once the crashed change's lease lapsed.
    const support = await h.client("support");
    const other = changeId({ agentId: "support", runId: run(), stepId: "audit" });
    await waitFor(async () => (await support.submit(leaseIntent(support, other, "acquire", payment, "refund_payment", 60_000), { onLeased: "answer" })).status === "applied", {
      timeoutMs: 30_000,
      message: "the other change never took the payment after the crashed change's lease lapsed",
    });

    // The agent's second life, knowing nothing of the first, resumes the change: its acquire is refused leased, and
    // the owner says the change held the record before.
    const resumed = await (await h.client("resolver")).change(input);

    expect(resumed).toMatchObject({ status: "incomplete", change, applied: ["refund", "tag"], result: { status: "rejected", reason: "leased", details: { heldBefore: true } } });
    // At the records server: the refund written once, the ticket never.
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_13")).state.refunds).toHaveLength(1);
    expect(h.records.patchRequests().filter((r) => r.type === "ticket")).toEqual([]);

    // The other change done, the change is resumed to its end: the refund answered from the ledger, still written once.
    expect(await support.submit(leaseIntent(support, other, "release", payment, "refund_payment"))).toMatchObject({ status: "applied", duplicate: false });
    const finished = await (await h.client("resolver")).change(input);
    expect(finished).toMatchObject({ status: "applied" });
    expect(finished.status === "applied" && finished.steps.map((s) => [s.intentKey === step.intentKey, s.duplicate])).toEqual([
      [true, true],
      [false, false],
    ]);
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_13")).state.refunds).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", "T-13")).state.tags).toEqual(["damaged", "refunded"]);
  });

  it("resume-held-before-grant: the crashed change's mark gone from its second record (64 other changes ended there), the first record's grant says lease.heldBefore and the resume ends incomplete, not not_started; the step is written once", { timeout: 120_000 }, async () => {
    const h = await harness();
    seedThree(h.records, "14");
    await h.startRouter();
    const input = { ...resolveDamagedOrder("14", run()), waitForLeaseMs: 1_000 };
    input.steps = input.steps.slice(0, 2);
    const [refund, tag] = input.steps;
    const payment = refund!.entity;
    const ticket = tag!.entity;
    // The first life of the agent: both leases (payment before ticket, entity-key order), the refund applied, then a crash.
    const first = await h.client("resolver");
    const change = changeId({ agentId: "resolver", runId: input.runId, stepId: input.stepId });
    for (const s of [refund!, tag!]) expect(await first.submit(leaseIntent(first, change, "acquire", s.entity, s.tool.name, 2_000))).toMatchObject({ status: "applied", via: "lease" });
    const before = await readVersion(h.records, "payment", "pay_14");
    const step = { ...first.buildIntent({ tool: refundPayment, entity: payment, runId: input.runId, stepId: `${input.stepId}/refund`, baseVersion: before.version, delta: refund!.delta as never, params: refund!.params }), lease: { change, op: "step" as const } };
    expect(await first.submit(step)).toMatchObject({ status: "applied", via: "patch" });
    await first.close();

    // The leases lapse; 64 short changes of another agent end on the ticket, so its entry keeps their marks, not the
    // crashed change's (the latest 64). The payment's entry keeps it.
    const support = await h.client("support");
    for (let n = 0; n < 64; n++) {
      const other = changeId({ agentId: "support", runId: run(), stepId: `short-${n}` });
      await waitFor(async () => (await support.submit(leaseIntent(support, other, "acquire", ticket, "tag_ticket", 5_000), { onLeased: "answer" })).status === "applied", {
        timeoutMs: 30_000,
        message: `short change ${n} never took the ticket`,
      });
      expect(await support.submit(leaseIntent(support, other, "release", ticket, "tag_ticket"))).toMatchObject({ status: "applied", duplicate: false });
    }
    // Then another change of that agent holds the ticket.
    const holder = changeId({ agentId: "support", runId: run(), stepId: "audit" });
    expect(await support.submit(leaseIntent(support, holder, "acquire", ticket, "tag_ticket", 60_000), { onLeased: "answer" })).toMatchObject({ status: "applied" });

    // The agent's second life resumes the change: the payment granted (the owner says the change held it before),
    // the ticket refused leased with nothing said of this change.
    const resumed = await (await h.client("resolver")).change(input);
    expect(resumed).toMatchObject({ status: "incomplete", change, applied: ["refund", "tag"], result: { status: "rejected", reason: "leased" } });
    expect(resumed.status === "incomplete" && (resumed.result as { details?: object }).details).not.toHaveProperty("heldBefore");
    expect(patches(h.records, step.intentKey)).toEqual(["applied"]);
    expect((await readVersion(h.records, "payment", "pay_14")).state.refunds).toHaveLength(1);
    expect(h.records.patchRequests().filter((r) => r.type === "ticket")).toEqual([]);
  });

  it("a compensated change run again by a client that does not remember it (a harness resuming before it recorded the result) ends compensated: the step it failed at is not written on the record's new version", async () => {
    const h = await harness();
    seedThree(h.records, "6");
    await h.startRouter();
    const input = resolveDamagedOrder("6", run());
    // The first life of the agent: the refund applied, the ticket's tag met a conflict, the refund was undone.
    h.records.setFaults([{ kind: "412-storm", times: 1, match: { type: "ticket", id: "T-6" } }]);
    const first = await h.client("resolver");
    const compensated = await first.change(input);
    expect(compensated).toMatchObject({ status: "compensated", failed: { step: "tag", result: { status: "conflict" } } });
    if (compensated.status !== "compensated") return;
    const tagKey = compensated.failed.result.intentKey;
    const refundKey = (compensated.undone[0] as AppliedReply).undoOf!;
    await first.close();
    // Meanwhile another agent writes the ticket: the tag's conflicted key now meets a new base version.
    const support = await h.client("support");
    const ticket = await readVersion(h.records, "ticket", "T-6");
    expect(await support.submit({ tool: tagTicket, entity: { type: "ticket", id: "T-6" }, runId: run(), stepId: "vip", baseVersion: ticket.version, delta: [{ op: "replace", path: "/tags", value: [...(ticket.state.tags as string[]), "vip"] }], params: { tag: "vip" } })).toMatchObject({ status: "applied" });

    // Its second life, knowing nothing of the first, runs the change again with the same input.
    const again = await (await h.client("resolver")).change(input);

    expect(again).toMatchObject({ status: "compensated", failed: { step: "refund", result: { status: "applied", duplicate: true, intentKey: refundKey, undoneBy: undoIntentKey(refundKey) } }, undone: [] });
    // At the records server: the refund written once and undone once; the tag and the note never written.
    expect(patches(h.records, refundKey)).toEqual(["applied"]);
    expect(patches(h.records, undoIntentKey(refundKey))).toEqual(["applied"]);
    expect(patches(h.records, tagKey)).not.toContain("applied");
    expect(h.records.patchRequests().filter((r) => r.type === "account")).toEqual([]);
    expect((await readVersion(h.records, "payment", "pay_6")).state.reversals).toEqual([{ reverses: refundKey, amountCents: 2500, reason: "damaged" }]);
    expect((await readVersion(h.records, "ticket", "T-6")).state.tags).toEqual(["damaged", "vip"]);
    expect((await readVersion(h.records, "account", "acc_6")).state.notes).toEqual([]);
  });
});
