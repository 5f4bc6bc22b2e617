// The change coordinator (producers/change.ts) against a scripted client: the
// order of its intents, and how it ends on each kind of answer. The owner's
// side and the records are tested on the real broker (test/integration/leases.test.ts).
import { describe, expect, it, vi } from "vitest";
import { z } from "zod";
import { runChange, type ChangeInput } from "../../../producers/change.ts";
import type { SubmitResult, WritClient } from "../../../producers/writ-client.ts";
import { RECORD_MAX_DEPTH, WireCodec } from "../../../src/codec.ts";
import { WritError } from "../../../src/errors.ts";
import { intentKey } from "../../../src/keys.ts";
import type { Reply } from "../../../src/schemas/reply.ts";
import type { WriteIntent } from "../../../src/schemas/write-intent.ts";
import { declareWriteTool } from "../../../src/tools.ts";

const tag = declareWriteTool({
  name: "tag_ticket",
  recordType: "ticket",
  params: z.object({ tag: z.string() }),
  intentFields: ["tag"],
  allowedPaths: ["/tags"],
  keyScope: "run",
  versionPolicy: "strict",
  system: "helpdesk",
  undo: () => [{ op: "replace", path: "/tags", value: [] }],
});

/** A client whose owners are a script: `answer` decides each intent's reply; every intent sent is kept. */
function scripted(answer: (i: WriteIntent, n: number) => SubmitResult | undefined) {
  const sent: WriteIntent[] = [];
  const versions = new Map<string, number>();
  const applied = (i: WriteIntent, extra: Partial<Reply> = {}): Reply => {
    const key = `${i.entity.type}:${i.entity.id}`;
    const lease = i.lease && i.lease.op !== "step";
    if (!lease) versions.set(key, (versions.get(key) ?? 1) + 1);
    const version = `"v${versions.get(key) ?? 1}"`;
    return { status: "applied", intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: "2025-01-01T00:00:00.000Z", entity: i.entity, state: { tags: [] }, version, via: lease ? "lease" : "patch", tool: i.tool, ...(i.undo ? { undoOf: i.undo.intentKey } : {}), ...extra } as Reply;
  };
  const client = {
    agentId: "agent-1",
    replyTopic: "writ.replies.agent-1",
    buildIntent: (i: { tool: typeof tag; entity: { type: string; id: string }; runId: string; stepId: string; baseVersion: string; delta: unknown[]; params: Record<string, unknown> }) =>
      ({
        intentId: `id-${sent.length}-${Math.random()}`,
        intentKey: intentKey({ tool: i.tool, agentId: "agent-1", runId: i.runId, stepId: i.stepId, entity: i.entity, params: i.params }),
        entity: i.entity,
        tool: i.tool.name,
        agent: { id: "agent-1", runId: i.runId, stepId: i.stepId },
        baseVersion: i.baseVersion,
        delta: i.delta,
        params: i.params,
        replyTo: "writ.replies.agent-1",
        createdAt: "2025-01-01T00:00:00.000Z",
      }) as WriteIntent,
    submit: async (i: WriteIntent) => {
      sent.push(i);
      return answer(i, sent.length) ?? applied(i);
    },
  } as unknown as WritClient & { replyTopic: string };
  return { client, sent, applied, versions };
}

const ticket = (id: string) => ({ type: "ticket", id });
const input = (extra: Partial<ChangeInput> = {}): ChangeInput => ({
  runId: "run-1",
  stepId: "change-1",
  steps: ["T-3", "T-1", "T-2"].map((id) => ({ name: id, tool: tag, entity: ticket(id), params: { tag: `x-${id}` }, delta: [{ op: "replace" as const, path: "/tags", value: [`x-${id}`] }] })),
  ...extra,
});
/** What each intent sent was: acquire/release/step/undo and its record. */
const trace = (sent: WriteIntent[]) => sent.map((i) => `${i.undo ? "undo" : (i.lease?.op ?? "plain")} ${i.entity.id}`);
const rejected = (i: WriteIntent, reason: string): SubmitResult => ({ status: "rejected", intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: "2025-01-01T00:00:00.000Z", reason, message: reason }) as SubmitResult;

