// The console's page in a real browser, for the console's integration tests: headless Chromium (Debian's
// package, /usr/bin/chromium, or $WRIT_CHROMIUM) driven by playwright-core, and a console on a harness's
// topics. A missing Chromium fails the test: it is never skipped.
import { existsSync, mkdtempSync, rmSync } from "node:fs";
import { tmpdir } from "node:os";
import { join } from "node:path";
import { chromium, type BrowserContext, type Page } from "playwright-core";
import { pino } from "pino";
import { onTestFinished } from "vitest";
import type { WritClient } from "../../producers/writ-client.ts";
import { startConsole, type ConsoleOptions, type ConsoleServer } from "../../src/console/server.ts";
import type { Reply } from "../../src/schemas/reply.ts";
import { brokers, registryUrl, type Harness } from "./writ-harness.ts";

const CHROMIUM = process.env.WRIT_CHROMIUM || "/usr/bin/chromium";
/** Chromium's own connections (updates, sync, QUIC probes) are refused on a closed network: all off. */
const CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-quic", "--no-first-run", "--disable-background-networking", "--disable-component-update", "--disable-sync"];

/** Headless Chromium with a fresh profile (playwright takes the user data dir as an argument, not as --user-data-dir). */
export async function launchChromium(): Promise<BrowserContext> {
  if (!existsSync(CHROMIUM)) {
    throw new Error(`no Chromium at ${CHROMIUM}: the console test needs a real browser (apt-get install -y --no-install-recommends chromium; .ci/run does)`);
  }
  const profile = mkdtempSync(join(tmpdir(), "writ-console-chromium-"));
  const context = await chromium.launchPersistentContext(profile, { executablePath: CHROMIUM, headless: true, args: CHROMIUM_ARGS, viewport: { width: 1440, height: 1000 } });
  onTestFinished(async () => {
    await context.close().catch(() => undefined);
    rmSync(profile, { recursive: true, force: true });
  });
  return context;
}

/** A page that records its script errors and console errors (a CSP violation is one). */
export async function openPage(context: BrowserContext): Promise<{ page: Page; errors: string[] }> {
  const page = await context.newPage();
  const errors: string[] = [];
  page.on("pageerror", (err) => errors.push(`pageerror: ${err.message}`));
  page.on("console", (msg) => {
    if (msg.type() === "error" && !/the server responded with a status of (401|403)/.test(msg.text())) errors.push(`console: ${msg.text()}`);
  });
  return { page, errors };
}

/**
 * A page opened on the console at `url` with `token`, once its stream is live; with its errors (openPage) and the
 * bodies of the decisions it posted (`/api/escalations/<id>/resolve`), in order.
 */
export async function openLivePage(context: BrowserContext, url: string, token: string): Promise<{ page: Page; errors: string[]; sent: string[] }> {
  const { page, errors } = await openPage(context);
  const sent: string[] = [];
  page.on("request", (r) => {
    if (r.url().includes("/resolve")) sent.push(r.postData() ?? "");
  });
  await page.goto(`${url}/#token=${token}`);
  await page.waitForSelector('#conn[data-state="live"]');
  return { page, errors, sent };
}

/** The replies `client` reads on its reply topic, as they come. */
export function listen(client: WritClient): Reply[] {
  const seen: Reply[] = [];
  void (async () => {
    for await (const r of client.replies()) seen.push(r);
  })();
  return seen;
}

/** The options of a console on the harness's topics and group, following this test's reply topics (`writ.replies.<p>-*`). */
export function consoleOptions(h: Harness, p: string, readToken: string, operatorToken: string, more: Partial<ConsoleOptions> = {}): ConsoleOptions {
  return {
    brokers: brokers(),
    ...(registryUrl() ? { schemaRegistryUrl: registryUrl()! } : {}),
    topics: { intents: h.config.topics.intents, human: h.config.topics.human, dlq: h.config.topics.dlq },
    replyPrefix: `writ.replies.${p}-`,
    groupId: h.config.groupId,
    token: readToken,
    operatorToken,
    operator: { id: `ops-${h.id}`, replyTopic: `writ.replies.${p}-ops` },
    discoverIntervalMs: 300,
    logger: pino({ level: process.env.LOG_LEVEL ?? "warn" }),
    ...more,
  };
}

/** A console started with `options`, closed after the test, once ready. */
export async function startTestConsole(options: ConsoleOptions): Promise<ConsoleServer> {
  const server = await startConsole(options);
  onTestFinished(() => server.close());
  await server.ready;
  return server;
}

/** A console on the harness's topics and group (consoleOptions); closed after the test. */
export async function consoleOf(h: Harness, p: string, readToken: string, operatorToken: string, more: Partial<ConsoleOptions> = {}): Promise<ConsoleServer> {
  return startTestConsole(consoleOptions(h, p, readToken, operatorToken, more));
}
