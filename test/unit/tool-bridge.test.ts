// The framework adapters' shared parts (producers/adapters/tool-bridge.ts, intent-bases.ts) against a
// scripted client: which version and state the next write is built on, and what the model is told.
// The adapters on a real broker: test/integration/adapters.
import { describe, expect, it } from "vitest";
import { tagTicketSpec } from "../../examples/demo-tool-specs.ts";
import { MemoryIntentBases, submitRepeatableToolCall } from "../../producers/adapters/intent-bases.ts";
import { createWritMcpServer } from "../../producers/adapters/mcp-server.ts";
import { VersionBook, recallVersions, submitToolCall, toModelResult, type WritCallContext } from "../../producers/adapters/tool-bridge.ts";
import type { SubmitResult } from "../../producers/writ-client.ts";
import type { Versioned } from "../../src/schemas/common.ts";
import { scripted } from "../helpers/scripted-client.ts";
import { connectInMemory } from "../helpers/mcp-in-memory.ts";

const T42 = { type: "ticket", id: "T-42" };
const at = "2025-01-01T00:00:00.000Z";
const applied = (extra: Record<string, unknown>): SubmitResult => ({ status: "applied", intentId: "i", intentKey: "k", duplicate: false, at, entity: T42, state: null, version: '"v0"', via: "patch", ...extra }) as SubmitResult;
const leased: SubmitResult = { status: "rejected", intentId: "i", intentKey: "k", duplicate: false, at, reason: "leased", message: "ticket:T-42 is leased to a change that spans records until 2025-01-01T00:01:00Z at the latest; nothing was written. Submit again once it ends." };

describe("recallVersions: a run continued from saved tool results", () => {
  it("passes over results that carry a version without the record (a repeat, a truncated reply): the next delta is built on a record, never on null", async () => {
    const tagged = { state: { subject: "Charged twice", tags: ["billing", "chargeback-risk"] }, version: '"v2"' };
    const saved = [
      { ...toModelResult(applied({ state: tagged.state, version: tagged.version })), entity: T42 },
      // The same call again (an approval replay): answered from the ledger, without the record.
      { ...toModelResult(applied({ duplicate: true, state: null, version: '"v2"' })), entity: T42 },
    ];
    const { client, sent } = scripted(() => applied({ state: null, version: '"v3"' }));
    const versions = new VersionBook();
    recallVersions(versions, saved);
    expect(versions.get(T42)).toEqual(tagged);
    await submitToolCall({ client, runId: "conv-1", versions, read: () => Promise.reject(new Error("not read")) }, tagTicketSpec, { ticketId: "T-42", tag: "vip" });
    expect(sent[0]).toMatchObject({ baseVersion: '"v2"', delta: [{ op: "replace", path: "/tags", value: ["billing", "chargeback-risk", "vip"] }] });

    // Truncated replies (`applied` or `conflict`) and outputs saved before `truncated` was carried (null alone): none is taken.
    const truncatedApplied = { ...toModelResult(applied({ state: null, version: '"v5"', truncated: true })), entity: T42 };
    expect(truncatedApplied).toMatchObject({ truncated: true, record: null });
    const truncatedConflict = {
      ...toModelResult({ status: "conflict", intentId: "i", intentKey: "k", duplicate: false, at, entity: T42, cycle: 1, message: "changed", current: { state: null, version: '"v6"' }, your_change: [], truncated: true }),
      entity: T42,
    };
    expect(truncatedConflict).toMatchObject({ truncated: true, instruction: expect.stringContaining("read the record again") });
    const oldNullConflict = { status: "conflict", entity: T42, cycle: 1, current: { state: null, version: '"v7"' }, your_change: [] };
    for (const stateless of [truncatedApplied, truncatedConflict, oldNullConflict]) {
      const book = new VersionBook();
      recallVersions(book, [stateless]);
      expect(book.get(T42)).toBeUndefined();
    }
  });
});

