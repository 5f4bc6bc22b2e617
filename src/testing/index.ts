// `writ/testing`: what tests, demos and examples run writ against. Not for
// production: the demo records server stands in for a system of record, and
// the local stack starts Kafka and a schema registry as plain JVM processes
// (Java 17+ and Maven on the PATH; see the README).
//
// The demo records server keeps its data in `node:sqlite`, so it needs
// Node >= 22.13; the rest of writ runs on Node >= 22 (package.json engines).
export {
  startDemoRecordsServer,
  formatEtag,
  DemoFault,
  DemoRecordsConfig,
  DemoRecordsServerOptions,
  type DemoRecordsServer,
  type DemoFaultInput,
  type DemoRecordsStats,
  type HistoryEntry,
  type PatchRequestOutcome,
  type PatchRequestRow,
  type WriteKind,
} from "./demo-records-server.ts";
export {
  ensureStack,
  stopStack,
  waitForBroker,
  PortServedByAnotherCluster,
  startBroker,
  stopBroker,
  killBroker,
  pauseBroker,
  resumeBroker,
  brokerPid,
  brokerPids,
  partitionInfo,
  leaderOf,
  startRegistry,
  killRegistry,
  KAFKA_VERSION,
  APICURIO_VERSION,
  LOCAL_BROKER,
  LOCAL_REGISTRY_URL,
  type StackEndpoints,
  type EnsureStackResult,
  type EnsureStackOptions,
  type StackOptions,
  type BrokerCount,
} from "./local-stack.ts";
export {
  ensureSecureStack,
  stopSecureStack,
  secureStackAcls,
  secureTenantNames,
  SECURE_USERS,
  SECURE_AGENTS,
  type SecureStackInfo,
  type SecureStackOptions,
  type SecureTenant,
  type SecureTenantNames,
  type SecureUser,
  type SecureUserName,
  type SecureAgentName,
  type AclRule,
} from "./secure-stack.ts";
