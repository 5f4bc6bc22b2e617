// What a verify scenario makes of what it saw, and what an outage seen during it can then excuse: run against the
// demo records server (real HTTP, ETags, If-Match, 412) behind the real fault proxy, with a scripted owner in place of
// writ's (no Kafka), so that each way a tool can fail is played exactly. A failure no outage explains (harm at the
// system of record, the tool's or its fixture's own) must stay a failure beside any outage sign; a race whose stale
// PATCH said nothing about If-Match must not pass.
import { randomUUID } from "node:crypto";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { describe, expect, it, onTestFinished } from "vitest";
import * as demoFixture from "../../../examples/verify-fixture.ts";
import { refundPayment, tagTicket } from "../../../examples/demo-tools.ts";
import type { SubmitResult } from "../../../producers/client-api.ts";
import { WritError } from "../../../src/errors.ts";
import type { Versioned } from "../../../src/schemas/common.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import type { SystemOfRecord } from "../../../src/sor/adapter.ts";
import { startDemoRecordsServer } from "../../../src/testing/demo-records-server.ts";
import { startFaultProxy } from "../../../src/verify/fault-proxy.ts";
import type { ToolVerifyFixture } from "../../../src/verify/fixture.ts";
import { instrumentSystem } from "../../../src/verify/instrumented-system.ts";
import { attributeFailure, OutageWatch, type OutageSign } from "../../../src/verify/outages.ts";
import { commitThenFault, race, type ScenarioAgent, type ScenarioContext } from "../../../src/verify/scenarios.ts";
import { failedToRun, interruptedIn, ToolInterrupted, verifyTool, type ToolRun } from "../../../src/verify/verify.ts";

const KAFKA: OutageSign = { what: "Kafka", source: "kafka", seenBy: "the owner", message: "Connection error: connect ECONNREFUSED 127.0.0.1:9092" };
const SYSTEM: OutageSign = { what: "the system of record helpdesk", source: "system", seenBy: "the fault proxy", message: "PATCH /records/ticket/T-verify: socket hang up" };

/** The signs of a scenario during which `signs` were seen. */
function seen(...signs: OutageSign[]) {
  const watch = new OutageWatch();
  const from = watch.mark();
  for (const s of signs) watch.note(s);
  return watch.since(from);
}

type Owner = (intent: WriteIntent, ctx: ScenarioContext) => Promise<SubmitResult>;

/** Agents whose intents `owner` answers, one at a time, as the single writer of the record does. */
function agentsOf(owner: Owner, ctx: () => ScenarioContext): ScenarioContext["agents"] {
  let queue: Promise<unknown> = Promise.resolve();
  const build = (input: { runId: string; tool: unknown }) =>
    ({ ...input, tool: (input.tool as { name: string }).name, intentId: randomUUID(), intentKey: `ik-${input.runId}` }) as unknown as WriteIntent;
  const submit = (x: object) => {
    const intent = "intentKey" in x ? (x as WriteIntent) : build(x as never);
    const answer = queue.then(() => owner(intent, ctx()));
    queue = answer.catch(() => undefined);
    return answer;
  };
  const agent = { buildIntent: build, submit, submitAll: (xs: object[]) => Promise.all(xs.map(submit)) } as unknown as ScenarioAgent;
  return { agent, agentA: agent, agentB: agent };
}

const at = () => new Date().toISOString();
const applied = (i: WriteIntent, version: string, via: "patch" | "reconcile", duplicate = false): SubmitResult =>
  ({ status: "applied", intentId: i.intentId, intentKey: i.intentKey, duplicate, at: at(), entity: i.entity, state: null, version, via }) as SubmitResult;
const rejected = (i: WriteIntent): SubmitResult => ({ status: "rejected", intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: at(), reason: "sor_rejected", message: "422 refused" });
const escalated = (i: WriteIntent): SubmitResult =>
  ({ status: "escalated", intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: at(), entity: i.entity, reason: "outcome_unknown", message: "a person will check", escalationId: "e-1" }) as SubmitResult;
const conflict = (i: WriteIntent, current: Versioned): SubmitResult =>
  ({ status: "conflict", intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: at(), entity: i.entity, cycle: 1, message: "moved", current, your_change: i.delta }) as SubmitResult;

const READ = { timeoutMs: 2000 };
const mark = (i: WriteIntent) => String((i.params as { tag?: string; ref?: string }).tag ?? (i.params as { ref?: string }).ref);

/**
 * A careful owner: a strict tool's intent on a moved record is a conflict; its PATCH carries If-Match and the intent
 * key; an outcome it did not get is reconciled by reading the record (the change there: applied), else a conflict on
 * the moved record. Each intent key is written once; a repeat gets the stored answer.
 */
