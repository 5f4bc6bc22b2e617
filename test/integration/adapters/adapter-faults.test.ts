// The demo's tool specs (examples/demo-tool-specs.ts, what `npm run mcp` serves by default) through the MCP
// server on a real broker: a spec's delta must be the one owners rebuild from the params (delta_mismatch
// otherwise, and the write is lost). Writes counted at the records server.
import { Client } from "@modelcontextprotocol/sdk/client/index.js";
import { StreamableHTTPClientTransport } from "@modelcontextprotocol/sdk/client/streamableHttp.js";
import { describe, expect, it, onTestFinished } from "vitest";
import { readers, specs } from "../../../examples/demo-tool-specs.ts";
import { RUN_ID_META_KEY, STEP_ID_META_KEY, startWritMcpHttpServer, recordsReader } from "../../../producers/adapters/mcp-server.ts";
import { startDemoHarness } from "../../helpers/adapter-fixtures.ts";
import { readVersion, type Harness } from "../../helpers/writ-harness.ts";

async function server(h: Harness): Promise<URL> {
  const client = await h.client("mcp-agent");
  const mcp = await startWritMcpHttpServer({ client, tools: specs, read: recordsReader(specs, readers({ RECORDS_URL: h.records.url })) });
  onTestFinished(() => mcp.close());
  return new URL(mcp.url);
}

async function session(h: Harness, url?: URL): Promise<Client> {
  const agent = new Client({ name: "writ-test-agent", version: "0.0.0" });
  await agent.connect(new StreamableHTTPClientTransport(url ?? (await server(h))));
  onTestFinished(() => agent.close());
  return agent;
}

describe("adapter faults on a real broker", () => {
  it("demo-refund-ref: a refund the model gives its own ref is written once, with the ref (not refused delta_mismatch)", async () => {
    const h = await startDemoHarness({ payment: true });
    const agent = await session(h);
    const args = { paymentId: "pay_1", amountCents: 700, reason: "late", ref: "rma-17" };
    const first = await agent.callTool({ name: "refund_payment", arguments: args });
    const again = await agent.callTool({ name: "refund_payment", arguments: args });
    expect(first.structuredContent).toMatchObject({ status: "applied", duplicate: false });
    expect(again.structuredContent).toMatchObject({ status: "applied", duplicate: true });
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([{ amountCents: 700, reason: "late", ref: "rma-17" }]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });

  it("demo-tag-mixed-tags: a tag on a ticket holding a non-string tag is written (not refused delta_mismatch)", async () => {
    const h = await startDemoHarness({ ticket: { subject: "Charged twice", status: "open", tags: ["billing", 7] } });
    const agent = await session(h);
    const r = await agent.callTool({ name: "tag_ticket", arguments: { ticketId: "T-1", tag: "vip" } });
    expect(r.structuredContent).toMatchObject({ status: "applied", duplicate: false });
    expect((await readVersion(h.records, "ticket", "T-1")).state.tags).toEqual(["billing", 7, "vip"]);
    expect(h.records.patchRequests().filter((p) => p.type === "ticket")).toHaveLength(1);
  });

  // A model regenerates the arguments it makes up (the refund's `ref`) when it calls again, e.g. after an
  // `unknown`: same intent key, other params, refused. The earlier call was applied; the model must not be told
  // that nothing was written, or it takes the refund for refused and makes it again under a changed amount.
  it("key-reused: a call refused because an earlier call with other arguments holds its key is not told nothing was written", async () => {
    const h = await startDemoHarness({ payment: true });
    const agent = await session(h);
    const first = await agent.callTool({ name: "refund_payment", arguments: { paymentId: "pay_1", amountCents: 700, reason: "late", ref: "rma-17" } });
    const reworded = await agent.callTool({ name: "refund_payment", arguments: { paymentId: "pay_1", amountCents: 700, reason: "late", ref: "rma-0017" } });
    expect(first.structuredContent).toMatchObject({ status: "applied", duplicate: false });
    expect(reworded.structuredContent).toMatchObject({ status: "rejected", reason: "key_reused_with_different_params" });
    const instruction = (reworded.structuredContent as { instruction: string }).instruction;
    expect(instruction).not.toMatch(/nothing was written/);
    expect(instruction).toMatch(/earlier write may have been applied/);
    expect((await readVersion(h.records, "payment", "pay_1")).state.refunds).toEqual([{ amountCents: 700, reason: "late", ref: "rma-17" }]);
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
  });

  // A harness that sends its conversation id as a number (a database id) meant one run across sessions; the
  // server passed the value over and took each session as its run, so a retry from a new session wrote again.
  it("meta-run-id-number: a _meta run id that is not a string is refused, not passed over for the session's", async () => {
    const h = await startDemoHarness({ payment: true });
    const url = await server(h);
    const refund = { name: "refund_payment", arguments: { paymentId: "pay_1", amountCents: 700, reason: "late" }, _meta: { [RUN_ID_META_KEY]: 4242 } };
    const first = await (await session(h, url)).callTool(refund);
    const retry = await (await session(h, url)).callTool(refund);
    for (const r of [first, retry]) {
      expect(r.isError).toBe(true);
      expect((r.content as { text: string }[])[0]!.text).toContain(`_meta["${RUN_ID_META_KEY}"] must be a string (it is number)`);
    }
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(0);
  });

  // Two refunds of the same amount in one run, told apart by step ids sent as numbers: the second was taken for
  // a repeat of the first (the step id passed over for the default) and never written.
  it("meta-step-id-number: a _meta step id that is not a string is refused, not passed over for the default step", async () => {
    const h = await startDemoHarness({ payment: true });
    const agent = await session(h);
    const refund = (step: unknown) => agent.callTool({ name: "refund_payment", arguments: { paymentId: "pay_1", amountCents: 700, reason: "late" }, _meta: { [RUN_ID_META_KEY]: `conv-${h.id}`, [STEP_ID_META_KEY]: step } });
    const one = await refund(1);
    const two = await refund(2);
    for (const r of [one, two]) expect((r.content as { text: string }[])[0]!.text).toContain(`_meta["${STEP_ID_META_KEY}"] must be a string (it is number)`);
    // The control: as strings, two writes.
    expect((await refund("1")).structuredContent).toMatchObject({ status: "applied", duplicate: false });
    expect((await refund("2")).structuredContent).toMatchObject({ status: "applied", duplicate: false });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(2);
  });
});
