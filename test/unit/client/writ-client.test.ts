// The agent client (producers/writ-client.ts) against kafkajs pieces the test
// drives by hand: the reply consumer's events and messages, and produce
// requests that complete when the test says. What the owners answer on a real
// broker is tested in test/integration.
import { generateKeyPairSync } from "node:crypto";
import type { Message } from "kafkajs";
import { afterEach, describe, expect, it, onTestFinished, vi } from "vitest";
import { z } from "zod";
import { modelResultOf } from "../../../producers/adapters/tool-bridge.ts";
import { createWritClient, MAX_UNREAD_REPLIES, type IntentInput, type WritClient } from "../../../producers/writ-client.ts";
import { WireCodec } from "../../../src/codec.ts";
import { rejectedReply } from "../../../src/owner/effects.ts";
import type { EndOffsets } from "../../../src/owner/hang-watch.ts";
import type { Reply } from "../../../src/schemas/reply.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { declareWriteTool } from "../../../src/tools.ts";
import { buildLeaseIntent } from "../../../producers/change.ts";
import { changeId } from "../../../src/keys.ts";
import { SIGNATURE_HEADER, verifyIntentSignature, type IntentSigner } from "../../../src/security/signing.ts";
import { createLogger } from "../../../src/logger.ts";

/** The kafkajs pieces of the client under test, as the fake Kafka below made them. */
const fakes = vi.hoisted(() => ({
  consumer: null as null | FakeConsumerShape,
  /** What the client asked kafkajs for when it made its reply consumer. */
  consumerOptions: null as null | { maxWaitTimeInMs?: number },
  produced: [] as { messages: Message[]; done: (err?: Error) => void }[],
  /** The offset probe never answers while set. */
  probeHangs: false,
  /** The reply consumer crashes for good before it joins its group while set. */
  crashOnRun: false,
  /** Consumer groups the client deleted. */
  deletedGroups: [] as string[],
}));
interface FakeConsumerShape {
  disconnected: boolean;
  emit(event: string, payload: unknown): void;
  deliver(message: { value: Buffer | null; offset?: string; headers?: Record<string, Buffer> }): Promise<void>;
}

vi.mock("kafkajs", async (importOriginal) => {
  const actual = await importOriginal<typeof import("kafkajs")>();
  const events = { GROUP_JOIN: "consumer.group_join", CRASH: "consumer.crash" };
  class FakeConsumer implements FakeConsumerShape {
    readonly events = events;
    private readonly handlers = new Map<string, Set<(e: unknown) => void>>();
    private eachMessage: ((p: unknown) => Promise<void>) | null = null;
    on(event: string, fn: (e: unknown) => void) {
      const set = this.handlers.get(event) ?? new Set();
      set.add(fn);
      this.handlers.set(event, set);
      return () => set.delete(fn);
    }
    emit(event: string, payload: unknown) {
      for (const fn of [...(this.handlers.get(event) ?? [])]) fn({ id: 0, type: event, timestamp: Date.now(), payload });
    }
    async connect() {}
    async subscribe() {}
    disconnected = false;
    async disconnect() {
      this.disconnected = true;
    }
    async commitOffsets() {}
    async run(opts: { eachMessage: (p: unknown) => Promise<void> }) {
      this.eachMessage = opts.eachMessage;
      // The join the client waits for, once run has returned.
      setImmediate(() => (fakes.crashOnRun ? this.emit(events.CRASH, { error: new Error("not retriable"), groupId: "g", restart: false }) : this.emit(events.GROUP_JOIN, {})));
    }
    async deliver(m: { value: Buffer | null; offset?: string; headers?: Record<string, Buffer> }) {
      await this.eachMessage!({ topic: "writ.replies.agent-1", partition: 0, message: { key: null, value: m.value, offset: m.offset ?? "0", headers: m.headers ?? {}, timestamp: "0", attributes: 0 } });
    }
  }
  class FakeKafka {
    admin() {
      return {
        connect: async () => {},
        disconnect: async () => {},
        listTopics: async () => ["writ.replies.agent-1"],
        fetchTopicMetadata: async () => ({ topics: [{ name: "writ.replies.agent-1", partitions: [{ partitionId: 0, leader: 1 }] }] }),
        fetchTopicOffsets: async () => [{ partition: 0, offset: "0", high: "0", low: "0" }],
        setOffsets: async () => {},
        deleteGroups: async (ids: string[]) => {
          fakes.deletedGroups.push(...ids);
          return ids.map((groupId) => ({ groupId, errorCode: 0 }));
        },
      };
    }
    producer() {
      return {
        connect: async () => {},
        disconnect: async () => {},
        send: ({ messages }: { messages: Message[] }) => new Promise<void>((resolve, reject) => fakes.produced.push({ messages, done: (err) => (err ? reject(err) : resolve()) })),
      };
    }
    consumer(options: { maxWaitTimeInMs?: number }) {
      fakes.consumerOptions = options;
      const c = new FakeConsumer();
      fakes.consumer = c;
      return c;
    }
  }
  return { ...actual, Kafka: FakeKafka };
});

