/**
 * Two fixes to kafkajs's transactional requests, which writ's owner sends
 * back to back under transactions v1 (a transaction is AddPartitionsToTxn,
 * Produce, EndTxn, and every few a TxnOffsetCommit; src/owner/transactions.ts).
 * Under transactions v2 (txn-v2.ts) the owner sends its own Produce and EndTxn
 * and uses the first fix, the cached coordinator, for InitProducerId and EndTxn.
 *
 * 1. The transaction coordinator is kept until it says otherwise, as the Java
 *    client's TransactionManager does. kafkajs 2.2.4 (its last release) sends
 *    FindCoordinator before every InitProducerId, AddPartitionsToTxn,
 *    AddOffsetsToTxn and EndTxn (`findTransactionCoordinator()` in its
 *    eosManager calls `cluster.findGroupCoordinator`, which asks a broker each
 *    time): measured, 2.17 FindCoordinator requests per transaction, five round
 *    trips where three do.
 * 2. kafkajs #304: right after EndTxn the coordinator is still writing the
 *    markers and answers the next AddPartitionsToTxn (or AddOffsetsToTxn)
 *    CONCURRENT_TRANSACTIONS. kafkajs fails the send, refreshes the metadata,
 *    logs an error and tries again after its retry delay. Here the request is
 *    asked again in place after 1, 2, 4 … ms. Measured on one producer
 *    committing back to back (local broker): 3.14 ms a transaction as kafkajs
 *    does it; 6.47 ms with the coordinator cached alone (the lookup had been
 *    giving the markers time, now every second AddPartitionsToTxn met
 *    CONCURRENT_TRANSACTIONS and went through kafkajs's retry); 2.21 ms with
 *    both, and no metadata refreshes.
 *
 * {@link patchTransactionalRequests} patches two kafkajs internals once per
 * process (kafkajs is pinned at 2.2.4 and will not change under it):
 * - `Cluster.findGroupCoordinator` for coordinator type TRANSACTION answers
 *   from a cache of `transactionalId → coordinator node` held per cluster (a
 *   cluster is one client's); group coordinators (consumers, TxnOffsetCommit)
 *   are looked up as before.
 * - The Broker's requests to a transaction coordinator retry
 *   CONCURRENT_TRANSACTIONS in place (AddPartitionsToTxn, AddOffsetsToTxn),
 *   and forget the cached node for their transactional id when they fail with
 *   a coordinator error (NOT_COORDINATOR, COORDINATOR_NOT_AVAILABLE,
 *   COORDINATOR_LOAD_IN_PROGRESS) or without an answer (connection lost,
 *   request timeout): kafkajs's retry, or writ's owner reopening the
 *   partition, then looks it up afresh.
 * Fencing is untouched: it rides on the producer id and epoch, which the
 * coordinator checks on every request, not on how the client found it.
 */
import { createRequire } from "node:module";
import { setTimeout as sleep } from "node:timers/promises";
import { backoffMs } from "../retry.ts";

const require = createRequire(import.meta.url);

interface BrokerLike {
  nodeId: number;
}
interface ClusterLike {
  findGroupCoordinator(args: { groupId: string; coordinatorType?: number }): Promise<BrokerLike>;
  findBroker(args: { nodeId: number }): Promise<BrokerLike>;
}
type ClusterClass = { prototype: ClusterLike };
type BrokerClass = { prototype: Record<string, (...args: unknown[]) => Promise<unknown>> };

const TRANSACTION = 1;
/** Requests kafkajs sends to the transaction coordinator; each names its transactional id. */
const COORDINATOR_REQUESTS = ["initProducerId", "addPartitionsToTxn", "addOffsetsToTxn", "endTxn"] as const;
/** Error types that say the node is not (or not yet) the coordinator (kafkajs names: codes 14, 15, 16). */
const COORDINATOR_ERRORS = new Set(["GROUP_LOAD_IN_PROGRESS", "GROUP_COORDINATOR_NOT_AVAILABLE", "NOT_COORDINATOR_FOR_GROUP"]);

let installed = false;
/**
 * CONCURRENT_TRANSACTIONS answers are asked again in place after 1, 2, 4 … 128
 * ms, then every 128 ms, until 5 s of waiting: right after a commit the markers
 * take a millisecond or two, but while a partition of the last transaction has
 * no leader (a broker down) they wait for its election, as the Java client's
 * TransactionManager keeps retrying. The only layer of these retries in writ.
 */
const CONCURRENT_WAIT_MAX_MS = 128;
const CONCURRENT_BUDGET_MS = 5_000;

