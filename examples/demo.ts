// `npm run demo`: writ end to end on a real broker and registry.
// Two owner processes, a demo records server, and simulated agents that
// (a) refund once, again, and once more around a commit-then-timeout,
// (b) race on one ticket's tags, (c) run out of conflict cycles, (d) open a
// ticket for one order three times from two agents, (e) undo writes of
// (a) to (c), and (f) run two changes that span three records under leases,
// the second compensated when its last step is refused. The records server
// runs with its own Idempotency-Key dedupe off, so any duplicate suppressed is
// writ's doing. Every figure in the last line is counted afterwards, never
// derived: refunds, PATCH requests, tags and the changes' steps at the records
// server, replies (conflicts) on the agents' reply topics, escalations on
// writ.human.
import { spawn, type ChildProcess } from "node:child_process";
import { mkdirSync, openSync, readFileSync } from "node:fs";
import { join, resolve } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { createIntentInput, createWritClient, type SubmitResult, type WritClient } from "../producers/writ-client.ts";
import { WireCodec } from "../src/codec.ts";
import { createLogger } from "../src/logger.ts";
import type { Reply } from "../src/schemas/reply.ts";
import { intentKey, undoIntentKey } from "../src/keys.ts";
import type { ChangeInput, ChangeResult } from "../producers/change.ts";
import { noteAccount, openTicket, refundPayment, tagTicket } from "./demo-tools.ts";
import { runExample, startLocalStack } from "./example-stack.ts";

const root = resolve(import.meta.dirname, "..");
const logDir = join(root, ".writ");
mkdirSync(logDir, { recursive: true });

const stack = await startLocalStack("demo");
const { brokers, registryUrl, records, say } = stack;
const read = (type: string, id: string) => stack.read<any>(type, id);
const demoStartedAt = Date.now();
const demoRun = `demo-${demoStartedAt.toString(36)}`;
const owners: ChildProcess[] = [];
/**
 * Each owner serves /metrics, /healthz and /readyz on a port of its own: WRIT_HEALTH_PORT=0, the kernel's pick
 * bound at once, read back from the owner's log (a port found free and handed over could be taken meanwhile).
 */
const metricsPorts: Promise<number>[] = [];
const clients: WritClient[] = [];
stack.onShutdown(stopAgentsAndOwners);

