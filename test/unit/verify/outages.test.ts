// How writ verify tells a tool's failure from an outage of Kafka, the registry or the system of record that is over
// by the time the scenario failed: the signs it records as they happen, and what a failed scenario becomes with them.
import { createServer as createHttpServer } from "node:http";
import { createServer } from "node:net";
import type { AddressInfo } from "node:net";
import { logLevel } from "kafkajs";
import { pino } from "pino";
import { describe, expect, it, onTestFinished } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import type { WritError } from "../../../src/errors.ts";
import { kafkaLogging, OWNER_GROUPS_WATCH, type KafkaLogEntry } from "../../../src/kafka-log.ts";
import { startFaultProxy } from "../../../src/verify/fault-proxy.ts";
import { attributeFailure, describeOutage, kafkaOutageSign, OutageWatch, type OutageSign, type OutageSigns } from "../../../src/verify/outages.ts";
import { formatReport, type ScenarioReport, type VerifyReport } from "../../../src/verify/report.ts";

const entry = (namespace: string, level: logLevel, message: string, extra: Record<string, unknown> = {}): KafkaLogEntry => ({ namespace, level, message, extra });
/** The sign's message, where the entry is one. */
const kafkaOutageMessage = (e: KafkaLogEntry) => kafkaOutageSign(e)?.message ?? null;

describe("the kafkajs log entries that are signs of a broker outage", () => {
  it("a connection the broker closed (said only at debug level), a connection refused or timed out, a request timed out, and what kafkajs retries or crashes on for them", () => {
    expect(kafkaOutageMessage(entry("Connection", logLevel.DEBUG, "Kafka server has closed connection", { broker: "127.0.0.1:9092" }))).toBe("the broker closed a connection (127.0.0.1:9092)");
    expect(kafkaOutageMessage(entry("Connection", logLevel.ERROR, "Connection error: connect ECONNREFUSED 127.0.0.1:9092"))).toBe("Connection error: connect ECONNREFUSED 127.0.0.1:9092");
    expect(kafkaOutageMessage(entry("Connection", logLevel.ERROR, "Connection timeout"))).toBe("Connection timeout");
    expect(kafkaOutageMessage(entry("Producer", logLevel.ERROR, "Failed to send messages: Closed connection", { retryCount: 0 }))).toBe("Failed to send messages: Closed connection");
    expect(kafkaOutageMessage(entry("Producer", logLevel.ERROR, "Request Produce(key: 0, version: 7) timed out", { retryCount: 1 }))).toBe("Request Produce(key: 0, version: 7) timed out");
    expect(kafkaOutageMessage(entry("BrokerPool", logLevel.ERROR, "Failed to connect to seed broker, trying another broker from the list: Connection error: connect ECONNREFUSED"))).not.toBeNull();
    expect(kafkaOutageMessage(entry("Consumer", logLevel.ERROR, "Crash: KafkaJSNumberOfRetriesExceeded: Connection error: read ECONNRESET"))).not.toBeNull();
    // The cause given as a field.
    expect(kafkaOutageMessage(entry("Admin", logLevel.WARN, "Could not create topics", { error: "Closed connection" }))).toBe("Could not create topics: Closed connection");
  });

  it("not a broker that answered (a leader moving, a coordinator loading, a rebalance), nor routine debug entries or our own disconnects", () => {
    expect(kafkaOutageMessage(entry("Connection", logLevel.ERROR, "Response Fetch(key: 1, version: 11)", { error: "This server is not the leader for that topic-partition" }))).toBeNull();
    expect(kafkaOutageMessage(entry("Runner", logLevel.WARN, "The group is rebalancing, re-joining"))).toBeNull();
    expect(kafkaOutageMessage(entry("Cluster", logLevel.ERROR, "The coordinator is loading", { error: "COORDINATOR_LOAD_IN_PROGRESS" }))).toBeNull();
    for (const debug of ["Connecting", "Request Fetch(key: 1, version: 11)", "disconnecting...", "disconnected"]) {
      expect(kafkaOutageMessage(entry("Connection", logLevel.DEBUG, debug))).toBeNull();
    }
    // Text that would match, below warn, is not a sign: only the closed connection is said at debug level.
    expect(kafkaOutageMessage(entry("Consumer", logLevel.INFO, "Connection timeout"))).toBeNull();
  });

  it("a tapped client logs at debug, so the tap sees the closed connection; only what is within the client's level reaches its logger", () => {
    const lines: string[] = [];
    const logger = pino({ level: "debug" }, { write: (l: string) => void lines.push(l) });
    const seen: KafkaLogEntry[] = [];
    const { logLevel: level, logCreator } = kafkaLogging(logger, logLevel.WARN, (e) => void seen.push(e));
    expect(level).toBe(logLevel.DEBUG);
    const log = logCreator(level);
    log({ namespace: "Connection", level: logLevel.DEBUG, label: "DEBUG", log: { timestamp: "", message: "Kafka server has closed connection", broker: "b:1" } });
    log({ namespace: "Connection", level: logLevel.ERROR, label: "ERROR", log: { timestamp: "", message: "Connection timeout" } });
    expect(seen.map((e) => [e.message, e.extra.broker])).toEqual([
      ["Kafka server has closed connection", "b:1"],
      ["Connection timeout", undefined],
    ]);
    // The logger, at debug itself, got the error only: the client logs at warn.
    expect(lines.map((l) => (JSON.parse(l) as { msg: string }).msg)).toEqual(["Connection timeout"]);
    // Without a tap: the client's level, as before.
    expect(kafkaLogging(logger, logLevel.WARN).logLevel).toBe(logLevel.WARN);
    // A tap that throws does not reach kafkajs.
    const throwing = kafkaLogging(logger, logLevel.WARN, () => {
      throw new Error("tap");
    }).logCreator(logLevel.DEBUG);
    expect(() => throwing({ namespace: "Connection", level: logLevel.ERROR, label: "ERROR", log: { timestamp: "", message: "Connection timeout" } })).not.toThrow();
  });
});

