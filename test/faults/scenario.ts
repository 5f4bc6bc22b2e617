// One run of the fault suite: owners as separate OS processes, agents submitting (and resubmitting)
// intents on many records, while the schedule kills, pauses and adds owners, makes the records server
// commit then delay or drop its answer, takes it down, restarts the broker (or kills a partition leader)
// and the registry, and sends poison records. Then the records server, the reply topics and the dead
// letters are checked. The schedule comes from the seed.
import { mkdirSync, rmSync } from "node:fs";
import { join } from "node:path";
import { createWritClient, type WritClient } from "../../producers/writ-client.ts";
import { createLogger } from "../../src/logger.ts";
import { runAgent, type PlannedIntent } from "./agent-load.ts";
import { checkOutcome, type Outcome } from "./check-outcome.ts";
import { diagnose } from "./diagnose.ts";
import type { SuiteOptions } from "./options.ts";
import { OwnerFleet } from "./owner-fleet.ts";
import { injectPoison, type PoisonRound } from "./poison.ts";
import { RecordsProcess } from "./records-process.ts";
import { seededRng } from "./rng.ts";
import { SESSION_TIMEOUT_MS, faultOwnerEnv, faultTopics } from "./owner-env.ts";

type Stack = typeof import("../../src/testing/local-stack.ts");

export interface RunResult {
  line: Record<string, unknown>;
  outcome: Outcome;
  problems: string[];
  failed: boolean;
}

type Action = "kill" | "join" | "leave" | "records-faults" | "records-outage" | "zombie" | "broker-restart" | "leader-kill" | "registry-restart" | "poison";

/** Nothing settling for this long ends the run with a diagnosis instead of waiting out the deadline. */
const STALL_MS = 60_000;
/** Longest a fault action may hold the load back (a zombie waits up to 60 s for an owner, then pauses it 12 s). */
const HOLD_MS = 180_000;


function schedule(opts: SuiteOptions, rng: ReturnType<typeof seededRng>): Action[] {
  const actions: Action[] = [
    "kill", "join", "records-faults", "poison", "zombie", "records-outage", "kill",
    opts.brokers === 3 ? "leader-kill" : "broker-restart",
    "registry-restart", "leave", "records-faults", "kill", "poison", "join", "kill", "leave", "kill",
  ];
  for (let i = actions.length - 1; i > 0; i--) {
    const j = rng.int(0, i);
    [actions[i], actions[j]] = [actions[j]!, actions[i]!];
  }
  return actions;
}

