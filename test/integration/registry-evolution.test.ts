// writ's schemas evolve under the registry's compatibility levels (docs/wire-contract.md §9), on the real registry:
// the upgrade from the schemas writ registered before optional members of open objects were registered untyped,
// and the optional members later versions add. (Apicurio's checker accepts more than Confluent's: it takes a typed
// member added to an `additionalProperties: {}` object, which Confluent refuses; test/unit/registered-schema.test.ts
// holds the property Confluent's rules need.)
import { randomUUID } from "node:crypto";
import { readFileSync } from "node:fs";
import { describe, expect, it } from "vitest";
import { z } from "zod";
import { WireCodec } from "../../src/codec.ts";
import { jsonSchemaOf, registeredSchema } from "../../src/json-schema.ts";
import { LedgerIntentEntry, LedgerLeaseEntry, LedgerMarker, LedgerProgress, type LedgerEntry } from "../../src/schemas/ledger-entry.ts";
import { ccompat, deletedAfterTest } from "../helpers/registry-subjects.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { registryUrl } from "../helpers/writ-harness.ts";

const register = (subject: string, schema: unknown) => ccompat(`/subjects/${subject}/versions`, "POST", { schemaType: "JSON", schema: JSON.stringify(schema) });
const setLevel = async (subject: string, compatibility: string) => expect((await ccompat(`/config/${subject}`, "PUT", { compatibility })).status).toBe(200);
/** A ledger topic of the test's own; its subject is deleted when the test finishes. */
const ledgerTopic = () => {
  const topic = `writ.evolve.${randomUUID().slice(0, 8)}`;
  deletedAfterTest(`${topic}-value`);
  return topic;
};

/** What writ registered before this change: zod's JSON Schema as it is, optional members typed. */
const previousGeneration = (schema: z.ZodType) => ({
  $id: "https://writ.dev/schemas/LedgerEntry.json",
  title: "LedgerEntry",
  ...z.toJSONSchema(schema, { target: "draft-7", unrepresentable: "any" }),
});
const ledgerOf = (intent: z.ZodType) => z.discriminatedUnion("kind", [intent as typeof LedgerIntentEntry, LedgerMarker, LedgerProgress, LedgerLeaseEntry]);
const LEDGER_NOW = ledgerOf(LedgerIntentEntry);
/** The ledger before signedDigest, the field docs/wire-contract.md §9 said a BACKWARD registry refused. */
const LEDGER_BEFORE_SIGNED_DIGEST = ledgerOf(LedgerIntentEntry.omit({ signedDigest: true }));
/** A later writ version's ledger: intent entries with two more optional fields. */
const LEDGER_NEXT = ledgerOf(LedgerIntentEntry.extend({ addedLater: z.string().optional(), structuredLater: z.object({ n: z.number().int() }).optional() }));
const nextSchema = { $id: "https://writ.dev/schemas/LedgerEntry.json", title: "LedgerEntry", ...registeredSchema(LEDGER_NEXT) };

const marker = (): LedgerEntry => ({ kind: "marker", partition: 0, nonce: randomUUID(), owner: "o", at: new Date().toISOString() });

/** Encodes a ledger value as an owner does; what the registry refused, if anything. */
async function encodeLedger(topic: string) {
  const told: (string | null)[] = [];
  const codec = new WireCodec({ schemaRegistryUrl: registryUrl(), onSchemaRefused: (_s, m) => told.push(m) });
  const value = marker();
  const bytes = await codec.encode(topic, "LedgerEntry", value);
  return { bytes, told, value, codec };
}