/** A note on a ticket: free text, so a test can make an intent as large or as deep as it needs. */
const note = declareWriteTool({ name: "add_note", recordType: "ticket", system: "helpdesk", params: z.object({ text: z.string() }), intentFields: ["text"], allowedPaths: ["/notes"], keyScope: "run", versionPolicy: "strict" });

const input = (extra: Partial<IntentInput> = {}): IntentInput => ({
  tool: note,
  entity: { type: "ticket", id: "T-1" },
  runId: "run-1",
  stepId: "s1",
  baseVersion: '"v1"',
  delta: [{ op: "add", path: "/notes", value: "x" }],
  params: { text: "x" },
  ...extra,
});

/** The reply partition's ends never move: a deadline that passes is `unknown`, never `blocked`. */
const probe = {
  endOffsets: (): Promise<EndOffsets[]> =>
    fakes.probeHangs ? new Promise<never>(() => undefined) : Promise.resolve([{ topic: "writ.replies.agent-1", partition: 0, lastStable: "0", highWatermark: "0" }]),
  commitGroupOffsets: async () => {},
};

const clients: WritClient[] = [];
async function client(
  options: { maxJsonDepth?: number; maxIntentBytes?: number; replyFetchMaxWaitMs?: number; onStopped?: (err: Error) => void; signer?: IntentSigner; audience?: string } = {},
): Promise<WritClient> {
  fakes.produced.length = 0;
  const c = await createWritClient({ brokers: ["127.0.0.1:9"], agentId: "agent-1", replyTopic: "writ.replies.agent-1", offsetProbe: probe, logger: createLogger({ level: "silent" }), ...options });
  clients.push(c);
  return c;
}

/** The intents produced, in order. */
const producedIntents = () => fakes.produced.flatMap((r) => r.messages.map((m) => JSON.parse(String(m.value)) as { intentId: string; intentKey: string }));

const applied = (intentId: string, intentKey: string): Reply =>
  ({ status: "applied", intentId, intentKey, duplicate: false, at: "2025-01-01T00:00:00.000Z", entity: { type: "ticket", id: "T-1" }, state: { notes: "x" }, version: '"v2"', via: "patch" }) as Reply;

const waitFor = async (cond: () => boolean) => {
  const deadline = Date.now() + 5000;
  while (!cond()) {
    if (Date.now() > deadline) throw new Error("condition not met");
    await new Promise((r) => setImmediate(r));
  }
};

afterEach(async () => {
  vi.useRealTimers();
  fakes.probeHangs = false;
  fakes.crashOnRun = false;
  for (const c of clients.splice(0)) await c.close();
});

/** Submits `i` with an hour's deadline and completes its produce request: the submit then waits for its reply. */
async function waitingSubmit(writ: WritClient, i: IntentInput | WriteIntent = input(), timeoutMs = 3_600_000) {
  const before = fakes.produced.length;
  const waiting = writ.submit(i, { timeoutMs });
  let settled = false;
  void waiting.finally(() => (settled = true));
  await waitFor(() => fakes.produced.length === before + 1);
  fakes.produced[before]!.done();
  return { waiting, settled: () => settled, sent: producedIntents()[before]! };
}

/** The reply consumer reads `reply`. */
const deliver = (reply: object) => fakes.consumer!.deliver({ value: Buffer.from(JSON.stringify(reply)) });

