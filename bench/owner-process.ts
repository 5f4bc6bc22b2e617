// The bench's owner process (the throughput and memory scenarios): one owner
// (startRouter, demo tools) with the config in BENCH_OWNER_CONFIG (JSON) and
// the records server at RECORDS_URL. It talks to the bench over IPC (bench/child.ts):
//   → {type: "started"} once startRouter resolved
//   ← {type: "measure"}  → {type: "measured", owned, rss, heapUsed} after a full GC
//   ← {type: "stop"}     → exits 0 once the router stopped
import { systems, tools } from "../examples/demo-tools.ts";
import { createLogger } from "../src/logger.ts";
import { hideKafkajsTimeoutWarning } from "../src/node-warnings.ts";
import { startRouter } from "../src/owner/router.ts";

hideKafkajsTimeoutWarning();
const send = (m: object) => process.send?.(m);
const router = await startRouter({
  config: JSON.parse(process.env.BENCH_OWNER_CONFIG ?? "{}"),
  tools,
  systems: systems({ RECORDS_URL: process.env.RECORDS_URL }),
  logger: createLogger({ level: process.env.LOG_LEVEL ?? "warn", name: "bench-owner" }),
  onFatal: (err) => {
    process.stderr.write(`owner cannot continue: ${err.message}\n`);
    process.exit(1);
  },
});
send({ type: "started" });
process.on("message", (m: { type?: string }) => {
  if (m.type === "measure") {
    void (async () => {
      const gc = (globalThis as { gc?: () => void }).gc;
      for (let k = 0; k < 3; k++) {
        gc?.();
        await new Promise((r) => setTimeout(r, 300));
      }
      const usage = process.memoryUsage();
      send({ type: "measured", owned: router.ownedPartitions(), rss: usage.rss, heapUsed: usage.heapUsed });
    })();
  }
  if (m.type === "stop") {
    void router.stop().finally(() => process.exit(0));
  }
});
