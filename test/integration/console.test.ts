// `writ console` in a real browser: headless Chromium driven by playwright-core
// (test/helpers/console-page.ts), against an owner (startRouter, the demo
// tools), the demo records server and the shared broker. A missing Chromium
// fails the test: it is never skipped.
// WRIT_CONSOLE_SCREENSHOT=1 writes docs/console.png.
import { execFile, spawn } from "node:child_process";
import { randomUUID } from "node:crypto";
import { mkdirSync } from "node:fs";
import { createServer, request } from "node:http";
import type { AddressInfo } from "node:net";
import { join } from "node:path";
import { Kafka, logLevel } from "kafkajs";
import { Agent, fetch as undiciFetch } from "undici";
import { pino } from "pino";
import { describe, expect, it, onTestFinished } from "vitest";
import { refundPayment, tagTicket } from "../../examples/demo-tools.ts";
import type { WritClient } from "../../producers/writ-client.ts";
import { atOffset, offsetsWanted, readRecordsAt } from "../../src/cli/topic-reader.ts";
import { CONSOLE_MAX_CONNECTIONS, startConsole, type ConsoleOptions } from "../../src/console/server.ts";
import { REDRIVEN_FROM_HEADER } from "../../src/dlq-redrive.ts";
import { entityKey } from "../../src/schemas/common.ts";
import type { DeadLetter } from "../../src/schemas/dead-letter.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { BUILT_CLI, ROOT, ensureBuilt } from "../helpers/build.ts";
import { consoleOf, launchChromium, listen, openLivePage, openPage } from "../helpers/console-page.ts";
import { openSocket, silentSockets, whileAllOpen } from "../helpers/sockets.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, deadLetterOf, escalateTicket, readVersion, refundIntent, registryUrl, startHarness, tagTicketNoDelta } from "../helpers/writ-harness.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

/** A raw HTTP request, so Host and Origin can be anything. */
function raw(url: string, opts: { method?: string; headers?: Record<string, string>; body?: string } = {}): Promise<{ status: number; body: string }> {
  return new Promise((resolve, reject) => {
    const req = request(url, { method: opts.method ?? "GET", headers: opts.headers }, (res) => {
      let body = "";
      res.setEncoding("utf8");
      res.on("data", (c: string) => (body += c));
      res.on("end", () => resolve({ status: res.statusCode ?? 0, body }));
    });
    req.on("error", reject);
    req.end(opts.body);
  });
}

