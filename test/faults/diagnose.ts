import { Kafka, logLevel } from "kafkajs";
import { TxnAdmin } from "../../src/kafka/txn-admin.ts";
import type { OwnerFleet } from "./owner-fleet.ts";

/**
 * Why a run stopped settling, from outside: the owners alive, whether the
 * records server answers, each reply partition's two ends (an open or
 * hanging transaction shows as a last stable offset behind the high
 * watermark, and DescribeProducers names the producer holding it), and the
 * owners' consumer lag on the intents topic.
 */
export async function diagnose(opts: {
  brokers: string[];
  replyTopics: string[];
  topics: { intents: string; ledger: string };
  fleet: OwnerFleet;
  recordsUrl: string;
  groupId: string;
}): Promise<string[]> {
  const out: string[] = [`owners alive: ${opts.fleet.alive}`];
  const records = await fetch(`${opts.recordsUrl}/_admin/stats`, { signal: AbortSignal.timeout(3000) }).then(
    (r) => `answers ${r.status}`,
    (err: unknown) => `does not answer (${(err as Error).message})`,
  );
  out.push(`records server ${records}`);
  const txn = new TxnAdmin({ brokers: opts.brokers, clientId: "fault-diagnose", maxAttempts: 2 });
  const kafka = new Kafka({ clientId: "fault-diagnose", brokers: opts.brokers, logLevel: logLevel.NOTHING });
  const admin = kafka.admin();
  try {
    await admin.connect();
    const tps = [];
    for (const t of [...opts.replyTopics, opts.topics.ledger]) {
      const meta = await admin.fetchTopicMetadata({ topics: [t] });
      for (const p of meta.topics[0]!.partitions) tps.push({ topic: t, partition: p.partitionId });
    }
    const ends = await txn.listOffsets(tps);
    const stuck = ends.filter((e) => e.lastStable < e.highWatermark);
    if (stuck.length === 0) out.push("no reply or ledger partition has an open transaction");
    const producers = stuck.length > 0 ? await txn.describeProducers(stuck) : [];
    for (const e of stuck) {
      const open = producers.find((p) => p.topic === e.topic && p.partition === e.partition)?.activeProducers.filter((a) => a.currentTxnStartOffset >= 0n) ?? [];
      out.push(
        `${e.topic}-${e.partition}: last stable offset ${e.lastStable} < high watermark ${e.highWatermark}; open transactions: ` +
          (open.map((a) => `producer ${a.producerId} epoch ${a.producerEpoch} from offset ${a.currentTxnStartOffset}`).join(", ") || "none reported"),
      );
    }
    const committed = await admin.fetchOffsets({ groupId: opts.groupId, topics: [opts.topics.intents] });
    const high = await admin.fetchTopicOffsets(opts.topics.intents);
    for (const p of committed[0]?.partitions ?? []) {
      const h = high.find((x) => x.partition === p.partition)?.high ?? "?";
      out.push(`${opts.topics.intents}-${p.partition}: committed ${p.offset}, end ${h}`);
    }
  } catch (err) {
    out.push(`could not read the cluster: ${(err as Error).message}`);
  } finally {
    await admin.disconnect().catch(() => undefined);
    await txn.close().catch(() => undefined);
  }
  return out;
}
