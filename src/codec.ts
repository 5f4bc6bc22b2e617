import { SchemaRegistry, SchemaType } from "@kafkajs/confluent-schema-registry";
import type { z } from "zod";
import { jsonDepth } from "./canonical-json.ts";
import { WritError } from "./errors.ts";
import { jsonSchemaOf } from "./json-schema.ts";
import { LruMap } from "./lru-map.ts";
import { retry } from "./retry.ts";
import { TokenBucket, type BucketClock } from "./token-bucket.ts";
import { registryTransport, type RegistryAuth, type RegistryTls, type RegistryTransport } from "./security/transport.ts";
import { WIRE_SCHEMAS, type WireSchemaName } from "./schemas/index.ts";

/** Confluent wire format: magic byte 0, then the schema id as a big-endian int32. */
const MAGIC_BYTE = 0;
const HEADER_BYTES = 5;

/**
 * `json` framed for schema `id`, as the registry client's `encode` frames it. writ frames its own values: the
 * client's `encode` validates each value again with ajv against the registered schema, which is the JSON Schema
 * of the zod schema the value has just passed (jsonSchemaOf; registered by writ under that id), so the second
 * check could never refuse what the first let through, and cost an owner about 2 % of its CPU per intent.
 */
function frame(id: number, json: string): Buffer {
  const size = Buffer.byteLength(json);
  const out = Buffer.allocUnsafe(HEADER_BYTES + size);
  out[0] = MAGIC_BYTE;
  out.writeInt32BE(id, 1);
  out.write(json, HEADER_BYTES, size, "utf8");
  return out;
}

export type DecodeResult<T> =
  /** `raw`: the JSON as parsed, before validation (what a signature covers). */
  | { ok: true; value: T; framed: boolean; raw: unknown }
  | { ok: false; reason: "undecodable" | "schema_invalid" | "schema_subject_mismatch" | "too_deep"; message: string; parsed?: unknown };

/**
 * How long values of a subject whose schema the registry refused go unframed before registering is tried again
 * (by the next value, or, while the refusal is reported, by the codec itself).
 */
export const REFUSED_RETRY_MS = 60_000;

/**
 * Whether a registration's 4xx answer leaves the subject's values to go as plain JSON (a refusal): 409, incompatible
 * under the subject's compatibility level; 422, a schema the registry holds invalid; 403, writ's user may not
 * register under this subject (a registry's per-subject roles); any other 4xx a registry gives a schema it will not
 * take. Not 401 (the login: every request fails, framed values cannot be read either), 404 (not the registry's API:
 * SCHEMA_REGISTRY_URL), 408 or 429 (an outage). A refusal stops nothing: one subject a registry will not take must
 * not hold the partitions whose values it frames.
 */
export function isSchemaRefusal(status: number): boolean {
  return status >= 400 && status < 500 && status !== 401 && status !== 404 && status !== 408 && status !== 429;
}

/** Where a registry's credentials are set, for the messages of a login it refuses. */
const REGISTRY_CREDENTIALS = "SCHEMA_REGISTRY_USERNAME and SCHEMA_REGISTRY_PASSWORD (a client's schemaRegistryAuth)";

/** Nesting accepted by {@link WireCodec.decode} unless the caller says otherwise. */
export const DEFAULT_MAX_DEPTH = 64;

/**
 * Nesting accepted where writ's records are read back (an agent's replies; `writ tail`, `writ escalations`, the
 * console): the deepest an owner writes. A system of record's state may be nested up to CANONICAL_MAX_DEPTH (256)
 * levels (src/sor/http-adapter.ts), two more in a reply or an escalation around it; an intent up to
 * WRIT_MAX_JSON_DEPTH (at most 128), one more in an escalation or a resolution. The depth check is iterative, so
 * this bound costs no stack.
 */
export const RECORD_MAX_DEPTH = 512;

const MAX_KNOWN_SCHEMA_IDS = 4096;
const MAX_UNKNOWN_SCHEMA_IDS = 1024;
const UNKNOWN_SCHEMA_ID_TTL_MS = 30_000;
/**
 * A "no" younger than UNKNOWN_SCHEMA_ID_TTL_MS is asked again this long after, when a lookup token is saved up:
 * an id framed early (a hostile record with the id the registry hands out next) would otherwise dead-letter a
 * producer's values framed with it, registered since, for the rest of the TTL. A flood of one id costs at most one
 * lookup a second, and only tokens no fresh id waits for.
 */
