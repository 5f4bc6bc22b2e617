/**
 * Every error writ raises carries a code from this list, whether it is worth
 * retrying (required, never defaulted: kafkajs's default-to-retriable is a
 * known pitfall), the cause, and context fields that pino logs.
 */
export const ERROR_CODES = [
  "config_invalid",
  "tool_not_admitted",
  "schema_drift",
  "codec_failed",
  "registry_unavailable",
  "kafka_failed",
  "producer_fenced",
  "sor_unavailable",
  "sor_protocol",
  "ledger_restore_timeout",
  "retries_exhausted",
] as const;
export type ErrorCode = (typeof ERROR_CODES)[number];

/** Machine-readable reasons carried by a `rejected` reply. */
export const REJECT_REASONS = [
  "undecodable",
  "schema_invalid",
  "reply_topic_not_allowed",
  "unknown_tool",
  "entity_type_mismatch",
  "params_invalid",
  "patch_path_not_allowed",
  "key_reused_with_different_params",
  "entity_not_found",
  "patch_not_applicable",
  "sor_rejected",
] as const;
export type RejectReason = (typeof REJECT_REASONS)[number];

export interface WritErrorContext {
  topic?: string;
  partition?: number;
  offset?: string;
  entity?: string;
  intentKey?: string;
  tool?: string;
  field?: string;
  [extra: string]: unknown;
}

export class WritError extends Error {
  readonly code: ErrorCode;
  readonly retriable: boolean;
  readonly context: WritErrorContext;

  constructor(
    code: ErrorCode,
    message: string,
    opts: { retriable: boolean; cause?: unknown; context?: WritErrorContext },
  ) {
    super(message, opts.cause === undefined ? undefined : { cause: opts.cause });
    this.name = "WritError";
    this.code = code;
    this.retriable = opts.retriable;
    this.context = opts.context ?? {};
  }

  toJSON(): Record<string, unknown> {
    return { name: this.name, code: this.code, message: this.message, retriable: this.retriable, ...this.context };
  }
}

/** True only when every error in the cause chain says it may be retried. */
export function isRetriable(err: unknown): boolean {
  let current: unknown = err;
  let seen = 0;
  while (current !== undefined && current !== null && seen < 16) {
    if (current instanceof WritError) {
      if (!current.retriable) return false;
    } else if (typeof current === "object" && "retriable" in current) {
      if ((current as { retriable: unknown }).retriable !== true) return false;
    } else {
      return false;
    }
    current = (current as { cause?: unknown }).cause;
    seen++;
  }
  return seen > 0;
}
