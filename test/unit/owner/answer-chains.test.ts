// An intent's run is one chain of the process's answer budget (src/sor/response-budget.ts): the bytes of the
// record it read stay charged while it keeps what it parsed (its PATCH out), and come back on every end of its run:
// its partition revoked mid-run, an outage pause (it reads afresh after), an exception, success. A charge leaked
// would shrink the budget for the rest of the process.
import { describe, expect, it, onTestFinished, vi } from "vitest";
import { IntentPipeline } from "../../../src/owner/intent-pipeline.ts";
import type { SystemOfRecord } from "../../../src/sor/adapter.ts";
import { sorResponseBudget } from "../../../src/sor/response-budget.ts";
import { admitTools } from "../../../src/tools.ts";
import { FakeSystem } from "./fake-system.ts";
import { addTag } from "./pipeline-fixtures.ts";
import { addTagIntentJson, gate, intentRecord, ownerWith, resetAfterEach, txns, until } from "./partition-owner-harness.ts";

vi.mock("../../../src/owner/partition-restore.ts", async () => {
  const { restoredWith } = await import("./partition-owner-harness.ts");
  return { transactionalIdFor: () => "test", restorePartition: async () => restoredWith([]) };
});

resetAfterEach();

const T1 = { type: "ticket", id: "T-1" };
const READ_BYTES = 300_000;

/**
 * An owner whose system reads as the HTTP adapter does (the answer's bytes taken from the process's budget,
 * released once parsed) and whose PATCHes wait for `patch` to open; `patchFirst` runs as each PATCH arrives.
 */
async function owner(opts: { patchFirst?: (sys: FakeSystem) => void; config?: Record<string, unknown>; until?: "patch" | "read" } = {}) {
  const sys = new FakeSystem("helpdesk");
  sys.seed(T1, { tags: [] });
  const patch = gate();
  let patching = 0;
  let read = 0;
  const system: SystemOfRecord = Object.assign(Object.create(sys), {
    name: "helpdesk",
    capabilities: sys.capabilities,
    read: async (e: never, o: never) => {
      const hold = sorResponseBudget.hold();
      try {
        await hold.take(READ_BYTES);
        read++;
        return await sys.read(e, o);
      } finally {
        hold.release();
      }
    },
    patch: async (e: never, ops: never, o: never) => {
      patching++;
      opts.patchFirst?.(sys);
      await patch.wait;
      return sys.patch(e, ops, o);
    },
  });
  const o = ownerWith({ tools: admitTools([addTag], [system], { sorTimeoutMs: 1_000 }), config: { sorTimeoutMs: 1_000, ...opts.config } });
  o.start();
  // Closed also when a test fails: a run left paused would keep its charge into the next test.
  onTestFinished(async () => {
    patch.open();
    await o.close();
  });
  await until(() => o.state === "running", () => `owner ${o.state}`);
  o.accept([intentRecord(0, addTagIntentJson("a"))], "0");
  if (opts.until === "read") await until(() => read > 0, () => "no read yet");
  else await until(() => patching > 0, () => "no PATCH yet");
  return { owner: o, sys, patch, patching: () => patching };
}

const whole = () => ({ held: sorResponseBudget.held, open: sorResponseBudget.open });

describe("an intent's run as one chain of the answer budget", () => {
  it("its read stays charged while its PATCH is out, and is given back when its partition is revoked mid-run", async () => {
    const { owner: o, patch } = await owner();
    // Released by the adapter once parsed, but the intent keeps the record: still charged.
    expect(whole()).toEqual({ held: READ_BYTES, open: 1 });
    const closing = o.close();
    await until(() => o.state === "closed", () => `owner ${o.state}`);
    patch.open();
    await closing;
    expect(whole()).toEqual({ held: 0, open: 0 });
  });

  it("given back on success", async () => {
    const { owner: o, patch, sys } = await owner();
    patch.open();
    await until(() => sorResponseBudget.open === 0, () => `${sorResponseBudget.held} bytes held`);
    expect(sys.patches).toHaveLength(1);
    expect(sorResponseBudget.held).toBe(0);
    await o.close();
  });

  it("given back for an outage pause (the next try reads afresh), and at the revocation ending the pause", async () => {
    // The PATCH is not taken (503): the intent pauses for a minute, keeping nothing it read.
    const { owner: o, patch, patching } = await owner({
      config: { outageBackoffInitialMs: 60_000, outageBackoffMaxMs: 60_000 },
      patchFirst: (sys) => void sys.script.patch.push({ kind: "answer", outcome: { kind: "unavailable", message: "503" } }),
    });
    patch.open();
    await until(() => sorResponseBudget.held === 0, () => `${sorResponseBudget.held} bytes still held through the pause`);
    expect(patching()).toBe(1);
    expect(sorResponseBudget.open).toBe(0);
    await o.close();
    expect(whole()).toEqual({ held: 0, open: 0 });
  });

  /** The pipeline fails (a bug) after the intent read its record: the failure comes out of the run's try. */
  function failingAfterRead() {
    vi.spyOn(IntentPipeline.prototype, "execute").mockImplementation(async (a) => {
      await a.tool.system.read(a.intent.entity, { timeoutMs: 1_000 });
      throw new Error("a bug after the read");
    });
  }

  it("given back for the pause after an exception out of a try", async () => {
    failingAfterRead();
    const { owner: o } = await owner({ until: "read", config: { maxProcessingAttempts: 3, outageBackoffInitialMs: 60_000, outageBackoffMaxMs: 60_000 } });
    await until(() => sorResponseBudget.held === 0, () => `${sorResponseBudget.held} bytes still held through the pause`);
    expect(sorResponseBudget.open).toBe(0);
    await o.close();
  });

  it("given back when the last try's exception settles the intent", async () => {
    failingAfterRead();
    const { owner: o } = await owner({ until: "read", config: { maxProcessingAttempts: 1 } });
    const replied = () => txns.some((t) => t.committed && t.records.some((r) => r.topic === "writ.replies.agent-1"));
    await until(replied, () => "no reply committed");
    await until(() => sorResponseBudget.open === 0, () => `${sorResponseBudget.held} bytes held, ${sorResponseBudget.open} chains open`);
    expect(sorResponseBudget.held).toBe(0);
    await o.close();
  });
});
