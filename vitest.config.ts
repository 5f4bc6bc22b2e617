import { defineConfig } from 'vitest/config';

// Options every test file runs with, given to each project below. The global setup is the root's alone: vitest
// runs it once, whichever projects' files run.
const common = {
  setupFiles: ['test/setup.ts'],
  testTimeout: 60_000,
  hookTimeout: 180_000,
};

export default defineConfig({
  test: {
    // Run once, by the root project, whichever projects' files run; what it provides reaches every project.
    globalSetup: ['test/global-setup.ts'],
    // stopping the broker in global teardown can take a few seconds
    teardownTimeout: 60_000,
    projects: [
      {
        test: {
          ...common,
          name: 'unit',
          include: ['test/unit/**/*.test.ts'],
          // No broker, so two files at a time, one per core. Vitest runs this group before the serial one below.
          maxWorkers: 2,
        },
      },
      {
        test: {
          ...common,
          name: 'integration',
          include: ['test/integration/**/*.test.ts', 'test/package/**/*.test.ts'],
          // test files share one broker on a 2-core machine: one file at a time
          fileParallelism: false,
        },
      },
    ],
  },
});
