import { z } from "zod";
import { WIRE_SCHEMAS, type WireSchemaName } from "./schemas/index.ts";

/**
 * The JSON Schema (draft-07, the Confluent registry's default) of a wire
 * schema, generated from its zod source: what writ registers under a subject
 * (`registeredSchema`). `schemas/*.json` are this output; a test fails when
 * they drift.
 */
export function jsonSchemaOf(name: WireSchemaName): Record<string, unknown> {
  return { $id: `https://writ.dev/schemas/${name}.json`, title: name, ...registeredSchema(WIRE_SCHEMAS[name]) };
}

/**
 * zod's JSON Schema of `schema`, with every optional member of an object that takes members it does not name
 * (a loose zod object: `additionalProperties: {}`) registered as what the object says of those (`{}`: any JSON).
 *
 * Registries check each new version of a subject against the last, and Confluent's default level is BACKWARD. Its
 * checker (io.confluent.kafka.schemaregistry.json.diff.ObjectSchemaDiff) compares a member added to such an
 * object with that `additionalProperties` schema: a typed one is PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_-
 * CONTENT_MODEL with TYPE_CHANGED, refused under BACKWARD, FORWARD and FULL (its LENIENT policy too), so every
 * optional member writ added to the ledger, replies or escalations was refused; registered as `{}` it is
 * PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL both ways. That is also the truth about such an object:
 * an older writer keeps and re-writes members a newer one added, so the registry cannot know their type. Nothing
 * is checked less: zod validates every value writ encodes or decodes. Required members, and the members of objects
 * that take no others (`additionalProperties: false`: an optional one added there is
 * OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL, accepted under BACKWARD), keep their types.
 */
export function registeredSchema(schema: z.ZodType): Record<string, unknown> {
  return openMembersUntyped(z.toJSONSchema(schema, { target: "draft-7", unrepresentable: "any" })) as Record<string, unknown>;
}

function openMembersUntyped(node: unknown): unknown {
  if (Array.isArray(node)) return node.map(openMembersUntyped);
  if (node === null || typeof node !== "object") return node;
  const out: Record<string, unknown> = {};
  for (const [key, value] of Object.entries(node)) out[key] = openMembersUntyped(value);
  const { properties, additionalProperties, required } = node as { properties?: unknown; additionalProperties?: unknown; required?: unknown };
  if (properties === null || typeof properties !== "object" || additionalProperties === false) return out;
  const others = typeof additionalProperties === "object" && additionalProperties !== null ? additionalProperties : {};
  const kept = new Set(Array.isArray(required) ? required : []);
  out.properties = Object.fromEntries(
    Object.entries(out.properties as Record<string, unknown>).map(([member, schema]) => [member, kept.has(member) ? schema : structuredClone(others)]),
  );
  return out;
}
