// `npm run test:faults`: the crash-safety suite. Owners run as separate OS
// processes; concurrent agents submit (and deliberately resubmit) intents on
// many entities while owners are SIGKILLed (also between PATCH and commit),
// join and leave, the records server commits then delays or drops its answer,
// and the broker is hard-killed and restarted once. Then the records server and
// the reply topics are checked. Last line: the measured figures as JSON.
import { mkdirSync, rmSync } from "node:fs";
import { join, resolve } from "node:path";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";

hideKafkajsTimeoutWarning();
const root = resolve(import.meta.dirname, "..", "..");
// A stack of its own (own ports, own data dir), since this suite kills its broker.
process.env.WRIT_LOCAL_STACK_DIR ??= join(root, ".cache", "run-faults");
process.env.WRIT_LOCAL_KAFKA_PORT ??= "49092";
process.env.WRIT_LOCAL_REGISTRY_PORT ??= "48081";
if (process.env.KAFKA_BROKERS) {
  console.error("test:faults kills and restarts its own local broker; unset KAFKA_BROKERS");
  process.exit(2);
}

const { ensureStack, killBroker, startBroker } = await import("../../scripts/local-stack.ts");
const { createWritClient } = await import("../../producers/writ-client.ts");
const { createLogger } = await import("../../src/logger.ts");
const { startDemoRecordsServer } = await import("../../src/sor/demo-records-server.ts");
const { OwnerFleet } = await import("./owner-fleet.ts");
const { runAgent } = await import("./agent-load.ts");
const { checkOutcome } = await import("./check-outcome.ts");
type PlannedIntent = import("./agent-load.ts").PlannedIntent;

const AGENTS = Number(process.env.FAULTS_AGENTS ?? 6);
const INTENTS_PER_AGENT = Number(process.env.FAULTS_INTENTS_PER_AGENT ?? 180);
const ENTITIES = Number(process.env.FAULTS_ENTITIES ?? 60);
const say = (line: string) => console.log(line);

const stack = await ensureStack({ log: (l) => say(`  [stack] ${l}`) });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
const id = Date.now().toString(36);
const logDir = join(root, ".writ", `faults-${id}`);
rmSync(logDir, { recursive: true, force: true });
mkdirSync(logDir, { recursive: true });

const entities: { type: string; id: string }[] = [];
for (let i = 0; i < ENTITIES; i++) {
  const e = i % 2 === 0 ? { type: "payment", id: `pay_${i}` } : { type: "ticket", id: `T-${i}` };
  entities.push(e);
  records.seed(e.type, e.id, e.type === "payment" ? { amountCents: 1_000_000, refunds: [] } : { status: "open", tags: [] });
}

const topics = { intents: `writ.intents.f${id}`, ledger: `writ.ledger.f${id}`, human: `writ.human.f${id}`, dlq: `writ.dlq.f${id}` };
const fleet = new OwnerFleet({
  script: join(root, "test", "faults", "fault-owner.ts"),
  logDir,
  env: {
    ...process.env,
    KAFKA_BROKERS: brokers.join(","),
    ...(registryUrl ? { SCHEMA_REGISTRY_URL: registryUrl } : {}),
    RECORDS_URL: records.url,
    WRIT_GROUP_ID: `writ.owners.f${id}`,
    WRIT_INTENTS_TOPIC: topics.intents,
    WRIT_LEDGER_TOPIC: topics.ledger,
    WRIT_HUMAN_TOPIC: topics.human,
    WRIT_DLQ_TOPIC: topics.dlq,
    WRIT_INTENT_PARTITIONS: "6",
    WRIT_SOR_TIMEOUT_MS: "1000",
    WRIT_SESSION_TIMEOUT_MS: "6000",
    WRIT_FAULT_CRASH_AFTER_PATCH: process.env.WRIT_FAULT_CRASH_AFTER_PATCH ?? "0.004",
    LOG_LEVEL: "info",
  },
});

const started = Date.now();
say(`writ fault suite f${id}: ${AGENTS} agents × ${INTENTS_PER_AGENT} intents on ${ENTITIES} entities; logs in ${logDir}`);
fleet.start(2);

const logger = createLogger({ level: "fatal", name: "fault-agent" });
const clients = await Promise.all(
  Array.from({ length: AGENTS }, (_, n) =>
    createWritClient({ brokers, agentId: `agent-${n}`, replyTopic: `writ.replies.agent-${n}.f${id}`, intentsTopic: topics.intents, schemaRegistryUrl: registryUrl, logger }),
  ),
);

