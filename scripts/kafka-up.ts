// npm run kafka:up — start (or reuse) the local Kafka broker and Apicurio registry
// and leave them running. Prints the env lines to export.
//
//   npm run kafka:up                    # one node on 19092, registry on 18081 (.cache/run)
//   npm run kafka:up -- --brokers 3     # three nodes on 19192/19194/19196 (controllers one above
//                                       # each), registry on 18181, in .cache/run-3
//   npm run kafka:up -- --secure        # one node with a SASL_SSL listener (SCRAM, TLS from a CA made at
//                                       # start, ACLs) on 19492, registry over HTTPS with basic auth on 18481,
//                                       # in .cache/run-secure (src/testing/secure-stack.ts); prints the owner's
//                                       # variables and the agents' and admin's password files
//   npm run kafka:up -- --secure --tenant T
//                                       # the same, with tenant T's users, names and ACLs (made at start; a
//                                       # running stack without T is an error); prints T's variables
//   A secure stack that runs is reused; one whose registry died gets it started again ("registry restarted",
//   not "started": `npm run kafka:down -- --secure --registry-only` stops it alone, the broker being others').
//
// WRIT_LOCAL_STACK_DIR, WRIT_LOCAL_KAFKA_PORT and WRIT_LOCAL_REGISTRY_PORT still override the dir and ports.
import { join, resolve } from 'node:path';
import { hideKafkajsTimeoutWarning } from '../src/node-warnings.ts';

hideKafkajsTimeoutWarning();

function brokersArg(argv: string[]): 1 | 3 {
  const i = argv.findIndex((a) => a === '--brokers' || a.startsWith('--brokers='));
  if (i < 0) return 1;
  const raw = argv[i]!.includes('=') ? argv[i]!.slice('--brokers='.length) : argv[i + 1];
  if (raw === '1' || raw === '3') return Number(raw) as 1 | 3;
  process.stderr.write(`[local-stack] --brokers must be 1 or 3, got ${String(raw)}\n`);
  process.exit(2);
}

const brokers = brokersArg(process.argv.slice(2));
if (process.argv.includes('--secure')) {
  if (brokers !== 1) {
    process.stderr.write('[local-stack] --secure runs one node; leave out --brokers\n');
    process.exit(2);
  }
  const { ensureStack } = await import('../src/testing/local-stack.ts');
  const t0 = Date.now();
  const at = process.argv.indexOf('--tenant');
  const tenant = at < 0 ? '' : (process.argv[at + 1] ?? '');
  try {
    const { startedParts = [], secure } = await ensureStack({ secure: { tenants: at < 0 ? [] : [tenant] } });
    const s = at < 0 ? secure! : secure!.tenant(tenant);
    const took = `in ${((Date.now() - t0) / 1000).toFixed(1)} s`;
    // "started" only when the broker was: whoever reads it (python/src/writ_client/devstack.py) then stops the whole
    // stack, which a reuse that started only a dead registry again must not do under the broker's other users.
    if (startedParts.includes('broker')) process.stderr.write(`[secure-stack] started ${took}; stop with: npm run kafka:down -- --secure\n`);
    else if (startedParts.includes('registry')) process.stderr.write(`[secure-stack] registry restarted ${took} (the broker was running); stop it alone with: npm run kafka:down -- --secure --registry-only\n`);
    else process.stderr.write(`[secure-stack] already running ${took}; stop with: npm run kafka:down -- --secure\n`);
    process.stdout.write(`# the owners (SCRAM user ${s.users['writ-owner'].username}${tenant === '' ? '' : `, tenant ${tenant}`}); CA: ${s.caFile}\n`);
    for (const [k, v] of Object.entries(s.env('writ-owner'))) process.stdout.write(`${k}=${v}\n`);
    for (const user of ['agent-a', 'agent-b', 'admin'] as const) {
      process.stdout.write(`# ${user === 'admin' ? 'admin (super user: writ topics, tail, escalations, doctor)' : `agent ${user}`}: KAFKA_SASL_USERNAME=${s.users[user].username} KAFKA_SASL_PASSWORD_FILE=${s.users[user].passwordFile}\n`);
    }
    process.exit(0);
  } catch (err) {
    process.stderr.write(`[secure-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}
if (brokers === 3) {
  // its own stack dir and ports, beside the single-node stack the tests share; below the ephemeral
  // range, as every stack's (src/testing/local-stack.ts's header says why).
  process.env['WRIT_LOCAL_STACK_DIR'] ??= join(resolve(import.meta.dirname, '..'), '.cache', 'run-3');
  process.env['WRIT_LOCAL_KAFKA_PORT'] ??= '19192';
  process.env['WRIT_LOCAL_REGISTRY_PORT'] ??= '18181';
}
// This command starts the local stack: KAFKA_BROKERS and SCHEMA_REGISTRY_URL, which name a stack for other
// programs (often this one's own output, exported), would make ensureStack() use them without starting anything,
// and report "already running" after a kafka:down.
for (const name of ['KAFKA_BROKERS', 'SCHEMA_REGISTRY_URL'] as const) delete process.env[name];
const { ensureStack } = await import('../src/testing/local-stack.ts');

const t0 = Date.now();
try {
  const { endpoints, startedParts = [] } = await ensureStack({ brokers });
  const down = brokers === 3 ? 'npm run kafka:down -- --brokers 3' : 'npm run kafka:down';
  const took = `in ${((Date.now() - t0) / 1000).toFixed(1)} s`;
  // "started" only when the broker was, as the secure stack's line above says it: a registry started again beside
  // a broker others use is said as such.
  if (startedParts.includes('broker')) process.stderr.write(`[local-stack] started ${took}; stop with: ${down}\n`);
  else if (startedParts.includes('registry')) process.stderr.write(`[local-stack] registry restarted ${took} (the broker was running); stop it alone with: ${brokers === 3 ? 'npm run kafka:down -- --brokers 3 --registry-only' : 'npm run kafka:down -- --registry-only'}\n`);
  else process.stderr.write(`[local-stack] already running ${took}; stop with: ${down}\n`);
  process.stdout.write(`KAFKA_BROKERS=${endpoints.brokers.join(',')}\n`);
  process.stdout.write(`SCHEMA_REGISTRY_URL=${endpoints.registryUrl}\n`);
  process.exit(0);
} catch (err) {
  process.stderr.write(`[local-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
