import { existsSync, readdirSync, readFileSync, statSync } from "node:fs";
import { join, relative, resolve } from "node:path";
import { describe, expect, it } from "vitest";
import { closest, editDistance } from "../../src/closest.ts";
import { KNOWN_WRIT_VARIABLES, unknownWritVariables } from "../../src/known-variables.ts";

const root = resolve(import.meta.dirname, "..", "..");

/** Files under `path` (or `path` itself) that may read a variable: code, compose and shell files. */
function files(path: string): string[] {
  if (!existsSync(path)) return [];
  if (!statSync(path).isDirectory()) return [path];
  return readdirSync(path, { withFileTypes: true }).flatMap((e) => {
    if (e.isDirectory()) return ["node_modules", "dist", ".cache", "__pycache__", ".venv"].includes(e.name) ? [] : files(join(path, e.name));
    return /\.(ts|js|mjs|cjs|py|sh|ya?ml)$|^Dockerfile$/.test(e.name) ? [join(path, e.name)] : [];
  });
}

describe("unknown WRIT_ variables at owner start", () => {
  it("names a misspelt one with the known name closest to it", () => {
    expect(unknownWritVariables({ WRIT_HEALTH_PROT: "9464", KAFKA_BROKERS: "a:1" })).toEqual([
      { variable: "WRIT_HEALTH_PROT", suggestion: "WRIT_HEALTH_PORT", message: "unknown setting WRIT_HEALTH_PROT (did you mean WRIT_HEALTH_PORT?)" },
    ]);
    expect(unknownWritVariables({ WRIT_SOR_TIMEOUT: "5000" })[0]?.message).toBe("unknown setting WRIT_SOR_TIMEOUT (did you mean WRIT_SOR_TIMEOUT_MS?)");
    expect(unknownWritVariables({ WRIT_INTENT_TOPIC: "x" })[0]?.suggestion).toBe("WRIT_INTENTS_TOPIC");
    // far from every known name: no guess, still said once
    expect(unknownWritVariables({ WRIT_MY_BILLING_URL: "http://b" })).toEqual([{ variable: "WRIT_MY_BILLING_URL", message: "unknown setting WRIT_MY_BILLING_URL: writ reads no such variable (ignored)" }]);
    // other prefixes are someone else's
    expect(unknownWritVariables({ KAFKA_BROKER: "a:1", WRITER_ID: "x", LOG_LEVEL: "debug" })).toEqual([]);
  });

  it("warns about none of the variables writ reads", () => {
    expect(unknownWritVariables(Object.fromEntries([...KNOWN_WRIT_VARIABLES].map((v) => [v, "1"])))).toEqual([]);
  });

  it("knows every WRIT_ variable the sources read (a new one read anywhere must join the tables or the list)", () => {
    const roots = ["src", "consumers", "producers", "examples", "scripts", "python/src", "python/tests", "docker-compose.yml", "Dockerfile", "deploy"];
    const seen = new Map<string, string>();
    // known-variables.ts is the list itself (and its comments give a misspelt example)
    for (const file of roots.flatMap((r) => files(join(root, r))).filter((f) => !f.endsWith("known-variables.ts"))) {
      for (const m of readFileSync(file, "utf8").matchAll(/\bWRIT_[A-Z0-9]+(?:_[A-Z0-9]+)*\b/g)) if (!seen.has(m[0])) seen.set(m[0], relative(root, file));
    }
    expect(seen.size).toBeGreaterThan(50);
    expect([...seen].filter(([name]) => !KNOWN_WRIT_VARIABLES.has(name)).map(([name, file]) => `${name} (${file})`)).toEqual([]);
  });
});

describe("closest", () => {
  it("counts a swap of neighbours as one edit, and guesses only for a slip", () => {
    expect(editDistance("PROT", "PORT")).toBe(1);
    expect(editDistance("", "abc")).toBe(3);
    expect(editDistance("kitten", "sitting")).toBe(3);
    expect(closest("baseVerison", ["tool", "baseVersion", "params"])).toBe("baseVersion");
    expect(closest("runid", ["runId", "stepId"])).toBe("runId");
    expect(closest("colour", ["tool", "entity"])).toBeUndefined();
  });
});
