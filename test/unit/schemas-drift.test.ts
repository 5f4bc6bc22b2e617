import { existsSync, readFileSync } from "node:fs";
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
    const python = join(import.meta.dirname, "..", "..", "python", "src", "writ_client", "schemas", `${name}.json`);
    if (existsSync(python)) {
      it(`the Python client's copy of ${name}.json is the same (npm run schemas:generate refreshes it)`, () => {
        expect(JSON.parse(readFileSync(python, "utf8"))).toEqual(jsonSchemaOf(name));
      });
    }
  }
});
