// writ verify must FAIL wherever a guarantee does not hold for the user's adapter and system, and never hang or
// leave its consumer groups behind. Each case here is an adapter or system that breaks a guarantee in a way the
// final record alone does not show (an append commutes), or a module that gave verify nothing to prove.
import { spawn } from "node:child_process";
import { once } from "node:events";
import { mkdtempSync, readFileSync, rmSync, writeFileSync } from "node:fs";
import { createServer, request, type IncomingMessage, type Server, type ServerResponse } from "node:http";
import type { AddressInfo } from "node:net";
import { tmpdir } from "node:os";
import { setTimeout as sleep } from "node:timers/promises";
import { join } from "node:path";
import { describe, expect, it, onTestFinished } from "vitest";
import * as demoFixture from "../../examples/verify-fixture.ts";
import { openTicket } from "../../examples/demo-tools.ts";
import { SAME_REQUEST_MS } from "../../src/cli/signals.ts";
import type { PatchOutcome, SystemOfRecord } from "../../src/sor/adapter.ts";
import { createHttpSystemOfRecord } from "../../src/sor/http-adapter.ts";
import type { DemoRecordsServer } from "../../src/testing/demo-records-server.ts";
import { formatReport, type VerifyReport } from "../../src/verify/verify.ts";
import { BUILT_CLI, ROOT, ensureBuilt } from "../helpers/build.ts";
import { leftovers, records, scenario, verifyAgainst, wrapped } from "../helpers/verify-runs.ts";
import { waitFor } from "../helpers/wait-for.ts";
import { brokers, readVersion, registryUrl } from "../helpers/writ-harness.ts";

/** The same without `config`: verify cannot see a base URL, so faults are simulated at the adapter. */
const opaque = (wrap: (inner: SystemOfRecord) => Partial<SystemOfRecord>) => (env: NodeJS.ProcessEnv) =>
  wrapped(wrap)(env).map(({ config: _hidden, ...rest }: SystemOfRecord & { config?: unknown }) => rest as SystemOfRecord);

/**
 * An HTTP server of the test's own in front of `target`: a request `intercept` answers (returning true) stays there;
 * each other is forwarded with its method mapped by `method`, and its answer given back through `answer` (default:
 * as it came). Resolves with its origin; closed when the test ends.
 */
async function forwarding(
  target: string,
  opts: { intercept?: (req: IncomingMessage, res: ServerResponse, api: Server) => boolean; method?: (m: string) => string; answer?: (from: IncomingMessage, res: ServerResponse) => void } = {},
): Promise<string> {
  const upstream = new URL(target);
  const api: Server = createServer((req, res) => {
    if (opts.intercept?.(req, res, api)) return;
    const method = opts.method?.(req.method ?? "GET") ?? req.method;
    const out = request({ host: upstream.hostname, port: upstream.port, path: req.url, method, headers: { ...req.headers, host: upstream.host } }, (from) => {
      if (opts.answer) return opts.answer(from, res);
      res.writeHead(from.statusCode ?? 502, from.headers);
      from.pipe(res);
    });
    out.on("error", () => res.destroy());
    req.pipe(out);
  });
  await new Promise<void>((resolve) => api.listen(0, "127.0.0.1", resolve));
  onTestFinished(() => new Promise<void>((resolve) => api.close(() => resolve())));
  return `http://127.0.0.1:${(api.address() as AddressInfo).port}`;
}

/** The records server as another API has it, at a URL of its own (see {@link forwarding}). */
const asApi = (server: DemoRecordsServer, opts: Parameters<typeof forwarding>[1] = {}) => forwarding(server.url, opts);

type Patch = SystemOfRecord["patch"];
/** An adapter's patch that sends the owner's PATCH and then does `then` with the outcome (`again` sends one more). */
const afterPatch =
  (then: (out: PatchOutcome, again: Patch, ...call: Parameters<Patch>) => PatchOutcome | Promise<PatchOutcome>) =>
  (inner: SystemOfRecord): Partial<SystemOfRecord> => ({
    patch: async (...call) => then(await inner.patch(...call), (...next) => inner.patch(...next), ...call),
  });

/**
 * The race alone, for refund_payment (appends commute, so no change is ever lost in the record): it must fail all
 * the same. Its problems, as one text.
 */