function carefulOwner(): Owner {
  const done = new Map<string, SubmitResult>();
  return async (intent, ctx) => {
    const stored = done.get(intent.intentKey);
    if (stored) return { ...stored, intentId: intent.intentId, duplicate: true } as SubmitResult;
    const current = (await ctx.owned.read(ctx.entity, READ))!;
    if (current.version !== intent.baseVersion) return conflict(intent, current);
    const out = await ctx.owned.patch(ctx.entity, intent.delta, { ifMatch: current.version, idempotencyKey: intent.intentKey, timeoutMs: 300 });
    let reply: SubmitResult;
    if (out.kind === "applied") reply = applied(intent, out.version, "patch");
    else if (out.kind === "unknown") {
      const now = (await ctx.owned.read(ctx.entity, READ))!;
      if ((await ctx.fixture.effects({ entity: ctx.entity, current: now, mark: mark(intent), system: ctx.direct })) > 0) reply = applied(intent, now.version, "reconcile");
      else return conflict(intent, now);
    } else if (out.kind === "precondition_failed") return conflict(intent, out.current ?? (await ctx.owned.read(ctx.entity, READ))!);
    else return rejected(intent);
    done.set(intent.intentKey, reply);
    return reply;
  };
}

/**
 * The demo records server with a ticket and a payment, its helpdesk and billing systems reached directly (the truth)
 * and through the fault proxy (`via`: a server of the test's own in front of the records server, if given), and
 * the context of a scenario of `tool` whose intents `owner` answers.
 */
async function staging(owner: Owner, opts: { tool?: "tag_ticket" | "refund_payment"; fixture?: Partial<ToolVerifyFixture>; via?: (records: string) => Promise<string> } = {}) {
  const server = await startDemoRecordsServer({ port: 0 });
  onTestFinished(() => server.close());
  server.seed("ticket", "T-verify", { subject: "writ verify", status: "open", tags: [] });
  server.seed("payment", "pay_verify", { customer: "c-verify", amountCents: 100_000_000, currency: "EUR", refunds: [] });
  const proxy = await startFaultProxy({ upstream: opts.via ? await opts.via(server.url) : server.url });
  onTestFinished(() => proxy.close());
  const refund = opts.tool === "refund_payment";
  const system = refund ? "billing" : "helpdesk";
  const pick = (url: string) => demoFixture.systems({ RECORDS_URL: url }).find((s) => s.name === system)!;
  const direct: SystemOfRecord = pick(server.url);
  const owned = instrumentSystem(pick(proxy.url));
  const fixture = { ...(refund ? demoFixture.verify.refund_payment : demoFixture.verify.tag_ticket), ...opts.fixture } as ToolVerifyFixture;
  const ctx: ScenarioContext = {
    runId: "wv-0a1b2c-test",
    tool: refund ? refundPayment : tagTicket,
    fixture,
    entity: refund ? { type: "payment", id: "pay_verify" } : { type: "ticket", id: "T-verify" },
    direct,
    owned,
    proxy,
    writeMethod: "PATCH",
    agents: agentsOf(owner, () => ctx),
    submitTimeoutMs: 5000,
    sorTimeoutMs: 2000,
    moduleTimeoutMs: 10_000,
  };
  return { server, proxy, ctx };
}

