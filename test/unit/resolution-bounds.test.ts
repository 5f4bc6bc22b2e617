// What owners admit of a resolution (src/schemas/resolution.ts, resolutionBounds), from the bounds they admit
// intents within, and everything that checks a resolution before it is sent taking its bounds from there: the
// console's delta bounds and room, the CLI's --delta, the owners' configuration. The Python client runs the same
// vectors (python/tests/test_vectors.py).
import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { jsonPatchFlag, UsageError } from "../../src/cli/common.ts";
import { routerConfigFromEnv } from "../../src/config.ts";
import { deltaBounds, deltaRoom, MAX_DELTA_BYTES } from "../../src/console/delta.ts";
import { deltaOutOfBounds, Resolution, RESOLUTION_FIELDS_BYTES, resolutionBounds } from "../../src/schemas/resolution.ts";
import { ROOT } from "../helpers/build.ts";
import { nested } from "../helpers/nested.ts";

interface VectorsFile {
  fieldsBytes: number;
  vectors: { maxIntentBytes: number; maxJsonDepth: number; expected: ReturnType<typeof resolutionBounds> }[];
}
const file = JSON.parse(readFileSync(join(ROOT, "test/fixtures/resolution-bounds-vectors.json"), "utf8")) as VectorsFile;

describe("resolutionBounds", () => {
  it("gives the vectors other clients are promised (test/fixtures/resolution-bounds-vectors.json)", () => {
    expect(RESOLUTION_FIELDS_BYTES).toBe(file.fieldsBytes);
    for (const v of file.vectors) expect(resolutionBounds({ maxIntentBytes: v.maxIntentBytes, maxJsonDepth: v.maxJsonDepth }), JSON.stringify(v)).toEqual(v.expected);
  });

  it("leaves room for every field a resolution holds beside its intent and delta, at their longest and every character escaped", () => {
    // What JSON.stringify writes six bytes for: every string at its schema's longest.
    const escaped = (n: number) => "\u0001".repeat(n);
    const intent = { intentId: "i", intentKey: "0".repeat(64), entity: { type: "t", id: "1" }, tool: "t", agent: { id: "a", runId: "r", stepId: "s" }, baseVersion: '"1"', delta: [{ op: "remove", path: "/x" }], params: {}, replyTo: "r", createdAt: "2025-06-01T12:00:00.000Z" };
    const longest = {
      kind: "resolution",
      resolutionId: escaped(128),
      escalationId: escaped(128),
      intent,
      decision: "discard",
      baseVersion: escaped(256),
      message: escaped(2_000),
      operator: { id: escaped(128) },
      replyTo: escaped(249),
      entity: { type: `a${"b".repeat(63)}`, id: escaped(256) },
      createdAt: "2025-06-01T12:00:00.000000+00:00",
    };
    expect(Resolution.safeParse(longest).success).toBe(true);
    // The registry's framing is 5 bytes.
    const fields = 5 + Buffer.byteLength(JSON.stringify(longest)) - Buffer.byteLength(JSON.stringify(intent));
    expect(fields).toBeGreaterThan(17_000);
    expect(fields).toBeLessThanOrEqual(RESOLUTION_FIELDS_BYTES);
  });

  it("a delta at its bounds passes; one level or one byte more is refused, too_deep before too_large", () => {
    const bounds = { maxBytes: 100, maxDepth: 5 };
    const at = [{ op: "add", path: "/x", value: nested(3) }];
    expect(deltaOutOfBounds(at, bounds)).toBeNull();
    expect(deltaOutOfBounds(undefined, bounds)).toBeNull();
    expect(deltaOutOfBounds([{ op: "add", path: "/x", value: nested(4) }], bounds)).toMatchObject({ reason: "too_deep" });
    const sized = (bytes: number) => [{ op: "add", path: "/x", value: "x".repeat(bytes - JSON.stringify([{ op: "add", path: "/x", value: "" }]).length) }];
    expect(deltaOutOfBounds(sized(100), bounds)).toBeNull();
    expect(deltaOutOfBounds(sized(101), bounds)).toMatchObject({ reason: "too_large", message: expect.stringContaining("101 bytes") });
    expect(deltaOutOfBounds([{ op: "add", path: "/x", value: [nested(4), "x".repeat(200)] }], bounds)).toMatchObject({ reason: "too_deep" });
  });
});

