// WireCodec against a fake schema registry (node:http): what it asks, counted at the fake, and what it does with
// each answer. No broker, no real registry.
import { randomUUID } from "node:crypto";
import type { ServerResponse } from "node:http";
import { describe, expect, it, onTestFinished } from "vitest";
import { WireCodec } from "../../src/codec.ts";
import { isRegistryOutage, isRetriable, type WritError } from "../../src/errors.ts";
import { json, startStub, type SeenRequest } from "../helpers/http-stub.ts";
import { sampleIntent as intent } from "../helpers/sample-intent.ts";
import { waitFor } from "../helpers/wait-for.ts";

/** A registry whose registrations `answer` decides (by subject); ids it hands out are served back by GET. */
async function fakeRegistry(answer: (subject: string, res: ServerResponse) => void) {
  const stub = await startStub((req, res) => {
    const registering = /^\/subjects\/([^/]+)\/versions$/.exec(req.path);
    if (req.method === "POST" && registering) return answer(decodeURIComponent(registering[1]!), res);
    if (req.method === "GET" && /^\/schemas\/ids\/\d+$/.test(req.path)) return json(res, 200, { schemaType: "JSON", schema: "{}" });
    json(res, 404, { error_code: 404, message: "HTTP 404 Not Found" });
  });
  const registrations = (subject: string) => stub.seen.filter((r: SeenRequest) => r.method === "POST" && r.path === `/subjects/${encodeURIComponent(subject)}/versions`).length;
  return { url: stub.url, registrations };
}

const incompatible = (res: ServerResponse) => json(res, 409, { error_code: 409, message: "Schema being registered is incompatible with an earlier schema" });

describe("WireCodec.close", () => {
  // Regression: the background tries of a refused subject (every REFUSED_RETRY_MS while onSchemaRefused is set) had
  // no end: each stopped router and closed client asked the registry for the life of the process. A second codec,
  // not closed, on the same interval is the clock: once it has asked four more times, the closed one would have too.
  it("asks the registry nothing more once closed, while the subject stays refused", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const subject = `${topic}-value`;
    const clockTopic = `writ.clock.${randomUUID().slice(0, 8)}`;
    const clockSubject = `${clockTopic}-value`;
    // Each refusal of `subject` is held until the test lets it go: close() then comes with no try in flight.
    const held: ServerResponse[] = [];
    const registry = await fakeRegistry((s, res) => (s === subject && registrationsOf() >= 2 ? held.push(res) : incompatible(res)));
    const registrationsOf = () => registry.registrations(subject);
    const told: (string | null)[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: registry.url, onSchemaRefused: (_s, m) => told.push(m), refusedRetryMs: 20 });
    const clock = new WireCodec({ schemaRegistryUrl: registry.url, onSchemaRefused: () => undefined, refusedRetryMs: 20 });
    expect((await codec.encode(topic, "WriteIntent", intent()))[0]).toBe("{".charCodeAt(0));
    expect(told).toHaveLength(1);
    // The background try, held at the registry.
    await waitFor(() => held.length === 1, { message: () => `${registrationsOf()} registrations` });
    codec.close();
    incompatible(held[0]!);
    await clock.encode(clockTopic, "WriteIntent", intent());
    await waitFor(() => registry.registrations(clockSubject) >= 5, { message: () => `${registry.registrations(clockSubject)} registrations of the clock's subject` });
    clock.close();
    expect(registrationsOf()).toBe(2);
    expect(told).toHaveLength(1);
  });

  // A stopped router's callback cleared its health board and logged: a try in flight at close() says nothing after it.
  it("says nothing after close, when a try in flight finds the schema accepted", async () => {
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const subject = `${topic}-value`;
    const held: ServerResponse[] = [];
    const registry = await fakeRegistry((s, res) => {
      const n = registry.registrations(s);
      return n === 1 ? incompatible(res) : n === 2 ? held.push(res) : json(res, 200, { id: 7 });
    });
    const told: (string | null)[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: registry.url, onSchemaRefused: (_s, m) => told.push(m), refusedRetryMs: 20 });
    await codec.encode(topic, "WriteIntent", intent());
    await waitFor(() => held.length === 1, { message: () => `${registry.registrations(subject)} registrations` });
    codec.close();
    json(held[0]!, 200, { id: 7 });
    // Accepted: its values are framed again (asked by the value, the try's answer forgotten with the refusal).
    await waitFor(async () => (await codec.encode(topic, "WriteIntent", intent()))[0] === 0);
    expect(told).toHaveLength(1);
  });
});

