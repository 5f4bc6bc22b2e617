import { type Attributes, type Context, type Link, type Span, type SpanContext, SpanKind, SpanStatusCode, context, isSpanContextValid, trace } from "@opentelemetry/api";
import type { IntentOutcome } from "../metrics/outcome.ts";
import type { AdmittedIntent } from "../owner/admission.ts";
import type { OutRecord } from "../owner/records.ts";
import type { WriteIntent } from "../schemas/write-intent.ts";
import { type HeaderValue, contextFromHeaders, traceHeaders, withoutTraceHeaders } from "./trace-context.ts";

/**
 * writ's spans, through `@opentelemetry/api` only: without a registered SDK
 * every span is a no-op, and an incoming trace context is passed on as it
 * came. Spans carry no record ids (entity ids), only the record type, the
 * tool, intent ids and keys.
 *
 * - `writ.submit` (client, kind CLIENT): from `submit()` until the reply
 *   arrives or the deadline passes; its context goes into the intent's
 *   `traceparent` header.
 * - `writ.process` (owner, kind CONSUMER, one per intent, child of the
 *   intent's context): from intake until the transaction carrying its result
 *   committed; its context goes on the reply, escalation and dead-letter
 *   records and into every request to the system of record.
 * - `writ.read`, `writ.patch`, `writ.lookup`, `writ.upsert` (kind CLIENT,
 *   children of `writ.process`): one per system-of-record call; the request
 *   carries the child's `traceparent`.
 * - `writ.transaction` (owner, kind PRODUCER): one per Kafka transaction that
 *   carries results, linked to the `writ.process` spans of those results
 *   (which link back to it): one transaction carries many intents, so it is
 *   no intent's child.
 */
export const TRACER_NAME = "writ";

/** Looked up per span: an SDK registered (or replaced, in tests) later is used from then on. */
function tracer() {
  return trace.getTracer(TRACER_NAME);
}

function describe(err: unknown): string {
  return err instanceof Error ? err.message : String(err);
}

// ---------------------------------------------------------------------------
// Agent side

/** The span of one `submit()`. */
export interface SubmitSpan {
  /** `traceparent`/`tracestate` for the intent record's headers (empty when nothing is traced). */
  readonly headers: Record<string, string>;
  /** Adds {@link headers} to a Kafka message's headers (nothing when nothing is traced). */
  stamp(message: { headers?: Record<string, string | Buffer | (string | Buffer)[] | undefined> }): void;
  /** The reply arrived, or the deadline gave `unknown`/`blocked`. Ends the span (once). */
  answered(result: { status: string; duplicate?: boolean }): void;
  /** The intent could not be sent. Ends the span (once). */
  failed(err: unknown): void;
}

/** Starts `writ.submit` as a child of the active context (the agent's own span, where it has a context manager). */
export function startSubmitSpan(intent: WriteIntent, intentsTopic: string): SubmitSpan {
  const span = tracer().startSpan(
    "writ.submit",
    {
      kind: SpanKind.CLIENT,
      attributes: {
        "messaging.system": "kafka",
        "messaging.destination.name": intentsTopic,
        "messaging.message.id": intent.intentId,
        "writ.tool": intent.tool,
        "writ.entity.type": intent.entity.type,
        "writ.intent_id": intent.intentId,
        "writ.intent_key": intent.intentKey,
        "writ.agent_id": intent.agent.id,
        "writ.reply_topic": intent.replyTo,
      },
    },
    context.active(),
  );
  let ended = false;
  const headers = traceHeaders(span.spanContext());
  return {
    headers,
    stamp(message) {
      if (Object.keys(headers).length > 0) message.headers = { ...message.headers, ...headers };
    },
    answered(result) {
      if (ended) return;
      ended = true;
      span.setAttribute("writ.reply.status", result.status);
      if (result.duplicate !== undefined) span.setAttribute("writ.reply.duplicate", result.duplicate);
      if (result.status === "unknown" || result.status === "blocked") span.setStatus({ code: SpanStatusCode.ERROR, message: `no reply before the deadline (${result.status})` });
      span.end();
    },
    failed(err) {
      if (ended) return;
      ended = true;
      span.recordException(err instanceof Error ? err : String(err));
      span.setStatus({ code: SpanStatusCode.ERROR, message: describe(err).slice(0, 500) });
      span.end();
    },
  };
}

// ---------------------------------------------------------------------------
// Owner side

/** The `writ.process` span of one intent in a partition owner. */
export class IntentTrace {
  private readonly span: Span;
  /** `traceparent`/`tracestate` of the process span: requests to the system of record and the result's records carry them. */
  readonly headers: Readonly<Record<string, string>>;
  private ended = false;

  private constructor(span: Span) {
    this.span = span;
    this.headers = traceHeaders(span.spanContext());
  }

  /** Starts `writ.process` as a child of the context in the intent record's headers (a new trace without one). */
  static start(
    message: { headers?: Readonly<Record<string, HeaderValue>> | undefined; offset: string },
    where: { topic: string; partition: number },
    admitted: AdmittedIntent | undefined,
    startTime?: number,
  ): IntentTrace {
    const attributes: Attributes = {
      "messaging.system": "kafka",
      "messaging.destination.name": where.topic,
      "messaging.destination.partition.id": String(where.partition),
      "messaging.kafka.offset": Number(message.offset),
    };
    if (admitted) {
      attributes["writ.tool"] = admitted.tool.name;
      attributes["writ.entity.type"] = admitted.intent.entity.type;
      attributes["writ.intent_id"] = admitted.intent.intentId;
      attributes["writ.intent_key"] = admitted.intent.intentKey;
      attributes["writ.agent_id"] = admitted.intent.agent.id;
    }
    const parent = contextFromHeaders(message.headers);
    const span = tracer().startSpan("writ.process", { kind: SpanKind.CONSUMER, attributes, ...(startTime !== undefined ? { startTime } : {}) }, parent);
    return new IntentTrace(span);
  }

