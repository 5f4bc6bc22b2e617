// Writes schemas/<Name>.json from the zod sources in src/schemas (one source of truth).
import { writeFileSync } from "node:fs";
import { join } from "node:path";
import { jsonSchemaOf } from "../src/json-schema.ts";
import { WIRE_SCHEMAS, type WireSchemaName } from "../src/schemas/index.ts";

const dir = join(import.meta.dirname, "..", "schemas");
for (const name of Object.keys(WIRE_SCHEMAS) as WireSchemaName[]) {
  writeFileSync(join(dir, `${name}.json`), `${JSON.stringify(jsonSchemaOf(name), null, 2)}\n`);
  console.log(`schemas/${name}.json`);
}