const UNKNOWN_SCHEMA_ID_RECHECK_MS = 1_000;
/**
 * Registry lookups of schema ids a process has not seen, a second, unless the caller says otherwise
 * (owners: WRIT_REGISTRY_LOOKUPS_PER_S). Any producer can frame values with fresh int32s; without a bound,
 * each partition's owner would send the registry one request per such record, as fast as it answers.
 */
export const DEFAULT_REGISTRY_LOOKUPS_PER_S = 100;

/** One registry lookup of a schema id: what it found, and how long it waited for the lookup budget (ms). */
export interface SchemaIdLookup {
  outcome: "known" | "unknown" | "failed";
  waitedMs: number;
}

/**
 * Encodes and decodes writ's JSON values. With a registry, values are
 * registered (subject `<topic>-value`, JSON Schema) and framed in the
 * Confluent wire format; without one, plain JSON. The decoder accepts both,
 * and zod validates after every decode.
 */
export class WireCodec {
  private readonly registry: SchemaRegistry | null;
  private readonly registryUrl: string;
  /** Schema id per subject and schema; null: the registry refused the schema, values go unframed for now. */
  private readonly ids = new Map<string, Promise<number | null>>();
  private readonly onSchemaRefused: ((subject: string, message: string | null) => void) | undefined;
  /** Subject|schema pairs whose registration the registry refused, until it accepts one. */
  private readonly refused = new Set<string>();
  private readonly refusedRetryMs: number;
  /** The background tries' timers ({@link askAgainLater}), cleared by {@link close}. */
  private readonly retryTimers = new Set<NodeJS.Timeout>();
  private closed = false;
  /**
   * Schema ids seen in framed values: the subjects of ids the registry knows (ids are immutable, so
   * for good), and when an unknown one was last asked. Any producer can frame a value with any
   * int32, so both are bounded, the least recently used dropped first: a flood of fresh ids costs
   * registry lookups, never memory.
   */
  private readonly knownIds = new LruMap<number, Set<string>>(MAX_KNOWN_SCHEMA_IDS);
  /**
   * When an id was last asked about, for the ids whose answer was "no": unknown to the registry, or not registered
   * under a subject a value needed. Both may change (an id registered since; one schema text registered under another
   * subject, which gets the same id), so "no" is asked again after UNKNOWN_SCHEMA_ID_TTL_MS, never cached for good,
   * and sooner (UNKNOWN_SCHEMA_ID_RECHECK_MS) where the lookup budget has a token to spare.
   */
  private readonly unknownIds = new LruMap<number, number>(MAX_UNKNOWN_SCHEMA_IDS);
  private readonly now: () => number;
  private readonly lookups = new Map<number, Promise<Set<string> | null>>();
  /** Basic auth and TLS of every registry request: the client library's (getSchema) and writ's own (register, subject lookups). */
  private readonly transport: RegistryTransport;
  /**
   * Lookups of ids not in either cache wait for a token: a flood of fresh ids reaches the registry at this
   * rate whatever the number of partitions, and slows the records that carry them, never the ones framed
   * with an id already known (those are answered from the cache and take no token).
   */
  private readonly lookupBudget: TokenBucket;
  private readonly onLookup: ((lookup: SchemaIdLookup) => void) | undefined;
  private readonly onUnreachable: ((err: WritError) => void) | undefined;
  private readonly onRegistryFault: ((message: string | null) => void) | undefined;
  /** A registry fault ({@link onRegistryFault}) was reported and no registration has succeeded since. */
  private faulted = false;

