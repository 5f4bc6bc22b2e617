import { describe, expect, it } from "vitest";
import * as demoFixture from "../../../examples/verify-fixture.ts";
import { runVerify } from "../../../src/verify/verify.ts";

// What runVerify refuses before it reaches Kafka (KAFKA_BROKERS=127.0.0.1:9 in the unit run: nothing listens).
const verify = (tools: Parameters<typeof runVerify>[0]["tools"]) => runVerify({ tools, brokers: "127.0.0.1:9", env: {} });

describe("runVerify: the module as given", () => {
  it("refuses a tools export that holds something other than tool declarations, naming it", async () => {
    await expect(verify({ ...demoFixture, tools: [demoFixture.tools[0]!, null as never] })).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining("tools[1] is not a tool declaration"),
    });
  });

  it("refuses a systems(env) that does not give systems, and one that never answers, naming it", async () => {
    await expect(verify({ ...demoFixture, systems: () => "nope" as never })).rejects.toMatchObject({ code: "config_invalid", message: expect.stringContaining("systems(env) must return an array") });
    await expect(
      runVerify({ tools: { ...demoFixture, systems: () => new Promise<never>(() => undefined) }, brokers: "127.0.0.1:9", env: {}, moduleTimeoutMs: 200 }),
    ).rejects.toThrow("the module's systems(env) did not answer within 200 ms");
  });
});