describe("the owner's minute's watch for other groups of owners", () => {
  it("is no sign: its ListGroups reaches every broker in the metadata, also one the run never uses; the owner's own clients' errors still are", () => {
    const watch = new OutageWatch();
    const from = watch.mark();
    const logger = pino({ level: "silent" });
    // As the router makes them: the watch's client named, the owner's other clients not.
    const watchLog = kafkaLogging(logger, logLevel.WARN, watch.kafkaTap("the owner"), OWNER_GROUPS_WATCH).logCreator(logLevel.DEBUG);
    const ownerLog = kafkaLogging(logger, logLevel.WARN, watch.kafkaTap("the owner")).logCreator(logLevel.DEBUG);
    const unreachable = { timestamp: "", message: "Connection error: getaddrinfo ENOTFOUND kafka-3.internal", broker: "kafka-3.internal:9092", clientId: "writ-verify-owner-groups-watch" };
    watchLog({ namespace: "Connection", level: logLevel.ERROR, label: "ERROR", log: unreachable });
    watchLog({ namespace: "BrokerPool", level: logLevel.ERROR, label: "ERROR", log: { timestamp: "", message: "Failed to connect to broker: Connection error: getaddrinfo ENOTFOUND kafka-3.internal" } });
    expect(watch.since(from)).toMatchObject({ count: 0, signs: [] });
    // A tool that never answers stays a failure, however often the watch fails.
    expect(attributeFailure(scenarioReport(), watch.since(from))).toMatchObject({ status: "fail" });
    // The same error from the owner's own client (its take-up look, its consumer) counts.
    ownerLog({ namespace: "Connection", level: logLevel.ERROR, label: "ERROR", log: { ...unreachable, clientId: "writ-verify" } });
    expect(watch.since(from)).toMatchObject({ count: 1, bySource: { kafka: 1 } });
  });
});