describe("registered schemas evolve under the subject's compatibility level", () => {
  for (const [from, old] of [
    ["this version's ledger", LEDGER_NOW],
    ["the ledger before signedDigest", LEDGER_BEFORE_SIGNED_DIGEST],
  ] as const) {
    it(`the first upgrade: a BACKWARD subject holding ${from}, as writ registered it before, takes the schema writ registers now`, async () => {
      const topic = ledgerTopic();
      const subject = `${topic}-value`;
      expect((await register(subject, previousGeneration(old))).status).toBe(200);
      await setLevel(subject, "BACKWARD");
      const { bytes, told, value, codec } = await encodeLedger(topic);
      expect(told).toEqual([]);
      expect(bytes[0]).toBe(0);
      const latest = (await (await ccompat(`/subjects/${subject}/versions/latest`)).json()) as { id: number; version: number; schema: string };
      expect(latest.id).toBe(bytes.readInt32BE(1));
      expect(latest.version).toBe(2);
      expect(JSON.parse(latest.schema)).toEqual(jsonSchemaOf("LedgerEntry"));
      expect(await codec.decode("LedgerEntry", bytes, { subject })).toMatchObject({ ok: true, framed: true, value });
    });
  }

  for (const level of ["BACKWARD", "BACKWARD_TRANSITIVE", "FORWARD", "FULL", "FULL_TRANSITIVE"]) {
    it(`an optional field a later version adds is accepted at ${level}`, async () => {
      const subject = `${ledgerTopic()}-value`;
      expect((await register(subject, jsonSchemaOf("LedgerEntry"))).status).toBe(200);
      await setLevel(subject, level);
      const res = await register(subject, nextSchema);
      expect(res.status, await res.text()).toBe(200);
    });
  }

  // The upgrade widens members that were typed (registered as `{}` now): BACKWARD, not FORWARD. A FULL subject's
  // operator lets it through once, as docs/operations.md §6.7 says: the level that accepts it, the schema registered
  // at once from schemas/<name>.json (the body its jq command sends), the level restored; the owner's problem clears
  // on its own next try, with no value written. FULL holds for the additions after it.
  it("a FULL subject refuses the first upgrade until its operator lets it through once; later optional fields pass FULL", async () => {
    const topic = ledgerTopic();
    const subject = `${topic}-value`;
    expect((await register(subject, previousGeneration(LEDGER_NOW))).status).toBe(200);
    await setLevel(subject, "FULL");
    const told: (string | null)[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl(), onSchemaRefused: (_s, m) => told.push(m), refusedRetryMs: 100 });
    expect((await codec.encode(topic, "LedgerEntry", marker()))[0]).toBe("{".charCodeAt(0));
    expect(told).toHaveLength(1);
    expect(told[0]).toMatch(/409/);
    await setLevel(subject, "BACKWARD");
    const file = JSON.parse(readFileSync(new URL("../../schemas/LedgerEntry.json", import.meta.url), "utf8")) as unknown;
    const res = await register(subject, file);
    expect(res.status, await res.clone().text()).toBe(200);
    const { id } = (await res.json()) as { id: number };
    await setLevel(subject, "FULL");
    await waitFor(() => told.at(-1) === null, { message: () => JSON.stringify(told) });
    const bytes = await codec.encode(topic, "LedgerEntry", marker());
    expect(bytes[0]).toBe(0);
    expect(bytes.readInt32BE(1)).toBe(id);
    const next = await register(subject, nextSchema);
    expect(next.status, await next.text()).toBe(200);
  });

  // Mixed versions (docs/operations.md §6.7): an older process's schema, typed members, narrows what a newer one
  // registered first, refused at BACKWARD; on a subject that held it before the upgrade it is an earlier version,
  // whose id the registry returns at any level.
  it("an older writ's schema is refused on a subject a newer one created, and accepted where it was registered before the upgrade", async () => {
    const created = ledgerTopic();
    expect((await register(`${created}-value`, jsonSchemaOf("LedgerEntry"))).status).toBe(200);
    await setLevel(`${created}-value`, "BACKWARD");
    const refused = await register(`${created}-value`, previousGeneration(LEDGER_NOW));
    expect(refused.status, await refused.text()).toBe(409);

    const upgraded = ledgerTopic();
    const before = await register(`${upgraded}-value`, previousGeneration(LEDGER_NOW));
    const { id: oldId } = (await before.json()) as { id: number };
    await setLevel(`${upgraded}-value`, "BACKWARD");
    expect((await register(`${upgraded}-value`, jsonSchemaOf("LedgerEntry"))).status).toBe(200);
    await setLevel(`${upgraded}-value`, "FULL");
    const rolledBack = await register(`${upgraded}-value`, previousGeneration(LEDGER_NOW));
    expect(rolledBack.status).toBe(200);
    expect(((await rolledBack.json()) as { id: number }).id).toBe(oldId);
  });
});