async function main(): Promise<Record<string, number>> {
  say(`writ demo (${demoRun})`);
  say(stack.endpointsLine);
  say("  the records server's own Idempotency-Key dedupe is off: only writ can stop a duplicate write");
  records.seed("payment", "pay_1001", { customer: "c-77", amountCents: 12_000, currency: "EUR", refunds: [] });
  records.seed("ticket", "T-42", { subject: "Charged twice", status: "open", tags: ["billing"] });
  records.seed("ticket", "T-43", { subject: "Refund stuck", status: "open", tags: [] });
  records.seed("payment", "pay_1002", { customer: "c-81", amountCents: 8_000, currency: "EUR", refunds: [] });
  records.seed("ticket", "T-44", { subject: "Parcel arrived damaged", status: "open", tags: ["billing"] });
  records.seed("account", "c-81", { name: "Ada Lovelace", notes: [] });

  for (const n of [1, 2]) owners.push(startOwner(n));
  say("  started 2 owner processes (consumer group writ.owners; one writer per partition)");
  const logger = createLogger({ level: "warn", name: "demo-agent" });
  const client = async (agentId: string) =>
    tallied(await createWritClient({ brokers, agentId, replyTopic: `writ.replies.${agentId}`, schemaRegistryUrl: registryUrl, logger, submitTimeoutMs: 90_000 }));
  const [billing, alice, bob] = await Promise.all([client("billing-agent"), client("support-alice"), client("support-bob")]);
  clients.push(billing!, alice!, bob!);

  // (a) one refund, three submissions; the first hits commit-then-timeout.
  say("");
  say("(a) refund 50.00 EUR on pay_1001, submitted three times");
  const pay = await read("payment", "pay_1001");
  const refund = {
    tool: refundPayment,
    entity: { type: "payment", id: "pay_1001" },
    runId: demoRun,
    stepId: "step-3-refund",
    baseVersion: pay.version,
    delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 5000, reason: "damaged" } }],
    params: { amountCents: 5000, reason: "damaged", note: "Customer sent photos of the broken item." },
  };
  records.setFaults([{ kind: "commit-then-delay", delayMs: 4000, times: 1, match: { type: "payment", id: "pay_1001" } }]);
  say("  records server armed: commit the next PATCH of pay_1001, then answer after 4 s (owner's timeout is 1.5 s)");
  const refundKey = billing!.buildIntent(refund).intentKey;
  // PATCH requests the records server saw for the refund's intent key while each submission was in flight.
  const patchesDuring: number[] = [];
  const submissions: SubmitResult[] = [];
  const submitRefund = async (label: string, input: typeof refund) => {
    const before = records.patchRequests(refundKey).length;
    const reply = await billing!.submit(input);
    patchesDuring.push(records.patchRequests(refundKey).length - before);
    submissions.push(reply);
    describe(label, reply);
  };
  await submitRefund("submission 1 (commit-then-timeout)", refund);
  // A harness retry and a resume from an older checkpoint: the model rewrote its note, the intent is the same.
  await submitRefund("submission 2 (harness retry)", { ...refund, params: { ...refund.params, note: "Refund for damaged item" } });
  await submitRefund("submission 3 (resume after approval)", refund);

  // (b) two agents read T-42 at the same version and both add a tag.
  say("");
  say("(b) support-alice and support-bob both read T-42 and add a tag");
  const t42 = await read("ticket", "T-42");
  say(`  both read T-42 at ${t42.version}: tags ${JSON.stringify(t42.state.tags)}`);
  const wanted = new Map<string, string>([
    ["support-alice", "vip"],
    ["support-bob", "chargeback-risk"],
  ]);
  const tagIntent = (agent: string, base: { state: any; version: string }) => ({
    tool: tagTicket,
    entity: { type: "ticket", id: "T-42" },
    runId: `${demoRun}-${agent}`,
    stepId: "step-1-tag",
    baseVersion: base.version,
    delta: [{ op: "replace" as const, path: "/tags", value: [...base.state.tags, wanted.get(agent)!] }],
    params: { tag: wanted.get(agent)! },
  });
  const race = await Promise.all(
    ([
      ["support-alice", alice!],
      ["support-bob", bob!],
    ] as const).map(async ([agent, c]) => {
      let reply = await c.submit(tagIntent(agent, t42));
      describe(`${agent}`, reply);
      while (reply.status === "conflict") {
        // The agent decides again from `current`, not blindly: same intent, fresh base.
        reply = await c.submit(tagIntent(agent, reply.current as { state: any; version: string }));
        describe(`${agent} decides again`, reply);
      }
      return reply;
    }),
  );

  // (c) another integration (an SLA bot) keeps changing T-43 under the agent: the conflict cycles run out.
  say("");
  say("(c) an SLA bot outside writ touches T-43 before each of support-bob's writes");
  let base = await read("ticket", "T-43");
  const t43Intent = (b: typeof base) => ({
    tool: tagTicket,
    entity: { type: "ticket", id: "T-43" },
    runId: `${demoRun}-support-bob`,
    stepId: "step-2-tag",
    baseVersion: b.version,
    delta: [{ op: "replace" as const, path: "/tags", value: [...b.state.tags, "refund-stuck"] }],
    params: { tag: "refund-stuck" },
  });
  for (let attempt = 1; attempt <= 3; attempt++) {
    await outsideWriterTouch("ticket", "T-43", attempt);
    const reply = await bob!.submit(t43Intent(base));
    describe(`support-bob on T-43, attempt ${attempt}`, reply);
    if (reply.status !== "conflict") break;
    base = reply.current as typeof base;
  }

  // (d) one order, one ticket: a create by external id, three times from two agents.
  say("");
  say("(d) support-alice opens a ticket for order ORD-7781, and again (a retry); support-bob opens one for the same order");
  const orderRef = "ORD-7781";
  const openFor = (agent: string, subject: string) =>
    createIntentInput(openTicket, { runId: `${demoRun}-${agent}`, stepId: "step-4-open-ticket", params: { orderRef, subject } });
  const opened = await alice!.submit(openFor("support-alice", "Parcel for ORD-7781 arrived damaged"));
  describe("support-alice", opened);
  // The retry's subject was reworded by the model (free text): the same intent, answered from the ledger.
  describe("support-alice (retry)", await alice!.submit(openFor("support-alice", "Damaged parcel, order ORD-7781")));
  describe("support-bob", await bob!.submit(openFor("support-bob", "Customer chasing order ORD-7781")));

  // (e) undo: the refund of (a), twice; the earlier of (b)'s tags, after the later one; (c)'s tag, never applied.
  say("");
  say("(e) billing-agent undoes the refund of (a), twice; undoing the first tag of (b) after the second; undoing (c)'s tag");
  describe("billing-agent undoes the refund", await billing!.undo(submissions[0]!));
  describe("billing-agent undoes it again (retry)", await billing!.undo(refundKey));
  const [raceAlice, raceBob] = race;
  const firstTag = [
    { reply: raceAlice!, agent: "support-alice", client: alice! },
    { reply: raceBob!, agent: "support-bob", client: bob! },
  ]
    .filter((t) => t.reply.status === "applied")
    .sort((x, y) => (x.reply as { version: string }).version.localeCompare((y.reply as { version: string }).version))[0];
  if (firstTag) describe(`${firstTag.agent} undoes its T-42 tag`, await firstTag.client.undo(firstTag.reply));
  describe("support-bob undoes its T-43 tag", await bob!.undo(bob!.buildIntent(t43Intent(base)).intentKey));

  // (f) one change over three records, under leases their owners hold: applied; then a second one, compensated.
  say("");
  say("(f) billing-agent resolves T-44 in one change over three records (refund pay_1002, tag T-44, note account c-81), then a second change whose note is refused");
  const change = (stepId: string, p: { amountCents: number; reason: "damaged" | "goodwill"; tag: string; text: string }): ChangeInput => ({
    runId: demoRun,
    stepId,
    steps: [
      { name: "refund", tool: refundPayment, entity: { type: "payment", id: "pay_1002" }, params: { amountCents: p.amountCents, reason: p.reason, ref: stepId }, delta: [{ op: "add", path: "/refunds/-", value: { amountCents: p.amountCents, reason: p.reason, ref: stepId } }] },
      // Built on the ticket as the change's lease read it: no other write lands on it until the change ends.
      { name: "tag", tool: tagTicket, entity: { type: "ticket", id: "T-44" }, params: { tag: p.tag }, delta: (current) => [{ op: "replace", path: "/tags", value: [...(current.state as { tags: string[] }).tags, p.tag] }] },
      { name: "note", tool: noteAccount, entity: { type: "account", id: "c-81" }, params: { ref: stepId, text: p.text }, delta: [{ op: "add", path: "/notes/-", value: { ref: stepId, text: p.text } }] },
    ],
  });
  const changes = [
    change("resolve-T-44", { amountCents: 2500, reason: "damaged", tag: "refunded", text: "Refunded 25.00 EUR: parcel arrived damaged (T-44)" }),
    change("goodwill-T-44", { amountCents: 1000, reason: "goodwill", tag: "goodwill", text: "Goodwill 10.00 EUR for the wait (T-44)" }),
  ];
  /** A step's intent key, as change() builds the step (`buildIntent`): the agent, the change's run, its step id plus the step's name. */
  const stepKey = (c: ChangeInput, name: string) => {
    const s = c.steps.find((x) => x.name === name)!;
    return intentKey({ tool: s.tool, agentId: billing!.agentId, runId: c.runId, stepId: `${c.stepId}/${s.name}`, entity: s.entity, params: s.params });
  };
  describeChange("change 1", changes[0]!, await billing!.change(changes[0]!));
  records.setFaults([{ kind: "refuse-write", match: { idempotencyKey: stepKey(changes[1]!, "note") }, problem: "account-frozen" }]);
  say("  records server armed: refuse (422) the PATCH of change 2's note step (matched by its Idempotency-Key)");
  describeChange("change 2", changes[1]!, await billing!.change(changes[1]!));

  // Counted afterwards: at the records server, on the reply topics, on writ.human.
  const payment = await read("payment", "pay_1001");
  const refundsCreated = payment.state.refunds.length;
  const patchRequests = records.patchRequests(refundKey).length;
  // A submission reached the owner when its reply is on the billing agent's reply topic; it was suppressed
  // when the records server saw no PATCH request for the intent key while it was in flight.
  const billingReplies = await readReplies("writ.replies.billing-agent", new Set([refundKey]));
  const answered = new Set(billingReplies.map((r) => r.intentId));
  const reachedOwner = submissions.filter((s) => answered.has(s.intentId)).length;
  const duplicatesSuppressed = submissions.filter((s, i) => answered.has(s.intentId) && patchesDuring[i] === 0).length;
  const tagKeys = new Set([
    alice!.buildIntent(tagIntent("support-alice", t42)).intentKey,
    bob!.buildIntent(tagIntent("support-bob", t42)).intentKey,
    bob!.buildIntent(t43Intent(base)).intentKey,
  ]);
  const tagReplies = [
    ...(await readReplies("writ.replies.support-alice", tagKeys)),
    ...(await readReplies("writ.replies.support-bob", tagKeys)),
  ];
  const conflicts = tagReplies.filter((r) => r.status === "conflict").length;
  const ticket = await read("ticket", "T-42");
  const appliedTags = race.filter((r) => r.status === "applied").length;
  const lostUpdates = [...wanted.values()].filter((tag) => !ticket.state.tags.includes(tag)).length;
  const escalations = await countEscalations();
  say("");
  say(
    `records server: pay_1001 has ${refundsCreated} refund(s); ${patchRequests} PATCH request(s) for the refund's intent key, ` +
      `during submissions ${patchesDuring.map((n, i) => `${i + 1}: ${n}`).join(", ")}`,
  );
  say(`writ.replies.billing-agent: ${reachedOwner} of ${submissions.length} submissions answered by the owner; ${duplicatesSuppressed} of them caused no PATCH request`);
  say(`records server: T-42 tags ${JSON.stringify(ticket.state.tags)} at ${ticket.version} (${appliedTags} of ${wanted.size} agents applied)`);
  say(`writ.replies.support-*: ${conflicts} conflict repl${conflicts === 1 ? "y" : "ies"} for this run's tag intents`);
  say(`writ.human: ${escalations} escalation(s) from this run`);
  const orderCreates = records.history("ticket", orderRef).filter((e) => e.kind === "create").length;
  const createRequests = records.putRequests().filter((r) => r.type === "ticket" && r.id === orderRef);
  const ticketsCreated = createRequests.filter((r) => r.outcome === "created").length;
  say(
    `records server: ticket ${orderRef} created ${orderCreates} time(s); ${createRequests.length} create request(s) for it: ` +
      `${ticketsCreated} created, ${createRequests.filter((r) => r.outcome === "precondition_failed").length} answered 412`,
  );
  const undoKey = undoIntentKey(refundKey);
  const undoPatches = records.patchRequests(undoKey).length;
  const reversals = ((payment.state.reversals ?? []) as unknown[]).length;
  say(`records server: pay_1001 has ${reversals} reversal(s); ${undoPatches} PATCH request(s) for the undo's intent key`);
  // Each change's steps: the PATCH requests for the step's intent key and for its undo's, and whether the step stands in the record.
  const [pay1002, t44, c81] = await Promise.all([read("payment", "pay_1002"), read("ticket", "T-44"), read("account", "c-81")]);
  let changesHalfDone = 0;
  changes.forEach((c, i) => {
    const outcomes = (key: string) => records.patchRequests(key).map((r) => r.outcome).join("+") || "none";
    const tag = c.steps[1]!.params.tag as string;
    const stands: Record<string, boolean> = {
      refund:
        (pay1002.state.refunds as { ref?: string }[]).some((r) => r.ref === c.stepId) &&
        !((pay1002.state.reversals ?? []) as { reverses: string }[]).some((r) => r.reverses === stepKey(c, "refund")),
      tag: (t44.state.tags as string[]).includes(tag),
      note: (c81.state.notes as { ref: string }[]).some((n) => n.ref === c.stepId),
    };
    const standing = Object.values(stands).filter(Boolean).length;
    if (standing !== 0 && standing !== c.steps.length) changesHalfDone++;
    const steps = c.steps.map((s) => {
      const key = stepKey(c, s.name);
      const undone = records.patchRequests(undoIntentKey(key)).length > 0;
      return `${s.name} ${outcomes(key)}${undone ? `, its undo ${outcomes(undoIntentKey(key))}` : ""}`;
    });
    say(`records server: change ${i + 1}'s PATCH requests: ${steps.join("; ")}; ${standing} of ${c.steps.length} steps stand in the records`);
  });
  await reportMetrics();
  return {
    refunds_created: refundsCreated,
    duplicates_suppressed: duplicatesSuppressed,
    patch_requests: patchRequests,
    conflicts,
    lost_updates: lostUpdates,
    escalations,
    tickets_created: ticketsCreated,
    undo_patch_requests: undoPatches,
    changes_half_done: changesHalfDone,
  };
}

