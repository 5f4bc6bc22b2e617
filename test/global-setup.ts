// vitest globalSetup: make sure a Kafka broker and a schema registry are there
// (start them with src/testing/local-stack.ts unless KAFKA_BROKERS is set or they
// already run), hand their addresses to the test workers, and stop in teardown
// only what this run started.
import type { TestProject } from 'vitest/node';
import { ensureStack } from '../src/testing/local-stack.ts';

declare module 'vitest' {
  interface ProvidedContext {
    kafkaBrokers: string;
    schemaRegistryUrl: string;
  }
}

export default async function setup(project: TestProject): Promise<() => Promise<void>> {
  const t0 = Date.now();
  const stack = await ensureStack({ log: (line) => console.log(`[local-stack] ${line}`) });
  const brokers = stack.endpoints.brokers.join(',');
  // Workers are forked after globalSetup, so they inherit these; inject() is the documented channel.
  process.env['KAFKA_BROKERS'] = brokers;
  if (stack.endpoints.registryUrl !== '') process.env['SCHEMA_REGISTRY_URL'] = stack.endpoints.registryUrl;
  project.provide('kafkaBrokers', brokers);
  project.provide('schemaRegistryUrl', stack.endpoints.registryUrl);
  console.log(
    `[local-stack] ${stack.started ? 'started' : 'using'} KAFKA_BROKERS=${brokers} SCHEMA_REGISTRY_URL=${stack.endpoints.registryUrl} (${((Date.now() - t0) / 1000).toFixed(1)} s)`,
  );
  return async () => {
    await stack.stop();
  };
}
