import { context } from "@opentelemetry/api";
import { isOutage } from "../owner/intent-pipeline.ts";
import type { EntityRef } from "../schemas/common.ts";
import type { PatchOutcome, ReconcileResult, SystemOfRecord } from "../sor/adapter.ts";
import type { AdmittedTool } from "../tools.ts";
import { type SorMethod, startSorSpan } from "../tracing/spans.ts";

/**
 * Every outcome `writ_sor_request_duration_seconds` may carry, by method (any call may also be `unavailable` or
 * `error`): what alert rules may match on (test/unit/alert-rules.test.ts). The compile-time checks below fail when
 * a PATCH outcome or a reconcile result is added without its label value.
 */
export const SOR_CALL_OUTCOMES = {
  read: ["ok", "not_found", "unavailable", "error"],
  patch: ["applied", "precondition_failed", "not_found", "rejected", "unavailable", "unknown", "error"],
  upsert: ["applied", "precondition_failed", "not_found", "rejected", "unavailable", "unknown", "error"],
  lookup: ["applied", "not_applied", "unknown", "unavailable", "error"],
} as const satisfies Record<SorMethod, readonly string[]>;
type Covers<All extends string, Listed extends string> = [Exclude<All, Listed>] extends [never] ? true : never;
const patchCovered: Covers<PatchOutcome["kind"], (typeof SOR_CALL_OUTCOMES.patch)[number]> = true;
const lookupCovered: Covers<ReconcileResult, (typeof SOR_CALL_OUTCOMES.lookup)[number]> = true;
void patchCovered;
void lookupCovered;

/** Receives the duration of one system-of-record call: system name, method, what it came to, seconds. */
export type SorCallObserver = (system: string, method: SorMethod, outcome: string, seconds: number) => void;

/**
 * A system of record that times every call (`observe`) and traces it
 * (`writ.read`, `writ.patch`, `writ.lookup`, `writ.upsert`, children of the
 * trace context in the call's headers, whose `traceparent` it replaces with
 * its own). Outcomes: `read` → ok, not_found; `patch`/`upsert` → the
 * {@link PatchOutcome} kind; `lookup` → applied, not_applied, unknown; any
 * call → unavailable (a `sor_unavailable` error) or error (another throw,
 * passed on unchanged). Nothing about the record (its id, its state) is
 * observed.
 */
export function observeSystem(system: SystemOfRecord, observe: SorCallObserver): SystemOfRecord {
  const name = system.name;
  async function call<T>(
    method: SorMethod,
    entity: EntityRef,
    headers: Readonly<Record<string, string>> | undefined,
    run: (headers: Record<string, string>) => Promise<T>,
    outcomeOf: (result: T) => string,
  ): Promise<T> {
    const span = startSorSpan(method, name, entity.type, headers);
    const started = performance.now();
    let result: T;
    try {
      result = await context.with(span.context, () => run(span.headers));
    } catch (err) {
      const outcome = isOutage(err) ? "unavailable" : "error";
      observe(name, method, outcome, (performance.now() - started) / 1000);
      span.end(outcome, err);
      throw err;
    }
    const outcome = outcomeOf(result);
    observe(name, method, outcome, (performance.now() - started) / 1000);
    span.end(outcome);
    return result;
  }
  const observed: SystemOfRecord = {
    name,
    capabilities: system.capabilities,
    read: (entity, opts) => call("read", entity, opts.headers, (headers) => system.read(entity, { ...opts, headers }), (r) => (r === null ? "not_found" : "ok")),
    patch: (entity, ops, opts) => call("patch", entity, opts.headers, (headers) => system.patch(entity, ops, { ...opts, headers }), (r) => r.kind),
  };
  if (system.lookupIdempotencyKey) {
    const lookup = system.lookupIdempotencyKey.bind(system);
    observed.lookupIdempotencyKey = (entity, key, opts) => call("lookup", entity, opts.headers, (headers) => lookup(entity, key, { ...opts, headers }), (r) => r);
  }
  if (system.upsertByExternalId) {
    const upsert = system.upsertByExternalId.bind(system);
    observed.upsertByExternalId = (entity, state, opts) =>
      call("upsert", entity, opts.headers, (headers) => upsert(entity, state, { ...opts, headers }), (r) => r.kind);
  }
  if (system.close) observed.close = system.close.bind(system);
  return observed;
}

/**
 * The admitted tools with each distinct system of record wrapped once by
 * {@link observeSystem} (tools sharing a system share its wrapper). A tool's
 * reconcile function gets the wrapped system too, so its lookups are timed.
 */
export function observeTools(tools: ReadonlyMap<string, AdmittedTool>, observe: SorCallObserver): Map<string, AdmittedTool> {
  const wrapped = new Map<SystemOfRecord, SystemOfRecord>();
  const out = new Map<string, AdmittedTool>();
  for (const [name, tool] of tools) {
    let system = wrapped.get(tool.system);
    if (!system) {
      system = observeSystem(tool.system, observe);
      wrapped.set(tool.system, system);
    }
    out.set(name, { ...tool, system });
  }
  return out;
}
