import { randomBytes } from "node:crypto";
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { Kafka, logLevel } from "kafkajs";
import { importWithin, withDeadline } from "../deadline.ts";
import { createWritClient, type SubmitResult, type WritClient } from "../../producers/writ-client.ts";
import { WritError } from "../errors.ts";
import { createLogger, type Logger } from "../logger.ts";
import { ledgerReaderGroups, startRouter, type Router } from "../owner/router.ts";
import { kafkaConnection, registryTransport, type KafkaSecurity, type RegistryAuth, type RegistryTls } from "../security/transport.ts";
import { entityKey, type EntityRef } from "../schemas/common.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import type { WriteToolDeclaration } from "../tools.ts";
import { startFaultProxy, type FaultProxy } from "./fault-proxy.ts";
import type { ToolVerifyFixture, VerifyModule } from "./fixture.ts";
import { instrumentSystem, type InstrumentedSystem } from "./instrumented-system.ts";
import { attributeFailure, OutageWatch } from "./outages.ts";
import { SCENARIOS, type ScenarioName, type ScenarioReport, type ToolReport, type VerifyLeftovers, type VerifyReport } from "./report.ts";
import { commitThenFault, duplicateSubmission, moduleCall, race, type ScenarioAgent, type ScenarioContext } from "./scenarios.ts";

export type { VerifyReport, ToolReport, ScenarioReport, LostUpdate, ScenarioName, VerifyLeftovers } from "./report.ts";
export { formatReport, leftoversLine, SCENARIOS } from "./report.ts";

export interface VerifyOptions {
  /** A tools module path (resolved from the working directory) or its exports: `tools`, `systems(env)`, `verify`. */
  tools: string | VerifyModule;
  /** Kafka brokers, `host:port`; verify creates its own topics there (prefix `writ.verify.<runId>.`). */
  brokers: string | string[];
  /** Confluent-API schema registry; unset means plain JSON. */
  schemaRegistryUrl?: string;
  /** The registry's basic auth and TLS. */
  schemaRegistryAuth?: RegistryAuth;
  schemaRegistryTls?: RegistryTls;
  /** SASL and TLS to the brokers (the owner, the agents and the topic cleanup use them). */
  kafka?: KafkaSecurity;
  /**
   * Replication factor of the topics verify creates (its own contract topics and reply topics). Default 1;
   * `writ verify` takes `WRIT_REPLICATION_FACTOR`. A cluster whose `min.insync.replicas` is 2 needs at least 2.
   */
  replicationFactor?: number;
  /** Given to `systems(env)`. Default `process.env`. HTTP systems must take their base URL from it (see `writ verify` in the README). */
  env?: NodeJS.ProcessEnv;
  /** Only these tools (by name). Default: every tool of the module. */
  only?: readonly string[];
  /** Only these scenarios. Default: all of {@link SCENARIOS}. */
  scenarios?: readonly ScenarioName[];
  /** The owner's system-of-record deadline. ms. Default 2000. Faults do not depend on it: the proxy holds an answer until the owner gives up. */
  sorTimeoutMs?: number;
  /** Deadline of each agent submit. ms. Default 60 000. One that ends without a reply is followed at once by the outage check. */
  submitTimeoutMs?: number;
  /**
   * Hard deadline of each call verify makes into the module: its import (a module given by path), `systems(env)`,
   * a fixture's `prepare` and `effects`, the adapters' own `read`/`patch`/`close` (past their `timeoutMs`, for one
   * that ignores it). ms. Default 30 000, or twice `sorTimeoutMs` plus 5 000 where that is longer (an adapter
   * within its own deadline is not cut off). An import past it is left pending (it cannot be cancelled) and the
   * run rejects `config_invalid`: a process that must end should exit.
   */
  moduleTimeoutMs?: number;
  /** Leave verify's topics on the cluster. Default false: they are deleted at the end. */
  keepTopics?: boolean;
  /** The owner's and clients' logger. Default: pino at `warn` on stderr. */
  logger?: Logger;
  /** One line per step, for a progress display. */
  onProgress?: (line: string) => void;
  /**
   * Stops the run early (Ctrl-C): the scenario under way is abandoned, the owner, agents and proxies stop, the
   * topics and groups are deleted as at the end of a run, and runVerify resolves with the report of what ran:
   * `interrupted` gives the signal's reason and names what did not run (status `incomplete`, or `fail` where a
   * scenario had failed). Stopped before the owner starts (the module still loading, `systems(env)` still
   * running), it rejects with the signal's reason, and the systems `systems(env)` makes are closed once made.
   */
  signal?: AbortSignal;
  /**
   * Called when the run is stopped while `systems(env)` is still running, with the closing of the systems it
   * makes once made (runVerify has already rejected): a caller that ends the process next awaits it first.
   */
  onStopClosing?: (closing: Promise<void>) => void;
  /**
   * Called, before runVerify settles, when the run's topics and groups could not be deleted at its end (Kafka lost
   * and still gone), however the run ended: what is left and the command that deletes it later. A report carries
   * it too (`leftovers`).
   */
  onLeftovers?: (left: VerifyLeftovers) => void;
  /** Called with the run's id once it has one, before anything of the run is made on the cluster (its names carry it). */
  onRunId?: (runId: string) => void;
}

/** Rejects with the signal's reason once it aborts; never settles without one. */
function abortion(signal: AbortSignal | undefined): Promise<never> {
  const stopped = new Promise<never>((_, reject) => {
    if (signal?.aborted) reject(signal.reason);
    else signal?.addEventListener("abort", () => reject(signal.reason), { once: true });
  });
  stopped.catch(() => undefined); // raced below; unawaited when the run ends first
  return stopped;
}

/** A system created by `createHttpSystemOfRecord` (it exposes its base URL), else null. */
function httpBaseUrl(system: SystemOfRecord): string | null {
  const config = (system as { config?: { baseUrl?: unknown } }).config;
  return typeof config?.baseUrl === "string" ? config.baseUrl : null;
}