describe("WireCodec: what each answer to a registration means", () => {
  /** A codec against a registry answering every registration `status`, and what it heard. */
  async function answering(status: number) {
    const registry = await fakeRegistry((_s, res) => json(res, status, { error_code: status, message: `answer ${status}` }));
    const heard = { refused: [] as (string | null)[], faults: [] as (string | null)[], unreachable: 0 };
    const codec = new WireCodec({
      schemaRegistryUrl: registry.url,
      onSchemaRefused: (_s, m) => heard.refused.push(m),
      onRegistryFault: (m) => heard.faults.push(m),
      onUnreachable: () => heard.unreachable++,
      refusedRetryMs: 3_600_000,
    });
    onTestFinished(() => codec.close());
    const topic = `writ.codec.${randomUUID().slice(0, 8)}`;
    const encoded = codec.encode(topic, "WriteIntent", intent()).then(
      (bytes) => ({ bytes }),
      (err: unknown) => ({ err: err as WritError }),
    );
    return { outcome: await encoded, heard, registrations: () => registry.registrations(`${topic}-value`) };
  }

  // 409 (incompatible under the subject's level), 422 (a schema the registry holds invalid) and any other 4xx a
  // registry gives a schema it will not take (400, 413) refuse the schema: its values go as plain JSON, which every
  // writ reader accepts, and the refusal is reported.
  it.each([409, 422, 400, 413])("%i refuses the schema: plain JSON, reported as a refusal", async (status) => {
    const { outcome, heard, registrations } = await answering(status);
    expect("bytes" in outcome && outcome.bytes[0]).toBe("{".charCodeAt(0));
    expect(heard.refused).toEqual([expect.stringContaining(String(status))]);
    expect(heard.faults).toEqual([]);
    expect(registrations()).toBe(1);
  });

  // A user the registry does not let register under this subject (per-subject roles): plain JSON too, so one subject
  // holds no partition, and also heard as a fault of writ's request (owners: a health problem naming the role).
  it("403 refuses writ's user the subject: plain JSON, reported as a refusal and as a fault naming the role", async () => {
    const { outcome, heard, registrations } = await answering(403);
    expect("bytes" in outcome && outcome.bytes[0]).toBe("{".charCodeAt(0));
    expect(heard.refused).toEqual([expect.stringMatching(/may register schemas/)]);
    expect(heard.faults).toEqual([expect.stringMatching(/SCHEMA_REGISTRY_USERNAME and SCHEMA_REGISTRY_PASSWORD/)]);
    expect(registrations()).toBe(1);
  });

  // Regression: any 4xx but 429 was a refusal, so a wrong password or a wrong URL path silently wrote plain JSON for
  // good, told to "check the subject's compatibility level". Now they throw at once, not retriable, naming what to
  // put right, and the codec's owner hears it (owners: a health problem).
  it.each([
    [401, /SCHEMA_REGISTRY_USERNAME and SCHEMA_REGISTRY_PASSWORD/],
    [404, /no \/subjects\/writ\.codec\.[0-9a-f]{8}-value\/versions .*SCHEMA_REGISTRY_URL/],
  ])("%i refuses writ's request: thrown, not retriable, naming what to put right", async (status, names) => {
    const { outcome, heard, registrations } = await answering(status);
    expect("err" in outcome && outcome.err).toMatchObject({ code: "registry_unavailable", retriable: false, message: expect.stringMatching(names) });
    expect(heard.faults).toEqual([expect.stringMatching(names)]);
    expect(heard.refused).toEqual([]);
    expect(heard.unreachable).toBe(0);
    expect(registrations()).toBe(1);
  });

  // An outage of the registry: tried again, then thrown retriable (under the retry that gave up), never plain JSON.
  it.each([408, 429, 500, 503])("%i is an outage: retried, then thrown as one", async (status) => {
    const { outcome, heard, registrations } = await answering(status);
    expect("err" in outcome && isRegistryOutage(outcome.err) && isRetriable((outcome.err as WritError).cause)).toBe(true);
    expect(heard.refused).toEqual([]);
    expect(heard.faults).toEqual([]);
    expect(registrations()).toBe(4);
    expect(heard.unreachable).toBe(4);
  });

  it("hears the end of a fault once a registration succeeds", async () => {
    let status = 401;
    const registry = await fakeRegistry((_s, res) => (status === 200 ? json(res, 200, { id: 7 }) : json(res, status, { error_code: status, message: "unauthorized" })));
    const faults: (string | null)[] = [];
    const codec = new WireCodec({ schemaRegistryUrl: registry.url, onRegistryFault: (m) => faults.push(m) });
    await expect(codec.encode("writ.a", "WriteIntent", intent())).rejects.toMatchObject({ retriable: false });
    // Said once while it lasts.
    await expect(codec.encode("writ.b", "WriteIntent", intent())).rejects.toMatchObject({ retriable: false });
    expect(faults).toEqual([expect.stringContaining("401")]);
    status = 200;
    expect((await codec.encode("writ.a", "WriteIntent", intent()))[0]).toBe(0);
    expect(faults).toEqual([expect.stringContaining("401"), null]);
  });
});