/** Every reply an agent received in this run, by status (`duplicate` for repeats answered from the ledger). */
const received: Record<string, number> = {};
/** The intent keys of this run's submissions (all distinct from other runs': each carries the run id). */
const receivedKeys = new Set<string>();

/**
 * `client`, with every answer its `submit()` resolves with tallied in `received`: also those of
 * `undo()` and of a change's lease intents, steps and undos, which go through `submit()` too.
 */
function tallied(client: WritClient): WritClient {
  const submit: WritClient["submit"] = async (intent, opts) => {
    const r = await client.submit(intent, opts);
    const kind = "duplicate" in r && r.duplicate ? "duplicate" : r.status;
    received[kind] = (received[kind] ?? 0) + 1;
    receivedKeys.add(r.intentKey);
    return r;
  };
  // Every other member as the client's own, with `this` the proxy, so that change() and undo() submit through it.
  return new Proxy(client, { get: (target, name, receiver) => (name === "submit" ? submit : Reflect.get(target, name, receiver)) });
}

function describe(label: string, r: SubmitResult): void {
  const dup = "duplicate" in r && r.duplicate ? " (duplicate: stored reply re-sent, nothing written)" : "";
  switch (r.status) {
    case "applied":
      say(`  ${label}: applied at ${r.version} via ${r.via}${dup}`);
      break;
    case "conflict":
      say(`  ${label}: conflict, cycle ${r.cycle}: record is at ${r.current.version} with ${JSON.stringify(r.current.state)}`);
      break;
    case "escalated":
      say(`  ${label}: escalated (${r.reason}) to writ.human`);
      break;
    case "rejected":
      say(`  ${label}: rejected (${r.reason}): ${r.message}`);
      break;
    default:
      say(`  ${label}: unknown outcome: ${r.message}`);
  }
}

