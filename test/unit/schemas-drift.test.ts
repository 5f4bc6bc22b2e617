import { readFileSync } from "node:fs";
import { join } from "node:path";
import { describe, expect, it } from "vitest";
import { jsonSchemaOf } from "../../src/json-schema.ts";
import { WIRE_SCHEMAS, type WireSchemaName } from "../../src/schemas/index.ts";

describe("schemas/*.json", () => {
  for (const name of Object.keys(WIRE_SCHEMAS) as WireSchemaName[]) {
    it(`${name}.json matches its zod source (run npm run schemas:generate after a change)`, () => {
      const onDisk = JSON.parse(readFileSync(join(import.meta.dirname, "..", "..", "schemas", `${name}.json`), "utf8"));
      expect(onDisk).toEqual(jsonSchemaOf(name));
    });
  }
});
