// `writ topics ensure|check`: the contract topics (routerTopics), created and
// checked as owners need them: partition p of the ledger holds the ledger of
// intents partition p, so both topics must have the same partition count, and
// the ledger must be compacted.
import type { Admin, ITopicConfig } from "kafkajs";
import { routerConfigFromEnv, type RouterConfig } from "../config.ts";
import { type BatchLimit, LEDGER_MIN_COMPACTION_LAG_MS, TOPIC_RESOURCE, batchLimitProblem, batchLimits, ensureTopics, routerTopics, topicNeeds } from "../topics.ts";
import { commandLogger, kafkaFor, parseCommandArgs, runCommand, UsageError, type Command } from "./common.ts";

const USAGE = `usage: writ topics ensure|check [--brokers <list>] [--json]

The contract topics, named and sized as owners configure them from the environment (WRIT_INTENTS_TOPIC,
WRIT_LEDGER_TOPIC, WRIT_HUMAN_TOPIC, WRIT_DLQ_TOPIC, WRIT_INTENT_PARTITIONS, WRIT_REPLICATION_FACTOR,
WRIT_LEDGER_RETENTION_HOURS; see the README):

  ensure   creates the ones that are missing (existing topics are left as they are), then checks them.
           Refuses to create one of intents/ledger beside an existing other with a different partition count.
  check    checks them and changes nothing.

A check fails on: a missing topic; an intents topic and a ledger with different partition counts; a
partition count other than WRIT_INTENT_PARTITIONS (owners restore that many ledger partitions); a ledger
whose cleanup.policy is not compact, or also delete with a retention.ms under the window or a retention.bytes;
unclean.leader.election.enable=true, or min.insync.replicas below 2 at replication factor 3 or more; a topic that takes less than writ writes there (its max.message.bytes,
or segment.bytes, or the brokers' message.max.bytes where the topic sets neither): the ledger less than its
largest entry (WRIT_MAX_INTENT_BYTES + 65536), the others less than WRIT_MAX_MESSAGE_BYTES. It warns (and passes) on a replication factor or a ledger
delete.retention.ms other than configured, and on a ledger min.compaction.lag.ms below an hour.

  --brokers <list>   Kafka brokers host:port[,…] (default $KAFKA_BROKERS)
  --json             one JSON report instead of text
  -h, --help         this text

Exit status: 0 the topics are as owners need them, 1 they are not (each problem is named), 2 bad usage,
bad configuration, or Kafka unreachable.`;

export interface TopicState {
  topic: string;
  role: "intents" | "ledger" | "human" | "dlq";
  exists: boolean;
  partitions?: number;
  replicationFactor?: number;
  configs?: Record<string, string>;
  /** What the topic takes of a batch (DescribeConfigs). */
  batchLimit?: BatchLimit;
}

export interface TopicsReport {
  ok: boolean;
  created: string[];
  topics: TopicState[];
  problems: string[];
  warnings: string[];
}

const ROLES = ["intents", "ledger", "human", "dlq"] as const;

/** The topic configs the check reads (each topic's effective value: its own override, else the brokers'). */
const CHECKED_CONFIGS = [
  "cleanup.policy",
  "delete.retention.ms",
  "min.compaction.lag.ms",
  "retention.ms",
  "retention.bytes",
  "unclean.leader.election.enable",
  "min.insync.replicas",
];

/** A numeric config's value; NaN when the broker gave none (a missing or empty value is no number, not 0). */
const configNumber = (value: string | null | undefined): number => (value === null || value === undefined || !/^-?\d+$/.test(value.trim()) ? NaN : Number(value));

/** What is lost on each topic when a broker drops records it had acknowledged. */
const LOST: Record<TopicState["role"], string> = {
  intents: "acknowledged intents, and new intents then take offsets below the owners' committed ones and are never read",
  ledger: "committed ledger entries (an applied write, a pending one), so a repeat of the intent is written again",
  human: "escalations",
  dlq: "dead letters",
};

async function describe(admin: Admin, config: RouterConfig): Promise<TopicState[]> {
  const existing = new Set(await admin.listTopics());
  const names = ROLES.map((r) => config.topics[r]);
  const present = names.filter((t) => existing.has(t));
  const { topics: metadata } = present.length > 0 ? await admin.fetchTopicMetadata({ topics: present }) : { topics: [] };
  const configs = new Map<string, Record<string, string>>();
  if (present.length > 0) {
    const described = await admin.describeConfigs({
      includeSynonyms: false,
      resources: present.map((name) => ({ type: TOPIC_RESOURCE, name, configNames: CHECKED_CONFIGS })),
    });
    for (const r of described.resources) configs.set(r.resourceName, Object.fromEntries(r.configEntries.map((e) => [e.configName, e.configValue])));
  }
  const limits = await batchLimits(admin, present);
  return ROLES.map((role) => {
    const topic = config.topics[role];
    const m = metadata.find((x) => x.name === topic);
    if (!existing.has(topic) || m === undefined) return { topic, role, exists: false };
    return {
      topic,
      role,
      exists: true,
      partitions: m.partitions.length,
      replicationFactor: Math.min(...m.partitions.map((p) => p.replicas.length)),
      configs: configs.get(topic) ?? {},
      ...(limits.has(topic) ? { batchLimit: limits.get(topic)! } : {}),
    };
  });
}