  /**
   * `onSchemaRefused`: the registry refused to register a schema (409, an
   * incompatible change under the subject's compatibility level, or 422, a
   * schema it holds invalid). Values of that subject are then written as plain
   * JSON, which every writ reader accepts, so no partition stops on a
   * registry's configuration;
   * the callback hears the first refusal, and `null` once registering succeeds.
   * Registration is tried again every {@link REFUSED_RETRY_MS}
   * (`refusedRetryMs`, for tests) without waiting for a value of the subject:
   * one an owner writes seldom (writ.human-value, writ.dlq-value, an idle
   * reply topic's) would otherwise stay refused, and reported, for hours after
   * its operator set the level right, until {@link close}. Without the
   * callback, the next value after that time tries again.
   *
   * `registryLookupsPerSecond` (default {@link DEFAULT_REGISTRY_LOOKUPS_PER_S}, as many saved up): the
   * budget of lookups of schema ids not seen yet; `onLookup` hears each one. `lookupClock` is for tests.
   *
   * `onUnreachable`: the registry did not answer, or answered 5xx, 408 or 429 (an outage, not a refusal), each time.
   *
   * `onRegistryFault`: the registry refused writ's own requests, whatever the schema: its login (401), or no
   * such path (404: SCHEMA_REGISTRY_URL is not its Confluent-compatible API): a deploy's to fix, encode throws it,
   * not retriable (no value goes unframed for it); or a user without the role for one subject (403), whose values
   * go as plain JSON as for a refusal ({@link isSchemaRefusal}). Heard at the first, `null` once a registration succeeds again.
   */
  constructor(opts: {
    schemaRegistryUrl?: string | undefined;
    schemaRegistryAuth?: RegistryAuth | undefined;
    schemaRegistryTls?: RegistryTls | undefined;
    onSchemaRefused?: (subject: string, message: string | null) => void;
    registryLookupsPerSecond?: number | undefined;
    onLookup?: (lookup: SchemaIdLookup) => void;
    onUnreachable?: (err: WritError) => void;
    onRegistryFault?: (message: string | null) => void;
    lookupClock?: BucketClock;
    refusedRetryMs?: number;
  }) {
    this.onSchemaRefused = opts.onSchemaRefused;
    this.refusedRetryMs = opts.refusedRetryMs ?? REFUSED_RETRY_MS;
    this.onLookup = opts.onLookup;
    this.onUnreachable = opts.onUnreachable;
    this.onRegistryFault = opts.onRegistryFault;
    this.lookupBudget = new TokenBucket({ perSecond: opts.registryLookupsPerSecond ?? DEFAULT_REGISTRY_LOOKUPS_PER_S, ...(opts.lookupClock ? { clock: opts.lookupClock } : {}) });
    const clock = opts.lookupClock;
    this.now = clock ? () => clock.now() : () => performance.now();
    this.registryUrl = (opts.schemaRegistryUrl ?? "").replace(/\/+$/, "");
    this.transport = registryTransport({ auth: opts.schemaRegistryAuth, tls: opts.schemaRegistryTls });
    const { auth, agent } = this.transport;
    this.registry = opts.schemaRegistryUrl
      ? new SchemaRegistry(
          { host: opts.schemaRegistryUrl, retry: { retries: 3 }, ...(auth ? { auth } : {}), ...(agent ? { agent } : {}) },
          // zod's JSON Schema carries `format: date-time`; ajv's strict mode would refuse unknown formats.
          { [SchemaType.JSON]: { strict: false, validateFormats: false } },
        )
      : null;
  }

  get framed(): boolean {
    return this.registry !== null;
  }

  /** Validates `value` with zod, then frames it for `topic`. Throws a non-retriable error on invalid values. */
  async encode<N extends WireSchemaName>(topic: string, name: N, value: z.input<(typeof WIRE_SCHEMAS)[N]>, opts: { subject?: string } = {}): Promise<Buffer> {
    const checked = WIRE_SCHEMAS[name].safeParse(value);
    if (!checked.success) {
      throw new WritError("codec_failed", `refusing to produce an invalid ${name}: ${checked.error.message}`, {
        retriable: false,
        context: { topic },
      });
    }
    const json = JSON.stringify(checked.data);
    const id = this.registry ? await this.schemaId(opts.subject ?? `${topic}-value`, name) : null;
    return id === null ? Buffer.from(json) : frame(id, json);
  }

