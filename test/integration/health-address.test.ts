// An owner whose health address cannot be had (WRIT_HEALTH_PORT held by another process, WRIT_HEALTH_HOST no
// address of this machine) refuses to start naming the setting, before it connects: a rejected startRouter
// leaves no member consuming in the owners' group and creates no topic.
import { createServer } from "node:net";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import { startRouter } from "../../src/owner/router.ts";
import { brokers, startHarness } from "../helpers/writ-harness.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";

describe("the health address, checked at start", () => {
  it("a held WRIT_HEALTH_PORT or an unresolvable WRIT_HEALTH_HOST: config_invalid naming it; no owner left in the group, no topic created", async () => {
    const h = await startHarness({ tools: [tagTicket] });
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => void holder.close());
    const held = (holder.address() as { port: number }).port;
    const admin = new Kafka({ clientId: `writ-test-health-${h.id}`, brokers: brokers(), logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    const systems = [createHttpSystemOfRecord({ name: "helpdesk", baseUrl: h.records.url, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" })];

    for (const [settings, variable, said] of [
      [{ healthPort: held }, "WRIT_HEALTH_PORT", `WRIT_HEALTH_PORT (healthPort): the health endpoints cannot listen on 127.0.0.1:${held}: the port is in use (EADDRINUSE)`],
      [{ healthPort: 0, healthHost: "no-such-host.invalid" }, "WRIT_HEALTH_HOST", "WRIT_HEALTH_HOST (healthHost): the health endpoints cannot listen on no-such-host.invalid:0"],
    ] as const) {
      let refused: unknown;
      const router = await startRouter({ config: { ...h.config, ...settings }, tools: [tagTicket], systems }).catch((err: unknown) => {
        refused = err;
        return null;
      });
      // had it started (the old behaviour on a held port: it joined the group, then threw), stop it for the next case
      onTestFinished(() => router?.stop());
      expect(router).toBeNull();
      expect(refused).toMatchObject({ code: "config_invalid", context: { field: variable } });
      expect((refused as Error).message).toContain(said);
      const { groups } = await admin.describeGroups([h.config.groupId]);
      expect(groups[0]?.members ?? []).toEqual([]);
      expect(await admin.listTopics()).not.toContain(h.config.topics.intents);
    }
  }, 60_000);
});