describe("a change that spans records, from its client's side", () => {
  it("takes the leases in entity-key order, runs the steps in their order under them, then releases them", async () => {
    const { client, sent } = scripted(() => undefined);
    const result = await runChange(client, input());
    expect(result.status).toBe("applied");
    expect(trace(sent)).toEqual(["acquire T-1", "acquire T-2", "acquire T-3", "step T-3", "step T-1", "step T-2", "release T-1", "release T-2", "release T-3"]);
    // Each step on the record as its lease read it; a step's key comes from the change's run and step plus its name.
    expect(sent.filter((i) => i.lease?.op === "step").map((i) => [i.baseVersion, i.agent.stepId])).toEqual([
      ['"v1"', "change-1/T-3"],
      ['"v1"', "change-1/T-1"],
      ['"v1"', "change-1/T-2"],
    ]);
    expect(new Set(sent.filter((i) => i.lease).map((i) => i.lease!.change)).size).toBe(1);
  });

  it("refuses step names that could make two changes' steps share intent keys, before anything is sent", async () => {
    const { client, sent } = scripted(() => undefined);
    const step = input().steps[0]!;
    // change "a" with step "b/c" and change "a/b" with step "c" would both key their step as run-1 / a/b/c
    await expect(runChange(client, input({ stepId: "a", steps: [{ ...step, name: "b/c" }] }))).rejects.toThrow(/must be 1 to 64 characters without "\/"/);
    await expect(runChange(client, input({ steps: [{ ...step, name: "" }] }))).rejects.toThrow(/step name ""/);
    await expect(runChange(client, input({ steps: [{ ...step, name: "x".repeat(65) }] }))).rejects.toThrow(/must be 1 to 64/);
    expect(sent).toEqual([]);
  });

  it("refuses a lease time to live or a wait that is not a whole number of ms in range (NaN asked again without end), naming the field, before anything is sent", async () => {
    // Every record leased to another change: a wait whose deadline is NaN would never run out.
    const { client, sent } = scripted((i) => (i.lease?.op === "acquire" ? rejected(i, "leased") : undefined));
    const bad: [keyof ChangeInput, number][] = [
      ["waitForLeaseMs", Number.NaN],
      ["waitForLeaseMs", -1],
      ["settleWithinMs", Number.NaN],
      ["settleWithinMs", Number.POSITIVE_INFINITY],
      ["leaseTtlMs", Number.NaN],
      ["leaseTtlMs", 999],
      ["leaseTtlMs", 600_001],
      ["leaseTtlMs", 1500.5],
    ];
    for (const [field, value] of bad) {
      await expect(runChange(client, input({ [field]: value })), `${field}: ${value}`).rejects.toMatchObject({ code: "config_invalid", context: { field } });
    }
    expect(sent).toEqual([]);
  });

  it("a step that is not applied: the applied steps are undone newest first, under the leases, then released", async () => {
    const { client, sent } = scripted((i) => (i.lease?.op === "step" && !i.undo && i.entity.id === "T-2" ? rejected(i, "patch_not_applicable") : undefined));
    const result = await runChange(client, input());
    expect(result).toMatchObject({ status: "compensated", failed: { step: "T-2", result: { reason: "patch_not_applicable" } } });
    expect(trace(sent).slice(3)).toEqual(["step T-3", "step T-1", "step T-2", "undo T-1", "undo T-3", "release T-1", "release T-2", "release T-3"]);
    expect(sent.filter((i) => i.undo).every((i) => i.lease?.op === "step")).toBe(true);
  });

  it("an escalated step, or one without an answer, ends the change incomplete: nothing is undone around it", async () => {
    for (const status of ["escalated", "unknown"] as const) {
      const { client, sent } = scripted((i) =>
        i.lease?.op === "step" && i.entity.id === "T-1"
          ? status === "escalated"
            ? ({ status, intentId: i.intentId, intentKey: i.intentKey, duplicate: false, at: "2025-01-01T00:00:00.000Z", entity: i.entity, reason: "outcome_unknown", message: "m", escalationId: "e" } as SubmitResult)
            : { status, intentId: i.intentId, intentKey: i.intentKey, message: "no reply" }
          : undefined,
      );
      const result = await runChange(client, input({ settleWithinMs: 1 }));
      expect(result).toMatchObject({ status: "incomplete", applied: ["T-3"] });
      expect(sent.some((i) => i.undo)).toBe(false);
    }
  });

  it("a record leased to another change is waited for; past waitForLeaseMs the change is not started and its leases are released", async () => {
    const { client, sent } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "leased") : undefined));
    const result = await runChange(client, input({ waitForLeaseMs: 300 }));
    expect(result).toMatchObject({ status: "not_started", entity: ticket("T-2"), result: { reason: "leased" } });
    expect(sent.filter((i) => i.lease?.op === "acquire" && i.entity.id === "T-2").length).toBeGreaterThan(1);
    expect(trace(sent).filter((t) => t.startsWith("release"))).toEqual(["release T-1"]);
    expect(sent.some((i) => i.lease?.op === "step")).toBe(false);
  });

  it("a renewal that finds a record written while its lease had lapsed stops the change: compensated, lease_not_held", async () => {
    let n = 0;
    const { client, sent, versions } = scripted((i) => {
      // Someone writes T-1 before the renewal that precedes the second step.
      if (i.lease?.op === "step" && ++n === 1) versions.set("ticket:T-1", 9);
      return undefined;
    });
    const result = await runChange(client, input({ leaseTtlMs: 1000, steps: input().steps.map((s) => ({ ...s, delta: () => { const until = Date.now() + 520; while (Date.now() < until); return s.delta as never; } })) }));
    expect(result).toMatchObject({ status: "compensated", failed: { step: "T-1", result: { reason: "lease_not_held" } } });
    expect(trace(sent)).toContain("undo T-3");
    expect(sent.some((i) => i.lease?.op === "step" && !i.undo && i.entity.id === "T-1")).toBe(false);
  });

  it("a renewal refused lease_hold_exceeded stops the change going forward; its undos run under the lease it still holds, never renewed again: compensated", async () => {
    // A clock of the script's: each step takes 600 ms of a 1 s lease, so every lease is renewed before the next.
    let clock = Date.parse("2025-01-01T00:00:00.000Z");
    const now = vi.spyOn(Date, "now").mockImplementation(() => clock);
    try {
      const acquires = new Map<string, number>();
      const { client, sent } = scripted((i) => {
        if (i.lease?.op === "step") clock += 600;
        if (i.lease?.op !== "acquire") return undefined;
        acquires.set(i.entity.id, (acquires.get(i.entity.id) ?? 0) + 1);
        // T-1's second renewal (before the third step) is past the longest hold.
        return i.entity.id === "T-1" && acquires.get("T-1")! >= 3 ? { ...rejected(i, "lease_hold_exceeded"), details: { acquiredAt: "2025-01-01T00:00:00.000Z", maxHoldMs: 1000 } } : undefined;
      });
      const result = await runChange(client, input({ leaseTtlMs: 1000 }));
      expect(result).toMatchObject({ status: "compensated", failed: { step: "T-2", result: { reason: "lease_hold_exceeded" } } });
      // Refused once: the other leases renewed, T-2 never written, the steps undone (T-1's under its lease still held),
      // T-1 never asked again, every lease released.
      expect(trace(sent).slice(3)).toEqual([
        ...["step T-3", "acquire T-1", "acquire T-2", "acquire T-3", "step T-1", "acquire T-1", "acquire T-2", "acquire T-3"],
        ...["undo T-1", "acquire T-2", "acquire T-3", "undo T-3", "release T-1", "release T-2", "release T-3"],
      ]);
    } finally {
      now.mockRestore();
    }
  });

  it("an acquire refused lease_limit (the agent holds as many leases as owners allow) ends the change not_started at once, the leases it took released, nothing written", async () => {
    const { client, sent } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "lease_limit") : undefined));
    const result = await runChange(client, input());
    expect(result).toMatchObject({ status: "not_started", entity: ticket("T-2"), result: { reason: "lease_limit" } });
    expect(trace(sent)).toEqual(["acquire T-1", "acquire T-2", "release T-1"]);
  });

  it("resume: a change whose lease is refused lease_hold_exceeded before its first step (it holds it from its earlier run) ends incomplete, never not_started: every step may stand; resume after the lease lapses", async () => {
    // The scenario: step T-3 applied, T-1's outcome unknown; the harness resumes, and the owner still holds the
    // change's lease of T-2 past the longest hold.
    const expiresAt = "2025-01-01T00:05:00.000Z";
    const { client, sent } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? { ...rejected(i, "lease_hold_exceeded"), details: { acquiredAt: "2025-01-01T00:00:00.000Z", maxHoldMs: 1000, expiresAt } } : undefined));
    const result = await runChange(client, input());
    expect(result).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "lease_hold_exceeded" } });
    expect(result.status === "incomplete" && result.message).toContain(expiresAt);
    // Asked once (never renewed again), nothing written, the lease it took now released.
    expect(trace(sent)).toEqual(["acquire T-1", "acquire T-2", "release T-1"]);
  });

  it("resume: a change this client left incomplete, resumed while a record is leased to another change or the agent is at its lease limit, ends incomplete with the steps it knows may stand, never not_started; a client started anew does not know it", async () => {
    for (const reason of ["leased", "lease_limit"]) {
      let resumed = false;
      const { client, sent } = scripted((i) => {
        if (!resumed && i.lease?.op === "step" && i.entity.id === "T-1") return { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: "no reply" };
        if (resumed && i.lease?.op === "acquire" && i.entity.id === "T-2") return rejected(i, reason);
        return undefined;
      });
      const first = await runChange(client, input({ settleWithinMs: 1 }));
      expect(first).toMatchObject({ status: "incomplete", applied: ["T-3"] });
      resumed = true;
      const before = sent.length;
      const again = await runChange(client, input({ waitForLeaseMs: 1 }));
      expect(again, reason).toMatchObject({ status: "incomplete", applied: ["T-3"], result: { reason } });
      expect(trace(sent.slice(before)).filter((t) => t.startsWith("step"))).toEqual([]);
      // Still incomplete: asked again, it says the same.
      expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "incomplete", applied: ["T-3"] });
      // Another client (the agent restarted after a crash) has no memory of it.
      const fresh = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, reason) : undefined));
      expect(await runChange(fresh.client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started" });
    }
  });

  it("resume by a client started anew: an acquire refused with details.heldBefore (owners: the change held the record before) ends incomplete, every step may stand, the leases it took released; without it, not_started", async () => {
    const heldBefore = (i: WriteIntent, reason: string, details: Record<string, unknown>) => ({ ...rejected(i, reason), details }) as SubmitResult;
    for (const [reason, details] of [
      ["leased", { expiresAt: "2025-01-01T00:01:00.000Z" }],
      ["lease_limit", { held: 64, max: 64 }],
      ["lease_cooldown", { until: "2025-01-01T00:00:10.000Z", change: "f".repeat(64) }],
      // A resume whose clock is behind the crashed run's: its acquire predates the lapsed lease's mark.
      ["lease_replayed", {}],
    ] as const) {
      const told = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? heldBefore(i, reason, { ...details, heldBefore: true }) : undefined));
      const result = await runChange(told.client, input({ waitForLeaseMs: 1 }));
      expect(result, reason).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason } });
      expect(result.status === "incomplete" && result.message, reason).toMatch(/held its records before.*may have written/);
      expect(trace(told.sent).filter((t) => !t.startsWith("acquire")), reason).toEqual(["release T-1"]);
      // Any value but absent, null or false counts (bytes from Kafka are hostile: read as absent, the unsafe answer).
      for (const odd of ["true", 1, 0, "", { heldBefore: true }]) {
        const hostile = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? heldBefore(i, reason, { ...details, heldBefore: odd }) : undefined));
        expect(await runChange(hostile.client, input({ waitForLeaseMs: 1 })), `${reason} ${JSON.stringify(odd)}`).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason } });
      }
      // The control: the same refusal without it, or with null or false.
      for (const absent of [undefined, null, false]) {
        const plain = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? heldBefore(i, reason, absent === undefined ? { ...details } : { ...details, heldBefore: absent }) : undefined));
        expect(await runChange(plain.client, input({ waitForLeaseMs: 1 })), `${reason} ${JSON.stringify(absent)}`).toMatchObject({ status: "not_started", entity: ticket("T-2"), result: { reason } });
      }
    }
    // Said while the record was waited for: known, even when the last refusal does not say it.
    let refusals = 0;
    const waited = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? heldBefore(i, "leased", refusals++ === 0 ? { heldBefore: true } : {}) : undefined));
    expect(await runChange(waited.client, input({ waitForLeaseMs: 300 }))).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"] });
    expect(refusals).toBeGreaterThan(1);
  });

  it("resume by a client started anew: a granted acquire saying lease.heldBefore (the refused record's mark gone; any value but absent, null or false) ends the change incomplete at a later refusal without it; a grant without it, not_started", async () => {
    for (const said of [true, undefined, "true", 1, null, false]) {
      const { client, sent, applied } = scripted((i) => {
        if (i.lease?.op !== "acquire") return undefined;
        if (i.entity.id === "T-1") return applied(i, { lease: { change: i.lease.change, expiresAt: "2025-01-01T00:01:00.000Z", ...(said === undefined ? {} : { heldBefore: said }) } } as Partial<Reply>);
        if (i.entity.id === "T-2") return { ...rejected(i, "leased"), details: { expiresAt: "2025-01-01T00:01:00.000Z" } } as SubmitResult;
        return undefined;
      });
      const result = await runChange(client, input({ waitForLeaseMs: 1 }));
      if (said !== undefined && said !== null && said !== false) {
        expect(result).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
        expect(result.status === "incomplete" && result.message).toMatch(/held its records before.*may have written/);
      } else expect(result, String(said)).toMatchObject({ status: "not_started", entity: ticket("T-2"), result: { reason: "leased" } });
      expect(trace(sent).filter((t) => !t.startsWith("acquire"))).toEqual(["release T-1"]);
    }
  });

  it("a change this client saw not_started (its leases taken and released leave owners' marks) is not_started again when a refusal says heldBefore: nothing of it stands", async () => {
    let again = false;
    const { client, sent } = scripted((i) => {
      if (i.lease?.op !== "acquire") return undefined;
      // First run: T-2 leased to another change (T-1 taken and released). Again: T-1 taken by that change, which the
      // owner says this change held before (its mark from the release).
      if (!again && i.entity.id === "T-2") return rejected(i, "leased");
      if (again && i.entity.id === "T-1") return { ...rejected(i, "leased"), details: { heldBefore: true } } as SubmitResult;
      return undefined;
    });
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-2") });
    expect(trace(sent).filter((t) => !t.startsWith("acquire"))).toEqual(["release T-1"]);
    again = true;
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-1") });
  });

  it("the memory of a not_started run speaks only for the records it took: heldBefore said of another (an earlier process's mark, its step may stand) ends the change incomplete; of records its remembered not_started runs took, not_started", async () => {
    // A client started anew resumes a change another process ran (a step on T-1) and crashed in. Run 1: T-1 leased
    // to another change, no heldBefore (that mark pushed off): not_started, nothing taken. Run 2: T-1 granted, T-2
    // refused with heldBefore (the crashed process's mark): not this client's run's.
    let run = 1;
    const { client } = scripted((i) => {
      if (i.lease?.op !== "acquire") return undefined;
      if (run === 1 && i.entity.id === "T-1") return rejected(i, "leased");
      if (run === 2 && i.entity.id === "T-2") return { ...rejected(i, "leased"), details: { heldBefore: true } } as SubmitResult;
      return undefined;
    });
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-1") });
    run = 2;
    const result = await runChange(client, input({ waitForLeaseMs: 1 }));
    expect(result).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
    expect(result.status === "incomplete" && result.message).toMatch(/held its records before.*may have written/);

    // The control: marks on records this client's not_started runs took (with those of every such run remembered).
    let again = 1;
    const own = scripted((i) => {
      if (i.lease?.op !== "acquire") return undefined;
      if (again === 1 && i.entity.id === "T-2") return rejected(i, "leased"); // took T-1
      if (again === 2 && i.entity.id === "T-1") return own.applied(i, { lease: { change: i.lease.change, expiresAt: "2025-01-01T00:01:00.000Z", heldBefore: true } } as Partial<Reply>);
      if (again === 2 && i.entity.id === "T-3") return rejected(i, "leased"); // took T-1 and T-2
      if (again === 3 && i.entity.id === "T-1") return own.applied(i, { lease: { change: i.lease.change, expiresAt: "2025-01-01T00:01:00.000Z", heldBefore: true } } as Partial<Reply>);
      if (again === 3 && i.entity.id === "T-2") return { ...rejected(i, "leased"), details: { heldBefore: true } } as SubmitResult;
      return undefined;
    });
    for (const [n, entity] of [[1, "T-2"], [2, "T-3"], [3, "T-2"]] as const) {
      again = n;
      expect(await runChange(own.client, input({ waitForLeaseMs: 1 })), `run ${n}`).toMatchObject({ status: "not_started", entity: ticket(entity) });
    }
  });

  it("a run that throws before any step is built is remembered not_started with the records it took: called again, a grant saying heldBefore on one of them and a refusal on another is not_started; not when that run was itself told heldBefore or lease_cooldown naming the change", async () => {
    const throwers: [string, (s: ChangeInput["steps"][number]) => ChangeInput["steps"][number], (i: WriteIntent) => void, string[]][] = [
      ["delta function", (s) => (s.name === "T-3" ? { ...s, delta: () => { throw new Error("the harness's delta broke"); } } : s), () => undefined, ["T-1", "T-2", "T-3"]],
      // The last acquire not sent: T-1 and T-2 taken.
      ["not_sent", (s) => s, (i) => { if (i.lease?.op === "acquire" && i.entity.id === "T-3") throw new WritError("not_sent", "nothing was sent", { retriable: true }); }, ["T-1", "T-2"]],
    ];
    for (const [what, step, submitThrows, took] of throwers) {
      for (const told of ["nothing", "heldBefore", "lease_cooldown"] as const) {
        let resumed = false;
        let cooled = false;
        const { client, sent, applied } = scripted((i) => {
          if (i.lease?.op === "acquire" && i.entity.id === "T-1") {
            const grant = (heldBefore: boolean) => applied(i, { lease: { change: i.lease!.change, expiresAt: "2025-01-01T00:01:00.000Z", ...(heldBefore ? { heldBefore } : {}) } } as Partial<Reply>);
            if (resumed) return grant(true);
            if (told === "heldBefore") return grant(true);
            if (told === "lease_cooldown" && !cooled) {
              cooled = true;
              return { ...rejected(i, "lease_cooldown"), details: { until: "2025-01-01T00:00:10.000Z", change: i.lease.change } } as SubmitResult;
            }
          }
          if (resumed && i.lease?.op === "acquire" && i.entity.id === "T-2") return rejected(i, "leased");
          if (!resumed) submitThrows(i);
          return undefined;
        });
        await expect(runChange(client, input({ steps: input().steps.map(step), waitForLeaseMs: 1_000 })), `${what} ${told}`).rejects.toThrow();
        expect(trace(sent).filter((t) => t.startsWith("release")), `${what} ${told}`).toEqual(took.map((id) => `release ${id}`));
        resumed = true;
        const result = await runChange(client, input({ waitForLeaseMs: 1 }));
        if (told === "nothing") expect(result, `${what} ${told}`).toMatchObject({ status: "not_started", entity: ticket("T-2") });
        else expect(result, `${what} ${told}`).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"] });
      }
    }
  });

  it("heldBefore said of a record after the run's own acquire of it had no answer is counted (an earlier run's mark may be the one said: unsure, incomplete); of another record too", async () => {
    // The fault: R0 took T-1 and T-2, wrote its step on T-1 and crashed; its leases lapsed (marks); another change took
    // T-2. A fresh client resumes: T-1's acquire is lost (an owner failover), asked again it is granted saying
    // heldBefore (R0's mark), and T-2 is refused leased until waitForLeaseMs: not_started would hide R0's write.
    for (const markOn of ["T-1", "T-2"] as const) {
      let lost = 0;
      const { client, applied } = scripted((i) => {
        if (i.lease?.op !== "acquire") return undefined;
        if (i.entity.id === "T-1" && lost++ === 0) return { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: "no reply" };
        if (i.entity.id === "T-1" && markOn === "T-1") return applied(i, { lease: { change: i.lease.change, expiresAt: "2025-01-01T00:01:00.000Z", heldBefore: true } } as Partial<Reply>);
        if (i.entity.id === "T-2") return { ...rejected(i, "leased"), details: markOn === "T-2" ? { heldBefore: true } : {} } as SubmitResult;
        return undefined;
      });
      const result = await runChange(client, input({ waitForLeaseMs: 150 }));
      expect(lost, markOn).toBe(2);
      expect(result, markOn).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
    }
  });

  it("a grant whose lease.heldBefore is not a boolean (bytes from Kafka are hostile) is read through the client's reply decoding, and counted as said: the lease granted and released, the change incomplete", async () => {
    const codec = new WireCodec({});
    const { client, sent } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "leased") : undefined));
    const decoded: Reply[] = [];
    const submit = client.submit.bind(client);
    (client as { submit: typeof client.submit }).submit = async (input, opts) => {
      const i = input as WriteIntent;
      const got = await submit(i, opts);
      if (!(i.lease?.op === "acquire" && i.entity.id === "T-1" && got.status === "applied")) return got;
      // As producers/writ-client.ts reads a reply off the broker: the codec's decode, whose failure skips the reply.
      const wire = Buffer.from(JSON.stringify({ ...got, lease: { change: i.lease.change, expiresAt: "2025-01-01T00:01:00.000Z", heldBefore: "true" } }));
      const read = await codec.decode("Reply", wire, { maxDepth: RECORD_MAX_DEPTH });
      if (!read.ok) return { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: `reply skipped: ${read.message}` };
      decoded.push(read.value);
      return read.value;
    };
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
    expect(decoded.length).toBeGreaterThan(0);
    expect(decoded[0]).toMatchObject({ status: "applied", lease: { heldBefore: "true" } });
    expect(trace(sent).filter((t) => !t.startsWith("acquire"))).toEqual(["release T-1"]);
  });

  it("an acquire refused lease_cooldown is waited out like a leased record; one naming this change (it held the record lately) ends it incomplete, one naming another change of the agent not_started", async () => {
    let refusals = 2;
    const waited = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" && refusals-- > 0 ? { ...rejected(i, "lease_cooldown"), details: { until: "2025-01-01T00:00:10.000Z", change: i.lease.change } } : undefined));
    expect((await runChange(waited.client, input())).status).toBe("applied");
    expect(trace(waited.sent).filter((t) => t === "acquire T-2")).toHaveLength(3);
    for (const own of [true, false]) {
      const { client } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? { ...rejected(i, "lease_cooldown"), details: { until: "2025-01-01T00:00:10.000Z", change: own ? i.lease.change : "f".repeat(64) } } : undefined));
      const result = await runChange(client, input({ waitForLeaseMs: 1 }));
      expect(result, `own: ${own}`).toMatchObject(own ? { status: "incomplete", applied: ["T-3", "T-1", "T-2"] } : { status: "not_started", entity: ticket("T-2") });
    }
  });

  it("a run that throws after a step was sent (a delta function, a submit not sent or its reply consumer stopped) is remembered with the steps that may stand, its leases left to expire: called again while a record is leased, incomplete, never not_started", async () => {
    const throwers: [string, (i: WriteIntent) => void, string[]][] = [
      ["delta function", () => undefined, ["T-3"]],
      ["not_sent", () => { throw new WritError("not_sent", "nothing was sent", { retriable: true }); }, ["T-3", "T-1"]],
      ["reply_consumer_stopped", () => { throw new WritError("reply_consumer_stopped", "stopped", { retriable: false }); }, ["T-3", "T-1"]],
    ];
    for (const [what, submitThrows, standing] of throwers) {
      let resumed = false;
      const { client, sent } = scripted((i) => {
        if (!resumed && i.lease?.op === "step" && i.entity.id === "T-1") submitThrows(i);
        if (resumed && i.lease?.op === "acquire" && i.entity.id === "T-2") return rejected(i, "leased");
        return undefined;
      });
      const steps = input().steps.map((s) => (what === "delta function" && s.name === "T-1" ? { ...s, delta: () => { throw new Error("the harness's delta broke"); } } : s));
      await expect(runChange(client, input({ steps })), what).rejects.toThrow();
      // Its leases left to expire, as an incomplete change's are: a resume takes them again.
      expect(trace(sent).filter((t) => t.startsWith("release")), what).toEqual([]);
      resumed = true;
      expect(await runChange(client, input({ waitForLeaseMs: 1 })), what).toMatchObject({ status: "incomplete", applied: standing, result: { reason: "leased" } });
    }
  });

  it("a run that throws before any step is sent wrote nothing: the leases it took are released, and called again while a record is leased it is not_started", async () => {
    let resumed = false;
    const { client, sent } = scripted((i) => (resumed && i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "leased") : undefined));
    const steps = input().steps.map((s) => (s.name === "T-3" ? { ...s, delta: () => { throw new Error("the harness's delta broke"); } } : s));
    await expect(runChange(client, input({ steps }))).rejects.toThrow(/delta broke/);
    expect(trace(sent)).toEqual(["acquire T-1", "acquire T-2", "acquire T-3", "release T-1", "release T-2", "release T-3"]);
    resumed = true;
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-2") });
  });

  it("a change this client saw applied, called again while a record is leased, is answered applied from what it knows (its steps as repeats), never not_started; one it saw compensated is not_started, nothing of it standing", async () => {
    let again = false;
    const { client } = scripted((i) => (again && i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "leased") : undefined));
    const first = await runChange(client, input());
    expect(first.status).toBe("applied");
    again = true;
    const repeat = await runChange(client, input({ waitForLeaseMs: 1 }));
    const keys = first.status === "applied" ? first.steps.map((r) => r.intentKey) : [];
    expect(repeat).toMatchObject({ status: "applied", steps: keys.map((intentKey) => ({ status: "applied", intentKey, duplicate: true, state: null })) });
    // Compensated after its hold ran out, called again within the cool-down: refused lease_cooldown naming it, yet
    // nothing of it stands.
    let refuse = false;
    const other = scripted((i) => {
      if (!refuse && i.lease?.op === "step" && !i.undo && i.entity.id === "T-2") return rejected(i, "patch_not_applicable");
      if (refuse && i.lease?.op === "acquire" && i.entity.id === "T-2") return { ...rejected(i, "lease_cooldown"), details: { until: "2025-01-01T00:00:10.000Z", change: i.lease.change } };
      return undefined;
    });
    expect((await runChange(other.client, input())).status).toBe("compensated");
    refuse = true;
    expect(await runChange(other.client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-2"), result: { reason: "lease_cooldown" } });
  });

  it("a change compensated before, run again by a client that does not remember it: its first step answered applied but undoneBy ends it compensated, no later step sent", async () => {
    // The owners answer the earlier run's key of T-3's step as its repeat: applied, and undone since.
    const { client, sent, applied } = scripted((i) => (i.lease?.op === "step" && !i.undo && i.entity.id === "T-3" ? applied(i, { duplicate: true, state: null, undoneBy: "undo-of-T-3" }) : undefined));
    const result = await runChange(client, input());
    expect(result).toMatchObject({ status: "compensated", failed: { step: "T-3", result: { status: "applied", undoneBy: "undo-of-T-3" } }, undone: [] });
    // Nothing went forward, nothing was undone by this run, the leases were released.
    expect(trace(sent)).toEqual(["acquire T-1", "acquire T-2", "acquire T-3", "step T-3", "release T-1", "release T-2", "release T-3"]);
  });

  it("a later step answered undoneBy (undone since): the steps this run applied before it are undone, and the change ends compensated", async () => {
    const { client, sent, applied } = scripted((i) => {
      if (i.lease?.op === "step" && !i.undo && i.entity.id === "T-1") return applied(i, { duplicate: true, state: null, undoneBy: "undo-of-T-1" });
      return undefined;
    });
    const result = await runChange(client, input());
    expect(result).toMatchObject({ status: "compensated", failed: { step: "T-1", result: { undoneBy: "undo-of-T-1" } } });
    expect(result.status === "compensated" ? result.undone.map((u) => u.status) : []).toEqual(["applied"]);
    expect(trace(sent).slice(3)).toEqual(["step T-3", "step T-1", "undo T-3", "release T-1", "release T-2", "release T-3"]);
  });

  it("the memory is bounded by the steps it keeps: a change of 100,000 steps run after another pushes the older out (called again while leased: not_started)", async () => {
    let leased = false;
    const { client } = scripted((i) => (leased && i.lease?.op === "acquire" ? rejected(i, "leased") : undefined));
    const small = input({ stepId: "small", steps: [input().steps[0]!] });
    expect((await runChange(client, small)).status).toBe("applied");
    const step = input().steps[1]!;
    const big = input({ stepId: "big", steps: Array.from({ length: 100_000 }, (_, n) => ({ ...step, name: `s${n}` })) });
    expect((await runChange(client, big)).status).toBe("applied");
    leased = true;
    // The big change is the latest: kept whatever it weighs. The small one was pushed out.
    expect((await runChange(client, { ...big, waitForLeaseMs: 1 })).status).toBe("applied");
    expect(await runChange(client, { ...small, waitForLeaseMs: 1 })).toMatchObject({ status: "not_started" });
  });

  it("what the client remembers of a change is its own: changing a result it returned changes no later answer", async () => {
    let resumed = false;
    const { client } = scripted((i) => {
      if (!resumed && i.lease?.op === "step" && i.entity.id === "T-1") return { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: "no reply" };
      if (resumed && i.lease?.op === "acquire" && i.entity.id === "T-2") return rejected(i, "leased");
      return undefined;
    });
    const first = await runChange(client, input({ settleWithinMs: 1 }));
    expect(first).toMatchObject({ status: "incomplete", applied: ["T-3"] });
    if (first.status === "incomplete") first.applied.splice(0, 1, "tampered");
    resumed = true;
    const second = await runChange(client, input({ waitForLeaseMs: 1 }));
    expect(second).toMatchObject({ status: "incomplete", applied: ["T-3"] });
    if (second.status === "incomplete") second.applied.length = 0;
    expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "incomplete", applied: ["T-3"] });
    // An applied change's replies, changed by the caller, are not what it is answered with later.
    let leased = false;
    const done = scripted((i) => (leased && i.lease?.op === "acquire" && i.entity.id === "T-2" ? rejected(i, "leased") : undefined));
    const applied = await runChange(done.client, input());
    if (applied.status === "applied") (applied.steps[0] as { version: string }).version = "tampered";
    leased = true;
    const answered = await runChange(done.client, input({ waitForLeaseMs: 1 }));
    expect(answered.status === "applied" && answered.steps.map((r) => (r as { version: string }).version)).toEqual(['"v2"', '"v2"', '"v2"']);
  });

  it("the memory of not_started runs never overrides a refusal lease_hold_exceeded or lease_cooldown naming the change, nor one said in an earlier round of the wait", async () => {
    for (const refusal of ["lease_hold_exceeded", "lease_cooldown"] as const) {
      let run = 1;
      const { client } = scripted((i) => {
        if (i.lease?.op !== "acquire" || i.entity.id !== "T-2") return undefined;
        if (run === 1) return rejected(i, "leased"); // not_started, T-1 taken (its mark this client's)
        return { ...rejected(i, refusal), details: refusal === "lease_cooldown" ? { until: "2025-01-01T00:00:10.000Z", change: i.lease.change } : { expiresAt: "2025-01-01T00:05:00.000Z" } } as SubmitResult;
      });
      expect(await runChange(client, input({ waitForLeaseMs: 1 }))).toMatchObject({ status: "not_started", entity: ticket("T-2") });
      run = 2;
      expect(await runChange(client, input({ waitForLeaseMs: 1 })), refusal).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: refusal } });
    }
    // lease_cooldown naming the change in the first round, then leased to another change until waitForLeaseMs.
    let refusals = 0;
    const waited = scripted((i) =>
      i.lease?.op === "acquire" && i.entity.id === "T-2"
        ? refusals++ === 0
          ? ({ ...rejected(i, "lease_cooldown"), details: { until: "2025-01-01T00:00:10.000Z", change: i.lease.change } } as SubmitResult)
          : rejected(i, "leased")
        : undefined,
    );
    expect(await runChange(waited.client, input({ waitForLeaseMs: 300 }))).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
    expect(refusals).toBeGreaterThan(1);
  });

  it("two runs of one change on one client: one ending not_started never replaces what the other remembered incomplete", async () => {
    // Run B (T-4, T-5) is refused lease_hold_exceeded on T-5 (incomplete), run A (T-1, T-2) leased on T-2 (not_started);
    // both read the memory before either writes it, B writes first, then A.
    const releases = new Map<string, () => void>();
    const { client, applied } = scripted(() => undefined);
    const scriptedSubmit = client.submit.bind(client);
    (client as { submit: typeof client.submit }).submit = async (i, opts) => {
      const w = i as WriteIntent;
      if (w.lease?.op === "acquire" && w.entity.id === "T-5") return { ...rejected(w, "lease_hold_exceeded"), details: { expiresAt: "2025-01-01T00:05:00.000Z" } } as SubmitResult;
      if (w.lease?.op === "acquire" && w.entity.id === "T-2") return rejected(w, "leased");
      if (w.lease?.op === "release") {
        await new Promise<void>((resolve) => releases.set(w.entity.id, resolve));
        return applied(w);
      }
      return scriptedSubmit(i, opts);
    };
    const over = (ids: string[]) => input({ waitForLeaseMs: 0, steps: ids.map((id) => ({ name: id, tool: tag, entity: ticket(id), params: { tag: id }, delta: [] })) });
    const b = runChange(client, over(["T-4", "T-5"]));
    const a = runChange(client, over(["T-1", "T-2"]));
    await vi.waitFor(() => expect([...releases.keys()].sort()).toEqual(["T-1", "T-4"]));
    releases.get("T-4")!();
    releases.get("T-1")!();
    expect(await b).toMatchObject({ status: "incomplete" });
    expect(await a).toMatchObject({ status: "not_started", entity: ticket("T-2") });
    // Called again, refused leased (no mark): the memory still says incomplete.
    releases.clear();
    const again = runChange(client, over(["T-1", "T-2"]));
    await vi.waitFor(() => expect(releases.has("T-1")).toBe(true));
    releases.get("T-1")!();
    expect(await again).toMatchObject({ status: "incomplete", result: { reason: "leased" } });
  });

  it("another run of the change on this client that ended applied while this one ran: losing a read before a step then ends incomplete, not compensated over that run's steps", async () => {
    // Run B takes T-1 and T-2 (T-2's grant too large to come back: read again before its step) and is held at its
    // step T-1; run A, the same change, runs whole meanwhile (applied, remembered); then B's read of T-2 is refused.
    let releaseB: () => void = () => undefined;
    const heldB = new Promise<void>((resolve) => (releaseB = resolve));
    let bHeld = false;
    let t2Acquires = 0;
    let aDone = false;
    const { client, sent, applied } = scripted(() => undefined);
    const scriptedSubmit = client.submit.bind(client);
    (client as { submit: typeof client.submit }).submit = async (i, opts) => {
      const w = i as WriteIntent;
      if (w.lease?.op === "acquire" && w.entity.id === "T-2") {
        t2Acquires++;
        if (aDone) return rejected(w, "leased");
        if (t2Acquires === 1) return applied(w, { truncated: true, state: null } as Partial<Reply>);
      }
      if (w.lease?.op === "step" && w.entity.id === "T-1" && !bHeld) {
        bHeld = true;
        await heldB;
      }
      return scriptedSubmit(i, opts);
    };
    const two = input({ settleWithinMs: 1, steps: ["T-1", "T-2"].map((id) => ({ name: id, tool: tag, entity: ticket(id), params: { tag: id }, delta: [] })) });
    const b = runChange(client, two);
    await vi.waitFor(() => expect(bHeld).toBe(true));
    expect(await runChange(client, two)).toMatchObject({ status: "applied" });
    aDone = true;
    releaseB();
    const result = await b;
    // Before, B compensated (undid T-1, which A's run had written too) and answered compensated while A's T-2 stood.
    expect(result).toMatchObject({ status: "incomplete", applied: ["T-1", "T-2"], result: { reason: "leased" } });
    expect(result.status === "incomplete" && result.message).toMatch(/another run of it on this client ended applied meanwhile/);
    expect(trace(sent).filter((t) => t.startsWith("undo"))).toEqual([]);
  });

  it("a resume (owners said heldBefore, or this client left it incomplete) that loses a lease or its read of a record before a step is sent ends incomplete, every step possibly standing, nothing undone; not known to be a resume, compensated", async () => {
    const grant = (i: WriteIntent, applied: (i: WriteIntent, extra?: Partial<Reply>) => Reply, heldBefore: boolean, extra: Partial<Reply> = {}) =>
      applied(i, { lease: { change: i.lease!.change, expiresAt: "2025-01-01T00:01:00.000Z", ...(heldBefore ? { heldBefore } : {}) }, ...extra } as Partial<Reply>);
    // The read before step T-1 (its acquire came back truncated) is refused: the lease lapsed and another change took it.
    for (const heldBefore of [true, false]) {
      let reads = 0;
      const { client, sent, applied } = scripted((i) => {
        if (i.lease?.op !== "acquire") return undefined;
        if (i.entity.id === "T-1") return reads++ === 0 ? grant(i, applied, false, { truncated: true, state: null } as Partial<Reply>) : rejected(i, "leased");
        if (i.entity.id === "T-2") return grant(i, applied, heldBefore);
        return undefined;
      });
      const result = await runChange(client, input({ settleWithinMs: 1 }));
      if (heldBefore) {
        expect(result).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "leased" } });
        expect(result.status === "incomplete" && result.message).toMatch(/ran before.*before step T-1 was sent.*nothing is undone/);
        // Nothing undone; the leases released (nothing of the run in flight; the marks they leave tell a resume).
        expect(trace(sent).filter((t) => !t.startsWith("acquire"))).toEqual(["step T-3", "release T-1", "release T-2", "release T-3"]);
        // Remembered incomplete: called again while a record is leased, incomplete (never not_started).
        const again = await runChange(client, input({ waitForLeaseMs: 1 }));
        expect(again).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"] });
      } else {
        expect(result).toMatchObject({ status: "compensated", failed: { step: "T-1", result: { reason: "leased" } } });
        expect(trace(sent).filter((t) => !t.startsWith("acquire"))).toEqual(["step T-3", "undo T-3", "release T-1", "release T-2", "release T-3"]);
      }
    }
    // A renewal refused lease_hold_exceeded before step T-2 (each step takes 600 ms of a 1 s lease), on a resume this
    // client knows of (it left the change incomplete: T-1's answer lost).
    let clock = Date.parse("2025-01-01T00:00:00.000Z");
    const now = vi.spyOn(Date, "now").mockImplementation(() => clock);
    try {
      let resumed = false;
      const acquires = new Map<string, number>();
      const { client, sent } = scripted((i) => {
        if (i.lease?.op === "step") clock += 600;
        if (!resumed && i.lease?.op === "step" && i.entity.id === "T-1") return { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: "no reply" };
        if (!resumed || i.lease?.op !== "acquire") return undefined;
        acquires.set(i.entity.id, (acquires.get(i.entity.id) ?? 0) + 1);
        return i.entity.id === "T-1" && acquires.get("T-1")! >= 3 ? { ...rejected(i, "lease_hold_exceeded"), details: { maxHoldMs: 1000 } } : undefined;
      });
      expect(await runChange(client, input({ leaseTtlMs: 1000, settleWithinMs: 0 }))).toMatchObject({ status: "incomplete", applied: ["T-3"] });
      resumed = true;
      const before = sent.length;
      const result = await runChange(client, input({ leaseTtlMs: 1000, settleWithinMs: 0 }));
      expect(result).toMatchObject({ status: "incomplete", applied: ["T-3", "T-1", "T-2"], result: { reason: "lease_hold_exceeded" } });
      expect(result.status === "incomplete" && result.message).toMatch(/this client left it incomplete/);
      expect(trace(sent.slice(before)).filter((t) => !t.startsWith("acquire"))).toEqual(["step T-3", "step T-1", "release T-1", "release T-2", "release T-3"]);
      // A step refused after it was sent on a resume keeps the compensation: owners answer an applied one as a repeat.
      const refused = scripted((i) => {
        if (i.lease?.op === "acquire" && i.entity.id === "T-1") return { ...rejected(i, "leased"), details: { heldBefore: true } } as SubmitResult;
        return i.lease?.op === "step" && !i.undo && i.entity.id === "T-2" ? rejected(i, "patch_not_applicable") : undefined;
      });
      let first = true;
      const submit = refused.client.submit.bind(refused.client);
      (refused.client as { submit: typeof submit }).submit = async (i, opts) => {
        const w = i as WriteIntent;
        // T-1 refused saying heldBefore once, then granted.
        if (w.lease?.op === "acquire" && w.entity.id === "T-1" && !first) return refused.applied(w);
        if (w.lease?.op === "acquire" && w.entity.id === "T-1") first = false;
        return submit(i, opts);
      };
      expect(await runChange(refused.client, input({ settleWithinMs: 0 }))).toMatchObject({ status: "compensated", failed: { step: "T-2", result: { reason: "patch_not_applicable" } } });
    } finally {
      now.mockRestore();
    }
  });

  it("a release without an answer is asked again", async () => {
    let lost = 0;
    const { client, sent } = scripted((i) => (i.lease?.op === "release" && i.entity.id === "T-3" && lost++ === 0 ? { status: "unknown", intentId: i.intentId, intentKey: i.intentKey, message: "no reply" } : undefined));
    expect((await runChange(client, input())).status).toBe("applied");
    expect(trace(sent).filter((t) => t === "release T-3")).toHaveLength(2);
  });

  it("a record whose acquire comes back without its state (truncated): a delta function is never built on it; the step is not written and the change is compensated, state_unavailable", async () => {
    const { client, sent, applied } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? applied(i, { state: null, truncated: true }) : undefined));
    const built: unknown[] = [];
    const steps = input().steps.map((s) => (s.name === "T-2" ? { ...s, delta: (current: { state: unknown }) => (built.push(current.state), s.delta as never) } : s));
    const result = await runChange(client, input({ steps }));
    expect(result).toMatchObject({ status: "compensated", failed: { step: "T-2", result: { status: "rejected", reason: "state_unavailable" } } });
    expect(built).toEqual([]);
    // Read once more before the step; then the applied steps are undone, newest first.
    expect(trace(sent).slice(3)).toEqual(["step T-3", "step T-1", "acquire T-2", "undo T-1", "undo T-3", "release T-1", "release T-2", "release T-3"]);
  });

  it("a fixed delta on a record whose acquire came back truncated is written on the version the acquire read", async () => {
    const { client, sent, applied } = scripted((i) => (i.lease?.op === "acquire" && i.entity.id === "T-2" ? applied(i, { state: null, truncated: true }) : undefined));
    expect((await runChange(client, input())).status).toBe("applied");
    expect(sent.find((i) => i.lease?.op === "step" && i.entity.id === "T-2")).toMatchObject({ baseVersion: '"v1"' });
  });
});