  /**
   * Decodes bytes that should hold a `name`. Bad bytes are a result, not an
   * exception: the caller dead-letters them. Only an unreachable registry throws
   * (retriable), because that says nothing about the record.
   */
  async decode<N extends WireSchemaName>(
    name: N,
    bytes: Buffer | null,
    opts: { maxDepth?: number; subject?: string } = {},
  ): Promise<DecodeResult<z.output<(typeof WIRE_SCHEMAS)[N]>>> {
    if (bytes === null || bytes.length === 0) return { ok: false, reason: "undecodable", message: "empty value" };
    let framed = false;
    let body = bytes;
    if (bytes[0] === MAGIC_BYTE) {
      if (bytes.length <= HEADER_BYTES) return { ok: false, reason: "undecodable", message: "truncated wire-format header" };
      const id = bytes.readInt32BE(1);
      // A reader without a registry (an agent's client, the console) of what owners with one wrote takes the JSON
      // after the header, which zod checks below. Owners (a subject to check the id against) cannot skip the check.
      if (this.registry || opts.subject !== undefined) {
        const subjects = await this.schemaSubjects(id, opts.subject);
        if (subjects === null) {
          const why = this.registry ? "is not in the registry" : "cannot be checked: this process has no schema registry";
          return { ok: false, reason: "undecodable", message: `schema id ${id} ${why}` };
        }
        // Any registered id frames a value, a dead letter's schema too: the id must be one of this topic's subject.
        if (opts.subject !== undefined && !subjects.has(opts.subject)) {
          return { ok: false, reason: "schema_subject_mismatch", message: `schema id ${id} is not registered under ${opts.subject}` };
        }
      }
      framed = true;
      body = bytes.subarray(HEADER_BYTES);
    }
    let parsed: unknown;
    try {
      parsed = JSON.parse(body.toString("utf8"));
    } catch (err) {
      return { ok: false, reason: "undecodable", message: `not JSON: ${(err as Error).message.slice(0, 200)}` };
    }
    // Before anything walks the value: nothing recursive runs on untrusted input without this bound.
    const maxDepth = opts.maxDepth ?? DEFAULT_MAX_DEPTH;
    if (jsonDepth(parsed, maxDepth) > maxDepth) {
      return { ok: false, reason: "too_deep", message: `JSON nested deeper than ${maxDepth} levels` };
    }
    const checked = WIRE_SCHEMAS[name].safeParse(parsed);
    if (!checked.success) {
      const issues = checked.error.issues.slice(0, 5).map((i) => `${i.path.join(".") || "(root)"}: ${i.message}`);
      return { ok: false, reason: "schema_invalid", message: `not a valid ${name}: ${issues.join("; ")}`, parsed };
    }
    return { ok: true, value: checked.data as z.output<(typeof WIRE_SCHEMAS)[N]>, framed, raw: parsed };
  }

  private schemaId(subject: string, name: WireSchemaName): Promise<number | null> {
    const cacheKey = `${subject}|${name}`;
    const cached = this.ids.get(cacheKey);
    if (cached) return cached;
    const id: Promise<number | null> = retry(() => this.registerAndLoad(subject, name), { maxAttempts: 4, initialDelayMs: 200 }).then((registered) => {
      if (this.refused.delete(cacheKey) && !this.closed) this.onSchemaRefused?.(subject, null);
      this.fault(null);
      return registered;
    }, (err: unknown) => {
      const status = err instanceof WritError ? (err.context as { status?: unknown } | undefined)?.status : undefined;
      if (typeof status !== "number" || !isSchemaRefusal(status)) throw err;
      // Refused for good (until an operator changes the subject): unframed for a while, then asked again.
      if (!this.refused.has(cacheKey)) {
        this.refused.add(cacheKey);
        if (!this.closed) this.onSchemaRefused?.(subject, (err as Error).message);
      }
      this.askAgainLater(subject, name, id);
      return null;
    });
    id.catch(() => this.ids.delete(cacheKey));
    this.ids.set(cacheKey, id);
    return id;
  }

