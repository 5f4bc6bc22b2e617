// The tools module of `writ owner` and `writ submit`: a module exporting
// `tools` (declared write tools) and `systems(env)` (their systems of record).
// It is named by a flag or an environment variable; there is no default.
import { existsSync } from "node:fs";
import { isAbsolute, resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { timerMs } from "../config.ts";
import { importWithin } from "../deadline.ts";
import { WritError } from "../errors.ts";
import type { SystemOfRecord } from "../sor/adapter.ts";
import type { WriteToolDeclaration } from "../tools.ts";
import { fromEnv } from "./common.ts";

export interface ToolsModule {
  tools: WriteToolDeclaration<any>[];
  systems: (env: NodeJS.ProcessEnv) => SystemOfRecord[];
}

/** Where the module name came from, for error messages: `--tools` or `WRIT_TOOLS_MODULE`. */
export type ToolsSource = "--tools" | "WRIT_TOOLS_MODULE";

function configError(message: string, field: ToolsSource): WritError {
  return new WritError("config_invalid", message, { retriable: false, context: { field } });
}

/** How long the tools module's import may take (its top-level code: a connection it awaits) by default. ms. */
export const DEFAULT_TOOLS_IMPORT_TIMEOUT_MS = 30_000;

/**
 * The module named by `--tools` (`flag`), else by `$WRIT_TOOLS_MODULE`. A
 * missing name, a missing file, a module that fails to load and one without
 * `tools[]` and `systems(env)` are configuration errors naming the flag or
 * variable. A path is resolved against the working directory; a `.ts` module
 * needs a Node that strips types (>= 22.18) and must not live under node_modules.
 * An import not finished within `$WRIT_TOOLS_IMPORT_TIMEOUT_MS` (checked first)
 * is one too, naming the module and the variable; it is left pending (an import
 * cannot be cancelled), so the command should end the process.
 */
export async function loadToolsModule(flag: string | undefined, env: NodeJS.ProcessEnv = process.env): Promise<{ module: ToolsModule; path: string; source: ToolsSource }> {
  const importTimeoutMs = fromEnv("WRIT_TOOLS_IMPORT_TIMEOUT_MS", timerMs(1), DEFAULT_TOOLS_IMPORT_TIMEOUT_MS, true, env);
  const source: ToolsSource = flag !== undefined ? "--tools" : "WRIT_TOOLS_MODULE";
  const spec = flag ?? env.WRIT_TOOLS_MODULE;
  if (spec === undefined || spec.trim() === "") {
    throw configError("no tools module: give --tools <module> (or set WRIT_TOOLS_MODULE) naming a module that exports tools[] and systems(env)", source);
  }
  const path = spec.startsWith("file:") ? new URL(spec).pathname : isAbsolute(spec) ? spec : resolve(spec);
  if (!existsSync(path)) throw configError(`tools module ${spec} (${source}) not found at ${path}`, source);
  let late: WritError | undefined;
  const imported = importWithin(pathToFileURL(path).href, importTimeoutMs, (why) => {
    late = new WritError(
      "config_invalid",
      `tools module ${spec} (${source}) did not finish loading within ${importTimeoutMs} ms (WRIT_TOOLS_IMPORT_TIMEOUT_MS; give it more where loading takes longer): ${why}`,
      { retriable: false, context: { field: "WRIT_TOOLS_IMPORT_TIMEOUT_MS" } },
    );
    return late;
  });
  let mod: Partial<ToolsModule>;
  try {
    mod = (await imported) as Partial<ToolsModule>;
  } catch (err) {
    if (err === late) throw err;
    const code = (err as { code?: unknown } | null)?.code;
    const message =
      code === "ERR_UNKNOWN_FILE_EXTENSION" && /\.[mc]?ts$/.test(path)
        ? `this Node (${process.version}) does not strip types from a TypeScript module: that needs Node >= 22.18, not run with --no-experimental-strip-types; else give the module as JavaScript`
        : err instanceof Error
          ? err.message
          : String(err);
    throw new WritError("config_invalid", `tools module ${spec} (${source}) failed to load: ${message}`, { retriable: false, cause: err, context: { field: source } });
  }
  if (!Array.isArray(mod.tools) || typeof mod.systems !== "function") {
    throw configError(`tools module ${spec} (${source}) must export tools[] and systems(env)`, source);
  }
  return { module: mod as ToolsModule, path, source };
}

/** What a value is, for an error message: `null`, `an array`, `a promise`, `a function`, `a string`, … */
function kindOf(v: unknown): string {
  if (v === null) return "null";
  if (v === undefined) return "undefined";
  if (Array.isArray(v)) return "an array";
  if (typeof (v as { then?: unknown }).then === "function") return "a promise (systems(env) must return the array itself)";
  return typeof v === "object" ? "an object" : `a ${typeof v}`;
}

/**
 * The systems of record of a loaded tools module: `systems(env)`, which must return an array of them (each with
 * a name, read and patch). One that throws, returns anything else, or holds anything else is a configuration
 * error naming the module and what it returned, so the owner exits 2 rather than crash at its start.
 */
export function systemsOf(loaded: { module: ToolsModule; path: string; source: ToolsSource }, env: NodeJS.ProcessEnv): SystemOfRecord[] {
  const where = `tools module ${loaded.path} (${loaded.source})`;
  let systems: unknown;
  try {
    systems = loaded.module.systems(env);
  } catch (err) {
    throw new WritError("config_invalid", `${where}: systems(env) threw: ${err instanceof Error ? err.message : String(err)}`, { retriable: false, cause: err, context: { field: loaded.source } });
  }
  if (!Array.isArray(systems)) throw configError(`${where}: systems(env) must return an array of systems of record, got ${kindOf(systems)}`, loaded.source);
  systems.forEach((s: unknown, i) => {
    const sor = s as Partial<SystemOfRecord> | null;
    if (sor === null || typeof sor !== "object" || typeof sor.name !== "string" || typeof sor.read !== "function" || typeof sor.patch !== "function") {
      throw configError(`${where}: systems(env)[${i}] is not a system of record (an object with name, read and patch, e.g. createHttpSystemOfRecord(…)), got ${kindOf(s)}`, loaded.source);
    }
  });
  return systems as SystemOfRecord[];
}