describe("the agent client's reply consumer", () => {
  it("stopping for good settles every waiting submit at once with reply_consumer_stopped, and later submits fail fast", async () => {
    const told: Error[] = [];
    const writ = await client({ onStopped: (err) => told.push(err) });
    const { waiting, settled } = await waitingSubmit(writ);
    fakes.consumer!.emit("consumer.crash", { error: new Error("not retriable"), groupId: "g", restart: false });
    // Settled now, not at its hour-long deadline.
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "unknown", reason: "reply_consumer_stopped" });
    await expect(writ.submit(input({ stepId: "s2" }), { timeoutMs: 3_600_000 })).rejects.toMatchObject({ code: "reply_consumer_stopped", retriable: false });
    // Nothing more was sent: no reply to it could be read.
    expect(fakes.produced).toHaveLength(1);
    // The owner of the client hears it once (the MCP server exits for its supervisor).
    expect(told).toMatchObject([{ code: "reply_consumer_stopped" }]);
  });

  it("closing the client settles every waiting submit at once with client_closed, and later submits fail fast", async () => {
    const writ = await client();
    const { waiting, settled } = await waitingSubmit(writ);
    await writ.close();
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "unknown", reason: "client_closed" });
    await expect(writ.submit(input({ stepId: "s2" }), { timeoutMs: 3_600_000 })).rejects.toMatchObject({ code: "client_closed", retriable: false });
    expect(fakes.produced).toHaveLength(1);
  });

  it("closing the client deletes its reply consumer's group (one per client: none left behind on the brokers)", async () => {
    const writ = await client();
    fakes.deletedGroups.length = 0;
    await writ.close();
    expect(fakes.deletedGroups).toEqual([expect.stringMatching(/^writ\.client\.agent-1\.[0-9a-f-]{36}$/)]);
  });

  // Regression: the codec's background tries of a refused subject (every 60 s) outlived the client. What close()
  // stops is shown at a fake registry in test/unit/codec-registry.test.ts; here, that the client's close asks it to.
  it("closing the client closes its codec (no background registry tries left behind)", async () => {
    const closing = vi.spyOn(WireCodec.prototype, "close");
    onTestFinished(() => closing.mockRestore());
    const writ = await client();
    await writ.close();
    expect(closing).toHaveBeenCalledTimes(1);
  });

  it("waits replyFetchMaxWaitMs on a quiet reply topic (close() waits for that fetch), 1000 ms unless set; a value out of 10 to 10000 is refused naming the field", async () => {
    await client();
    expect(fakes.consumerOptions).toMatchObject({ maxWaitTimeInMs: 1000 });
    await client({ replyFetchMaxWaitMs: 100 });
    expect(fakes.consumerOptions).toMatchObject({ maxWaitTimeInMs: 100 });
    for (const bad of [5, 20_000, 1.5]) await expect(client({ replyFetchMaxWaitMs: bad })).rejects.toThrow(/replyFetchMaxWaitMs/);
  });

  it("stopping for good before it joins its group fails the client's start and disconnects it", async () => {
    fakes.crashOnRun = true;
    await expect(client()).rejects.toMatchObject({ code: "reply_consumer_stopped" });
    expect(fakes.consumer!.disconnected).toBe(true);
  });

  it("reads a reply whose record state is nested as deep as a system of record may nest it (256 levels)", async () => {
    const writ = await client();
    const { waiting, settled, sent } = await waitingSubmit(writ);
    await deliver({ ...applied(sent.intentId, sent.intentKey), state: nested(256) });
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "applied", intentId: sent.intentId });
  });

  it("one reply settles every submission of its intent id", async () => {
    const writ = await client();
    const intent = writ.buildIntent(input());
    const first = await waitingSubmit(writ, intent);
    const second = await waitingSubmit(writ, intent);
    await deliver(applied(intent.intentId, intent.intentKey));
    await waitFor(() => first.settled() && second.settled());
    await expect(first.waiting).resolves.toMatchObject({ status: "applied", intentId: intent.intentId });
    await expect(second.waiting).resolves.toMatchObject({ status: "applied", intentId: intent.intentId });
  });

  it("a crash that kafkajs restarts from leaves the waiters alone", async () => {
    const writ = await client();
    const { waiting, sent } = await waitingSubmit(writ);
    fakes.consumer!.emit("consumer.crash", { error: new Error("passing"), groupId: "g", restart: true });
    await deliver(applied(sent.intentId, sent.intentKey));
    await expect(waiting).resolves.toMatchObject({ status: "applied", intentId: sent.intentId });
  });
});

/** `levels` arrays, one in the other: a JSON value of that depth. */
const nested = (levels: number): unknown => {
  let v: unknown = "x";
  for (let i = 0; i < levels; i++) v = [v];
  return v;
};

/** How a submit ended, or `sent` as soon as it produced anything: what owners dead-letter must never be sent. */
async function refusedOrSent(submitted: Promise<unknown>): Promise<unknown> {
  let outcome: unknown;
  let settled = false;
  submitted.then(
    (r) => ((outcome = r), (settled = true)),
    (err: unknown) => ((outcome = err), (settled = true)),
  );
  await waitFor(() => settled || fakes.produced.length > 0);
  return fakes.produced.length > 0 ? "sent" : outcome;
}