/** One line for a change's result; `c` gives the steps' names. */
function describeChange(label: string, c: ChangeInput, r: ChangeResult): void {
  const at = (rs: Reply[], names: string[]) => rs.map((x, i) => `${names[i]} at ${"version" in x ? x.version : "?"}`).join(", ");
  const names = c.steps.map((s) => s.name);
  switch (r.status) {
    case "applied":
      say(`  ${label}: applied, each record leased to the change until it ended: ${at(r.steps, names)}`);
      break;
    case "compensated": {
      const failed = r.failed.result;
      const why = failed.status === "rejected" || failed.status === "escalated" ? `${failed.status} (${failed.reason})` : failed.status;
      say(`  ${label}: compensated: step ${r.failed.step} ${why}; undone, newest first: ${at(r.undone, names.slice(0, names.indexOf(r.failed.step)).reverse())}`);
      break;
    }
    case "not_started":
      say(`  ${label}: not started (${r.result.status}); nothing written`);
      break;
    default:
      say(`  ${label}: incomplete: ${r.message}`);
  }
}

/** A writer outside writ (another integration): read, then PUT with If-Match, as a well-behaved client does. */
async function outsideWriterTouch(type: string, id: string, n: number): Promise<void> {
  const current = await read(type, id);
  const res = await fetch(`${records.url}/records/${type}/${id}`, {
    method: "PUT",
    headers: { "content-type": "application/json", "if-match": current.version },
    body: JSON.stringify({ ...current.state, slaCheckedBy: "sla-bot", slaChecks: n }),
  });
  if (!res.ok) throw new Error(`outside writer: PUT ${type}/${id} answered ${res.status}`);
}