describe("writ console, in headless Chromium", () => {
  it("shows conflicts, dead letters, intents in flight, lag and escalations live; resolves one from the page; sends a dead letter back; filters; 401 without a token, 403 and no buttons read-only", async () => {
    const started = Date.now();
    const h = await startHarness({ tools: [refundPayment, tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const p = `cons-${h.id}`;
    const opsId = `ops-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    // Everything the console logs, to show no token is ever in it.
    const logged: string[] = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(line) });
    // this test's agents only (the shared broker holds every test's reply topics)
    const consoleServer = await consoleOf(h, p, readToken, operatorToken, { operator: { id: opsId, replyTopic: `writ.replies.${p}-${opsId}` }, lagIntervalMs: 500, logger });
    const url = consoleServer.url;
    const context = await launchChromium();

    // --- refused without a token (the stream, the API) or with a wrong one; the page itself holds no data ---
    const { page: anon } = await openPage(context);
    expect((await anon.goto(`${url}/`))!.status()).toBe(200);
    await waitFor(async () => /needs its token/.test((await anon.textContent("#notice")) ?? ""), { message: "the no-token notice" });
    const { page: wrong } = await openPage(context);
    await wrong.goto(`${url}/#token=not-the-right-token-at-all`);
    await waitFor(async () => /refused this token/.test((await wrong.textContent("#notice")) ?? ""), { message: "the refused-token notice" });
    await expect(wrong.evaluate(() => sessionStorage.getItem("writ-console-token"))).resolves.toBeNull();
    // (the stream's tickets and the endpoints' refusals without a token: the next test)
    // Host and Origin are checked before anything else (DNS rebinding)
    expect((await raw(`${url}/?token=${operatorToken}`, { headers: { host: `evil.example:${consoleServer.port}` } })).status).toBe(403);
    expect((await raw(`${url}/api/state`, { headers: { authorization: `Bearer ${readToken}`, origin: "http://evil.example" } })).status).toBe(403);

    // --- the operator's page: the token leaves the address, the stream is live, no request carries it in its URL ---
    const { page, errors } = await openPage(context);
    const requested: string[] = [];
    page.on("request", (r) => void requested.push(r.url()));
    expect((await page.goto(`${url}/#token=${operatorToken}`))!.status()).toBe(200);
    await page.waitForSelector('#conn[data-state="live"]');
    expect(page.url()).toBe(`${url}/`);
    expect(requested.some((u) => u.includes("/events?ticket="))).toBe(true);
    expect(requested.filter((u) => u.includes(operatorToken) || u.includes(encodeURIComponent(operatorToken)))).toEqual([]);
    await expect(page.textContent("#role")).resolves.toBe(`operator: ${opsId}`);
    await expect(page.evaluate(() => sessionStorage.getItem("writ-console-token"))).resolves.toBe(operatorToken);
    // a reload (the address has no token now) opens it again from the tab's sessionStorage
    await page.reload();
    await page.waitForURL(`${url}/`);
    await page.waitForSelector('#conn[data-state="live"]');
    await expect(page.textContent("#role")).resolves.toBe(`operator: ${opsId}`);
    // an old ?token= link still opens the page, which takes the token out of the address and says such links are logged
    const { page: legacy, errors: legacyErrors } = await openPage(context);
    await legacy.goto(`${url}/?token=${readToken}`);
    await legacy.waitForSelector('#conn[data-state="live"]');
    expect(legacy.url()).toBe(`${url}/`);
    await expect(legacy.textContent("#role")).resolves.toBe("read-only");
    await expect(legacy.textContent("#notice")).resolves.toMatch(/query \(\?token=…\), which servers and proxies log/);
    await legacy.close();
    expect(legacyErrors).toEqual([]);

    // --- two agents on one ticket: a conflict appears, current beside your_change ---
    const alice = await h.client(`${p}-alice`);
    const bob = await h.client(`${p}-bob`);
    const ticket = `T-${h.id}-race`;
    h.records.seed("ticket", ticket, { status: "open", tags: ["billing"] });
    const read = await readVersion(h.records, "ticket", ticket);
    const runId = `run-${randomUUID()}`;
    const tag = (client: WritClient, t: string) =>
      client.submit({ tool: tagTicket, entity: { type: "ticket", id: ticket }, runId, stepId: `tag-${t}`, baseVersion: read.version, delta: [{ op: "replace", path: "/tags", value: ["billing", t] }], params: { tag: t } });
    await expect(tag(bob, "vip")).resolves.toMatchObject({ status: "applied" });
    const conflict = await tag(alice, "chargeback-risk");
    expect(conflict).toMatchObject({ status: "conflict", cycle: 1 });
    const card = page.locator(`#conflicts article[data-entity="ticket:${ticket}"]`);
    await card.waitFor();
    await expect(card.locator("header").textContent()).resolves.toContain(`${p}-alice`);
    await expect(card.locator(".current h4").textContent()).resolves.toContain((conflict as { current: { version: string } }).current.version);
    const current = JSON.parse((await card.locator(".current pre").textContent())!);
    expect(current).toEqual({ status: "open", tags: ["billing", "vip"] });
    const yourChange = JSON.parse((await card.locator(".your-change pre").textContent())!);
    expect(yourChange).toEqual([{ op: "replace", path: "/tags", value: ["billing", "chargeback-risk"] }]);
    await expect(card.locator(".your-change h4").textContent()).resolves.toContain(read.version);
    await page.locator(`#replies tr[data-status="applied"][data-intent-id]`).first().waitFor();
    await expect(page.locator('#counts [data-count="conflict"] .v').textContent()).resolves.toBe("1");

    // --- an intent in flight: its system of record answers reads past the owner's timeout, twice (an outage: it waits) ---
    const slowTicket = `T-${h.id}-slow`;
    h.records.seed("ticket", slowTicket, { status: "open", tags: [] });
    const slowBase = await readVersion(h.records, "ticket", slowTicket);
    h.records.setFaults([{ kind: "slow-read", delayMs: 2500, times: 2, match: { type: "ticket", id: slowTicket } }]);
    const slowIntent = alice.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: slowTicket }, runId, stepId: "slow", baseVersion: slowBase.version, delta: [{ op: "replace", path: "/tags", value: ["slow"] }], params: { tag: "slow" } });
    const slowReply = alice.submit(slowIntent);
    const flying = page.locator(`#inflight tr[data-intent-id="${slowIntent.intentId}"]`);
    await flying.waitFor();
    await expect(flying.textContent()).resolves.toContain(`ticket:${slowTicket}`);
    await expect(slowReply).resolves.toMatchObject({ status: "applied" });
    await flying.waitFor({ state: "detached" });
    await page.locator(`#replies tr[data-status="applied"][data-intent-id="${slowIntent.intentId}"]`).waitFor();

    // --- an intent whose reply topic does not exist: a dead letter (reason, source, key); settled, so not in flight ---
    const ghost = alice.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: ticket }, runId, stepId: "ghost", baseVersion: read.version, delta: [{ op: "replace", path: "/tags", value: ["ghost"] }], params: { tag: "ghost" } });
    ghost.replyTo = `writ.replies.${p}-nobody-${h.id}`;
    await h.produceRaw(entityKey(ghost.entity), Buffer.from(JSON.stringify(ghost)));
    const dead = page.locator('#dead-letters tr[data-reason="reply_topic_missing"]');
    await dead.waitFor();
    await expect(dead.textContent()).resolves.toContain(`ticket:${ticket}`);
    await expect(dead.textContent()).resolves.toContain(h.config.topics.intents);
    // no reply will ever come; the owners committed past it, which settles it
    await waitFor(async () => (await page.locator("#inflight tr[data-intent-id]").count()) === 0, { message: "nothing left in flight" });

    // --- lag per intents partition ---
    await waitFor(async () => (await page.locator("#lag tr[data-partition]").count()) === 2, { message: "two lag rows" });

    // --- two escalations (three conflict cycles each, an outside write between) ---
    const carol = await h.client(`${p}-carol`);
    const carolSeen = listen(carol);
    const dave = await h.client(`${p}-dave`);
    const carolTicket = `T-${h.id}-carol`;
    const daveTicket = `T-${h.id}-dave`;
    const escalated = await escalateTicket(h, carol, carolTicket);
    await escalateTicket(h, dave, daveTicket);
    const humanRecords = await h.readTopic(h.config.topics.human, "Escalation", 2);
    const escalation = humanRecords.find((e) => e.intent.intentKey === escalated.intentKey) as Escalation;
    expect(escalation.current?.version).toBeTruthy();
    const esc = page.locator(`#escalations article[data-escalation-id="${escalation.escalationId}"]`);
    await esc.waitFor();
    await expect(esc.getAttribute("data-status")).resolves.toBe("open");
    await expect(esc.locator("code.version").textContent()).resolves.toBe(escalation.current!.version);
    await expect(esc.locator('input[name="baseVersion"]').inputValue()).resolves.toBe(escalation.current!.version);
    await expect(esc.locator("button[data-action]").count()).resolves.toBe(3);
    await page.locator("#escalations article").nth(1).waitFor();

    // --- filters: by agent, tool and record ---
    await page.fill("#f-agent", `${p}-carol`);
    await waitFor(async () => (await page.locator("#escalations article").count()) === 1, { message: "only carol's escalation" });
    // Conflicts come from the reply topics, read apart from writ.human: carol's may show after her escalation does.
    await waitFor(async () => (await page.locator(`#conflicts article[data-entity="ticket:${carolTicket}"]`).count()) === 2, { message: "carol's two conflicts" });
    await expect(page.locator(`#conflicts article[data-entity="ticket:${ticket}"]`).count()).resolves.toBe(0);
    await page.fill("#f-agent", "");
    await page.fill("#f-record", daveTicket);
    await waitFor(async () => (await page.locator(`#escalations article[data-entity="ticket:${daveTicket}"]`).count()) === 1 && (await page.locator("#escalations article").count()) === 1);
    await page.fill("#f-tool", "refund_payment");
    await waitFor(async () => (await page.locator("#escalations article").count()) === 0 && (await page.locator("#conflicts article").count()) === 0);
    await page.click("#f-clear");
    await waitFor(async () => (await page.locator("#escalations article").count()) === 2);

    // --- a read-only page: sees the escalation, has no buttons; the API answers 403 ---
    const { page: reader, errors: readerErrors } = await openPage(context);
    await reader.goto(`${url}/#token=${readToken}`);
    await reader.waitForSelector('#conn[data-state="live"]');
    await expect(reader.textContent("#role")).resolves.toBe("read-only");
    const readerEsc = reader.locator(`#escalations article[data-escalation-id="${escalation.escalationId}"]`);
    await readerEsc.waitFor();
    await expect(reader.locator("#escalations button").count()).resolves.toBe(0);
    const refused = await reader.evaluate(
      async ([id, token]) => (await fetch(`/api/escalations/${encodeURIComponent(id!)}/resolve`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}` }, body: JSON.stringify({ decision: "discard" }) })).status,
      [escalation.escalationId, readToken],
    );
    expect(refused).toBe(403);

    // --- resolve from the page: first on another base (a stale one): the owner refuses, nothing written, still open ---
    await esc.locator('input[name="baseVersion"]').fill('"v1"');
    await esc.locator('button[data-action="apply"]').click();
    await esc.locator('.answer [data-answer-reason="resolution_conflict"]').waitFor({ timeout: 45_000 });
    expect(h.records.patchRequests(escalated.intentKey)).toHaveLength(0);
    await expect(esc.getAttribute("data-status")).resolves.toBe("open");
    await expect(esc.locator(".outcome").textContent()).resolves.toMatch(/^Still open\. Last decision \(apply by .*\): rejected resolution_conflict/);
    // then on the version the escalation showed
    await esc.locator('input[name="baseVersion"]').fill(escalation.current!.version);
    await esc.locator('button[data-action="apply"]').click();
    const answer = esc.locator('.answer [data-answer-status="applied"]');
    await answer.waitFor({ timeout: 45_000 });
    await expect(answer.textContent()).resolves.toMatch(/^Owner's answer: applied at /);
    await waitFor(async () => (await esc.getAttribute("data-status")) === "resolved", { message: "the card shows the escalation resolved" });
    await expect(esc.locator(".outcome").textContent()).resolves.toMatch(new RegExp(`Resolved: applied by ${opsId}`));
    await expect(esc.locator(".decide").isHidden()).resolves.toBe(true);
    // the agent hears the decision on its own reply topic, under the escalated intent's id
    const toAgent = await waitFor(() => carolSeen.find((r) => r.intentId === escalated.intentId && r.status === "applied"), { message: "carol's reply to the resolution" });
    expect(toAgent).toMatchObject({ status: "applied", resolvedBy: opsId, intentKey: escalated.intentKey });
    // written once, at the records server
    expect(h.records.patchRequests(escalated.intentKey)).toHaveLength(1);
    expect(h.records.history("ticket", carolTicket).filter((e) => e.kind === "patch")).toHaveLength(1);
    expect((await readVersion(h.records, "ticket", carolTicket)).state.tags).toEqual(["needs-human"]);
    // the read-only page follows (from the agent's reply on the stream)
    await waitFor(async () => (await readerEsc.getAttribute("data-status")) === "resolved", { message: "the read-only page shows it resolved" });
    // a second decision on a closed escalation is refused by the console
    const again = await fetch(`${url}/api/escalations/${encodeURIComponent(escalation.escalationId)}/resolve`, {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: url },
      body: JSON.stringify({ decision: "apply" }),
    });
    expect(again.status).toBe(409);
    // an oversized decision is answered 413 with its reason, whether its length was declared or streamed (a
    // decision may carry a delta: 16 KiB and the 64 KiB a delta may take)
    const resolveUrl = `${url}/api/escalations/${encodeURIComponent(escalation.escalationId)}/resolve`;
    const operatorHeaders = { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: url };
    const big = JSON.stringify({ decision: "apply", message: "m".repeat(128 * 1024) });
    const tooLarge = { error: "request body over 81920 bytes", reason: "body_too_large" };
    const declared = await fetch(resolveUrl, { method: "POST", headers: operatorHeaders, body: big });
    expect([declared.status, await declared.json()]).toEqual([413, tooLarge]);
    const chunks = new ReadableStream<Uint8Array>({
      start(c) {
        for (let i = 0; i < 17; i++) c.enqueue(new TextEncoder().encode(big.slice(i * 8192, (i + 1) * 8192)));
        c.close();
      },
    });
    const streamed = await fetch(resolveUrl, { method: "POST", headers: operatorHeaders, body: chunks, duplex: "half" } as RequestInit);
    expect([streamed.status, await streamed.json()]).toEqual([413, tooLarge]);
    // dave's escalation is still open, with its buttons
    await expect(page.locator(`#escalations article[data-entity="ticket:${daveTicket}"] button[data-action]`).count()).resolves.toBe(3);

    if (process.env.WRIT_CONSOLE_SCREENSHOT === "1") {
      // with one intent held in flight by a slow read, as the picture should show it
      const shotTicket = `T-${h.id}-shot`;
      h.records.seed("ticket", shotTicket, { status: "open", tags: [] });
      const shotBase = await readVersion(h.records, "ticket", shotTicket);
      h.records.setFaults([{ kind: "slow-read", delayMs: 2500, times: 2, match: { type: "ticket", id: shotTicket } }]);
      const shot = bob.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: shotTicket }, runId, stepId: "shot", baseVersion: shotBase.version, delta: [{ op: "replace", path: "/tags", value: ["vip"] }], params: { tag: "vip" } });
      const shotReply = bob.submit(shot);
      await page.locator(`#inflight tr[data-intent-id="${shot.intentId}"]`).waitFor();
      mkdirSync(join(ROOT, "docs"), { recursive: true });
      await page.screenshot({ path: join(ROOT, "docs", "console.png"), fullPage: true });
      await expect(shotReply).resolves.toMatchObject({ status: "applied" });
    }
    // --- hostile records (any producer may write a reply topic or writ.human) ---
    const daveEscalation = humanRecords.find((e) => e.intent.agent.id === `${p}-dave`) as Escalation;
    const daveCard = page.locator(`#escalations article[data-escalation-id="${daveEscalation.escalationId}"]`);
    const resolveDave = () =>
      fetch(`${url}/api/escalations/${encodeURIComponent(daveEscalation.escalationId)}/resolve`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: url }, body: JSON.stringify({ decision: "discard" }) });
    const forger = new Kafka({ brokers: brokers(), clientId: "console-test-forger", logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    // a forged close on dave's reply topic: only reported; the buttons stay (the owner decides)
    const { intentId, intentKey, entity } = daveEscalation.intent;
    const forgedClose = { status: "applied", intentId, intentKey, duplicate: false, at: new Date().toISOString(), entity, state: null, version: '"forged"', via: "patch", resolvedBy: "mallory" };
    await forger.send({ topic: daveEscalation.intent.replyTo, messages: [{ key: intentId, value: JSON.stringify(forgedClose) }] });
    await waitFor(async () => /^Reported resolved by mallory \(applied; from a reply; the owner decides\)/.test((await daveCard.locator(".outcome").textContent()) ?? ""), { message: "dave's card shows the reported close" });
    await expect(daveCard.locator(".decide").isVisible()).resolves.toBe(true);
    await expect(daveCard.locator(".warning.contested").isVisible()).resolves.toBe(false);
    // a second record for dave's escalation id with another change: contested, no buttons, refused with its reason
    const forgedEscalation = { ...daveEscalation, message: "safe to apply", intent: { ...daveEscalation.intent, delta: [{ op: "add", path: "/tags/-", value: "ATTACKER" }] } };
    await forger.send({ topic: h.config.topics.human, messages: [{ key: entityKey(daveEscalation.intent.entity), value: JSON.stringify(forgedEscalation) }] });
    await daveCard.locator(".warning.contested").waitFor({ state: "visible" });
    await expect(daveCard.locator(".decide").isHidden()).resolves.toBe(true);
    await expect(daveCard.locator(".your-change pre").first().textContent()).resolves.not.toContain("ATTACKER");
    await expect(daveCard.locator(".msg").textContent()).resolves.toBe(daveEscalation.message);
    const contested = await resolveDave();
    expect([contested.status, ((await contested.json()) as { reason?: string }).reason]).toEqual([409, "escalation_contested"]);

    // --- sending the dead letter back: not from the read-only page; from the operator's, first while its cause
    // remains (dead-lettered again, a row of its own), then once the reply topic exists: answered, at most one PATCH ---
    await reader.locator('#dead-letters tr[data-reason="reply_topic_missing"]').first().waitFor();
    await expect(reader.locator("#dead-letters button").count()).resolves.toBe(0);
    const where = { partition: await dead.getAttribute("data-dlq-partition"), offset: await dead.getAttribute("data-dlq-offset") };
    const redriveUrl = (w: { partition: string | null; offset: string | null }) => `${url}/api/dead-letters/${w.partition}/${w.offset}/redrive`;
    const post = (u: string, token: string) => fetch(u, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}`, origin: url }, body: "{}" });
    expect((await post(redriveUrl(where), readToken)).status).toBe(403);
    const unknownLetter = await post(redriveUrl({ partition: "0", offset: "999999999" }), operatorToken);
    expect([unknownLetter.status, ((await unknownLetter.json()) as { reason?: string }).reason]).toEqual([404, "dead_letter_unknown"]);
    expect(h.records.patchRequests(ghost.intentKey)).toHaveLength(0);
    const first = page.locator(`#dead-letters tr[data-dlq-partition="${where.partition}"][data-dlq-offset="${where.offset}"]`);
    await first.locator('button[data-action="redrive"]').click();
    await waitFor(async () => (await first.getAttribute("data-sent-back")) === "true", { message: "the dead letter shows it was sent back", timeoutMs: 45_000 });
    await expect(first.locator(".sent-back").textContent()).resolves.toMatch(new RegExp(`^sent back → ${h.config.topics.intents.replace(/\./g, "\\.")}\\[\\d+\\]@\\d+$`));
    await expect(first.locator("button").count()).resolves.toBe(0);
    // its cause remained: a new dead letter of the same record, which can be sent back in turn
    const deadAgain = page.locator('#dead-letters tr[data-reason="reply_topic_missing"][data-sent-back="false"]');
    await deadAgain.waitFor({ timeout: 45_000 });
    await expect(deadAgain.textContent()).resolves.toContain(`ticket:${ticket}`);
    // the read-only page sees it sent back too (the console's state, not the operator page's own view)
    await reader.locator(`#dead-letters tr[data-dlq-offset="${where.offset}"][data-dlq-partition="${where.partition}"][data-sent-back="true"]`).waitFor();
    const twice = await post(redriveUrl(where), operatorToken);
    expect([twice.status, ((await twice.json()) as { reason?: string }).reason]).toEqual([409, "dead_letter_sent_back"]);
    const admin = new Kafka({ brokers: brokers(), clientId: "console-test-admin", logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: ghost.replyTo, numPartitions: 1 }]);
    await deadAgain.locator('button[data-action="redrive"]').click();
    const ghostReply = page.locator(`#replies tr[data-intent-id="${ghost.intentId}"]`);
    await ghostReply.waitFor({ timeout: 45_000 });
    const ghostStatus = await ghostReply.getAttribute("data-status");
    expect(["applied", "conflict"]).toContain(ghostStatus);
    // counted at the records server: one PATCH if applied, none on a conflict, never two
    expect(h.records.patchRequests(ghost.intentKey)).toHaveLength(ghostStatus === "applied" ? 1 : 0);
    await expect(page.locator('#dead-letters tr[data-reason="reply_topic_missing"]').count()).resolves.toBe(2);

    expect(errors).toEqual([]);
    expect(readerErrors).toEqual([]);
    const log = logged.join("");
    expect(log).toContain("escalation decision from the console");
    expect(log).toContain("dead letter sent back from the console");
    expect(log).not.toContain(readToken);
    expect(log).not.toContain(operatorToken);
    console.log(`[console.test] scenario took ${((Date.now() - started) / 1000).toFixed(1)} s`);
  }, 240_000);

  it("applies an escalation of a tool without a delta function with the change given on the page: without it the owner answers resolution_delta_required and the page points at the field; a malformed change is refused in the page (nothing sent) and by the endpoint with its reason; a change beyond the tool's allowedPaths is refused by the owner (patch_path_not_allowed), shown on the card and at the change, nothing written; the edited change written once", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const p = `cons-${h.id}`;
    const opsId = `ops-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    const decisions: { status: string; reason?: string }[] = [];
    const consoleServer = await consoleOf(h, p, readToken, operatorToken, { operator: { id: opsId, replyTopic: `writ.replies.${p}-${opsId}` }, onDecision: (d) => void decisions.push(d) });
    const url = consoleServer.url;
    const context = await launchChromium();
    const { page, errors, sent } = await openLivePage(context, url, operatorToken);

    // --- an escalation of tag_ticket_no_delta: the owner cannot rebuild its change on the record now ---
    const erin = await h.client(`${p}-erin`);
    const erinSeen = listen(erin);
    const ticket = `T-${h.id}-nodelta`;
    const escalated = await escalateTicket(h, erin, ticket, tagTicketNoDelta);
    const escalation = (await h.readTopic(h.config.topics.human, "Escalation", 1)).find((e) => e.intent.intentKey === escalated.intentKey) as Escalation;
    const esc = page.locator(`#escalations article[data-escalation-id="${escalation.escalationId}"]`);
    await esc.waitFor();
    await expect(esc.locator('input[name="baseVersion"]').inputValue()).resolves.toBe(escalation.current!.version);
    // the change field: prefilled with the agent's own change, not sent unless ticked
    const deltaText = esc.locator('textarea[name="delta"]');
    const useDelta = esc.locator('input[name="useDelta"]');
    expect(JSON.parse(await deltaText.inputValue())).toEqual(escalation.intent.delta);
    await expect(useDelta.isChecked()).resolves.toBe(false);
    const patches = () => h.records.patchRequests(escalated.intentKey);

    // --- control: Apply without a change: refused resolution_delta_required, nothing written, the field pointed at ---
    await esc.locator('button[data-action="apply"]').click();
    await esc.locator('.answer [data-answer-reason="resolution_delta_required"]').waitFor({ timeout: 45_000 });
    expect(JSON.parse(sent[0]!)).toEqual({ decision: "apply", baseVersion: escalation.current!.version });
    await expect(esc.locator(".answer > span").allTextContents()).resolves.toEqual([
      expect.stringMatching(/^Owner's answer: resolution_delta_required: tool tag_ticket_no_delta has no delta function/),
      " Nothing was written. Give the change to write in “Change to write with Apply” below and Apply again.",
    ]);
    await expect(esc.locator(".delta-required").isVisible()).resolves.toBe(true);
    await expect(esc.locator("details.delta").getAttribute("open")).resolves.not.toBeNull();
    await expect(useDelta.isChecked()).resolves.toBe(true);
    await expect(deltaText.evaluate((el) => el.ownerDocument.activeElement === el)).resolves.toBe(true);
    expect(patches()).toHaveLength(0);
    await expect(esc.getAttribute("data-status")).resolves.toBe("open");
    expect(decisions).toEqual([expect.objectContaining({ status: "rejected", reason: "resolution_delta_required" })]);

    // --- a malformed change: refused in the page, its error inline, nothing sent ---
    for (const [typed, said] of [
      ['[{"op": "replace", "path": "/tags", ', /^The change is not JSON: /],
      ['{"op": "replace", "path": "/tags", "value": []}', /^The change is not a JSON Patch \(RFC 6902\): it must be an array of operations/],
      ['[{"op": "frobnicate", "path": "/tags"}]', /^The change is not a JSON Patch \(RFC 6902\): \[0\]\.op must be one of add, remove, replace, move, copy, test/],
      ['[{"op": "replace", "path": "tags", "value": []}]', /^The change is not a JSON Patch \(RFC 6902\): \[0\]\.path must be a JSON Pointer/],
    ] as const) {
      await deltaText.fill(typed);
      await expect(esc.locator(".delta-error").isHidden()).resolves.toBe(true);
      await esc.locator('button[data-action="apply"]').click();
      await esc.locator(".delta-error").waitFor({ state: "visible" });
      await expect(esc.locator(".delta-error").textContent()).resolves.toMatch(said);
      await expect(deltaText.getAttribute("aria-invalid")).resolves.toBe("true");
    }
    expect(sent).toHaveLength(1);
    // posted to the endpoint directly: refused with its reason, nothing sent to the owner
    const resolveUrl = `${url}/api/escalations/${encodeURIComponent(escalation.escalationId)}/resolve`;
    const post = async (body: unknown) => {
      const res = await fetch(resolveUrl, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: url }, body: JSON.stringify(body) });
      return { status: res.status, ...((await res.json()) as { reason?: string; error?: string }) };
    };
    const base = escalation.current!.version;
    await expect(post({ decision: "apply", baseVersion: base, delta: [{ op: "frobnicate", path: "/tags" }] })).resolves.toMatchObject({
      status: 400,
      reason: "delta_invalid",
      error: expect.stringMatching(/^the delta is not a JSON Patch \(RFC 6902\), an array of operations such as .*: Invalid discriminator value.* at \[0\]\.op$/),
    });
    await expect(post({ decision: "apply", baseVersion: base, delta: { op: "replace", path: "/tags", value: [] } })).resolves.toMatchObject({ status: 400, reason: "delta_invalid" });
    await expect(post({ decision: "apply", baseVersion: base, delta: [] })).resolves.toMatchObject({ status: 400, reason: "delta_invalid" });
    let deep: unknown = "x";
    for (let i = 0; i < 40; i++) deep = [deep];
    await expect(post({ decision: "apply", baseVersion: base, delta: [{ op: "replace", path: "/tags", value: deep }] })).resolves.toMatchObject({ status: 400, reason: "delta_too_deep" });
    await expect(post({ decision: "apply", baseVersion: base, delta: [{ op: "replace", path: "/tags", value: ["x".repeat(70_000)] }] })).resolves.toMatchObject({ status: 400, reason: "delta_too_large" });
    await expect(post({ decision: "discard", delta: [{ op: "replace", path: "/tags", value: [] }] })).resolves.toMatchObject({ status: 400, reason: "delta_not_for_apply" });
    expect(decisions).toHaveLength(1);
    expect(patches()).toHaveLength(0);

    // --- a change beyond the tool's scope (it may touch /tags only): the page does not know the tool's paths; the
    // owner refuses it, and the page shows that answer on the card and at the change; nothing written, still open ---
    const wide = [
      { op: "replace", path: "/tags", value: ["needs-human"] },
      { op: "add", path: "/owner", value: "mallory" },
    ];
    await deltaText.fill(JSON.stringify(wide));
    await esc.locator('button[data-action="apply"]').click();
    await esc.locator('.answer [data-answer-reason="patch_path_not_allowed"]').waitFor({ timeout: 45_000 });
    expect(sent).toHaveLength(2);
    expect(JSON.parse(sent[1]!)).toEqual({ decision: "apply", baseVersion: base, delta: wide });
    const refusedText = /^tool tag_ticket_no_delta may not touch \/owner \(its allowedPaths\): nothing was written, the escalation stays open; send a change within them/;
    await expect(esc.locator(".answer > span").allTextContents()).resolves.toEqual([expect.stringMatching(new RegExp(`^Owner's answer: patch_path_not_allowed: ${refusedText.source.slice(1)}`))]);
    await expect(esc.locator(".delta-error").textContent()).resolves.toMatch(new RegExp(`^The record's owner refused this change: ${refusedText.source.slice(1)}`));
    await expect(deltaText.getAttribute("aria-invalid")).resolves.toBe("true");
    await expect(deltaText.evaluate((el) => el.ownerDocument.activeElement === el)).resolves.toBe(true);
    await expect(esc.getAttribute("data-status")).resolves.toBe("open");
    expect(decisions).toEqual([expect.objectContaining({ reason: "resolution_delta_required" }), expect.objectContaining({ status: "rejected", reason: "patch_path_not_allowed" })]);
    expect(patches()).toHaveLength(0);
    expect(h.records.history("ticket", ticket).filter((e) => e.kind === "patch")).toHaveLength(0);

    // --- the change edited against the record shown: applied once, exactly that change ---
    const before = await readVersion(h.records, "ticket", ticket);
    const edited = [{ op: "replace", path: "/tags", value: ["needs-human", "edited-by-ops"] }];
    await deltaText.fill(JSON.stringify(edited, null, 2));
    await esc.locator('button[data-action="apply"]').click();
    const applied = esc.locator('.answer [data-answer-status="applied"]');
    await applied.waitFor({ timeout: 45_000 });
    await expect(esc.locator(".answer > span").allTextContents()).resolves.toEqual([expect.stringMatching(/^Owner's answer: applied at "v\d+" \(via patch\)$/)]);
    expect(sent).toHaveLength(3);
    expect(JSON.parse(sent[2]!)).toEqual({ decision: "apply", baseVersion: base, delta: edited });
    await expect(esc.locator(".delta-error").isHidden()).resolves.toBe(true);
    await waitFor(async () => (await esc.getAttribute("data-status")) === "resolved", { message: "the card shows the escalation resolved" });
    await expect(esc.locator(".outcome").textContent()).resolves.toMatch(new RegExp(`Resolved: applied by ${opsId}`));
    const toAgent = await waitFor(() => erinSeen.find((r) => r.intentId === escalated.intentId && r.status === "applied"), { message: "erin's reply to the resolution" });
    expect(toAgent).toMatchObject({ status: "applied", resolvedBy: opsId });
    // at the records server: one PATCH, on the version shown, of exactly the edited change
    expect(patches()).toHaveLength(1);
    const written = h.records.history("ticket", ticket).filter((e) => e.kind === "patch");
    expect(written).toHaveLength(1);
    expect(written[0]!.ops).toEqual(edited);
    expect((await readVersion(h.records, "ticket", ticket)).state).toEqual({ ...(before.state as object), tags: ["needs-human", "edited-by-ops"] });
    expect(errors).toEqual([]);
  }, 180_000);

  it("sends back a dead letter whose value was cut to fit, from its source offset; a forged one naming another record there is refused source_changed", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    h.records.seed("payment", "pay_1", { amountCents: 10_000, refunds: [] });
    // Owners that take at most 16 KiB, with 52 KiB records (the least that holds a resolution of a 16 KiB intent): a
    // 60 KB intent is dead-lettered too_large, its value cut to fit.
    const strict = await h.startRouter({ config: { ...h.config, maxIntentBytes: 16_384, maxMessageBytes: 53_248 } });
    const p = `cons-big-${h.id}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, `read-${randomUUID()}`, operatorToken);
    const agent = await h.client(`${p}-agent`);
    const intent = agent.buildIntent(refundIntent(`run-${h.id}`, (await readVersion(h.records, "payment", "pay_1")).version, 800));
    // an attachment-sized field the schema does not know (owners drop it once admitted)
    await h.produceRaw("payment:pay_1", Buffer.from(JSON.stringify({ ...intent, attachment: "x".repeat(60_000) })));
    const [dead] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 1)) as DeadLetter[];
    expect(dead).toMatchObject({ reason: "too_large", truncated: true });
    // a forged dead letter naming the same source offset with another sha256: not the record there
    const forger = new Kafka({ brokers: brokers(), clientId: `console-big-forger-${h.id}`, logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    await forger.send({ topic: h.config.topics.dlq, messages: [{ key: "payment:pay_1", value: JSON.stringify({ ...dead, sha256: "0".repeat(64) }) }] });

    const context = await launchChromium();
    const { page, errors } = await openPage(context);
    await page.goto(`${consoleServer.url}/#token=${operatorToken}`);
    await page.waitForSelector('#conn[data-state="live"]');
    const rows = page.locator('#dead-letters tr[data-reason="too_large"]');
    await waitFor(async () => (await rows.count()) === 2, { message: "the dead letter and the forged one" });
    // one key, one partition of writ.dlq: the real one first, then the forgery, then what a send back makes again
    const byOffset = async () => {
      const found: { offset: bigint; sentBack: string | null; text: string }[] = [];
      for (const row of await rows.all()) found.push({ offset: BigInt((await row.getAttribute("data-dlq-offset"))!), sentBack: await row.getAttribute("data-sent-back"), text: (await row.textContent()) ?? "" });
      return found.sort((a, b) => (a.offset < b.offset ? -1 : 1));
    };
    const [real, forged] = await byOffset();
    expect(real!.text).toContain("(truncated)");
    const row = (offset: bigint) => page.locator(`#dead-letters tr[data-reason="too_large"][data-dlq-offset="${offset}"]`);
    await row(forged!.offset).locator('button[data-action="redrive"]').click();
    await row(forged!.offset).locator('.redrive-error[data-reason="source_changed"]').waitFor({ timeout: 45_000 });
    await expect(row(forged!.offset).getAttribute("data-sent-back")).resolves.toBe("false");
    // the real one goes from its source; the owners still refuse it: dead-lettered again, whole (not the cut value)
    await row(real!.offset).locator('button[data-action="redrive"]').click();
    await waitFor(async () => (await row(real!.offset).getAttribute("data-sent-back")) === "true", { message: "the truncated dead letter shows it was sent back", timeoutMs: 45_000 });
    await waitFor(async () => (await rows.count()) === 3, { message: "dead-lettered again", timeoutMs: 45_000 });
    const again = (await byOffset())[2]!;
    expect([again.sentBack, again.text]).toEqual(["false", expect.stringContaining(`${dead!.originalBytes} (truncated)`)]);
    const [, second] = (await h.readTopic(h.config.topics.dlq, "DeadLetter", 3)).filter((d) => d.sha256 === dead!.sha256) as DeadLetter[];
    expect(second).toMatchObject({ reason: "too_large", originalBytes: dead!.originalBytes, sha256: dead!.sha256 });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(0);
    // the cause fixed (owners with the default limits): sent back again, answered, written once
    await strict.stop();
    await h.startRouter();
    await row(again.offset).locator('button[data-action="redrive"]').click();
    const [reply] = (await h.readTopic(intent.replyTo, "Reply", 1)) as Reply[];
    expect(reply).toMatchObject({ status: "applied", duplicate: false, intentKey: intent.intentKey });
    expect(h.records.patchRequests().filter((r) => r.type === "payment")).toHaveLength(1);
    // the refused send back of the forgery is the page's one failed request (a favicon.ico 404 was another)
    expect(errors).toEqual([expect.stringMatching(/status of 409 \(Conflict\)/)]);
  }, 180_000);

  it("refuses value_changed to send back a dead letter whose value is not the bytes its sha256 names (forged with a real record's key and sha256)", async () => {
    const h = await startHarness({ tools: [refundPayment], intentPartitions: 2 });
    await h.startRouter();
    const p = `cons-val-${h.id}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, `read-${randomUUID()}`, operatorToken);
    const agent = await h.client(`${p}-agent`);
    const bytes = Buffer.from(JSON.stringify(agent.buildIntent(refundIntent(`run-${h.id}`, '"1"', 300))));
    const other = Buffer.from(JSON.stringify(agent.buildIntent(refundIntent(`run-x-${h.id}`, '"1"', 5_000))));
    const forged = deadLetterOf(bytes, { topic: h.config.topics.intents, partition: 0, offset: "0" }, { carried: other });
    const forger = new Kafka({ brokers: brokers(), clientId: `console-val-forger-${h.id}`, logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    const [at] = await forger.send({ topic: h.config.topics.dlq, messages: [{ key: "payment:pay_1", value: JSON.stringify(forged) }] });
    const redrive = async () => {
      const res = await fetch(`${consoleServer.url}/api/dead-letters/${at!.partition}/${at!.baseOffset}/redrive`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: consoleServer.url }, body: "{}" });
      return { status: res.status, ...((await res.json()) as { reason?: string }) };
    };
    const answer = await waitFor(async () => {
      const a = await redrive();
      return a.reason === "dead_letter_unknown" ? undefined : a;
    }, { message: "the console keeps the forged dead letter" });
    expect(answer).toMatchObject({ status: 409, reason: "value_changed" });
  }, 120_000);

  it("sends back the ticked dead letters, then every one shown, filtered by reason, in one request: a record dead-lettered twice goes once, another reason stays; each answered and written once", async () => {
    const h = await startHarness({ tools: [tagTicket], intentPartitions: 2 });
    await h.startRouter();
    const p = `cons-bulk-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    const consoleServer = await consoleOf(h, p, readToken, operatorToken);
    // Three intents on three tickets, answered on a reply topic that does not exist yet: each dead-lettered
    // reply_topic_missing; the first produced twice (a producer's retry): two dead letters of one record.
    const agent = await h.client(`${p}-agent`);
    const replyTo = `writ.replies.${p}-late`;
    const runId = `run-${randomUUID()}`;
    const intents = [];
    for (const i of [0, 1, 2]) {
      const ticket = `T-${h.id}-bulk-${i}`;
      h.records.seed("ticket", ticket, { status: "open", tags: [] });
      const { version } = await readVersion(h.records, "ticket", ticket);
      const intent = agent.buildIntent({ tool: tagTicket, entity: { type: "ticket", id: ticket }, runId, stepId: `tag-${i}`, baseVersion: version, delta: [{ op: "replace", path: "/tags", value: [`bulk-${i}`] }], params: { tag: `bulk-${i}` } });
      intent.replyTo = replyTo;
      intents.push(intent);
    }
    for (const intent of [...intents, intents[0]!]) await h.produceRaw(entityKey(intent.entity), Buffer.from(JSON.stringify(intent)));
    // and one of another reason, whose cause is not fixed: it must stay where it is
    await h.produceRaw(entityKey(intents[1]!.entity), Buffer.from("{not json"));

    const context = await launchChromium();
    const { page, errors } = await openPage(context);
    await page.goto(`${consoleServer.url}/#token=${operatorToken}`);
    await page.waitForSelector('#conn[data-state="live"]');
    const all = page.locator("#dead-letters tr[data-reason]");
    const missing = page.locator('#dead-letters tr[data-reason="reply_topic_missing"]');
    await waitFor(async () => (await all.count()) === 5, { message: "four dead letters of a missing reply topic and one of another reason", timeoutMs: 45_000 });
    const other = page.locator('#dead-letters tr[data-reason]:not([data-reason="reply_topic_missing"])');
    const otherWhere = { partition: await other.getAttribute("data-dlq-partition"), offset: await other.getAttribute("data-dlq-offset") };
    const button = page.locator('#dlq-send-shown[data-action="redrive-shown"]');
    await expect(button.getAttribute("data-count")).resolves.toBe("5");
    // the cause fixed for one reason; the page shows that reason only, and sends what it shows
    const admin = new Kafka({ brokers: brokers(), clientId: `console-bulk-admin-${h.id}`, logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: replyTo, numPartitions: 1 }]);
    await page.selectOption("#dlq-reason", "reply_topic_missing");
    await waitFor(async () => (await all.count()) === 4, { message: "the reason filter" });
    await expect(page.textContent("#n-dlq")).resolves.toBe("4 of 5");
    await expect(button.textContent()).resolves.toBe("Send back 4 shown");
    // one ticked: the button sends that one only (counted at the records server: the others not written yet)
    const second = missing.filter({ hasText: entityKey(intents[1]!.entity) });
    await second.locator('input[type="checkbox"][data-action="pick"]').check();
    await waitFor(async () => (await button.getAttribute("data-scope")) === "selected", { message: "the button takes the ticked one" });
    await expect(button.textContent()).resolves.toBe("Send back 1 selected");
    await button.click();
    await page.locator('#dlq-bulk[data-sent="1"][data-not-sent="0"]').waitFor({ timeout: 45_000 });
    await waitFor(async () => (await second.getAttribute("data-sent-back")) === "true", { message: "the ticked one shows sent back", timeoutMs: 45_000 });
    const [first] = (await h.readTopic(replyTo, "Reply", 1)) as Reply[];
    expect(first).toMatchObject({ intentKey: intents[1]!.intentKey, status: "applied", duplicate: false });
    expect(intents.map((i) => h.records.patchRequests(i.intentKey).length)).toEqual([0, 1, 0]);
    await expect(missing.locator('input[data-action="pick"]').count()).resolves.toBe(3);
    // none ticked: every shown one not sent back yet
    await expect(button.textContent()).resolves.toBe("Send back 3 shown");
    await button.click();
    const bulk = page.locator('#dlq-bulk[data-sent="2"]');
    await bulk.waitFor({ timeout: 45_000 });
    await expect(bulk.getAttribute("data-not-sent")).resolves.toBe("1");
    await expect(bulk.textContent()).resolves.toBe("2 sent back, 1 not (same_record 1)");
    await waitFor(async () => (await page.locator('#dead-letters tr[data-reason="reply_topic_missing"][data-sent-back="true"]').count()) === 3, { message: "three shown sent back", timeoutMs: 45_000 });
    const twin = missing.filter({ has: page.locator('.redrive-error[data-reason="same_record"]') });
    await expect(twin.getAttribute("data-sent-back")).resolves.toBe("false");
    // answered once each, counted at the records server: one PATCH per intent
    const replies = (await h.readTopic(replyTo, "Reply", 3)) as Reply[];
    expect(replies.map((r) => [r.intentKey, r.status, r.duplicate]).sort()).toEqual(intents.map((i) => [i.intentKey, "applied", false]).sort());
    for (const intent of intents) expect(h.records.patchRequests(intent.intentKey)).toHaveLength(1);

    // through the API: not with the read-only token; bounded; the twin named twice in one request goes once, and
    // the owner answers it from its ledger (duplicate, no PATCH)
    const post = (token: string, body: unknown) =>
      fetch(`${consoleServer.url}/api/dead-letters/redrive`, { method: "POST", headers: { "content-type": "application/json", authorization: `Bearer ${token}`, origin: consoleServer.url }, body: JSON.stringify(body) });
    const twinWhere = { partition: Number(await twin.getAttribute("data-dlq-partition")), offset: (await twin.getAttribute("data-dlq-offset"))! };
    expect((await post(readToken, { deadLetters: [twinWhere] })).status).toBe(403);
    expect((await post(operatorToken, { deadLetters: Array.from({ length: 201 }, (_, i) => ({ partition: 0, offset: String(i) })) })).status).toBe(400);
    expect((await post(operatorToken, { deadLetters: [] })).status).toBe(400);
    const again = await post(operatorToken, { deadLetters: [twinWhere, twinWhere, { partition: Number(otherWhere.partition), offset: otherWhere.offset }] });
    const answer = (await again.json()) as { sent: number; notSent: number; results: { outcome: string; sentTo?: { topic: string; partition: number; offset: string } }[] };
    expect([again.status, answer.sent, answer.notSent, answer.results.map((r) => r.outcome)]).toEqual([200, 2, 1, ["sent", "dead_letter_sending", "sent"]]);
    // where the answer says each went is that record: its header names the dead letter it came from
    const sentTo = [answer.results[0]!.sentTo!, answer.results[2]!.sentTo!];
    const reader = new Kafka({ brokers: brokers(), clientId: `console-bulk-reader-${h.id}`, logLevel: logLevel.NOTHING });
    const { found } = await readRecordsAt(reader, h.config.topics.intents, offsetsWanted(sentTo), { timeoutMs: 30_000, log: pino({ level: "silent" }) });
    expect(sentTo.map((t) => [t.topic, found.get(atOffset(t.partition, t.offset))?.headers?.[REDRIVEN_FROM_HEADER]?.toString()])).toEqual([
      [h.config.topics.intents, `${h.config.topics.dlq}:${twinWhere.partition}:${twinWhere.offset}`],
      [h.config.topics.intents, `${h.config.topics.dlq}:${otherWhere.partition}:${otherWhere.offset}`],
    ]);
    const [, , , repeat] = (await h.readTopic(replyTo, "Reply", 4)) as Reply[];
    expect(repeat).toMatchObject({ intentKey: intents[0]!.intentKey, status: "applied", duplicate: true });
    for (const intent of intents) expect(h.records.patchRequests(intent.intentKey)).toHaveLength(1);
    // the page marks the twin sent back too, and drops its refusal
    const twinRow = page.locator(`#dead-letters tr[data-dlq-partition="${twinWhere.partition}"][data-dlq-offset="${twinWhere.offset}"]`);
    await waitFor(async () => (await twinRow.getAttribute("data-sent-back")) === "true", { message: "the twin shows sent back", timeoutMs: 45_000 });
    await expect(twinRow.locator(".redrive-error").count()).resolves.toBe(0);
    // the other reason's dead letter, sent back by the API only: dead-lettered again (its cause remains)
    await page.selectOption("#dlq-reason", "");
    await waitFor(async () => (await all.count()) === 6, { message: "the other dead letter, dead-lettered again", timeoutMs: 45_000 });
    expect(errors).toEqual([]);
  }, 180_000);

  it("the page is served to anyone, its data only with the token; the stream opens on a one-use, 30 s ticket with its token's role; no token in a URL is taken", async () => {
    const id = randomUUID().slice(0, 8);
    const readToken = `read-${randomUUID()}`;
    const logged: string[] = [];
    const logger = pino({ level: "debug" }, { write: (line: string) => void logged.push(line) });
    // The tickets' clock is the test's: an expiry is a turn of it, not a wait.
    let now = 1_000_000;
    const options = {
      brokers: brokers(),
      ...(registryUrl() ? { schemaRegistryUrl: registryUrl()! } : {}),
      topics: { intents: `cons-tickets-${id}.intents`, human: `cons-tickets-${id}.human`, dlq: `cons-tickets-${id}.dlq` },
      replyPrefix: `writ.replies.cons-tickets-${id}-`,
      token: readToken,
      now: () => now,
      logger,
    };
    const server = await startConsole(options);
    onTestFinished(() => server.close());
    const url = server.url;
    const bearer = { authorization: `Bearer ${readToken}` };
    const askTicket = (headers: Record<string, string> = bearer) => fetch(`${url}/api/stream-ticket`, { method: "POST", headers });
    const newTicket = async () => ((await (await askTicket()).json()) as { ticket: string; expiresInMs: number }).ticket;
    /** The stream's `hello` (its role), then the stream closed. */
    const hello = async (ticket: string): Promise<unknown> => {
      const stream = new AbortController();
      const res = await fetch(`${url}/events?ticket=${ticket}`, { signal: stream.signal });
      expect(res.status).toBe(200);
      const body = res.body!.getReader();
      let text = "";
      let m: RegExpExecArray | null = null;
      while ((m = /event: hello\ndata: (.*)\n/.exec(text)) === null) text += new TextDecoder().decode((await body.read()).value);
      stream.abort();
      return JSON.parse(m[1]!);
    };
    /** The status and reason of /events with `ticket` (a stream it opened is closed at once). */
    const refusedTicket = async (ticket: string) => {
      const stream = new AbortController();
      const res = await fetch(`${url}/events?ticket=${ticket}`, { signal: stream.signal });
      if (res.status !== 401) {
        stream.abort();
        return [res.status];
      }
      return [res.status, ((await res.json()) as { reason?: string }).reason];
    };

    // The page and its files hold no data: served without a token. Everything else needs one, as a header.
    const page = await fetch(`${url}/`);
    expect([page.status, page.headers.get("referrer-policy")]).toEqual([200, "no-referrer"]);
    await expect(page.text()).resolves.toMatch(/<title>writ console<\/title>/);
    for (const path of ["/api/session", "/api/state", "/events"]) expect([path, (await fetch(`${url}${path}`)).status]).toEqual([path, 401]);
    expect((await fetch(`${url}/api/state`, { headers: { authorization: "Bearer wrong-token-0123456789" } })).status).toBe(401);
    expect((await fetch(`${url}/api/session`, { headers: bearer })).status).toBe(200);
    // A token in a URL is taken nowhere (it would reach access logs, history and Referer).
    for (const path of ["/api/session", "/api/state", "/events"]) expect([path, (await fetch(`${url}${path}?token=${readToken}`)).status]).toEqual([path, 401]);

    // A ticket is asked for with the token as Authorization only, by POST.
    const noToken = await askTicket({});
    expect([noToken.status, ((await noToken.json()) as { reason?: string }).reason]).toEqual([401, "token_invalid"]);
    expect((await askTicket({ authorization: "Bearer wrong-token-0123456789" })).status).toBe(401);
    expect((await fetch(`${url}/api/stream-ticket?token=${readToken}`, { method: "POST" })).status).toBe(401);
    expect((await fetch(`${url}/api/stream-ticket`, { headers: bearer })).status).toBe(405);
    const issued = (await (await askTicket()).json()) as { ticket: string; expiresInMs: number };
    expect(issued.ticket).toMatch(/^[A-Za-z0-9_-]{43}$/);
    expect(issued.expiresInMs).toBe(30_000);
    // It opens one stream, with the role of the token that asked (reader: a ticket grants no more than its token) ...
    await expect(hello(issued.ticket)).resolves.toMatchObject({ role: "reader", operator: null });
    // ... and never another.
    await expect(refusedTicket(issued.ticket)).resolves.toEqual([401, "ticket_invalid"]);
    await expect(refusedTicket("not-a-ticket")).resolves.toEqual([401, "ticket_invalid"]);
    // Within its 30 s it works; at 30 s it is refused.
    const late = await newTicket();
    const inTime = await newTicket();
    now += 29_999;
    await expect(hello(inTime)).resolves.toMatchObject({ role: "reader" });
    now += 1;
    await expect(refusedTicket(late)).resolves.toEqual([401, "ticket_invalid"]);

    // At most 1,000 outstanding: then 429 (no other page's ticket is evicted), until the expired make room.
    const outstanding: string[] = [];
    for (let i = 0; i < 1000; i++) outstanding.push(await newTicket());
    const over = await askTicket();
    expect([over.status, over.headers.get("retry-after"), ((await over.json()) as { reason?: string }).reason]).toEqual([429, "30", "too_many_tickets"]);
    await expect(hello(outstanding[0]!)).resolves.toMatchObject({ role: "reader" });
    await expect(newTicket()).resolves.toMatch(/^[A-Za-z0-9_-]{43}$/);
    now += 30_000;
    for (let i = 0; i < 5; i++) expect((await askTicket()).status).toBe(200);
    await expect(refusedTicket(outstanding[1]!)).resolves.toEqual([401, "ticket_invalid"]);

    // A page whose stream drops (here: the console restarts under it) comes back on a ticket of its own; the
    // browser's own retry would reuse the spent one.
    const context = await launchChromium();
    const { page: tab, errors } = await openPage(context);
    const requested: string[] = [];
    tab.on("request", (r) => void requested.push(r.url()));
    await tab.goto(`${url}/#token=${readToken}`);
    await tab.waitForSelector('#conn[data-state="live"]');
    // The shared broker has no authorizer: the ACL check of the console's start puts up a banner.
    await tab.waitForSelector('#trust[data-reason="no_authorizer"]:not([hidden])');
    await expect(tab.textContent("#trust")).resolves.toMatch(/^Writers are not restricted: this Kafka cluster has no authorizer\.The cluster has no authorizer .*may be forged.*reason: no_authorizer$/);
    await server.close();
    await tab.waitForSelector('#conn:not([data-state="live"])');
    const restarted = await startConsole({ ...options, port: server.port });
    onTestFinished(() => restarted.close());
    await tab.waitForSelector('#conn[data-state="live"]', { timeout: 20_000 });
    await expect(tab.textContent("#role")).resolves.toBe("read-only");
    const streams = requested.filter((u) => u.includes("/events?ticket="));
    expect(streams.length).toBeGreaterThanOrEqual(2);
    expect(new Set(streams).size).toBe(streams.length);
    expect(requested.filter((u) => u.includes(readToken))).toEqual([]);
    expect(tab.url()).toBe(`${url}/`);
    // (the console's refused connections while it was down are console errors; no script failed)
    expect(errors.filter((e) => e.startsWith("pageerror"))).toEqual([]);

    // Neither the token nor a ticket is logged.
    const log = logged.join("");
    expect(log).not.toContain(readToken);
    for (const t of [issued.ticket, late, inTime, outstanding[0]!, ...streams.map((u) => new URL(u).searchParams.get("ticket")!)]) expect(log).not.toContain(t);
  }, 90_000);

  it("connection limits: silent sockets on every free slot are closed after the headers timeout, then the API answers; the event stream stays open; bad limits are refused naming the field", async () => {
    const id = randomUUID().slice(0, 8);
    const readToken = `read-${randomUUID()}`;
    const options: ConsoleOptions = {
      brokers: brokers(),
      ...(registryUrl() ? { schemaRegistryUrl: registryUrl()! } : {}),
      topics: { intents: `cons-limits-${id}.intents`, human: `cons-limits-${id}.human`, dlq: `cons-limits-${id}.dlq` },
      replyPrefix: `writ.replies.cons-limits-${id}-`,
      token: readToken,
      headersTimeoutMs: 1_500,
      logger: pino({ level: "silent" }),
    };
    await expect(startConsole({ ...options, headersTimeoutMs: 0 })).rejects.toMatchObject({ code: "config_invalid", context: { field: "headersTimeoutMs" } });
    await expect(startConsole({ ...options, maxConnectionsPerAddress: CONSOLE_MAX_CONNECTIONS + 1 })).rejects.toThrow(/maxConnectionsPerAddress must be a whole number from 1 to 256/);
    await expect(startConsole({ ...options, maxStreams: 65 })).rejects.toThrow(/maxStreams must be a whole number from 1 to 64/);
    const server = await startConsole(options);
    onTestFinished(() => server.close());
    const bearer = { authorization: `Bearer ${readToken}` };
    // Each on a connection of its own, closed after: a pooled keep-alive one would hold a slot, or skip the queue.
    const once = async <T>(go: (dispatcher: Agent) => Promise<T>): Promise<T> => {
      const dispatcher = new Agent({ pipelining: 0 });
      try {
        return await go(dispatcher);
      } finally {
        await dispatcher.close();
      }
    };
    const session = (): Promise<number | null> =>
      once((dispatcher) => undiciFetch(`${server.url}/api/session`, { dispatcher, headers: bearer, signal: AbortSignal.timeout(2_000) }).then((r) => r.status)).catch(() => null);
    const { ticket } = await once(async (dispatcher) => (await (await undiciFetch(`${server.url}/api/stream-ticket`, { dispatcher, method: "POST", headers: bearer })).json()) as { ticket: string });
    const stream = await openSocket(server.port);
    onTestFinished(() => void stream.destroy());
    stream.write(`GET /events?ticket=${ticket} HTTP/1.1\r\nHost: 127.0.0.1:${server.port}\r\n\r\n`);
    await waitFor(() => stream.got.includes("event: snapshot"), { timeoutMs: 10_000, intervalMs: 20 });

    // Every other slot taken by a socket that sends nothing (opened well within the 1.5 s they have): refused.
    const idle = await silentSockets(server.port, CONSOLE_MAX_CONNECTIONS - 1);
    onTestFinished(() => idle.forEach((s) => s.destroy()));
    const full = await whileAllOpen(idle, session);
    if (full.allOpen) expect(full.value).toBeNull();
    // Node closes them (408) once the headers timeout passes; the API answers again, the stream is still open.
    await waitFor(async () => (await session()) === 200, { timeoutMs: 15_000, intervalMs: 20, message: "the API never answered again" });
    await waitFor(() => idle.every((s) => s.isClosed()), { timeoutMs: 5_000, intervalMs: 20 });
    expect(idle[0]!.got).toMatch(/^HTTP\/1\.1 408 /);
    expect(stream.isClosed()).toBe(false);
    expect(stream.got).toMatch(/^HTTP\/1\.1 200 [^]*text\/event-stream/);

    // A refused request closes its connection (keep-alive asked for, no token): requests without a token cannot keep a slot.
    const refused = await openSocket(server.port);
    onTestFinished(() => void refused.destroy());
    refused.write(`GET /api/session HTTP/1.1\r\nHost: 127.0.0.1:${server.port}\r\nConnection: keep-alive\r\n\r\n`);
    await waitFor(() => refused.isClosed(), { timeoutMs: 4_000, intervalMs: 20, message: "the refused keep-alive connection stayed open" });
    expect(refused.got).toMatch(/^HTTP\/1\.1 401 [^]*connection: close/i);
  }, 60_000);

  it("writ console: --help, a token is required (and at least 16 characters, never echoed); the built CLI serves the page", async () => {
    const env = { ...process.env, KAFKA_BROKERS: brokers().join(","), WRIT_CONSOLE_TOKEN: "", WRIT_CONSOLE_OPERATOR_TOKEN: "" };
    const run = (args: string[], extra: Record<string, string> = {}) =>
      new Promise<{ code: number; stdout: string; stderr: string }>((resolve) => {
        execFile(process.execPath, [join(ROOT, "src", "cli", "main.ts"), "console", ...args], { env: { ...env, ...extra }, timeout: 60_000 }, (err, stdout, stderr) =>
          resolve({ code: err === null ? 0 : typeof err.code === "number" ? err.code : 1, stdout, stderr }),
        );
      });
    const help = await run(["--help"]);
    expect(help.code).toBe(0);
    expect(help.stdout).toMatch(/^usage: writ console/);
    expect(help.stdout).toMatch(/--operator-token/);
    expect(help.stdout).toMatch(/Exit status/);
    const none = await run([]);
    expect(none.code).toBe(2);
    expect(none.stderr).toMatch(/needs a token/);
    // Flags are checked before the port: a short token is named as such even on a port another process holds.
    const holder = createServer();
    await new Promise<void>((resolve) => holder.listen(0, "127.0.0.1", resolve));
    onTestFinished(() => void holder.close());
    const held = String((holder.address() as AddressInfo).port);
    const short = await run(["--port", held], { WRIT_CONSOLE_TOKEN: "short-secret" });
    expect(short.code).toBe(2);
    expect(short.stderr).toMatch(/at least 16 characters/);
    expect(short.stderr).not.toContain("short-secret");
    const taken = await run(["--port", held], { WRIT_CONSOLE_TOKEN: "long-enough-secret-0123" });
    expect([taken.code, taken.stderr]).toEqual([2, expect.stringMatching(new RegExp(`--port ${held}: .*in use`))]);
    expect(taken.stderr).not.toContain("long-enough-secret-0123");
    const same = await run(["--token", "same-token-0123456789", "--operator-token", "same-token-0123456789"]);
    expect(same.code).toBe(2);
    expect(same.stderr).toMatch(/must differ/);
    const badOwner = await run(["--token", "a-token-0123456789", "--owner-principal", "bad name"]);
    expect(badOwner.code).toBe(2);
    expect(badOwner.stderr).toMatch(/--owner-principal: not a Kafka principal/);
    const badTimeout = await run(["--token", "a-token-0123456789", "--headers-timeout-ms", "0"]);
    expect([badTimeout.code, badTimeout.stderr]).toEqual([2, expect.stringMatching(/--headers-timeout-ms must be an integer from 1 to 3600000, got 0/)]);
    const badCap = await run(["--token", "a-token-0123456789", "--max-connections-per-address", "257"]);
    expect([badCap.code, badCap.stderr]).toEqual([2, expect.stringMatching(/--max-connections-per-address must be an integer from 1 to 256, got 257/)]);

    // The built package's CLI finds the page too (dist/src/console has no HTML: it reads src/console/assets).
    await ensureBuilt();
    const token = `built-${randomUUID()}`;
    const built = `cons-built-${randomUUID().slice(0, 8)}`;
    const child = spawn(process.execPath, ["--no-experimental-strip-types", BUILT_CLI, "console", "--port", "0", "--owner-principal", "ops-owner"], {
      cwd: ROOT,
      // Its own reply prefix: the default would follow every reply topic on the broker, another file's too.
      env: { ...env, WRIT_CONSOLE_TOKEN: token, WRIT_INTENTS_TOPIC: `${built}.intents`, WRIT_REPLY_TOPIC_PREFIX: `${built}.replies.` },
      stdio: ["ignore", "ignore", "pipe"],
    });
    let stderr = "";
    child.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    const exited = new Promise<number | null>((resolve) => child.on("exit", (code) => resolve(code)));
    onTestFinished(() => {
      if (child.exitCode === null) child.kill("SIGKILL");
    });
    const base = await waitFor(() => /listening on (http:\/\/127\.0\.0\.1:\d+)\//.exec(stderr)?.[1], { timeoutMs: 30_000, message: () => `no "listening" line: ${stderr}` });
    expect(stderr).toMatch(/read-only/);
    expect(stderr).toContain(`open ${base}/#token=<your token>`);
    const page = await fetch(`${base}/`);
    expect(page.status).toBe(200);
    expect(await page.text()).toMatch(/<title>writ console<\/title>/);
    expect((await fetch(`${base}/assets/console.js`)).status).toBe(200);
    expect((await fetch(`${base}/api/state`)).status).toBe(401);
    expect((await fetch(`${base}/api/state`, { headers: { authorization: `Bearer ${token}` } })).status).toBe(200);
    // the ACL check takes its owners from --owner-principal (over $WRIT_OWNER_PRINCIPALS)
    const trust = await waitFor(
      async () => ((await (await fetch(`${base}/api/session`, { headers: { authorization: `Bearer ${token}` } })).json()) as { trust: { owners: string[] } | null }).trust ?? undefined,
      { timeoutMs: 30_000, message: "the console's ACL check" },
    );
    expect(trust.owners).toEqual(["User:ops-owner"]);
    child.kill("SIGTERM");
    expect(await exited).toBe(0);
    expect(stderr).not.toContain(token);
  }, 180_000);
});
