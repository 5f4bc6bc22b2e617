// A PartitionOwner whose transactional producer records what each transaction sends, for the owner's own
// logic (what goes into which transaction, where the offset stands). Kafka's side is the integration suite's.
// A test file mocks partition-restore.ts with `restoredWith(...)` to hand the owner this producer and a ledger.
import type { KafkaMessage } from "kafkajs";
import { pino } from "pino";
import { afterEach, vi } from "vitest";
import { WireCodec } from "../../../src/codec.ts";
import { RouterConfig, type RouterConfigInput, parseConfig } from "../../../src/config.ts";
import { PartitionLedger, type RestoredEntry } from "../../../src/ledger/ledger-state.ts";
import type { Logger } from "../../../src/logger.ts";
import { HealthBoard } from "../../../src/owner/health.ts";
import { IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import type { OwnerContext } from "../../../src/owner/owner-context.ts";
import { PartitionOwner } from "../../../src/owner/partition-owner.ts";
import { RecordEncoder } from "../../../src/owner/records.ts";
import { intentKey } from "../../../src/keys.ts";
import type { AgentRegistry } from "../../../src/security/agent-registry.ts";
import type { AdmittedTool } from "../../../src/tools.ts";
import { version } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";

export interface SentTxn {
  records: { topic: string; key: string | null; value: Buffer | null }[];
  offset: string | null;
  committed: boolean;
  aborted: boolean;
}

/** Every transaction begun, in order. */
export const txns: SentTxn[] = [];

function recordingProducer() {
  return {
    protocol: "v2" as const,
    async connect() {},
    async disconnect() {},
    async transaction() {
      const t: SentTxn = { records: [], offset: null, committed: false, aborted: false };
      txns.push(t);
      return {
        async send(round: { topic: string; messages: { key: string | null; value: Buffer | null }[] }[]) {
          for (const tm of round) for (const m of tm.messages) t.records.push({ topic: tm.topic, key: m.key, value: m.value });
        },
        async sendOffset(o: { offset: string }) {
          t.offset = String(o.offset);
        },
        async commit() {
          t.committed = true;
        },
        async abort() {
          t.aborted = true;
        },
      };
    },
  };
}

/** What the mocked restorePartition returns: a fresh partition with these committed ledger entries. */
export function restoredWith(entries: [string, RestoredEntry][] = []) {
  return { producer: recordingProducer(), ledger: new PartitionLedger(0, entries), next: 0n, groupOffset: 0n, healed: 0, inDoubt: 0 };
}

/** The committed ledger entries the mocked restore of {@link restoreMock} hands the next owner; emptied after each test. */
export const restoring = { entries: [] as [string, unknown][] };

/**
 * partition-restore.ts as a test file mocks it to restore {@link restoring}'s entries:
 * `vi.mock("../../../src/owner/partition-restore.ts", async () => (await import("./partition-owner-harness.ts")).restoreMock())`.
 */
export function restoreMock() {
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith(restoring.entries as [string, RestoredEntry][]) };
}

/**
 * An owner of partition 0 with writ's defaults, no linger; `codec` may stand in for the registry's, `config`
 * overrides settings, `tools` are the ones admission knows (none by default), `agents` its agent registry (none by
 * default), `log` takes its log lines, `observe` its metrics hooks.
 */
export function ownerWith(
  opts: { codec?: WireCodec; config?: Partial<RouterConfigInput>; tools?: ReadonlyMap<string, AdmittedTool>; agents?: AgentRegistry; log?: Logger; observe?: OwnerContext["observe"] } = {},
): PartitionOwner {
  const config = parseConfig(RouterConfig, { brokers: ["127.0.0.1:9"], commitLingerMs: 0, offsetCommitIntervalMs: 0, ...opts.config }, "router");
  const codec = opts.codec ?? new WireCodec({});
  const log = opts.log ?? pino({ level: "silent" });
  const ctx = {
    config,
    codec,
    encoder: new RecordEncoder(codec, config),
    pipeline: new IntentPipeline({ config, log }),
    admission: { config, codec, tools: opts.tools ?? new Map(), replyTopics: { exists: async () => true }, now: () => new Date(), partitions: 1, ...(opts.agents ? { agents: opts.agents } : {}) },
    intake: { pause: () => undefined, resume: () => undefined, seek: () => undefined },
    lease: { confirmed: () => true },
    health: new HealthBoard(),
    onFenced: () => undefined,
    topicDirectory: { forget: () => undefined },
    ...(opts.observe ? { observe: opts.observe } : {}),
    log,
  } as unknown as OwnerContext;
  return new PartitionOwner(0, ctx);
}

