import { describe, expect, it } from "vitest";
import { WritError, isRegistryOutage } from "../../src/errors.ts";

describe("isRegistryOutage", () => {
  const down = new WritError("registry_unavailable", "could not reach the schema registry", { retriable: true });
  it("is a retriable registry_unavailable, itself or under a retry that gave up", () => {
    expect(isRegistryOutage(down)).toBe(true);
    expect(isRegistryOutage(new WritError("retries_exhausted", "gave up after 4 attempts", { retriable: false, cause: down }))).toBe(true);
  });
  // A registry refusing writ's login or URL says nothing about the record either: failed, its dead letter (framed
  // too) would fail as well, and the record be passed with nothing written. Owners pause it, and their health says why.
  it("is also a registry that refuses writ's own requests (not retriable: its login, its URL)", () => {
    expect(isRegistryOutage(new WritError("registry_unavailable", "401: check SCHEMA_REGISTRY_USERNAME", { retriable: false, context: { status: 401 } }))).toBe(true);
  });
  it("is not another error, or a registry error under something else", () => {
    expect(isRegistryOutage(new WritError("codec_failed", "bad", { retriable: false, cause: down }))).toBe(false);
    expect(isRegistryOutage(new Error("boom", { cause: down }))).toBe(false);
    expect(isRegistryOutage(undefined)).toBe(false);
  });
});
