import { randomUUID } from "node:crypto";
import { SpanKind, context, trace } from "@opentelemetry/api";
import { AsyncLocalStorageContextManager } from "@opentelemetry/context-async-hooks";
import { BasicTracerProvider, InMemorySpanExporter, type ReadableSpan, SimpleSpanProcessor } from "@opentelemetry/sdk-trace-base";
import { type IHeaders, Kafka, Partitioners, logLevel } from "kafkajs";
import { afterEach, beforeEach, describe, expect, it } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import { WireCodec } from "../../src/codec.ts";
import { entityKey } from "../../src/schemas/common.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { parseTraceparent, spanContextFromHeaders } from "../../src/tracing/trace-context.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl, startHarness } from "../helpers/writ-harness.ts";

const exporter = new InMemorySpanExporter();
let provider: BasicTracerProvider;

beforeEach(() => {
  exporter.reset();
  provider = new BasicTracerProvider({ spanProcessors: [new SimpleSpanProcessor(exporter)] });
  trace.setGlobalTracerProvider(provider);
  context.setGlobalContextManager(new AsyncLocalStorageContextManager().enable());
});

afterEach(async () => {
  trace.disable();
  context.disable();
  await provider.shutdown();
});

const spanNamed = (spans: ReadableSpan[], name: string) => spans.filter((s) => s.name === name);

/** The headers of the first record on `topic` whose key is `key` (read_committed, from the beginning). */
async function recordHeaders(topic: string, key: string): Promise<IHeaders> {
  const kafka = new Kafka({ clientId: `tracing-test-${randomUUID().slice(0, 8)}`, brokers: brokers(), logLevel: logLevel.NOTHING });
  const consumer = kafka.consumer({ groupId: `writ.test-reader.${randomUUID()}`, readUncommitted: false, maxWaitTimeInMs: 100 });
  let found: IHeaders | null = null;
  await consumer.connect();
  try {
    await consumer.subscribe({ topic, fromBeginning: true });
    await consumer.run({
      eachMessage: async ({ message }) => {
        if (message.key?.toString() === key) found ??= message.headers ?? {};
      },
    });
    return await waitFor(() => found, { timeoutMs: 30_000, message: `a record keyed ${key} on ${topic}` });
  } finally {
    await consumer.disconnect();
  }
}

