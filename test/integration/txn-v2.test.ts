// Transactions v2 (src/kafka/txn-v2.ts) on the real broker, which is the
// independent reader of every request here: Kafka 4.4 with transaction.version
// 2 finalized. What a read_committed consumer and the group coordinator see is
// the proof: committed records exactly once, aborted and fenced ones never,
// the consumed offset only with a committed transaction. The producer epoch
// going up with every EndTxn is what tells v2 from v1 (kafkajs keeps one epoch
// for a producer's life), and sequence numbers that did not start again at 0
// under each new epoch would be refused (OUT_OF_ORDER_SEQUENCE_NUMBER). A
// Produce or EndTxn answer lost after the broker acted (sockets that break as
// the answer arrives) is asked again without a second copy; re-encoding the
// resent batch under the next sequence instead (a blind replay, tried by hand)
// makes the Produce case fail with the batch twice, as its control shows. The
// spacing between transactions is timed against a spacing far above a local
// round trip: without it (tried by hand) a send returns after about 10 ms.
import { randomUUID } from "node:crypto";
import { connect, type Socket } from "node:net";
import { Kafka, logLevel, type ISocketFactory } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { partitionFor } from "../../src/kafka/partition.ts";
import { TransactionalProducerV2, clusterOf, probeTransactionVersion } from "../../src/kafka/txn-v2.ts";
import { isFencing } from "../../src/owner/partition-owner.ts";
import { ownerProducer } from "../../src/owner/transactions.ts";
import { brokers } from "../helpers/writ-harness.ts";
import { readCommitted } from "../helpers/read-committed.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

const kafka = new Kafka({ clientId: `txn-v2-${randomUUID().slice(0, 8)}`, brokers: brokers(), logLevel: logLevel.NOTHING });

async function topic(partitions = 3): Promise<string> {
  const name = `txn-v2.${randomUUID().slice(0, 8)}`;
  const admin = kafka.admin();
  await admin.connect();
  try {
    await createTopicsWithLeaders(admin, [{ topic: name, numPartitions: partitions }]);
  } finally {
    await admin.disconnect();
  }
  return name;
}