async function failedRefundRace(server: DemoRecordsServer, systems?: (env: NodeJS.ProcessEnv) => SystemOfRecord[]): Promise<string> {
  const report = await verifyAgainst(server, { ...(systems ? { tools: { ...demoFixture, systems } } : {}), only: ["refund_payment"], scenarios: ["race"] });
  const race = scenario(report, "refund_payment", "race")!;
  expect(race.lostUpdates).toEqual([]);
  expect(report.ok, formatReport(report)).toBe(false);
  return race.problems.join("\n");
}


/** `writ verify --tools <module>` as a child process (killed when the test ends): its stderr so far, and its exit. */
function spawnVerify(module: string, logFile: string) {
  const cli = spawn(
    process.execPath,
    ["src/cli/main.ts", "verify", "--tools", module, "--brokers", brokers().join(","), ...(registryUrl() ? ["--registry", registryUrl()!] : []), "--log-file", logFile],
    { stdio: ["ignore", "pipe", "pipe"] },
  );
  onTestFinished(() => void cli.kill("SIGKILL"));
  const seen = { stderr: "", exited: null as [number | null, string | null] | null };
  cli.stderr.on("data", (c: Buffer) => (seen.stderr += c.toString()));
  cli.on("exit", (code, sig) => (seen.exited = [code, sig]));
  return { cli, seen };
}

/**
 * A run stopped while its `waiting`th systems(env) call waits on a setup the test then releases: how runVerify
 * ended, the calls made, and each system closed (`<name>#<call>`).
 */
async function stoppedInSystems(server: DemoRecordsServer, waiting: 1 | 2) {
  const stop = new AbortController();
  let release: () => void = () => undefined;
  const closed: string[] = [];
  let calls = 0;
  const slowSystems = async (env: NodeJS.ProcessEnv) => {
    const n = ++calls;
    if (n === waiting) await new Promise<void>((resolve) => (release = resolve));
    return demoFixture.systems(env).map((s) => Object.assign(s, { close: async () => void closed.push(`${s.name}#${n}`) }));
  };
  let outcome: { stopped: unknown } | null = null;
  verifyAgainst(server, { tools: { ...demoFixture, systems: slowSystems }, only: ["tag_ticket"], signal: stop.signal, moduleTimeoutMs: 3_600_000 }).then(
    () => (outcome = { stopped: "resolved" }),
    (err: unknown) => (outcome = { stopped: err }),
  );
  await waitFor(() => calls === waiting, { timeoutMs: 30_000 });
  stop.abort(new Error("stopped by the test"));
  const { stopped } = await waitFor(() => outcome, { timeoutMs: 30_000, message: "runVerify did not stop while systems(env) was pending" });
  return { stopped, release: () => release(), closed, calls: () => calls };
}