  spanContext(): SpanContext {
    return this.span.spanContext();
  }

  /** The intent's result is staged: what it came to (null: forwarded to its key's partition). */
  settled(outcome: IntentOutcome | null): void {
    if (outcome === null) {
      this.span.setAttribute("writ.outcome", "forwarded");
      return;
    }
    this.span.setAttribute("writ.outcome", outcome.outcome);
    if (outcome.escalations.length > 0) this.span.setAttribute("writ.escalation.reason", outcome.escalations.join(","));
    if (outcome.deadLetters.length > 0) this.span.setAttribute("writ.dead_letter.reason", outcome.deadLetters.join(","));
  }

  /** Puts the process span's trace context on the result's records (replies, escalations, dead letters), not on `skipTopic` (the ledger). */
  stamp(records: OutRecord[], skipTopic: string): void {
    if (Object.keys(this.headers).length === 0) return;
    for (const r of records) if (r.topic !== skipTopic) r.headers = { ...r.headers, ...this.headers };
  }

  /** The transaction carrying the result committed: links to it and ends. */
  committed(txn: TransactionSpan | null): void {
    if (this.ended) return;
    this.ended = true;
    const sc = txn?.spanContext();
    if (sc && isSpanContextValid(sc)) this.span.addLink({ context: sc });
    this.span.end();
  }

  /** The owner's session ended before the result committed (a failed transaction, a fence, a release): the intent is read again. */
  abandoned(reason: string): void {
    if (this.ended) return;
    this.ended = true;
    this.span.setStatus({ code: SpanStatusCode.ERROR, message: `not committed: ${reason}`.slice(0, 500) });
    this.span.end();
  }
}

/** The `writ.transaction` span of one owner transaction carrying results. */
export interface TransactionSpan {
  spanContext(): SpanContext;
  committed(): void;
  failed(err: unknown): void;
}

/** Starts `writ.transaction` (a root span), linked to the process spans of the results it carries. */
export function startTransactionSpan(partition: number, intents: readonly (IntentTrace | undefined)[], records: number): TransactionSpan {
  const links: Link[] = [];
  for (const t of intents) {
    const sc = t?.spanContext();
    if (sc && isSpanContextValid(sc)) links.push({ context: sc });
  }
  const span = tracer().startSpan(
    "writ.transaction",
    { kind: SpanKind.PRODUCER, root: true, links, attributes: { "messaging.system": "kafka", "writ.partition": partition, "writ.results": intents.length, "writ.records": records } },
    context.active(),
  );
  let ended = false;
  return {
    spanContext: () => span.spanContext(),
    committed() {
      if (ended) return;
      ended = true;
      span.end();
    },
    failed(err) {
      if (ended) return;
      ended = true;
      span.recordException(err instanceof Error ? err : String(err));
      span.setStatus({ code: SpanStatusCode.ERROR, message: describe(err).slice(0, 500) });
      span.end();
    },
  };
}

/** The method of a system-of-record call, as spans and `writ_sor_request_duration_seconds` name it. */
export type SorMethod = "read" | "patch" | "lookup" | "upsert";

/** The span of one system-of-record call. */
export interface SorSpan {
  /** The request's headers: the caller's, with the trace context replaced by this span's. */
  readonly headers: Record<string, string>;
  /** The context to run the call in (this span active), for instrumentation inside the adapter. */
  readonly context: Context;
  /** Ends the span with what the call came to; `error` marks it failed. */
  end(outcome: string, error?: unknown): void;
}

/**
 * Starts `writ.<method>` as a child of the trace context in `headers` (the
 * owner puts its `writ.process` context there), else of the active context.
 */
export function startSorSpan(method: SorMethod, system: string, entityType: string, headers: Readonly<Record<string, string>> | undefined): SorSpan {
  const parent = contextFromHeaders(headers, context.active());
  const span = tracer().startSpan(
    `writ.${method}`,
    { kind: SpanKind.CLIENT, attributes: { "writ.system": system, "writ.sor.method": method, "writ.entity.type": entityType } },
    parent,
  );
  const child = traceHeaders(span.spanContext());
  const hasParent = trace.getSpanContext(parent) !== undefined;
  // No span and no parent: pass the caller's headers on untouched.
  const out = Object.keys(child).length > 0 || hasParent ? { ...withoutTraceHeaders(headers), ...child } : { ...headers };
  let ended = false;
  return {
    headers: out,
    context: trace.setSpan(parent, span),
    end(outcome, error) {
      if (ended) return;
      ended = true;
      span.setAttribute("writ.sor.outcome", outcome);
      if (error !== undefined) {
        span.recordException(error instanceof Error ? error : String(error));
        span.setStatus({ code: SpanStatusCode.ERROR, message: describe(error).slice(0, 500) });
      } else if (outcome === "unavailable" || outcome === "unknown") {
        span.setStatus({ code: SpanStatusCode.ERROR, message: outcome });
      }
      span.end();
    },
  };
}