/** Whether a failed request means the coordinator must be looked up again. */
export function forgetsCoordinator(err: unknown): boolean {
  const type = (err as { type?: unknown } | null)?.type;
  if (typeof type === "string") return COORDINATOR_ERRORS.has(type);
  // No protocol answer at all: a lost connection, a timeout, a broker gone from the metadata.
  return true;
}

/**
 * Transactional id → the node that coordinates it, as one cluster (one
 * kafkajs client) found it. Bounded by the transactional ids in use: one per
 * owned partition. An entry of another cluster (a producer made again after a
 * failure) is not used, but replaced.
 */
export class CoordinatorCache {
  private readonly nodes = new Map<string, { cluster: WeakRef<object>; nodeId: number }>();

  /** The cached coordinator's broker; else (or when `broker` refuses the node) `lookup`'s answer, remembered. */
  async find(cluster: object, transactionalId: string, broker: (nodeId: number) => Promise<BrokerLike>, lookup: () => Promise<BrokerLike>): Promise<BrokerLike> {
    const known = this.nodes.get(transactionalId);
    if (known !== undefined && known.cluster.deref() === cluster) {
      try {
        return await broker(known.nodeId);
      } catch {
        // Gone from the metadata or unreachable: ask the cluster again.
        this.forget(transactionalId);
      }
    }
    const found = await lookup();
    if (typeof found.nodeId === "number") this.nodes.set(transactionalId, { cluster: new WeakRef(cluster), nodeId: found.nodeId });
    return found;
  }

  forget(transactionalId: string): void {
    this.nodes.delete(transactionalId);
  }

  /** The node cached for `transactionalId`, if any. */
  cached(transactionalId: string): number | undefined {
    return this.nodes.get(transactionalId)?.nodeId;
  }
}

/**
 * One request to the transaction coordinator of `transactionalId`: with
 * `retryConcurrent`, CONCURRENT_TRANSACTIONS (kafkajs #304: the previous
 * transaction's markers are still being written) is asked again in place after
 * 1, 2, 4 … 128 ms, then every 128 ms for up to {@link CONCURRENT_BUDGET_MS},
 * instead of failing the send, which kafkajs answers with a
 * metadata refresh, an error log line and its own, longer, retry delay. A
 * coordinator error or no answer forgets the cached coordinator.
 */
export async function askCoordinator<T>(
  cache: CoordinatorCache,
  transactionalId: string | undefined,
  request: () => Promise<T>,
  opts: { retryConcurrent: boolean; sleep?: (ms: number) => Promise<unknown> },
): Promise<T> {
  const wait = opts.sleep ?? sleep;
  try {
    for (let attempt = 0, waited = 0; ; attempt++) {
      try {
        return await request();
      } catch (err) {
        if (!opts.retryConcurrent || (err as { type?: unknown }).type !== "CONCURRENT_TRANSACTIONS" || waited >= CONCURRENT_BUDGET_MS) throw err;
        const ms = Math.min(backoffMs(attempt + 1, { initialDelayMs: 1, maxDelayMs: CONCURRENT_WAIT_MAX_MS, jitter: 0 }), CONCURRENT_BUDGET_MS - waited);
        waited += ms;
        await wait(ms);
      }
    }
  } catch (err) {
    if (transactionalId !== undefined && forgetsCoordinator(err)) cache.forget(transactionalId);
    throw err;
  }
}

/** The process's cache, shared by every kafkajs client in it once patched. */
export const transactionCoordinators = new CoordinatorCache();

/** Installs both fixes (idempotent). Called before writ's owner makes a transactional producer. */
export function patchTransactionalRequests(): void {
  if (installed) return;
  installed = true;
  const Cluster = require("kafkajs/src/cluster/index.js") as ClusterClass;
  const Broker = require("kafkajs/src/broker/index.js") as BrokerClass;
  const cache = transactionCoordinators;

  const find = Cluster.prototype.findGroupCoordinator;
  Cluster.prototype.findGroupCoordinator = function (this: ClusterLike, args) {
    if (args.coordinatorType !== TRANSACTION) return find.call(this, args);
    return cache.find(
      this,
      args.groupId,
      (nodeId) => this.findBroker({ nodeId }),
      () => find.call(this, args),
    );
  };

  for (const name of COORDINATOR_REQUESTS) {
    const request = Broker.prototype[name];
    if (typeof request !== "function") throw new Error(`kafkajs Broker.${name} is missing: writ's transactional request patch does not fit this kafkajs`);
    const retryConcurrent = name === "addPartitionsToTxn" || name === "addOffsetsToTxn";
    Broker.prototype[name] = function (this: unknown, ...args: unknown[]) {
      const id = (args[0] as { transactionalId?: unknown } | undefined)?.transactionalId;
      return askCoordinator(cache, typeof id === "string" ? id : undefined, () => request.apply(this, args), { retryConcurrent });
    };
  }
}
