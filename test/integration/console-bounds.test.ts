// What records and answers bring to the console's page, in a real browser (test/helpers/console-page.ts) against an
// owner (startRouter), the demo records server and the shared broker: an owner's answer carrying a large record is
// given to the page clipped; a forged escalation's controls and bidi overrides are shown as escapes, its change
// still prefilled as the same JSON, and the page still decides it by the id it shows, however long that id is once
// percent-encoded; an Apply on a record version shown escaped and cut is sent with the record's own version.
import { createHash, randomUUID } from "node:crypto";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import { tagTicket } from "../../examples/demo-tools.ts";
import type { AnswerShown } from "../../src/console/state.ts";
import { entityKey } from "../../src/schemas/common.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import { consoleOf, launchChromium, openLivePage } from "../helpers/console-page.ts";
import { brokers, escalateTicket, startHarness } from "../helpers/writ-harness.ts";

/** A CSS attribute value for `s` (its backslashes escaped). */
const attr = (s: string) => s.replace(/\\/g, "\\\\");
/** An id as the console shows one it escaped: with the digest of the record's own (two ids never shown alike). */
const marked = (shown: string, raw: string) => `${shown} (sha256 ${createHash("sha256").update(Buffer.from(raw, "utf16le")).digest("hex").slice(0, 32)})`;

/** The version the records proxy gives for the demo server's `"vN"`: a C1 control (NEL, obs-text in an ETag) and 250 characters. */
const oddVersion = (n: string) => `"v${n}\u0085${"x".repeat(250 - 4 - n.length)}"`;

/**
 * A proxy in front of the demo records server whose ETags are oddVersion's (and whose If-Match takes them back): a
 * system of record whose versions the page shows escaped and cut. Latin-1 both ways, as HTTP carries obs-text.
 */
async function oddVersionsProxy(target: string): Promise<string> {
  const to = new URL(target);
  const server = createServer((req, res) => {
    const headers = { ...req.headers };
    const ifMatch = /^"v(\d+)\u0085x*"$/.exec(String(headers["if-match"] ?? ""));
    if (ifMatch) headers["if-match"] = `"v${ifMatch[1]}"`;
    const forward = request({ host: to.hostname, port: to.port, method: req.method, path: req.url, headers }, (answer) => {
      const out = { ...answer.headers };
      const etag = /^"v(\d+)"$/.exec(String(out.etag ?? ""));
      if (etag) out.etag = oddVersion(etag[1]!);
      res.writeHead(answer.statusCode ?? 502, out);
      answer.pipe(res);
    });
    forward.on("error", () => res.destroy());
    req.pipe(forward);
  });
  await new Promise<void>((resolve) => server.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => {
    server.closeAllConnections();
    return new Promise<void>((resolve) => server.close(() => resolve()));
  });
  return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
}

