// `npm run bench`: end-to-end throughput and latency of writ on the local
// broker: agents' submit → owner (dedupe, pending, fresh read, If-Match PATCH,
// one transaction per chunk) → reply. Prints its figures; asserts nothing.
import { randomUUID } from "node:crypto";
import { createWritClient, type IntentInput } from "../producers/writ-client.ts";
import { ensureStack } from "../scripts/local-stack.ts";
import { refundPayment, systems, tools } from "../examples/demo-tools.ts";
import { createLogger } from "../src/logger.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { startRouter } from "../src/owner/router.ts";
import { startDemoRecordsServer } from "../src/sor/demo-records-server.ts";

hideKafkajsTimeoutWarning();
const INTENTS = Number(process.env.BENCH_INTENTS ?? 3000);
const ENTITIES = Number(process.env.BENCH_ENTITIES ?? 200);
const WAVE = Number(process.env.BENCH_WAVE ?? 100);
const PARTITIONS = Number(process.env.BENCH_PARTITIONS ?? 12);

const stack = await ensureStack({ log: () => undefined });
const brokers = stack.endpoints.brokers;
const registryUrl = stack.endpoints.registryUrl || undefined;
const records = await startDemoRecordsServer({ port: 0 });
for (let i = 0; i < ENTITIES; i++) records.seed("payment", `pay_${i}`, { amountCents: 10_000_000, refunds: [] });
const id = randomUUID().slice(0, 8);
const logger = createLogger({ level: "warn", name: "bench" });
const router = await startRouter({
  config: {
    brokers,
    schemaRegistryUrl: registryUrl,
    groupId: `writ.bench.${id}`,
    intentPartitions: PARTITIONS,
    topics: { intents: `writ.intents.b${id}`, ledger: `writ.ledger.b${id}`, human: `writ.human.b${id}`, dlq: `writ.dlq.b${id}` },
  },
  tools,
  systems: systems({ RECORDS_URL: records.url }),
  logger,
});
const client = await createWritClient({
  brokers,
  agentId: "bench",
  replyTopic: `writ.replies.bench.${id}`,
  intentsTopic: `writ.intents.b${id}`,
  schemaRegistryUrl: registryUrl,
  logger,
});

const intent = (i: number): IntentInput => ({
  tool: refundPayment,
  entity: { type: "payment", id: `pay_${i % ENTITIES}` },
  runId: `bench-${id}`,
  stepId: `s${i}`,
  baseVersion: '"v1"',
  delta: [{ op: "add", path: "/refunds/-", value: { amountCents: 100, reason: "goodwill", ref: `r${i}` } }],
  params: { amountCents: 100, reason: "goodwill" },
});

// Warm-up: partition assignment, ledger restore, schema registration.
await client.submitAll(Array.from({ length: PARTITIONS * 2 }, (_, i) => intent(INTENTS + i)));

const latencies: number[] = [];
const started = performance.now();
for (let sent = 0; sent < INTENTS; sent += WAVE) {
  const wave = Array.from({ length: Math.min(WAVE, INTENTS - sent) }, (_, k) => intent(sent + k));
  const t0 = performance.now();
  const replies = await client.submitAll(wave, { timeoutMs: 60_000 });
  const t1 = performance.now();
  for (const r of replies) {
    if (r.status !== "applied") throw new Error(`bench: intent answered ${r.status}`);
    latencies.push(t1 - t0);
  }
}
const seconds = (performance.now() - started) / 1000;

// Duplicates: the same wave again, answered from the ledger without touching the records server.
const dupStart = performance.now();
for (let sent = 0; sent < INTENTS; sent += WAVE) {
  await client.submitAll(Array.from({ length: Math.min(WAVE, INTENTS - sent) }, (_, k) => intent(sent + k)), { timeoutMs: 60_000 });
}
const dupSeconds = (performance.now() - dupStart) / 1000;

latencies.sort((a, b) => a - b);
const pct = (p: number) => latencies[Math.min(latencies.length - 1, Math.floor((p / 100) * latencies.length))]!.toFixed(0);
const writes = Object.values(records.stats().writesByKey).reduce((a, b) => a + b, 0);
console.log(`writ bench: ${INTENTS} refund intents on ${ENTITIES} entities, ${PARTITIONS} partitions, waves of ${WAVE}, 1 owner`);
console.log(`  new intents:  ${(INTENTS / seconds).toFixed(0)} intents/s; wave latency p50 ${pct(50)} ms, p95 ${pct(95)} ms, p99 ${pct(99)} ms`);
console.log(`  duplicates:   ${(INTENTS / dupSeconds).toFixed(0)} intents/s answered from the ledger`);
console.log(`  records server: ${writes} writes for ${INTENTS + PARTITIONS * 2} intents`);
console.log(
  JSON.stringify({
    intents_per_s: Math.round(INTENTS / seconds),
    duplicate_intents_per_s: Math.round(INTENTS / dupSeconds),
    wave_latency_ms: { p50: Number(pct(50)), p95: Number(pct(95)), p99: Number(pct(99)) },
    writes,
  }),
);

await client.close();
await router.stop();
await records.close();
if (stack.started) await stack.stop();
process.exit(0);
