import { z } from "zod";
import { WIRE_SCHEMAS, type WireSchemaName } from "./schemas/index.ts";

/**
 * The JSON Schema (draft-07, the Confluent registry's default) of a wire
 * schema, generated from its zod source. `schemas/*.json` are this output;
 * a test fails when they drift.
 */
export function jsonSchemaOf(name: WireSchemaName): Record<string, unknown> {
  const generated = z.toJSONSchema(WIRE_SCHEMAS[name], { target: "draft-7", unrepresentable: "any" });
  return { $id: `https://writ.dev/schemas/${name}.json`, title: name, ...generated };
}
