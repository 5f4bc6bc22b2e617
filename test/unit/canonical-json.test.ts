import fc from "fast-check";
import { describe, expect, it } from "vitest";
import { CANONICAL_MAX_DEPTH, canonicalJson, jsonDepth, sha256Hex } from "../../src/canonical-json.ts";
import { WritError } from "../../src/errors.ts";
import { deltaFingerprint } from "../../src/keys.ts";

/** `[[[…[]…]]]`, `depth` levels, built without recursion. */
function nested(depth: number, innermost: unknown = []): unknown {
  let v = innermost;
  for (let i = 1; i < depth; i++) v = [v];
  return v;
}

/** 1,000,000 levels, built once for the tests that need one. */
let million: unknown;
const deepMillion = () => (million ??= nested(1_000_000));

/** An array that throws on any look inside it: whoever touches it walked too deep. */
const poison = new Proxy([], {
  get() {
    throw new Error("walked below the limit");
  },
  ownKeys() {
    throw new Error("walked below the limit");
  },
  has() {
    throw new Error("walked below the limit");
  },
});

/** The same JSON value with the keys of every object in reverse order. */
function reversedKeys(v: unknown): unknown {
  if (Array.isArray(v)) return v.map(reversedKeys);
  if (v !== null && typeof v === "object") {
    return Object.fromEntries(
      Object.keys(v)
        .reverse()
        .map((k) => [k, reversedKeys((v as Record<string, unknown>)[k])]),
    );
  }
  return v;
}

describe("jsonDepth", () => {
  it("counts nesting: a scalar is 0, [] and {} are 1, the deepest branch counts", () => {
    expect(jsonDepth(5, 10)).toBe(0);
    expect(jsonDepth(null, 10)).toBe(0);
    expect(jsonDepth("deep", 10)).toBe(0);
    expect(jsonDepth([], 10)).toBe(1);
    expect(jsonDepth({}, 10)).toBe(1);
    expect(jsonDepth({ a: [{}] }, 10)).toBe(3);
    expect(jsonDepth({ a: 1, b: [1, [2, [3]]], c: { d: {} } }, 10)).toBe(4);
  });

  it("returns the depth when it is exactly the limit, and limit + 1 past it", () => {
    expect(jsonDepth(nested(32), 32)).toBe(32);
    expect(jsonDepth(nested(33), 32)).toBe(33);
    expect(jsonDepth(nested(1_000), 32)).toBe(33);
  });

  it("stops at limit + 1 on a 1,000,000-deep value", () => {
    expect(jsonDepth(deepMillion(), 64)).toBe(65);
  });

  it("never looks inside anything below depth limit + 1 (bounded work on a hostile value)", () => {
    const hostile = nested(66, poison); // poison sits at depth 66
    expect(jsonDepth(hostile, 64)).toBe(65);
    expect(() => jsonDepth(hostile, 70)).toThrow(/walked below the limit/);
  });

  it("measures a 1,000,000-deep value without recursion (no RangeError)", () => {
    expect(jsonDepth(deepMillion(), 2_000_000)).toBe(1_000_000);
  });
});

describe("canonicalJson", () => {
  it("sorts object keys at every depth and keeps array order", () => {
    expect(canonicalJson({ b: 1, a: { d: [{ z: 1, y: 2 }, 3], c: null } })).toBe('{"a":{"c":null,"d":[{"y":2,"z":1},3]},"b":1}');
    expect(canonicalJson([3, 1, 2])).toBe("[3,1,2]");
  });

  it("leaves out undefined values, as JSON does", () => {
    expect(canonicalJson({ a: undefined, b: 1 })).toBe('{"b":1}');
  });

  it("is the same for the same value whatever the key order, and round-trips", () => {
    fc.assert(
      fc.property(
        fc.jsonValue(),
        (v) => {
        const text = canonicalJson(v);
        expect(canonicalJson(reversedKeys(v))).toBe(text);
        expect(JSON.parse(text)).toEqual(JSON.parse(JSON.stringify(v)));
        },
      ),
      { numRuns: 500 },
    );
  });

  it(`accepts exactly CANONICAL_MAX_DEPTH (${CANONICAL_MAX_DEPTH}) levels`, () => {
    expect(canonicalJson(nested(CANONICAL_MAX_DEPTH))).toBe("[".repeat(CANONICAL_MAX_DEPTH) + "]".repeat(CANONICAL_MAX_DEPTH));
  });

  it("refuses one level more with a non-retriable input_too_deep error", () => {
    let thrown: unknown;
    try {
      canonicalJson({ params: nested(CANONICAL_MAX_DEPTH) });
    } catch (err) {
      thrown = err;
    }
    expect(thrown).toBeInstanceOf(WritError);
    expect(thrown).toMatchObject({ code: "input_too_deep", retriable: false });
  });

  it("refuses a 1,000,000-deep value with input_too_deep, never a RangeError", () => {
    expect(() => canonicalJson(deepMillion())).toThrow(expect.objectContaining({ code: "input_too_deep" }));
  });

  // Regression (found by fast-check): keys were copied with `out[key] = …` into a plain object, so an own
  // "__proto__" key (JSON.parse creates one) sets the copy's prototype instead and vanishes from the output.
  // Values that differ only under "__proto__" then hash the same: deltaFingerprint({"__proto__":{"n":1}}) ===
  // deltaFingerprint({"__proto__":{"n":2}}) === deltaFingerprint({}), so the ledger takes another change under
  // the same intent key for a repeat (answered "applied, duplicate") instead of rejecting
  // key_reused_with_different_params. (zod's record drops such keys from params; the delta's values are kept.)
  it("keeps an own __proto__ key, so values that differ under it serialize differently", () => {
    const a = JSON.parse('{"__proto__":{"n":1},"y":2}');
    const b = JSON.parse('{"__proto__":{"n":2},"y":2}');
    expect(canonicalJson(a)).toBe(JSON.stringify(a));
    expect(canonicalJson(a)).not.toBe(canonicalJson(b));
  });

  it("gives deltas that differ under a __proto__ key different fingerprints", () => {
    const delta = (n: number) => [{ op: "add" as const, path: "/meta", value: JSON.parse(`{"__proto__":{"n":${n}}}`) }];
    expect(deltaFingerprint(delta(1), () => false)).not.toBe(deltaFingerprint(delta(2), () => false));
  });
});

describe("sha256Hex", () => {
  it("hashes strings and buffers alike", () => {
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(sha256Hex(Buffer.from("abc"))).toBe(sha256Hex("abc"));
  });
});
