import { randomUUID } from "node:crypto";
import { withDeadline } from "../deadline.ts";
import { PROVISIONAL_REASONS, type IntentInput, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { entityKey, type EntityRef, type JsonPatchOp, type Versioned } from "../schemas/common.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import type { WriteToolDeclaration } from "../tools.ts";
import type { FaultProxy, ProxyFaultKind } from "./fault-proxy.ts";
import type { ToolVerifyFixture } from "./fixture.ts";
import type { HookedPatch, InstrumentedSystem } from "./instrumented-system.ts";
import type { DuplicateEffect, LostUpdate, OutageExplains, ScenarioName, ScenarioReport } from "./report.ts";

/** What a scenario does with an agent's client: build intents and submit them. */
export type ScenarioAgent = Pick<WritClient, "buildIntent" | "submit" | "submitAll">;

/** What a scenario gets: one tool, its fixture, the system both directly and as the owner sees it, and the agents. */
export interface ScenarioContext {
  runId: string;
  tool: WriteToolDeclaration<any>;
  fixture: ToolVerifyFixture<any>;
  entity: EntityRef;
  /** The system of record itself: the truth, and the outside writer's way in. */
  direct: SystemOfRecord;
  /** What the owner calls: through the proxy (HTTP) and the adapter hooks. */
  owned: InstrumentedSystem;
  proxy: FaultProxy | null;
  /** The HTTP method of the system's writes on the wire (PATCH, or POST where the API takes that). */
  writeMethod: string;
  agents: { agent: ScenarioAgent; agentA: ScenarioAgent; agentB: ScenarioAgent };
  /** Deadline of each submit. ms. */
  submitTimeoutMs: number;
  /** Deadline of verify's own reads and writes. ms. */
  sorTimeoutMs: number;
  /** Hard deadline of each call into the user's module (adapter, fixture), whether or not it honours its timeoutMs. ms. */
  moduleTimeoutMs: number;
}

/**
 * A call into the user's tools module (an adapter's read or patch, a fixture's
 * prepare or effects): its result, or an error naming it once `ms` pass. An
 * adapter that ignores its timeoutMs and never answers fails the step instead
 * of holding verify forever; a synchronous throw is a rejection like any.
 */
export function moduleCall<T>(what: string, ms: number, call: () => T | Promise<T>): Promise<T> {
  return withDeadline(Promise.resolve().then(call), ms, () => {
    throw new Error(`${what} did not answer within ${ms} ms`);
  });
}

/** A change some writer made in a scenario, and how it was reported. */
interface Change {
  writer: string;
  mark: string;
  change: JsonPatchOp[];
  /** How it was reported applied; null when it was not. */
  reportedApplied: string | null;
}

const DUPLICATE_SUBMISSIONS = 3;
const OUTSIDE_WRITER_ATTEMPTS = 5;
/** Bound on an agent's decide-again loop; the tool's conflict cycles end it first. */
const MAX_DECISIONS = 12;

function describeReply(r: SubmitResult): string {
  switch (r.status) {
    case "applied":
      return r.duplicate ? "applied (duplicate)" : `applied via ${r.via}`;
    case "conflict":
      return `conflict (cycle ${r.cycle})`;
    case "rejected":
      return `rejected (${r.reason}: ${r.message})`;
    case "escalated":
      return `escalated (${r.reason})`;
    default:
      return "unknown (no reply before the deadline)";
  }
}

function readSystem(ctx: ScenarioContext): Promise<Versioned | null> {
  return moduleCall(`${ctx.direct.name}.read(${entityKey(ctx.entity)})`, ctx.moduleTimeoutMs, () => ctx.direct.read(ctx.entity, { timeoutMs: ctx.sorTimeoutMs }));
}

async function readDirect(ctx: ScenarioContext): Promise<Versioned> {
  const current = await readSystem(ctx);
  if (current === null) throw new Error(`${entityKey(ctx.entity)} does not exist on ${ctx.direct.name}`);
  return current;
}

function intentInput(ctx: ScenarioContext, mark: string, current: Versioned): IntentInput {
  const { params, delta } = ctx.fixture.change(current, mark);
  // The mark is in run id and step id, so each scenario's (and agent's) intent key is its own under either key scope.
  return { tool: ctx.tool, entity: ctx.entity, runId: mark, stepId: `writ-verify-${mark}`, baseVersion: current.version, delta, params };
}

/** Counts every change in the final record: applied ones must be there once; any found twice is a duplicate. */
async function settle(ctx: ScenarioContext, changes: Change[]) {
  const final = await readSystem(ctx);
  const lostUpdates: LostUpdate[] = [];
  const duplicates: DuplicateEffect[] = [];
  const byMark = new Map<string, number>();
  let effects = 0;
  for (const c of changes) {
    const n: unknown = await moduleCall(`the fixture's effects()`, ctx.moduleTimeoutMs, () =>
      ctx.fixture.effects({ entity: ctx.entity, current: final, mark: c.mark, system: ctx.direct }),
    );
    // A yes/no (`includes`) counts a change found twice as one: a duplicate would pass unseen.
    if (typeof n !== "number" || !Number.isSafeInteger(n) || n < 0) {
      throw new Error(`the fixture's effects() gave ${JSON.stringify(n) ?? String(n)} for ${c.mark}: it must count the mark's occurrences (0, 1, 2, ...), so a duplicate shows as 2`);
    }
    effects += n;
    byMark.set(c.mark, n);
    if (n > 1) duplicates.push({ writer: c.writer, mark: c.mark, effects: n });
    if (n === 0 && c.reportedApplied !== null) {
      lostUpdates.push({
        tool: ctx.tool.name,
        entity: entityKey(ctx.entity),
        writer: c.writer,
        mark: c.mark,
        change: c.change,
        reportedApplied: c.reportedApplied,
        message: `${c.writer}'s change ${c.mark} to ${entityKey(ctx.entity)} (${JSON.stringify(c.change)}) was reported applied (${c.reportedApplied}) and is not in the final record${final ? ` at ${final.version}` : ""}: it was overwritten`,
      });
    }
  }
  const expectedEffects = changes.filter((c) => c.reportedApplied !== null).length;
  const problems = [
    ...lostUpdates.map((l) => `lost update: ${l.message}`),
    ...duplicates.map((d) => `duplicate: ${d.writer}'s change ${d.mark} is in the record ${d.effects} times`),
  ];
  return { final, effects, byMark, expectedEffects, lostUpdates, duplicates, problems };
}

function report(
  scenario: ScenarioName,
  started: number,
  problems: Problems,
  fields: Omit<ScenarioReport, "scenario" | "ok" | "status" | "outage" | "durationMs" | "problems" | "harm" | "outageCanExplain">,
): ScenarioReport {
  const status = problems.list.length > 0 ? "fail" : fields.notExercised !== undefined ? "incomplete" : "pass";
  return {
    scenario,
    ok: status === "pass",
    status,
    ...fields,
    problems: problems.list,
    harm: problems.harm,
    outageCanExplain: problems.outageCanExplain(),
    durationMs: Date.now() - started,
  };
}

const EXPLAINS_LESS: Record<OutageExplains, number> = { none: 0, system: 1, any: 2 };

/**
 * The problems of a scenario, each with the outage that can explain it, so that one seen during the scenario
 * makes it `incomplete` only where it explains every problem: harm proven at the system of record or on the wire
 * (a lost update, a duplicate effect or write, a stale write let through, an outcome the adapter made up, a
 * rejection of a change the system shows made) none does; nor the tool's, its adapter's or its fixture's failures;
 * a reply or an effect that did not come, any outage (of Kafka or the registry carrying it, of the system of record
 * taking it); a rejection or an escalation, only the system of record failing (an owner never refuses for Kafka).
 */
class Problems {
  readonly list: string[] = [];
  harm = false;
  private explains: OutageExplains = "any";

  private add(explains: OutageExplains, problems: string[]): void {
    if (problems.length === 0) return;
    this.list.push(...problems);
    if (EXPLAINS_LESS[explains] < EXPLAINS_LESS[this.explains]) this.explains = explains;
  }

  /** Harm proven at the system of record or on the wire. */
  proven(...problems: string[]): void {
    if (problems.length > 0) this.harm = true;
    this.add("none", problems);
  }

  /** What the tool, its adapter or its fixture got wrong, which no outage makes happen. */
  wrong(...problems: string[]): void {
    this.add("none", problems);
  }

  /** A reply or an effect that should have come did not. */
  missing(...problems: string[]): void {
    this.add("any", problems);
  }

  /** What only the system of record failing can explain (it did not answer the outside writer). */
  systemFailed(...problems: string[]): void {
    this.add("system", problems);
  }

  /** A problem about `replies` that are not what they should be: what can explain it follows from what they were. */
  replied(replies: readonly SubmitResult[], problem: string): void {
    const explains = replies.map(replyExplainedBy).reduce((a, b) => (EXPLAINS_LESS[b] < EXPLAINS_LESS[a] ? b : a), "any");
    this.add(explains, [problem]);
  }

  /** Which outage can explain every problem; `none` where there is none. */
  outageCanExplain(): OutageExplains {
    return this.list.length === 0 ? "none" : this.explains;
  }
}

/**
 * Which outage can explain a reply that is not the one wanted: no reply (unknown, or blocked behind an open
 * transaction), any; a rejection or an escalation, only the system of record's (an owner that cannot reach it
 * reconciles and tries again, and may end escalated); a conflict or an `applied`, none.
 */
function replyExplainedBy(r: SubmitResult): OutageExplains {
  if (r.status === "unknown" || r.status === "blocked") return "any";
  return r.status === "rejected" || r.status === "escalated" ? "system" : "none";
}

/**
 * A rejection of a change the system of record shows made: a lie no outage excuses, since an owner rejects only
 * where no write of the intent can have gone out. Not a provisional one (an answer to a record the owner could not
 * authenticate, which need not be this intent), nor an escalation: writ escalates where the write may have been made,
 * and says so to the person who checks it.
 */
function rejectedYetMade(writer: string, replies: readonly SubmitResult[], effects: number): string[] {
  const rejected = replies.filter((r) => r.status === "rejected" && !PROVISIONAL_REASONS.has(r.reason));
  if (effects === 0 || rejected.length === 0) return [];
  return [`${writer}'s change is in the system of record (${effects} effect(s)), yet writ answered ${rejected.map(describeReply).join(", ")}: a change reported not made that was made`];
}

/**
 * duplicate-submission: one intent sent as a racing double send, then once
 * more after the reply (a harness retry, a resume). Exactly one effect; every
 * reply `applied`, all but one marked duplicate.
 */
export async function duplicateSubmission(ctx: ScenarioContext): Promise<ScenarioReport> {
  const started = Date.now();
  const mark = `${ctx.runId}-dup`;
  const input = intentInput(ctx, mark, await readDirect(ctx));
  const first = ctx.agents.agent.buildIntent(input);
  const replies = await ctx.agents.agent.submitAll([first, { ...first, intentId: randomUUID() }], { timeoutMs: ctx.submitTimeoutMs });
  for (let i = replies.length; i < DUPLICATE_SUBMISSIONS; i++) replies.push(await ctx.agents.agent.submit(input, { timeoutMs: ctx.submitTimeoutMs }));
  const applied = replies.filter((r) => r.status === "applied");
  const settled = await settle(ctx, [
    { writer: "agent", mark, change: input.delta, reportedApplied: applied.length > 0 ? `writ replied applied ${applied.length} times` : null },
  ]);
  const problems = new Problems();
  problems.proven(...settled.problems);
  problems.proven(...rejectedYetMade("agent", replies, settled.effects));
  const notApplied = replies.filter((r) => r.status !== "applied");
  if (notApplied.length > 0) problems.replied(notApplied, `every submission should be answered applied; got ${replies.map(describeReply).join(", ")}`);
  const effectsProblem = `${replies.length} submissions of one intent left ${settled.effects} effects at the system of record; want exactly 1`;
  if (settled.effects > 1) problems.proven(effectsProblem);
  else if (settled.effects !== 1) problems.missing(effectsProblem);
  if (applied.filter((r) => !r.duplicate).length > 1) problems.proven("more than one reply was a fresh (non-duplicate) write");
  problems.proven(...writtenOnce(ctx, first.intentKey, "agent"));
  return report("duplicate-submission", started, problems, {
    effects: settled.effects,
    expectedEffects: 1,
    conflicts: replies.filter((r) => r.status === "conflict").length,
    lostUpdates: settled.lostUpdates,
    duplicates: settled.duplicates,
    patchesSent: patchesSent(ctx, first.intentKey),
    replies: replies.map(describeReply),
    faultInjection: null,
    notes: [],
  });
}

/**
 * Writes of one intent that committed at the system, counted where they were
 * answered: on the wire (the proxy), each 2xx write request with the intent
 * key, but for a replay of a stored answer (one carrying an ETag an earlier
 * 2xx of the key carried); at the adapter otherwise (distinct versions it
 * reported applied). Without ETags nothing tells a replay from a second
 * write, so each 2xx counts: two writes never collapse into one. The record
 * alone cannot show a second write of an idempotent change (a replace of
 * /tags with the same list); the system, its hooks and audit did.
 */
function writesCommitted(ctx: ScenarioContext, intentKey: string): { writes: number; how: string } {
  if (!ctx.proxy) {
    const writes = ctx.owned.appliedVersions(intentKey).length;
    return { writes, how: `the adapter reported applied at ${writes} different versions` };
  }
  const etags = new Set<string>();
  let writes = 0;
  for (const r of ctx.proxy.requests()) {
    if (r.method !== ctx.writeMethod || r.idempotencyKey !== intentKey || r.upstreamStatus === null || r.upstreamStatus < 200 || r.upstreamStatus >= 300) continue;
    if (r.etag !== null && etags.has(r.etag)) continue;
    if (r.etag !== null) etags.add(r.etag);
    writes++;
  }
  return { writes, how: `the system answered 2xx to ${writes} ${ctx.writeMethod} requests, none a replay of an earlier answer` };
}

/** A problem when one intent committed more than once at the system, else none. */
function writtenOnce(ctx: ScenarioContext, intentKey: string, writer: string): string[] {
  const { writes, how } = writesCommitted(ctx, intentKey);
  return writes > 1 ? [`${writer}'s intent ${intentKey} was written ${writes} times (${how}): a duplicate write, though the record shows it once`] : [];
}

function patchesSent(ctx: ScenarioContext, intentKey: string): number {
  return ctx.proxy ? ctx.proxy.countByIdempotencyKey(intentKey, ctx.writeMethod) : ctx.owned.patchCount(intentKey);
}

/**
 * commit-then-timeout / commit-then-drop: the write commits at the system of
 * record and the owner gets no answer. The owner must settle it by
 * reconciling, never by a blind replay: exactly one effect, the reply
 * `applied`, and a resubmission answered from the ledger.
 */
export async function commitThenFault(ctx: ScenarioContext, kind: ProxyFaultKind): Promise<ScenarioReport> {
  const started = Date.now();
  const mark = `${ctx.runId}-${kind === "commit-then-timeout" ? "ctt" : "ctd"}`;
  const input = intentInput(ctx, mark, await readDirect(ctx));
  const intent = ctx.agents.agent.buildIntent(input);
  if (ctx.proxy) ctx.proxy.arm({ kind, match: { method: ctx.writeMethod, idempotencyKey: intent.intentKey } });
  else ctx.owned.simulate(kind, intent.intentKey);
  const replies: SubmitResult[] = [];
  let fired = false;
  try {
    replies.push(await ctx.agents.agent.submit(intent, { timeoutMs: ctx.submitTimeoutMs }));
    fired = ctx.proxy
      ? ctx.proxy.requests().some((r) => r.idempotencyKey === intent.intentKey && r.fault === kind)
      : ctx.owned.simulatedFired(intent.intentKey);
    // The agent's retry after an unknown outcome: safe, the ledger answers it.
    replies.push(await ctx.agents.agent.submit(input, { timeoutMs: ctx.submitTimeoutMs }));
  } finally {
    ctx.proxy?.disarm();
  }
  const first = replies[0]!;
  const settled = await settle(ctx, [
    { writer: "agent", mark, change: input.delta, reportedApplied: first.status === "applied" ? `writ replied applied at ${first.version} via ${first.via}` : null },
  ]);
  const problems = new Problems();
  problems.proven(...settled.problems);
  problems.proven(...rejectedYetMade("agent", replies, settled.effects));
  if (!fired) {
    const never = `the fault never fired: no ${ctx.writeMethod} for this intent committed (first reply: ${describeReply(first)}), so nothing was tested`;
    // The change is there, so its write committed where the fault could not take it (at the proxy: a write without
    // the intent key as Idempotency-Key, or not on the system's write method; at the adapter: one its patch did not
    // answer applied). Else it never committed, for the reason the reply gives.
    const unmatched = ctx.proxy ? `did not carry the intent key as Idempotency-Key on a ${ctx.writeMethod}` : "was not answered applied by the adapter";
    if (settled.effects > 0) problems.wrong(`${never}, yet the change is in the record: the write that made it ${unmatched}`);
    else problems.replied([first], never);
  }
  if (first.status !== "applied") problems.replied([first], `the owner should settle the unknown outcome as applied; it answered ${describeReply(first)}`);
  else if (fired && first.via !== "reconcile") problems.proven(notReconciled(ctx, kind, intent.intentKey, first.via));
  const effectsProblem = `${settled.effects} effects at the system of record after ${kind}; want exactly 1`;
  if (settled.effects > 1) problems.proven(effectsProblem);
  // A write the fault fired on committed: its effect missing is not an outage's.
  else if (settled.effects !== 1) (fired ? problems.wrong(`${effectsProblem}, though the write committed`) : problems.missing(effectsProblem));
  problems.proven(...writtenOnce(ctx, intent.intentKey, "agent"));
  const retry = replies[1];
  if (retry && !(retry.status === "applied" && retry.duplicate)) problems.replied([retry], `the resubmission should be a duplicate answered from the ledger; got ${describeReply(retry)}`);
  return report(kind, started, problems, {
    effects: settled.effects,
    expectedEffects: 1,
    conflicts: replies.filter((r) => r.status === "conflict").length,
    lostUpdates: settled.lostUpdates,
    duplicates: settled.duplicates,
    patchesSent: patchesSent(ctx, intent.intentKey),
    replies: replies.map(describeReply),
    faultInjection: ctx.proxy ? "proxy" : "adapter",
    notes: [],
  });
}

/**
 * The answer to the faulted PATCH never reached the owner, yet it was told
 * `applied` by a write, not by reconcile: the adapter either guessed the
 * outcome (and would say applied where the write had not committed) or sent
 * the PATCH again (a blind replay only the system's dedupe made harmless).
 */
function notReconciled(ctx: ScenarioContext, kind: ProxyFaultKind, intentKey: string, via: string): string {
  const said = `after ${kind} the owner should settle the outcome by reconcile; it was answered applied via ${via}`;
  if (!ctx.proxy) return said;
  const sent = patchesSent(ctx, intentKey);
  return sent > 1
    ? `${said}: the adapter sent the PATCH again (${sent} on the wire), a replay that only the system's Idempotency-Key dedupe kept from applying twice`
    : `${said}: the adapter reported applied for a PATCH whose answer it never got, which it would also say where the write had not committed`;
}

interface OutsideWrite {
  change: JsonPatchOp[];
  /** The version its applied write was conditional on (If-Match). */
  base: string | null;
  appliedAt: string | null;
  conflicts: number;
  failure: string | null;
  /** The system did not answer it (`unavailable`, `unknown`): an outage of it may explain the race not run. */
  unanswered?: boolean;
}

/** Another integration's write, straight to the system of record: PATCH with If-Match; on 412 read again and redo, as a careful client does. */
async function outsideWrite(ctx: ScenarioContext, read: Versioned, mark: string): Promise<OutsideWrite> {
  let current = read;
  let conflicts = 0;
  let change: JsonPatchOp[] = [];
  for (let attempt = 1; attempt <= OUTSIDE_WRITER_ATTEMPTS; attempt++) {
    change = ctx.fixture.outsideChange?.(current, mark) ?? ctx.fixture.change(current, mark).delta;
    const base = current.version;
    const outcome = await moduleCall(`${ctx.direct.name}.patch(${entityKey(ctx.entity)})`, ctx.moduleTimeoutMs, () =>
      ctx.direct.patch(ctx.entity, change, { ifMatch: base, idempotencyKey: `${mark}-${attempt}`, timeoutMs: ctx.sorTimeoutMs }),
    );
    if (outcome.kind === "applied") return { change, base, appliedAt: outcome.version, conflicts, failure: null };
    if (outcome.kind !== "precondition_failed") {
      const unanswered = outcome.kind === "unavailable" || outcome.kind === "unknown";
      return { change, base: null, appliedAt: null, conflicts, failure: `${outcome.kind}${"message" in outcome ? `: ${outcome.message}` : ""}`, unanswered };
    }
    conflicts++;
    current = outcome.current ?? (await readDirect(ctx));
  }
  return { change, base: null, appliedAt: null, conflicts, failure: `412 on each of ${OUTSIDE_WRITER_ATTEMPTS} attempts` };
}

/**
 * What the race shows of the system's If-Match, whatever the fixture's change:
 * the owner's PATCH that left right after the outside writer's committed
 * write was conditional on the version before it, so it must come back 412.
 * An append commutes and loses nothing when it is let through, so the final
 * record alone would pass a system that ignores If-Match (or whose version
 * never changes); its next read-modify-write tool would lose updates.
 * Judged at the wire (the proxy) where there is one, else at the adapter.
 * Where the stale PATCH said nothing either way (it ended unknown or
 * unavailable, a 502 from the proxy, threw, or left no answer), If-Match was
 * not exercised: the race is `incomplete`, never a pass on the final record
 * alone, which a system that ignores If-Match passes too.
 */
function ifMatchVerdict(ctx: ScenarioContext, o: OutsideWrite, hooked: HookedPatch | null): { problems: string[]; notExercised?: string } {
  if (o.appliedAt === null || o.base === null) return { problems: [] };
  if (o.appliedAt === o.base) {
    const problem =
      `the system's version did not change on a write: the outside writer's PATCH with If-Match ${o.base} was answered 2xx at ${o.appliedAt}, ` +
      "so If-Match cannot tell a record changed in between from one that was not (a lost update waits for the first read-modify-write)";
    return { problems: [problem] };
  }
  if (hooked === null || hooked.ifMatch !== o.base) {
    return { problems: [], notExercised: "If-Match was not exercised: the owner's PATCH after the outside writer's write was not sent with the version before it" };
  }
  const stale = `the owner's PATCH with If-Match ${hooked.ifMatch}, sent after the outside writer's write had moved the record to ${o.appliedAt}`;
  const status = staleOnWire(ctx, hooked);
  if (status !== null && status >= 200 && status < 300) {
    return { problems: [`the system answered ${status} to ${stale}: it does not enforce If-Match (RFC 9110 §13.1.1 wants 412), so a read-modify-write overwrites changes made in between`] };
  }
  if (hooked.outcome === "applied") {
    const problem = `the adapter reported applied for ${stale}${status === null ? "" : ` (the system answered ${status}: did the adapter write it again on its own?)`}; a stale write must come back precondition_failed`;
    return { problems: [problem] };
  }
  if (status === 412 || hooked.outcome === "precondition_failed") return { problems: [] };
  return { problems: [], notExercised: `If-Match was not exercised: the owner's stale PATCH ended ${hooked.outcome}${status === null ? "" : ` (the system answered ${status})`}, not 412` };
}

/**
 * The system's status for the stale PATCH itself, or null when it did not reach the system (or there is no proxy).
 * By its If-Match too: after an attempt known not sent (`unavailable`), the owner reads afresh and sends the same
 * Idempotency-Key with the new version, and that retry's 200 is not an answer to the stale one.
 */
function staleOnWire(ctx: ScenarioContext, hooked: HookedPatch): number | null {
  const version = entityTagOpaque(hooked.ifMatch);
  const wire = ctx.proxy
    ?.requests()
    .find((r) => r.method === ctx.writeMethod && r.idempotencyKey === hooked.idempotencyKey && r.ifMatch !== null && entityTagOpaque(r.ifMatch) === version);
  return wire?.upstreamStatus ?? null;
}

/**
 * A version as an If-Match value compares: without a weak prefix and its quotes. The owner carries a raw version
 * (`v3`, from a body) where the HTTP adapter sends it quoted (`"v3"`).
 */
function entityTagOpaque(value: string): string {
  const tag = value.trim().replace(/^W\//, "");
  return tag.length >= 2 && tag.startsWith('"') && tag.endsWith('"') ? tag.slice(1, -1) : tag;
}

/**
 * race: two agents with conflicting goals read the record at the same
 * version and write it; a writer outside writ read it too and writes it in
 * the window between the owner's read and its PATCH (the adapter hook puts
 * it there, so the interleaving is fixed). Agents decide again on a conflict.
 * Every change reported applied, by writ or by the outside writer's 2xx, must
 * be in the final record.
 */
export async function race(ctx: ScenarioContext): Promise<ScenarioReport> {
  const started = Date.now();
  const read = await readDirect(ctx);
  const outsideMark = `${ctx.runId}-race-o`;
  let outside: OutsideWrite | null = null;
  ctx.owned.beforeNextPatch(ctx.entity, async () => {
    outside = await outsideWrite(ctx, read, outsideMark).catch((err: unknown) => ({
      change: [],
      base: null,
      appliedAt: null,
      conflicts: 0,
      failure: err instanceof Error ? err.message : String(err),
    }));
  });
  const agents = [
    { writer: "agent-a", client: ctx.agents.agentA, mark: `${ctx.runId}-race-a` },
    { writer: "agent-b", client: ctx.agents.agentB, mark: `${ctx.runId}-race-b` },
  ];
  const results = await Promise.all(
    agents.map(async ({ writer, client, mark }) => {
      const replies: SubmitResult[] = [];
      let input = intentInput(ctx, mark, read);
      for (let n = 0; n < MAX_DECISIONS; n++) {
        const reply = await client.submit(input, { timeoutMs: ctx.submitTimeoutMs });
        replies.push(reply);
        if (reply.status !== "conflict") break;
        // The agent decides again from the record the conflict carries, never from its stale read.
        input = intentInput(ctx, mark, reply.current);
      }
      return { writer, mark, input, replies };
    }),
  );
  const notes: string[] = [];
  const hookFired = ctx.owned.hookFired(ctx.entity);
  if (!hookFired) {
    ctx.owned.disarm(ctx.entity);
    notes.push("the owner sent no PATCH, so the outside writer wrote after writ, from its stale read");
    outside = await outsideWrite(ctx, read, outsideMark);
  }
  const o = outside as OutsideWrite | null;
  const changes: Change[] = results.map(({ writer, mark, input, replies }) => {
    const last = replies.at(-1)!;
    return { writer, mark, change: input.delta, reportedApplied: last.status === "applied" ? `writ replied applied at ${last.version}` : null };
  });
  if (o) changes.push({ writer: "outside-writer", mark: outsideMark, change: o.change, reportedApplied: o.appliedAt === null ? null : `the system answered 2xx at ${o.appliedAt}` });
  const settled = await settle(ctx, changes);
  const problems = new Problems();
  problems.proven(...settled.problems);
  let notExercised: string | undefined = hookFired ? undefined : "If-Match was not exercised: the owner sent no PATCH";
  if (hookFired && o !== null) {
    const verdict = ifMatchVerdict(ctx, o, ctx.owned.hookedPatch(ctx.entity));
    problems.proven(...verdict.problems);
    notExercised = verdict.notExercised;
  }
  if (o === null || o.appliedAt === null) {
    const problem = `the outside writer could not write (${o?.failure ?? "did not run"}), so the race was not exercised`;
    // Only the system not answering it is an outage's; a refusal, 412s without end, or its fixture or adapter failing is not.
    if (o?.unanswered) problems.systemFailed(problem);
    else problems.wrong(problem);
  }
  for (const r of results) {
    const last = r.replies.at(-1)!;
    problems.proven(...rejectedYetMade(r.writer, [last], settled.byMark.get(r.mark) ?? 0));
    if (last.status === "rejected" || last.status === "unknown" || last.status === "blocked") problems.replied([last], `${r.writer}: ${describeReply(last)}`);
    if (last.status === "escalated") notes.push(`${r.writer} was escalated to a human (${last.reason}); its change is not required in the record`);
  }
  if (!results.some((r) => r.replies.at(-1)!.status === "applied")) notes.push("no agent's change was applied (maxConflictCycles below 2?): only the outside writer's change was checked");
  for (const r of results) for (const key of new Set(r.replies.map((x) => x.intentKey))) problems.proven(...writtenOnce(ctx, key, r.writer));
  const agentConflicts = results.reduce((n, r) => n + r.replies.filter((x) => x.status === "conflict").length, 0);
  return report("race", started, problems, {
    effects: settled.effects,
    expectedEffects: settled.expectedEffects,
    conflicts: agentConflicts + (o?.conflicts ?? 0),
    lostUpdates: settled.lostUpdates,
    duplicates: settled.duplicates,
    patchesSent: [...new Set(results.flatMap((r) => r.replies.map((x) => x.intentKey)))].reduce((n, key) => n + patchesSent(ctx, key), 0),
    replies: results.flatMap((r) => r.replies.map((x) => `${r.writer}: ${describeReply(x)}`)).concat(
      o ? [`outside-writer: ${o.appliedAt ? `2xx at ${o.appliedAt}` : `failed (${o.failure})`}${o.conflicts ? ` after ${o.conflicts}×412` : ""}`] : [],
    ),
    faultInjection: null,
    notes,
    ...(notExercised === undefined ? {} : { notExercised }),
  });
}
