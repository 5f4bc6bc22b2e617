// Forged escalations filling the console's list, in a real browser (test/helpers/console-page.ts) on the shared
// broker: any producer can write writ.human and the reply topics. What reaches every open page for one more
// record is what that record changed (its own escalation, the counts), never the whole list again; the page's
// list stays the console's.
import { randomUUID } from "node:crypto";
import { Kafka, logLevel } from "kafkajs";
import { describe, expect, it, onTestFinished } from "vitest";
import type { ConsoleSnapshot } from "../../src/console/state.ts";
import { entityKey } from "../../src/schemas/common.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import { consoleOf, launchChromium, openPage } from "../helpers/console-page.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, startHarness, tagTicketNoDelta } from "../helpers/writ-harness.ts";
import { createTopicsWithLeaders } from "../helpers/topics.ts";

describe("writ console under forged escalations", () => {
  it("one more forged record costs every open page what it changed, not the whole list again (a full list of several kilobytes each, 4 records a second, was megabytes a second per page): escalations, conflicts; the page's lists stay the console's", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta] });
    const p = `cflood-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    // writ.human as an owner makes it (no owner runs here: every escalation is forged)
    const admin = new Kafka({ brokers: brokers(), clientId: "console-flood-admin", logLevel: logLevel.NOTHING }).admin();
    await admin.connect();
    onTestFinished(() => admin.disconnect());
    await createTopicsWithLeaders(admin, [{ topic: h.config.topics.human, numPartitions: 1 }]);
    const consoleServer = await consoleOf(h, p, readToken, operatorToken, { limits: { escalations: 3, recent: 3 } });
    const url = consoleServer.url;
    const context = await launchChromium();
    const { page, errors } = await openPage(context);
    // every server-sent event the page receives, as the browser got it
    const frames: { event: string; data: string }[] = [];
    const cdp = await context.newCDPSession(page);
    cdp.on("Network.eventSourceMessageReceived", (m: { eventName: string; data: string }) => void frames.push({ event: m.eventName, data: m.data }));
    await cdp.send("Network.enable");
    await page.goto(`${url}/#token=${operatorToken}`);
    await page.waitForSelector('#conn[data-state="live"]');

    const mallory = await h.client(`${p}-mallory`);
    const forger = new Kafka({ brokers: brokers(), clientId: "console-flood-forger", logLevel: logLevel.NOTHING }).producer();
    await forger.connect();
    onTestFinished(() => forger.disconnect());
    // escalations of several kilobytes each, marked so a frame that carries one again shows it
    const mark = (n: number) => `BULK-${n}-`;
    const forged = (n: number): Escalation => {
      const intent = mallory.buildIntent({ tool: tagTicketNoDelta, entity: { type: "ticket", id: `T-${h.id}-${n}` }, runId: "r", stepId: `s-${n}`, baseVersion: '"v1"', delta: [{ op: "replace", path: "/tags", value: ["x"] }], params: { tag: "x" } });
      return { escalationId: `e-${h.id}-${n}`, reason: "conflict_cycles_exhausted", message: `${mark(n)}${"m".repeat(1500)}`, intent, cycles: 3, current: { state: { note: `${mark(n)}${"s".repeat(3000)}` }, version: '"v1"' }, at: new Date().toISOString() };
    };
    const send = (list: Escalation[]) => forger.send({ topic: h.config.topics.human, messages: list.map((e) => ({ key: entityKey(e.intent.entity), value: JSON.stringify(e) })) });
    const shownIds = () => page.locator("#escalations article.escalation").evaluateAll((cards) => cards.map((c) => (c as unknown as { dataset: { escalationId: string } }).dataset.escalationId));
    const state = async () => (await (await fetch(`${url}/api/state`, { headers: { authorization: `Bearer ${readToken}` } })).json()) as ConsoleSnapshot;
    /** The page shows the console's escalations, in its order, with their status. */
    const sameAsConsole = async () => {
      const s = await state();
      const shown = await shownIds();
      const statuses = await page.locator("#escalations article.escalation").evaluateAll((cards) => cards.map((c) => (c as unknown as { dataset: { status: string } }).dataset.status));
      return JSON.stringify([shown, statuses]) === JSON.stringify([s.escalations.map((e) => e.escalationId), s.escalations.map((e) => e.status)]);
    };

    // --- the list filled: three forged escalations ---
    const first = [0, 1, 2].map(forged);
    await send(first);
    await waitFor(async () => (await shownIds()).length === 3, { message: "three escalations on the page" });
    const afterFull = frames.length;

    // --- a fourth (not kept: the list is full of open ones) and a close reported on a reply topic: the page gets
    // the counts and that one escalation's status, nothing of the others' messages or records ---
    await send([forged(3)]);
    await page.locator('#counts .tile.alert[data-count="open escalations"] .v', { hasText: "(+1 not kept)" }).waitFor();
    const e1 = first[1]!;
    const forgedClose = { status: "applied", intentId: e1.intent.intentId, intentKey: e1.intent.intentKey, duplicate: false, at: new Date().toISOString(), entity: e1.intent.entity, state: null, version: '"forged"', via: "patch", resolvedBy: "mallory" };
    await forger.send({ topic: e1.intent.replyTo, messages: [{ key: e1.intent.intentId, value: JSON.stringify(forgedClose) }] });
    const e1Card = page.locator(`#escalations article[data-escalation-id="${e1.escalationId}"]`);
    await waitFor(async () => /^Reported resolved by mallory/.test((await e1Card.locator(".outcome").textContent()) ?? ""), { message: "the reported close on its card" });
    const updates = (from: number) => frames.slice(from).filter((f) => f.event === "update");
    const carried = (from: number) => [0, 1, 2, 3, 4].filter((n) => updates(from).some((f) => f.data.includes(mark(n))));
    expect(carried(afterFull)).toEqual([]);
    await waitFor(sameAsConsole, { message: "the page's escalations are the console's (the closed one last)" });
    expect((await shownIds())[2]).toBe(e1.escalationId);

    // --- a fifth takes the closed one's place: it alone comes whole ---
    const beforeFifth = frames.length;
    await send([forged(4)]);
    await waitFor(async () => (await shownIds()).includes(`e-${h.id}-4`), { message: "the fifth on the page" });
    expect(carried(beforeFifth)).toEqual([4]);
    await waitFor(sameAsConsole, { message: "the page's escalations are the console's (the closed one gone)" });
    expect(await shownIds()).toEqual([`e-${h.id}-0`, `e-${h.id}-2`, `e-${h.id}-4`]);
    // --- conflicts (any producer can write a reply topic): one more costs the pages that one, not the list ---
    const cmark = (n: number) => `CONFLICT-${n}-`;
    const conflict = (n: number) => ({
      status: "conflict",
      intentId: `c-${h.id}-${n}`,
      intentKey: e1.intent.intentKey,
      duplicate: false,
      at: new Date().toISOString(),
      entity: e1.intent.entity,
      cycle: 1,
      message: `${cmark(n)}${"m".repeat(1500)}`,
      current: { state: { note: `${cmark(n)}${"s".repeat(3000)}` }, version: '"v2"' },
      your_change: [{ op: "replace", path: "/tags", value: ["x"] }],
    });
    const sendConflicts = (ns: number[]) => forger.send({ topic: e1.intent.replyTo, messages: ns.map((n) => ({ key: `c-${h.id}-${n}`, value: JSON.stringify(conflict(n)) })) });
    const shownConflicts = () => page.locator("#conflicts article.conflict").evaluateAll((cards) => cards.map((c) => (c as unknown as { dataset: { intentId: string } }).dataset.intentId));
    await sendConflicts([0, 1, 2]);
    await waitFor(async () => (await shownConflicts()).length === 3, { message: "three conflicts on the page" });
    const beforeConflict = frames.length;
    await sendConflicts([3]);
    await waitFor(async () => (await shownConflicts())[0] === `c-${h.id}-3`, { message: "the fourth conflict on the page" });
    expect([0, 1, 2, 3].filter((n) => updates(beforeConflict).some((f) => f.data.includes(cmark(n))))).toEqual([3]);
    expect(await shownConflicts()).toEqual((await state()).conflicts.map((c) => c.intentId));
    expect(await shownConflicts()).toEqual([3, 2, 1].map((n) => `c-${h.id}-${n}`));

    // a reload (a snapshot) shows the same
    await page.reload();
    await page.waitForSelector('#conn[data-state="live"]');
    await waitFor(async () => (await shownIds()).length === 3, { message: "the escalations after a reload" });
    expect(await sameAsConsole()).toBe(true);
    await waitFor(async () => (await shownConflicts()).length === 3, { message: "the conflicts after a reload" });
    expect(await shownConflicts()).toEqual((await state()).conflicts.map((c) => c.intentId));
    expect(errors).toEqual([]);
  }, 120_000);
});