/** The HTTP method of an HTTP system's writes (`createHttpSystemOfRecord`'s `method`): where the proxy injects and counts. */
function httpWriteMethod(system: SystemOfRecord): string {
  const method = (system as { config?: { method?: unknown } }).config?.method;
  return typeof method === "string" ? method.toUpperCase() : "PATCH";
}

function configError(message: string, field: string): WritError {
  return new WritError("config_invalid", `writ verify: ${message}`, { retriable: false, context: { field } });
}

/**
 * Imports the tools module at `path` within `ms`. An ESM import cannot be cancelled: one whose top-level code never
 * settles (an await on a connection that never comes) is left pending, and the run is refused, naming the
 * deadline; the CLI then ends the process, which the pending import would otherwise hold.
 */
function importModule(path: string, ms: number): Promise<unknown> {
  return importWithin(pathToFileURL(resolve(path)).href, ms, (why) =>
    configError(
      `the tools module ${path} did not finish loading within ${ms} ms (--module-timeout-ms, moduleTimeoutMs in runVerify; give it more where loading takes longer): ${why}`,
      "moduleTimeoutMs",
    ),
  );
}

async function loadModule(tools: string | VerifyModule, moduleTimeoutMs: number): Promise<VerifyModule> {
  const where = typeof tools === "string" ? tools : "the tools module";
  const mod = (typeof tools === "string" ? await importModule(tools, moduleTimeoutMs) : tools) as Partial<VerifyModule>;
  if (!Array.isArray(mod.tools) || typeof mod.systems !== "function") throw configError(`${where} must export tools[] and systems(env)`, "tools");
  const notTool = mod.tools.findIndex((t: unknown) => typeof t !== "object" || t === null || typeof (t as { name?: unknown }).name !== "string");
  if (notTool >= 0) throw configError(`${where}: tools[${notTool}] is not a tool declaration (an object with a name)`, "tools");
  if (typeof mod.verify !== "object" || mod.verify === null) {
    throw configError(`${where} must export \`verify\`: a verify fixture per tool, by tool name (see src/verify/fixture.ts)`, "verify");
  }
  return mod as VerifyModule;
}

/**
 * Every environment value that is a URL on `origin` now points at `proxyUrl`,
 * path kept: `systems(env)` called with the result builds the same systems,
 * credentials included, talking through the proxy.
 */