describe("commit-then-timeout: what an outage seen during it can excuse", () => {
  it("a change answered rejected that the system of record shows made is harm, and stays a failure beside an outage of that system", async () => {
    // An owner whose adapter gets no answer to the PATCH (the fault proxy holds it; it committed) and says "rejected".
    const { ctx } = await staging(async (intent, c) => {
      const current = (await c.owned.read(c.entity, READ))!;
      if (current.version === intent.baseVersion) await c.owned.patch(c.entity, intent.delta, { ifMatch: current.version, idempotencyKey: intent.intentKey, timeoutMs: 300 });
      return rejected(intent);
    });
    const report = await commitThenFault(ctx, "commit-then-timeout");
    expect(report).toMatchObject({ effects: 1, harm: true, outageCanExplain: "none", status: "fail" });
    expect(report.problems).toContainEqual(expect.stringMatching(/^agent's change is in the system of record \(1 effect\(s\)\), yet writ answered rejected/));
    // Before, not harm: the system's outage (or Kafka's) turned it incomplete.
    expect(attributeFailure(report, seen(SYSTEM, KAFKA))).toMatchObject({ status: "fail", notes: [expect.stringContaining("does not explain what the system of record shows")] });
  });

  it("a provisional rejection (an answer to a record the owner could not authenticate, held to the deadline) is no lie about the change made", async () => {
    const { ctx } = await staging(async (intent, c) => {
      const current = (await c.owned.read(c.entity, READ))!;
      if (current.version === intent.baseVersion) await c.owned.patch(c.entity, intent.delta, { ifMatch: current.version, idempotencyKey: intent.intentKey, timeoutMs: 300 });
      return { ...rejected(intent), reason: "unauthenticated", message: "bad signature (answered before the owner had authenticated the record …)" } as SubmitResult;
    });
    const report = await commitThenFault(ctx, "commit-then-timeout");
    expect(report).toMatchObject({ effects: 1, harm: false, outageCanExplain: "system", status: "fail" });
  });

  it("a fault that never fired because the adapter's write carries its own Idempotency-Key is the tool's failure, whatever outage came with it", async () => {
    const careful = carefulOwner();
    // An adapter that sends a key of its own, not the intent key: the proxy cannot match the write, which commits.
    const { ctx, server } = await staging((intent, c) => careful({ ...intent, intentKey: `${intent.intentKey}-own` }, c).then((r) => ({ ...r, intentKey: intent.intentKey })));
    const report = await commitThenFault(ctx, "commit-then-timeout");
    expect(report).toMatchObject({ effects: 1, harm: false, outageCanExplain: "none", status: "fail" });
    expect(report.problems).toEqual([expect.stringMatching(/^the fault never fired: .*yet the change is in the record: the write that made it did not carry the intent key as Idempotency-Key on a PATCH$/)]);
    // Counted at the records server: one write, under the adapter's own key.
    expect(server.patchRequests().map((r) => r.idempotencyKey)).toEqual([`ik-${ctx.runId}-ctt-own`]);
    // Before: incomplete beside any sign, a broker's connection error or the system's.
    for (const sign of [KAFKA, SYSTEM]) expect(attributeFailure(report, seen(sign)).status).toBe("fail");
  });

  it("an escalation, nothing written: only the system of record's outage explains it, not Kafka's", async () => {
    const { ctx } = await staging(async (intent) => escalated(intent));
    const report = await commitThenFault(ctx, "commit-then-timeout");
    expect(report).toMatchObject({ effects: 0, harm: false, outageCanExplain: "system", status: "fail" });
    // Before, Kafka's connection error made it incomplete: an owner does not escalate for Kafka.
    expect(attributeFailure(report, seen(KAFKA))).toMatchObject({
      status: "fail",
      notes: [expect.stringContaining("does not explain a rejection or an escalation, which only the system of record failing leads to")],
    });
    const during = attributeFailure(report, seen(KAFKA, SYSTEM));
    expect(during).toMatchObject({ status: "incomplete", outage: expect.stringMatching(/^the system of record helpdesk \(seen by the fault proxy: PATCH/) });
    expect(during.outage).not.toContain("Kafka");
  });

  it("replies that never came, nothing written: any outage explains them", async () => {
    const { ctx } = await staging(async (intent) => ({ status: "unknown", intentId: intent.intentId, intentKey: intent.intentKey, message: "no reply before the deadline" }));
    const report = await commitThenFault(ctx, "commit-then-timeout");
    expect(report).toMatchObject({ effects: 0, harm: false, outageCanExplain: "any", status: "fail" });
    expect(attributeFailure(report, seen(KAFKA)).status).toBe("incomplete");
    expect(attributeFailure(report, seen()).status).toBe("fail");
  });
});

describe("the race: If-Match not exercised, and the outside writer that could not write", () => {
  it("a stale PATCH answered 502 by the fault proxy (its system unreachable) is not a pass: incomplete, If-Match not exercised", async () => {
    // The first PATCH's connection to the system dropped (a system going away mid-request): the proxy answers 502.
    let dropped = false;
    const dropFirstPatch = async (records: string): Promise<string> => {
      const upstream = new URL(records);
      const api = createServer((req, res) => {
        if (req.method === "PATCH" && !dropped) return void ((dropped = true), req.socket.destroy());
        const out = request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (from) => {
          res.writeHead(from.statusCode ?? 502, from.headers);
          from.pipe(res);
        });
        req.pipe(out);
      });
      await new Promise<void>((resolve) => api.listen(0, "127.0.0.1", resolve));
      onTestFinished(() => new Promise<void>((resolve) => api.close(() => resolve())));
      return `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
    };
    const { ctx, proxy } = await staging(carefulOwner(), { via: dropFirstPatch });
    const report = await race(ctx);
    expect(dropped).toBe(true);
    // The stale PATCH (If-Match of the version before the outside write) never reached the system.
    const stale = proxy.requests().find((r) => r.method === "PATCH" && r.idempotencyKey === `ik-${ctx.runId}-race-a`);
    expect(stale?.upstreamStatus).toBeNull();
    expect(report.problems).toEqual([]);
    // Before: pass (ok), with a note: a system that ignores If-Match passes the same way.
    expect(report).toMatchObject({ ok: false, status: "incomplete", notExercised: expect.stringMatching(/^If-Match was not exercised: the owner's stale PATCH ended unknown, not 412$/) });
  });

  it("a stale PATCH the system applied (2xx) is found on the wire by its If-Match quoted, though the owner carried the version raw: a failure, not incomplete", async () => {
    // A system whose ETags are unquoted (`v3`): the adapter carries the version raw and sends If-Match `"v3"`.
    let viaUrl = "";
    const unquoted = async (records: string): Promise<string> => {
      const upstream = new URL(records);
      const api = createServer((req, res) => {
        const out = request({ host: upstream.hostname, port: upstream.port, path: req.url, method: req.method, headers: req.headers }, (from) => {
          const etag = from.headers.etag;
          res.writeHead(from.statusCode ?? 502, { ...from.headers, ...(typeof etag === "string" ? { etag: etag.replaceAll('"', "") } : {}) });
          from.pipe(res);
        });
        req.pipe(out);
      });
      await new Promise<void>((resolve) => api.listen(0, "127.0.0.1", resolve));
      onTestFinished(() => new Promise<void>((resolve) => api.close(() => resolve())));
      viaUrl = `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
      return viaUrl;
    };
    // Refunds append, which commutes: the final record loses nothing, only If-Match tells.
    const { ctx, proxy, server } = await staging(carefulOwner(), { tool: "refund_payment", via: unquoted });
    // The outside writer's adapter as the owner's (raw versions), past the fault proxy.
    ctx.direct = demoFixture.systems({ RECORDS_URL: viaUrl }).find((s) => s.name === "billing")!;
    // It ignores If-Match, and the stale PATCH's answer is lost on the way back: the adapter ends unknown.
    server.setConfig({ enforceIfMatch: false, honourIdempotencyKey: false });
    proxy.arm({ kind: "commit-then-drop", match: { idempotencyKey: `ik-${ctx.runId}-race-a` } });
    const report = await race(ctx);
    const stale = proxy.requests().find((r) => r.method === "PATCH" && r.idempotencyKey === `ik-${ctx.runId}-race-a`);
    expect(stale).toMatchObject({ ifMatch: expect.stringMatching(/^"v\d+"$/), upstreamStatus: 200, fault: "commit-then-drop" });
    // Before: the wire lookup compared `v1` with `"v1"`, missed, and the adapter's unknown made it incomplete.
    expect(report).toMatchObject({ status: "fail", problems: [expect.stringMatching(/^the system answered 200 to the owner's PATCH with If-Match v\d+, sent after/)] });
    expect(attributeFailure(report, seen(KAFKA, SYSTEM)).status).toBe("fail");
  });

  it("an outside writer whose fixture throws is the fixture's failure, which no outage explains", async () => {
    const { ctx } = await staging(carefulOwner(), {
      fixture: {
        outsideChange: () => {
          throw new Error("outsideChange: no such field");
        },
      },
    });
    const report = await race(ctx);
    expect(report).toMatchObject({ outageCanExplain: "none", status: "fail", problems: [expect.stringMatching(/^the outside writer could not write \(outsideChange: no such field\)/)] });
    // Before, incomplete beside any sign.
    expect(attributeFailure(report, seen(KAFKA, SYSTEM)).status).toBe("fail");
  });
});

describe("a scenario that could not run", () => {
  it("for its fixture (an effects() that gives no count) stays a failure beside any outage", () => {
    const report = failedToRun("duplicate-submission", new Error("the fixture's effects() gave true for wv-0a1b2c-dup: it must count"), Date.now());
    expect(report.outageCanExplain).toBe("none");
    expect(attributeFailure(report, seen(KAFKA, SYSTEM)).status).toBe("fail");
  });

  it("because its adapter could not reach the system of record is that system's outage's, where one was seen", () => {
    const down = new WritError("sor_unavailable", "helpdesk.read: connect ECONNREFUSED", { retriable: true });
    const report = failedToRun("race", new Error("could not read", { cause: down }), Date.now());
    expect(report.outageCanExplain).toBe("system");
    expect(attributeFailure(report, seen(KAFKA)).status).toBe("fail");
    expect(attributeFailure(report, seen(SYSTEM)).status).toBe("incomplete");
  });
});

describe("a tool's scenarios, when an outage or a stop comes after one proved harm", () => {
  /** An owner that writes every submission afresh (no dedupe by intent key): refunds appended twice and more. */
  const duplicating: Owner = async (intent, c) => {
    const current = (await c.owned.read(c.entity, READ))!;
    const out = await c.owned.patch(c.entity, intent.delta, { ifMatch: current.version, idempotencyKey: `${intent.intentKey}-${randomUUID()}`, timeoutMs: 2000 });
    return out.kind === "applied" ? applied(intent, out.version, "patch") : rejected(intent);
  };

  async function toolRun(outage: ToolRun["outage"], signal?: AbortSignal) {
    const { ctx, server } = await staging(duplicating, { tool: "refund_payment" });
    const stopped = new Promise<never>((_, reject) => signal?.addEventListener("abort", () => reject(signal.reason), { once: true }));
    stopped.catch(() => undefined);
    const run: ToolRun = {
      runId: "wv-0a1b2c",
      routed: {
        direct: new Map([["billing", ctx.direct]]),
        owned: new Map([["billing", ctx.owned]]),
        proxies: new Map(),
        proxyOf: new Map([["billing", ctx.proxy!]]),
        writeMethod: new Map([["billing", "PATCH"]]),
        all: [],
      },
      env: {},
      sorTimeoutMs: 2000,
      submitTimeoutMs: 5000,
      moduleTimeoutMs: 10_000,
      scenarios: ["duplicate-submission", "race"],
      progress: () => undefined,
      signal,
      until: (work) => (signal ? Promise.race([work, stopped]) : work),
      outage,
      outages: new OutageWatch(),
      agents: ctx.agents,
    };
    const { prepare: _prepare, ...fixture } = demoFixture.verify.refund_payment;
    const thrown = await verifyTool(refundPayment, fixture, run).then(
      () => null,
      (err: unknown) => err,
    );
    expect(thrown).toBeInstanceOf(ToolInterrupted);
    // Counted at the records server: the one refund appended three times.
    const refunds = (server.history("payment", "pay_verify").at(-1)!.state as { refunds: { ref?: string }[] }).refunds;
    expect(refunds.filter((r) => r.ref === "wv-0a1b2c-refundpa-dup")).toHaveLength(3);
    return thrown as ToolInterrupted;
  }

  it("Kafka found lost after it: the failure is reported (harm), and only the scenarios after it are not run", async () => {
    const err = await toolRun(async () => new WritError("kafka_failed", "Kafka was lost during the run", { retriable: true }));
    // Before, the scenario was dropped with its harm, and named not run: with no failure before it, no report at all.
    expect(err.report).toMatchObject({ status: "fail", notRun: ["race"], scenarios: [{ scenario: "duplicate-submission", status: "fail", harm: true }] });
    expect(err.message).toMatch(/^writ verify could not run \(refund_payment race\): Kafka was lost during the run/);
    expect(interruptedIn(err, [])).toMatchObject({ notRun: ["refund_payment race"], stopped: false });
  });

  it("stopped while verify asks whether Kafka is still there: the failure it proved is reported, not dropped as not run", async () => {
    const stop = new AbortController();
    // The probe waits (Kafka slow to answer) and the signal comes meanwhile.
    const err = await toolRun(() => {
      stop.abort(new Error("stopped by SIGINT"));
      return new Promise<never>(() => undefined);
    }, stop.signal);
    expect(err.outage).toBeNull();
    expect(err.report).toMatchObject({ status: "fail", notRun: ["race"], scenarios: [{ scenario: "duplicate-submission", status: "fail", harm: true }] });
    expect(interruptedIn(err, ["tag_ticket"])).toEqual({ reason: "stopped by SIGINT", notRun: ["refund_payment race", "tag_ticket"], stopped: true });
  });
});

describe("the run's interrupted.notRun", () => {
  it("names a tool of which no scenario ran by its name, as the tools after it (summary.notRun counts it so)", () => {
    const empty = { tool: "refund_payment", system: "billing", entity: "-", ok: false, status: "incomplete" as const, effects: 0, conflicts: 0, lostUpdates: [], scenarios: [], problems: [] };
    const err = new ToolInterrupted({ stopped: new Error("stopped by SIGTERM") }, empty, ["duplicate-submission", "race"]);
    // Before: "refund_payment duplicate-submission", "refund_payment race", then "tag_ticket".
    expect(interruptedIn(err, ["tag_ticket"])).toEqual({ reason: "stopped by SIGTERM", notRun: ["refund_payment", "tag_ticket"], stopped: true });
  });
});