describe("intents that owners dead-letter without a reply", () => {
  it("an intent nested deeper than maxJsonDepth is refused too_deep before sending; one at the limit is sent", async () => {
    const writ = await client({ maxJsonDepth: 10 });
    // The intent is an object (1), its delta an array (2) of op objects (3): a value of depth 7 makes 10.
    const deep = (levels: number) => input({ delta: [{ op: "add", path: "/notes", value: nested(levels) }] });
    expect(await refusedOrSent(writ.submit(deep(8), { timeoutMs: 3_600_000 }))).toMatchObject({ code: "too_deep", retriable: false });
    expect(await refusedOrSent(writ.submit(deep(7), { timeoutMs: 3_600_000 }))).toBe("sent");
  });

  it("an intent larger than maxIntentBytes encoded is refused too_large before sending", async () => {
    const writ = await client();
    const text = "x".repeat(300_000);
    const big = input({ params: { text }, delta: [{ op: "add", path: "/notes", value: text }] });
    expect(await refusedOrSent(writ.submit(big, { timeoutMs: 3_600_000 }))).toMatchObject({ code: "too_large", retriable: false, context: { limit: 262_144 } });
  });

  it("an intent that validation would change is refused changed_by_validation before sending: what is sent must be what is signed", async () => {
    const writ = await client();
    const unknownField = { ...writ.buildIntent(input()), note: "not in the schema" } as WriteIntent;
    expect(await refusedOrSent(writ.submit(unknownField, { timeoutMs: 3_600_000 }))).toMatchObject({ code: "changed_by_validation", retriable: false });
    const ownProto = input({ params: JSON.parse('{"text":"x","__proto__":{"admin":true}}') as Record<string, unknown> });
    expect(await refusedOrSent(writ.submit(ownProto, { timeoutMs: 3_600_000 }))).toMatchObject({ code: "changed_by_validation", retriable: false });
    // The same intent without them goes.
    expect(await refusedOrSent(writ.submit(input(), { timeoutMs: 3_600_000 }))).toBe("sent");
  });

  it("the adapters tell the model the refusal is final, not to call again", async () => {
    const writ = await client();
    const text = "x".repeat(300_000);
    const result = await refusedOrSent(modelResultOf(writ.submit(input({ params: { text } }), { timeoutMs: 3_600_000 })));
    expect(result).toMatchObject({ status: "rejected", reason: "too_large", instruction: expect.stringContaining("fails the same way") });
  });
});

describe("resolutions of intents at the owners' bounds", () => {
  /** An escalation of `intent`, as writ.human carries it. */
  const escalationOf = (intent: WriteIntent) => ({ escalationId: "esc-1", reason: "conflict_cycles_exhausted", message: "two conflict cycles", intent, cycles: 2, current: null, at: "2025-01-01T00:00:00.000Z" });
  const resolve = (writ: WritClient, intent: WriteIntent, d: Parameters<WritClient["resolve"]>[1]) => refusedOrSent(writ.resolve(escalationOf(intent) as never, d, { timeoutMs: 3_600_000 }));

  it("an intent maxJsonDepth deep is resolved with a delta as deep as an intent's may be; a delta or an intent one level deeper is refused too_deep before sending", async () => {
    const writ = await client({ maxJsonDepth: 10 });
    // The intent (1), its delta (2), an operation (3): a value of depth 7 makes 10, the limit.
    const deepest = writ.buildIntent(input({ delta: [{ op: "add", path: "/notes", value: nested(7) }] }));
    // A delta of depth 9 (the array, an operation, a value of 7) is as deep as one in an intent may be.
    const delta = [{ op: "add" as const, path: "/notes", value: nested(7) }];
    expect(await resolve(writ, deepest, { decision: "apply", baseVersion: '"v2"', delta })).toBe("sent");
    fakes.produced.length = 0;
    expect(await resolve(writ, deepest, { decision: "apply", baseVersion: '"v2"', delta: [{ op: "add", path: "/notes", value: nested(8) }] })).toMatchObject({ code: "too_deep", retriable: false });
    // An escalated intent deeper than owners admit (a forged escalation's): its resolution is past the bound too.
    const tooDeep = { ...deepest, delta: [{ op: "add", path: "/notes", value: nested(8) }] } as WriteIntent;
    expect(await resolve(writ, tooDeep, { decision: "discard" })).toMatchObject({ code: "too_deep", retriable: false, context: { limit: 11 } });
  });

  it("an intent of maxIntentBytes is resolved with a delta as large; a larger delta, or a forged escalation's larger intent, is refused too_large before sending", async () => {
    const writ = await client({ maxIntentBytes: 4_096 });
    const padded = (bytes: number) => [{ op: "add" as const, path: "/notes", value: "x".repeat(bytes - JSON.stringify([{ op: "add", path: "/notes", value: "" }]).length) }];
    const intent = writ.buildIntent(input({ delta: padded(3_600) }));
    expect(Buffer.byteLength(JSON.stringify(intent))).toSatisfy((n: number) => n > 3_900 && n <= 4_096);
    expect(await resolve(writ, intent, { decision: "apply", baseVersion: '"v2"', delta: padded(4_096), message: "m".repeat(2_000) })).toBe("sent");
    fakes.produced.length = 0;
    expect(await resolve(writ, intent, { decision: "apply", baseVersion: '"v2"', delta: padded(4_097) })).toMatchObject({ code: "too_large", retriable: false });
    const forged = { ...intent, params: { text: "x".repeat(30_000) } } as WriteIntent;
    expect(await resolve(writ, forged, { decision: "discard" })).toMatchObject({ code: "too_large", retriable: false, context: { limit: 2 * 4_096 + 20 * 1024 } });
  });
});

