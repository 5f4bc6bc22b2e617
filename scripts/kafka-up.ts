// npm run kafka:up — start (or reuse) the local Kafka broker and Apicurio registry
// and leave them running. Prints the env lines to export.
import { hideKafkajsTimeoutWarning } from '../src/node-warnings.ts';
import { ensureStack } from './local-stack.ts';

hideKafkajsTimeoutWarning();

const t0 = Date.now();
try {
  const { endpoints, started } = await ensureStack();
  process.stderr.write(
    `[local-stack] ${started ? 'started' : 'already running'} in ${((Date.now() - t0) / 1000).toFixed(1)} s; stop with: npm run kafka:down\n`,
  );
  process.stdout.write(`KAFKA_BROKERS=${endpoints.brokers.join(',')}\n`);
  process.stdout.write(`SCHEMA_REGISTRY_URL=${endpoints.registryUrl}\n`);
  process.exit(0);
} catch (err) {
  process.stderr.write(`[local-stack] failed: ${err instanceof Error ? err.message : String(err)}\n`);
  process.exit(1);
}
