import { describe, expect, it } from "vitest";
import { brokerRequestCounts, perRequest, requestsBetween, startRequestCount, sumRequests } from "../../../bench/broker-requests.ts";

describe("bench broker request counts", () => {
  it("turns two counts into requests per request, largest first, under 0.01 left out", () => {
    const during = requestsBetween({ Produce: 100, EndTxn: 10, Fetch: 5 }, { Produce: 400, EndTxn: 160, Fetch: 5, Metadata: 1 });
    expect(during).toEqual({ Produce: 300, EndTxn: 150, Fetch: 0, Metadata: 1 });
    const per = perRequest(during, 300);
    expect(per).toEqual({ Produce: 1, EndTxn: 0.5 });
    expect(Object.keys(per ?? {})).toEqual(["Produce", "EndTxn"]);
  });

  it("sums two loops' requests, and gives null when either count is missing", () => {
    expect(sumRequests({ Produce: 2, Fetch: 1 }, { Produce: 3, EndTxn: 1 })).toEqual({ Produce: 5, Fetch: 1, EndTxn: 1 });
    expect(sumRequests(null, { Produce: 1 })).toBeNull();
    expect(requestsBetween({ Produce: 1 }, null)).toBeNull();
    expect(perRequest(null, 10)).toBeNull();
    expect(perRequest({ Produce: 10 }, 0)).toBeNull();
  });

  it("gives null without a broker pid, and says why, without signalling it, for a process that is no JVM", async () => {
    const said: string[] = [];
    expect(await brokerRequestCounts(undefined, (l) => said.push(l))).toBeNull();
    expect(said).toEqual([]);
    // This test process is no JVM: an attach would send it SIGQUIT, which ends a node process. It is not tried.
    expect(await brokerRequestCounts(process.pid, (l) => said.push(l))).toBeNull();
    expect(said).toEqual([`broker requests not counted: process ${process.pid} is not a JVM`]);
    expect(await brokerRequestCounts(process.pid, (l) => said.push(l))).toBeNull();
    expect(said).toHaveLength(1);
  });

  it("a count started where none can be read ends in null, and says nothing for a missing pid", async () => {
    const said: string[] = [];
    const stop = await startRequestCount(undefined, (l) => said.push(l));
    expect(await stop()).toBeNull();
    expect(said).toEqual([]);
  });
});
