// Transactions v2 (src/kafka/txn-v2.ts) on the real broker, which is the
// independent reader of every request here: Kafka 4.4 with transaction.version
// 2 finalized. What a read_committed consumer and the group coordinator see is
// the proof: committed records exactly once, aborted and fenced ones never,
// the consumed offset only with a committed transaction. The producer epoch
// going up with every EndTxn is what tells v2 from v1 (kafkajs keeps one epoch
// for a producer's life), and sequence numbers that did not start again at 0
// under each new epoch would be refused (OUT_OF_ORDER_SEQUENCE_NUMBER).
import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { partitionFor } from "../../src/kafka/partition.ts";
import { TransactionalProducerV2, clusterOf, probeTransactionVersion } from "../../src/kafka/txn-v2.ts";
import { isFencing } from "../../src/owner/partition-owner.ts";
import { ownerProducer } from "../../src/owner/transactions.ts";
import { brokers } from "../helpers/writ-harness.ts";
import { readCommitted } from "../helpers/read-committed.ts";
import { waitFor } from "../helpers/wait-for.ts";

const kafka = new Kafka({ clientId: `txn-v2-${randomUUID().slice(0, 8)}`, brokers: brokers(), logLevel: logLevel.NOTHING });

async function topic(partitions = 3): Promise<string> {
  const name = `txn-v2.${randomUUID().slice(0, 8)}`;
  const admin = kafka.admin();
  await admin.connect();
  try {
    await admin.createTopics({ topics: [{ topic: name, numPartitions: partitions }], waitForLeaders: true });
  } finally {
    await admin.disconnect();
  }
  return name;
}

async function producer(transactionalId = `txn-v2-${randomUUID()}`): Promise<TransactionalProducerV2> {
  const p = new TransactionalProducerV2(clusterOf(kafka), { transactionalId, transactionTimeoutMs: 60_000 });
  onTestFinished(() => p.disconnect());
  await p.init();
  return p;
}

/** Every record of `name` a read_committed consumer sees, as `partition:value`, once `expected` arrived. */
async function committed(name: string, expected: number): Promise<string[]> {
  return (await readCommitted(kafka, name, expected)).map((r) => `${r.partition}:${r.value}`);
}

describe("transactions v2", () => {
  it("the cluster has transaction.version 2 finalized and serves the v2 requests, so auto picks v2", async () => {
    const cluster = clusterOf(kafka);
    onTestFinished(() => cluster.disconnect());
    const probe = await probeTransactionVersion(cluster);
    expect(probe.level).toBeGreaterThanOrEqual(2);
    expect(probe.requests).toBe(true);
    const auto = await ownerProducer(kafka, { transactionalId: `txn-v2-${randomUUID()}`, transactionTimeoutMs: 60_000, protocol: "auto" });
    onTestFinished(() => auto.disconnect());
    expect(auto.protocol).toBe("v2");
    const v1 = await ownerProducer(kafka, { transactionalId: `txn-v2-${randomUUID()}`, transactionTimeoutMs: 60_000, protocol: "v1" });
    expect(v1.protocol).toBe("v1");
  });

  it("commits exactly what was committed (an aborted transaction never shows), with a new epoch after every EndTxn", async () => {
    const name = await topic();
    const p = await producer();
    const epochs = [p.identity.producerEpoch];
    const expected: string[] = [];
    for (let i = 0; i < 20; i++) {
      const key = `entity-${i % 7}`;
      await p.send([
        { topic: name, partition: 0, key: null, value: `a${i}` },
        { topic: name, partition: 1, key: null, value: `b${i}`, headers: { h: "1" } },
        // by key: the Java client's partitioner
        { topic: name, key, value: `k${i}` },
      ]);
      const abort = i === 7;
      await p.end(!abort);
      epochs.push(p.identity.producerEpoch);
      if (!abort) expected.push(`0:a${i}`, `1:b${i}`, `${partitionFor(key, 3)}:k${i}`);
    }
    // every EndTxn (commit or abort) answered with a higher epoch, and the next transaction used it
    for (let i = 1; i < epochs.length; i++) expect(epochs[i]).toBe(epochs[i - 1]! + 1);
    // records are read in offset order: an aborted record, had it shown, would come before later committed ones
    const seen = await committed(name, expected.length);
    expect(seen.sort()).toEqual(expected.sort());
  });

  it("a second producer of the same transactional id fences the first: its requests fail as fencing, its open records never show", async () => {
    const name = await topic();
    const id = `txn-v2-${randomUUID()}`;
    const first = await producer(id);
    await first.send([{ topic: name, partition: 0, key: null, value: "before" }]);
    await first.end(true);
    await first.send([{ topic: name, partition: 0, key: null, value: "zombie-open" }]);
    // the new owner: InitProducerId bumps the epoch and aborts the first one's open transaction
    const second = await producer(id);
    const late = await Promise.resolve()
      .then(async () => {
        await first.send([{ topic: name, partition: 1, key: null, value: "zombie-late" }]);
        await first.end(true);
        return null;
      })
      .catch((err: unknown) => err);
    expect(late).not.toBeNull();
    expect(isFencing(late)).toBe(true);
    await second.send([{ topic: name, partition: 0, key: null, value: "after" }]);
    await second.end(true);
    const seen = await committed(name, 2);
    expect(seen.sort()).toEqual(["0:after", "0:before"]);
  });

  it("the consumed offset commits with its transaction (TxnOffsetCommit v5), and not with an aborted one", async () => {
    const name = await topic(1);
    const groupId = `txn-v2-group-${randomUUID()}`;
    const p = await producer();
    const admin = kafka.admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    const groupOffset = async () => (await admin.fetchOffsets({ groupId, topics: [name] }))[0]!.partitions[0]!.offset;

    await p.send([{ topic: name, partition: 0, key: null, value: "r1" }]);
    await p.sendOffset({ groupId, topic: name, partition: 0, offset: 41n });
    await p.end(true);
    await waitFor(async () => (await groupOffset()) === "41", { timeoutMs: 10_000, message: () => "offset 41 committed" });

    // an offset alone opens a transaction too
    await p.sendOffset({ groupId, topic: name, partition: 0, offset: 57n });
    await p.end(false);
    await p.sendOffset({ groupId, topic: name, partition: 0, offset: 60n });
    await p.end(true);
    await waitFor(async () => (await groupOffset()) === "60", { timeoutMs: 10_000, message: () => "offset 60 committed" });
    const seen = await committed(name, 1);
    expect(seen).toEqual(["0:r1"]);
  });
});
