// `npm run test:faults [-- options]`: the crash-safety suite (see scenario.ts, and options.ts for the
// flags). Each run's last line is its measured figures as JSON; the process exits 1 if any run failed.
import { resolve } from "node:path";
import { hideKafkajsTimeoutWarning } from "../../src/node-warnings.ts";
import { parseSuiteOptions, USAGE } from "./options.ts";

hideKafkajsTimeoutWarning();
const root = resolve(import.meta.dirname, "..", "..");
let opts;
try {
  opts = parseSuiteOptions(process.argv.slice(2));
} catch (err) {
  console.error(`test:faults: ${(err as Error).message}\n\n${USAGE}`);
  process.exit(2);
}
if (process.env.KAFKA_BROKERS) {
  console.error("test:faults kills and restarts its own local broker; unset KAFKA_BROKERS");
  process.exit(2);
}
// A stack of its own (own ports, own data dir), since this suite kills its broker. Its ports lie below
// the ephemeral range, as every stack's (src/testing/local-stack.ts's header says why).
const three = opts.brokers === 3;
process.env.WRIT_LOCAL_STACK_DIR ??= resolve(root, ".cache", three ? "run-faults-3" : "run-faults");
process.env.WRIT_LOCAL_KAFKA_PORT ??= three ? "21192" : "21092";
process.env.WRIT_LOCAL_REGISTRY_PORT ??= three ? "21181" : "21081";

const stack = await import("../../src/testing/local-stack.ts");
const { runScenario } = await import("./scenario.ts");
const say = (line: string) => console.log(line);

const up = await stack.ensureStack({ brokers: opts.brokers, log: (l) => say(`  [stack] ${l}`) });
let failures = 0;
// What failed, said again last: a CI log shows only its tail, and later cases print a lot.
const failed: string[] = [];
const fail = (what: string, line: unknown, problems: string[]): void => {
  failures++;
  failed.push(`${what} failed: ${JSON.stringify(line)}`, ...problems.slice(0, 10).map((p) => `  PROBLEM ${p}`));
};
try {
  // The lease ablation removes a guarantee only the lease case checks: it runs alone.
  for (let run = 0; run < (opts.ablate === "leases" ? 0 : opts.runs); run++) {
    const seed = opts.seed + run;
    if (opts.runs > 1) say(`run ${run + 1} of ${opts.runs}`);
    const result = await runScenario({ ...opts, seed, root, stack, brokers_: up.endpoints.brokers, registryUrl: up.endpoints.registryUrl || undefined, say });
    for (const p of result.problems.slice(0, 25)) say(`  PROBLEM ${p}`);
    if (result.problems.length > 25) say(`  … and ${result.problems.length - 25} more problems`);
    console.log(JSON.stringify(result.line));
    if (result.failed) fail(`run ${run + 1} (seed ${seed})`, result.line, result.problems);
  }
  if (opts.ablate === "leases" || (opts.leaseCase && opts.ablate === null)) {
    const { runLeaseCase } = await import("./lease-case.ts");
    const lease = await runLeaseCase({ root, brokers: up.endpoints.brokers, registryUrl: up.endpoints.registryUrl || undefined, replicationFactor: three ? 3 : 1, seed: opts.seed, ablate: opts.ablate, say });
    for (const p of lease.problems.slice(0, 25)) say(`  PROBLEM ${p}`);
    console.log(JSON.stringify(lease.line));
    if (lease.failed) fail("the lease case", lease.line, lease.problems);
  }
  if (three && opts.hangCase && opts.ablate === null) {
    const { runHangCase } = await import("./hang-case.ts");
    say("hanging-transaction case: a reply partition's leader dies while an owner's commit is held, so the coordinator skips its marker");
    const hang = await runHangCase({ brokers: up.endpoints.brokers, registryUrl: up.endpoints.registryUrl || undefined, say: (l) => say(`  ${l}`), id: `h${opts.seed.toString(36)}`, logDir: resolve(root, ".writ") });
    for (const p of hang.problems) say(`  PROBLEM ${p}`);
    const line = { case: "hanging-transaction", ...hang, problems: undefined };
    console.log(JSON.stringify(line));
    if (!hang.reproduced || hang.healedByWatchMs === null || hang.healedByRestartMs === null || hang.answered !== hang.expected || hang.problems.length > 0) fail("the hanging-transaction case", line, hang.problems);
  }
} finally {
  if (up.started) await up.stop();
}
for (const line of failed) say(line);
if (failures > 0) say(`${failures} run(s) failed`);
process.exit(failures > 0 ? 1 : 0);
