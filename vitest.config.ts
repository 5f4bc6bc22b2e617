import { defineConfig } from 'vitest/config';

export default defineConfig({
  test: {
    include: ['test/**/*.test.ts'],
    globalSetup: ['test/global-setup.ts'],
    setupFiles: ['test/setup.ts'],
    testTimeout: 60_000,
    hookTimeout: 180_000,
    // stopping the broker in global teardown can take a few seconds
    teardownTimeout: 60_000,
    // test files share one broker on a 2-core machine: one file at a time
    fileParallelism: false,
  },
});