export async function runScenario(
  opts: SuiteOptions & { seed: number; root: string; stack: Stack; brokers_: string[]; registryUrl: string | undefined; say: (line: string) => void },
): Promise<RunResult> {
  const { stack, say } = opts;
  const rng = seededRng(opts.seed);
  const planRng = rng.fork();
  const chaosRng = rng.fork();
  const agentRngs = Array.from({ length: opts.agents }, () => rng.fork());
  const started = Date.now();
  const brokers = opts.brokers_;
  const registryUrl = opts.registryUrl;
  const id = `${opts.seed.toString(36)}${Date.now().toString(36).slice(-4)}`;
  const logDir = join(opts.root, ".writ", `faults-${id}`);
  rmSync(logDir, { recursive: true, force: true });
  mkdirSync(logDir, { recursive: true });
  const records = new RecordsProcess({ root: opts.root, dbPath: join(logDir, "records.db"), logFile: join(logDir, "records.log") });
  await records.start();

  const entities: { type: string; id: string }[] = [];
  for (let i = 0; i < opts.entities; i++) {
    const e = i % 2 === 0 ? { type: "payment", id: `pay_${i}` } : { type: "ticket", id: `T-${i}` };
    entities.push(e);
    await records.seed(e.type, e.id, e.type === "payment" ? { amountCents: 1_000_000, refunds: [] } : { status: "open", tags: [], notes: [] });
  }
  const poisonEntities = [0, 1].map((n) => ({ type: "payment" as const, id: `poison_${n}` }));
  for (const e of poisonEntities) await records.seed(e.type, e.id, { amountCents: 1_000_000, refunds: [] });

  const topics = faultTopics(`f${id}`);
  const replicationFactor = opts.brokers === 3 ? 3 : 1;
  const fleet = new OwnerFleet({
    script: join(opts.root, "test", "faults", "fault-owner.ts"),
    logDir,
    rng: chaosRng.fork(),
    env: faultOwnerEnv({ brokers, registryUrl, recordsUrl: records.url, id: `f${id}`, topics, replicationFactor, ablate: opts.ablate }),
  });

  const total = Math.ceil(opts.intents / opts.agents) * opts.agents;
  say(
    `writ fault suite f${id} (seed ${opts.seed}${opts.ablate ? `, ablate ${opts.ablate}` : ""}): ${opts.agents} agents × ${total / opts.agents} intents on ${opts.entities} records, ` +
      `${opts.brokers} broker(s); logs in ${logDir}`,
  );
  fleet.start(2);

  const logger = createLogger({ level: "fatal", name: "fault-agent" });
  const makeClient = (agent: string) =>
    createWritClient({
      brokers,
      agentId: agent,
      replyTopic: `writ.replies.${agent}.f${id}`,
      intentsTopic: topics.intents,
      schemaRegistryUrl: registryUrl,
      replicationFactor,
      submitTimeoutMs: 20_000,
      logger,
    });
  const names = Array.from({ length: opts.agents }, (_, n) => `agent-${n}`);
  const clients: WritClient[] = await Promise.all(names.map(makeClient));
  const poisonClient = await makeClient("agent-poison");
  const replyTopics = [...names, "agent-poison"].map((a) => `writ.replies.${a}.f${id}`);

  const plans: PlannedIntent[][] = names.map((agent, n) =>
    Array.from({ length: total / opts.agents }, (_, i) => {
      const entity = entities[planRng.int(0, entities.length - 1)]!;
      const kind = entity.type === "payment" ? "refund" : planRng.next() < 0.5 ? "tag" : "note";
      void n;
      return { agent, kind, entity, mark: `a${n}-i${i}`, submissions: 0 } as PlannedIntent;
    }),
  );

  // Chaos, paced by progress so it spreads over the run whatever the speed. Actions run one after another (an outage
  // lasts 12 s, a zombie's pause past the session timeout longer); while one is due and has not begun, agents hold
  // new intents, so a fast run cannot finish its load with faults still queued: every action begins with intents
  // left to send, the last one before the final 1/(n+1) of them.
  const actions = schedule(opts, chaosRng);
  let actionsBegun = 0;
  let held: { promise: Promise<void>; release: () => void; since: number } | null = null;
  const releaseLoad = () => {
    held?.release();
    held = null;
  };
  const poison: PoisonRound[] = [];
  let settled = 0;
  let lastSettledAt = Date.now();
  let nextAction = 0;
  let brokerRestarts = 0;
  let registryRestarts = 0;
  let leaderKills = 0;
  let chaos: Promise<void> = Promise.resolve();
  const chaosErrors: string[] = [];
  const act = async (action: Action) => {
    const at = `${Math.round((100 * settled) / total)}%`;
    actionsBegun++;
    if (nextAction === actionsBegun) {
      // The time held was the suite's, not a stall of the owners.
      if (held) lastSettledAt = Date.now();
      releaseLoad();
    }
    switch (action) {
      case "kill":
        say(`  ${at}: SIGKILL ${fleet.killOne() ?? "(no owner)"} (a replacement joins)`);
        break;
      case "join":
        fleet.join();
        say(`  ${at}: an owner joins`);
        break;
      case "leave":
        say(`  ${at}: ${fleet.leave() ?? "(no owner to stop)"}`);
        break;
      case "records-faults": {
        const pick = () => chaosRng.pick(entities);
        await records.setFaults([
          { kind: "commit-then-delay", delayMs: 2500, times: 3, match: pick() },
          { kind: "commit-then-delay", delayMs: 2500, times: 3 },
          { kind: "commit-then-drop", times: 3, match: pick() },
          { kind: "commit-then-drop", times: 3 },
        ]);
        say(`  ${at}: records server will commit then delay (2.5 s > 1 s timeout) or drop the answer, 12 times`);
        break;
      }
      case "records-outage":
        say(`  ${at}: records server down (SIGKILL) for 12 s`);
        await records.outage(12_000);
        say(`  records server back`);
        break;
      case "zombie": {
        const z = await fleet.zombie(SESSION_TIMEOUT_MS + 6000);
        say(`  ${at}: ${z ? `${z.name} paused (SIGSTOP) ${((z.resumedAt - z.pausedAt) / 1000).toFixed(0)} s past the session timeout, then resumed` : "(no owner to pause)"}`);
        break;
      }
      case "broker-restart": {
        const pid = await stack.killBroker();
        say(`  ${at}: broker hard-killed (SIGKILL pid ${pid})`);
        await stack.startBroker({ log: () => undefined });
        brokerRestarts++;
        say(`  broker restarted`);
        break;
      }
      case "leader-kill": {
        const partition = chaosRng.int(0, 5);
        const leader = await stack.leaderOf(brokers, topics.intents, partition);
        if (leader < 0) break;
        await stack.killBroker(leader);
        leaderKills++;
        say(`  ${at}: SIGKILL broker ${leader}, leader of ${topics.intents}-${partition}`);
        await new Promise((r) => setTimeout(r, 8000));
        await stack.startBroker({ nodeId: leader, log: () => undefined });
        say(`  broker ${leader} restarted`);
        break;
      }
      case "registry-restart": {
        await stack.killRegistry();
        say(`  ${at}: schema registry hard-killed`);
        await stack.startRegistry({ log: () => undefined });
        registryRestarts++;
        say(`  schema registry restarted`);
        break;
      }
      case "poison": {
        const entity = poisonEntities[poison.length % poisonEntities.length]!;
        say(`  ${at}: poison on ${entity.type}:${entity.id}: 10,000-deep JSON, 900 KB of garbage, an lz4 batch from the Java console producer`);
        poison.push(await injectPoison({ brokers, intentsTopic: topics.intents, client: poisonClient, recordsUrl: records.url, entity, runId: `f${id}-poison`, tag: `p${poison.length}` }));
        break;
      }
    }
  };
  const onSettled = () => {
    settled++;
    lastSettledAt = Date.now();
    const due = Math.floor((settled / total) * (actions.length + 1));
    while (nextAction < actions.length && nextAction < due) {
      const action = actions[nextAction++]!;
      chaos = chaos.then(() => act(action)).catch((err: unknown) => void chaosErrors.push(`${action}: ${(err as Error).message}`));
    }
    if (nextAction > actionsBegun && !held) {
      let release = () => undefined as void;
      held = { promise: new Promise<void>((resolve) => (release = resolve)), release: () => release(), since: Date.now() };
    }
  };

  let stalled: string | null = null;
  let deadlineAt = Date.now() + 10 * 60_000;
  const watchdog = setInterval(() => {
    if (stalled !== null) return;
    if (held) {
      // Holding the load is the suite's doing, not a stall of the owners; a fault action that never ends is one.
      if (Date.now() - held.since > HOLD_MS) stalled = `fault action ${actionsBegun} of ${actions.length} still running after ${HOLD_MS / 1000} s`;
    } else if (settled < total && Date.now() - lastSettledAt > STALL_MS) {
      stalled = `nothing settled for ${STALL_MS / 1000} s at ${settled}/${total}`;
    }
    if (stalled !== null) {
      deadlineAt = Date.now();
      releaseLoad();
    }
  }, 1000);
  await Promise.all(
    clients.map((c, n) =>
      runAgent(c, plans[n]!, 6, {
        runId: `f${id}`,
        recordsUrl: records.url,
        submitTimeoutMs: 20_000,
        resubmitRate: 0.15,
        deadline: () => deadlineAt,
        onSettled,
        gate: () => held?.promise ?? Promise.resolve(),
        rng: agentRngs[n]!,
      }),
    ),
  );
  clearInterval(watchdog);
  let diagnosis: string[] = [];
  if (stalled !== null) {
    say(`  STALLED: ${stalled}; diagnosing instead of waiting out the deadline`);
    diagnosis = await diagnose({ brokers, replyTopics, topics, fleet, recordsUrl: records.url, groupId: `writ.owners.f${id}` });
    for (const line of diagnosis) say(`  DIAGNOSIS ${line}`);
  } else {
    await chaos;
  }
  await records.setFaults([]).catch(() => undefined);
  say(`  load ended after ${((Date.now() - started) / 1000).toFixed(0)} s; checking the records server, the reply topics and the dead letters`);

  await Promise.all([...clients, poisonClient].map((c) => c.close()));
  await fleet.stopAll();
  await records.stop();
  const store = records.openStore();
  let checked;
  try {
    checked = await checkOutcome({
      intents: plans.flat(),
      store,
      brokers,
      registryUrl,
      replyTopics,
      dlqTopic: topics.dlq,
      entities,
      zombies: fleet.zombies,
      poison,
    });
  } finally {
    store.close();
  }
  const { outcome, problems } = checked;
  problems.push(...chaosErrors.map((e) => `fault action failed: ${e}`), ...fleet.crashNotes, ...diagnosis);
  if (stalled !== null) problems.unshift(`stalled: ${stalled}`);

  const line = {
    seed: opts.seed,
    intents: outcome.intents,
    applied: outcome.applied,
    duplicates: outcome.duplicates,
    lost_updates: outcome.lost_updates,
    unanswered: outcome.unanswered,
    patches_after_commit: outcome.patches_after_commit,
    escalated_unsent: outcome.escalated_unsent,
    owner_crashes: fleet.crashes,
    kills: fleet.kills,
    zombies: fleet.zombies.length,
    sor_outages: records.outages,
    rebalances: fleet.rebalances,
    broker_restarts: brokerRestarts + leaderKills,
    poison: outcome.poison,
  };
  const submissions = plans.flat().reduce((n, p) => n + p.submissions, 0);
  say(
    `  ${submissions} submissions for ${outcome.intents} intents (${outcome.never_submitted} never submitted, ${outcome.submitted_unanswered} submitted and unanswered); ` +
      `${outcome.applied} applied, ${outcome.escalated} escalated, ${outcome.conflicts_answered} conflict replies; PATCH requests per intent at most ${outcome.max_patches_per_intent}, ` +
      `${outcome.patches_after_commit} replayed after a commit, ${outcome.late_patches_refused} late ones refused by If-Match; ${fleet.selfCrashes} kills at the PATCH→commit crash point; ` +
      `zombie writes ${outcome.zombie_writes}; poison ${outcome.poison_dead_lettered}/${outcome.poison} dead-lettered, ${outcome.poison_follow_ups_applied}/${outcome.poison_follow_ups} intents after them applied; ` +
      `registry restarts ${registryRestarts}; records server down ${(records.downMs / 1000).toFixed(0)} s; ${outcome.hanging_partitions} reply partitions hanging at the end`,
  );
  const expectedBrokerRestarts = opts.brokers === 3 ? leaderKills === 1 : brokerRestarts === 1;
  const failed =
    stalled !== null ||
    outcome.duplicates + outcome.lost_updates + outcome.unanswered + outcome.mismatches + outcome.patches_after_commit + outcome.escalated_unsent > 0 ||
    fleet.crashes + outcome.zombie_writes + outcome.hanging_partitions > 0 ||
    outcome.poison_dead_lettered !== outcome.poison ||
    outcome.poison_follow_ups_applied !== outcome.poison_follow_ups ||
    chaosErrors.length > 0 ||
    !expectedBrokerRestarts;
  return { line, outcome, problems, failed };
}
