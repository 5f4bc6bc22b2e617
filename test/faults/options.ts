import { parseArgs } from "node:util";

export type Ablation = "ledger" | "if-match" | "leases" | "in-doubt-scan";

export interface SuiteOptions {
  seed: number;
  runs: number;
  intents: number;
  agents: number;
  entities: number;
  brokers: 1 | 3;
  ablate: Ablation | null;
  /** Skip the deterministic hanging-transaction case (it needs three brokers). */
  hangCase: boolean;
  /** Run the case of three-record changes under leases after the main scenario. */
  leaseCase: boolean;
}

export const USAGE = `npm run test:faults -- [options]

  --seed N       the schedule's seed (default: random, printed first); a seed replays the schedule
  --runs N       runs in a row, seeds N, N+1, … (default 1)
  --intents N    intents per run (default 2160), spread over 6 agents
  --entities N   records the intents touch (default 60)
  --brokers 1|3  a single broker (default), or three (replication factor 3, min.insync.replicas 2):
                 a partition leader is killed mid-run, and the deterministic hanging-transaction case runs
  --ablate ledger|if-match|leases|in-doubt-scan
                 remove a guarantee: the owner skips its ledger (must report duplicates), sends
                 no version precondition (must report lost updates), grants every lease and
                 honours none (only the lease case runs; it must report changes left partly
                 applied), or restores without the read_uncommitted scan for the pending entries
                 of aborted transactions (a crash between PATCH and commit then loses them: must
                 report duplicates or misreported outcomes); the run then exits 1 as it should
  --no-lease-case
                 skip the case of three-record changes under leases (run after the main scenario)
  --no-hang-case skip the hanging-transaction case in --brokers 3
  --help`;

export function parseSuiteOptions(argv: string[]): SuiteOptions {
  const { values } = parseArgs({
    args: argv,
    options: {
      seed: { type: "string" },
      runs: { type: "string", default: "1" },
      intents: { type: "string", default: "2160" },
      entities: { type: "string", default: "60" },
      brokers: { type: "string", default: "1" },
      ablate: { type: "string" },
      "no-hang-case": { type: "boolean", default: false },
      "no-lease-case": { type: "boolean", default: false },
      help: { type: "boolean", default: false },
    },
    strict: true,
  });
  if (values.help) {
    console.log(USAGE);
    process.exit(0);
  }
  const int = (name: string, raw: string | undefined, min: number): number => {
    const n = Number(raw);
    if (!Number.isInteger(n) || n < min) throw new Error(`--${name} must be an integer >= ${min}, got ${raw}`);
    return n;
  };
  const brokers = int("brokers", values.brokers, 1);
  if (brokers !== 1 && brokers !== 3) throw new Error("--brokers must be 1 or 3");
  const ablate = values.ablate ?? null;
  if (ablate !== null && ablate !== "ledger" && ablate !== "if-match" && ablate !== "leases" && ablate !== "in-doubt-scan") {
    throw new Error("--ablate must be ledger, if-match, leases or in-doubt-scan");
  }
  return {
    seed: values.seed === undefined ? Math.floor(Math.random() * 0x7fffffff) : int("seed", values.seed, 0),
    runs: int("runs", values.runs, 1),
    intents: int("intents", values.intents, 6),
    agents: 6,
    entities: int("entities", values.entities, 4),
    brokers,
    ablate,
    hangCase: !values["no-hang-case"],
    leaseCase: !values["no-lease-case"],
  };
}