describe("submitRepeatableToolCall after a conflict", () => {
  it("a conflict reply without the record (truncated) moves the pin to a fresh read, not to a version with no state: deciding again keeps the record's tags", async () => {
    const reads: Versioned[] = [
      { state: { subject: "Charged twice", tags: ["billing"] }, version: '"v1"' },
      { state: { subject: "Charged twice", tags: ["billing", "vip"] }, version: '"v3"' },
    ];
    const { client, sent } = scripted((i, n) =>
      n === 1
        ? { status: "conflict", intentId: "i", intentKey: "k", duplicate: false, at, entity: T42, cycle: 1, message: "changed", current: { state: null, version: '"v3"' }, your_change: i.delta, truncated: true }
        : applied({ state: null, version: '"v4"' }),
    );
    const ctx: WritCallContext = { client, runId: "run-1", versions: new VersionBook(), read: async () => reads.shift()! };
    const bases = new MemoryIntentBases();
    const params = { ticketId: "T-42", tag: "chargeback-risk" };
    expect(await submitRepeatableToolCall(ctx, tagTicketSpec, params, bases)).toMatchObject({ status: "conflict" });
    await submitRepeatableToolCall(ctx, tagTicketSpec, params, bases);
    expect(sent.map((i) => [i.baseVersion, i.delta])).toEqual([
      ['"v1"', [{ op: "replace", path: "/tags", value: ["billing", "chargeback-risk"] }]],
      ['"v3"', [{ op: "replace", path: "/tags", value: ["billing", "vip", "chargeback-risk"] }]],
    ]);
  });
});

describe("MemoryIntentBases", () => {
  it("drops the least recently used pin: one read again (a retry, an approval coming back) outlives pins set after it", () => {
    const bases = new MemoryIntentBases(2);
    const v = (version: string): Versioned => ({ state: {}, version });
    bases.set("approval", v('"v1"'));
    bases.set("b", v('"v2"'));
    expect(bases.get("approval")).toEqual(v('"v1"'));
    bases.set("c", v('"v3"'));
    expect(bases.get("approval")).toEqual(v('"v1"'));
    expect(bases.get("b")).toBeUndefined();
    expect(bases.get("c")).toEqual(v('"v3"'));
  });
});

describe("what the model is told", () => {
  it("a leased refusal: call again later with the same arguments (it ends by itself); other refusals hold", () => {
    const told = toModelResult(leased);
    expect(told).toMatchObject({ status: "rejected", reason: "leased", instruction: expect.stringContaining("Call the tool again later with the same arguments") });
    expect(told.instruction).not.toMatch(/do not retry/i);
    expect(toModelResult({ ...leased, reason: "patch_not_applicable", message: "no" }).instruction).toMatch(/Do not retry it unchanged/);
  });

  it("over MCP, a leased refusal is not flagged isError (it is no failure of the call); a refusal that holds is", async () => {
    let answer = leased;
    const { client } = scripted(() => answer);
    const server = createWritMcpServer({ client, tools: [tagTicketSpec], read: async () => ({ state: { tags: [] }, version: '"v1"' }) }, { fallbackRunId: "run-1" });
    const mcp = await connectInMemory(server);
    try {
      const first = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" } });
      expect(first).toMatchObject({ isError: false, structuredContent: { status: "rejected", reason: "leased" } });
      answer = { ...leased, reason: "patch_not_applicable", message: "no" };
      const second = await mcp.callTool({ name: "tag_ticket", arguments: { ticketId: "T-42", tag: "vip" } });
      expect(second).toMatchObject({ isError: true, structuredContent: { reason: "patch_not_applicable" } });
    } finally {
      await mcp.close();
    }
  });

  it("an unknown outcome: calling again with the same arguments is safe only in the same run (a new MCP session is a new run)", () => {
    const { instruction } = toModelResult({ status: "unknown", intentId: "i", intentKey: "k", message: "no reply" } as SubmitResult);
    expect(instruction).toMatch(/In this same run \(this conversation or session\), calling the same tool with the same arguments again is safe/);
    expect(instruction).toMatch(/new session/);
  });
});
