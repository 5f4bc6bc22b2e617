// The fault suite's case for changes that span records (docs/architecture.md
// §10): agents run three-record changes under leases (tag the ticket, refund
// the payment, note the account) while owner processes are SIGKILLed in the
// middle of them and other agents race single-record writes onto the same
// records. A third of the changes meet a step the system refuses (the
// records server answers 422 to that step's Idempotency-Key), so their
// applied steps must be undone.
//
// Checked at the records server, never from writ's replies:
// - every change ends fully applied, or fully compensated (its refund
//   reversed, its tag and note gone), and its result says which;
// - every racing write answered `applied` is in the record, once; every
//   record's version chain is unbroken (no lost update);
// - no Idempotency-Key was committed twice (no duplicate step or undo).
//
// The ablation control (`--ablate leases`: owners grant every lease and honour
// none) lets racing writes land between a change's steps: an undo then finds
// its record changed and conflicts, and the change ends partly applied.
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { noteAccount, refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { ChangeInput, ChangeResult } from "../../producers/change.ts";
import { createWritClient, type SubmitOptions, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import type { WriteIntent } from "../../src/schemas/write-intent.ts";
import { createLogger } from "../../src/logger.ts";
import { entityKey } from "../../src/schemas/common.ts";
import type { Ablation } from "./options.ts";
import { OwnerFleet } from "./owner-fleet.ts";
import { faultOwnerEnv, faultTopics } from "./owner-env.ts";
import { RecordsProcess } from "./records-process.ts";
import { seededRng } from "./rng.ts";
import { versionChains } from "./check-outcome.ts";

export interface LeaseCaseOptions {
  root: string;
  brokers: string[];
  registryUrl: string | undefined;
  replicationFactor: number;
  seed: number;
  ablate: Ablation | null;
  say: (line: string) => void;
}

export interface LeaseCaseResult {
  line: {
    case: "changes-under-leases";
    changes: number;
    applied: number;
    compensated: number;
    partial: number;
    misreported: number;
    duplicates: number;
    lost_updates: number;
    racing_applied: number;
    racing_lost: number;
    kills_mid_change: number;
    crashes_after_patch: number;
    owner_crashes: number;
    resumes: number;
  };
  problems: string[];
  failed: boolean;
}

const TRIPLES = 4;
const CHANGERS = 3;
const CHANGES_PER_AGENT = 6;
const RACERS = 2;

interface PlannedChange {
  n: number;
  agent: number;
  triple: number;
  refuse: boolean;
  input: ChangeInput;
  result?: ChangeResult;
  /** Intent keys of its refund step (its reversal names it) and of its note step (the one refused). */
  refundKey?: string;
  noteKey?: string;
}

interface RacingWrite {
  kind: "refund" | "tag" | "note";
  entity: { type: string; id: string };
  ref: string;
  result?: SubmitResult;
}

export async function runLeaseCase(opts: LeaseCaseOptions): Promise<LeaseCaseResult> {
  const { say } = opts;
  const rng = seededRng(opts.seed ^ 0x5eed);
  const id = `l${opts.seed.toString(36)}${Date.now().toString(36).slice(-4)}`;
  const logDir = join(opts.root, ".writ", `faults-${id}`);
  rmSync(logDir, { recursive: true, force: true });
  mkdirSync(logDir, { recursive: true });
  const records = new RecordsProcess({ root: opts.root, dbPath: join(logDir, "records.db"), logFile: join(logDir, "records.log") });
  // Only writ may stop a duplicate: the suite's records server runs with its own Idempotency-Key dedupe off.
  await records.start();
  const triple = (t: number) => ({
    payment: { type: "payment", id: `pay_${t}` },
    ticket: { type: "ticket", id: `T-${t}` },
    account: { type: "account", id: `acc_${t}` },
  });
  const entities = Array.from({ length: TRIPLES }, (_, t) => Object.values(triple(t))).flat();
  for (let t = 0; t < TRIPLES; t++) {
    const r = triple(t);
    await records.seed(r.payment.type, r.payment.id, { amountCents: 1_000_000, refunds: [] });
    await records.seed(r.ticket.type, r.ticket.id, { status: "open", tags: [] });
    await records.seed(r.account.type, r.account.id, { name: `customer ${t}`, notes: [] });
  }
  const topics = faultTopics(id);
  const fleet = new OwnerFleet({
    script: join(opts.root, "test", "faults", "fault-owner.ts"),
    logDir,
    rng: rng.fork(),
    env: faultOwnerEnv({ brokers: opts.brokers, registryUrl: opts.registryUrl, recordsUrl: records.url, id, topics, replicationFactor: opts.replicationFactor, ablate: opts.ablate, crashAfterPatch: "0.03" }),
  });
  say(`changes under leases ${id}${opts.ablate ? ` (ablate ${opts.ablate})` : ""}: ${CHANGERS} agents × ${CHANGES_PER_AGENT} three-record changes on ${TRIPLES} record triples, ${RACERS} racing agents, owners killed mid-change; logs in ${logDir}`);
  fleet.start(2);

  const logger = createLogger({ level: "fatal", name: "lease-agent" });
  const client = (agent: string) =>
    createWritClient({
      brokers: opts.brokers,
      agentId: agent,
      replyTopic: `writ.replies.${agent}.${id}`,
      intentsTopic: topics.intents,
      schemaRegistryUrl: opts.registryUrl,
      replicationFactor: opts.replicationFactor,
      submitTimeoutMs: 15_000,
      logger,
    });
  const changers = await Promise.all(Array.from({ length: CHANGERS }, (_, a) => client(`changer-${a}`)));
  const racers = await Promise.all(Array.from({ length: RACERS }, (_, a) => client(`racer-${a}`)));

  // The plan: which triple each change touches, and which changes meet a refused step.
  const plans: PlannedChange[] = [];
  const planRng = rng.fork();
  for (let a = 0; a < CHANGERS; a++) {
    for (let j = 0; j < CHANGES_PER_AGENT; j++) {
      const n = plans.length;
      const t = planRng.int(0, TRIPLES - 1);
      const r = triple(t);
      const ref = `chg-${n}`;
      const input: ChangeInput = {
        runId: `${id}-c${n}`,
        stepId: "resolve-damaged-order",
        leaseTtlMs: 60_000,
        waitForLeaseMs: 180_000,
        settleWithinMs: 120_000,
        steps: [
          { name: "tag", tool: tagTicket, entity: r.ticket, params: { tag: ref }, delta: (cur) => [{ op: "replace", path: "/tags", value: [...((cur.state as { tags?: string[] }).tags ?? []), ref] }] },
          { name: "refund", tool: refundPayment, entity: r.payment, params: { amountCents: 100 + n, reason: "damaged", ref }, delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 100 + n, reason: "damaged", ref } }] },
          { name: "note", tool: noteAccount, entity: r.account, params: { ref, text: `refund ${ref} for a damaged order` }, delta: [{ op: "add", path: "/notes/-", value: { ref, text: `refund ${ref} for a damaged order` } }] },
        ],
      };
      plans.push({ n, agent: a, triple: t, refuse: n % 3 === 2, input });
    }
  }
  // A step's key does not depend on its base version or delta: the keys are known before the change runs.
  const stepKey = (c: PlannedChange, name: string) => {
    const s = c.input.steps.find((x) => x.name === name)!;
    return changers[c.agent]!.buildIntent({ tool: s.tool, entity: s.entity, runId: c.input.runId, stepId: `${c.input.stepId}/${s.name}`, baseVersion: "x", delta: [{ op: "add", path: "/x", value: 0 }], params: s.params }).intentKey;
  };
  for (const c of plans) {
    c.refundKey = stepKey(c, "refund");
    c.noteKey = stepKey(c, "note");
  }
  // A frozen account refuses the note every time it is asked (an owner killed after a refusal, before its commit,
  // asks again): a refusal that held only once would let the step through, and the change end applied.
  await records.setFaults(plans.filter((c) => c.refuse).map((c) => ({ kind: "refuse-write" as const, times: 100, match: { idempotencyKey: c.noteKey! }, problem: "account-frozen" })));

  let running = 0;
  let killsMidChange = 0;
  let resumes = 0;
  let done = false;
  const problems: string[] = [];

  // Owners are SIGKILLed in the middle of changes: as the 2nd, 11th, 20th and 29th step submission of the case goes out
  // (every change has three steps, so each is a change's second step: its leases held, its first step applied). The
  // owners' own crash point adds kills between a step's PATCH and its commit (WRIT_FAULT_CRASH_AFTER_PATCH 0.03).
  const KILL_AT = new Set([2, 11, 20, 29]);
  let stepSubmissions = 0;
  const killing = (client: WritClient): WritClient =>
    new Proxy(client, {
      get: (target, name, receiver) =>
        name === "submit"
          ? (intent: WriteIntent, o?: SubmitOptions) => {
              if (intent.lease?.op === "step" && !intent.undo && KILL_AT.has(++stepSubmissions)) {
                const killed = fleet.killOne();
                if (killed) {
                  killsMidChange++;
                  say(`  SIGKILL ${killed} as step submission ${stepSubmissions} goes out (${running} change(s) in progress; a replacement joins)`);
                }
              }
              return target.submit(intent, o);
            }
          : Reflect.get(target, name, receiver),
    });

  // Racing single-record writes onto the same records, until the changes are done.
  const racing: RacingWrite[] = [];
  const races = racers.map(async (racer, a) => {
    const raceRng = rng.fork();
    for (let i = 0; !done; i++) {
      const r = triple(raceRng.int(0, TRIPLES - 1));
      const pick = raceRng.next();
      const ref = `r${a}-${i}`;
      const w: RacingWrite = pick < 0.6 ? { kind: "tag", entity: r.ticket, ref } : pick < 0.8 ? { kind: "refund", entity: r.payment, ref } : { kind: "note", entity: r.account, ref };
      racing.push(w);
      w.result = await raceOnce(racer, records.url, w, `${id}-r${a}`).catch((err: unknown) => ({ status: "unknown" as const, intentId: "", intentKey: "", message: String(err) }));
    }
  });

  await Promise.all(
    changers.map(async (changer, a) => {
      for (const c of plans.filter((p) => p.agent === a)) {
        running++;
        try {
          c.result = await killing(changer).change(c.input);
          // An incomplete change is resumed, as its agent would after a crash: the same input again.
          for (let again = 0; again < 3 && c.result.status === "incomplete"; again++) {
            resumes++;
            c.result = await killing(changer).change(c.input);
          }
        } catch (err) {
          problems.push(`change ${c.n} threw: ${(err as Error).message}`);
        } finally {
          running--;
        }
      }
    }),
  );
  done = true;
  await Promise.all(races);
  await Promise.all([...changers, ...racers].map((c) => c.close()));
  await fleet.stopAll();
  await records.stop();

  // The check, at the records server.
  const store = records.openStore();
  let applied = 0;
  let compensated = 0;
  let partial = 0;
  let misreported = 0;
  let duplicates = 0;
  let lost = 0;
  let racingApplied = 0;
  let racingLost = 0;
  try {
    const chains = versionChains(store, entities);
    lost += chains.lost;
    problems.push(...chains.problems);
    const state = new Map<string, { tags?: string[]; refunds?: { ref?: string }[]; reversals?: { reverses?: string }[]; notes?: { ref?: string }[] }>(
      [...chains.finalState].map(([k, v]) => [k, v ?? {}]),
    );
    for (const [key, n] of Object.entries(store.stats().writesByKey)) {
      if (n > 1) {
        duplicates += n - 1;
        problems.push(`Idempotency-Key ${key.slice(0, 12)}… committed ${n} times`);
      }
    }
    for (const c of plans) {
      const r = triple(c.triple);
      const ref = `chg-${c.n}`;
      const ticket = state.get(entityKey(r.ticket))!;
      const payment = state.get(entityKey(r.payment))!;
      const account = state.get(entityKey(r.account))!;
      const tagged = (ticket.tags ?? []).includes(ref);
      const refunds = (payment.refunds ?? []).filter((x) => x?.ref === ref).length;
      const reversals = (payment.reversals ?? []).filter((x) => x?.reverses === c.refundKey).length;
      const notes = (account.notes ?? []).filter((x) => x?.ref === ref).length;
      const fullyApplied = tagged && refunds === 1 && reversals === 0 && notes === 1;
      const fullyCompensated = !tagged && notes === 0 && refunds === reversals && refunds <= 1;
      const status = c.result?.status ?? "none";
      if (fullyApplied) applied++;
      else if (fullyCompensated) compensated++;
      else {
        partial++;
        problems.push(`change ${c.n} (${status}) ended partly applied: tag ${tagged}, refunds ${refunds}, reversals ${reversals}, notes ${notes}`);
      }
      const expected = c.refuse ? "compensated" : "applied";
      if (status !== expected || (expected === "applied" ? !fullyApplied : !fullyCompensated)) {
        misreported++;
        problems.push(`change ${c.n}: expected ${expected}, its result says ${status}${c.result?.status === "incomplete" ? ` (${c.result.message})` : ""}`);
      }
    }
    for (const w of racing) {
      if (w.result?.status !== "applied") continue;
      racingApplied++;
      const s = state.get(entityKey(w.entity))!;
      const n = w.kind === "tag" ? (s.tags ?? []).filter((t) => t === w.ref).length : w.kind === "refund" ? (s.refunds ?? []).filter((x) => x?.ref === w.ref).length : (s.notes ?? []).filter((x) => x?.ref === w.ref).length;
      if (n !== 1) {
        racingLost++;
        problems.push(`racing ${w.kind} ${w.ref} on ${entityKey(w.entity)} was answered applied and is in the record ${n} times`);
      }
    }
  } finally {
    store.close();
  }
  problems.push(...fleet.crashNotes);
  const line: LeaseCaseResult["line"] = {
    case: "changes-under-leases",
    changes: plans.length,
    applied,
    compensated,
    partial,
    misreported,
    duplicates,
    lost_updates: lost,
    racing_applied: racingApplied,
    racing_lost: racingLost,
    kills_mid_change: killsMidChange,
    crashes_after_patch: fleet.selfCrashes,
    owner_crashes: fleet.crashes,
    resumes,
  };
  const failed = partial + misreported + duplicates + lost + racingLost + fleet.crashes > 0 || killsMidChange === 0 || problems.length > 0;
  return { line, problems, failed };
}

