// The owner process: `npm run owner`. Configuration comes from the environment
// (see the README) and is validated before anything connects.
import { resolve } from "node:path";
import { pathToFileURL } from "node:url";
import { routerConfigFromEnv } from "../src/config.ts";
import { WritError } from "../src/errors.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { createLogger } from "../src/logger.ts";
import { startRouter } from "../src/owner/router.ts";
import type { SystemOfRecord } from "../src/sor/adapter.ts";
import type { WriteToolDeclaration } from "../src/tools.ts";

interface ToolsModule {
  tools: WriteToolDeclaration<any>[];
  systems: (env: NodeJS.ProcessEnv) => SystemOfRecord[];
}

hideKafkajsTimeoutWarning();
const log = createLogger({ name: "writ-owner" });
try {
  const config = routerConfigFromEnv();
  const modulePath = process.env.WRIT_TOOLS_MODULE ?? resolve(import.meta.dirname, "../examples/demo-tools.ts");
  const mod = (await import(pathToFileURL(resolve(modulePath)).href)) as Partial<ToolsModule>;
  if (!Array.isArray(mod.tools) || typeof mod.systems !== "function") {
    throw new WritError("config_invalid", `WRIT_TOOLS_MODULE (${modulePath}) must export tools[] and systems(env)`, {
      retriable: false,
      context: { field: "WRIT_TOOLS_MODULE" },
    });
  }
  const router = await startRouter({
    config,
    tools: mod.tools,
    systems: mod.systems(process.env),
    logger: log,
    onFatal: (err) => {
      log.fatal({ err }, "owner cannot continue; exiting so a supervisor restarts it");
      process.exit(1);
    },
  });
  let stopping = false;
  const stop = async (signal: string) => {
    if (stopping) return;
    stopping = true;
    log.info({ signal }, "stopping");
    await router.stop();
    process.exit(0);
  };
  process.on("SIGTERM", () => void stop("SIGTERM"));
  process.on("SIGINT", () => void stop("SIGINT"));
} catch (err) {
  log.fatal({ err }, err instanceof WritError ? err.message : "owner failed to start");
  process.exitCode = 1;
  setTimeout(() => process.exit(1), 100).unref();
}