/**
 * Scrapes both owners' /metrics (Prometheus text) and checks them against the replies on the agents' reply
 * topics for this run's intent keys: every result an owner commits carries exactly one reply, so the two agree
 * exactly. The agents' own tally (`received`) can be lower by redeliveries: a record delivered again after the
 * rebalance (the offset commit lags results) is answered again from the ledger, and the agent has its answer.
 * The owners are fresh processes, so their counters hold what they settled in this run: this run's intents, and
 * the last intents of an earlier run whose consumed offset was not committed before its owners stopped, read
 * again and answered from the ledger on the same reply topics since this run began (counted apart).
 * A difference fails the demo.
 */
async function reportMetrics(): Promise<void> {
  // The scrape and the topics are read one after the other: an answer committed between the two (a late
  // redelivery) shows on one only. Both only grow, so they are read again until they agree or 15 s pass.
  const deadline = Date.now() + 15_000;
  let tally = await metricsAndReplies();
  while (!tally.agree && Date.now() < deadline) {
    await new Promise((resolve) => setTimeout(resolve, 250));
    tally = await metricsAndReplies();
  }
  const { scraped, onTopics, again, earlierRuns, agree } = tally;
  const line = (c: Record<string, number>) => Object.keys(scraped).map((k) => `${c[k] ?? 0} ${k}`).join(", ");
  say(`replies the agents received: ${line(received)}`);
  const notes = [
    ...(again > 0 ? [`${again} for submissions redelivered after the rebalance and answered again`] : []),
    ...(earlierRuns > 0 ? [`${earlierRuns} for an earlier run's last intents, read again past its last committed offset`] : []),
  ];
  say(`replies on the agents' reply topics: ${line(onTopics)}${notes.length > 0 ? ` (${notes.join("; ")})` : ""}`);
  say(`owners' /metrics (writ_intents_total by outcome): ${line(scraped)}: ${agree ? "the same as on the reply topics" : "DIFFERENT from the reply topics"}`);
  if (!agree) throw new Error("the owners' metrics do not match the replies on the reply topics");
}

