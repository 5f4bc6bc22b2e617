// writ's patch of kafkajs's transactional requests (src/kafka/txn-requests.ts), on the real broker: the
// transaction coordinator looked up once instead of before every request, CONCURRENT_TRANSACTIONS (kafkajs
// #304) asked again in place (its waits: test/unit/kafka/txn-requests.test.ts), and the transactions
// still exactly what a read_committed consumer sees. Counted from kafkajs's own request
// events. The first test runs before the patch is installed in this worker (one file, one worker): the
// ablation control, kafkajs as it is.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel, type Producer } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { patchTransactionalRequests } from "../../src/kafka/txn-requests.ts";
import { ownerProducerOptions } from "../../src/owner/transactions.ts";
import { brokers } from "../helpers/writ-harness.ts";
import { readCommitted } from "../helpers/read-committed.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const TRANSACTIONS = 40;
const kafka = new Kafka({ clientId: `txn-requests-${randomUUID().slice(0, 8)}`, brokers: brokers(), logLevel: logLevel.NOTHING });

async function topic(): Promise<string> {
  const name = `txn-requests.${randomUUID().slice(0, 8)}`;
  const admin = kafka.admin();
  await admin.connect();
  try {
    await createTopicsWithLeaders(admin, [{ topic: name, numPartitions: 2 }]);
  } finally {
    await admin.disconnect();
  }
  return name;
}

/** Back-to-back transactions of two records (one per partition); kafkajs's requests counted by API. */
async function backToBack(producer: Producer, name: string): Promise<Map<string, number>> {
  const counts = new Map<string, number>();
  await producer.connect();
  onTestFinished(() => producer.disconnect());
  // The first transaction (InitProducerId, the first lookup, the metadata) is not counted.
  const first = await producer.transaction();
  await first.send({ topic: name, messages: [{ partition: 0, value: "warm" }, { partition: 1, value: "warm" }] });
  await first.commit();
  const off = producer.on(producer.events.REQUEST, (e) => counts.set(e.payload.apiName, (counts.get(e.payload.apiName) ?? 0) + 1));
  for (let i = 0; i < TRANSACTIONS; i++) {
    const txn = await producer.transaction();
    await txn.send({ topic: name, messages: [{ partition: 0, value: `a${i}` }, { partition: 1, value: `b${i}` }], acks: -1 });
    await txn.commit();
  }
  off();
  return counts;
}

describe("kafkajs's transactional requests", () => {
  it("as kafkajs sends them (control): a FindCoordinator before each AddPartitionsToTxn and EndTxn", async () => {
    const name = await topic();
    const counts = await backToBack(kafka.producer(ownerProducerOptions(`txn-requests-${randomUUID()}`, 60_000)), name);
    expect(counts.get("GroupCoordinator") ?? 0).toBeGreaterThanOrEqual(2 * TRANSACTIONS);
  });

  it("patched: the coordinator found once (no FindCoordinator after the first transaction), every record committed once", async () => {
    patchTransactionalRequests();
    patchTransactionalRequests(); // installing it twice changes nothing
    const name = await topic();
    const producer = kafka.producer(ownerProducerOptions(`txn-requests-${randomUUID()}`, 60_000));
    const counts = await backToBack(producer, name);
    expect(counts.get("GroupCoordinator") ?? 0).toBe(0);
    expect(counts.get("EndTxn")).toBe(TRANSACTIONS);
    expect(counts.get("Produce")).toBe(TRANSACTIONS);
    // CONCURRENT_TRANSACTIONS right after a commit is asked again in place: at least one AddPartitionsToTxn each.
    expect(counts.get("AddPartitionsToTxn") ?? 0).toBeGreaterThanOrEqual(TRANSACTIONS);
    const seen = (await readCommitted(kafka, name, 2 * (TRANSACTIONS + 1))).map((r) => r.value);
    expect(seen.sort()).toEqual(["warm", "warm", ...Array.from({ length: TRANSACTIONS }, (_, i) => [`a${i}`, `b${i}`]).flat()].sort());
  });
});
