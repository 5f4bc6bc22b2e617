// Writes schemas/<Name>.json from the zod sources in src/schemas (one source of truth), and refreshes the
// copies the Python client packages (python/src/writ_client/schemas: the schemas it registers and decodes).
import { existsSync, writeFileSync } from "node:fs";
import { join } from "node:path";
import { jsonSchemaOf } from "../src/json-schema.ts";
import { WIRE_SCHEMAS, type WireSchemaName } from "../src/schemas/index.ts";

const root = join(import.meta.dirname, "..");
const python = join(root, "python", "src", "writ_client", "schemas");
for (const name of Object.keys(WIRE_SCHEMAS) as WireSchemaName[]) {
  const text = `${JSON.stringify(jsonSchemaOf(name), null, 2)}\n`;
  writeFileSync(join(root, "schemas", `${name}.json`), text);
  console.log(`schemas/${name}.json`);
  if (existsSync(join(python, `${name}.json`))) {
    writeFileSync(join(python, `${name}.json`), text);
    console.log(`python/src/writ_client/schemas/${name}.json`);
  }
}