describe("writ console: what records and answers bring to the page", () => {
  it("an owner's resolution_conflict carrying a large, nested record reaches the page clipped; a forged escalation's U+202E and controls show as escapes, its change prefilled as the same JSON, and it is decided by the id the page shows", async () => {
    const h = await startHarness({ tools: [tagTicket] });
    await h.startRouter();
    const p = `cbounds-${h.id}`;
    const opsId = `ops-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, readToken, operatorToken, { operator: { id: opsId, replyTopic: `writ.replies.${p}-${opsId}` } });
    const context = await launchChromium();
    const { page, errors } = await openLivePage(context, consoleServer.url, operatorToken);
    const answerOf = async (click: () => Promise<void>) => {
      const response = page.waitForResponse((r) => r.url().includes("/resolve"), { timeout: 45_000 });
      await click();
      const r = await response;
      return { status: r.status(), body: (await r.json()) as { answer: AnswerShown } };
    };

    // --- a real escalation; the record then replaced by a large, nested one: Apply on the version shown is refused
    // resolution_conflict with that record in its details ---
    const agent = await h.client(`${p}-ann`);
    const ticket = `T-${h.id}-big`;
    await escalateTicket(h, agent, ticket);
    const escalation = (await h.readTopic(h.config.topics.human, "Escalation", 1)).find((e) => e.intent.entity.id === ticket)!;
    const card = page.locator(`#escalations article[data-escalation-id="${escalation.escalationId}"]`);
    await card.waitFor();
    let nested: unknown = "x".repeat(100_000);
    for (let i = 0; i < 30; i++) nested = { n: [nested] };
    h.records.seed("ticket", ticket, { status: "open", tags: [], nested });
    const conflict = await answerOf(() => card.locator('button[data-action="apply"]').click());
    expect(conflict.status).toBe(200);
    const answer = conflict.body.answer;
    expect(answer).toMatchObject({ status: "rejected", reason: "resolution_conflict", details: { truncated: true } });
    expect(Object.keys(answer).sort()).toEqual(["details", "message", "reason", "status"]);
    expect(answer.details!.json.length).toBeLessThan(5000);
    await card.locator('.answer [data-answer-reason="resolution_conflict"]').waitFor();
    // the page prints the details as given, not the whole answer indented
    await expect(card.locator(".answer details pre").textContent()).resolves.toBe(answer.details!.json);

    // --- a forged escalation (any producer can write writ.human) whose ids, message and change carry U+202E and controls ---
    const odd = `T-${h.id}-12\u202e34`;
    const intent = agent.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: odd }, runId: "r", stepId: "s", baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: ["a\u202eb", "c\u009bd", "e\u2066f"] }], params: { tag: "x" } });
    const forged: Escalation = { escalationId: `e-${h.id}-\u202e1`, reason: "conflict_cycles_exhausted", message: "look\u202e here\u001b[2J", intent, cycles: 3, current: { state: { tags: [] }, version: '"v1"' }, at: new Date().toISOString() };
    const producer = new Kafka({ brokers: brokers(), clientId: "console-bounds-forger", logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    await producer.send({ topic: h.config.topics.human, messages: [{ key: entityKey(intent.entity), value: JSON.stringify(forged) }] });
    const shownId = marked(`e-${h.id}-\\u202e1`, forged.escalationId);
    const forgedCard = page.locator(`#escalations article[data-escalation-id="${attr(shownId)}"]`);
    await forgedCard.waitFor();
    await expect(forgedCard.locator("header b").textContent()).resolves.toBe(marked(`ticket:T-${h.id}-12\\u202e34`, `ticket:${odd}`));
    await expect(forgedCard.locator("p.msg").textContent()).resolves.toBe("look\\u202e here\\x1b[2J");
    const prefilled = await forgedCard.locator('textarea[name="delta"]').inputValue();
    expect(prefilled).not.toMatch(/[\u0080-\u009f\u202a-\u202e\u2066-\u2069]/);
    expect(JSON.parse(prefilled)).toEqual(intent.delta);
    // decided by the id the page shows: the console finds it, and sends the record's own (the owner's ledger has no such
    // escalation: resolution_not_applicable)
    const discard = await answerOf(() => forgedCard.locator('button[data-action="discard"]').click());
    expect(discard).toMatchObject({ status: 200, body: { answer: { status: "rejected", reason: "resolution_not_applicable" } } });
    await forgedCard.locator('.answer [data-answer-reason="resolution_not_applicable"]').waitFor();
    expect(errors.filter((e) => e.startsWith("pageerror"))).toEqual([]);
  }, 180_000);
  it("Apply on the record version the page shows, escaped and cut (a C1 control, 250 characters), is sent with the record's own version: applied, one PATCH (the shown text was answered resolution_conflict for ever)", async () => {
    const h = await startHarness({ tools: [tagTicket] });
    const proxy = await oddVersionsProxy(h.records.url);
    await h.startRouter({ systems: [createHttpSystemOfRecord({ name: "helpdesk", baseUrl: proxy, idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" })] });
    const p = `cbounds-${h.id}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, `read-${randomUUID()}`, operatorToken, { operator: { id: `ops-${h.id}`, replyTopic: `writ.replies.${p}-ops-${h.id}` } });
    const context = await launchChromium();
    const { page, errors, sent } = await openLivePage(context, consoleServer.url, operatorToken);
    const agent = await h.client(`${p}-ann`);
    const ticket = `T-${h.id}-odd`;
    await escalateTicket(h, agent, ticket);
    const escalation = (await h.readTopic(h.config.topics.human, "Escalation", 1)).find((e) => e.intent.entity.id === ticket)!;
    const version = escalation.current!.version;
    expect(version).toMatch(/^"v\d+\u0085x+"$/);
    expect(version.length).toBe(250);
    const card = page.locator(`#escalations article[data-escalation-id="${escalation.escalationId}"]`);
    await card.waitFor();
    // shown escaped and cut; the base version field prefilled with what is shown
    const shown = await card.locator(".current code.version").textContent();
    expect(shown).not.toBe(version);
    expect(shown).toContain("\\x85");
    expect(shown!.length).toBeLessThanOrEqual(200);
    await expect(card.locator('input[name="baseVersion"]').inputValue()).resolves.toBe(shown);
    const before = h.records.patchRequests().length;
    const response = page.waitForResponse((r) => r.url().includes("/resolve"), { timeout: 45_000 });
    await card.locator('button[data-action="apply"]').click();
    const answer = (await (await response).json()) as { answer: AnswerShown };
    expect(answer.answer).toMatchObject({ status: "applied", via: "patch" });
    expect(JSON.parse(sent.at(-1)!)).toMatchObject({ decision: "apply", baseVersion: version });
    expect(h.records.patchRequests().length - before).toBe(1);
    expect(h.records.history("ticket", ticket).at(-1)).toMatchObject({ state: { tags: ["needs-human"] } });
    expect(errors.filter((e) => e.startsWith("pageerror"))).toEqual([]);
  }, 180_000);

  it("an escalation whose id, as shown, is long once percent-encoded (CJK and escaped controls: 9 characters each) is decided by the id the page shows, not answered 404", async () => {
    const h = await startHarness({ tools: [tagTicket] });
    await h.startRouter();
    const p = `cbounds-${h.id}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, `read-${randomUUID()}`, operatorToken, { operator: { id: `ops-${h.id}`, replyTopic: `writ.replies.${p}-ops-${h.id}` } });
    const context = await launchChromium();
    const { page, errors } = await openLivePage(context, consoleServer.url, operatorToken);
    const agent = await h.client(`${p}-ann`);
    const entity = { type: "ticket", id: `T-${h.id}-route` };
    const intent = agent.buildIntent({ tool: tagTicket, entity, runId: "r", stepId: "s", baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: ["x"] }], params: { tag: "x" } });
    // 121 characters (a resolution carries 128 at most), shown 275 when escaped: cut to 200
    const forged: Escalation = { escalationId: `e-${h.id}-${"中\u001b".repeat(55)}`, reason: "conflict_cycles_exhausted", message: "m", intent, cycles: 3, current: { state: { tags: [] }, version: '"v1"' }, at: new Date().toISOString() };
    const producer = new Kafka({ brokers: brokers(), clientId: "console-bounds-forger", logLevel: logLevel.NOTHING }).producer();
    await producer.connect();
    onTestFinished(() => producer.disconnect());
    await producer.send({ topic: h.config.topics.human, messages: [{ key: entityKey(entity), value: JSON.stringify(forged) }] });
    const card = page.locator(`#escalations article[data-entity="ticket:${entity.id}"]`);
    await card.waitFor();
    const shownId = (await card.getAttribute("data-escalation-id"))!;
    expect(shownId.length).toBeLessThanOrEqual(200);
    expect(encodeURIComponent(shownId).length).toBeGreaterThan(400);
    const response = page.waitForResponse((r) => r.url().includes("/resolve"), { timeout: 45_000 });
    await card.locator('button[data-action="discard"]').click();
    const r = await response;
    // found, and sent with the record's own id (no owner has it: resolution_not_applicable)
    expect({ status: r.status(), body: await r.json() }).toMatchObject({ status: 200, body: { answer: { status: "rejected", reason: "resolution_not_applicable" } } });
    expect(errors.filter((e) => e.startsWith("pageerror"))).toEqual([]);
  }, 180_000);
});