async function metricsAndReplies() {
  const samples: { name: string; labels: string; value: number }[] = [];
  for (const port of await Promise.all(metricsPorts)) {
    const res = await fetch(`http://127.0.0.1:${port}/metrics`);
    if (!res.ok) throw new Error(`owner /metrics on port ${port} answered ${res.status}`);
    for (const line of (await res.text()).split("\n")) {
      const m = /^([a-zA-Z_:][a-zA-Z0-9_:]*)(?:\{(.*)\})? (\S+)$/.exec(line);
      if (m) samples.push({ name: m[1]!, labels: m[2] ?? "", value: Number(m[3]) });
    }
  }
  const total = (name: string, label = "") => samples.filter((x) => x.name === name && x.labels.includes(label)).reduce((n, x) => n + x.value, 0);
  const scraped: Record<string, number> = {
    applied: total("writ_intents_total", 'outcome="applied"'),
    duplicate: total("writ_intents_total", 'outcome="repeat"') + total("writ_intents_total", 'outcome="redelivered"'),
    conflict: total("writ_intents_total", 'outcome="conflict"'),
    escalated: total("writ_intents_total", 'outcome="escalated"'),
    rejected: total("writ_intents_total", 'outcome="rejected"'),
  };
  const onTopics: Record<string, number> = {};
  // Replies for a submission answered before (a redelivery), and for an earlier run's intents read again.
  let again = 0;
  let earlierRuns = 0;
  const answered = new Set<string>();
  for (const agent of ["billing-agent", "support-alice", "support-bob"]) {
    for (const r of (await readTopic(`writ.replies.${agent}`, "Reply")) as Reply[]) {
      const first = !answered.has(r.intentId);
      answered.add(r.intentId);
      if (!receivedKeys.has(r.intentKey)) {
        if (Date.parse(r.at) < demoStartedAt) continue;
        earlierRuns++;
      } else if (!first) again++;
      const kind = r.duplicate ? "duplicate" : r.status;
      onTopics[kind] = (onTopics[kind] ?? 0) + 1;
    }
  }
  const agree = Object.keys(scraped).every((k) => scraped[k] === (onTopics[k] ?? 0));
  return { scraped, onTopics, again, earlierRuns, agree };
}