/**
 * One racing write, as an agent makes it: a fresh read, then the write; a
 * conflict is decided again from the record it carries (a strict tag), at
 * most three times.
 */
async function raceOnce(client: WritClient, recordsUrl: string, w: RacingWrite, runId: string): Promise<SubmitResult> {
  const read = async () => {
    const res = await fetch(`${recordsUrl}/records/${w.entity.type}/${w.entity.id}`);
    if (!res.ok) throw new Error(`GET ${entityKey(w.entity)} answered ${res.status}`);
    return { state: (await res.json()) as { tags?: string[] }, version: res.headers.get("etag")! };
  };
  let current = await read();
  for (let round = 0; ; round++) {
    const input =
      w.kind === "tag"
        ? { tool: tagTicket, params: { tag: w.ref }, delta: [{ op: "replace" as const, path: "/tags", value: [...(current.state.tags ?? []), w.ref] }] }
        : w.kind === "refund"
          ? { tool: refundPayment, params: { amountCents: 1, reason: "goodwill", ref: w.ref }, delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 1, reason: "goodwill", ref: w.ref } }] }
          : { tool: noteAccount, params: { ref: w.ref, text: "racing note" }, delta: [{ op: "add" as const, path: "/notes/-", value: { ref: w.ref, text: "racing note" } }] };
    const result = await client.submit({ ...input, entity: w.entity, runId, stepId: w.ref, baseVersion: current.version }, { timeoutMs: 60_000 });
    if (result.status !== "conflict" || round >= 2) return result;
    current = { state: (result.current.state ?? {}) as { tags?: string[] }, version: result.current.version };
  }
}
