// The schemas writ registers must evolve under a Confluent registry's default level (BACKWARD). Its JSON Schema
// checker (io.confluent.kafka.schemaregistry.json.diff.ObjectSchemaDiff) takes an object with
// `additionalProperties: <schema>` (zod's loose objects: `{}`) as a partially open content model: a member added
// later is compared with that schema, and accepted only when it is covered (PROPERTY_ADDED_IS_COVERED_BY_PARTIALLY_-
// OPEN_CONTENT_MODEL). zod's own output types the member, which Confluent refuses (TYPE_CHANGED,
// PROPERTY_ADDED_NOT_COVERED_BY_PARTIALLY_OPEN_CONTENT_MODEL): every optional field writ added to the ledger was.
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { jsonSchemaOf, registeredSchema } from "../../src/json-schema.ts";
import { WIRE_SCHEMAS, type WireSchemaName } from "../../src/schemas/index.ts";
import { LedgerIntentEntry, LedgerLeaseEntry, LedgerMarker, LedgerProgress } from "../../src/schemas/ledger-entry.ts";

type Node = Record<string, unknown>;
const isNode = (v: unknown): v is Node => v !== null && typeof v === "object" && !Array.isArray(v);

/** Every object schema (a node with `properties`) in `schema`, with its JSON pointer. */
function objects(schema: unknown, at = "#"): [string, Node][] {
  if (Array.isArray(schema)) return schema.flatMap((s, i) => objects(s, `${at}/${i}`));
  if (!isNode(schema)) return [];
  const here: [string, Node][] = isNode(schema.properties) ? [[at, schema]] : [];
  return [...here, ...Object.entries(schema).flatMap(([k, v]) => objects(v, `${at}/${k}`))];
}

const intentEntryOf = (registered: Node) => (registered.oneOf as Node[]).find((o) => (o.properties as Node).kind && ((o.properties as Node).kind as Node).const === "intent")!;

describe("registered schemas: optional members of open objects", () => {
  for (const name of Object.keys(WIRE_SCHEMAS) as WireSchemaName[]) {
    it(`${name}: each optional member of an object that takes unnamed members is registered as what the object says of those`, () => {
      let open = 0;
      for (const [at, object] of objects(jsonSchemaOf(name))) {
        if (object.additionalProperties === false) continue;
        open++;
        const required = new Set((object.required as string[] | undefined) ?? []);
        for (const [member, schema] of Object.entries(object.properties as Node)) {
          if (!required.has(member)) expect(schema, `${at}/properties/${member}`).toEqual(object.additionalProperties ?? {});
        }
      }
      expect(open).toBeGreaterThan(0);
    });
  }

  it("the ledger's signedDigest, an optional field added to intent entries, is covered by their additionalProperties", () => {
    const entry = intentEntryOf(jsonSchemaOf("LedgerEntry"));
    expect(entry.additionalProperties).toEqual({});
    expect((entry.properties as Node).signedDigest).toEqual(entry.additionalProperties);
  });

  // The next writ version adds an optional field (any type): its registered schema differs from this one's only by a
  // member equal to what this one's object says of unnamed members, the condition Confluent's checker accepts under
  // BACKWARD, FORWARD and FULL alike.
  it("an optional member a later version adds is registered as this version's object already admits it", () => {
    const next = z.discriminatedUnion("kind", [
      LedgerIntentEntry.extend({ addedLater: z.string().optional(), structuredLater: z.object({ n: z.number().int() }).optional() }),
      LedgerMarker,
      LedgerProgress,
      LedgerLeaseEntry,
    ]);
    const now = intentEntryOf(jsonSchemaOf("LedgerEntry"));
    const later = intentEntryOf(registeredSchema(next));
    const { addedLater, structuredLater, ...rest } = later.properties as Node;
    expect(addedLater).toEqual(now.additionalProperties);
    expect(structuredLater).toEqual(now.additionalProperties);
    expect({ ...later, properties: rest }).toEqual(now);
  });

  it("keeps the types of required members and of every member of a closed object", () => {
    const entry = intentEntryOf(jsonSchemaOf("LedgerEntry"));
    expect((entry.properties as Node).intentKey).toEqual({ type: "string" });
    expect((entry.properties as Node).attempts).toMatchObject({ type: "array", minItems: 1 });
    const intent = jsonSchemaOf("WriteIntent");
    expect(intent.additionalProperties).toBe(false);
    // WriteIntent's `lease` is optional, in a closed object: an optional member added there is
    // OPTIONAL_PROPERTY_ADDED_TO_UNOPEN_CONTENT_MODEL, accepted under BACKWARD, so it keeps its type.
    expect((intent.properties as Node).lease).toMatchObject({ type: "object", additionalProperties: false, required: ["change", "op"] });
  });

  it("checks nothing less: zod still refuses a mistyped optional member on decode", () => {
    const entry = {
      kind: "intent", intentKey: "a".repeat(64), intentId: "i", status: "pending", entity: { type: "ticket", id: "T-1" }, tool: "t",
      fingerprint: "f", attempts: [{ baseVersion: '"v1"', deltaFingerprint: "d" }], cycles: 0, replyTo: "writ.replies.a", updatedAt: "2026-01-01T00:00:00.000Z",
    };
    expect(WIRE_SCHEMAS.LedgerEntry.safeParse({ ...entry, signedDigest: "abc" }).success).toBe(true);
    expect(WIRE_SCHEMAS.LedgerEntry.safeParse({ ...entry, signedDigest: 42 }).success).toBe(false);
  });
});
