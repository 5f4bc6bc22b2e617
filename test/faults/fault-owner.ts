// An owner process for the fault suite: the production owner (same router,
// same demo tools) plus one injected crash point, between the PATCH answer and
// the batch's Kafka commit: with probability WRIT_FAULT_CRASH_AFTER_PATCH the
// process SIGKILLs itself there, the worst moment for exactly-once.
import { routerConfigFromEnv } from "../../src/config.ts";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";
import { createLogger } from "../../src/logger.ts";
import { startRouter } from "../../src/owner/router.ts";
import { systems, tools } from "../../examples/demo-tools.ts";

hideKafkajsTimeoutWarning();
const log = createLogger({ name: "fault-owner" });
const crashProbability = Number(process.env.WRIT_FAULT_CRASH_AFTER_PATCH ?? "0");
if (!(crashProbability >= 0 && crashProbability <= 1)) throw new Error("WRIT_FAULT_CRASH_AFTER_PATCH must be within 0..1");

const router = await startRouter({
  config: routerConfigFromEnv(),
  tools,
  systems: systems(process.env),
  logger: log,
  onFatal: () => process.exit(1),
  afterPatch: (intent, outcome) => {
    if (outcome.kind === "applied" && Math.random() < crashProbability) {
      log.warn({ intentKey: intent.intentKey }, "fault: crashing between PATCH and commit");
      process.kill(process.pid, "SIGKILL");
    }
  },
});
process.on("SIGTERM", () => void router.stop().then(() => process.exit(0)));