describe("writ verify fails where a guarantee does not hold", () => {
  it("a system that ignores If-Match fails the race even for a tool whose appends commute (nothing lost in the record)", async () => {
    const server = await records();
    server.setConfig({ enforceIfMatch: false });
    expect(await failedRefundRace(server)).toMatch(/the system answered 200 to the owner's PATCH with If-Match "v\d+", sent after the outside writer's write had moved the record to "v\d+": it does not enforce If-Match/);
    // Counted at the records server: the owner's PATCH carrying the stale If-Match was let through.
    const stale = server.patchRequests().filter((r) => r.type === "payment" && r.id === "pay_verify" && r.outcome !== "precondition_failed");
    expect(stale.length).toBeGreaterThanOrEqual(2);
  }, 120_000);

  it("the same race against a system that enforces If-Match passes (the check is not a false alarm)", async () => {
    const server = await records();
    const report = await verifyAgainst(server, { only: ["refund_payment"], scenarios: ["race"] });
    expect(report.ok, formatReport(report)).toBe(true);
    expect(server.patchRequests().some((r) => r.status === 412)).toBe(true);
  }, 120_000);

  it("an adapter whose version never changes fails the race, though its appends lose nothing", async () => {
    const server = await records();
    // A system with no versions, wrapped to give one: every read and write says "static", so If-Match always matches.
    server.setConfig({ enforceIfMatch: false });
    const constant = opaque((inner) => ({
      read: async (entity, opts) => {
        const r = await inner.read(entity, opts);
        return r && { ...r, version: '"static"' };
      },
      patch: async (entity, ops, opts): Promise<PatchOutcome> => {
        const out = await inner.patch(entity, ops, opts);
        return out.kind === "applied" ? { ...out, version: '"static"' } : out;
      },
    }));
    expect(await failedRefundRace(server, constant)).toContain(`the system's version did not change on a write: the outside writer's PATCH with If-Match "static" was answered 2xx at "static"`);
  }, 120_000);

  it("an adapter that rewrites a 412 as a fresh PATCH on its own fails the race, though the appends commute", async () => {
    const server = await records();
    const rebasing = wrapped((inner) =>
      afterPatch(async (out, again, entity, ops, opts) => {
        if (out.kind !== "precondition_failed") return out;
        const now = await inner.read(entity, opts);
        return now ? again(entity, ops, { ...opts, ifMatch: now.version }) : out;
      })(inner),
    );
    expect(await failedRefundRace(server, rebasing)).toMatch(/the adapter reported applied for the owner's PATCH with If-Match "v\d+".* \(the system answered 412: did the adapter write it again on its own\?\)/);
  }, 120_000);

  it("commit-then-timeout: an adapter that answers applied for a PATCH whose answer never came fails (it guessed; reconcile did not settle it)", async () => {
    const server = await records();
    // What a careless adapter does with a timeout: assume the write went through.
    const guessing = wrapped(afterPatch((out, _again, _entity, _ops, opts) => (out.kind === "unknown" ? { kind: "applied", state: null, version: opts.ifMatch } : out)));
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: guessing }, only: ["tag_ticket"], scenarios: ["commit-then-timeout"] });

    const ctt = scenario(report, "tag_ticket", "commit-then-timeout")!;
    expect(ctt.replies[0]).toBe("applied via patch");
    expect(ctt.effects).toBe(1);
    expect(report.ok, formatReport(report)).toBe(false);
    expect(ctt.problems.join("\n")).toContain(
      "after commit-then-timeout the owner should settle the outcome by reconcile; it was answered applied via patch: the adapter reported applied for a PATCH whose answer it never got",
    );
    // The records server saw that PATCH once: nothing reconciled it, nothing replayed it.
    const key = server.history("ticket", "T-verify").find((h) => JSON.stringify(h.ops ?? "").includes(`${report.runId}-tagticke-ctt`))?.idempotencyKey;
    expect(server.patchRequests(key!)).toHaveLength(1);
  }, 120_000);

  it("a PATCH the adapter sends twice fails duplicate-submission though the change is idempotent (the record shows it once)", async () => {
    const server = await records();
    // No Idempotency-Key dedupe at the system, and an adapter that sends each PATCH once more "to be safe",
    // conditional on the version its first answer gave: both commit. A replace of /tags looks the same after either.
    server.setConfig({ honourIdempotencyKey: false });
    const twice = wrapped(afterPatch((out, again, entity, ops, opts) => (out.kind === "applied" ? again(entity, ops, { ...opts, ifMatch: out.version }) : out)));
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: twice }, only: ["tag_ticket"], scenarios: ["duplicate-submission"] });

    const dup = scenario(report, "tag_ticket", "duplicate-submission")!;
    expect(dup.effects).toBe(1);
    expect(report.ok, formatReport(report)).toBe(false);
    expect(dup.problems.join("\n")).toMatch(/agent's intent \S+ was written 2 times \(the system answered 2xx to 2 PATCH requests, none a replay of an earlier answer\)/);
    // Counted at the records server: two PATCHes with that intent key committed.
    const key = server.history("ticket", "T-verify").find((h) => JSON.stringify(h.ops ?? "").includes(`${report.runId}-tagticke-dup`))!.idempotencyKey!;
    expect(server.history("ticket", "T-verify").filter((h) => h.kind === "patch" && h.idempotencyKey === key)).toHaveLength(2);
  }, 120_000);

  it("a PATCH the adapter sends twice to a system without ETags fails duplicate-submission too (its two 2xx answers are two writes)", async () => {
    const server = await records();
    server.setConfig({ honourIdempotencyKey: false });
    // The records server as an API that answers no ETag: the version comes in the body ({ record, version }).
    const apiUrl = await asApi(server, {
      answer: async (from, res) => {
        const chunks: Buffer[] = [];
        for await (const c of from) chunks.push(c as Buffer);
        const { etag, "content-length": _length, ...headers } = from.headers;
        const body = Buffer.concat(chunks).toString();
        res.writeHead(from.statusCode ?? 502, headers);
        res.end(etag === undefined || body === "" ? body : JSON.stringify({ record: JSON.parse(body) as unknown, version: etag }));
      },
    });
    // Each PATCH sent once more "to be safe", conditional on the version its first answer gave: both commit.
    const twice = (env: NodeJS.ProcessEnv) =>
      ["billing", "helpdesk"].map((name) => {
        const inner = createHttpSystemOfRecord({
          name,
          baseUrl: env.RECORDS_URL!,
          version: { from: "body", pointer: "/version" },
          state: { pointer: "/record" },
          idempotencyKeys: true,
          idempotencyLookupPath: "/idempotency-keys/{key}",
        });
        return Object.assign(Object.create(Object.getPrototypeOf(inner) as object), inner, {
          patch: async (...[entity, ops, opts]: Parameters<Patch>) => {
            const out = await inner.patch(entity, ops, opts);
            return out.kind === "applied" ? inner.patch(entity, ops, { ...opts, ifMatch: out.version }) : out;
          },
        }) as SystemOfRecord;
      });
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: twice }, env: { RECORDS_URL: apiUrl }, only: ["tag_ticket"], scenarios: ["duplicate-submission"] });

    const dup = scenario(report, "tag_ticket", "duplicate-submission")!;
    expect(dup.effects).toBe(1);
    expect(report.ok, formatReport(report)).toBe(false);
    expect(dup.problems.join("\n")).toMatch(/agent's intent \S+ was written 2 times \(the system answered 2xx to 2 PATCH requests/);
    // Counted at the records server: two PATCHes with that intent key committed.
    const key = server.history("ticket", "T-verify").find((h) => JSON.stringify(h.ops ?? "").includes(`${report.runId}-tagticke-dup`))!.idempotencyKey!;
    expect(server.history("ticket", "T-verify").filter((h) => h.kind === "patch" && h.idempotencyKey === key)).toHaveLength(2);
  }, 120_000);

  it("a fixture whose effects() says yes/no instead of counting fails, so a duplicate cannot hide as one effect", async () => {
    const server = await records();
    // A system that applies each change twice (an adapter retrying without If-Match, say): the mark lands twice.
    const doubling = opaque(
      afterPatch((out, again, entity, ops, opts) => (out.kind === "applied" ? again(entity, ops, { ...opts, ifMatch: out.version, idempotencyKey: `${opts.idempotencyKey}-again` }) : out)),
    );
    const yesNo = {
      ...demoFixture.verify.refund_payment,
      effects: ({ current, mark }: { current: { state: unknown } | null; mark: string }) =>
        ((current?.state as { refunds: { ref?: string }[] } | undefined)?.refunds ?? []).some((r) => r.ref === mark) as unknown as number,
    };
    const report = await verifyAgainst(server, {
      tools: { ...demoFixture, systems: doubling, verify: { ...demoFixture.verify, refund_payment: yesNo } },
      only: ["refund_payment"],
      scenarios: ["duplicate-submission"],
    });

    const refunds = (await readVersion(server, "payment", "pay_verify")).state.refunds as { ref?: string }[];
    expect(refunds.filter((r) => r.ref === `${report.runId}-refundpa-dup`)).toHaveLength(2);
    expect(report.ok, formatReport(report)).toBe(false);
    expect(scenario(report, "refund_payment", "duplicate-submission")!.problems.join("\n")).toContain("the fixture's effects() gave true");
  }, 120_000);
});