  /**
   * After a refusal: forgets it once {@link REFUSED_RETRY_MS} has passed, so that the next value asks the registry
   * again; while the refusal is reported (`onSchemaRefused`), asks it then itself, until it accepts the schema.
   */
  private askAgainLater(subject: string, name: WireSchemaName, refusal: Promise<number | null> | undefined): void {
    const cacheKey = `${subject}|${name}`;
    if (this.closed) {
      if (this.ids.get(cacheKey) === refusal) this.ids.delete(cacheKey);
      return;
    }
    const timer = setTimeout(() => {
      this.retryTimers.delete(timer);
      if (this.ids.get(cacheKey) === refusal) this.ids.delete(cacheKey);
      if (this.closed || !this.onSchemaRefused || !this.refused.has(cacheKey)) return;
      // Refused again schedules the next try itself; an unreachable registry (retriable: thrown) does not.
      this.schemaId(subject, name).catch(() => this.askAgainLater(subject, name, undefined));
    }, this.refusedRetryMs).unref();
    this.retryTimers.add(timer);
  }

  /**
   * Stops the background tries of refused subjects, and the callbacks: a stopped router or a closed client would
   * otherwise ask the registry every {@link REFUSED_RETRY_MS} for the life of the process while a subject stays
   * refused (and keep this codec, and a stopped router's health board, alive with it). Values may still be
   * encoded and decoded; a refused subject is then asked again by its next value.
   */
  close(): void {
    this.closed = true;
    for (const timer of this.retryTimers) clearTimeout(timer);
    this.retryTimers.clear();
    for (const cacheKey of this.refused) this.ids.delete(cacheKey);
  }

  /**
   * Registers the subject's schema and loads it back by id through the client
   * library, once per subject (a single flight: a burst of concurrent encodes,
   * an owner taking partitions over under load, asks once): what a reader of
   * any client does with a framed value, so an id the registry cannot serve
   * fails here, retriably, before a value framed with it is produced.
   */
  private async registerAndLoad(subject: string, name: WireSchemaName): Promise<number> {
    const id = await this.register(subject, name);
    if (!this.registry) return id;
    try {
      await this.registry.getSchema(id);
    } catch (err) {
      throw this.unreachable(new WritError("registry_unavailable", `could not load schema ${id} of ${subject} from the registry`, { retriable: true, cause: err }));
    }
    return id;
  }

  /**
   * POST /subjects/{subject}/versions: registering a schema the subject already
   * has returns its id, so owners and clients may race on it. (The client
   * library's register() also reads and writes the subject's compatibility
   * config, which races between processes; the subject's config is left to
   * its operators.)
   */
  private async register(subject: string, name: WireSchemaName): Promise<number> {
    const url = `${this.registryUrl}/subjects/${encodeURIComponent(subject)}/versions`;
    let res: Response;
    try {
      res = await this.transport.fetch(url, {
        method: "POST",
        headers: { ...this.transport.headers, "content-type": "application/vnd.schemaregistry.v1+json" },
        body: JSON.stringify({ schemaType: "JSON", schema: JSON.stringify(jsonSchemaOf(name)) }),
        signal: AbortSignal.timeout(10_000),
      });
    } catch (err) {
      throw this.unreachable(new WritError("registry_unavailable", `could not reach the schema registry to register ${subject}`, { retriable: true, cause: err }));
    }
    const body = (await res.json().catch(() => ({}))) as { id?: unknown; message?: unknown };
    if (res.ok && typeof body.id === "number") return body.id;
    const status = res.status;
    const answer = `${status} ${String(body.message ?? "")}`.trim().slice(0, 500);
    const context = { subject, status };
    if (status === 401 || status === 403) {
      const who = status === 401 ? "refused writ's login" : "refused writ's user the registration";
      throw this.registryFault(`the schema registry ${who} of ${subject} (${answer}): check ${REGISTRY_CREDENTIALS}, and that the user may register schemas`, context);
    }
    if (status === 404) {
      throw this.registryFault(`the schema registry has no ${new URL(url).pathname} (404 registering ${subject}): SCHEMA_REGISTRY_URL must be its Confluent-compatible API (Apicurio: …/apis/ccompat/v7)`, context);
    }
    // A refusal of the schema (isSchemaRefusal: plain JSON, a deploy's problem, not a passing fault); 408, 429 and
    // 5xx are an outage.
    const failed = new WritError("registry_unavailable", `registering ${subject} failed: ${answer}`, { retriable: status >= 500 || status === 429 || status === 408, context });
    throw failed.retriable ? this.unreachable(failed) : failed;
  }

