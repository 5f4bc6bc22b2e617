import { z } from "zod";

/** A business entity: `{type, id}`; its Kafka key is `<type>:<id>`. */
export const EntityRef = z.looseObject({
  type: z.string().regex(/^[a-z][a-z0-9_-]{0,63}$/, "lower-case record type, e.g. ticket"),
  id: z.string().min(1).max(256),
});
export type EntityRef = z.infer<typeof EntityRef>;

const pointer = z.string().regex(/^(\/([^~/]|~[01])*)*$/, "a JSON Pointer (RFC 6901)");

/** One RFC 6902 JSON Patch operation. */
export const JsonPatchOp = z.discriminatedUnion("op", [
  z.object({ op: z.literal("add"), path: pointer, value: z.unknown() }).strict(),
  z.object({ op: z.literal("remove"), path: pointer }).strict(),
  z.object({ op: z.literal("replace"), path: pointer, value: z.unknown() }).strict(),
  z.object({ op: z.literal("move"), from: pointer, path: pointer }).strict(),
  z.object({ op: z.literal("copy"), from: pointer, path: pointer }).strict(),
  z.object({ op: z.literal("test"), path: pointer, value: z.unknown() }).strict(),
]);
export type JsonPatchOp = z.infer<typeof JsonPatchOp>;

export const JsonPatch = z.array(JsonPatchOp).min(1).max(256);

/** What a JSON Patch looks like, for messages that refuse one. */
export const JSON_PATCH_EXAMPLE = '[{"op":"replace","path":"/tags","value":["vip"]}]';

/**
 * `value` parsed as a {@link JsonPatch}, or its first problem and where it is (`… at [0].op`): the check the CLI's
 * `--delta` flags and the console's resolve endpoint share.
 */
export function parseJsonPatch(value: unknown): { ok: true; patch: JsonPatchOp[] } | { ok: false; problem: string } {
  const patch = JsonPatch.safeParse(value);
  if (patch.success) return { ok: true, patch: patch.data };
  const issue = patch.error.issues[0];
  const at = issue !== undefined && issue.path.length > 0 ? ` at ${issue.path.map((p) => (typeof p === "number" ? `[${p}]` : `.${String(p)}`)).join("")}` : "";
  return { ok: false, problem: `${issue?.message ?? "invalid"}${at}` };
}

/**
 * The deployment a signature is meant for (an intent's or a resolution's `audience`, an owner's
 * `WRIT_SIGNING_AUDIENCE`): 1–128 of `A-Z a-z 0-9 . _ : / -`, e.g. `prod-eu-1` or `acme:billing/prod`. Signed with the
 * rest of the record, so bytes signed for one deployment are refused by the owners of another that require theirs
 * (docs/wire-contract.md §7).
 */
export const Audience = z.string().regex(/^[A-Za-z0-9._:/-]{1,128}$/, "1–128 of A-Z a-z 0-9 . _ : / -");

/** An opaque HTTP entity tag as the system of record sent it, quotes included (RFC 9110 §8.8.3). */
export const Version = z.string().min(1).max(256);

/** A record as read from its system of record. */
export const Versioned = z.looseObject({
  state: z.unknown(),
  version: Version,
});
export type Versioned = z.infer<typeof Versioned>;

export const IsoTime = z.iso.datetime({ offset: true });

/** Kafka key of an entity: `<recordType>:<id>`. */
export function entityKey(entity: EntityRef): string {
  return `${entity.type}:${entity.id}`;
}

/**
 * A reason from `known`, or one added by a newer owner: readers must accept a
 * reason they do not know (and treat it as its status says), or an agent would
 * wait for a reply it already has. The enum stays in the JSON schema as the
 * documented values.
 */
export const openReason = <T extends readonly [string, ...string[]]>(known: T) =>
  z.union([z.enum(known), z.string().regex(/^[a-z][a-z0-9_]{0,63}$/)]);