/** A record of the intents topic at `offset`. */
export function intentRecord(offset: number, value: string, key = "ticket:T-1"): KafkaMessage {
  return { offset: String(offset), key: Buffer.from(key), value: Buffer.from(value), headers: {}, timestamp: String(Date.now()), attributes: 0 };
}

/** A promise `open()` resolves: holds a step of the owner (a read, a PATCH, an encode) until the test lets it go. */
export function gate(): { wait: Promise<void>; open: () => void } {
  let open!: () => void;
  const wait = new Promise<void>((resolve) => (open = resolve));
  return { wait, open };
}

/**
 * Date.now stands still until advanced: the commit loop's linger (WRIT_COMMIT_LINGER_MS) then never runs out by
 * itself, and a test decides when it has. Restored by vi.restoreAllMocks().
 */
export function frozenClock(): { advance(ms: number): void } {
  const t0 = Date.now();
  let shift = 0;
  vi.spyOn(Date, "now").mockImplementation(() => t0 + shift);
  return { advance: (ms) => void (shift += ms) };
}

/** Waits for `predicate` under a frozen clock (waitFor's deadline is Date.now's): at most `turns` 1 ms pauses. */
export async function until(predicate: () => boolean, message: () => string, turns = 5_000): Promise<void> {
  for (let i = 0; i < turns; i++) {
    if (predicate()) return;
    await new Promise((resolve) => setTimeout(resolve, 1));
  }
  throw new Error(`never happened: ${message()}`);
}

/**
 * The ledger records transactions carried, in topic order, as `<key>:<status|kind|tombstone>`: the committed
 * ones' (what a read_committed restore reads), or those of every transaction not aborted (`sent`: what its
 * read_uncommitted scan finds too).
 */
export function committedLedger(of: "committed" | "sent" = "committed"): string[] {
  return txns
    .filter((t) => (of === "committed" ? t.committed : !t.aborted))
    .flatMap((t) => t.records)
    .filter((r) => r.topic === "writ.ledger")
    .map((r) => {
      if (r.value === null) return `${r.key}:tombstone`;
      const v = JSON.parse(r.value.toString("utf8")) as { status?: string; kind?: string };
      return `${r.key}:${v.status ?? v.kind}`;
    });
}

/** An add_tag intent of agent-1's run-1 on ticket T-1 (step `stepId`): "vip" added to its tags, based on version 1. */
export function addTagIntentJson(stepId: string): string {
  const entity = { type: "ticket", id: "T-1" };
  const params = { tag: "vip" };
  const key = intentKey({ agentId: "agent-1", tool: addTag, runId: "run-1", stepId, entity, params });
  return JSON.stringify({
    intentId: stepId,
    intentKey: key,
    entity,
    tool: "add_tag",
    agent: { id: "agent-1", runId: "run-1", stepId },
    baseVersion: version(1),
    delta: [{ op: "add", path: "/tags/-", value: "vip" }],
    params,
    replyTo: "writ.replies.agent-1",
    createdAt: new Date().toISOString(),
  });
}

/** After each test of the file: no transactions recorded, nothing to restore, mocks (a frozen clock, spies) restored. */
export function resetAfterEach(): void {
  afterEach(() => {
    txns.length = 0;
    restoring.entries = [];
    vi.restoreAllMocks();
  });
}
