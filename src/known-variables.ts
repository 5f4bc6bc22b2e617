// Every WRIT_* environment variable something in writ reads, for the owner's warning about the ones it does not
// know (`unknown setting WRIT_HEALTH_PROT (did you mean WRIT_HEALTH_PORT?)`). Most come from the tables that map
// settings to variables; the rest are read in one place each, listed below. test/unit/known-variables.test.ts
// scans the sources for WRIT_ names and fails on one missing here.
import { closest } from "./closest.ts";
import { ROUTER_ENV } from "./config.ts";
import { MCP_ENV } from "../producers/mcp-env.ts";

/** WRIT_ variables read outside the owner's and the MCP server's tables, by where they are read. */
const ELSEWHERE = [
  // the writ command: src/cli/tools-module.ts, src/cli/common.ts, src/console/command.ts
  "WRIT_TOOLS_MODULE",
  "WRIT_TOOLS_IMPORT_TIMEOUT_MS",
  "WRIT_OWNER_PRINCIPALS",
  "WRIT_CONSOLE_TOKEN",
  "WRIT_CONSOLE_OPERATOR_TOKEN",
  // the local stacks of writ/testing: src/testing/stack-layout.ts, src/testing/secure-stack.ts
  "WRIT_LOCAL_STACK_DIR",
  "WRIT_LOCAL_STACK_CACHE",
  "WRIT_LOCAL_KAFKA_PORT",
  "WRIT_LOCAL_REGISTRY_PORT",
  "WRIT_KAFKA_VERSION",
  "WRIT_APICURIO_VERSION",
  "WRIT_SECURE_STACK_DIR",
  "WRIT_SECURE_KAFKA_PORT",
  "WRIT_SECURE_REGISTRY_PORT",
  // docker-compose.yml (the tools folder it mounts) and scripts/ensure-deps.cjs
  "WRIT_TOOLS_DIR",
  "WRIT_CHROMIUM",
  // the Python client, its examples and its tests (python/src/writ_client, python/tests), which may share an owner's environment
  "WRIT_SIGNING_SEED",
  "WRIT_REPO",
  "WRIT_EXAMPLE_START",
  "WRIT_KEEP_STACK",
  "WRIT_SKIP_SECURE",
] as const;

/** Every WRIT_ variable writ reads. */
export const KNOWN_WRIT_VARIABLES: ReadonlySet<string> = new Set(
  [...Object.values(ROUTER_ENV), ...Object.values(MCP_ENV), ...ELSEWHERE].filter((name) => name.startsWith("WRIT_")),
);

/**
 * The WRIT_-prefixed variables of `env` that writ does not read, each with the message an owner warns with:
 * `unknown setting WRIT_HEALTH_PROT (did you mean WRIT_HEALTH_PORT?)`. Not an error: a user may keep variables
 * of their own under the prefix (a tools module's systems(env) reads the owner's environment).
 */
export function unknownWritVariables(env: NodeJS.ProcessEnv): { variable: string; suggestion?: string; message: string }[] {
  return Object.keys(env)
    .filter((name) => name.startsWith("WRIT_") && !KNOWN_WRIT_VARIABLES.has(name))
    .sort()
    .map((variable) => {
      const suggestion = closest(variable, KNOWN_WRIT_VARIABLES);
      return suggestion === undefined
        ? { variable, message: `unknown setting ${variable}: writ reads no such variable (ignored)` }
        : { variable, suggestion, message: `unknown setting ${variable} (did you mean ${suggestion}?)` };
    });
}
