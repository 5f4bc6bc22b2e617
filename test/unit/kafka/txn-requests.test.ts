import { describe, expect, it } from "vitest";
import { askCoordinator, CoordinatorCache, forgetsCoordinator } from "../../../src/kafka/txn-requests.ts";

const broker = (nodeId: number) => ({ nodeId });
const protocolError = (type: string) => Object.assign(new Error(type), { name: "KafkaJSProtocolError", type });

describe("the transaction coordinator cache", () => {
  it("looks a transactional id's coordinator up once per cluster, then answers from the cache", async () => {
    const cache = new CoordinatorCache();
    const cluster = {};
    let lookups = 0;
    const lookup = async () => (lookups++, broker(2));
    const byNode = async (nodeId: number) => broker(nodeId);
    for (let i = 0; i < 5; i++) expect(await cache.find(cluster, "t-1", byNode, lookup)).toEqual({ nodeId: 2 });
    expect(lookups).toBe(1);
    // Another client (a producer made again) does not use the first one's entry.
    await cache.find({}, "t-1", byNode, lookup);
    expect(lookups).toBe(2);
  });

  it("looks again when the cached node is gone from the cluster's metadata", async () => {
    const cache = new CoordinatorCache();
    const cluster = {};
    let coordinator = 1;
    const lookup = async () => broker(coordinator);
    await cache.find(cluster, "t-1", async (n) => broker(n), lookup);
    coordinator = 3;
    const gone = async (nodeId: number) => {
      if (nodeId === 1) throw Object.assign(new Error("Broker 1 not found in the cached metadata"), { name: "KafkaJSBrokerNotFound" });
      return broker(nodeId);
    };
    expect(await cache.find(cluster, "t-1", gone, lookup)).toEqual({ nodeId: 3 });
    expect(cache.cached("t-1")).toBe(3);
  });

  it("forgets the coordinator on coordinator errors and on no answer, not on other protocol errors", async () => {
    for (const type of ["NOT_COORDINATOR_FOR_GROUP", "GROUP_COORDINATOR_NOT_AVAILABLE", "GROUP_LOAD_IN_PROGRESS"]) expect(forgetsCoordinator(protocolError(type))).toBe(true);
    expect(forgetsCoordinator(Object.assign(new Error("closed"), { name: "KafkaJSConnectionClosedError" }))).toBe(true);
    expect(forgetsCoordinator(Object.assign(new Error("timeout"), { name: "KafkaJSRequestTimeoutError" }))).toBe(true);
    for (const type of ["INVALID_PRODUCER_EPOCH", "PRODUCER_FENCED", "CONCURRENT_TRANSACTIONS", "INVALID_TXN_STATE"]) expect(forgetsCoordinator(protocolError(type))).toBe(false);

    const cache = new CoordinatorCache();
    const cluster = {};
    await cache.find(cluster, "t-1", async (n) => broker(n), async () => broker(1));
    await expect(askCoordinator(cache, "t-1", async () => Promise.reject(protocolError("PRODUCER_FENCED")), { retryConcurrent: false })).rejects.toThrow("PRODUCER_FENCED");
    expect(cache.cached("t-1")).toBe(1);
    await expect(askCoordinator(cache, "t-1", async () => Promise.reject(protocolError("NOT_COORDINATOR_FOR_GROUP")), { retryConcurrent: false })).rejects.toThrow();
    expect(cache.cached("t-1")).toBeUndefined();
  });

  it("asks again in place while the coordinator answers CONCURRENT_TRANSACTIONS, with growing waits, then gives up", async () => {
    const cache = new CoordinatorCache();
    const waits: number[] = [];
    const sleep = async (ms: number) => void waits.push(ms);
    let calls = 0;
    const busyTwice = async () => {
      if (++calls <= 2) throw protocolError("CONCURRENT_TRANSACTIONS");
      return "added";
    };
    expect(await askCoordinator(cache, "t-1", busyTwice, { retryConcurrent: true, sleep })).toBe("added");
    expect(waits).toEqual([1, 2]);

    waits.length = 0;
    const alwaysBusy = async () => Promise.reject(protocolError("CONCURRENT_TRANSACTIONS"));
    await expect(askCoordinator(cache, "t-1", alwaysBusy, { retryConcurrent: true, sleep })).rejects.toThrow("CONCURRENT_TRANSACTIONS");
    // 1 … 128 ms, then 128 ms at a time, until 5 s of waiting in all.
    expect(waits.slice(0, 9)).toEqual([1, 2, 4, 8, 16, 32, 64, 128, 128]);
    expect(waits.reduce((a, b) => a + b, 0)).toBe(5_000);
    expect(Math.max(...waits)).toBe(128);
    // EndTxn is not asked again: its CONCURRENT_TRANSACTIONS goes to the caller.
    calls = 0;
    await expect(askCoordinator(cache, "t-1", busyTwice, { retryConcurrent: false, sleep })).rejects.toThrow("CONCURRENT_TRANSACTIONS");
    expect(calls).toBe(1);
  });
});
