/**
 * Runs the demo records server: `npm run records-server`.
 *
 * Env: `RECORDS_PORT` (default 4010), `RECORDS_HOST` (default 127.0.0.1),
 * `RECORDS_DB` (SQLite file, default `.writ/records.db`; `:memory:` allowed),
 * `RECORDS_ENFORCE_IF_MATCH`, `RECORDS_HONOUR_IDEMPOTENCY_KEY` (`true`/`false`,
 * default true). Stops on SIGTERM/SIGINT; a second one (1 s or more after the first) ends it at once.
 */
import { mkdirSync } from "node:fs";
import { dirname } from "node:path";
import { pino } from "pino";
import { z } from "zod";
import { onStopSignals } from "../cli/signals.ts";
import { startDemoRecordsServer } from "./demo-records-server.ts";

const unset = (v: unknown) => (v === "" ? undefined : v);
const flag = z.preprocess(unset, z.enum(["true", "false"]).transform((v) => v === "true").optional());

const Env = z.object({
  RECORDS_PORT: z.preprocess(unset, z.coerce.number().int().min(0).max(65535).default(4010)),
  // Host and the two flags default in the server's own options schema.
  RECORDS_HOST: z.preprocess(unset, z.string().optional()),
  RECORDS_DB: z.preprocess(unset, z.string().default(".writ/records.db")),
  RECORDS_ENFORCE_IF_MATCH: flag,
  RECORDS_HONOUR_IDEMPOTENCY_KEY: flag,
});

// Written at once: a line logged as a second signal ends the process is not lost.
const log = pino({ name: "demo-records-server" }, pino.destination({ dest: 1, sync: true }));

const env = Env.safeParse(process.env);
if (!env.success) {
  const issue = env.error.issues[0];
  const field = issue?.path.join(".") ?? "(env)";
  log.fatal({ field }, `invalid environment: ${field}: ${issue?.message ?? "invalid"}`);
  process.exit(2);
}

const { RECORDS_PORT, RECORDS_HOST, RECORDS_DB, RECORDS_ENFORCE_IF_MATCH, RECORDS_HONOUR_IDEMPOTENCY_KEY } = env.data;
if (RECORDS_DB !== ":memory:") mkdirSync(dirname(RECORDS_DB), { recursive: true });

const server = await startDemoRecordsServer({
  port: RECORDS_PORT,
  host: RECORDS_HOST,
  dbPath: RECORDS_DB,
  enforceIfMatch: RECORDS_ENFORCE_IF_MATCH,
  honourIdempotencyKey: RECORDS_HONOUR_IDEMPOTENCY_KEY,
}).catch((err: unknown) => {
  log.fatal({ err }, `demo records server failed to start: ${err instanceof Error ? err.message : String(err)}`);
  process.exit(1);
});
log.info({ url: server.url, db: RECORDS_DB, ...server.config() }, `demo records server listening on ${server.url}`);

// A second signal, of either kind, while the server closes (a request held by a fault) ends the process at once.
const signals = onStopSignals(
  (signal) => {
    server
      .close()
      .then(() => {
        signals.dispose();
        log.info({ signal }, "demo records server stopped");
      })
      .catch((err: unknown) => {
        log.error({ err }, "demo records server failed to stop cleanly");
        process.exitCode = 1;
      });
  },
  (signal) => log.warn({ signal }, "second signal: exiting without a clean stop"),
);
