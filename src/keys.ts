import { canonicalJson, sha256Hex } from "./canonical-json.ts";
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
 * The intent key: sha256 over run id (scope `run`), step id, tool, target and
 * the tool's declared intent fields, never free text the model wrote and
 * never a random id, so every retry or resume of one business intent gets the
 * same key.
 *
 * @example
 * const key = intentKey({ tool: refund, runId, stepId: "refund-1", entity: { type: "payment", id: "pay_1" },
 *   params: { amountCents: 500, reason: "damaged" } });
 */
export function intentKey(input: IntentKeyInput): string {
  const fields: Record<string, unknown> = {};
  for (const name of input.tool.intentFields) {
    if (!(name in input.params)) throw new TypeError(`intent field "${name}" of tool ${input.tool.name} is missing`);
    fields[name] = input.params[name];
  }
  return sha256Hex(
    canonicalJson({
      v: 1,
      scope: input.tool.keyScope,
      run: input.tool.keyScope === "run" ? input.runId : null,
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
  for (const [k, v] of Object.entries(params)) if (!freeText.includes(k)) out[k] = v;
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