function startOwner(n: number): ChildProcess {
  const logFile = join(logDir, `demo-owner-${n}.log`);
  const out = openSync(logFile, "w");
  const owner = spawn(process.execPath, [join(root, "consumers", "owner-main.ts")], {
    env: {
      ...process.env,
      KAFKA_BROKERS: brokers.join(","),
      ...(registryUrl ? { SCHEMA_REGISTRY_URL: registryUrl } : {}),
      RECORDS_URL: records.url,
      WRIT_TOOLS_MODULE: join(root, "examples", "demo-tools.ts"),
      WRIT_SOR_TIMEOUT_MS: "1500",
      WRIT_INSTANCE_ID: `demo-owner-${n}`,
      WRIT_HEALTH_HOST: "127.0.0.1",
      WRIT_HEALTH_PORT: "0",
      // info at least: its "health endpoints serving" line names the port it got (the log is its file, not the demo's output)
      LOG_LEVEL: /^(trace|debug)$/i.test(process.env.LOG_LEVEL ?? "") ? process.env.LOG_LEVEL! : "info",
    },
    stdio: ["ignore", out, out],
  });
  const port = healthPort(owner, logFile);
  port.catch(() => undefined); // awaited by the metrics check; a failure is said there
  metricsPorts.push(port);
  return owner;
}

/** The port of an owner's health endpoints, from its log line "health endpoints serving"; rejects if it exits first, or after 120 s. */
async function healthPort(owner: ChildProcess, logFile: string): Promise<number> {
  const deadline = Date.now() + 120_000;
  for (;;) {
    const line = readFileSync(logFile, "utf8").split("\n").find((l) => l.includes('"msg":"health endpoints serving"'));
    const port = line === undefined ? undefined : /"address":"127\.0\.0\.1:(\d+)"/.exec(line)?.[1];
    if (port !== undefined) return Number(port);
    if (owner.exitCode !== null || owner.signalCode !== null) throw new Error(`owner exited (${owner.exitCode ?? owner.signalCode}) before its health endpoints served; see ${logFile}`);
    if (Date.now() > deadline) throw new Error(`owner's health endpoints did not serve within 120 s; see ${logFile}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}

async function countEscalations(): Promise<number> {
  const escalations = (await readTopic("writ.human", "Escalation")) as { intent?: { agent?: { runId?: string } } }[];
  return escalations.filter((e) => e.intent?.agent?.runId?.startsWith(demoRun)).length;
}

/** The replies on `topic` (committed ones, as an agent reads them) for the given intent keys. */
async function readReplies(topic: string, intentKeys: Set<string>): Promise<Reply[]> {
  return ((await readTopic(topic, "Reply")) as Reply[]).filter((r) => intentKeys.has(r.intentKey));
}

/**
 * Every committed value on `topic`, from its start to its end as of the call
 * (read_committed, so aborted writes are not counted), decoded as `name`.
 */
let reads = 0;
async function readTopic(topic: string, name: "Reply" | "Escalation"): Promise<unknown[]> {
  const kafka = new Kafka({ clientId: "writ-demo-reader", brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  await admin.connect();
  const end = await admin.fetchTopicOffsets(topic).finally(() => admin.disconnect());
  // Partitions not yet read to their end offset (transaction markers included).
  const behind = new Map(end.filter((p) => Number(p.high) > Number(p.low)).map((p) => [p.partition, Number(p.high)]));
  if (behind.size === 0) return [];
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl });
  const consumer = kafka.consumer({ groupId: `writ.demo-reader.${demoRun}.${topic}.${++reads}`, readUncommitted: false, maxWaitTimeInMs: 500 });
  const values: unknown[] = [];
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const done = new Promise<void>((resolveDone) => {
    consumer.on(consumer.events.END_BATCH_PROCESS, ({ payload }) => {
      const high = behind.get(payload.partition);
      if (high !== undefined && Number(payload.lastOffset) + 1 >= high) behind.delete(payload.partition);
      if (behind.size === 0) resolveDone();
    });
  });
  await consumer.run({
    eachMessage: async ({ message }) => {
      const d = await codec.decode(name, message.value);
      if (d.ok) values.push(d.value);
    },
  });
  await Promise.race([done, new Promise((r) => setTimeout(r, 30_000))]);
  await consumer.disconnect();
  return values;
}

/** At shutdown, before the records server closes: the agents' clients, then the owner processes (SIGKILL after 15 s). */
async function stopAgentsAndOwners(): Promise<void> {
  await Promise.all(clients.map((c) => c.close()));
  await Promise.all(
    owners.map(
      (o) =>
        new Promise<void>((r) => {
          if (o.exitCode !== null) return r();
          o.once("exit", () => r());
          o.kill("SIGTERM");
          setTimeout(() => o.kill("SIGKILL"), 15_000).unref();
        }),
    ),
  );
}

await runExample(stack, main);
