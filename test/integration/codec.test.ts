import { randomUUID } from "node:crypto";
import { createServer } from "node:http";
import type { AddressInfo } from "node:net";
import { SchemaRegistry, SchemaType } from "@kafkajs/confluent-schema-registry";
import Ajv from "ajv";
import { describe, expect, it, onTestFinished } from "vitest";
import { WireCodec } from "../../src/codec.ts";
import { startRecordingProxy } from "../helpers/recording-proxy.ts";
import { ccompat, refusingSubject } from "../helpers/registry-subjects.ts";
import { sampleIntent as intent } from "../helpers/sample-intent.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { registryUrl } from "../helpers/writ-harness.ts";

describe("WireCodec against the real schema registry", () => {
  it("registers under <topic>-value, frames in the Confluent wire format and decodes back", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
    const value = intent();
    const bytes = await codec.encode(topic, "WriteIntent", value);
    expect(bytes[0]).toBe(0);
    const decoded = await codec.decode("WriteIntent", bytes);
    expect(decoded).toEqual({ ok: true, value, framed: true, raw: value });
    const res = await fetch(`${registryUrl()}/subjects/${topic}-value/versions/latest`);
    expect(res.status).toBe(200);
    expect(((await res.json()) as { id: number }).id).toBe(bytes.readInt32BE(1));
  });

  // writ frames its values itself (one validation, zod's, instead of zod's and then ajv's in the client library's
  // encode): the bytes must be the library's, which every Confluent-format reader expects.
  it("frames a value byte for byte as the registry client library's encode does", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const value = { ...intent(), params: { tag: "ünïcödé ✓ 𝄞" } };
    const bytes = await new WireCodec({ schemaRegistryUrl: registryUrl() }).encode(topic, "WriteIntent", value);
    const library = new SchemaRegistry({ host: registryUrl()! }, { [SchemaType.JSON]: { strict: false, validateFormats: false } });
    expect(bytes.equals(await library.encode(bytes.readInt32BE(1), value))).toBe(true);
    expect(await library.decode(bytes)).toEqual(value);
  });

  // Regression: a registry refusing writ's schema (409 under the subject's compatibility level) made every encode
  // of a result throw, so the owner's partition stopped. Now the values go unframed and a person is told.
  it("writes plain JSON, and says so, when the registry refuses the schema (409); a reader still decodes it", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const subject = `${topic}-value`;
    await refusingSubject(subject);
    const told: [string, string | null][] = [];
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl(), onSchemaRefused: (s, m) => told.push([s, m]) });
    const value = intent();
    const bytes = await codec.encode(topic, "WriteIntent", value);
    expect(bytes[0]).toBe("{".charCodeAt(0));
    expect(told).toHaveLength(1);
    expect(told[0]![0]).toBe(subject);
    expect(told[0]![1]).toMatch(/409/);
    expect(await new WireCodec({ schemaRegistryUrl: registryUrl() }).decode("WriteIntent", bytes, { subject })).toMatchObject({ ok: true, framed: false, value });
    // Refused once is remembered: the next value does not ask the registry again.
    await codec.encode(topic, "WriteIntent", intent());
    expect(told).toHaveLength(1);
  });

  // Regression: a refused registration was tried again only when the next value of its subject was written, so the
  // owners' schema: problem of a subject they write seldom (writ.human-value, writ.dlq-value, an idle reply topic's)
  // stayed for hours after the operator had set the level right (docs/operations.md §6.7). Now the codec asks again
  // on its own while the refusal is reported. No value is written after the refusal here.
  it("asks the registry again on its own while a refusal is reported, and says so once it is accepted", async () => {
    const registry = new URL(registryUrl()!);
    const proxy = await startRecordingProxy(registry.origin);
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const subject = `${topic}-value`;
    await refusingSubject(subject);
    const told: (string | null)[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}`, onSchemaRefused: (_s, m) => told.push(m), refusedRetryMs: 100 });
    expect((await codec.encode(topic, "WriteIntent", intent()))[0]).toBe("{".charCodeAt(0));
    const registrations = () => proxy.seen.filter((r) => r.method === "POST" && r.path.endsWith(`/subjects/${subject}/versions`));
    // Refused again, and not said again: the problem stands, one error line.
    await waitFor(() => registrations().length >= 3, { message: () => `${registrations().length} registrations` });
    expect(registrations().every((r) => r.status === 409)).toBe(true);
    expect(told).toHaveLength(1);
    expect(told[0]).toMatch(/409/);
    // The operator lets the schema through: the refusal ends without a value of the subject.
    expect((await ccompat(`/config/${subject}`, "PUT", { compatibility: "NONE" })).status).toBe(200);
    await waitFor(() => told.at(-1) === null, { message: () => JSON.stringify(told) });
    expect(told).toHaveLength(2);
    const latest = (await (await ccompat(`/subjects/${subject}/versions/latest`, "GET")).json()) as { id: number };
    const bytes = await codec.encode(topic, "WriteIntent", intent());
    expect(bytes[0]).toBe(0);
    expect(bytes.readInt32BE(1)).toBe(latest.id);
  });

  // Regression: the client library coalesces the fetch of a schema it lacks, but then every encode that was waiting
  // compiled it, so an owner's first burst of results (64 at once when it takes partitions over under load) compiled
  // the same schema 64 times (~0.6 s of CPU). Counted at ajv's compile, which the library calls, and at the registry.
  it("compiles a subject's schema once, however many values the first burst encodes", async () => {
    const proto = (Ajv as unknown as { prototype: { compile: (...a: unknown[]) => unknown } }).prototype;
    const compile = proto.compile;
    let compiles = 0;
    proto.compile = function (this: unknown, ...a: unknown[]) {
      compiles++;
      return compile.apply(this, a);
    };
    onTestFinished(() => {
      proto.compile = compile;
    });
    const registry = new URL(registryUrl() ?? "");
    const proxy = await startRecordingProxy(registry.origin);
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}` });
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const values = Array.from({ length: 64 }, intent);
    const encoded = await Promise.all(values.map((v) => codec.encode(topic, "WriteIntent", v)));
    const id = encoded[0]!.readInt32BE(1);
    expect(encoded.every((b) => b[0] === 0 && b.readInt32BE(1) === id)).toBe(true);
    expect(compiles).toBe(1);
    const asked = (path: RegExp) => proxy.seen.filter((r) => path.test(r.path)).length;
    expect(asked(/\/subjects\/[^/]+\/versions$/)).toBe(1);
    expect(asked(new RegExp(`/schemas/ids/${id}(\\?|$)`))).toBe(1);
    const reader = new WireCodec({ schemaRegistryUrl: registryUrl() });
    expect((await Promise.all(encoded.map((b) => reader.decode("WriteIntent", b)))).map((d) => d.ok && d.value)).toEqual(values);
  });

  it("gives racing processes the same schema id for the same subject", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const codecs = Array.from({ length: 4 }, () => new WireCodec({ schemaRegistryUrl: registryUrl() }));
    const framed = await Promise.all(codecs.map((c) => c.encode(topic, "WriteIntent", intent())));
    expect(new Set(framed.map((b) => b.readInt32BE(1))).size).toBe(1);
  });

  it("accepts plain JSON, and reports bad bytes as results, not exceptions", async () => {
    const codec = new WireCodec({ schemaRegistryUrl: registryUrl() });
    const value = intent();
    expect(await codec.decode("WriteIntent", Buffer.from(JSON.stringify(value)))).toEqual({ ok: true, value, framed: false, raw: value });
    expect(await codec.decode("WriteIntent", Buffer.from("{oops"))).toMatchObject({ ok: false, reason: "undecodable" });
    expect(await codec.decode("WriteIntent", Buffer.from(JSON.stringify({ intentId: 1 })))).toMatchObject({ ok: false, reason: "schema_invalid" });
    const unknownId = Buffer.concat([Buffer.from([0, 0x7f, 0xff, 0xff, 0xf0]), Buffer.from(JSON.stringify(value))]);
    expect(await codec.decode("WriteIntent", unknownId)).toMatchObject({ ok: false, reason: "undecodable" });
  });

  it("remembers at most 1,024 unknown schema ids: a flood of fresh ids costs lookups, not memory", async () => {
    const registry = new URL(registryUrl() ?? "");
    const proxy = await startRecordingProxy(registry.origin);
    // A budget no lookup here waits for: this is about the caches (the budget is the next test's). Its clock stands
    // still: no answer here gets old enough to be asked again.
    const clock = { now: () => 0, sleep: async () => undefined };
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}`, registryLookupsPerSecond: 1_000_000, lookupClock: clock });
    const body = Buffer.from(JSON.stringify(intent()));
    // Ids no registry has handed out (they count up from 1); 3,000 of them, as a hostile producer would frame values.
    const ids = Array.from({ length: 3000 }, (_, i) => 0x7f000000 + i);
    const framed = (id: number) => {
      const header = Buffer.alloc(5); // magic byte 0, then the id
      header.writeInt32BE(id, 1);
      return Buffer.concat([header, body]);
    };
    const decodeAll = async (some: number[]) => {
      for (let i = 0; i < some.length; i += 100) {
        const results = await Promise.all(some.slice(i, i + 100).map((id) => codec.decode("WriteIntent", framed(id))));
        expect(results.every((r) => !r.ok && r.reason === "undecodable")).toBe(true);
      }
    };
    const lookups = () => proxy.seen.filter((r) => /\/schemas\/ids\/\d+\/versions$/.test(r.path)).length;
    await decodeAll(ids);
    expect(lookups()).toBe(3000);
    // The latest 1,024 are remembered (not asked again within a second); the oldest were let go and are asked again.
    await decodeAll(ids.slice(-1000));
    expect(lookups()).toBe(3000);
    await decodeAll(ids.slice(0, 500));
    expect(lookups()).toBe(3500);
  }, 120_000);

  it("looks up unseen ids within its budget, each waiting its turn; ids already seen take no token", async () => {
    const registry = new URL(registryUrl() ?? "");
    const proxy = await startRecordingProxy(registry.origin);
    let now = 0;
    const sleeps: { ms: number; release: () => void }[] = [];
    const clock = { now: () => now, sleep: (ms: number) => new Promise<void>((release) => sleeps.push({ ms, release })) };
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}`, registryLookupsPerSecond: 2, lookupClock: clock });
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const subject = `${topic}-value`;
    const good = await codec.encode(topic, "WriteIntent", intent());
    const header = Buffer.alloc(5);
    const unknown = (id: number) => (header.writeInt32BE(id, 1), Buffer.concat([header, Buffer.from(JSON.stringify(intent()))]));
    const lookups = () => proxy.seen.filter((r) => /\/schemas\/ids\/\d+\/versions$/.test(r.path)).length;

    // Two tokens saved up: the good id's lookup and an unknown one's.
    expect((await codec.decode("WriteIntent", good, { subject })).ok).toBe(true);
    expect(await codec.decode("WriteIntent", unknown(0x7d000001), { subject })).toMatchObject({ ok: false, reason: "undecodable" });
    expect(lookups()).toBe(2);
    // The third fresh id waits half a second (2 a second) before it asks.
    const third = codec.decode("WriteIntent", unknown(0x7d000002), { subject });
    await waitFor(() => sleeps.length === 1, { message: "the third lookup waits for a token" });
    expect(sleeps[0]!.ms).toBe(500);
    // Meanwhile ids already seen are answered from the caches, known or unknown, without a token or a request.
    expect((await codec.decode("WriteIntent", good, { subject })).ok).toBe(true);
    expect(await codec.decode("WriteIntent", unknown(0x7d000001), { subject })).toMatchObject({ ok: false, reason: "undecodable" });
    expect(lookups()).toBe(2);
    expect(sleeps).toHaveLength(1);
    now += 500;
    sleeps[0]!.release();
    expect(await third).toMatchObject({ ok: false, reason: "undecodable", message: "schema id 2097152002 is not in the registry" });
    expect(lookups()).toBe(3);
  });

  // A registry gives one schema text one id, whatever the subject (checked here on the real one): a deployment sharing
  // the registry (staging's `stg.intents-value`) registers writ's next schema first, a record framed with that id
  // reaches this owner, and when this deployment's clients register the same schema under its subject, the owner had
  // cached the id's subjects for good: every intent they framed was dead-lettered schema_subject_mismatch until a restart.
  it("an id seen under another subject only is asked again a second later: it may be registered under this one since", async () => {
    const registry = new URL(registryUrl() ?? "");
    const proxy = await startRecordingProxy(registry.origin);
    let now = 0;
    const clock = { now: () => now, sleep: async () => undefined };
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}`, lookupClock: clock });
    const ccompat = (path: string, body: unknown) =>
      fetch(`${registryUrl()}${path}`, { method: "POST", headers: { "content-type": "application/vnd.schemaregistry.v1+json" }, body: JSON.stringify(body) });
    const schema = { schemaType: "JSON", schema: JSON.stringify({ $schema: "http://json-schema.org/draft-07/schema#", type: "object", title: `shared-${randomUUID()}` }) };
    const other = `writ.codec.${randomUUID().slice(0, 8)}-value`;
    const subject = `writ.codec.${randomUUID().slice(0, 8)}-value`;
    const id = ((await (await ccompat(`/subjects/${other}/versions`, schema)).json()) as { id: number }).id;
    const header = Buffer.alloc(5);
    header.writeInt32BE(id, 1);
    const bytes = Buffer.concat([header, Buffer.from(JSON.stringify(intent()))]);
    const lookups = () => proxy.seen.filter((r) => r.path.endsWith(`/schemas/ids/${id}/versions`)).length;

    expect(await codec.decode("WriteIntent", bytes, { subject })).toMatchObject({ ok: false, reason: "schema_subject_mismatch" });
    expect(((await (await ccompat(`/subjects/${subject}/versions`, schema)).json()) as { id: number }).id).toBe(id);
    // Within a second the answer stands (a flood of such records costs no lookups)...
    now += 999;
    expect(await codec.decode("WriteIntent", bytes, { subject })).toMatchObject({ ok: false, reason: "schema_subject_mismatch" });
    expect(lookups()).toBe(1);
    // ...then, a token saved up, the registry is asked again, and the id's new subject counts.
    now += 1;
    expect(await codec.decode("WriteIntent", bytes, { subject })).toMatchObject({ ok: true, framed: true });
    expect(lookups()).toBe(2);
    // Known under the subject now: for good, with no more lookups.
    now += 60_000;
    expect((await codec.decode("WriteIntent", bytes, { subject })).ok).toBe(true);
    expect((await codec.decode("WriteIntent", bytes, { subject: other })).ok).toBe(true);
    expect(lookups()).toBe(2);
  });

  /** A codec on a registry behind a recording proxy, its lookup clock turned by the test; framed values of any id. */
  async function turnedCodec(registryLookupsPerSecond?: number) {
    const registry = new URL(registryUrl() ?? "");
    const proxy = await startRecordingProxy(registry.origin);
    const clock = { now: 0, sleeps: [] as { ms: number; release: () => void }[] };
    const lookupClock = { now: () => clock.now, sleep: (ms: number) => new Promise<void>((release) => clock.sleeps.push({ ms, release })) };
    const codec = new WireCodec({ schemaRegistryUrl: `${proxy.url}${registry.pathname}`, registryLookupsPerSecond, lookupClock });
    const subject = `writ.codec.${randomUUID().slice(0, 8)}-value`;
    const framed = (id: number) => {
      const header = Buffer.alloc(5);
      header.writeInt32BE(id, 1);
      return Buffer.concat([header, Buffer.from(JSON.stringify(intent()))]);
    };
    const lookupsOf = (id: number) => proxy.seen.filter((r) => r.path.endsWith(`/schemas/ids/${id}/versions`)).length;
    /** `n` records framed with `id` at once: each dead-lettered undecodable. */
    const flood = async (id: number, n: number) => {
      const results = await Promise.all(Array.from({ length: n }, () => codec.decode("WriteIntent", framed(id), { subject })));
      expect(results.every((r) => !r.ok && r.reason === "undecodable")).toBe(true);
    };
    return { codec, clock, subject, framed, lookupsOf, flood };
  }

  // A record framed with the id the registry hands out next (hostile, or a producer's that raced its registration)
  // made the owner cache "unknown" for 30 s: once a producer registered its new schema, which got that id, every
  // intent it framed with it was dead-lettered undecodable for the rest of those 30 s.
  it("an id unknown, then registered, is asked again a second later when a token is saved up, and decodes", async () => {
    const { codec, clock, subject, framed, lookupsOf } = await turnedCodec();
    const register = async (on: string) => {
      const schema = { schemaType: "JSON", schema: JSON.stringify({ $schema: "http://json-schema.org/draft-07/schema#", type: "object", title: `next-${randomUUID()}` }) };
      const res = await fetch(`${registryUrl()}/subjects/${on}/versions`, { method: "POST", headers: { "content-type": "application/vnd.schemaregistry.v1+json" }, body: JSON.stringify(schema) });
      return ((await res.json()) as { id: number }).id;
    };
    // The registry counts ids up. Other tests on the shared registry may take the next id first: then again with theirs' next.
    let id = 0;
    for (let tries = 0; tries < 10 && id === 0; tries++) {
      const next = (await register(`writ.codec.${randomUUID().slice(0, 8)}-value`)) + 1;
      expect(await codec.decode("WriteIntent", framed(next), { subject })).toMatchObject({ ok: false, reason: "undecodable", message: `schema id ${next} is not in the registry` });
      if ((await register(subject)) === next) id = next;
    }
    expect(id, "an id seen unknown, then registered under the subject").not.toBe(0);
    expect(lookupsOf(id)).toBe(1);
    // Within a second the "unknown" stands...
    clock.now += 999;
    expect(await codec.decode("WriteIntent", framed(id), { subject })).toMatchObject({ ok: false, reason: "undecodable" });
    expect(lookupsOf(id)).toBe(1);
    // ...a second after it, with tokens saved up, the registry is asked again: the producer's values decode, not 29 s later.
    clock.now += 1;
    expect(await codec.decode("WriteIntent", framed(id), { subject })).toMatchObject({ ok: true, framed: true });
    expect(lookupsOf(id)).toBe(2);
  });

  it("a flood of one unknown id costs at most one lookup a second, tokens to spare or not", async () => {
    // The default budget: 100 tokens saved up, which the repeats could take but do not.
    const { clock, lookupsOf, flood } = await turnedCodec();
    const id = 0x7e000001;
    // [ms on, records at once, lookups so far]: repeats within the second cost nothing; a second on, one lookup,
    // however many records ask at once; then none again for a second.
    const steps = [
      [0, 1, 1],
      [0, 50, 1],
      [999, 50, 1],
      [1, 50, 2],
      [500, 50, 2],
      [500, 50, 3],
    ] as const;
    for (const [ms, records, lookups] of steps) {
      clock.now += ms;
      await flood(id, records);
      expect(lookupsOf(id), `at ${clock.now} ms`).toBe(lookups);
    }
    expect(clock.sleeps).toHaveLength(0);
  });

  it("a young unknown id is asked again only with a token saved up, never one a fresh id waits for; past 30 s as any", async () => {
    // One token a second, one saved up.
    const { codec, clock, subject, framed, lookupsOf, flood } = await turnedCodec(1);
    const id = 0x7e100001;
    await flood(id, 1);
    clock.now += 1000;
    await flood(id, 1);
    expect(lookupsOf(id)).toBe(2);
    // A second later a fresh id took the token first: the "unknown" stands, no lookup, no wait.
    clock.now += 1000;
    expect(await codec.decode("WriteIntent", framed(0x7e100002), { subject })).toMatchObject({ ok: false, reason: "undecodable" });
    await flood(id, 50);
    expect(lookupsOf(id)).toBe(2);
    // A fresh id waiting its turn keeps the token it waits for: the flood does not take it when it comes.
    const fresh = codec.decode("WriteIntent", framed(0x7e100003), { subject });
    await waitFor(() => clock.sleeps.length === 1, { message: "the fresh id waits for a token" });
    clock.now += 1000;
    await flood(id, 50);
    expect(lookupsOf(id)).toBe(2);
    clock.sleeps[0]!.release();
    expect(await fresh).toMatchObject({ ok: false, reason: "undecodable" });
    expect(lookupsOf(0x7e100003)).toBe(1);
    // Past 30 s the id is asked again as any unseen one: waiting its turn for a token when none is saved up.
    clock.now += 30_000;
    expect(await codec.decode("WriteIntent", framed(0x7e100004), { subject })).toMatchObject({ ok: false, reason: "undecodable" });
    const again = flood(id, 50);
    await waitFor(() => clock.sleeps.length === 2, { message: "the old unknown id waits for a token" });
    expect(lookupsOf(id)).toBe(2);
    clock.now += 1000;
    clock.sleeps[1]!.release();
    await again;
    expect(lookupsOf(id)).toBe(3);
  });

  it("a reader without a registry reads framed values (zod checks them); an owner without one refuses them", async () => {
    const value = intent();
    const bytes = await new WireCodec({ schemaRegistryUrl: registryUrl() }).encode(`writ.codec.${randomUUID().slice(0, 8)}`, "WriteIntent", value);
    const plain = new WireCodec({});
    expect(await plain.decode("WriteIntent", bytes)).toEqual({ ok: true, value, framed: true, raw: value });
    expect(await plain.decode("WriteIntent", bytes, { subject: "writ.intents-value" })).toMatchObject({
      ok: false,
      reason: "undecodable",
      message: `schema id ${bytes.readInt32BE(1)} cannot be checked: this process has no schema registry`,
    });
    const invalid = Buffer.concat([bytes.subarray(0, 5), Buffer.from(JSON.stringify({ intentId: 1 }))]);
    expect(await plain.decode("WriteIntent", invalid)).toMatchObject({ ok: false, reason: "schema_invalid" });
  });

  it("a registry answering 400 or 422 about an id says the id is unknown, not that the registry is down", async () => {
    const server = createServer((req, res) => {
      res.writeHead(req.url?.includes("/ids/-1/") ? 422 : 400, { "content-type": "application/json" });
      res.end(JSON.stringify({ error_code: 42202, message: "invalid id" }));
    });
    await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => new Promise<void>((resolve) => server.close(() => resolve())));
    const codec = new WireCodec({ schemaRegistryUrl: `http://127.0.0.1:${(server.address() as AddressInfo).port}` });
    for (const id of [-1, 7]) {
      const header = Buffer.alloc(5);
      header.writeInt32BE(id, 1);
      expect(await codec.decode("WriteIntent", Buffer.concat([header, Buffer.from(JSON.stringify(intent()))]))).toMatchObject({ ok: false, reason: "undecodable" });
    }
  });

  it("refuses to produce a value that is not valid", async () => {
    const codec = new WireCodec({});
    await expect(codec.encode("t", "WriteIntent", { ...intent(), intentKey: "short" })).rejects.toMatchObject({ code: "codec_failed", retriable: false });
  });
});