/** Problems (the owners cannot work with these topics) and warnings (they can). */
export function judge(states: TopicState[], config: RouterConfig, wanted: ITopicConfig[]): { problems: string[]; warnings: string[] } {
  const problems: string[] = [];
  const warnings: string[] = [];
  const by = (role: TopicState["role"]) => states.find((s) => s.role === role)!;
  for (const s of states) {
    if (!s.exists) problems.push(`${s.topic} (${s.role}) does not exist: writ topics ensure creates it`);
    else if (s.replicationFactor !== undefined && s.replicationFactor !== config.replicationFactor) {
      warnings.push(`${s.topic} has replication factor ${s.replicationFactor}; WRIT_REPLICATION_FACTOR is ${config.replicationFactor}`);
    }
  }
  const needs = topicNeeds(config);
  for (const s of states) {
    const problem = s.exists && s.batchLimit ? batchLimitProblem(s.topic, s.role, s.batchLimit, needs[s.role]) : null;
    if (problem !== null) problems.push(problem);
  }
  for (const s of states) {
    if (!s.exists) continue;
    const alter = (setting: string) => `(kafka-configs --alter --entity-type topics --entity-name ${s.topic} --add-config ${setting})`;
    // A leader elected from outside the in-sync replicas truncates what the others had acknowledged.
    if (s.configs?.["unclean.leader.election.enable"] === "true") {
      problems.push(`${s.topic} has unclean.leader.election.enable=true: a broker failure can then lose ${LOST[s.role]} ${alter("unclean.leader.election.enable=false")}`);
    }
    // Transactions write with acks=all, which waits only for min.insync.replicas copies.
    const minIsr = configNumber(s.configs?.["min.insync.replicas"]);
    if (s.replicationFactor !== undefined && s.replicationFactor >= 3 && Number.isInteger(minIsr) && minIsr < 2) {
      problems.push(
        `${s.topic} has min.insync.replicas=${minIsr} with replication factor ${s.replicationFactor}: a write is acknowledged once one broker has it, and that broker's loss loses ${LOST[s.role]} ${alter("min.insync.replicas=2")}`,
      );
    }
  }
  const intents = by("intents");
  const ledger = by("ledger");
  if (intents.exists && ledger.exists && intents.partitions !== ledger.partitions) {
    problems.push(
      `${intents.topic} has ${intents.partitions} partitions and ${ledger.topic} ${ledger.partitions}: they must be equal (ledger partition p holds the ledger of intents partition p)`,
    );
  }
  for (const s of [intents, ledger]) {
    if (s.exists && s.partitions !== config.intentPartitions) {
      problems.push(`${s.topic} has ${s.partitions} partitions; WRIT_INTENT_PARTITIONS is ${config.intentPartitions}: set WRIT_INTENT_PARTITIONS=${s.partitions} for owners and writ topics`);
    }
  }
  if (ledger.exists) {
    const policy = ledger.configs?.["cleanup.policy"] ?? "";
    if (!policy.split(",").map((p) => p.trim()).includes("compact")) {
      problems.push(`${ledger.topic} is not compacted (cleanup.policy=${policy || "?"}): the ledger must have cleanup.policy=compact`);
    } else if (policy.includes("delete")) {
      // Kafka deletes whole segments past retention.ms or beyond retention.bytes, compacted or not.
      const windowMs = config.ledgerRetentionHours * 3_600_000;
      const retentionMs = configNumber(ledger.configs?.["retention.ms"]);
      const retentionBytes = configNumber(ledger.configs?.["retention.bytes"]);
      if ((retentionMs >= 0 && retentionMs < windowMs) || retentionBytes >= 0) {
        const limit = retentionBytes >= 0 ? `retention.bytes=${retentionBytes}` : `retention.ms=${retentionMs}`;
        problems.push(
          `${ledger.topic} has cleanup.policy=${policy} and ${limit}: Kafka deletes ledger entries inside the ${config.ledgerRetentionHours} h window ` +
            `(WRIT_LEDGER_RETENTION_HOURS), so an owner restoring the partition misses them and a repeat of their intent is written again; ` +
            `use cleanup.policy=compact (kafka-configs --alter --entity-type topics --entity-name ${ledger.topic} --add-config cleanup.policy=compact)`,
        );
      } else {
        warnings.push(`${ledger.topic} has cleanup.policy=${policy}: retention also deletes ledger entries by age (pending ones and open escalations too)`);
      }
    }
    const want = wanted.find((t) => t.topic === ledger.topic)?.configEntries?.find((e) => e.name === "delete.retention.ms")?.value;
    const have = ledger.configs?.["delete.retention.ms"];
    if (want !== undefined && have !== undefined && have !== want) {
      warnings.push(`${ledger.topic} has delete.retention.ms=${have}; WRIT_LEDGER_RETENTION_HOURS asks for ${want}`);
    }
    const lag = ledger.configs?.["min.compaction.lag.ms"];
    if (lag !== undefined && Number(lag) < LEDGER_MIN_COMPACTION_LAG_MS) {
      warnings.push(
        `${ledger.topic} has min.compaction.lag.ms=${lag}; writ creates it with ${LEDGER_MIN_COMPACTION_LAG_MS}: below that, a partition left without an owner ` +
          "after a crash may have its in-doubt pending entries dropped by the log cleaner before the next owner finds them " +
          `(kafka-configs --alter --entity-type topics --entity-name ${ledger.topic} --add-config min.compaction.lag.ms=${LEDGER_MIN_COMPACTION_LAG_MS})`,
      );
    }
  }
  return { problems, warnings };
}