describe("writ verify proves a system whose writes are POSTs (createHttpSystemOfRecord's method: POST)", () => {
  it("injects its faults on the POST and counts it on the wire, so the demo tool passes there too", async () => {
    const server = await records();
    // The system as such an API has it: writes are POST to the record's path; the demo server takes them as PATCH.
    const postUrl = await asApi(server, { method: (m) => (m === "POST" ? "PATCH" : m) });
    const posting = (env: NodeJS.ProcessEnv) =>
      ["billing", "helpdesk"].map((name) =>
        createHttpSystemOfRecord({ name, baseUrl: env.RECORDS_URL!, method: "POST", idempotencyKeys: true, idempotencyLookupPath: "/idempotency-keys/{key}" }),
      );
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: posting }, env: { RECORDS_URL: postUrl }, only: ["tag_ticket"] });
    expect(report.ok, formatReport(report)).toBe(true);
    expect(scenario(report, "tag_ticket", "commit-then-timeout")!.replies[0]).toBe("applied via reconcile");
    expect(scenario(report, "tag_ticket", "duplicate-submission")!.patchesSent).toBe(1);
  }, 120_000);
});

describe("writ verify refuses to report a pass for a run that proved nothing", () => {
  it("a module whose only tools are create tools is refused, not passed", async () => {
    const server = await records();
    await expect(verifyAgainst(server, { tools: { ...demoFixture, tools: [openTicket] } })).rejects.toMatchObject({
      code: "config_invalid",
      message: expect.stringContaining("no tool to verify: every tool of the module is a create tool"),
    });
  }, 120_000);

  it("no scenario is refused, not passed", async () => {
    const server = await records();
    await expect(verifyAgainst(server, { scenarios: [] })).rejects.toMatchObject({ code: "config_invalid", message: expect.stringContaining("no scenario to run") });
    expect(server.stats()).toMatchObject({ patchRequests: 0 });
  }, 120_000);
});

