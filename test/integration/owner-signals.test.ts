// How the built `writ owner` stops when its clean stop hangs: an intent's PATCH is in flight at a system of record
// that commits it and does not answer (the stop waits for a write in flight up to three system-of-record
// deadlines, here minutes). A second
// SIGTERM, or a second Ctrl-C, 1 s or more after the first (SAME_REQUEST_MS: one sooner is the same request, as
// test/unit/cli-signals.test.ts shows), ends the process at once (143, 130) with a warning; without one, the owner
// ends by itself once WRIT_STOP_TIMEOUT_MS has passed (exit 1), saying so.
import { spawn, type ChildProcess } from "node:child_process";
import { randomUUID } from "node:crypto";
import { constants } from "node:os";
import { join } from "node:path";
import { setTimeout as sleep } from "node:timers/promises";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, inject, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import { createWritClient } from "../../producers/writ-client.ts";
import { SAME_REQUEST_MS } from "../../src/cli/signals.ts";
import { createLogger } from "../../src/logger.ts";
import { startDemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { BUILT_CLI, ROOT, ensureBuilt } from "../helpers/build.ts";
import { commandEnv } from "../helpers/command-env.ts";
import { waitFor } from "../helpers/wait-for.ts";

const brokers = inject("kafkaBrokers") || process.env.KAFKA_BROKERS || "127.0.0.1:19092";
const registry = inject("schemaRegistryUrl") || process.env.SCHEMA_REGISTRY_URL || "";
const COMPOSE_TOOLS = join(ROOT, "examples", "compose", "tools.js");

/** The exit status a shell (or Kubernetes) reports: the code, or 128 + the signal's number for a process killed by one. */
const status = ({ code, signal }: { code: number | null; signal: NodeJS.Signals | null }) => code ?? 128 + constants.signals[signal!];

/**
 * The built `writ owner` on topics and a group of its own, with one intent's PATCH in flight at a records server
 * that committed it and does not answer: what it prints and how it exited. `extra`: more of the owner's environment.
 */
async function ownerWithIntentInFlight(extra: Record<string, string> = {}) {
  await ensureBuilt();
  const id = randomUUID().slice(0, 8);
  const topics = { intents: `sig-${id}.intents`, ledger: `sig-${id}.ledger`, human: `sig-${id}.human`, dlq: `sig-${id}.dlq` };
  const agent = `sig-${id}`;
  // The ticket's system of record (its Idempotency-Key dedupe off): the first PATCH is committed and not answered.
  const records = await startDemoRecordsServer({ port: 0, honourIdempotencyKey: false });
  onTestFinished(() => records.close());
  const { version } = records.seed("ticket", "T-1", { subject: "signals", status: "open", tags: [] });
  records.setFaults([{ kind: "commit-then-delay", delayMs: 600_000 }]);
  const admin = new Kafka({ clientId: `writ-sig-test-${id}`, brokers: brokers.split(","), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  onTestFinished(async () => {
    await admin.deleteTopics({ topics: [...Object.values(topics), `writ.replies.${agent}`] }).catch(() => undefined);
    await admin.disconnect();
  });

  const owner: ChildProcess = spawn(process.execPath, ["--no-experimental-strip-types", BUILT_CLI, "owner", "--tools", COMPOSE_TOOLS], {
    cwd: ROOT,
    env: commandEnv(brokers, registry, topics, {
      WRIT_GROUP_ID: `sig-${id}.owners`,
      WRIT_INTENT_PARTITIONS: "1",
      // The stop waits for the intent in flight up to three of these: six minutes, past every deadline below.
      WRIT_SOR_TIMEOUT_MS: "120000",
      WRIT_SESSION_TIMEOUT_MS: "10000",
      RECORDS_URL: records.url,
      ...extra,
    }),
    stdio: ["ignore", "ignore", "pipe"],
  });
  onTestFinished(() => {
    if (owner.exitCode === null && owner.signalCode === null) owner.kill("SIGKILL");
  });
  let stderr = "";
  owner.stderr!.on("data", (d: Buffer) => (stderr += d.toString()));
  let exit: { code: number | null; signal: NodeJS.Signals | null } | undefined;
  // "close", not "exit": stderr is read to its end by then.
  owner.once("close", (code, signal) => (exit = { code, signal }));
  await waitFor(() => stderr.includes('"msg":"owner started"') || exit, { timeoutMs: 60_000, message: () => `owner did not start:\n${stderr}` });
  expect(exit, stderr).toBeUndefined();

  const client = await createWritClient({
    brokers: brokers.split(","),
    agentId: agent,
    replyTopic: `writ.replies.${agent}`,
    intentsTopic: topics.intents,
    ...(registry ? { schemaRegistryUrl: registry } : {}),
    replyFetchMaxWaitMs: 100,
    logger: createLogger({ level: "silent" }),
  });
  onTestFinished(() => client.close());
  // Not answered while the owner runs: its PATCH is never answered.
  void client
    .submit({ tool: tagTicket, entity: { type: "ticket", id: "T-1" }, runId: `run-${id}`, stepId: "s1", baseVersion: version, delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" } })
    .catch(() => undefined);
  await waitFor(() => records.patchRequests().length > 0, { message: () => `no PATCH reached the records server:\n${stderr}` });

  return {
    owner,
    stderr: () => stderr,
    /**
     * Sends `signal`; for a first one, waits until the owner says it is stopping; a later one is sent once
     * SAME_REQUEST_MS has passed since (sooner it would be the first again).
     */
    async signal(signal: NodeJS.Signals, first = false) {
      if (!first) await sleep(SAME_REQUEST_MS + 50);
      owner.kill(signal);
      if (first) await waitFor(() => stderr.includes(`"signal":"${signal}","msg":"stopping"`), { timeoutMs: 10_000, message: () => `no "stopping" line:\n${stderr}` });
    },
    /** How the owner exited, within `timeoutMs`. */
    exited: (timeoutMs = 10_000) => waitFor(() => exit, { timeoutMs, message: () => `writ owner still runs:\n${stderr}` }),
    /** The writes the records server committed to the ticket, the seed aside. */
    writes: () => records.history("ticket", "T-1").length - 1,
    patches: () => records.patchRequests().length,
  };
}

describe("writ owner whose clean stop hangs", () => {
  for (const [signal, code] of [
    ["SIGTERM", 143],
    ["SIGINT", 130],
  ] as const) {
    it(`a second ${signal} ends it at once (${code}) while the stop hangs, with one warning`, async () => {
      const run = await ownerWithIntentInFlight();
      await run.signal(signal, true);
      // Before, the second signal was ignored while the stop waited for the intent in flight (minutes): SIGKILL only.
      await run.signal(signal);
      const exit = await run.exited();
      expect(status(exit), run.stderr()).toBe(code);
      expect(exit.signal).toBe(signal);
      const warnings = run.stderr().split("\n").filter((l) => l.includes('"msg":"second signal: exiting without a clean stop"'));
      expect(warnings, run.stderr()).toHaveLength(1);
      expect(JSON.parse(warnings[0]!)).toMatchObject({ level: 40, signal });
      expect(run.stderr()).not.toContain('"msg":"router stopped"');
      // The one write in flight, committed once; nothing more was sent.
      expect({ writes: run.writes(), patches: run.patches() }).toEqual({ writes: 1, patches: 1 });
    });
  }

  it("a SIGINT, then a SIGTERM, ends it at once (143)", async () => {
    // A bound that covers four WRIT_SOR_TIMEOUT_MS: nothing said of it at start.
    const run = await ownerWithIntentInFlight({ WRIT_STOP_TIMEOUT_MS: "480000" });
    await run.signal("SIGINT", true);
    await run.signal("SIGTERM");
    expect(status(await run.exited()), run.stderr()).toBe(143);
    expect(run.stderr()).not.toContain("is below four WRIT_SOR_TIMEOUT_MS");
  });

  it("with no second signal it ends once WRIT_STOP_TIMEOUT_MS has passed: exit 1, saying so", async () => {
    const run = await ownerWithIntentInFlight({ WRIT_STOP_TIMEOUT_MS: "1000" });
    await run.signal("SIGTERM", true);
    const exit = await run.exited();
    expect(exit, run.stderr()).toEqual({ code: 1, signal: null });
    const line = run.stderr().split("\n").find((l) => l.includes("did not stop within WRIT_STOP_TIMEOUT_MS"));
    expect(JSON.parse(line!)).toMatchObject({ level: 50, signal: "SIGTERM", stopTimeoutMs: 1000 });
    expect(run.stderr()).not.toContain('"msg":"router stopped"');
    // Said at start already: 1 s is below the four WRIT_SOR_TIMEOUT_MS the clean stop may take.
    const warned = run.stderr().split("\n").find((l) => l.includes("is below four WRIT_SOR_TIMEOUT_MS"));
    expect(JSON.parse(warned!)).toMatchObject({ level: 40, stopTimeoutMs: 1000, sorTimeoutMs: 120_000 });
  });
});
