// What writ verify's integration files share: runs of the demo's fixture against a records server of the test's
// own on the shared broker, and a run whose Kafka connections a relay cuts mid-scenario (test/integration/
// verify-false-pass.test.ts, verify-kafka-outage.test.ts).
import { Kafka, logLevel } from "kafkajs";
import { pino } from "pino";
import { onTestFinished } from "vitest";
import * as demoFixture from "../../examples/verify-fixture.ts";
import type { JsonPatchOp } from "../../src/schemas/common.ts";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { runVerify, type VerifyReport } from "../../src/verify/verify.ts";
import { startKafkaRelay } from "./kafka-relay.ts";
import { brokers, registryUrl } from "./writ-harness.ts";

export async function records(): Promise<DemoRecordsServer> {
  const server = await startDemoRecordsServer({ port: 0 });
  onTestFinished(() => server.close());
  return server;
}

export const verifyAgainst = (server: DemoRecordsServer, extra: Partial<Parameters<typeof runVerify>[0]> = {}): Promise<VerifyReport> =>
  runVerify({ tools: demoFixture, brokers: brokers(), schemaRegistryUrl: registryUrl(), env: { RECORDS_URL: server.url }, sorTimeoutMs: 1500, ...extra });

export const scenario = (report: VerifyReport, tool: string, name: string) =>
  report.tools.find((t) => t.tool === tool)?.scenarios.find((s) => s.scenario === name);

/** The demo's HTTP systems, each passed through `wrap` (its `config` kept, so verify still puts the proxy in front). */
export const wrapped = (wrap: (inner: SystemOfRecord) => Partial<SystemOfRecord>) => (env: NodeJS.ProcessEnv) =>
  demoFixture.systems(env).map((inner) => Object.assign(Object.create(Object.getPrototypeOf(inner) as object), inner, wrap(inner)) as SystemOfRecord);

/** The run's consumer groups and topics still on the cluster. */
export async function leftovers(runId: string): Promise<{ groups: string[]; topics: string[] }> {
  const admin = new Kafka({ clientId: "verify-leftovers", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
  await admin.connect();
  try {
    const groups = (await admin.listGroups()).groups.map((g) => g.groupId).filter((g) => g.includes(runId));
    return { groups, topics: (await admin.listTopics()).filter((t) => t.includes(runId)) };
  } finally {
    await admin.disconnect();
  }
}

/**
 * A run whose owner and agents reach the shared broker through a relay that the first PATCH that `cuts` (default:
 * any) cuts: the intent was read and recorded pending; its outcome and reply cannot be. The run's leftovers, which
 * verify could not delete through the cut relay, are deleted on the broker itself. `tools` may replace the demo's
 * fixtures, not its systems. `spare`: the client ids the cut leaves through (see KafkaRelay.cut); `restoreAt`: the
 * cut is restored once a progress line starts with it (a scenario judged).
 */
export function verifyCuttingKafka(
  server: DemoRecordsServer,
  extra: Partial<Parameters<typeof runVerify>[0]> & { cuts?: (system: string, ops: readonly JsonPatchOp[]) => boolean; spare?: (clientId: string) => boolean; restoreAt?: string },
) {
  const { cuts, tools, spare, restoreAt, onProgress, ...opts } = extra;
  const relay = startKafkaRelay(brokers()[0]!);
  let runId = "";
  onTestFinished(async () => {
    await (await relay).close();
    // No run id (the run ended before it said one): every name on the cluster contains "", so nothing is deleted
    // (other files' topics and groups are there too, two files running at a time).
    const left = runId === "" ? { groups: [], topics: [] } : await leftovers(runId);
    const admin = new Kafka({ clientId: "verify-leftovers", brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    await admin.deleteGroups(left.groups).catch(() => undefined);
    if (left.topics.length > 0) await admin.deleteTopics({ topics: left.topics });
    await admin.disconnect();
    // A Metadata answer the relay could not rewrite fails the test that met it, not the worker (after the cleanup).
    const failure = (await relay).error();
    if (failure) throw failure;
  });
  const run = relay.then(async (r) => {
    const cutting = wrapped((inner) =>
      ({
        patch: (...call) => {
          if (cuts?.(inner.name, call[1]) ?? true) r.cut(spare ? { spare } : {});
          return inner.patch(...call);
        },
      }),
    );
    return verifyAgainst(server, {
      brokers: [r.broker],
      tools: { ...demoFixture, ...(typeof tools === "object" ? tools : {}), systems: cutting },
      submitTimeoutMs: 5000,
      // The owner's and agents' reconnect errors are expected here.
      logger: pino({ level: "silent" }),
      onProgress: (line) => {
        runId ||= /^(wv-[0-9a-f]{6}): starting an owner/.exec(line)?.[1] ?? "";
        if (restoreAt !== undefined && line.startsWith(restoreAt)) r.restore();
        onProgress?.(line);
      },
      ...opts,
    });
  });
  return { relay, run };
}
