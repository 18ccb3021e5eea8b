import { defineConfig } from 'vitest/config';

// unit: pure logic. integration: real sandboxes, real layers, the real CLI; needs root and
// `npm run prepare-host` (the test script runs it). The leak check runs after everything.
export default defineConfig({
  test: {
    globalSetup: ['test/support/leak-check.ts'],
    projects: [
      { test: { name: 'unit', include: ['test/unit/**/*.test.ts'], sequence: { groupOrder: 0 } } },
      {
        test: {
          name: 'integration',
          include: ['test/integration/**/*.test.ts'],
          testTimeout: 120_000,
          hookTimeout: 120_000,
          // Two cores: more than two files at once only adds contention.
          maxWorkers: 2,
          sequence: { groupOrder: 1 },
        },
      },
    ],
  },
});
