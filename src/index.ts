// writ's public API. Internals (ledger state, partition owners, codec details) are not exported.
export { startRouter, type Router, type RouterOptions } from "./owner/router.ts";
export { declareWriteTool, admitTools, type WriteToolDeclaration, type VersionPolicy, type ReconcileFn, type ReconcileContext } from "./tools.ts";
export { intentKey, type KeyScope, type KeyedTool, type IntentKeyInput } from "./keys.ts";
export { RouterConfig, ClientConfig, routerConfigFromEnv, type RouterConfigInput, type ClientConfigInput } from "./config.ts";
export { WritError, ERROR_CODES, REJECT_REASONS, isRetriable, type ErrorCode, type RejectReason } from "./errors.ts";
export type { SystemOfRecord, PatchOutcome, PatchOptions, ReadOptions, ReconcileResult } from "./sor/adapter.ts";
export { createHttpSystemOfRecord, type HttpSystemOfRecordOptions } from "./sor/http-adapter.ts";
export { startDemoRecordsServer, type DemoRecordsServer } from "./sor/demo-records-server.ts";
export {
  WriteIntent,
  Reply,
  LedgerEntry,
  Escalation,
  DeadLetter,
  EntityRef,
  JsonPatchOp,
  Versioned,
  entityKey,
} from "./schemas/index.ts";
export { createLogger, type Logger } from "./logger.ts";