function redirectEnv(env: NodeJS.ProcessEnv, proxies: ReadonlyMap<string, FaultProxy>): NodeJS.ProcessEnv {
  const out: NodeJS.ProcessEnv = { ...env };
  for (const [name, value] of Object.entries(env)) {
    if (value === undefined || !/^https?:\/\//i.test(value)) continue;
    let url: URL;
    try {
      url = new URL(value);
    } catch {
      continue;
    }
    const proxy = proxies.get(url.origin);
    const path = url.pathname === "/" && !value.endsWith("/") ? "" : url.pathname;
    if (proxy) out[name] = proxy.url + path + url.search + url.hash;
  }
  return out;
}

export interface Routed {
  direct: Map<string, SystemOfRecord>;
  owned: Map<string, InstrumentedSystem>;
  proxies: Map<string, FaultProxy>;
  proxyOf: Map<string, FaultProxy>;
  /** HTTP systems' write method, by system name. */
  writeMethod: Map<string, string>;
  all: SystemOfRecord[];
}

/**
 * Builds the systems twice: directly (the truth), and through one fault proxy per upstream origin (what the owner
 * uses). A proxy that cannot reach its upstream tells `outages`.
 */
async function routeSystems(mod: VerifyModule, env: NodeJS.ProcessEnv, moduleTimeoutMs: number, signal: AbortSignal | undefined, outages: OutageWatch): Promise<Routed> {
  const systemsOf = async (e: NodeJS.ProcessEnv): Promise<SystemOfRecord[]> => {
    const list: unknown = await moduleCall("the module's systems(env)", moduleTimeoutMs, () => mod.systems(e));
    if (!Array.isArray(list) || list.some((x) => typeof x !== "object" || x === null || typeof (x as { name?: unknown }).name !== "string")) {
      throw configError("systems(env) must return an array of systems of record (objects with a name)", "systems");
    }
    return list as SystemOfRecord[];
  };
  const directList = await systemsOf(env);
  const direct = new Map(directList.map((s) => [s.name, s]));
  const proxies = new Map<string, FaultProxy>();
  const routed: Routed = { direct, owned: new Map(), proxies, proxyOf: new Map(), writeMethod: new Map(), all: [...directList] };
  try {
    // Stopped while the first systems were made: no proxy is started and systems(env) is not called again.
    signal?.throwIfAborted();
    for (const s of directList) {
      const base = httpBaseUrl(s);
      if (base === null) continue;
      const origin = new URL(base).origin;
      if (proxies.has(origin)) continue;
      const names = directList.filter((d) => httpBaseUrl(d)?.startsWith(origin)).map((d) => d.name).join(", ");
      const onUnreachable = (req: { method: string; path: string }, message: string) =>
        outages.note({ what: `the system of record ${names} (${origin})`, source: "system", seenBy: "the fault proxy", message: `${req.method} ${req.path}: ${message}` });
      proxies.set(origin, await startFaultProxy({ upstream: origin, onUnreachable }));
    }
    signal?.throwIfAborted();
    const ownedList = proxies.size > 0 ? await systemsOf(redirectEnv(env, proxies)) : directList;
    if (ownedList !== directList) routed.all.push(...ownedList);
    for (const s of ownedList) {
      const before = direct.get(s.name);
      const beforeBase = before ? httpBaseUrl(before) : null;
      if (beforeBase !== null) {
        const proxy = proxies.get(new URL(beforeBase).origin)!;
        const now = httpBaseUrl(s);
        if (now === null || !now.startsWith(proxy.url)) {
          throw configError(
            `system "${s.name}" still points at ${now ?? "(unknown)"}: verify redirects HTTP systems by rewriting the environment ` +
              `given to systems(env), so the base URL must come from an environment variable (e.g. RECORDS_URL=${beforeBase})`,
            "systems",
          );
        }
        routed.proxyOf.set(s.name, proxy);
        routed.writeMethod.set(s.name, httpWriteMethod(s));
      }
      routed.owned.set(s.name, instrumentSystem(s));
    }
    return routed;
  } catch (err) {
    await closeRouted(routed, moduleTimeoutMs);
    throw err;
  }
}

async function closeRouted(r: Routed, moduleTimeoutMs: number): Promise<void> {
  await Promise.all([...r.proxies.values()].map((p) => p.close().catch(() => undefined)));
  await Promise.all(r.all.map((s) => (typeof s.close === "function" ? moduleCall(`${s.name}.close()`, moduleTimeoutMs, () => s.close!()).catch(() => undefined) : undefined)));
}

/** A tool none of whose scenarios ran, for `problems` (there is always one). */
function emptyToolReport(tool: string, system: string, entity: string, problems: string[]): ToolReport {
  return { tool, system, entity, ok: false, status: "fail", effects: 0, conflicts: 0, lostUpdates: [], scenarios: [], problems };
}

/** The owner's system-of-record deadline in a verify run, ms. */
export const DEFAULT_VERIFY_SOR_TIMEOUT_MS = 2000;

/** A call into the module may take what an adapter within its own deadline takes: a read and a write, and a margin. */
export function defaultModuleTimeoutMs(sorTimeoutMs: number): number {
  return Math.max(30_000, 2 * sorTimeoutMs + 5_000);
}

/**
 * Proves a module's write tools against a staging system of record: starts
 * its own owner (unique topics) with the tools' systems behind a fault
 * proxy, and runs per tool `duplicate-submission`, `commit-then-timeout`,
 * `commit-then-drop` and `race`. Counts come from the system of record.
 * Throws only when it cannot run (bad module, Kafka or the registry
 * unreachable, also when lost mid-run, tools not admitted); a tool that
 * misbehaves is a failed report. Lost mid-run after a scenario had already
 * failed, or stopped by `signal` once the owner is starting, it returns the
 * report of what ran, with `interrupted` naming what did not run and the tool
 * cut short `incomplete`. Topics and groups its cleanup
 * could not delete are given to `onLeftovers` (and the report's `leftovers`).
 *
 * @example
 * const report = await runVerify({ tools: "./my-tools.ts", brokers: "kafka:9092", env: { ...process.env, CRM_URL: staging } });
 * if (!report.ok) console.log(formatReport(report));
 */
export async function runVerify(opts: VerifyOptions): Promise<VerifyReport> {
  const started = Date.now();
  const startedAt = new Date(started).toISOString();
  const progress = opts.onProgress ?? (() => undefined);
  const logger = opts.logger ?? createLogger({ level: "warn", name: "writ-verify" });
  const brokers = (Array.isArray(opts.brokers) ? [...opts.brokers] : opts.brokers.split(",")).map((b) => b.trim()).filter(Boolean);
  const sorTimeoutMs = opts.sorTimeoutMs ?? DEFAULT_VERIFY_SOR_TIMEOUT_MS;
  const submitTimeoutMs = opts.submitTimeoutMs ?? 60_000;
  const moduleTimeoutMs = opts.moduleTimeoutMs ?? defaultModuleTimeoutMs(sorTimeoutMs);
  // Each once: a scenario run again reuses its marks and intent keys, and its repeats would pass having proved nothing.
  const scenarios = [...new Set(opts.scenarios ?? SCENARIOS)];
  const badScenario = scenarios.find((s) => !SCENARIOS.includes(s));
  if (badScenario !== undefined) throw configError(`unknown scenario ${JSON.stringify(badScenario)}; one of ${SCENARIOS.join(", ")}`, "scenarios");
  // A run that proves nothing must not read as a pass.
  if (scenarios.length === 0) throw configError(`no scenario to run; give one or more of ${SCENARIOS.join(", ")}`, "scenarios");
  const env = opts.env ?? process.env;
  const connection = {
    ...(opts.kafka === undefined ? {} : { kafka: opts.kafka }),
    ...(opts.schemaRegistryUrl === undefined ? {} : { schemaRegistryUrl: opts.schemaRegistryUrl }),
    ...(opts.schemaRegistryAuth === undefined ? {} : { schemaRegistryAuth: opts.schemaRegistryAuth }),
    ...(opts.schemaRegistryTls === undefined ? {} : { schemaRegistryTls: opts.schemaRegistryTls }),
  };
  const topicSettings = opts.replicationFactor === undefined ? {} : { replicationFactor: opts.replicationFactor };
  const runId = `wv-${randomBytes(3).toString("hex")}`;
  opts.onRunId?.(runId);
  const stopped = abortion(opts.signal);
  // Awaited until the signal, if any, aborts; what it starts is still stopped in `finally` (kept below).
  const until = <T>(work: Promise<T>): Promise<T> => (opts.signal ? Promise.race([work, stopped]) : work);
  // The module's import and its systems(env) may take long (a slow setup, a connection): a stop is not left waiting for them.
  const mod = await until(loadModule(opts.tools, moduleTimeoutMs));
  const unknown = (opts.only ?? []).filter((n) => !mod.tools.some((t) => t.name === n));
  if (unknown.length > 0) throw configError(`no tool named ${unknown.join(", ")} in the module`, "only");
  // The scenarios are those of a change to an existing record; a create tool is not proved here (yet): left out,
  // and reported as not verified when asked for by name.
  const named = mod.tools.filter((t) => opts.only === undefined || opts.only.includes(t.name));
  const selected = named.filter((t) => t.create === undefined);
  const creates = named.filter((t) => t.create !== undefined);
  if (opts.only === undefined && creates.length > 0) progress(`${creates.map((t) => t.name).join(", ")}: create tools, not verified (writ verify proves changes to existing records)`);
  if (named.length === 0 || (opts.only === undefined && selected.length === 0)) {
    throw configError(`no tool to verify: ${named.length === 0 ? "the module declares no tools" : "every tool of the module is a create tool, which writ verify does not prove"}`, "tools");
  }

  // Signs of Kafka, the registry or a system failing, as they happen: a scenario that failed during one is not
  // blamed on the tool (outageNow, asked after it failed, misses an outage over by then).
  const outages = new OutageWatch();
  const routing = routeSystems(mod, env, moduleTimeoutMs, opts.signal, outages);
  let routed: Routed;
  try {
    routed = await until(routing);
  } catch (err) {
    // Stopped while the systems were being made: those made are closed once made (nothing else exists yet; a
    // routing that fails closes its own).
    if (opts.signal?.aborted) {
      const closing = routing.then((r) => closeRouted(r, moduleTimeoutMs), () => undefined);
      opts.onStopClosing?.(closing);
    }
    throw err;
  }
  const { topics, replyTopic, ownerGroup, instanceId, agentId } = runNames(runId);
  const tools: ToolReport[] = [];
  let interrupted: VerifyReport["interrupted"];
  if (opts.only !== undefined) {
    for (const tool of creates) tools.push(emptyToolReport(tool.name, tool.system, "-", ["a create tool: writ verify proves changes to existing records, not creates"]));
  }
  let starting: Promise<Router> | null = null;
  let making: Promise<WritClient>[] = [];
  // The owner's consumer stopped for good (Kafka failed it, or another group of owners runs on the topic): every
  // scenario after that fails for writ's reasons.
  let ownerStopped: Error | null = null;
  // The report, once made (its cleanup may add what it left), and whether the run is over (its clients closing).
  let result: VerifyReport | undefined;
  let over = false;
  const outage = () => outageNow({ brokers, security: opts.kafka, topics: [topics.intents, topics.ledger], registry: connection, ownerStopped });
  try {
    try {
      progress(`${runId}: starting an owner on ${brokers.join(",")} (topics writ.verify.${runId}.*)`);
      starting = startRouter({
        config: {
          brokers,
          ...connection,
          groupId: ownerGroup,
          clientId: "writ-verify",
          instanceId,
          intentPartitions: 1,
          ...topicSettings,
          topics,
          sorTimeoutMs,
          sessionTimeoutMs: 10_000,
        },
        tools: selected,
        systems: [...routed.owned.values()],
        logger,
        onFatal: (err) => void (ownerStopped ??= err),
      }, {
        // Idle fetches of 100 ms, not 500: the owner lives for this run only; its first intents are read sooner
        // after its partition opens, and its stop waits less (RouterInternals.fetchMaxWaitMs).
        fetchMaxWaitMs: 100,
        kafkaLogTap: outages.kafkaTap("the owner"),
        onRegistryUnreachable: (err) => outages.note({ what: "the schema registry", source: "registry", seenBy: "the owner", message: causes(err) }),
      });
      await until(starting);
      // Idle fetches of 100 ms: each client's close() waits for the one in flight, and a run's three clients live
      // only for its seconds (a reply still ends a fetch at once).
      const client = (agent: string) =>
        createWritClient({
          brokers,
          agentId: agentId(agent),
          replyTopic: replyTopic(agent),
          intentsTopic: topics.intents,
          ...connection,
          ...topicSettings,
          replyFetchMaxWaitMs: 100,
          logger,
          kafkaLogTap: outages.kafkaTap(agent),
        });
      making = [client("agent"), client("agent-a"), client("agent-b")];
      const [agent, agentA, agentB] = await until(Promise.all(making));

      for (const tool of selected) {
        // Own keys only: a tool named `constructor` or `toString` has no fixture, whatever Object.prototype holds.
        const fixture: unknown = Object.hasOwn(mod.verify, tool.name) ? mod.verify[tool.name] : undefined;
        const watch = (c: WritClient) => watched(c, outage, () => over);
        const agents = { agent: watch(agent!), agentA: watch(agentA!), agentB: watch(agentB!) };
        const run = { runId, routed, env, sorTimeoutMs, submitTimeoutMs, moduleTimeoutMs, scenarios, progress, signal: opts.signal, until, outage, outages, agents };
        try {
          tools.push(await verifyTool(tool, fixture, run));
        } catch (err) {
          if (!(err instanceof ToolInterrupted)) throw err;
          if (err.report.scenarios.length > 0) tools.push(err.report);
          // Lost with nothing failed yet: the run proved nothing, and could not run (exit 2). A failure already
          // proven is reported (exit 1), not hidden behind the outage that came after it; a stop reports what ran.
          // Either way what did not run is named.
          if (err.outage !== null && !tools.some((t) => t.status === "fail")) throw err.outage;
          interrupted = interruptedIn(err, selected.slice(selected.indexOf(tool) + 1).map((t) => t.name));
          progress(`stopped: ${err.message}; not run: ${interrupted.notRun.join(", ")}`);
          break;
        }
      }
    } catch (err) {
      // Stopped while the owner or the agents were starting: no scenario ran, and the report says so.
      if (!opts.signal?.aborted) throw err;
      interrupted = { reason: causes(opts.signal.reason), notRun: selected.filter((t) => !tools.some((r) => r.tool === t.name)).map((t) => t.name), stopped: true };
    }
    const ran = new Set(tools.map((t) => t.tool));
    const count = (status: ToolReport["status"]) => tools.filter((t) => t.status === status).length;
    const status = runStatus(tools, interrupted);
    result = {
      ok: status === "pass",
      status,
      ...(interrupted === undefined ? {} : { interrupted }),
      summary: { pass: count("pass"), fail: count("fail"), incomplete: count("incomplete"), notRun: selected.filter((t) => !ran.has(t.name)).length },
      runId,
      startedAt,
      durationMs: Date.now() - started,
      brokers,
      systems: [...routed.owned.keys()].map((name) => {
        const proxy = routed.proxyOf.get(name);
        return { name, faultInjection: proxy ? ("proxy" as const) : ("adapter" as const), upstream: proxy?.upstream ?? null };
      }),
      tools,
    };
    return result;
  } finally {
    // Submits that end without a reply now are the clients closing, not an outage to look for.
    over = true;
    // Each client and the owner that started, also those still starting when the run failed or was stopped; side
    // by side, as each waits for its consumers' fetches in flight.
    await Promise.all([...making.map((m) => m.then((c) => c.close()).catch(() => undefined)), starting?.then((r) => r.stop()).catch(() => undefined)]);
    await closeRouted(routed, moduleTimeoutMs);
    // The topics, and the consumer groups that outlive their consumers (the owner's and its ledger readers'; an
    // agent's, where its own delete did not get through). Once the owner was started, topics may exist.
    if (!opts.keepTopics && starting !== null) {
      let left: Omit<VerifyLeftovers, "runId" | "cleanup"> | null;
      try {
        // force: the run has ended, so members left in its groups are its own consumers that could not leave.
        const { busy } = await cleanupVerifyRun({ runId, brokers, force: true, ...(opts.kafka === undefined ? {} : { kafka: opts.kafka }) });
        left = busy.length === 0 ? null : { reason: "consumers that could not leave (Kafka was lost) hold these groups until the broker drops them, after their session timeout (30 s at most)", topics: [], groups: busy, groupPrefixes: [] };
      } catch (err) {
        // Kafka did not answer (lost mid-run and still gone): the run says what it may have left, and how to delete it.
        left = {
          reason: causes(err),
          topics: [...Object.values(topics), ...AGENTS.map(replyTopic)],
          groups: [ownerGroup, ...Object.values(ledgerReaderGroups({ groupId: ownerGroup, instanceId }))],
          // The agents' reply groups end in a random id: named by what they start with.
          groupPrefixes: [`writ.client.${agentId("")}`],
        };
      }
      if (left !== null) {
        const named: VerifyLeftovers = { runId, ...left, cleanup: `writ verify --cleanup ${runId} --brokers ${brokers.join(",")}` };
        if (result) result.leftovers = named;
        opts.onLeftovers?.(named);
      }
    }
  }
}

/** The run's three agents: one for the single-writer scenarios, two for the race. */
const AGENTS = ["agent", "agent-a", "agent-b"] as const;

/** The names of run `runId`'s topics and groups: every one carries the run id, so its cleanup finds them all. */
function runNames(runId: string) {
  return {
    topics: {
      intents: `writ.verify.${runId}.intents`,
      ledger: `writ.verify.${runId}.ledger`,
      human: `writ.verify.${runId}.human`,
      dlq: `writ.verify.${runId}.dlq`,
    },
    replyTopic: (agent: string) => `writ.replies.verify.${runId}.${agent}`,
    ownerGroup: `writ.verify.${runId}`,
    instanceId: `writ-verify-${runId}`,
    // An agent's reply group is `writ.client.<agentId>.<random id>`.
    agentId: (agent: string) => `verify-${runId}-${agent}`,
  };
}

/** A run id as runVerify makes them: the cleanup deletes nothing for any other. */
const RUN_ID = /^wv-[0-9a-f]{6}$/;

/** What {@link cleanupVerifyRun} deleted, and the groups it could not delete yet. */
export interface VerifyCleanup {
  runId: string;
  /** Deleted: none where `busy` stopped it (without `force`). */
  topics: string[];
  groups: string[];
  /**
   * Groups that still have members: a run still going (its id copied from another job's log), or consumers of an
   * ended run that could not leave (Kafka was lost), which the broker drops after their session timeout (30 s at
   * most). Without `force` nothing was deleted; with it the rest was.
   */
  busy: string[];
}

/** The groups of a failed DeleteGroups that still have members; throws for any other failure. */
function busyGroups(err: unknown): string[] {
  const failed = (err as { groups?: { groupId: string; error?: { type?: string } }[] }).groups;
  if (!Array.isArray(failed)) throw err;
  // One deleted since it was listed is gone, as asked.
  const left = failed.filter((g) => g.error?.type !== "GROUP_ID_NOT_FOUND");
  if (left.some((g) => g.error?.type !== "NON_EMPTY_GROUP")) throw err;
  return left.map((g) => g.groupId);
}

/**
 * Deletes what verify run `runId` (`wv-` and six hex digits, as a report names it) has on the cluster: its topics
 * (`writ.verify.<run>.*`, `writ.replies.verify.<run>.*`) and consumer groups (`writ.verify.<run>` and
 * `writ.verify.<run>.*`, the agents' `writ.client.verify-<run>-*`), nothing else. For a run that has ended: what
 * `writ verify --cleanup` runs, and each run at its end (with `force`). Where a group still has members (`busy`)
 * the run may still be going, and its owner would lose its topics mid-run: nothing is deleted, unless `force`,
 * which deletes the topics and the groups without members all the same. Rejects `config_invalid` for any other
 * id, `kafka_failed` when Kafka does not answer within 15 s.
 */
export async function cleanupVerifyRun(opts: { runId: string; brokers: string[]; kafka?: KafkaSecurity; force?: boolean }): Promise<VerifyCleanup> {
  const { runId } = opts;
  if (!RUN_ID.test(runId)) throw configError(`${JSON.stringify(runId)} is not a verify run id (wv- and six hex digits, as the report names it)`, "runId");
  const admin = new Kafka({ clientId: "writ-verify-cleanup", brokers: opts.brokers, ...kafkaConnection(opts.kafka), logLevel: logLevel.NOTHING, retry: { retries: 2 } }).admin();
  const deleting = (async (): Promise<VerifyCleanup> => {
    await admin.connect();
    const groups = (await admin.listGroups()).groups
      .map((g) => g.groupId)
      .filter((g) => g === `writ.verify.${runId}` || g.startsWith(`writ.verify.${runId}.`) || g.startsWith(`writ.client.verify-${runId}-`));
    const held = groups.length === 0 ? [] : (await admin.describeGroups(groups)).groups.filter((g) => g.members.length > 0).map((g) => g.groupId);
    if (held.length > 0 && !opts.force) return { runId, topics: [], groups: [], busy: held };
    // A consumer that joined since it was described fails its group's delete (NON_EMPTY_GROUP): busy all the same.
    const busy = groups.length === 0 ? [] : await admin.deleteGroups(groups).then(() => [], busyGroups);
    const deleted = groups.filter((g) => !busy.includes(g));
    if (busy.length > 0 && !opts.force) return { runId, topics: [], groups: deleted, busy };
    const topics = (await admin.listTopics()).filter((t) => t.startsWith(`writ.verify.${runId}.`) || t.startsWith(`writ.replies.verify.${runId}.`));
    if (topics.length > 0) await admin.deleteTopics({ topics, timeout: 10_000 });
    return { runId, topics, groups: deleted, busy };
  })();
  deleting.catch(() => undefined); // raced below; past the deadline nobody awaits it
  try {
    return await withDeadline(deleting, OUTAGE_PROBE_MS, () => {
      throw new Error(`no answer within ${OUTAGE_PROBE_MS} ms`);
    });
  } catch (err) {
    throw new WritError("kafka_failed", `could not delete verify run ${runId}'s topics and groups (brokers ${opts.brokers.join(",")}): ${causes(err)}`, { retriable: true, cause: err });
  } finally {
    // Under the deadline too: kafkajs's disconnect waits for a request in flight (its 30 s request timeout).
    await withDeadline(admin.disconnect(), OUTAGE_PROBE_MS, () => undefined).catch(() => undefined);
  }
}

/** How long verify asks Kafka and the registry whether they still serve the run. ms. */
const OUTAGE_PROBE_MS = 15_000;

export interface OutageProbe {
  brokers: string[];
  security: KafkaSecurity | undefined;
  /** The run's own topics: the brokers must still have them. */
  topics: string[];
  registry: { schemaRegistryUrl?: string; schemaRegistryAuth?: RegistryAuth; schemaRegistryTls?: RegistryTls };
  ownerStopped: Error | null;
}

/**
 * Why Kafka, the registry or the owner cannot serve the run now, or null: the owner's consumer stopped for good,
 * the brokers do not answer for the run's topics, or the registry does not answer (or answers 5xx). Asked after a
 * scenario failed. Exported for its tests.
 */
export async function outageNow(probe: OutageProbe): Promise<WritError | null> {
  const stopped = probe.ownerStopped;
  // Its own reason where writ gave one (another group of owners runs on the topic: config_invalid), else Kafka's.
  if (stopped instanceof WritError) return new WritError(stopped.code, "the owner stopped", { retriable: stopped.retriable, cause: stopped });
  if (stopped) return new WritError("kafka_failed", "the owner stopped: Kafka failed its consumer", { retriable: true, cause: stopped });
  const admin = new Kafka({
    clientId: "writ-verify-probe",
    brokers: probe.brokers,
    ...kafkaConnection(probe.security),
    logLevel: logLevel.NOTHING,
    retry: { retries: 2 },
  }).admin();
  try {
    const asked = admin.connect().then(() => admin.fetchTopicMetadata({ topics: probe.topics }));
    asked.catch(() => undefined); // raced below; past the deadline nobody awaits it
    await withDeadline(asked, OUTAGE_PROBE_MS, () => {
      throw new Error(`no answer within ${OUTAGE_PROBE_MS} ms`);
    });
  } catch (err) {
    return new WritError("kafka_failed", `Kafka was lost during the run (brokers ${probe.brokers.join(",")})`, { retriable: true, cause: err });
  } finally {
    // Under the deadline too: kafkajs's disconnect waits for a request in flight (its 30 s request timeout).
    await withDeadline(admin.disconnect(), OUTAGE_PROBE_MS, () => undefined).catch(() => undefined);
  }
  const url = probe.registry.schemaRegistryUrl;
  if (url === undefined) return null;
  const transport = registryTransport({ auth: probe.registry.schemaRegistryAuth, tls: probe.registry.schemaRegistryTls });
  try {
    const res = await transport.fetch(`${url}/subjects`, { headers: transport.headers, signal: AbortSignal.timeout(OUTAGE_PROBE_MS) });
    await res.body?.cancel();
    // Any 4xx is the registry answering (a login that may register schemas but not list subjects gets 401/403):
    // only no answer, or a 5xx, is the registry lost.
    if (res.status >= 500) throw new Error(`GET /subjects answered ${res.status}`);
  } catch (err) {
    return new WritError("registry_unavailable", "the schema registry was lost during the run", { retriable: true, cause: err });
  }
  return null;
}

/**
 * An agent as the scenarios use it: a submit that ends without a reply (unknown, blocked) asks at once whether
 * Kafka, the registry and the owner still serve the run, and where they do not, throws that outage, so the scenario
 * stops as not run there instead of waiting out its other submits' deadlines first. Not once the run is over: its
 * clients closing end their submits without a reply.
 */
function watched(client: WritClient, outage: () => Promise<WritError | null>, over: () => boolean): ScenarioAgent {
  const check = async (replies: SubmitResult[]): Promise<void> => {
    if (over() || !replies.some((r) => r.status === "unknown" || r.status === "blocked")) return;
    const down = await outage();
    if (down) throw new WritError(down.code, `${down.message}, seen when a submit got no reply`, { retriable: down.retriable, cause: down.cause });
  };
  return {
    buildIntent: (input) => client.buildIntent(input),
    submit: async (intent, opts) => {
      const reply = await client.submit(intent, opts);
      await check([reply]);
      return reply;
    },
    submitAll: async (intents, opts) => {
      const replies = await client.submitAll(intents, opts);
      await check(replies);
      return replies;
    },
  };
}

const INFRASTRUCTURE = new Set<string>(["registry_unavailable", "kafka_failed", "reply_consumer_stopped", "client_closed"]);

/** The WritError with one of `codes`, in `err` or its causes, if any. */
function writErrorIn(err: unknown, codes: ReadonlySet<string>): WritError | null {
  for (let e: unknown = err, depth = 0; e instanceof Error && depth < 8; e = e.cause, depth++) {
    if (e instanceof WritError && codes.has(e.code)) return e;
  }
  return null;
}

/** The WritError, in `err` or its causes, that says Kafka or the schema registry failed the run. */
const infrastructureError = (err: unknown): WritError | null => writErrorIn(err, INFRASTRUCTURE);

/** An error's message and its causes', e.g. `gave up after 4 attempts: could not reach the schema registry …`. */
function causes(err: unknown): string {
  const parts: string[] = [];
  for (let e: unknown = err, depth = 0; e !== undefined && e !== null && depth < 8; e = e instanceof Error ? e.cause : undefined, depth++) {
    parts.push(e instanceof Error ? e.message : String(e));
  }
  return parts.join(": ");
}

/** What verifyTool runs a tool's scenarios with. Exported for its tests. */
export interface ToolRun {
  runId: string;
  routed: Routed;
  env: NodeJS.ProcessEnv;
  sorTimeoutMs: number;
  submitTimeoutMs: number;
  moduleTimeoutMs: number;
  scenarios: readonly ScenarioName[];
  progress: (line: string) => void;
  signal: AbortSignal | undefined;
  /** Awaits `work` until the signal, if any, aborts (then rejects with its reason). */
  until: <T>(work: Promise<T>) => Promise<T>;
  /** Why Kafka, the registry or the owner cannot serve the run now, or null. */
  outage: () => Promise<WritError | null>;
  /** Signs of Kafka, the registry or a system failing, as they happened. */
  outages: OutageWatch;
  agents: ScenarioContext["agents"];
}

/** What is wrong with a tool's fixture as the module exports it (any value), or null. */
function fixtureProblem(name: string, fixture: unknown): string | null {
  if (typeof fixture !== "object" || fixture === null) return `the verify fixture of ${name} is ${fixture === null ? "null" : typeof fixture}, not an object (see src/verify/fixture.ts)`;
  const f = fixture as Record<string, unknown>;
  if (typeof f.entityId !== "string" || f.entityId === "") return `the verify fixture of ${name} needs entityId: the id of a staging record`;
  for (const fn of ["change", "effects"]) if (typeof f[fn] !== "function") return `the verify fixture of ${name} needs ${fn}() (see src/verify/fixture.ts)`;
  for (const fn of ["prepare", "outsideChange"]) if (f[fn] !== undefined && typeof f[fn] !== "function") return `the verify fixture of ${name}: ${fn} must be a function`;
  return null;
}

/**
 * A run's `interrupted`, cut short in `err.report`'s tool: what did not run of it (`<tool> <scenario>`; its name
 * where none of its scenarios ran, as the tools `after` it are named, and as summary.notRun counts them).
 * Exported for its tests.
 */
export function interruptedIn(err: ToolInterrupted, after: readonly string[]): NonNullable<VerifyReport["interrupted"]> {
  const tool = err.report.tool;
  const cut = err.report.scenarios.length === 0 ? [tool] : err.notRun.map((s) => `${tool} ${s}`);
  return { reason: err.message, notRun: [...cut, ...after], stopped: err.outage === null };
}

/** Kafka, the registry or the owner failed during a tool's scenario, or the run was stopped: it cannot go on. */
export class ToolInterrupted extends Error {
  /** What failed; null where the run was stopped (the signal). */
  readonly outage: WritError | null;
  /** The tool's scenarios that ran before it. */
  readonly report: ToolReport;
  /** The scenario under way and those after it. */
  readonly notRun: ScenarioName[];
  constructor(why: { outage: WritError } | { stopped: unknown }, report: ToolReport, notRun: ScenarioName[]) {
    const cause = "outage" in why ? why.outage : why.stopped;
    super(causes(cause), { cause });
    this.outage = "outage" in why ? why.outage : null;
    this.report = report;
    this.notRun = notRun;
  }
}

/**
 * `fail` where a tool failed (a failure proven is never hidden); else `incomplete` where one is, or the run
 * stopped before every tool ran; else `pass`.
 */
function runStatus(tools: readonly ToolReport[], interrupted: VerifyReport["interrupted"]): VerifyReport["status"] {
  if (tools.some((t) => t.status === "fail")) return "fail";
  return interrupted !== undefined || tools.some((t) => t.status === "incomplete") ? "incomplete" : "pass";
}

/**
 * Runs one tool's scenarios: its report, or a ToolInterrupted where an outage or a stop cut them short (with the
 * report of those that ran). Exported for its tests.
 */
export async function verifyTool(tool: WriteToolDeclaration<any>, exported: unknown, run: ToolRun): Promise<ToolReport> {
  // Stopped between tools: this one is not started.
  if (run.signal?.aborted) throw new ToolInterrupted({ stopped: run.signal.reason }, emptyToolReport(tool.name, tool.system, "-", []), [...run.scenarios]);
  if (exported === undefined) {
    return emptyToolReport(tool.name, tool.system, "-", [`no verify fixture: add \`${tool.name}\` to the module's \`verify\` export`]);
  }
  const bad = fixtureProblem(tool.name, exported);
  if (bad !== null) return emptyToolReport(tool.name, tool.system, "-", [bad]);
  const fixture = exported as ToolVerifyFixture<any>;
  const entity: EntityRef = { type: tool.recordType, id: fixture.entityId };
  const direct = run.routed.direct.get(tool.system)!;
  const owned = run.routed.owned.get(tool.system)!;
  const reports: ScenarioReport[] = [];
  // `notRun`: the scenarios a stop left out. A tool whose scenarios so far passed is then incomplete, not a pass.
  const report = (notRun: ScenarioName[] = []): ToolReport => {
    const lostUpdates = reports.flatMap((r) => r.lostUpdates);
    const status = reports.some((r) => r.status === "fail") ? "fail" : notRun.length > 0 || reports.some((r) => r.status === "incomplete") ? "incomplete" : "pass";
    return {
      tool: tool.name,
      system: tool.system,
      entity: entityKey(entity),
      ok: status === "pass",
      status,
      ...(notRun.length > 0 ? { notRun } : {}),
      effects: reports.reduce((n, r) => n + r.effects, 0),
      conflicts: reports.reduce((n, r) => n + r.conflicts, 0),
      lostUpdates,
      scenarios: reports,
      problems: [],
    };
  };
  // The scenarios run so far go with it: a failure they proved is still reported. `at`: the first scenario not run.
  const interrupted = (code: WritError["code"], cause: unknown, at: number) => {
    const notRun = run.scenarios.slice(at);
    const where = at < run.scenarios.length ? `writ verify could not run (${tool.name} ${run.scenarios[at]})` : `writ verify could not go on after ${tool.name} ${run.scenarios[at - 1]}`;
    return new ToolInterrupted({ outage: new WritError(code, `${where}: ${causes(cause)}`, { retriable: true, cause }) }, report(notRun), notRun);
  };
  // Stopped (Ctrl-C) before scenario `at`: the scenarios before it are reported, it and those after it as not run.
  const stopped = (at: number) => {
    const notRun = run.scenarios.slice(at);
    return new ToolInterrupted({ stopped: run.signal?.reason }, report(notRun), notRun);
  };
  try {
    if (fixture.prepare) await run.until(moduleCall("the fixture's prepare()", run.moduleTimeoutMs, () => fixture.prepare!({ entity, system: direct, env: run.env })));
    const read = await run.until(moduleCall(`${direct.name}.read(${entityKey(entity)})`, run.moduleTimeoutMs, () => direct.read(entity, { timeoutMs: run.sorTimeoutMs })));
    if (read === null) {
      return emptyToolReport(tool.name, tool.system, entityKey(entity), [`${entityKey(entity)} does not exist on ${tool.system}: create it, or give the fixture a prepare()`]);
    }
  } catch (err) {
    if (run.signal?.aborted) throw stopped(0);
    return emptyToolReport(tool.name, tool.system, entityKey(entity), [`preparing ${entityKey(entity)} failed: ${err instanceof Error ? err.message : String(err)}`]);
  }
  const ctx: ScenarioContext = {
    runId: `${run.runId}-${tool.name.replace(/[^a-zA-Z0-9]/g, "").slice(0, 8).toLowerCase()}`,
    tool,
    fixture,
    entity,
    direct,
    owned,
    proxy: run.routed.proxyOf.get(tool.system) ?? null,
    writeMethod: run.routed.writeMethod.get(tool.system) ?? "PATCH",
    agents: run.agents,
    submitTimeoutMs: run.submitTimeoutMs,
    sorTimeoutMs: run.sorTimeoutMs,
    moduleTimeoutMs: run.moduleTimeoutMs,
  };
  for (const [i, scenario] of run.scenarios.entries()) {
    // The scenario under way is abandoned at a stop (its submits end as the run's clients close).
    if (run.signal?.aborted) throw stopped(i);
    const t0 = Date.now();
    const from = run.outages.mark();
    let r: ScenarioReport;
    try {
      r = await run.until(
        scenario === "duplicate-submission" ? duplicateSubmission(ctx)
        : scenario === "race" ? race(ctx)
        : commitThenFault(ctx, scenario),
      );
    } catch (err) {
      if (run.signal?.aborted) throw stopped(i);
      // Kafka or the registry failing is verify not running, not the tool failing a guarantee: the run stops (exit 2).
      const outage = infrastructureError(err);
      if (outage) throw interrupted(outage.code, err, i);
      r = failedToRun(scenario, err, t0);
    }
    // Judged by the signs seen during it (an outage over by now may explain what did not come), and reported before
    // anything else is awaited: a stop or an outage found next keeps a failure it proved.
    r = attributeFailure(r, run.outages.since(from));
    reports.push(r);
    if (!r.ok) {
      // A broker or the registry lost during the scenario shows as replies that never came (unknown), not as an
      // error, and may have left no sign yet: asked now. Down, it is verify not running (exit 2): a failure it can
      // explain is not judged (the scenario is not run); one it cannot stands, and the scenarios after it are not run.
      const down = await run.until(run.outage()).catch((err: unknown) => {
        if (run.signal?.aborted) throw stopped(i + 1);
        throw err;
      });
      if (down) {
        const theOutages = r.outageCanExplain === "any";
        if (theOutages) reports.pop();
        throw interrupted(down.code, down, theOutages ? i : i + 1);
      }
    }
    const shown =
      r.status === "incomplete" ? (r.outage !== undefined ? `incomplete, during an outage of ${r.outage}` : `incomplete: ${r.notExercised ?? "not judged"}`)
      : r.ok ? "pass"
      : "FAIL";
    run.progress(`${tool.name} ${scenario}: ${shown} (${r.effects}/${r.expectedEffects} effects, ${r.conflicts} conflicts, ${r.lostUpdates.length} lost)`);
  }
  return report();
}

/**
 * A scenario that threw: the tool's, its adapter's or its fixture's failure (an effects() that gives no count, a
 * change() that throws, a call past the module deadline), which no outage explains; but where the adapter said its
 * system could not be reached (`sor_unavailable`), that system's outage can. Exported for its tests.
 */
export function failedToRun(scenario: ScenarioName, err: unknown, t0: number): ScenarioReport {
  return {
    scenario,
    ok: false,
    status: "fail",
    harm: false,
    effects: 0,
    expectedEffects: 0,
    conflicts: 0,
    lostUpdates: [],
    duplicates: [],
    patchesSent: null,
    replies: [],
    faultInjection: null,
    problems: [`could not run: ${causes(err)}`],
    outageCanExplain: writErrorIn(err, SOR_UNAVAILABLE) ? "system" : "none",
    notes: [],
    durationMs: Date.now() - t0,
  };
}

/** An adapter's error that says its system of record did not answer. */
const SOR_UNAVAILABLE = new Set<string>(["sor_unavailable"]);