const plans: PlannedIntent[][] = clients.map((_, n) =>
  Array.from({ length: INTENTS_PER_AGENT }, (_, i) => {
    const entity = entities[(n * 7 + i * 13) % ENTITIES]!;
    return { agent: `agent-${n}`, kind: entity.type === "payment" ? "refund" : "tag", entity, mark: `a${n}-i${i}`, submissions: 0 } as PlannedIntent;
  }),
);
const total = AGENTS * INTENTS_PER_AGENT;

// Chaos, paced by progress so it spreads over the run whatever the speed.
const actions = ["kill", "join", "records-faults", "kill", "broker-restart", "leave", "kill", "records-faults", "join", "kill", "leave", "kill"] as const;
let settled = 0;
let nextAction = 0;
let brokerRestarts = 0;
let chaos: Promise<void> = Promise.resolve();
const act = async (action: (typeof actions)[number]) => {
  const at = `${Math.round((100 * settled) / total)}%`;
  switch (action) {
    case "kill":
      fleet.killOne();
      say(`  ${at}: SIGKILL an owner (a replacement joins)`);
      break;
    case "join":
      fleet.join();
      say(`  ${at}: an owner joins`);
      break;
    case "leave":
      fleet.leave();
      say(`  ${at}: an owner leaves`);
      break;
    case "records-faults": {
      const pick = () => entities[Math.floor(Math.random() * entities.length)]!;
      records.setFaults([
        { kind: "commit-then-delay", delayMs: 2500, times: 3, match: pick() },
        { kind: "commit-then-delay", delayMs: 2500, times: 3 },
        { kind: "commit-then-drop", times: 3, match: pick() },
        { kind: "commit-then-drop", times: 3 },
      ]);
      say(`  ${at}: records server will commit then delay (2.5 s > 1 s timeout) or drop the answer, 12 times`);
      break;
    }
    case "broker-restart": {
      const pid = await killBroker();
      say(`  ${at}: broker hard-killed (SIGKILL pid ${pid})`);
      await startBroker({ log: () => undefined });
      brokerRestarts++;
      say(`  broker restarted`);
      break;
    }
  }
};
const onSettled = () => {
  settled++;
  const due = Math.floor((settled / total) * (actions.length + 1));
  while (nextAction < actions.length && nextAction < due) {
    const action = actions[nextAction++]!;
    chaos = chaos.then(() => act(action));
  }
};

await Promise.all(
  clients.map((c, n) =>
    runAgent(c, plans[n]!, 6, {
      runId: `f${id}`,
      recordsUrl: records.url,
      submitTimeoutMs: 20_000,
      resubmitRate: 0.15,
      deadlineMs: 8 * 60_000,
      onSettled,
    }),
  ),
);
await chaos;
records.setFaults([]);
say(`  all intents settled after ${((Date.now() - started) / 1000).toFixed(0)} s; checking the records server and the reply topics`);

const { outcome, problems } = await checkOutcome({
  intents: plans.flat(),
  records,
  brokers,
  registryUrl,
  replyTopics: clients.map((_, n) => `writ.replies.agent-${n}.f${id}`),
  entities,
});
const submissions = plans.flat().reduce((n, p) => n + p.submissions, 0);
const reconciled = plans.flat().filter((p) => p.final?.status === "applied" && p.final.via === "reconcile").length;
const faulted = plans.flat().filter((p) => records.patchRequests(p.intentKey).some((r) => r.fault !== null)).length;
await Promise.all(clients.map((c) => c.close()));
await fleet.stopAll();
await records.close();
if (stack.started) await stack.stop();

for (const p of problems.slice(0, 20)) say(`  PROBLEM ${p}`);
say(
  `  ${submissions} submissions for ${outcome.intents} intents; ${outcome.applied} applied, ${outcome.escalated} escalated, ` +
    `${outcome.conflicts_answered} conflict replies; PATCH requests per intent at most ${outcome.max_patches_per_intent}, ` +
    `${outcome.patches_after_commit} after a commit; ${fleet.selfCrashes} of the kills at the PATCH→commit crash point; ` +
    `${outcome.mismatches} answers disagreeing with the records server; ${faulted} intents met a commit-then-delay/drop, ` +
    `${reconciled} settled by reconcile`,
);
console.log(
  JSON.stringify({
    intents: outcome.intents,
    applied: outcome.applied,
    duplicates: outcome.duplicates,
    lost_updates: outcome.lost_updates,
    unanswered: outcome.unanswered,
    kills: fleet.kills,
    rebalances: fleet.rebalances,
    broker_restarts: brokerRestarts,
  }),
);
const failed =
  outcome.duplicates + outcome.lost_updates + outcome.unanswered + outcome.mismatches + outcome.patches_after_commit > 0 || brokerRestarts !== 1;
process.exit(failed ? 1 : 0);
