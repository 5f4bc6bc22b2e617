import { describe, expect, it } from "vitest";
import { intFlag, msFlag, UsageError } from "../../src/cli/common.ts";

describe("intFlag, msFlag", () => {
  it("takes an integer within its bounds and names the flag otherwise", () => {
    expect(intFlag("lines", undefined, 10)).toBe(10);
    expect(intFlag("lines", "0", 10)).toBe(0);
    expect(intFlag("port", "65535", 39200, 0, 65535)).toBe(65535);
    expect(() => intFlag("port", "65536", 39200, 0, 65535)).toThrow(/--port must be an integer from 0 to 65535, got 65536/);
    expect(() => intFlag("keep", "0", 100, 1)).toThrow(UsageError);
    expect(() => intFlag("lines", "0x10", 10)).toThrow(/--lines/);
  });

  it("refuses a duration past Node's longest timer (writ submit --timeout-ms 3000000000 would answer unknown at once)", () => {
    expect(msFlag("timeout-ms", "2147483647", 30_000, 1)).toBe(2_147_483_647);
    expect(() => msFlag("timeout-ms", "3000000000", 30_000, 1)).toThrow(/--timeout-ms must be an integer from 1 to 2147483647, got 3000000000/);
    expect(() => msFlag("discover-ms", "2147483648", 5000, 100)).toThrow(UsageError);
  });
});
