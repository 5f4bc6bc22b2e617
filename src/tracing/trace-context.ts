import {
  type Context,
  ROOT_CONTEXT,
  type SpanContext,
  type TraceState,
  createTraceState,
  isSpanContextValid,
  trace,
} from "@opentelemetry/api";

/**
 * W3C Trace Context (https://www.w3.org/TR/trace-context/) in Kafka record
 * headers and HTTP request headers, written here so that it travels whether
 * or not an OpenTelemetry SDK (and its propagator) is installed: writ depends
 * on `@opentelemetry/api` only, which is a no-op until an application
 * registers an SDK.
 *
 * Header names, on intents, replies, escalations, dead letters and every
 * request to a system of record: `traceparent` and `tracestate`.
 */
export const TRACEPARENT_HEADER = "traceparent";
export const TRACESTATE_HEADER = "tracestate";

/** A header value as kafkajs or node:http hands it over. */
export type HeaderValue = string | Buffer | readonly (string | Buffer)[] | undefined;

const TRACEPARENT = /^([0-9a-f]{2})-([0-9a-f]{32})-([0-9a-f]{16})-([0-9a-f]{2})(-.*)?$/;

/** `00-<trace id>-<span id>-<flags>` of a span context. */
export function formatTraceparent(sc: SpanContext): string {
  return `00-${sc.traceId}-${sc.spanId}-${(sc.traceFlags & 0xff).toString(16).padStart(2, "0")}`;
}

/** The span context a `traceparent` (and `tracestate`) header names; null when absent or malformed. */
export function parseTraceparent(traceparent: string | undefined, tracestate?: string): SpanContext | null {
  if (traceparent === undefined) return null;
  const m = TRACEPARENT.exec(traceparent.trim());
  if (!m) return null;
  const [, version, traceId, spanId, flags, rest] = m;
  // Version ff is invalid; version 00 has nothing after the flags. Later versions may append fields.
  if (version === "ff" || (version === "00" && rest !== undefined)) return null;
  let traceState: TraceState | undefined;
  if (tracestate !== undefined && tracestate.length > 0 && tracestate.length <= 512) {
    try {
      traceState = createTraceState(tracestate);
    } catch {
      traceState = undefined;
    }
  }
  const sc: SpanContext = { traceId: traceId!, spanId: spanId!, traceFlags: Number.parseInt(flags!, 16) & 0xff, isRemote: true, ...(traceState ? { traceState } : {}) };
  return isSpanContextValid(sc) ? sc : null;
}

/** The text of a header value (the first one, if repeated); undefined when absent or null (kafkajs decodes a null header value as null). */
export function headerText(value: HeaderValue | null | undefined): string | undefined {
  const first: unknown = Array.isArray(value) ? value[0] : value;
  if (typeof first === "string") return first;
  return Buffer.isBuffer(first) ? first.toString("utf8") : undefined;
}

/** A header by name, exact first, then case-insensitively (HTTP names are case-insensitive; Kafka's are not). */
function lookup(headers: Readonly<Record<string, HeaderValue>> | undefined, name: string): string | undefined {
  if (!headers) return undefined;
  if (name in headers) return headerText(headers[name]);
  for (const [k, v] of Object.entries(headers)) if (k.toLowerCase() === name) return headerText(v);
  return undefined;
}

/** The remote span context carried in `headers` (Kafka record headers or HTTP headers), or null. */
export function spanContextFromHeaders(headers: Readonly<Record<string, HeaderValue>> | undefined): SpanContext | null {
  return parseTraceparent(lookup(headers, TRACEPARENT_HEADER), lookup(headers, TRACESTATE_HEADER));
}

/** A context whose parent is the span context carried in `headers`; `fallback` (the root context) when none is. */
export function contextFromHeaders(headers: Readonly<Record<string, HeaderValue>> | undefined, fallback: Context = ROOT_CONTEXT): Context {
  const sc = spanContextFromHeaders(headers);
  return sc ? trace.setSpanContext(fallback, sc) : fallback;
}

/**
 * The `traceparent` (and `tracestate`) headers of a span context; empty when
 * it is not valid (no SDK and no incoming trace: nothing to propagate).
 */
export function traceHeaders(sc: SpanContext | undefined): Record<string, string> {
  if (!sc || !isSpanContextValid(sc)) return {};
  const out: Record<string, string> = { [TRACEPARENT_HEADER]: formatTraceparent(sc) };
  const state = sc.traceState?.serialize();
  if (state) out[TRACESTATE_HEADER] = state;
  return out;
}

/** `headers` without any trace context header (to replace it with a child's). */
export function withoutTraceHeaders(headers: Readonly<Record<string, string>> | undefined): Record<string, string> {
  const out: Record<string, string> = {};
  for (const [k, v] of Object.entries(headers ?? {})) {
    const lower = k.toLowerCase();
    if (lower !== TRACEPARENT_HEADER && lower !== TRACESTATE_HEADER) out[k] = v;
  }
  return out;
}
