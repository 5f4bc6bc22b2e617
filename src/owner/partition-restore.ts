// Opening an intents partition (docs/architecture.md §5.1): look for another
// group of owners, fence the previous owner, restore the ledger partition up to
// this owner's marker, take up the `pending` entries of aborted transactions,
// heal what this transactional id may have left open, and find where intake
// resumes.
import { randomUUID } from "node:crypto";
import type { RouterConfig } from "../config.ts";
import { WritError } from "../errors.ts";
import { startOffset } from "../kafka/serial-admin.ts";
import { markerKey } from "../ledger/ledger-reader.ts";
import { PartitionLedger } from "../ledger/ledger-state.ts";
import type { Logger } from "../logger.ts";
import type { LedgerIntentEntry } from "../schemas/ledger-entry.ts";
import { mayHaveRepliedOn } from "./admission.ts";
import { transact } from "./commit-loop.ts";
import type { OwnerContext } from "./owner-context.ts";
import { type OutRecord, healRecord } from "./records.ts";
import { checkSingleWriter, checkTakeUp } from "./single-writer.ts";
import { type OwnerProducer, ownerProducer } from "./transactions.ts";

/** Transactional id of the owner of intents partition p: one per partition fences a zombie owner (no KIP-447 in kafkajs; docs/architecture.md §5.2). */
/**
 * A restore's marker and heal are sent as usual while its partition isolates records after a size refusal: they
 * carry no intent's result, are checked against their topics' limits, and a heal may touch a partition of every
 * reply topic (one request each would make every reopen slow).
 */
const NOT_ISOLATED = { isolate: false } as const;

export function transactionalIdFor(config: RouterConfig, partition: number): string {
  return `${config.groupId}.${config.topics.intents}.${partition}`;
}

/** A partition restored: its producer (connected, holding the fence), its ledger and where intake resumes. */
export interface RestoredPartition {
  producer: OwnerProducer;
  ledger: PartitionLedger;
  /** The offset intake resumes at: the ledger's progress entry, or the group's offset when that is further. */
  next: bigint;
  /** The group's committed offset. */
  groupOffset: bigint;
  /** Partitions the heal transaction touched (beside the in-doubt entries it committed again). */
  healed: number;
  /** `pending` entries of aborted transactions, taken up as in doubt. */
  inDoubt: number;
}

/**
 * The take-up check (another group of owners on the intents topic; see
 * {@link checkTakeUp}), then a new transactional producer (its InitProducerId
 * fences the previous owner and aborts its open transaction), a marker in
 * ledger partition p, the ledger restored from the topic up to that marker,
 * the in-doubt scan, the ledger's check (its progress entry, see
 * {@link checkSingleWriter}), then a heal transaction touching every partition
 * this transactional id may have left a transaction open on (see
 * {@link healTargets}). `released` is asked before the fence: a partition
 * released meanwhile must not fence its new owner. The producer is
 * disconnected if anything fails.
 */