describe("tracing on a real broker", () => {
  it("one trace from submit() through the owner and the PATCH's traceparent to the reply record", async () => {
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const proxy = await startRecordingProxy(h.records.url);
    const systems = [
      createHttpSystemOfRecord({ name: "billing", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    await h.startRouter({ systems });
    const agent = await h.client("trace-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");

    // The agent's own span is active around submit(): writ.submit becomes its child.
    const reply = await trace.getTracer("test-agent").startActiveSpan("agent.step", async (step) => {
      try {
        return await agent.submit({
          tool: refundPayment,
          entity: { type: "payment", id: "pay_1" },
          runId: `run-${randomUUID()}`,
          stepId: "refund-1",
          baseVersion: version,
          delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 700, reason: "late" } }],
          params: { amountCents: 700, reason: "late" },
        });
      } finally {
        step.end();
      }
    });
    expect(reply).toMatchObject({ status: "applied", duplicate: false });

    const spans = await waitFor(
      () => {
        const s = exporter.getFinishedSpans();
        return ["agent.step", "writ.submit", "writ.process", "writ.read", "writ.patch", "writ.transaction"].every((n) => spanNamed(s, n).length > 0) && s;
      },
      { timeoutMs: 20_000, message: () => `spans so far: ${exporter.getFinishedSpans().map((s) => s.name).join(", ")}` },
    );
    const [step] = spanNamed(spans, "agent.step");
    const [submit] = spanNamed(spans, "writ.submit");
    const [process] = spanNamed(spans, "writ.process");
    expect(spanNamed(spans, "writ.submit")).toHaveLength(1);
    expect(spanNamed(spans, "writ.process")).toHaveLength(1);
    const traceId = submit!.spanContext().traceId;

    // One trace: agent step → submit → process → read, patch.
    expect(submit!.parentSpanContext?.spanId).toBe(step!.spanContext().spanId);
    expect(submit!.kind).toBe(SpanKind.CLIENT);
    expect(submit!.attributes["writ.reply.status"]).toBe("applied");
    expect(process!.spanContext().traceId).toBe(traceId);
    expect(process!.parentSpanContext?.spanId).toBe(submit!.spanContext().spanId);
    expect(process!.kind).toBe(SpanKind.CONSUMER);
    expect(process!.attributes).toMatchObject({ "writ.tool": "refund_payment", "writ.outcome": "applied", "writ.intent_id": reply.intentId });
    const reads = spanNamed(spans, "writ.read").filter((s) => s.spanContext().traceId === traceId);
    const patches = spanNamed(spans, "writ.patch").filter((s) => s.spanContext().traceId === traceId);
    expect(reads).toHaveLength(1);
    expect(patches).toHaveLength(1);
    for (const s of [...reads, ...patches]) {
      expect(s.parentSpanContext?.spanId).toBe(process!.spanContext().spanId);
      expect(s.attributes).toMatchObject({ "writ.system": "billing", "writ.entity.type": "payment" });
    }
    expect(patches[0]!.attributes["writ.sor.outcome"]).toBe("applied");
    // The owner's spans never name the record.
    for (const s of spans) for (const v of Object.values(s.attributes)) expect(String(v)).not.toContain("pay_1");

    // The records server received the PATCH (and the GET) with a traceparent of this trace, naming the child span.
    const patchRequest = proxy.seen.find((r) => r.method === "PATCH");
    const getRequest = proxy.seen.find((r) => r.method === "GET" && r.path.startsWith("/records/payment/"));
    const sent = parseTraceparent(String(patchRequest?.headers.traceparent));
    expect(sent?.traceId).toBe(traceId);
    expect(sent?.spanId).toBe(patches[0]!.spanContext().spanId);
    expect(parseTraceparent(String(getRequest?.headers.traceparent))?.spanId).toBe(reads[0]!.spanContext().spanId);
    expect(h.records.patchRequests(reply.intentKey)).toHaveLength(1);

    // The reply record carries the owner's process span context back.
    const replyHeaders = await recordHeaders(`writ.replies.trace-agent.${h.id}`, reply.intentId);
    const back = spanContextFromHeaders(replyHeaders);
    expect(back?.traceId).toBe(traceId);
    expect(back?.spanId).toBe(process!.spanContext().spanId);

    // The transaction that carried the result is linked to the process span, and back.
    const txn = spanNamed(spans, "writ.transaction").find((t) => t.links.some((l) => l.context.spanId === process!.spanContext().spanId));
    expect(txn).toBeDefined();
    expect(process!.links.map((l) => l.context.spanId)).toContain(txn!.spanContext().spanId);
  });

  it("without an SDK nothing is traced, and an incoming trace context is passed on unchanged", async () => {
    trace.disable();
    context.disable();
    const h = await startHarness({ tools: [refundPayment, tagTicket] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const proxy = await startRecordingProxy(h.records.url);
    const systems = [
      createHttpSystemOfRecord({ name: "billing", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    await h.startRouter({ systems });
    const agent = await h.client("plain-agent");
    const { version } = await readVersion(h.records, "payment", "pay_1");
    const reply = await agent.submit({
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: `run-${randomUUID()}`,
      stepId: "refund-1",
      baseVersion: version,
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 300, reason: "late" } }],
      params: { amountCents: 300, reason: "late" },
    });
    expect(reply.status).toBe("applied");
    expect(exporter.getFinishedSpans()).toHaveLength(0);
    // No trace to pass on: no traceparent on the requests or on the reply.
    expect(proxy.seen.length).toBeGreaterThan(0);
    for (const r of proxy.seen) expect(r.headers.traceparent).toBeUndefined();
    expect(spanContextFromHeaders(await recordHeaders(`writ.replies.plain-agent.${h.id}`, reply.intentId))).toBeNull();

    // An intent that arrives with a trace context (its producer traces, this owner does not): passed on as it came.
    const incoming = "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01";
    const { version: v2 } = await readVersion(h.records, "payment", "pay_1");
    const intent = agent.buildIntent({
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: `run-${randomUUID()}`,
      stepId: "refund-2",
      baseVersion: v2,
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 400, reason: "late" } }],
      params: { amountCents: 400, reason: "late" },
    });
    const kafka = new Kafka({ clientId: `tracing-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING });
    const producer = kafka.producer({ createPartitioner: Partitioners.DefaultPartitioner });
    await producer.connect();
    try {
      const value = await new WireCodec({ schemaRegistryUrl: registryUrl() }).encode(h.config.topics.intents, "WriteIntent", intent);
      await producer.send({ topic: h.config.topics.intents, messages: [{ key: entityKey(intent.entity), value, headers: { traceparent: incoming } }] });
    } finally {
      await producer.disconnect();
    }
    const headers = await recordHeaders(`writ.replies.plain-agent.${h.id}`, intent.intentId);
    expect(String(headers.traceparent)).toBe(incoming);
    const patch = await waitFor(() => proxy.seen.find((r) => r.method === "PATCH" && r.headers["idempotency-key"] === intent.intentKey));
    expect(patch.headers.traceparent).toBe(incoming);
  });
});