describe("writ verify says what it could not judge", () => {
  it("a race whose stale PATCH never reached the system (unavailable first) is incomplete, not failed for its retry's 200 and never a pass: If-Match was not exercised", async () => {
    const server = await records();
    // Each owner PATCH's first attempt answered as a 503 would be (nothing sent); the outside writer's go through.
    const tried = new Set<string>();
    const flaky = wrapped((inner) => ({
      patch: async (entity, ops, opts): Promise<PatchOutcome> => {
        if (opts.idempotencyKey.includes("-race-o-") || tried.has(opts.idempotencyKey)) return inner.patch(entity, ops, opts);
        tried.add(opts.idempotencyKey);
        return { kind: "unavailable", message: "503 Service Unavailable (first attempt)" };
      },
    }));
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: flaky }, only: ["refund_payment"], scenarios: ["race"] });
    const race = scenario(report, "refund_payment", "race")!;
    // The owner read afresh and sent the same Idempotency-Key with the new version: that 200 is the retry's, not the
    // stale PATCH's, so nothing failed; but nothing showed If-Match either, which a system that ignores it passes too.
    expect(race, formatReport(report)).toMatchObject({ ok: false, status: "incomplete", problems: [], notExercised: expect.stringMatching(/^If-Match was not exercised: the owner's stale PATCH ended unavailable/) });
    expect(race.outage).toBeUndefined();
    expect(report).toMatchObject({ ok: false, status: "incomplete" });
    expect(formatReport(report)).toMatch(/race: not judged: If-Match was not exercised: .*; run it again/);
  }, 120_000);
});

describe("writ verify runs each scenario once", () => {
  it("a scenario named twice runs once: run again it reused its intent keys, and its repeats passed having proved nothing", async () => {
    const server = await records();
    const report = await verifyAgainst(server, { only: ["tag_ticket"], scenarios: ["duplicate-submission", "duplicate-submission"] });
    expect(report.tools[0]!.scenarios.map((s) => s.scenario)).toEqual(["duplicate-submission"]);
    expect(report.ok).toBe(true);
  }, 120_000);
});

