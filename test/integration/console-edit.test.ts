// The operator's edits on an escalation's card, in a real browser (test/helpers/console-page.ts) against an owner
// (startRouter), the demo records server and the shared broker: what the operator typed survives every rebuild
// of the page while the escalation is there, stays on its own card, is marked when the record changes under it,
// and is what Apply writes.
import { randomUUID } from "node:crypto";
import type { Locator } from "playwright-core";
import { describe, expect, it, onTestFinished } from "vitest";
import { startConsole } from "../../src/console/server.ts";
import type { Escalation } from "../../src/schemas/escalation.ts";
import { consoleOptions, launchChromium, listen, openLivePage, startTestConsole } from "../helpers/console-page.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { escalateTicket, readVersion, startHarness, tagTicketNoDelta } from "../helpers/writ-harness.ts";

/** What an escalation's card holds of the operator's typing. */
async function fields(card: Locator): Promise<{ base: string; delta: string; use: boolean; message: string }> {
  return {
    base: await card.locator('input[name="baseVersion"]').inputValue(),
    delta: await card.locator('textarea[name="delta"]').inputValue(),
    use: await card.locator('input[name="useDelta"]').isChecked(),
    message: await card.locator('input[name="message"]').inputValue(),
  };
}

/** A textarea or input, as far as its caret goes (the page's types, without the DOM's). */
type TextField = { ownerDocument: { activeElement: unknown }; selectionStart: number | null; selectionEnd: number | null; setSelectionRange(start: number, end: number): void };

/** Whether `field` has the page's focus, and where its caret or selection is. */
const caret = (field: Locator) =>
  field.evaluate((el) => {
    const t = el as unknown as TextField;
    return { focused: t.ownerDocument.activeElement === el, start: t.selectionStart, end: t.selectionEnd };
  });

