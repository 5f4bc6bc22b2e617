// npm run kafka:down — stop the broker(s) and registry started by kafka:up (or by a
// test run that was interrupted), found through the pid files in .cache/run.
// `npm run kafka:down -- --brokers 3` stops the three-node stack of
// `npm run kafka:up -- --brokers 3` (.cache/run-3). `--registry-only` stops the registry alone; `--secure` stops
// the secure stack, `--secure --registry-only` its registry alone.
import { join, resolve } from 'node:path';

const argv = process.argv.slice(2);
if (argv.includes('--secure')) {
  // the secure stack of `npm run kafka:up -- --secure` (.cache/run-secure, src/testing/secure-stack.ts)
  const { stopSecureStack } = await import('../src/testing/secure-stack.ts');
  try {
    // --registry-only: the registry a `kafka:up -- --secure` started again for a broker others use
    const { broker, registry } = await stopSecureStack({ registryOnly: argv.includes('--registry-only') });
    const parts = [...(broker === undefined ? [] : [`secure broker (pid ${broker})`]), ...(registry === undefined ? [] : [`secure registry (pid ${registry})`])];
    process.stdout.write(parts.length > 0 ? `stopped ${parts.join(', ')}\n` : 'nothing to stop\n');
    process.exit(0);
  } catch (err) {
    process.stderr.write(`[secure-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
    process.exit(1);
  }
}
const i = argv.findIndex((a) => a === '--brokers' || a.startsWith('--brokers='));
const brokers = i < 0 ? '1' : argv[i]!.includes('=') ? argv[i]!.slice('--brokers='.length) : argv[i + 1];
if (brokers !== '1' && brokers !== '3') {
  process.stderr.write(`[local-stack] --brokers must be 1 or 3, got ${String(brokers)}\n`);
  process.exit(2);
}
if (brokers === '3') process.env['WRIT_LOCAL_STACK_DIR'] ??= join(resolve(import.meta.dirname, '..'), '.cache', 'run-3');
const { stopStack } = await import('../src/testing/local-stack.ts');

try {
  // --registry-only: the registry a `kafka:up` started again for a broker others use
  const { broker, nodes, registry } = await stopStack({ registryOnly: argv.includes('--registry-only') });
  const parts: string[] = [];
  if (broker !== undefined) parts.push(`broker (pid ${broker})`);
  for (const [id, pid] of Object.entries(nodes ?? {})) parts.push(`broker node ${id} (pid ${pid})`);
  if (registry !== undefined) parts.push(`registry (pid ${registry})`);
  process.stdout.write(parts.length > 0 ? `stopped ${parts.join(', ')}\n` : 'nothing to stop\n');
  process.exit(0);
} catch (err) {
  process.stderr.write(`[local-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