  /** A refusal of writ's own request ({@link onRegistryFault}), reported once until a registration succeeds. */
  private registryFault(message: string, context: Record<string, unknown>): WritError {
    this.fault(message);
    return new WritError("registry_unavailable", message, { retriable: false, context });
  }

  private fault(message: string | null): void {
    if (this.faulted === (message !== null)) return;
    this.faulted = message !== null;
    if (!this.closed) this.onRegistryFault?.(message);
  }

  /** `err`, an outage of the registry, once `onUnreachable` has heard it. */
  private unreachable(err: WritError): WritError {
    this.onUnreachable?.(err);
    return err;
  }

  /**
   * The subjects a schema id is registered under, or null for an id the registry does not know. `subject`: the one
   * the caller needs; an id known without it is asked about again after a while, as an unknown one is.
   */
  private schemaSubjects(id: number, subject?: string): Promise<Set<string> | null> {
    if (!this.registry) return Promise.resolve(null);
    const known = this.knownIds.get(id);
    if (known && (subject === undefined || known.has(subject))) return Promise.resolve(known);
    let lookup = this.lookups.get(id);
    if (!lookup) {
      const askedAt = this.unknownIds.get(id);
      const age = askedAt === undefined ? Number.POSITIVE_INFINITY : this.now() - askedAt;
      // A young "no" stands unless it is a second old and a token is saved up (taken here: the lookup takes no other).
      const spareToken = age < UNKNOWN_SCHEMA_ID_TTL_MS && age >= UNKNOWN_SCHEMA_ID_RECHECK_MS && this.lookupBudget.tryTake();
      if (age < UNKNOWN_SCHEMA_ID_TTL_MS && !spareToken) return Promise.resolve(known ?? null);
      lookup = (async () => {
        const waitedMs = spareToken ? 0 : await this.lookupBudget.take();
        try {
          const subjects = await this.askSubjects(id);
          this.onLookup?.({ outcome: subjects === null ? "unknown" : "known", waitedMs });
          return subjects;
        } catch (err) {
          this.onLookup?.({ outcome: "failed", waitedMs });
          throw err;
        }
      })();
      lookup.then(
        (subjects) => {
          if (subjects !== null) this.knownIds.set(id, subjects);
          if (subjects === null || (subject !== undefined && !subjects.has(subject))) this.unknownIds.set(id, this.now());
          else this.unknownIds.delete(id);
        },
        () => undefined,
      );
      void lookup.finally(() => this.lookups.delete(id)).catch(() => undefined);
      this.lookups.set(id, lookup);
    }
    return lookup;
  }

  /** GET /schemas/ids/{id}/versions: the subject-version pairs an id is registered under (Confluent API); null: not registered. */
  private async askSubjects(id: number): Promise<Set<string> | null> {
    let res: Response;
    try {
      res = await this.transport.fetch(`${this.registryUrl}/schemas/ids/${id}/versions`, { headers: this.transport.headers, signal: AbortSignal.timeout(10_000) });
    } catch (err) {
      throw this.unreachable(new WritError("registry_unavailable", `could not look up schema id ${id}`, { retriable: true, cause: err }));
    }
    // Not found; 400 and 422 are answers about the id itself (a registry that refuses a negative one, say),
    // which would otherwise hold its partition for good as an outage. 401, 403 and 5xx stay outages.
    if (res.status === 404 || res.status === 400 || res.status === 422) return null;
    const body = (await res.json().catch(() => null)) as { subject?: unknown }[] | null;
    if (!res.ok || !Array.isArray(body)) {
      const login = res.status === 401 || res.status === 403;
      const hint = login ? `: the schema registry refused writ's ${res.status === 401 ? "login" : "user"}; check ${REGISTRY_CREDENTIALS}` : "";
      const failed = new WritError("registry_unavailable", `looking up schema id ${id} answered ${res.status}${hint}`, { retriable: true, context: { status: res.status } });
      // 401 and 403 are the registry answering (a login it refuses), not an outage of it: the record waits all the same.
      throw res.status >= 500 || res.status === 429 ? this.unreachable(failed) : failed;
    }
    return new Set(body.map((v) => String(v.subject)));
  }
}
