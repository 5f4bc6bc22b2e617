import { createServer, connect, type Socket } from "node:net";
import type { AddressInfo } from "node:net";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment } from "../../examples/demo-tools.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl, startHarness } from "../helpers/writ-harness.ts";

/**
 * A TCP relay to the schema registry that can be cut: while cut it takes each
 * connection and closes it at once (the owner's fetch fails), and counts them.
 */
async function startCuttableRelay(target: string): Promise<{ url: string; cut(): void; restore(): void; refused(): number }> {
  const to = new URL(target);
  let down = false;
  let refused = 0;
  const open = new Set<Socket>();
  const server = createServer((inbound) => {
    open.add(inbound);
    inbound.on("close", () => open.delete(inbound));
    if (down) {
      refused++;
      inbound.destroy();
      return;
    }
    const outbound = connect(Number(to.port), to.hostname);
    open.add(outbound);
    outbound.on("close", () => open.delete(outbound));
    inbound.pipe(outbound).pipe(inbound);
    inbound.on("error", () => outbound.destroy());
    outbound.on("error", () => inbound.destroy());
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => {
    for (const s of open) s.destroy();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  const port = (server.address() as AddressInfo).port;
  return {
    url: `${to.protocol}//127.0.0.1:${port}${to.pathname}`,
    cut: () => {
      down = true;
      // Kept-alive connections would carry on: cut those too.
      for (const s of open) s.destroy();
    },
    restore: () => {
      down = false;
    },
    refused: () => refused,
  };
}

describe("a registry outage between the write and its result", () => {
  it("the result is staged again when the registry is back; the write is never sent twice (counted at the records server)", async () => {
    const registry = registryUrl();
    if (!registry) throw new Error("this test needs the schema registry (SCHEMA_REGISTRY_URL)");
    const h = await startHarness({ tools: [refundPayment] });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const relay = await startCuttableRelay(registry);
    await h.startRouter({ config: { ...h.config, schemaRegistryUrl: relay.url } });
    // A new agent: its reply topic's subject is registered by the owner at the first reply, after the write.
    const agent = await h.client(`agent-reg-${h.id}`);
    // The records server commits the PATCH and answers it (applied) 1 s later, within the owner's 1.5 s timeout:
    // time to cut the registry between the write and the encoding of its result.
    h.records.setFaults([{ kind: "commit-then-delay", delayMs: 1000, times: 1, match: { type: "payment", id: "pay_1" } }]);
    const input = {
      tool: refundPayment,
      entity: { type: "payment", id: "pay_1" },
      runId: `run-${h.id}`,
      stepId: "refund-1",
      baseVersion: (await readVersion(h.records, "payment", "pay_1")).version,
      delta: [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 900, reason: "late" as const, ref: "r1" } }],
      params: { amountCents: 900, reason: "late", ref: "r1" },
    };
    const key = agent.buildIntent(input).intentKey;
    const reply = agent.submit(input);
    // The write reached the records server: cut the registry before the owner encodes the result.
    await waitFor(() => h.records.patchRequests(key).length === 1, { timeoutMs: 30_000, message: "the PATCH at the records server" });
    relay.cut();
    // More refused connections than one registration's retries (4): the owner's first staging attempt gave up.
    await waitFor(() => relay.refused() >= 6, { timeoutMs: 60_000, message: "the owner trying the registry while it is cut" });
    relay.restore();
    const answer = await reply;
    expect(answer).toMatchObject({ status: "applied", duplicate: false });
    expect(h.records.patchRequests(key)).toHaveLength(1);
    const payment = await readVersion(h.records, "payment", "pay_1");
    expect((payment.state as { refunds: { ref?: string }[] }).refunds.filter((r) => r.ref === "r1")).toHaveLength(1);
  });
});

describe("a registry outage while a record is answered at admission", () => {
  it("its dead letter goes out once the registry is back, and the group's offset passes it (never held for the session)", async () => {
    const registry = registryUrl();
    if (!registry) throw new Error("this test needs the schema registry (SCHEMA_REGISTRY_URL)");
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 1 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    const relay = await startCuttableRelay(registry);
    await h.startRouter({ config: { ...h.config, schemaRegistryUrl: relay.url } });
    const agent = await h.client(`agent-adm-${h.id}`);
    const refund = async (ref: string) => {
      const base = (await readVersion(h.records, "payment", "pay_1")).version;
      const delta = [{ op: "add" as const, path: "/refunds/-", value: { amountCents: 100, reason: "late" as const, ref } }];
      const answer = await agent.submit({ tool: refundPayment, entity: { type: "payment", id: "pay_1" }, runId: `run-${h.id}`, stepId: ref, baseVersion: base, delta, params: { amountCents: 100, reason: "late", ref } });
      expect(answer).toMatchObject({ status: "applied" });
    };
    // The partition is open and has answered (its ledger and reply subjects registered); the harness's
    // dead-letter topic is this test's own, so its subject is registered at the first dead letter.
    await refund("before");
    relay.cut();
    await h.produceRaw("payment:pay_1", Buffer.from("not JSON"));
    // More refused connections than one registration's retries (4): the first encoding of the dead letter gave up.
    await waitFor(() => relay.refused() >= 6, { timeoutMs: 60_000, message: "the owner trying the registry while it is cut" });
    relay.restore();
    const [dead] = await h.readTopic(h.config.topics.dlq, "DeadLetter", 1);
    expect(dead).toMatchObject({ reason: "undecodable", source: { offset: "1" } });

    // An intent after it is answered, and the group's committed offset passes all three.
    await refund("after");
    const admin = new Kafka({ clientId: `registry-outage-test-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await waitFor(
      async () => {
        const [group] = await admin.fetchOffsets({ groupId: h.config.groupId, topics: [h.config.topics.intents] });
        return Number(group?.partitions[0]?.offset) === 3;
      },
      { timeoutMs: 30_000, message: "the group's offset never passed the record answered during the outage" },
    );
  });
});
