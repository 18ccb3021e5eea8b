import { describe, expect, it } from 'vitest';
import { benchCommand } from '../../src/cli/commands/bench.ts';
import { BENCH_FLAGS, BENCHMARKS } from '../../benchmarks/index.ts';

describe('benchmark flags', () => {
  it('are known for cluster-scale, which is a benchmark', () => {
    expect(Object.keys(BENCHMARKS)).toContain('cluster-scale');
    expect(BENCH_FLAGS['cluster-scale']).toEqual(
      expect.arrayContaining(['nodes', 'processes', 'creates', 'in-flight', 'projects', 'hold']),
    );
  });

  it('are refused for a benchmark that takes none, and when unknown, before anything runs', async () => {
    await expect(benchCommand(['create', '--nodes', '160'])).rejects.toThrow(
      /--nodes is not a flag of create/,
    );
    await expect(benchCommand(['cluster-scale', '--bogus', '1'])).rejects.toThrow(/unknown option --bogus/);
    await expect(benchCommand(['cluster-scale', '--nodes'])).rejects.toThrow(/--nodes/);
  });
});
