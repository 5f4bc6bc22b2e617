// writ verify when Kafka is lost mid-run: the run is stopped, or its scenario judged incomplete, never blamed on the
// tool for replies the outage kept from coming, and never a pass; a tool's own failure during an outage stays a
// failure; what the run left is named with the command that deletes it. Each run's owner and agents reach the
// broker through a relay the test cuts (test/helpers/verify-runs.ts). Run alone (vitest.config.ts): a consumer of
// a cut run may commit again once the relay is restored, and bring back a group the test's cleanup just deleted.
import { execFile } from "node:child_process";
import { promisify } from "node:util";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import * as demoFixture from "../../examples/verify-fixture.ts";
import type { JsonPatchOp } from "../../src/schemas/common.ts";
import { formatReport, type VerifyLeftovers } from "../../src/verify/verify.ts";
import { leftovers, records, scenario, verifyCuttingKafka } from "../helpers/verify-runs.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers } from "../helpers/writ-harness.ts";

describe("writ verify when Kafka is lost during a run", () => {
  it("Kafka lost in the middle of a scenario stops the run as not run (exit 2) at the first submit left without a reply, and names what it left and how to delete it", async () => {
    const server = await records();
    let left: VerifyLeftovers | null = null;
    // Counted after the cut: the scenario's own count of its effects, which comes after all its submits.
    let cut = false;
    let counted = 0;
    const tagTicket = demoFixture.verify.tag_ticket;
    const verify = { ...demoFixture.verify, tag_ticket: { ...tagTicket, effects: (a: Parameters<typeof tagTicket.effects>[0]) => ((counted += cut ? 1 : 0), tagTicket.effects(a)) } };
    const { relay, run } = verifyCuttingKafka(server, {
      only: ["tag_ticket"],
      scenarios: ["duplicate-submission"],
      tools: { ...demoFixture, verify },
      cuts: () => (cut = true),
      onLeftovers: (l) => void (left = l),
    });

    await expect(run).rejects.toMatchObject({
      code: "kafka_failed",
      message: expect.stringMatching(/^writ verify could not run \(tag_ticket duplicate-submission\): Kafka was lost during the run \(brokers [^)]+\), seen when a submit got no reply/),
    });
    // The outage came mid-scenario: the owner's PATCH had reached the records server, and the relay refused Kafka after.
    expect(server.stats().patchRequests).toBeGreaterThan(0);
    expect((await relay).refused()).toBeGreaterThan(0);
    // The run stopped at its first submit with no reply: before, it submitted again and waited that out too, then counted.
    expect(counted).toBe(0);

    // The broker was still gone at the cleanup: the run named what it left, as the broker itself has it.
    const { runId } = left!;
    const there = await leftovers(runId);
    expect(there.topics.length).toBeGreaterThan(0);
    expect(left!.topics).toEqual(expect.arrayContaining(there.topics));
    // Groups by name, the agents' by prefix (a glob among the names would fail a script deleting each one).
    for (const g of there.groups) expect(left!.groups.includes(g) || left!.groupPrefixes.some((p) => g.startsWith(p)), g).toBe(true);
    expect(left!.groups.filter((g) => g.includes("*"))).toEqual([]);
    expect(left!.groupPrefixes).toEqual([`writ.client.verify-${runId}-`]);
    expect(left!.cleanup).toBe(`writ verify --cleanup ${runId} --brokers ${(await relay).broker}`);
    // The broker back, the command it named deletes them; not while a group of the run has members, as where the
    // run still goes on (here a consumer of the test's own joins one).
    (await relay).restore();
    const member = new Kafka({ clientId: "verify-leftovers", brokers: brokers(), logLevel: logLevel.NOTHING }).consumer({ groupId: `writ.client.verify-${runId}-still-running` });
    onTestFinished(() => member.disconnect());
    let joined = false;
    member.on(member.events.GROUP_JOIN, () => (joined = true));
    await member.connect();
    await member.subscribe({ topics: [left!.topics[0]!] });
    await member.run({ eachMessage: async () => undefined });
    await waitFor(() => joined, { timeoutMs: 30_000, message: "the test's consumer did not join" });
    // Not spawnSync: the relay runs in this process. Exit 1 where a group still has members: those it names.
    const cleanupCli = (...more: string[]) =>
      promisify(execFile)(process.execPath, ["src/cli/main.ts", ...left!.cleanup.split(" ").slice(1), "--json", ...more], { timeout: 60_000 }).catch(
        (err: { code: number; stdout: string; stderr: string }) => (expect(err.code, err.stderr).toBe(1), err),
      );
    const refused = await cleanupCli();
    // Before, the topics went all the same, under the running owner.
    expect(JSON.parse(refused.stdout)).toMatchObject({ topics: [], groups: [], busy: expect.arrayContaining([`writ.client.verify-${runId}-still-running`]) });
    expect(refused.stderr).toContain("deleted nothing");
    expect((await leftovers(runId)).topics.sort()).toEqual(there.topics.sort());
    // --force (the run known to have ended): the topics and the groups without members go; those with members are named.
    const cleanup = await cleanupCli("--force");
    const done = JSON.parse(cleanup.stdout) as { topics: string[]; groups: string[]; busy: string[] };
    expect(done.topics.sort()).toEqual(there.topics.sort());
    expect(done.busy).toContain(`writ.client.verify-${runId}-still-running`);
    const after = await leftovers(runId);
    expect(after.topics).toEqual([]);
    expect(done.busy).toEqual(expect.arrayContaining(after.groups));
    await member.disconnect();
  }, 240_000);

  it("Kafka lost after a tool already failed: the failure is reported (exit 1), the tool cut short is incomplete, not a pass, and what did not run is named", async () => {
    const server = await records();
    // refund_payment fails the race on its own (If-Match ignored); tag_ticket passes duplicate-submission, then its
    // race's first PATCH cuts Kafka.
    server.setConfig({ enforceIfMatch: false });
    const cuts = (system: string, ops: readonly JsonPatchOp[]) => system === "helpdesk" && JSON.stringify(ops).includes("-race-");
    const { relay, run } = verifyCuttingKafka(server, { only: ["refund_payment", "tag_ticket"], scenarios: ["duplicate-submission", "race"], cuts });
    const report = await run;

    expect(scenario(report, "refund_payment", "race")).toMatchObject({ ok: false, problems: [expect.stringContaining("does not enforce If-Match")] });
    expect(report.ok).toBe(false);
    expect(report.interrupted).toMatchObject({ reason: expect.stringMatching(/^writ verify could not run \(tag_ticket race\): Kafka was lost during the run/), notRun: ["tag_ticket race"] });
    // Before, tag_ticket showed pass (ok: true), its race left out only in the "not run" line.
    const tag = report.tools.find((t) => t.tool === "tag_ticket")!;
    expect(tag).toMatchObject({ ok: false, status: "incomplete", notRun: ["race"], scenarios: [{ scenario: "duplicate-submission", ok: true }] });
    expect(report.summary).toEqual({ pass: 0, fail: 1, incomplete: 1, notRun: 0 });
    const text = formatReport(report);
    expect(text).toContain("not run: tag_ticket race");
    expect(text).toContain("tools: 0 pass, 1 FAIL, 1 incomplete, 0 not run");
    expect(text).toContain("tag_ticket on ticket:T-verify: incomplete (not run: race)");
    expect(text).toMatch(/tag_ticket\s+race\s+not run/);
    // The broker still gone at the cleanup: the report names what is left and the command.
    expect(report.leftovers).toMatchObject({ runId: report.runId, cleanup: `writ verify --cleanup ${report.runId} --brokers ${(await relay).broker}` });
    expect(text).toContain(`delete them with: writ verify --cleanup ${report.runId}`);
    expect((await relay).refused()).toBeGreaterThan(0);
  }, 240_000);

  it("Kafka lost during a scenario and back by the time it failed: the scenario is incomplete, naming the outage, not blamed on the tool", async () => {
    const server = await records();
    // Counted at the records server: every PATCH that reaches it is a write (no Idempotency-Key dedupe).
    server.setConfig({ honourIdempotencyKey: false });
    let restored = false;
    // The owner's first PATCH cuts Kafka for the owner and the agents, not for verify's outage probe: to it Kafka
    // is back, as it is for a broker that returned before verify asked. Restored once the scenario is judged.
    const { relay, run } = verifyCuttingKafka(server, {
      only: ["tag_ticket"],
      scenarios: ["duplicate-submission"],
      spare: (clientId) => clientId === "writ-verify-probe",
      onProgress: (line) => {
        if (line.startsWith("tag_ticket duplicate-submission:")) void relay.then((r) => (r.restore(), (restored = true)));
      },
    });
    const report = await run;

    const dup = scenario(report, "tag_ticket", "duplicate-submission")!;
    // Before, status fail (ok: false, exit 1): the tool blamed for replies the outage kept from coming.
    expect(dup, formatReport(report)).toMatchObject({ ok: false, status: "incomplete", harm: false, outage: expect.stringMatching(/^Kafka \(seen by [^)]*the owner/) });
    expect(dup.problems.join("\n")).toContain("every submission should be answered applied; got unknown");
    expect(report).toMatchObject({ ok: false, status: "incomplete", summary: { pass: 0, fail: 0, incomplete: 1, notRun: 0 } });
    expect(report.interrupted).toBeUndefined();
    expect(report.tools[0]).toMatchObject({ tool: "tag_ticket", ok: false, status: "incomplete" });
    const text = formatReport(report);
    expect(text).toContain(`writ verify ${report.runId}: INCOMPLETE`);
    expect(text).toMatch(/duplicate-submission: not judged: it failed during an outage of Kafka/);
    expect(text).toMatch(/tag_ticket\s+duplicate-submission\s+incomplete/);
    // The owner's write committed once at the records server before the cut; nothing wrote it again.
    const patches = server.history("ticket", "T-verify").filter((h) => h.kind === "patch" && JSON.stringify(h.ops).includes(`${report.runId}-tagticke-dup`));
    expect(patches).toHaveLength(1);
    expect((await relay).refused()).toBeGreaterThan(0);
    expect(restored).toBe(true);
  }, 240_000);

  it("Kafka lost during a scenario the tool failed on its own (a stale write let through) leaves it failed: no outage explains that", async () => {
    const server = await records();
    server.setConfig({ enforceIfMatch: false });
    // The owner's first PATCH of the race cuts Kafka for the owner and the agents (not for verify's probe), until the
    // race is judged: their reconnects are refused meanwhile.
    const cuts = (_system: string, ops: readonly JsonPatchOp[]) => JSON.stringify(ops).includes("-race-");
    const { relay, run } = verifyCuttingKafka(server, {
      only: ["refund_payment"],
      scenarios: ["race"],
      cuts,
      spare: (clientId) => clientId === "writ-verify-probe",
      restoreAt: "refund_payment race:",
    });
    const report = await run;

    const race = scenario(report, "refund_payment", "race")!;
    expect(race, formatReport(report)).toMatchObject({ ok: false, status: "fail", harm: true, outageCanExplain: "none", problems: expect.arrayContaining([expect.stringContaining("does not enforce If-Match")]) });
    expect(race.outage).toBeUndefined();
    expect(race.notes).toContainEqual(expect.stringMatching(/^an outage during it \(Kafka \(seen by .*\) does not explain what the system of record shows$/));
    expect(report).toMatchObject({ ok: false, status: "fail" });
    expect((await relay).refused()).toBeGreaterThan(0);
  }, 240_000);

  it("a fixture whose effects() says yes/no fails during a Kafka outage too: no outage explains the fixture's failure", async () => {
    const server = await records();
    const tagTicket = demoFixture.verify.tag_ticket;
    const yesNo = {
      ...tagTicket,
      effects: ({ current, mark }: Parameters<typeof tagTicket.effects>[0]) => ((current?.state as { tags: string[] } | undefined)?.tags ?? []).includes(mark) as unknown as number,
    };
    // As in the case above: Kafka gone for the owner and the agents from the owner's first PATCH until the scenario is judged.
    const { relay, run } = verifyCuttingKafka(server, {
      only: ["tag_ticket"],
      scenarios: ["duplicate-submission"],
      tools: { ...demoFixture, verify: { ...demoFixture.verify, tag_ticket: yesNo } },
      spare: (clientId) => clientId === "writ-verify-probe",
      restoreAt: "tag_ticket duplicate-submission:",
    });
    const report = await run;

    const dup = scenario(report, "tag_ticket", "duplicate-submission")!;
    // Before, incomplete (exit 2): the outage taken for the reason, though the README says a yes/no fails the scenario.
    expect(dup, formatReport(report)).toMatchObject({ ok: false, status: "fail", harm: false, outageCanExplain: "none", problems: [expect.stringContaining("the fixture's effects() gave true")] });
    expect(dup.notes).toContainEqual(expect.stringMatching(/^an outage during it \(Kafka .*\) does not explain its problems, which are the tool's, its adapter's or its fixture's$/));
    expect(report).toMatchObject({ ok: false, status: "fail" });
    // The owner's write reached the records server once, before the cut took effect.
    expect(server.history("ticket", "T-verify").filter((h) => h.kind === "patch" && JSON.stringify(h.ops).includes(`${report.runId}-tagticke-dup`))).toHaveLength(1);
    expect((await relay).refused()).toBeGreaterThan(0);
  }, 240_000);
});
