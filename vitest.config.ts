import { defineConfig } from 'vitest/config';

// unit: pure logic. integration: real sandboxes, real layers, the real CLI; system: several
// processes over network namespaces, and the hostile suite (attacks, with a neighbour's latency
// measured, so nothing else runs beside it). Integration and system need root and
// `npm run prepare-host` (the test script runs it). The leak check runs after everything.
export default defineConfig({
  test: {
    // the hostile suite's totals print last, after the leak check's verdict
    globalSetup: ['test/hostile/summary.ts', 'test/support/leak-check.ts'],
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
      {
        // several processes and network namespaces per test: one file at a time, after the rest
        test: {
          name: 'system',
          include: ['test/system/**/*.test.ts', 'test/hostile/**/*.test.ts'],
          testTimeout: 300_000,
          hookTimeout: 180_000,
          maxWorkers: 1,
          sequence: { groupOrder: 2 },
        },
      },
    ],
  },
});