async function producer(transactionalId = `txn-v2-${randomUUID()}`, spacingMs = 0): Promise<TransactionalProducerV2> {
  const p = new TransactionalProducerV2(clusterOf(kafka), { transactionalId, transactionTimeoutMs: 60_000, spacingMs });
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
        // neither key nor partition (a dead letter): kafkajs's default partitioner's turn
        { topic: name, key: null, value: `n${i}` },
      ]);
      const abort = i === 7;
      await p.end(!abort);
      epochs.push(p.identity.producerEpoch);
      if (!abort) expected.push(`0:a${i}`, `1:b${i}`, `${partitionFor(key, 3)}:k${i}`, `n${i}`);
    }
    // every EndTxn (commit or abort) answered with a higher epoch, and the next transaction used it
    for (let i = 1; i < epochs.length; i++) expect(epochs[i]).toBe(epochs[i - 1]! + 1);
    // records are read in offset order: an aborted record, had it shown, would come before later committed ones
    const seen = await committed(name, expected.length);
    // keyless records: wherever the partitioner put them, each committed one once
    expect(seen.map((r) => (r.split(":")[1]!.startsWith("n") ? r.split(":")[1]! : r)).sort()).toEqual(expected.sort());
  });

  it("with spacingMs, a transaction's first request waits until that long after the last one ended (or InitProducerId)", async () => {
    // The owner's spacing (WRIT_TRANSACTION_SPACING_MS) keeps a transaction from meeting the coordinator still writing
    // the last one's markers. Measured here with a spacing far above a local round trip, so that a send that did not
    // wait (the spacing removed) is told apart: it returns in a few ms.
    const spacingMs = 150;
    const name = await topic(1);
    const p = await producer(undefined, spacingMs);
    let ended = performance.now(); // InitProducerId counts as an end (it ends the last holder's transaction)
    const waited: number[] = [];
    for (let i = 0; i < 3; i++) {
      await p.send([{ topic: name, partition: 0, key: null, value: `s${i}` }]);
      waited.push(performance.now() - ended);
      await p.send([{ topic: name, partition: 0, key: null, value: `t${i}` }]); // same transaction: no second wait
      await p.end(true);
      ended = performance.now();
    }
    // measured from just after the producer's own mark, so a few ms less than it waited
    for (const ms of waited) expect(ms).toBeGreaterThanOrEqual(spacingMs - 5);
    expect(await committed(name, 6)).toEqual(["0:s0", "0:t0", "0:s1", "0:t1", "0:s2", "0:t2"]);
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

/**
 * Sockets that lose the answer to the next request of API `apiKey` once armed:
 * the request reaches the broker and is acted on; when its answer arrives the
 * connection breaks before the client reads it (a broker or network failure
 * after the work was done). kafkajs writes each request frame in one write.
 */
function lossySockets(): { factory: ISocketFactory; loseNextAnswerTo(apiKey: number): void; lost: number[] } {
  let armed: number | null = null;
  const lost: number[] = [];
  const factory: ISocketFactory = ({ host, port, onConnect }) => {
    const socket: Socket = connect({ host, port }, onConnect);
    let losing: number | null = null;
    const write = socket.write.bind(socket) as (chunk: unknown, ...rest: unknown[]) => boolean;
    socket.write = ((chunk: unknown, ...rest: unknown[]) => {
      const b = Buffer.isBuffer(chunk) ? chunk : null;
      if (armed !== null && b !== null && b.length >= 6 && b.readInt16BE(4) === armed) {
        losing = armed;
        armed = null;
      }
      return write(chunk, ...rest);
    }) as typeof socket.write;
    const emit = socket.emit.bind(socket) as (event: string | symbol, ...args: unknown[]) => boolean;
    socket.emit = ((event: string | symbol, ...args: unknown[]) => {
      if (event === "data" && losing !== null) {
        lost.push(losing);
        losing = null;
        socket.destroy(new Error("connection lost with the answer (test)"));
        return true;
      }
      return emit(event, ...args);
    }) as typeof socket.emit;
    return socket;
  };
  return { factory, loseNextAnswerTo: (apiKey) => void (armed = apiKey), lost };
}

describe("transactions v2: answers lost after the broker acted", () => {
  const PRODUCE = 0;
  const END_TXN = 26;

  async function lossyProducer(): Promise<{ p: TransactionalProducerV2; sockets: ReturnType<typeof lossySockets> }> {
    const sockets = lossySockets();
    const lossy = new Kafka({ clientId: `txn-v2-lossy-${randomUUID().slice(0, 8)}`, brokers: brokers(), logLevel: logLevel.NOTHING, socketFactory: sockets.factory });
    const p = new TransactionalProducerV2(clusterOf(lossy), { transactionalId: `txn-v2-${randomUUID()}`, transactionTimeoutMs: 60_000 });
    onTestFinished(() => p.disconnect());
    await p.init();
    return { p, sockets };
  }

  it("a Produce whose answer is lost is sent again with the same sequence: the broker keeps one copy", async () => {
    const name = await topic(1);
    const { p, sockets } = await lossyProducer();
    await p.send([{ topic: name, partition: 0, key: null, value: "t1" }]);
    await p.end(true);
    sockets.loseNextAnswerTo(PRODUCE);
    await p.send(["t2-a", "t2-b", "t2-c"].map((value) => ({ topic: name, partition: 0, key: null, value })));
    await p.end(true);
    await p.send([{ topic: name, partition: 0, key: null, value: "t3" }]);
    await p.end(true);
    expect(sockets.lost).toEqual([PRODUCE]);
    // read in offset order: a second copy of t2 would come before t3
    expect(await committed(name, 5)).toEqual(["0:t1", "0:t2-a", "0:t2-b", "0:t2-c", "0:t3"]);
  });

  it("control: the same records sent again as a new batch (a blind replay) are two copies, and the check above sees them", async () => {
    const name = await topic(1);
    const { p, sockets } = await lossyProducer();
    const t2 = ["t2-a", "t2-b", "t2-c"].map((value) => ({ topic: name, partition: 0, key: null, value }));
    sockets.loseNextAnswerTo(PRODUCE);
    await p.send(t2);
    await p.send(t2); // what a client without idempotent resends does after a lost answer
    await p.end(true);
    expect(sockets.lost).toEqual([PRODUCE]);
    expect(await committed(name, 6)).toEqual(["0:t2-a", "0:t2-b", "0:t2-c", "0:t2-a", "0:t2-b", "0:t2-c"]);
  });

  it("an EndTxn whose answer is lost is asked again and answered as the first time; the next transaction goes on", async () => {
    const name = await topic(1);
    const { p, sockets } = await lossyProducer();
    await p.send([{ topic: name, partition: 0, key: null, value: "t1" }]);
    await p.end(true);
    const before = p.identity.producerEpoch;
    await p.send([{ topic: name, partition: 0, key: null, value: "t2" }]);
    sockets.loseNextAnswerTo(END_TXN);
    await p.end(true);
    expect(sockets.lost).toEqual([END_TXN]);
    expect(p.identity.producerEpoch).toBe(before + 1);
    await p.send([{ topic: name, partition: 0, key: null, value: "t3" }]);
    await p.end(true);
    expect(await committed(name, 3)).toEqual(["0:t1", "0:t2", "0:t3"]);
  });
});