function format(report: TopicsReport): string {
  const lines = report.topics.map((t) =>
    t.exists
      ? `${t.topic.padEnd(24)} ${t.role.padEnd(8)} ${String(t.partitions).padStart(4)} partition${t.partitions === 1 ? " " : "s"}  rf ${t.replicationFactor}${t.role === "ledger" && t.configs?.["cleanup.policy"] ? `  cleanup.policy=${t.configs["cleanup.policy"]}` : ""}${report.created.includes(t.topic) ? "  (created)" : ""}`
      : `${t.topic.padEnd(24)} ${t.role.padEnd(8)} missing`,
  );
  for (const w of report.warnings) lines.push(`warning: ${w}`);
  for (const p of report.problems) lines.push(`problem: ${p}`);
  lines.push(report.ok ? "topics ok" : `topics NOT ok: ${report.problems.length} problem${report.problems.length === 1 ? "" : "s"}`);
  return lines.join("\n");
}

const OPTIONS = { brokers: { type: "string" }, json: { type: "boolean" } } as const;

async function main(argv: string[]): Promise<number> {
  const parsed = parseCommandArgs(argv, OPTIONS, USAGE, true);
  if (parsed === undefined) return 0;
  const [action, ...extra] = parsed.positionals;
  if (action !== "ensure" && action !== "check") throw new UsageError(action === undefined ? "ensure or check?" : `unknown action ${action}; ensure or check`);
  if (extra.length > 0) throw new UsageError(`unexpected argument ${extra[0]}`);
  const env = { ...process.env };
  if (parsed.values.brokers !== undefined) env.KAFKA_BROKERS = parsed.values.brokers;
  if ((env.KAFKA_BROKERS ?? "") === "") throw new UsageError("no Kafka: give --brokers host:port[,…] (or set KAFKA_BROKERS)");
  const config = routerConfigFromEnv(env);
  const wanted = routerTopics(config);
  const log = commandLogger("topics");
  const admin = kafkaFor(config.brokers, "writ-cli-topics", log, config.kafka).admin();
  await admin.connect();
  try {
    const created: string[] = [];
    if (action === "ensure") {
      const before = await describe(admin, config);
      const [intents, ledger] = [before.find((s) => s.role === "intents")!, before.find((s) => s.role === "ledger")!];
      const lone = intents.exists !== ledger.exists ? (intents.exists ? intents : ledger) : undefined;
      if (lone !== undefined && lone.partitions !== config.intentPartitions) {
        const other = lone === intents ? ledger : intents;
        const report: TopicsReport = {
          ok: false,
          created: [],
          topics: before,
          problems: [
            `refusing to create ${other.topic} with ${config.intentPartitions} partitions beside ${lone.topic} with ${lone.partitions}: set WRIT_INTENT_PARTITIONS=${lone.partitions}`,
          ],
          warnings: [],
        };
        process.stdout.write(parsed.values.json ? `${JSON.stringify(report)}\n` : `${format(report)}\n`);
        return 1;
      }
      const missing = before.filter((s) => !s.exists).map((s) => s.topic);
      if (missing.length > 0) await ensureTopics(admin, wanted.filter((t) => missing.includes(t.topic)));
      created.push(...missing);
    }
    const topics = await describe(admin, config);
    const { problems, warnings } = judge(topics, config, wanted);
    const report: TopicsReport = { ok: problems.length === 0, created, topics, problems, warnings };
    process.stdout.write(parsed.values.json ? `${JSON.stringify(report)}\n` : `${format(report)}\n`);
    return report.ok ? 0 : 1;
  } finally {
    await admin.disconnect().catch(() => undefined);
  }
}

export const topicsCommand: Command = {
  usage: USAGE,
  options: OPTIONS,
  main: (argv) => runCommand("topics", USAGE, () => main(argv)),
};