export async function restorePartition(ctx: OwnerContext, partition: number, log: Logger, released: () => boolean): Promise<RestoredPartition> {
  const { kafka, config, reader, admin, encoder } = ctx;
  // A released owner (a revoke, the router stopping) goes no further: no fencing, no restore, no heal.
  const stillOpen = () => {
    if (released()) throw new WritError("producer_fenced", "released while opening", { retriable: true });
  };
  // First, needing no ledger: a partition it refuses (retried every 30 s while another group cannot be told) is
  // neither fenced, nor given a marker in the ledger partition another group may share, nor read. Looking before the
  // restore rather than after it keeps checkTakeUp's argument (the look still comes after this member's join).
  if (!ctx.ablateSingleWriter && !ctx.ablateTakeUp) await checkTakeUp(() => ctx.ownerGroups(), config, partition);
  const producer = await ownerProducer(kafka, {
    transactionalId: transactionalIdFor(config, partition),
    transactionTimeoutMs: config.transactionTimeoutMs,
    protocol: config.transactionProtocol,
    spacingMs: config.transactionSpacingMs,
  });
  try {
    // Connecting runs InitProducerId, which fences whoever holds this partition now: a released owner must not.
    stillOpen();
    await producer.connect();
    stillOpen();
    const nonce = randomUUID();
    // InitProducerId fences the previous owner and aborts its open transaction; the marker is written
    // with the new epoch, and its commit marker also closes a transaction of this id left hanging on
    // ledger partition p (see healTargets).
    const marker = await ctx.codec.encode(config.topics.ledger, "LedgerEntry", {
      kind: "marker",
      partition,
      nonce,
      owner: config.instanceId,
      at: new Date().toISOString(),
    });
    await transact(ctx, partition, producer, [{ topic: config.topics.ledger, partition, key: markerKey(partition), value: marker }], null, null, undefined, NOT_ISOLATED);
    // Released during the marker's transaction (the router stopping, a revoke): no restore on readers going away.
    stillOpen();
    const restored = await reader.restore(partition, nonce, config.restoreTimeoutMs);
    stillOpen();
    // `pending` entries acknowledged in a transaction that was then aborted (its owner crashed or the transaction
    // failed): their PATCH may have gone out. Taken up as in doubt, like committed ones, and committed again.
    const inDoubt = ctx.ablateInDoubtScan ? new Map<string, LedgerIntentEntry>() : await ctx.inDoubtReader.scanInDoubt(partition, nonce, config.restoreTimeoutMs, restored);
    const ledger = new PartitionLedger(partition, concat(restored.entries, inDoubt));
    // Before anything else is written for it: another group's owner may be the partition's writer (its progress
    // entry says so). Needs the restored ledger, so it comes after the marker, unlike the take-up check.
    if (!ctx.ablateSingleWriter) await checkSingleWriter(ctx.admin, config, ledger, log);
    if (ledger.foreign > 0) {
      log.warn({ entries: ledger.foreign }, "ledger entries under another key than an owner writes them under (not an owner's): passed over");
    }
    if (inDoubt.size > 0) {
      // Aborted records are anyone's (no schema bounds their keys): each key as long as an intent key at most.
      const intentKeys = [...inDoubt.keys()].slice(0, 20).map((k) => k.slice(0, 64));
      log.warn({ entries: inDoubt.size, intentKeys }, "pending entries of an aborted transaction found; taken up as in doubt (reconciled before any write)");
    }
    const again = await Promise.all([...inDoubt.values()].map((entry) => encoder.ledgerEntry(entry, partition)));
    const targets = await healTargets(ctx, ledger, partition);
    const heal = [...again, ...targets];
    // A closed owner commits no heal: its successor heals what it finds.
    stillOpen();
    if (heal.length > 0) await transact(ctx, partition, producer, heal, null, null, undefined, NOT_ISOLATED);
    const groupOffset = await startOffset(admin, config.groupId, config.topics.intents, partition);
    // The ledger's progress entry went in with the last committed results; the group's offset lags it (or,
    // written by an older version without progress entries, stands alone).
    const next = ledger.progress !== null && ledger.progress > groupOffset ? ledger.progress : groupOffset;
    return { producer, ledger, next, groupOffset, healed: targets.length, inDoubt: again.length };
  } catch (err) {
    await producer.disconnect().catch(() => undefined);
    throw err;
  }
}

/**
 * Every partition this partition's transactional id may have left a
 * transaction open on, beside the ledger partition the marker already
 * touched: each reply topic its ledger names that owners may have replied on, `writ.human`, `writ.dlq`, and
 * every other intents partition (a forward goes there; its owner skips the
 * heal record, see `isHealRecord`).
 *
 * Why this heals: a partition's last stable offset stays at the first offset
 * of the earliest transaction still open on it, and on the partition leader
 * a transaction is completed only by a control marker for the same producer
 * id (Kafka's ProducerStateManager, KIP-98). The coordinator writes markers
 * only to partitions added to the transaction being ended, and it skips a
 * partition whose leader it cannot find ("likely deleted already"), which
 * after a broker crash can leave a committed transaction without its marker
 * forever. A transaction of the same transactional id (same producer id,
 * epoch bumped by InitProducerId) that writes to that partition and commits
 * gets a marker there, and that marker completes the producer's open
 * transaction on it, from the old first offset: the last stable offset moves.
 */
async function healTargets(ctx: OwnerContext, ledger: PartitionLedger, partition: number): Promise<OutRecord[]> {
  const { topics } = ctx.config;
  const counts = await ctx.topicDirectory.partitionCounts([...ledger.replyTopics().filter((t) => mayHaveRepliedOn(t, ctx.admission)), topics.human, topics.dlq, topics.intents]);
  const out: OutRecord[] = [];
  for (const [topic, count] of counts) {
    // A topic that takes less than a heal record (its configs say so, or it refused one: an agent's reply topic of
    // max.message.bytes 0) holds no transaction of this process; a heal record there would fail every open.
    if (!ctx.encoder.limits.fits(healRecord(topic, 0))) continue;
    // Intents partitions are written by forwards (§3.1), never to the owner's own: its own needs no heal.
    for (let p = 0; p < count; p++) if (topic !== topics.intents || p !== partition) out.push(healRecord(topic, p));
  }
  return out;
}

/** The restored entries, then the in-doubt ones (later in the topic than any committed record of their keys). */
function* concat<K, V>(...maps: ReadonlyMap<K, V>[]): Generator<[K, V]> {
  for (const m of maps) yield* m;
}