describe("Kafka's routine: a connection the broker closed, a request kafkajs retries", () => {
  const closed = entry("Connection", logLevel.DEBUG, "Kafka server has closed connection", { broker: "127.0.0.1:9092" });
  const retriedTimeout = entry("Producer", logLevel.ERROR, "Request Produce(key: 0, version: 7) timed out", { retryCount: 0, retryTime: 300 });
  const retriedClose = entry("Producer", logLevel.ERROR, "Failed to send messages: Closed connection", { retryCount: 1 });
  const refused = entry("Connection", logLevel.ERROR, "Connection error: connect ECONNREFUSED 127.0.0.1:9092");

  it("is routine: a connection error, a failed connect or a crash (a request kafkajs gave up on) is not, retried or not", () => {
    for (const e of [closed, retriedTimeout, retriedClose]) expect(kafkaOutageSign(e), e.message).toMatchObject({ routine: true });
    const notRoutine = [
      refused,
      entry("BrokerPool", logLevel.ERROR, "Failed to connect to seed broker, trying another broker from the list: Connection error: connect ECONNREFUSED", { retryCount: 2 }),
      // A connect whose connection was taken and closed at once (a broker going down, a load balancer without one).
      entry("BrokerPool", logLevel.ERROR, "Closed connection", { retryCount: 0 }),
      entry("Connection", logLevel.ERROR, "Connection timeout"),
      entry("Connection", logLevel.ERROR, "Connection error: read ECONNRESET"),
      entry("Consumer", logLevel.ERROR, "Crash: KafkaJSNumberOfRetriesExceeded: Request Fetch(key: 1, version: 11) timed out", { retryCount: 5 }),
    ];
    for (const e of notRoutine) expect(kafkaOutageSign(e), e.message).toMatchObject({ routine: false });
  });

  it("alone during a failed scenario, is no outage: the scenario stays a failure (an adapter that never answers, a scenario long enough for an idle close)", () => {
    const watch = new OutageWatch();
    const from = watch.mark();
    for (const e of [closed, retriedTimeout, retriedClose]) watch.kafkaTap("the owner")(e);
    expect(watch.since(from)).toMatchObject({ count: 0, signs: [] });
    // Before, the broker's idle close alone made it incomplete.
    expect(attributeFailure(scenarioReport(), watch.since(from))).toMatchObject({ status: "fail" });
  });

  it("beside a connection error during the same scenario, counts with it", () => {
    const watch = new OutageWatch();
    watch.kafkaTap("agent")(refused);
    const from = watch.mark();
    watch.kafkaTap("the owner")(closed);
    // A connection error of the scenario before does not make this one's close count.
    expect(watch.since(from).count).toBe(0);
    watch.kafkaTap("agent-a")(refused);
    expect(watch.since(from)).toMatchObject({ count: 2, bySource: { kafka: 2 } });
    expect(attributeFailure(scenarioReport(), watch.since(from))).toMatchObject({
      status: "incomplete",
      outage: "Kafka (seen by the owner, agent-a: the broker closed a connection (127.0.0.1:9092)); 2 signs in all",
    });
  });
});

describe("the outage watch", () => {
  const sign = (n: number, what = "Kafka"): OutageSign => ({ what, source: "kafka", seenBy: "the owner", message: `sign ${n}` });

  it("gives the signs since a mark: those of one scenario, not the one before", () => {
    const watch = new OutageWatch();
    watch.note(sign(1));
    const from = watch.mark();
    expect(watch.since(from)).toEqual({ count: 0, bySource: { kafka: 0, registry: 0, system: 0 }, signs: [] });
    watch.note(sign(2));
    watch.kafkaTap("agent-a")(entry("Connection", logLevel.ERROR, "Connection timeout"));
    watch.kafkaTap("agent-a")(entry("Connection", logLevel.DEBUG, "Request Fetch(key: 1, version: 11)"));
    expect(watch.since(from)).toEqual({
      count: 2,
      bySource: { kafka: 2, registry: 0, system: 0 },
      signs: [sign(2), { what: "Kafka", source: "kafka", seenBy: "agent-a", message: "Connection timeout", routine: false }],
    });
  });

  it("keeps a bounded number of signs, and still counts every one (a long outage logs one per reconnect)", () => {
    const watch = new OutageWatch();
    const from = watch.mark();
    for (let i = 0; i < 1000; i++) watch.note(sign(i));
    const { count, signs } = watch.since(from);
    expect(count).toBe(1000);
    expect(signs.length).toBeLessThan(1000);
    expect(signs.at(-1)).toEqual(sign(999));
  });

  it("describes the signs by what failed and who saw it", () => {
    const text = describeOutage({
      count: 3,
      signs: [
        { what: "Kafka", source: "kafka", seenBy: "the owner", message: "Connection timeout" },
        { what: "Kafka", source: "kafka", seenBy: "agent", message: "Closed connection" },
        { what: "the schema registry", source: "registry", seenBy: "the owner", message: "could not look up schema id 7" },
      ],
    });
    expect(text).toBe("Kafka (seen by the owner, agent: Connection timeout); the schema registry (seen by the owner: could not look up schema id 7); 3 signs in all");
  });
});

