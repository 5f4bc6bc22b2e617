import { describe, expect, it, onTestFinished } from "vitest";
import * as demoFixture from "../../examples/verify-fixture.ts";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { startDemoRecordsServer, type DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import { formatReport, runVerify, type VerifyReport } from "../../src/verify/verify.ts";
import { brokers, readVersion, registryUrl } from "../helpers/writ-harness.ts";

async function records(): Promise<DemoRecordsServer> {
  const server = await startDemoRecordsServer({ port: 0 });
  onTestFinished(() => server.close());
  return server;
}

const verifyAgainst = (server: DemoRecordsServer, extra: Partial<Parameters<typeof runVerify>[0]> = {}): Promise<VerifyReport> =>
  runVerify({
    tools: demoFixture,
    brokers: brokers(),
    schemaRegistryUrl: registryUrl(),
    env: { RECORDS_URL: server.url },
    sorTimeoutMs: 1500,
    ...extra,
  });

const scenario = (report: VerifyReport, tool: string, name: string) =>
  report.tools.find((t) => t.tool === tool)?.scenarios.find((s) => s.scenario === name);

describe("writ verify against the demo records server", () => {
  it("passes with the demo tools: one effect per intent under duplicate submission, commit-then-timeout and commit-then-drop; no lost update in the race", async () => {
    const server = await records();
    const report = await verifyAgainst(server);

    expect(report.ok, formatReport(report)).toBe(true);
    expect(report.tools.map((t) => t.tool)).toEqual(["refund_payment", "tag_ticket", "note_account"]);
    for (const t of report.tools) {
      expect(t.scenarios.map((s) => [s.scenario, s.ok])).toEqual([
        ["duplicate-submission", true],
        ["commit-then-timeout", true],
        ["commit-then-drop", true],
        ["race", true],
      ]);
      expect(t.lostUpdates).toEqual([]);
    }
    expect(report.systems.every((s) => s.faultInjection === "proxy" && s.upstream === server.url)).toBe(true);

    // Counted again at the records server, not taken from the report.
    const payment = await readVersion(server, "payment", "pay_verify");
    const refs = (payment.state.refunds as { ref: string }[]).map((r) => r.ref);
    const prefix = `${report.runId}-refundpa`;
    for (const s of ["dup", "ctt", "ctd", "race-a", "race-b", "race-o"]) expect(refs.filter((r) => r === `${prefix}-${s}`), s).toHaveLength(1);
    const ticket = await readVersion(server, "ticket", "T-verify");
    const tagPrefix = `${report.runId}-tagticke`;
    for (const s of ["dup", "ctt", "ctd", "race-a", "race-b", "race-o"]) expect(ticket.state.tags.filter((t: string) => t === `${tagPrefix}-${s}`), s).toHaveLength(1);
    // Each faulted intent reached the records server exactly once: settled by reconcile, never replayed.
    const timeout = scenario(report, "refund_payment", "commit-then-timeout")!;
    expect(timeout.replies[0]).toBe("applied via reconcile");
    const key = server.history("payment", "pay_verify").find((h) => JSON.stringify(h.ops ?? "").includes(`${prefix}-ctt`))?.idempotencyKey;
    expect(key).toBeTruthy();
    expect(server.patchRequests(key!)).toHaveLength(1);
    // The race produced conflicts, and the outside writer's change survived.
    expect(scenario(report, "tag_ticket", "race")!.conflicts).toBeGreaterThan(0);
  }, 240_000);

  it("race-lost-update: with If-Match enforcement off at the records server, verify fails and names the lost update", async () => {
    const server = await records();
    server.setConfig({ enforceIfMatch: false });
    const report = await verifyAgainst(server, { scenarios: ["duplicate-submission", "race"] });

    expect(report.ok).toBe(false);
    const race = scenario(report, "tag_ticket", "race")!;
    expect(race.ok).toBe(false);
    expect(race.lostUpdates).toHaveLength(1);
    const lost = race.lostUpdates[0]!;
    expect(lost).toMatchObject({ tool: "tag_ticket", entity: "ticket:T-verify", writer: "outside-writer", mark: `${report.runId}-tagticke-race-o` });
    expect(lost.change).toEqual([{ op: "replace", path: "/tags", value: expect.arrayContaining([lost.mark]) }]);
    expect(race.problems.join("\n")).toContain(`lost update: outside-writer's change ${lost.mark} to ticket:T-verify`);
    expect(formatReport(report)).toContain(lost.mark);
    // The records server confirms: the outside writer's write committed, and its tag is gone.
    expect(server.history("ticket", "T-verify").some((h) => JSON.stringify(h.ops ?? "").includes(lost.mark))).toBe(true);
    expect((await readVersion(server, "ticket", "T-verify")).state.tags).not.toContain(lost.mark);

    // Duplicate submission still writes once. Appends (refunds) commute, so nothing is lost there, yet the race
    // fails them too: the system let a PATCH with a stale If-Match through.
    expect(scenario(report, "tag_ticket", "duplicate-submission")!.ok).toBe(true);
    expect(scenario(report, "refund_payment", "duplicate-submission")!.ok).toBe(true);
    const refundRace = scenario(report, "refund_payment", "race")!;
    expect(refundRace.lostUpdates).toEqual([]);
    expect(refundRace.problems.join("\n"), formatReport(report)).toContain("it does not enforce If-Match");
  }, 240_000);

  it("a system that is not HTTP: faults are simulated at the adapter, and the report says so", async () => {
    const server = await records();
    // The demo adapter without its `config`: verify cannot see a base URL, so it cannot put the proxy in front.
    const opaque = (name: string): SystemOfRecord => {
      const { config: _hidden, ...system } = createHttpSystemOfRecord({ name, baseUrl: server.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" });
      return system;
    };
    const report = await verifyAgainst(server, {
      tools: { ...demoFixture, systems: () => [opaque("billing"), opaque("helpdesk")] },
      only: ["tag_ticket"],
      scenarios: ["commit-then-timeout", "race"],
    });

    expect(report.ok, formatReport(report)).toBe(true);
    expect(report.systems.find((s) => s.name === "helpdesk")).toEqual({ name: "helpdesk", faultInjection: "adapter", upstream: null });
    const timeout = scenario(report, "tag_ticket", "commit-then-timeout")!;
    expect(timeout).toMatchObject({ faultInjection: "adapter", replies: ["applied via reconcile", "applied (duplicate)"], effects: 1 });
    expect(formatReport(report)).toContain("not HTTP: faults simulated at the adapter");
  }, 240_000);

  it("refuses an HTTP system whose base URL does not come from the environment, naming it", async () => {
    const server = await records();
    const fixed = () => [
      createHttpSystemOfRecord({ name: "billing", baseUrl: server.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      createHttpSystemOfRecord({ name: "helpdesk", baseUrl: server.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
    ];
    await expect(verifyAgainst(server, { tools: { ...demoFixture, systems: fixed }, env: {} })).rejects.toThrow(
      /system "billing" still points at http:\/\/127\.0\.0\.1:\d+.*must come from an environment variable/,
    );
    expect(server.stats()).toMatchObject({ patchRequests: 0 });
  });
});