describe("writ verify ends, and cleans up", () => {
  it("an adapter that never answers a read fails the tool with a deadline instead of holding verify forever", async () => {
    const server = await records();
    const silent = opaque(() => ({ read: () => new Promise<never>(() => undefined) }));
    const report = await verifyAgainst(server, { tools: { ...demoFixture, systems: silent }, only: ["tag_ticket"], scenarios: ["duplicate-submission"], moduleTimeoutMs: 1000 });

    expect(report.ok).toBe(false);
    expect(report.tools[0]!.problems).toEqual(["preparing ticket:T-verify failed: helpdesk.read(ticket:T-verify) did not answer within 1000 ms"]);
  }, 60_000);

  it("a schema registry that cannot be reached stops the run as not run (exit 2), not as the tool failing a guarantee", async () => {
    const server = await records();
    await expect(verifyAgainst(server, { schemaRegistryUrl: "http://127.0.0.1:9/apis/ccompat/v7", only: ["tag_ticket"], scenarios: ["duplicate-submission"] })).rejects.toMatchObject({
      code: "registry_unavailable",
      message: expect.stringMatching(/^writ verify could not run \(tag_ticket duplicate-submission\): .*could not reach the schema registry/),
    });
    expect(server.stats()).toMatchObject({ patchRequests: 0 });
  }, 120_000);

  it("a failing tool behind a registry that refuses GET /subjects (403) is a failed report (exit 1), not 'could not run': the registry answered", async () => {
    const server = await records();
    server.setConfig({ enforceIfMatch: false });
    // The registry as a login that may register schemas but not list subjects sees it; everything else passes through.
    const real = new URL(registryUrl()!);
    let listed = 0;
    const url = `${await forwarding(real.href, {
      intercept: (req, res) => {
        if (req.method !== "GET" || !req.url?.endsWith("/subjects")) return false;
        listed++;
        res.writeHead(403, { "content-type": "application/json" }).end('{"error_code":40301,"message":"not authorized to list subjects"}');
        return true;
      },
    })}${real.pathname}`;

    const report = await verifyAgainst(server, { schemaRegistryUrl: url, only: ["refund_payment"], scenarios: ["race"] });
    expect(report.ok).toBe(false);
    expect(scenario(report, "refund_payment", "race")!.ok).toBe(false);
    // The failed race was followed by the outage probe, which asked the registry and got its 403.
    expect(listed).toBeGreaterThan(0);
  }, 120_000);

  it("a system of record the fault proxy cannot reach during a scenario: incomplete, naming the system, not blamed on the tool", async () => {
    const server = await records();
    // The staging API goes down at the first write: that write's connection dropped unanswered, and nothing connects
    // after it (refused), neither the owner's calls through the fault proxy nor verify's own.
    const apiUrl = await asApi(server, {
      intercept: (req, _res, api) => {
        if (req.method !== "PATCH") return false;
        api.close();
        api.closeAllConnections();
        return true;
      },
    });
    const report = await verifyAgainst(server, { env: { RECORDS_URL: apiUrl }, only: ["tag_ticket"], scenarios: ["duplicate-submission"], submitTimeoutMs: 5000 });

    const dup = scenario(report, "tag_ticket", "duplicate-submission")!;
    // Before, a failure of the tool (exit 1) for a write its system never took. A connection dropped after it was
    // made is no sign (the request may be why): the refused connects after it are.
    expect(dup, formatReport(report)).toMatchObject({
      status: "incomplete",
      harm: false,
      outage: expect.stringMatching(/^the system of record [^(]*helpdesk[^(]* \(http:\/\/127\.0\.0\.1:\d+\) \(seen by the fault proxy: [A-Z]+ \/[^:]*: connect ECONNREFUSED/),
    });
    expect(report).toMatchObject({ ok: false, status: "incomplete" });
    // Counted at the records server: no write reached it.
    expect(server.patchRequests()).toEqual([]);
  }, 240_000);

  it("a hostile verify export (a fixture that is null) fails that tool and verifies the others", async () => {
    const server = await records();
    const report = await verifyAgainst(server, {
      tools: { ...demoFixture, verify: { ...demoFixture.verify, tag_ticket: null as never } },
      only: ["tag_ticket", "note_account"],
      scenarios: ["duplicate-submission"],
    });
    expect(report.tools.find((t) => t.tool === "tag_ticket")!.problems).toEqual(["the verify fixture of tag_ticket is null, not an object (see src/verify/fixture.ts)"]);
    expect(report.tools.find((t) => t.tool === "note_account")!.ok, formatReport(report)).toBe(true);
    expect(report.ok).toBe(false);
  }, 120_000);

  it("leaves none of its consumer groups or topics on the cluster", async () => {
    const server = await records();
    const report = await verifyAgainst(server, { only: ["tag_ticket"], scenarios: ["duplicate-submission"] });
    expect(report.ok, formatReport(report)).toBe(true);
    expect(await leftovers(report.runId)).toEqual({ groups: [], topics: [] });
  }, 120_000);

  it.each([
    ["SIGINT", 130, "text"],
    ["SIGTERM", 143, "--json"],
  ] as const)("%s in the middle of a run: the built CLI prints the report of what ran, the rest not run (incomplete), deletes the run's topics and groups, and exits %i (%s)", async (signal, exitCode, output) => {
    await ensureBuilt();
    const server = await records();
    const json = output === "--json";
    // The built CLI, on a Node that strips the types of the .ts tools module.
    const cli = spawn(
      process.execPath,
      [BUILT_CLI, "verify", "--tools", "examples/verify-fixture.ts", "--tool", "tag_ticket", "--brokers", brokers().join(","), ...(registryUrl() ? ["--registry", registryUrl()!] : []), ...(json ? ["--json"] : []), "--log-file", `.writ/verify-${signal}-test.log`],
      { cwd: ROOT, env: { ...process.env, RECORDS_URL: server.url }, stdio: ["ignore", "pipe", "pipe"] },
    );
    onTestFinished(() => void cli.kill("SIGKILL"));
    let [stdout, stderr] = ["", ""];
    cli.stdout.on("data", (c: Buffer) => (stdout += c.toString()));
    cli.stderr.on("data", (c: Buffer) => (stderr += c.toString()));
    const exited = once(cli, "close");
    // Stopped once a scenario is done and the next under way: without --json its progress line says so; with it
    // (no progress), the records server has the next scenario's PATCH.
    const tagged = (mark: string) => server.history("ticket", "T-verify").some((h) => JSON.stringify(h.ops ?? []).includes(mark));
    await waitFor(() => (json ? tagged("-tagticke-ctt") : stderr.includes("tag_ticket duplicate-submission: pass")), { timeoutMs: 90_000, message: () => stderr });
    cli.kill(signal);
    const [code, killedBy] = (await exited) as [number | null, string | null];

    expect({ code, killedBy }, stderr).toEqual({ code: exitCode, killedBy: null });
    expect(stderr).toContain(`writ verify: stopped by ${signal}`);
    // Before, nothing on stdout: the run's report was lost with the stop.
    const report = JSON.parse(stdout.trim().split("\n").at(-1)!) as VerifyReport;
    const all = ["duplicate-submission", "commit-then-timeout", "commit-then-drop", "race"];
    const tool = report.tools[0]!;
    const ran = tool.scenarios.map((s) => s.scenario);
    expect(report).toMatchObject({ ok: false, status: "incomplete", summary: { pass: 0, fail: 0, incomplete: 1, notRun: 0 } });
    expect(tool).toMatchObject({ tool: "tag_ticket", ok: false, status: "incomplete", scenarios: [{ scenario: "duplicate-submission", ok: true }] });
    // What ran, then what did not: the scenario under way and those after it.
    expect([...ran, ...tool.notRun!]).toEqual(all);
    expect(tool.notRun).toContain("race");
    expect(report.interrupted).toEqual({ reason: `stopped by ${signal}`, notRun: tool.notRun!.map((s) => `tag_ticket ${s}`), stopped: true });
    // Counted at the records server: the scenario reported done left its mark once.
    const tags = (await readVersion(server, "ticket", "T-verify")).state.tags as string[];
    expect(tags.filter((t) => t === `${report.runId}-tagticke-dup`)).toHaveLength(tool.scenarios[0]!.effects);
    expect(tool.scenarios[0]!.effects).toBe(1);
    if (json) expect(stdout.trim().split("\n")).toHaveLength(1);
    else {
      expect(stdout).toContain(`writ verify ${report.runId}: INCOMPLETE`);
      expect(stdout).toContain(`stopped early: stopped by ${signal}`);
      expect(stdout).toMatch(/tag_ticket\s+duplicate-submission\s+pass/);
      expect(stdout).toMatch(/tag_ticket\s+race\s+not run/);
    }
    expect(await leftovers(report.runId)).toEqual({ groups: [], topics: [] });
  }, 150_000);
  it.each([
    ["SIGINT", 130],
    ["SIGTERM", 143],
  ] as const)("%s while the tools module is still loading: the CLI stops at once with exit %i", async (signal, exitCode) => {
    // A module whose import waits on a slow setup (a connection, a secret fetch) that outlasts any test.
    const dir = mkdtempSync(join(tmpdir(), "writ-verify-slow-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const slow = join(dir, "slow-tools.mjs");
    writeFileSync(slow, 'process.stderr.write("slow module: loading\\n");\nawait new Promise((resolve) => setTimeout(resolve, 3_600_000));\nexport const tools = [];\n');
    const { cli, seen } = spawnVerify(slow, ".writ/verify-slow-load-test.log");
    await waitFor(() => seen.stderr.includes("slow module: loading"), { timeoutMs: 60_000, message: () => seen.stderr });
    cli.kill(signal);

    const [code, killedBy] = await waitFor(() => seen.exited, { timeoutMs: 30_000, message: () => `still running after ${signal}: ${seen.stderr}` });
    expect({ code, killedBy }, seen.stderr).toEqual({ code: exitCode, killedBy: null });
    expect(seen.stderr).toContain(`writ verify: stopped by ${signal}`);
  }, 120_000);

  it("stopped while systems(env) is still making the systems: runVerify rejects with the stop, and closes what was made once made", async () => {
    const server = await records();
    // The second call (the systems the owner gets, through the proxy) waits on a setup the test releases.
    const { stopped, release, closed } = await stoppedInSystems(server, 2);
    expect(stopped).toMatchObject({ message: "stopped by the test" });
    release();
    // Both lists of systems are closed once the second is made: nothing of the run is left open.
    await waitFor(() => closed.length === 4, { timeoutMs: 30_000, message: () => JSON.stringify(closed) });
    expect(closed.sort()).toEqual(["billing#1", "billing#2", "helpdesk#1", "helpdesk#2"]);
    expect(server.stats()).toMatchObject({ patchRequests: 0 });
  }, 120_000);

  it("stopped during the first systems(env) call: no proxy is started and systems(env) is not called again; what it made is closed", async () => {
    const server = await records();
    const { stopped, release, closed, calls } = await stoppedInSystems(server, 1);
    expect(stopped).toMatchObject({ message: "stopped by the test" });
    release();
    // Closed once made; before, the proxies started and systems(env) was called a second time first.
    await waitFor(() => closed.length >= 2, { timeoutMs: 30_000, message: () => JSON.stringify(closed) });
    expect(calls()).toBe(1);
    expect(closed.sort()).toEqual(["billing#1", "helpdesk#1"]);
  }, 120_000);

  /** A tools module whose systems(env) waits for a setup the test releases (a file), then makes one system whose close() is recorded. */
  function slowSystemsModule(): { released: string; closedFile: string; module: string } {
    const dir = mkdtempSync(join(tmpdir(), "writ-verify-slow-systems-"));
    onTestFinished(() => rmSync(dir, { recursive: true, force: true }));
    const [released, closedFile, module] = [join(dir, "released"), join(dir, "closed"), join(dir, "slow-systems.mjs")];
    writeFileSync(
      module,
      `import { appendFileSync, existsSync } from "node:fs";
export const tools = [{ name: "tag", system: "slow", recordType: "ticket" }];
export const verify = {};
export async function systems() {
  process.stderr.write("slow systems: making\\n");
  while (!existsSync(${JSON.stringify(released)})) await new Promise((resolve) => setTimeout(resolve, 20));
  return [{ name: "slow", read: async () => null, patch: async () => ({ status: "unknown" }), close: async () => appendFileSync(${JSON.stringify(closedFile)}, "closed\\n") }];
}
`,
    );
    return { released, closedFile, module };
  }

  it("the CLI stopped while systems(env) runs closes the systems it makes before it exits 130 (a second signal would quit at once)", async () => {
    const { released, closedFile, module } = slowSystemsModule();
    const { cli, seen } = spawnVerify(module, ".writ/verify-slow-systems-test.log");
    await waitFor(() => seen.stderr.includes("slow systems: making"), { timeoutMs: 60_000, message: () => seen.stderr });
    cli.kill("SIGINT");
    // Before, the process ended here, and the systems made after were never closed.
    await waitFor(() => seen.stderr.includes("closing the systems systems(env) is still making"), { timeoutMs: 30_000, message: () => seen.stderr });
    writeFileSync(released, "");

    const [code, killedBy] = await waitFor(() => seen.exited, { timeoutMs: 30_000, message: () => `still running: ${seen.stderr}` });
    expect({ code, killedBy }, seen.stderr).toEqual({ code: 130, killedBy: null });
    expect(readFileSync(closedFile, "utf8")).toBe("closed\n");
  }, 120_000);

  it("a second signal of the other kind (SIGINT, then SIGTERM) ends the CLI at once while it waits to close the systems", async () => {
    const { module } = slowSystemsModule();
    const { cli, seen } = spawnVerify(module, ".writ/verify-second-signal-test.log");
    await waitFor(() => seen.stderr.includes("slow systems: making"), { timeoutMs: 60_000, message: () => seen.stderr });
    cli.kill("SIGINT");
    await waitFor(() => seen.stderr.includes("closing the systems systems(env) is still making"), { timeoutMs: 30_000, message: () => seen.stderr });
    // Before, SIGTERM only aborted the run again, and the CLI went on waiting for systems(env) (never released here).
    // Sent past the window in which it would be the first request again.
    await sleep(SAME_REQUEST_MS + 50);
    cli.kill("SIGTERM");
    const [code, killedBy] = await waitFor(() => seen.exited, { timeoutMs: 20_000, message: () => `still running after a second signal: ${seen.stderr}` });
    expect({ code, killedBy }, seen.stderr).toEqual({ code: null, killedBy: "SIGTERM" });
  }, 120_000);
});