describe("what checks a resolution before it is sent agrees with the owners", () => {
  it("the console: its delta bounds are the owners' for a resolution's delta (at most its own 64 KiB), its room never less for an intent they admit", () => {
    const owners = resolutionBounds({ maxIntentBytes: 262_144, maxJsonDepth: 32 });
    expect(deltaBounds()).toEqual({ maxBytes: MAX_DELTA_BYTES, maxDepth: owners.delta.maxDepth });
    expect(deltaBounds({ maxIntentBytes: 16_384, maxJsonDepth: 10 })).toEqual(resolutionBounds({ maxIntentBytes: 16_384, maxJsonDepth: 10 }).delta);
    const largest = { params: { note: "x".repeat(16_384 - 22) } };
    expect(Buffer.byteLength(JSON.stringify(largest))).toBe(16_384);
    expect(deltaRoom({ maxIntentBytes: 16_384 }, largest)).toBe(16_384);
    // A forged escalation's larger intent leaves less.
    expect(deltaRoom({ maxIntentBytes: 16_384 }, { params: { note: "x".repeat(40_000) } })).toBeLessThan(0);
  });

  it("the CLI: --delta within the owners' bounds for a resolution's delta (WRIT_MAX_JSON_DEPTH, WRIT_MAX_INTENT_BYTES), one level or byte more a usage error", () => {
    const saved = { depth: process.env.WRIT_MAX_JSON_DEPTH, bytes: process.env.WRIT_MAX_INTENT_BYTES };
    process.env.WRIT_MAX_JSON_DEPTH = "10";
    process.env.WRIT_MAX_INTENT_BYTES = "2048";
    try {
      const { delta } = resolutionBounds({ maxIntentBytes: 2048, maxJsonDepth: 10 });
      const deep = (levels: number) => JSON.stringify([{ op: "add", path: "/x", value: nested(levels - 2) }]);
      expect(jsonPatchFlag("delta", deep(delta.maxDepth), undefined)).toHaveLength(1);
      expect(() => jsonPatchFlag("delta", deep(delta.maxDepth + 1), undefined)).toThrow(new UsageError(`--delta: nested deeper than ${delta.maxDepth} levels, which owners refuse inside the record it is sent in (WRIT_MAX_JSON_DEPTH)`));
      const sized = (bytes: number) => JSON.stringify([{ op: "add", path: "/x", value: "x".repeat(bytes - JSON.stringify([{ op: "add", path: "/x", value: "" }]).length) }]);
      expect(jsonPatchFlag("delta", sized(delta.maxBytes), undefined)).toHaveLength(1);
      expect(() => jsonPatchFlag("delta", sized(delta.maxBytes + 1), undefined)).toThrow(/^--delta: larger than 2048 bytes/);
    } finally {
      for (const [name, value] of [["WRIT_MAX_JSON_DEPTH", saved.depth], ["WRIT_MAX_INTENT_BYTES", saved.bytes]] as const) {
        if (value === undefined) delete process.env[name];
        else process.env[name] = value;
      }
    }
  });

  it("the owners' configuration: maxMessageBytes must hold a resolution of the largest intent they admit, naming maxIntentBytes", () => {
    const config = (env: Record<string, string>) => () => routerConfigFromEnv({ KAFKA_BROKERS: "a:1", ...env });
    expect(config({ WRIT_MAX_INTENT_BYTES: "489760" })).not.toThrow();
    expect(config({ WRIT_MAX_INTENT_BYTES: "489761" })).toThrow(
      /WRIT_MAX_INTENT_BYTES \(maxIntentBytes\): must leave room in maxMessageBytes \(1000000\) for a resolution of such an intent, twice maxIntentBytes and 20480 bytes \(1000002\): make it at most 489760, or make maxMessageBytes at least 1000002/,
    );
    expect(config({ WRIT_MAX_INTENT_BYTES: "1024", WRIT_MAX_MESSAGE_BYTES: "16384" })).toThrow(/\(22528\): make maxMessageBytes at least 22528 \(and the brokers' message.max.bytes\)/);
  });
});
