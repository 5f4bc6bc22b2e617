import { describe, expect, it } from "vitest";
import { WritError, isRegistryOutage } from "../../src/errors.ts";

describe("isRegistryOutage", () => {
  const down = new WritError("registry_unavailable", "could not reach the schema registry", { retriable: true });
  it("is a retriable registry_unavailable, itself or under a retry that gave up", () => {
    expect(isRegistryOutage(down)).toBe(true);
    expect(isRegistryOutage(new WritError("retries_exhausted", "gave up after 4 attempts", { retriable: false, cause: down }))).toBe(true);
  });
  it("is not a refusal by the registry, another error, or a registry error under something else", () => {
    expect(isRegistryOutage(new WritError("registry_unavailable", "409", { retriable: false }))).toBe(false);
    expect(isRegistryOutage(new WritError("codec_failed", "bad", { retriable: false, cause: down }))).toBe(false);
    expect(isRegistryOutage(new Error("boom", { cause: down }))).toBe(false);
    expect(isRegistryOutage(undefined)).toBe(false);
  });
});
