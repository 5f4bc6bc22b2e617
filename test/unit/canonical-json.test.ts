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

  it("keeps an own __proto__ key from JSON.parse at every depth, sorted like any key, and never touches a prototype", () => {
    const v = JSON.parse('{"b":1,"__proto__":{"polluted":true},"a":[{"__proto__":{"x":1},"A":0}]}');
    expect(canonicalJson(v)).toBe('{"__proto__":{"polluted":true},"a":[{"A":0,"__proto__":{"x":1}}],"b":1}');
    expect(({} as Record<string, unknown>).polluted).toBeUndefined();
    // An own "__proto__" made without JSON.parse is a key too; an inherited property is not.
    const own = Object.defineProperty({ z: 1 }, "__proto__", { value: 2, enumerable: true });
    expect(canonicalJson(own)).toBe('{"__proto__":2,"z":1}');
    expect(canonicalJson(Object.create({ inherited: 1 }))).toBe("{}");
  });

  it("gives deltas that differ under a __proto__ key different fingerprints", () => {
    const delta = (n: number) => [{ op: "add" as const, path: "/meta", value: JSON.parse(`{"__proto__":{"n":${n}}}`) }];
    expect(deltaFingerprint(delta(1), () => false)).not.toBe(deltaFingerprint(delta(2), () => false));
  });
});

describe("canonicalJson is RFC 8785 (JCS)", () => {
  /** The message of the non-retriable not_canonical WritError `v` is refused with. */
  const refused = (v: unknown): string => {
    try {
      canonicalJson(v);
    } catch (err) {
      expect(err).toBeInstanceOf(WritError);
      expect(err).toMatchObject({ code: "not_canonical", retriable: false });
      return (err as Error).message;
    }
    throw new Error("not refused");
  };

  it("sorts keys by UTF-16 code units only: no array-index keys first", () => {
    // JSON.stringify of a sorted copy wrote {"4":2,"":1}, and "9" before "10".
    expect(canonicalJson({ "": 1, "4": 2 })).toBe('{"":1,"4":2}');
    expect(canonicalJson(JSON.parse('{"b":1,"10":2,"9":3,"a":4,"0":5,"-1":6}'))).toBe('{"-1":6,"0":5,"10":2,"9":3,"a":4,"b":1}');
    // Code units, not code points: U+1F600 is D83D DE00, before U+FF5A.
    expect(canonicalJson({ "ｚ": 1, "😀": 2 })).toBe('{"😀":2,"ｚ":1}');
  });

  it("writes RFC 8785's own examples as the RFC prints them (sections 3.2.2 and 3.2.3)", () => {
    const values = JSON.parse(String.raw`{"numbers":[333333333.33333329,1E30,4.50,2e-3,0.000000000000000000000000001],"string":"\u20ac$\u000F\u000aA'\u0042\u0022\u005c\\\"\/","literals":[null,true,false]}`);
    expect(canonicalJson(values)).toBe(String.raw`{"literals":[null,true,false],"numbers":[333333333.3333333,1e+30,4.5,0.002,1e-27],"string":"€$\u000f\nA'B\"\\\\\"/"}`);
    const keys = JSON.parse(String.raw`{"\u20ac":"Euro Sign","\r":"Carriage Return","\ufb33":"Hebrew Letter Dalet With Dagesh","1":"One","\ud83d\ude00":"Emoji: Grinning Face","\u0080":"Control","\u00f6":"Latin Small Letter O With Diaeresis"}`);
    const written = canonicalJson(keys).match(/"(?:[^"\\]|\\.)*":/g);
    expect(written).toEqual([String.raw`"\r":`, '"1":', '"\u0080":', '"\u00f6":', '"\u20ac":', '"\ud83d\ude00":', '"\ufb33":']);
  });

  it("refuses a lone surrogate in a string or a key with not_canonical, saying where", () => {
    expect(refused({ params: { note: "x\ud800y" } })).toMatch(/lone surrogate.* at \/params\/note$/);
    expect(refused(["ok", "\udc00"])).toMatch(/ at \/1$/);
    expect(refused("\ude00\ud83d")).toMatch(/ at \(root\)$/); // a reversed pair is two lone surrogates
    expect(refused({ a: { "k\udbff": 1 } })).toMatch(/object key with a lone surrogate.* at \/a\/k\ufffd$/);
    expect(refused(JSON.parse(String.raw`{"x":"\ud800"}`))).toMatch(/ at \/x$/);
    expect(canonicalJson("\ud83d\ude00")).toBe('"😀"'); // a pair is the character
  });

  it("refuses NaN and ±Infinity (1e400 parses to Infinity) instead of writing null", () => {
    // Before, {"v":1e400} and {"v":null} had the same canonical text, so the same key.
    expect(refused({ amount: JSON.parse("1e400") })).toMatch(/Infinity.* at \/amount$/);
    expect(refused([JSON.parse("-1e400")])).toMatch(/-Infinity/);
    expect(refused(Number.NaN)).toMatch(/NaN/);
    expect(canonicalJson({ v: null })).toBe('{"v":null}');
  });

  it("refuses what has no JSON form at all (a BigInt, undefined) with not_canonical", () => {
    expect(refused({ n: 10n })).toMatch(/BigInt at \/n$/);
    expect(refused(undefined)).toMatch(/no canonical JSON/);
  });

  it("matches an independent JCS writer on arbitrary JSON, lone surrogates and index-like keys included", () => {
    const jcs = (v: unknown): string => {
      if (typeof v === "string") {
        if (/\p{Cs}/u.test(v)) throw new Error("lone surrogate");
        return JSON.stringify(v);
      }
      if (Array.isArray(v)) return `[${v.map(jcs).join(",")}]`;
      if (v !== null && typeof v === "object") {
        const keys = Object.keys(v).sort((a, b) => (a < b ? -1 : a > b ? 1 : 0)); // < compares UTF-16 code units
        return `{${keys.map((k) => `${jcs(k)}:${jcs((v as Record<string, unknown>)[k])}`).join(",")}}`;
      }
      return JSON.stringify(v);
    };
    const unit = fc.constantFrom("a", "B", "0", "1", "9", "é", "😀", "ｚ", "\ud800", "\udc00", "\u0000", '"', "\\", "_");
    // Objects keyed by index-like and other short keys, as well as arbitrary JSON.
    const indexKeyed = fc.dictionary(fc.oneof(fc.nat({ max: 20 }).map(String), fc.constantFrom("", "a", "-1", "01", "1.5", "4294967295")), fc.integer());
    fc.assert(
      fc.property(fc.oneof(fc.jsonValue({ stringUnit: unit, maxDepth: 4 }), indexKeyed), (v) => {
        let expected: string | null;
        try {
          expected = jcs(v);
        } catch {
          expected = null;
        }
        if (expected === null) expect(() => canonicalJson(v)).toThrow(expect.objectContaining({ code: "not_canonical" }));
        else expect(canonicalJson(v)).toBe(expected);
      }),
      { numRuns: 1000 },
    );
  });
});

describe("sha256Hex", () => {
  it("hashes strings and buffers alike", () => {
    expect(sha256Hex("abc")).toBe("ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
    expect(sha256Hex(Buffer.from("abc"))).toBe(sha256Hex("abc"));
  });
});