function scenarioReport(fields: Partial<ScenarioReport> = {}): ScenarioReport {
  return {
    scenario: "duplicate-submission",
    ok: false,
    status: "fail",
    harm: false,
    outageCanExplain: "any",
    effects: 1,
    expectedEffects: 1,
    conflicts: 0,
    lostUpdates: [],
    duplicates: [],
    patchesSent: 1,
    replies: ["unknown (no reply before the deadline)"],
    faultInjection: null,
    problems: ["every submission should be answered applied; got unknown (no reply before the deadline)"],
    notes: [],
    durationMs: 5000,
    ...fields,
  };
}

describe("a failed scenario, and the signs seen during it", () => {
  const kafka: OutageSigns = { count: 2, bySource: { kafka: 2, registry: 0, system: 0 }, signs: [{ what: "Kafka", source: "kafka", seenBy: "the owner", message: "Closed connection" }] };

  it("with none, stays a failure of the tool", () => {
    const failed = scenarioReport();
    expect(attributeFailure(failed, { count: 0, bySource: { kafka: 0, registry: 0, system: 0 }, signs: [] })).toBe(failed);
  });

  it("with some, and only replies or effects that did not come, is incomplete, naming the outage", () => {
    expect(attributeFailure(scenarioReport(), kafka)).toMatchObject({ ok: false, status: "incomplete", outage: "Kafka (seen by the owner: Closed connection); 2 signs in all" });
  });

  it("with some, but harm proven at the system of record, stays a failure, with a note naming the outage", () => {
    const lost = attributeFailure(scenarioReport({ harm: true, outageCanExplain: "none", problems: ["lost update: …"] }), kafka);
    expect(lost).toMatchObject({ status: "fail", notes: ["an outage during it (Kafka (seen by the owner: Closed connection); 2 signs in all) does not explain what the system of record shows"] });
    expect(lost.outage).toBeUndefined();
  });

  it("a rejection or an escalation (outageCanExplain system): only the system of record's outage explains it, not Kafka's nor the registry's", () => {
    const refused = scenarioReport({ outageCanExplain: "system", replies: ["rejected (sor_rejected: 422)"], problems: ["the owner should settle …; it answered rejected (sor_rejected: 422)"] });
    const registry: OutageSigns = { count: 1, bySource: { kafka: 0, registry: 1, system: 0 }, signs: [{ what: "the schema registry", source: "registry", seenBy: "the owner", message: "503" }] };
    // Before: incomplete for either.
    for (const transport of [kafka, registry]) {
      expect(attributeFailure(refused, transport)).toMatchObject({ status: "fail", notes: [expect.stringMatching(/does not explain a rejection or an escalation, which only the system of record failing leads to$/)] });
    }
    const system: OutageSign = { what: "the system of record helpdesk (http://127.0.0.1:1)", source: "system", seenBy: "the fault proxy", message: "PATCH /records/ticket/T-1: ECONNREFUSED" };
    const both: OutageSigns = { count: 3, bySource: { kafka: 2, registry: 0, system: 1 }, signs: [...kafka.signs, system] };
    // Named by the outage that explains it alone.
    expect(attributeFailure(refused, both)).toMatchObject({ status: "incomplete", outage: "the system of record helpdesk (http://127.0.0.1:1) (seen by the fault proxy: PATCH /records/ticket/T-1: ECONNREFUSED)" });
  });

  it("a failure of the tool or its fixture (outageCanExplain none) stays a failure beside any outage", () => {
    const own = scenarioReport({ outageCanExplain: "none", problems: ["the fault never fired: …"] });
    const system: OutageSigns = { count: 1, bySource: { kafka: 0, registry: 0, system: 1 }, signs: [{ what: "the system of record helpdesk", source: "system", seenBy: "the fault proxy", message: "502" }] };
    for (const signs of [kafka, system]) {
      expect(attributeFailure(own, signs)).toMatchObject({ status: "fail", notes: [expect.stringMatching(/does not explain its problems, which are the tool's, its adapter's or its fixture's$/)] });
    }
  });

  it("a scenario that passed is left as it is", () => {
    const passed = scenarioReport({ ok: true, status: "pass", problems: [] });
    expect(attributeFailure(passed, kafka)).toBe(passed);
  });

  it("the table shows it incomplete, says it was not judged and why, and the run is INCOMPLETE", () => {
    const scenario = attributeFailure(scenarioReport(), kafka);
    const report: VerifyReport = {
      ok: false,
      status: "incomplete",
      runId: "wv-0a1b2c",
      startedAt: "2026-01-01T00:00:00.000Z",
      durationMs: 6000,
      brokers: ["127.0.0.1:9092"],
      systems: [],
      tools: [{ tool: "tag_ticket", system: "helpdesk", entity: "ticket:T-verify", ok: false, status: "incomplete", effects: 1, conflicts: 0, lostUpdates: [], scenarios: [scenario], problems: [] }],
      summary: { pass: 0, fail: 0, incomplete: 1, notRun: 0 },
    };
    const text = formatReport(report);
    expect(text).toContain("writ verify wv-0a1b2c: INCOMPLETE");
    expect(text).toMatch(/tag_ticket\s+duplicate-submission\s+incomplete/);
    expect(text).toContain("duplicate-submission: not judged: it failed during an outage of Kafka (seen by the owner: Closed connection); 2 signs in all; run it again");
  });
});

describe("the fault proxy, when its system cannot be reached", () => {
  it("answers 502 and says so to onUnreachable: the system's outage, not the tool's", async () => {
    // A port nothing listens on: taken, then let go.
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve));
    const { port } = holder.address() as AddressInfo;
    await new Promise<void>((resolve) => holder.close(() => resolve()));
    const seen: string[] = [];
    const proxy = await startFaultProxy({ upstream: `http://127.0.0.1:${port}`, onUnreachable: (req, message) => void seen.push(`${req.method} ${req.path}: ${message}`) });
    onTestFinished(() => proxy.close());
    const res = await fetch(`${proxy.url}/records/ticket/T-1`, { method: "PATCH", body: "[]" });
    expect(res.status).toBe(502);
    expect(seen).toEqual([expect.stringMatching(/^PATCH \/records\/ticket\/T-1: .*ECONNREFUSED/)]);
  });
});

describe("the owner's codec, when the registry does not answer", () => {
  it("tells onUnreachable of no answer and of a 5xx or 429, not of a 4xx (the registry answering: a login it refuses)", async () => {
    let status = 503;
    const registry = createHttpServer((_req, res) => res.writeHead(status, { "content-type": "application/json" }).end("{}"));
    await new Promise<void>((resolve) => registry.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => registry.close(() => resolve())));
    const heard: WritError[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: `http://127.0.0.1:${(registry.address() as AddressInfo).port}`, onUnreachable: (err) => void heard.push(err) });
    // A value framed with a schema id the codec has not seen: it asks the registry which subjects the id is under.
    const framed = (id: number) => Buffer.concat([Buffer.from([0, 0, 0, 0, id]), Buffer.from("{}")]);
    await expect(codec.decode("Reply", framed(7))).rejects.toMatchObject({ code: "registry_unavailable" });
    expect(heard.map((e) => e.message)).toEqual(["looking up schema id 7 answered 503"]);
    status = 403;
    await expect(codec.decode("Reply", framed(8))).rejects.toMatchObject({ code: "registry_unavailable" });
    expect(heard).toHaveLength(1);
  });
});
