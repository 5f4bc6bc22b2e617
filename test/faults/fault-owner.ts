// An owner process for the fault suite: the production owner (same router,
// same demo tools) with its systems of record wrapped at the adapter
// boundary, as `writ verify` does:
// - a crash point between the PATCH answer and the results' Kafka commit:
//   with probability WRIT_FAULT_CRASH_AFTER_PATCH the process SIGKILLs itself
//   there, the worst moment for exactly-once;
// - ablation controls (WRIT_FAULT_ABLATE=ledger | if-match | leases | in-doubt-scan),
//   which remove a guarantee so that the suite can show its check fails without
//   it (if-match: the write goes out with the version just read, and the delta is
//   not rebuilt from the params on that record either; in-doubt-scan: a restore
//   does not look for the pending entries of aborted transactions).
import { routerConfigFromEnv } from "../../src/config.ts";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";
import { createLogger } from "../../src/logger.ts";
import { startRouter } from "../../src/owner/router.ts";
import type { SystemOfRecord } from "../../src/sor/adapter.ts";
import { faultTools, systems } from "./fault-tools.ts";

hideKafkajsTimeoutWarning();
const log = createLogger({ name: "fault-owner" });
// Asked to leave before the router is up: leave at once (the handler below takes over once it is).
let stopRouter: (() => Promise<void>) | null = null;
process.on("SIGTERM", () => void (stopRouter ?? (async () => undefined))().then(() => process.exit(0)));
const crashProbability = Number(process.env.WRIT_FAULT_CRASH_AFTER_PATCH ?? "0");
if (!(crashProbability >= 0 && crashProbability <= 1)) throw new Error("WRIT_FAULT_CRASH_AFTER_PATCH must be within 0..1");
const ablate = new Set((process.env.WRIT_FAULT_ABLATE ?? "").split(",").filter((s) => s !== ""));
for (const a of ablate) if (a !== "ledger" && a !== "if-match" && a !== "leases" && a !== "in-doubt-scan") throw new Error(`WRIT_FAULT_ABLATE: unknown ablation ${a}`);

/** The crash point, at the adapter: after the system answered a PATCH applied, before anything reaches Kafka. */
function crashAfterPatch(inner: SystemOfRecord): SystemOfRecord {
  return {
    ...inner,
    read: (entity, opts) => inner.read(entity, opts),
    async patch(entity, ops, opts) {
      const outcome = await inner.patch(entity, ops, opts);
      if (outcome.kind === "applied" && Math.random() < crashProbability) {
        log.warn({ intentKey: opts.idempotencyKey }, "fault: crashing between PATCH and commit");
        process.kill(process.pid, "SIGKILL");
      }
      return outcome;
    },
  };
}

const router = await startRouter(
  {
    config: routerConfigFromEnv(),
    tools: faultTools,
    systems: systems(process.env).map(crashAfterPatch),
    logger: log,
    onFatal: () => process.exit(1),
  },
  { ablateLedger: ablate.has("ledger"), ablateVersionCheck: ablate.has("if-match"), ablateLeases: ablate.has("leases"), ablateInDoubtScan: ablate.has("in-doubt-scan") },
);
stopRouter = () => router.stop();