describe("a submit's deadline", () => {
  /** Only the timers the client's deadlines use are faked: the test's own waits, and the consumer's, stay real. */
  const fakeDeadlines = () => vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });

  /** `p`, with a flag that says whether it has settled. */
  const watched = <T>(p: Promise<T>) => {
    const w = { settled: false, p };
    p.then(
      () => (w.settled = true),
      () => (w.settled = true),
    );
    return w;
  };

  it("holds when the produce request is slower than the deadline: unknown, the write may have happened", async () => {
    const writ = await client();
    fakeDeadlines();
    const submit = watched(writ.submit(input(), { timeoutMs: 10_000 }));
    await waitFor(() => fakes.produced.length === 1);
    await vi.advanceTimersByTimeAsync(10_000);
    await waitFor(() => submit.settled);
    await expect(submit.p).resolves.toMatchObject({ status: "unknown", message: expect.stringContaining("acknowledged") });
  });

  it("drops a send still queued behind a slow request at its deadline: a retriable not_sent, and it is never produced", async () => {
    const writ = await client();
    fakeDeadlines();
    void writ.submit(input({ stepId: "first" }), { timeoutMs: 3_600_000 });
    await waitFor(() => fakes.produced.length === 1);
    const queued = watched(writ.submit(input({ stepId: "queued" }), { timeoutMs: 10_000 }));
    await vi.advanceTimersByTimeAsync(10_000);
    await waitFor(() => queued.settled);
    await expect(queued.p).rejects.toMatchObject({ code: "not_sent", retriable: true });
    // The slow request completes; the next one carries only what was submitted after it.
    fakes.produced[0]!.done();
    void writ.submit(input({ stepId: "later" }), { timeoutMs: 3_600_000 });
    await waitFor(() => fakes.produced.length === 2);
    expect(fakes.produced[1]!.messages).toHaveLength(1);
    expect(producedIntents()[1]!.intentKey).toBe(writ.buildIntent(input({ stepId: "later" })).intentKey);
  });

  it("passing for one submission of an intent id leaves another's wait for the reply alone", async () => {
    const writ = await client();
    fakeDeadlines();
    const intent = writ.buildIntent(input());
    const short = await waitingSubmit(writ, intent, 10_000);
    const long = await waitingSubmit(writ, intent);
    await vi.advanceTimersByTimeAsync(10_000);
    await waitFor(short.settled);
    await expect(short.waiting).resolves.toMatchObject({ status: "unknown" });
    await deliver(applied(intent.intentId, intent.intentKey));
    await waitFor(long.settled);
    await expect(long.waiting).resolves.toMatchObject({ status: "applied", intentId: intent.intentId });
  });

  it("a timeoutMs no timer can keep (over 2^31-1 ms, Infinity, NaN, 0, a fraction) is refused before anything is sent", async () => {
    const writ = await client();
    // Node fires a longer timer after 1 ms: the submit would answer unknown at once while its intent is written.
    for (const timeoutMs of [Infinity, 2 ** 31, 40 * 24 * 3_600_000, Number.NaN, 0, 1.5]) {
      await expect(writ.submit(input(), { timeoutMs })).rejects.toMatchObject({ code: "config_invalid", context: { field: "timeoutMs" } });
    }
    expect(fakes.produced).toHaveLength(0);
  });

  it("a leased intent's resend still queued at the deadline: submitAll answers with what it has (leased), not a not_sent that loses the applied one", async () => {
    const writ = await client();
    // Real timers: the leased retry's backoff and the resend's deadline both run; the deadline is short.
    const [a, b] = [writ.buildIntent(input({ stepId: "a" })), writ.buildIntent(input({ stepId: "b" }))];
    const all = watched(writ.submitAll([a, b], { timeoutMs: 1500 }));
    await waitFor(() => fakes.produced.length === 1);
    fakes.produced[0]!.done();
    // Another submit's produce request, slow: the resend of b queues behind it.
    void writ.submit(input({ stepId: "slow" }), { timeoutMs: 3_600_000 });
    await waitFor(() => fakes.produced.length === 2);
    await deliver(applied(a.intentId, a.intentKey));
    await deliver(rejectedReply(b.intentId, b.intentKey, "leased", "leased to a change", "2025-01-01T00:00:00.000Z"));
    await waitFor(() => all.settled);
    await expect(all.p).resolves.toMatchObject([
      { status: "applied", intentId: a.intentId },
      { status: "rejected", reason: "leased", intentId: b.intentId },
    ]);
    expect(fakes.produced).toHaveLength(2); // the resend never left
  });

  it("holds when the offset probe never answers: unknown at the deadline", async () => {
    const writ = await client();
    fakes.probeHangs = true;
    fakeDeadlines();
    const submit = watched(writ.submit(input(), { timeoutMs: 10_000 }));
    await waitFor(() => fakes.produced.length === 1);
    fakes.produced[0]!.done();
    await vi.advanceTimersByTimeAsync(10_000);
    await waitFor(() => submit.settled);
    await expect(submit.p).resolves.toMatchObject({ status: "unknown", message: expect.stringContaining("No reply before the deadline") });
  });
});