describe("writ console: an operator's edits on an escalation's card", () => {
  it("survive every rebuild (another escalation, one resolved elsewhere, filters, the console restarting), keep focus and caret, never reach another card; marked when the record changes under them, Apply held until kept (or started again); the one PATCH is exactly the edited change", async () => {
    const h = await startHarness({ tools: [tagTicketNoDelta], intentPartitions: 2 });
    await h.startRouter();
    const p = `cedit-${h.id}`;
    const opsId = `ops-${h.id}`;
    const readToken = `read-${randomUUID()}`;
    const operatorToken = `oper-${randomUUID()}`;
    const options = consoleOptions(h, p, readToken, operatorToken, { operator: { id: opsId, replyTopic: `writ.replies.${p}-${opsId}` } });
    const first = await startTestConsole(options);
    const url = first.url;
    const context = await launchChromium();
    const { page, errors, sent } = await openLivePage(context, url, operatorToken);

    const escalationOf = async (intentKey: string, n: number) =>
      (await h.readTopic(h.config.topics.human, "Escalation", n)).find((e) => e.intent.intentKey === intentKey) as Escalation;
    const cardOf = (e: Escalation) => page.locator(`#escalations article[data-escalation-id="${e.escalationId}"]`);
    const prefill = (e: Escalation) => ({ base: e.current!.version, delta: JSON.stringify(e.intent.delta, null, 2), use: false, message: "" });

    // --- two escalations of a tool without a delta function: zoe's first (its card above), then erin's ---
    const zoe = await h.client(`${p}-zoe`);
    const erin = await h.client(`${p}-erin`);
    const erinSeen = listen(erin);
    const zTicket = `T-${h.id}-z`;
    const aTicket = `T-${h.id}-a`;
    const zEscalated = await escalateTicket(h, zoe, zTicket, tagTicketNoDelta);
    const aEscalated = await escalateTicket(h, erin, aTicket, tagTicketNoDelta);
    const z = await escalationOf(zEscalated.intentKey, 2);
    const a = await escalationOf(aEscalated.intentKey, 2);
    const zCard = cardOf(z);
    const aCard = cardOf(a);
    await aCard.waitFor();
    const order = () => page.locator("#escalations > article").evaluateAll((cards) => cards.map((c) => c.getAttribute("data-escalation-id")));
    await expect(order()).resolves.toEqual([z, a].map((e) => e.escalationId));
    await expect(fields(aCard)).resolves.toEqual(prefill(a));

    // --- the operator edits erin's: the change, a message; the caret left inside the change ---
    const edited = [{ op: "replace", path: "/tags", value: ["needs-human", "edited-by-ops"] }];
    const editedText = JSON.stringify(edited, null, 2);
    const aDelta = aCard.locator('textarea[name="delta"]');
    await aCard.locator('input[name="message"]').fill("checked by ops");
    await aCard.locator("details.delta summary").click();
    await aDelta.fill(editedText);
    await aDelta.evaluate((el) => (el as unknown as TextField).setSelectionRange(20, 27));
    const typed = { base: a.current!.version, delta: editedText, use: true, message: "checked by ops" };
    await expect(fields(aCard)).resolves.toEqual(typed);
    await expect(caret(aDelta)).resolves.toEqual({ focused: true, start: 20, end: 27 });

    // --- rebuild: another escalation arrives (frank's); its card has its own prefill, erin's keeps the edit ---
    const frank = await h.client(`${p}-frank`);
    const bTicket = `T-${h.id}-b`;
    const bEscalated = await escalateTicket(h, frank, bTicket, tagTicketNoDelta);
    const b = await escalationOf(bEscalated.intentKey, 3);
    const bCard = cardOf(b);
    await bCard.waitFor();
    await expect(fields(bCard)).resolves.toEqual(prefill(b));
    await expect(fields(aCard)).resolves.toEqual(typed);
    await expect(caret(aDelta)).resolves.toEqual({ focused: true, start: 20, end: 27 });

    // --- rebuild: zoe's escalation is discarded elsewhere (another operator's page): its card moves below erin's ---
    const resolveUrl = (e: Escalation) => `${url}/api/escalations/${encodeURIComponent(e.escalationId)}/resolve`;
    const elsewhere = await fetch(resolveUrl(z), {
      method: "POST",
      headers: { "content-type": "application/json", authorization: `Bearer ${operatorToken}`, origin: url },
      body: JSON.stringify({ decision: "discard" }),
    });
    expect(elsewhere.status).toBe(200);
    await waitFor(async () => (await zCard.getAttribute("data-status")) === "resolved", { message: "zoe's card shows the escalation resolved" });
    await expect(order()).resolves.toEqual([a, b, z].map((e) => e.escalationId));
    await expect(fields(aCard)).resolves.toEqual(typed);
    await expect(fields(bCard)).resolves.toEqual(prefill(b));
    await expect(caret(aDelta)).resolves.toEqual({ focused: true, start: 20, end: 27 });

    // --- rebuild: a filter hides erin's card, clearing it shows it again ---
    await page.fill("#f-record", `ticket:T-${h.id}-b`);
    await aCard.waitFor({ state: "detached" });
    await page.click("#f-clear");
    await aCard.waitFor();
    await expect(fields(aCard)).resolves.toEqual(typed);
    await expect(aCard.locator("details.delta").getAttribute("open")).resolves.not.toBeNull();
    await expect(fields(bCard)).resolves.toEqual(prefill(b));

    // --- rebuild: the console restarts under the page, which reconnects and starts again from a snapshot ---
    await first.close();
    await page.waitForSelector('#conn:not([data-state="live"])');
    const restarted = await startConsole({ ...options, port: first.port });
    onTestFinished(() => restarted.close());
    await page.waitForSelector('#conn[data-state="live"]', { timeout: 20_000 });
    await aCard.waitFor();
    await expect(fields(aCard)).resolves.toEqual(typed);
    await expect(fields(bCard)).resolves.toEqual(prefill(b));
    expect(sent).toEqual([]);

    // --- the record changes under the edit: Apply on the version shown is refused resolution_conflict; the card
    // shows the record now, its edit kept as typed and marked; Apply is held until the operator keeps it ---
    const moved = h.records.seed("ticket", aTicket, { status: "reopened", tags: ["from-elsewhere"] });
    await aCard.locator('button[data-action="apply"]').click();
    await aCard.locator('.answer [data-answer-reason="resolution_conflict"]').waitFor({ timeout: 45_000 });
    expect(sent.map((s) => JSON.parse(s))).toEqual([{ decision: "apply", baseVersion: a.current!.version, message: "checked by ops", delta: edited }]);
    await waitFor(async () => (await aCard.locator(".current .version").textContent()) === moved.version, { message: "erin's card shows the record as the owner read it" });
    expect(JSON.parse((await aCard.locator(".current pre").textContent())!)).toEqual({ status: "reopened", tags: ["from-elsewhere"] });
    const stale = aCard.locator(".draft-stale");
    await stale.waitFor({ state: "visible" });
    await expect(stale.textContent()).resolves.toContain(`written against the record at ${a.current!.version}; it is now ${moved.version}`);
    await expect(fields(aCard)).resolves.toEqual(typed);
    await aCard.locator('button[data-action="apply"]').click();
    await aCard.locator(".delta-error").waitFor({ state: "visible" });
    await expect(aCard.locator(".delta-error").textContent()).resolves.toMatch(/^The record changed since you edited this change/);
    expect(sent).toHaveLength(1);
    // frank's card is untouched by any of it
    await expect(fields(bCard)).resolves.toEqual(prefill(b));
    await aCard.locator('button[data-draft="keep"]').click();
    await stale.waitFor({ state: "hidden" });
    await expect(fields(aCard)).resolves.toEqual({ ...typed, base: moved.version });

    // --- Apply: the one PATCH at the records server is exactly the edited change, on the record now ---
    await aCard.locator('button[data-action="apply"]').click();
    await aCard.locator('.answer [data-answer-status="applied"]').waitFor({ timeout: 45_000 });
    expect(sent.map((s) => JSON.parse(s))).toEqual([
      { decision: "apply", baseVersion: a.current!.version, message: "checked by ops", delta: edited },
      { decision: "apply", baseVersion: moved.version, message: "checked by ops", delta: edited },
    ]);
    const toAgent = await waitFor(() => erinSeen.find((r) => r.intentId === aEscalated.intentId && r.status === "applied"), { message: "erin's reply to the resolution" });
    expect(toAgent).toMatchObject({ status: "applied", resolvedBy: opsId });
    expect(h.records.patchRequests(aEscalated.intentKey)).toHaveLength(1);
    const history = h.records.history("ticket", aTicket);
    const written = history.filter((e) => e.kind === "patch");
    expect(written).toHaveLength(1);
    expect(written[0]).toMatchObject({ ops: edited, fromVersion: history.find((e) => e.etag === moved.version)!.toVersion });
    expect((await readVersion(h.records, "ticket", aTicket)).state).toEqual({ status: "reopened", tags: ["needs-human", "edited-by-ops"] });
    // nothing else was written: frank's and zoe's records only as escalateTicket left them
    expect(h.records.patchRequests(bEscalated.intentKey)).toHaveLength(0);
    expect(h.records.patchRequests(zEscalated.intentKey)).toHaveLength(0);
    await expect(fields(bCard)).resolves.toEqual(prefill(b));

    // --- frank's, edited, its record changed, Apply refused: started again from the record now (its prefill on
    // the version the owner read), nothing more written ---
    await bCard.locator("details.delta summary").click();
    await bCard.locator('textarea[name="delta"]').fill('[{"op": "add", "path": "/tags/-", "value": "frank-edit"}]');
    const bMoved = h.records.seed("ticket", bTicket, { status: "reopened", tags: [] });
    await bCard.locator('button[data-action="apply"]').click();
    await bCard.locator('.answer [data-answer-reason="resolution_conflict"]').waitFor({ timeout: 45_000 });
    await bCard.locator(".draft-stale").waitFor({ state: "visible" });
    await bCard.locator('button[data-draft="reset"]').click();
    await bCard.locator(".draft-stale").waitFor({ state: "hidden" });
    await expect(fields(bCard)).resolves.toEqual({ ...prefill(b), base: bMoved.version });
    expect(sent).toHaveLength(3);
    expect(h.records.patchRequests(bEscalated.intentKey)).toHaveLength(0);
    expect(errors.filter((e) => e.startsWith("pageerror"))).toEqual([]);
  }, 240_000);
});
