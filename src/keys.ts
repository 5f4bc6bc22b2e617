import { canonicalJson, sha256Hex } from "./canonical-json.ts";
import { WritError } from "./errors.ts";
import type { EntityRef, JsonPatchOp } from "./schemas/common.ts";
import { entityKey } from "./schemas/common.ts";

/** `run`: once per run (conversation); `global`: once ever, whatever run asks. */
export type KeyScope = "run" | "global";

/** The part of a tool declaration that the intent key depends on. */
export interface KeyedTool {
  name: string;
  keyScope: KeyScope;
  /** Names of the params that define the business intent, e.g. `["orderId", "amountCents"]`. */
  intentFields: readonly string[];
}

export interface IntentKeyInput {
  tool: KeyedTool;
  /**
   * The agent submitting it; part of the key under scope `run`, so one agent
   * can never present another's key (owners recompute it), and two agents'
   * runs never collide. Not part of it under `global` (once for everyone).
   */
  agentId: string;
  /** The run or conversation id; used only when the tool's key scope is `run`. */
  runId: string;
  /**
   * The harness's step id: stable across retries and resume. A framework's
   * tool-call id can serve where the framework keeps it across resume.
   */
  stepId: string;
  entity: EntityRef;
  params: Readonly<Record<string, unknown>>;
}

/**
 * The intent key: sha256 over agent id and run id (scope `run`), step id,
 * tool, target and the tool's declared intent fields, never free text the
 * model wrote and never a random id, so every retry or resume of one business
 * intent gets the same key. The bytes hashed are the canonical JSON (RFC 8785
 * JCS, see {@link canonicalJson}) of `{v: 2, scope, agent, run, step, tool,
 * target, fields}`, as UTF-8; the wire contract (python/README.md) and the
 * golden vectors in test/fixtures/intent-key-vectors.json pin them for other
 * languages. Owners recompute it and refuse an intent whose key differs.
 * Throws a non-retriable WritError: `config_invalid` when a declared intent
 * field is missing from the params, `not_canonical` when a value has no
 * canonical form (a string with a lone surrogate, NaN, ±Infinity).
 *
 * @example
 * const key = intentKey({ tool: refund, agentId: "billing-agent", runId, stepId: "refund-1",
 *   entity: { type: "payment", id: "pay_1" }, params: { amountCents: 500, reason: "damaged" } });
 */
export function intentKey(input: IntentKeyInput): string {
  const fields: Record<string, unknown> = {};
  for (const name of input.tool.intentFields) {
    if (!Object.hasOwn(input.params, name)) {
      throw new WritError("config_invalid", `intent field "${name}" of tool ${input.tool.name} is missing`, { retriable: false, context: { field: name } });
    }
    // defineProperty: an intent field named "__proto__" must stay an own key (assignment would set the prototype).
    Object.defineProperty(fields, name, { value: input.params[name], enumerable: true, writable: true, configurable: true });
  }
  const run = input.tool.keyScope === "run";
  return sha256Hex(
    canonicalJson({
      v: 2,
      scope: input.tool.keyScope,
      agent: run ? input.agentId : null,
      run: run ? input.runId : null,
      step: input.stepId,
      tool: input.tool.name,
      target: entityKey(input.entity),
      fields,
    }),
  );
}

/** Removes free-text values, which a model may reword on a retry of the same intent. */
function withoutFreeText(params: Readonly<Record<string, unknown>>, freeText: readonly string[]): Record<string, unknown> {
  const out: Record<string, unknown> = {};
  // defineProperty, as for intent fields: a param named "__proto__" must stay an own key, in the fingerprint.
  for (const [k, v] of Object.entries(params)) if (!freeText.includes(k)) Object.defineProperty(out, k, { value: v, enumerable: true, writable: true, configurable: true });
  return out;
}

/** sha256 over tool, entity and the params that are not free text (Stripe's key-reuse rule). */
export function paramsFingerprint(
  tool: string,
  entity: EntityRef,
  params: Readonly<Record<string, unknown>>,
  freeTextParams: readonly string[],
): string {
  return sha256Hex(canonicalJson({ tool, entity: entityKey(entity), params: withoutFreeText(params, freeTextParams) }));
}

/** sha256 over the delta with the values at free-text paths blanked. */
export function deltaFingerprint(delta: readonly JsonPatchOp[], isFreeTextPath: (path: string) => boolean): string {
  return sha256Hex(
    canonicalJson(delta.map((op) => ("value" in op && isFreeTextPath(op.path) ? { ...op, value: "<free-text>" } : op))),
  );
}

/**
 * The digest of an escalated intent, as its escalation carries it on writ.human: sha256 over the canonical JSON of
 * the whole intent (its intent id and free text too). The owner keeps it with the escalated outcome and a
 * resolution's intent must hash to it: any producer can write a writ.human record under a real escalation id.
 * Throws `not_canonical` for a value with no canonical form.
 */
export function escalatedIntentDigest(intent: unknown): string {
  return sha256Hex(canonicalJson(intent));
}

/**
 * The intent key of the undo of the intent keyed `undoneKey`: sha256 over the
 * canonical JSON of `{v: 2, undo: undoneKey}`. It depends on the undone key
 * only, so every submission of that undo, by any agent, run or retry, is one
 * intent, and the ledger answers repeats with the stored reply.
 */
export function undoIntentKey(undoneKey: string): string {
  return sha256Hex(canonicalJson({ v: 2, undo: undoneKey }));
}

/** The params fingerprint of an undo: over its tool, its entity and the undone key (an undo's params are empty). */
export function undoFingerprint(tool: string, entity: EntityRef, undoneKey: string): string {
  return paramsFingerprint(tool, entity, { undo: undoneKey }, []);
}

/**
 * The id of a change that spans records (`client.change()`): sha256 over the
 * canonical JSON of `{v: 2, change: {agent, run, step}}`. Like an intent key,
 * it is stable across retries and resume of the change, so a change resumed
 * after a crash takes up its own leases and its steps are answered from the
 * ledger.
 */
export function changeId(input: { agentId: string; runId: string; stepId: string }): string {
  return sha256Hex(canonicalJson({ v: 2, change: { agent: input.agentId, run: input.runId, step: input.stepId } }));
}

/**
 * The intent key of a lease intent: sha256 over the canonical JSON of
 * `{v: 2, lease: change, op, target}`. One key per change, operation and
 * record: a repeat is the same operation again (both are idempotent).
 */
export function leaseIntentKey(change: string, op: "acquire" | "release", entity: EntityRef): string {
  return sha256Hex(canonicalJson({ v: 2, lease: change, op, target: entityKey(entity) }));
}