describe("a rejection given before the owner authenticated the record", () => {
  /** Only the client's deadline timers are faked, as in "a submit's deadline". */
  const fakeDeadlines = () => vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
  const at = "2025-01-01T00:00:00.000Z";

  it("does not settle the submit: a later applied for the same intent id wins (a forged record naming this intent cannot fail it)", async () => {
    const writ = await client();
    const { waiting, settled, sent } = await waitingSubmit(writ);
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "not signed by agent agent-1: no signature", at));
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "key_mismatch", "the record key is not the intent's entity", at));
    expect(settled()).toBe(false);
    await deliver(applied(sent.intentId, sent.intentKey));
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "applied", intentId: sent.intentId });
  });

  it("is what the submit returns at its deadline when nothing else answered, saying it may not answer this client's record", async () => {
    const writ = await client();
    fakeDeadlines();
    const { waiting, settled, sent } = await waitingSubmit(writ, input(), 10_000);
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "not signed by agent agent-1: no signature", at));
    await vi.advanceTimersByTimeAsync(9_000);
    expect(settled()).toBe(false);
    await vi.advanceTimersByTimeAsync(1_000);
    await waitFor(settled);
    const result = await waiting;
    expect(result).toMatchObject({ status: "rejected", reason: "unauthenticated", intentId: sent.intentId });
    expect((result as { message: string }).message).toMatch(/not this client's/);
  });

  it("any other rejection (params_invalid) still settles the submit at once", async () => {
    const writ = await client();
    const { waiting, settled, sent } = await waitingSubmit(writ);
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "params_invalid", "params of add_note: text is required", at));
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "rejected", reason: "params_invalid" });
  });

  it("still goes to replies() listeners at once", async () => {
    const writ = await client();
    const { sent } = await waitingSubmit(writ);
    const seen: Reply[] = [];
    const ac = new AbortController();
    const reading = (async () => {
      for await (const r of writ.replies({ signal: ac.signal })) {
        seen.push(r);
        ac.abort();
      }
    })();
    await new Promise((r) => setImmediate(r));
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "not signed", at));
    await waitFor(() => seen.length === 1);
    await reading;
    expect(seen[0]).toMatchObject({ status: "rejected", reason: "unauthenticated" });
  });
});

