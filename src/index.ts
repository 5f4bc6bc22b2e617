// writ's public API. Internals (ledger state, partition owners, codec details) are not exported.
export { startRouter, type Router, type RouterOptions } from "./owner/router.ts";
export {
  declareWriteTool,
  admitTools,
  type WriteToolDeclaration,
  type EditToolDeclaration,
  type CreateToolDeclaration,
  type CreateDeclaration,
  type UndoFn,
  type UndoContext,
  type VersionPolicy,
  type ReconcileFn,
  type ReconcileContext,
} from "./tools.ts";
export { changeId, intentKey, leaseIntentKey, undoIntentKey, type KeyScope, type KeyedTool, type IntentKeyInput } from "./keys.ts";
export { ABSENT_VERSION, LEASE_VERSION, LEDGER_VERSION } from "./schemas/write-intent.ts";
export { RouterConfig, ClientConfig, routerConfigFromEnv, type RouterConfigInput, type ClientConfigInput } from "./config.ts";
export {
  KafkaSecurity,
  RegistryAuth,
  RegistryTls,
  connectionSecurityFromEnv,
  kafkaConnection,
  type ConnectionSecurity,
  type KafkaSecurityInput,
} from "./security/transport.ts";
// The owners' agent registry (also loaded from WRIT_AGENT_REGISTRY), and the signer type agents give createWritClient.
export { AgentRegistry, type RegisteredAgent } from "./security/agent-registry.ts";
export type { IntentSigner } from "./security/signing.ts";
export { WritError, ERROR_CODES, REJECT_REASONS, isRetriable, type ErrorCode, type RejectReason } from "./errors.ts";
export type { SystemOfRecord, PatchOutcome, PatchOptions, CreateOptions, ReadOptions, ReconcileResult } from "./sor/adapter.ts";
export { createHttpSystemOfRecord, type HttpSystemOfRecordOptions } from "./sor/http-adapter.ts";
// The `verify` export of a tools module, for `writ verify`.
export { verifyFixture, type VerifyFixtures, type ToolVerifyFixture } from "./verify/fixture.ts";
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
  CONTROL_HEADER,
  isControlRecord,
} from "./schemas/index.ts";
// Sending a dead letter back to the intents topic (what `writ dlq redrive` and the console do), for other tools.
export { REDRIVEN_FROM_HEADER, notRedrivable, redriveMessage, type DeadLetterRef } from "./dlq-redrive.ts";
export { createLogger, type Logger } from "./logger.ts";
// The agent side: the client, and what every framework adapter shares (each adapter is its own subpath, writ/adapters/<name>).
export {
  createWritClient,
  createIntentInput,
  buildUndoIntent,
  type UndoTarget,
  type WritClient,
  type IntentInput,
  type SubmitResult,
  type UnknownOutcome,
  type BlockedOutcome,
  type SubmitOptions,
} from "../producers/writ-client.ts";
export { buildLeaseIntent, type ChangeInput, type ChangeStep, type ChangeResult } from "../producers/change.ts";
export {
  VersionBook,
  DEFAULT_STEP_ID,
  toModelResult,
  toReadResult,
  type WritToolSpec,
  type WritCallContext,
  type ModelToolResult,
  type ReadToolResult,
} from "../producers/adapters/tool-bridge.ts";
export { MemoryIntentBases, recordIntentBases, type IntentBases, type IntentPin } from "../producers/adapters/intent-bases.ts";