describe("a resolution's answer given before the owner authenticated the record", () => {
  const at = "2025-01-01T00:00:00.000Z";

  /** An escalation of an intent this client sent, and a resolution of it waiting for its answer (its produce request completed). */
  async function waitingResolution(writ: WritClient, timeoutMs: number) {
    const { sent } = await waitingSubmit(writ);
    const intent = JSON.parse(String(fakes.produced.at(-1)!.messages[0]!.value)) as WriteIntent;
    const escalation = { escalationId: `esc-${sent.intentKey.slice(0, 8)}`, reason: "conflict_cycles_exhausted", message: "two conflict cycles", intent, cycles: 2, current: null, at };
    const before = fakes.produced.length;
    const waiting = writ.resolve(escalation as never, { decision: "discard" }, { timeoutMs });
    let settled = false;
    void waiting.finally(() => (settled = true));
    await waitFor(() => fakes.produced.length === before + 1);
    fakes.produced[before]!.done();
    const { resolutionId } = JSON.parse(String(fakes.produced[before]!.messages[0]!.value)) as { resolutionId: string };
    return { waiting, settled: () => settled, resolutionId, intentKey: sent.intentKey };
  }

  it("does not settle it: the owner's own answer for the resolution id wins (a forged record naming it cannot end it)", async () => {
    const writ = await client();
    const { waiting, settled, resolutionId, intentKey } = await waitingResolution(writ, 3_600_000);
    await deliver(rejectedReply(resolutionId, intentKey, "unauthenticated", "not signed by agent agent-1: no signature", at));
    expect(settled()).toBe(false);
    await deliver(rejectedReply(resolutionId, intentKey, "escalation_discarded", "discarded by agent-1", at));
    await waitFor(settled);
    await expect(waiting).resolves.toMatchObject({ status: "rejected", reason: "escalation_discarded" });
  });

  it("is what it returns at its deadline when nothing else answered, saying it may not answer this client's record", async () => {
    const writ = await client();
    vi.useFakeTimers({ toFake: ["setTimeout", "clearTimeout"] });
    const { waiting, settled, resolutionId, intentKey } = await waitingResolution(writ, 10_000);
    await deliver(rejectedReply(resolutionId, intentKey, "unauthenticated", "not signed by agent agent-1: no signature", at));
    await vi.advanceTimersByTimeAsync(9_000);
    expect(settled()).toBe(false);
    await vi.advanceTimersByTimeAsync(1_000);
    await waitFor(settled);
    const result = await waiting;
    expect(result).toMatchObject({ status: "rejected", reason: "unauthenticated", intentId: resolutionId });
    expect((result as { message: string }).message).toMatch(/resolution id before the deadline: it may answer a record that was not this client's/);
  });
});

describe("replies()", () => {
  /** How many `replies()` iterations the client is feeding. */
  const listening = (writ: WritClient) => (writ as unknown as { listeners: Set<unknown> }).listeners.size;
  const reply = (n: number) => applied(`id-${n}`, "key");

  it("listens only once iterated: an iterable never iterated holds nothing", async () => {
    const writ = await client();
    writ.replies();
    expect(listening(writ)).toBe(0);
  });

  it("stops listening at the abort, even while the reader holds it paused at a reply", async () => {
    const writ = await client();
    const abort = new AbortController();
    const it = writ.replies({ signal: abort.signal })[Symbol.asyncIterator]();
    const first = it.next();
    await deliver(reply(1));
    await expect(first).resolves.toMatchObject({ value: { intentId: "id-1" } });
    abort.abort();
    expect(listening(writ)).toBe(0);
  });

  it("holds at most MAX_UNREAD_REPLIES unread, dropping the oldest", async () => {
    const writ = await client();
    const it = writ.replies()[Symbol.asyncIterator]();
    const first = it.next();
    await deliver(reply(0));
    await expect(first).resolves.toMatchObject({ value: { intentId: "id-0" } });
    // The reader holds the iterator at reply 0 while MAX_UNREAD_REPLIES + 5 more arrive.
    for (let n = 1; n <= MAX_UNREAD_REPLIES + 5; n++) await deliver(reply(n));
    // Replies 1 to 5 were dropped: the oldest still held is the one after them.
    await expect(it.next()).resolves.toMatchObject({ value: { intentId: "id-6" } });
    await it.return!(undefined);
    expect(listening(writ)).toBe(0);
  });
});

describe("the audience a client signs for (its owners' WRIT_SIGNING_AUDIENCE)", () => {
  const pair = generateKeyPairSync("ed25519");
  const signer: IntentSigner = { keyId: "k1", privateKey: pair.privateKey };
  const keys = new Map([["k1", pair.publicKey]]);
  /** The last record produced: its value as sent and its signature header. */
  const lastRecord = () => {
    const m = fakes.produced.at(-1)!.messages[0]!;
    return { value: JSON.parse(String(m.value)) as Record<string, unknown>, header: String((m.headers as Record<string, unknown>)[SIGNATURE_HEADER]) };
  };

  it("an audience without a signer, or outside 1–128 of A-Z a-z 0-9 . _ : / -, is config_invalid naming the field", async () => {
    await expect(client({ audience: "prod" })).rejects.toMatchObject({ code: "config_invalid", context: { field: "audience" } });
    for (const bad of ["", "a".repeat(129), "prod eu", "prod\u001b[2J"]) {
      await expect(client({ signer, audience: bad }), JSON.stringify(bad)).rejects.toMatchObject({ code: "config_invalid", context: { field: "audience" } });
    }
  });

  it("is in every intent it signs, inside the signed bytes: the same intent with another audience fails verification", async () => {
    const writ = await client({ signer, audience: "acme:billing/prod-eu-1" });
    expect(writ.buildIntent(input()).audience).toBe("acme:billing/prod-eu-1");
    await waitingSubmit(writ);
    const { value, header } = lastRecord();
    expect(value.audience).toBe("acme:billing/prod-eu-1");
    expect(verifyIntentSignature(value, header, keys)).toEqual({ ok: true, keyId: "k1" });
    expect(verifyIntentSignature({ ...value, audience: "acme:billing/staging" }, header, keys)).toMatchObject({ ok: false });
    const { audience: _, ...without } = value;
    expect(verifyIntentSignature(without, header, keys)).toMatchObject({ ok: false });
  });

  it("intents built elsewhere get it too (a lease acquire, an undo, a whole intent given to submit); one naming another audience is refused, nothing sent", async () => {
    const writ = await client({ signer, audience: "prod" });
    const lease = buildLeaseIntent({ change: changeId({ agentId: "agent-1", runId: "run-1", stepId: "s1" }), op: "acquire", entity: { type: "ticket", id: "T-1" }, tool: "add_note", agentId: "agent-1", runId: "run-1", stepId: "s1/acquire", replyTo: "writ.replies.agent-1" });
    expect(lease.audience).toBeUndefined();
    await waitingSubmit(writ, lease);
    expect(lastRecord().value).toMatchObject({ lease: { op: "acquire" }, audience: "prod" });
    expect(verifyIntentSignature(lastRecord().value, lastRecord().header, keys)).toMatchObject({ ok: true });

    const before = fakes.produced.length;
    void writ.undo({ intentKey: "a".repeat(64), entity: { type: "ticket", id: "T-1" }, tool: "add_note" }, { timeoutMs: 3_600_000 }).catch(() => undefined);
    await waitFor(() => fakes.produced.length === before + 1);
    fakes.produced[before]!.done();
    expect(lastRecord().value).toMatchObject({ undo: { intentKey: "a".repeat(64) }, audience: "prod" });
    expect(verifyIntentSignature(lastRecord().value, lastRecord().header, keys)).toMatchObject({ ok: true });

    const sent = fakes.produced.length;
    await expect(writ.submit({ ...writ.buildIntent(input()), audience: "staging" })).rejects.toMatchObject({ code: "config_invalid", context: { field: "audience" } });
    expect(fakes.produced.length).toBe(sent);
  });

  it("is in every resolution it signs, covered by the signature", async () => {
    const writ = await client({ signer, audience: "prod" });
    await waitingSubmit(writ);
    const intent = lastRecord().value;
    const escalation = { escalationId: "esc-1", reason: "conflict_cycles_exhausted", message: "two conflict cycles", intent, cycles: 2, current: null, at: "2025-01-01T00:00:00.000Z" };
    const before = fakes.produced.length;
    void writ.resolve(escalation as never, { decision: "discard" }, { timeoutMs: 3_600_000 }).catch(() => undefined);
    await waitFor(() => fakes.produced.length === before + 1);
    fakes.produced[before]!.done();
    const { value, header } = lastRecord();
    expect(value).toMatchObject({ kind: "resolution", audience: "prod" });
    expect(verifyIntentSignature(value, header, keys)).toMatchObject({ ok: true });
    expect(verifyIntentSignature({ ...value, audience: "staging" }, header, keys)).toMatchObject({ ok: false });
  });

  it("an owner's refusal for the audience settles the submit at once: given only once the signature verified, it is final", async () => {
    const writ = await client({ signer, audience: "staging" });
    const { waiting, settled, sent } = await waitingSubmit(writ);
    const at = "2025-01-01T00:00:00.000Z";
    // The control: an unauthenticated refusal of another kind is held (it may answer another producer's record).
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "not signed by agent agent-1: no signature", at));
    expect(settled()).toBe(false);
    // details that only look like it are held too.
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "x", at, { problem: ["audience_mismatch"] }));
    expect(settled()).toBe(false);
    await deliver(rejectedReply(sent.intentId, sent.intentKey, "unauthenticated", "agent agent-1: audience_mismatch: …", at, { problem: "audience_mismatch", received: "staging" }));
    await waitFor(settled);
    const result = await waiting;
    expect(result).toMatchObject({ status: "rejected", reason: "unauthenticated", details: { problem: "audience_mismatch", received: "staging" } });
    expect((result as { message: string }).message).not.toMatch(/not this client's/);
  });

  it("without an audience a signing client sends none (as before)", async () => {
    const writ = await client({ signer });
    await waitingSubmit(writ);
    expect(lastRecord().value).not.toHaveProperty("audience");
    expect(verifyIntentSignature(lastRecord().value, lastRecord().header, keys)).toMatchObject({ ok: true });
  });
});
