import { describe, expect, it } from 'vitest';
import { compared, quantile, quantilesAgainst } from '../../benchmarks/report.ts';

describe('benchmark reports', () => {
  it('take nearest-rank quantiles', () => {
    const samples = Array.from({ length: 100 }, (_, i) => i + 1);
    expect(quantile(samples, 0.5)).toBe(50);
    expect(quantile(samples, 0.99)).toBe(99);
    expect(quantile([3, 1, 2], 0.5)).toBe(2);
  });

  it('state each figure against its baseline as value / baseline', () => {
    expect(compared(2, 8)).toEqual({ value: 2, unit: 'ms', baseline: 8, ratio: 0.25 });
    const metrics = quantilesAgainst('exec', [1, 1, 1], { nsenter: [2, 2, 2], crun_exec: [4, 4, 4] });
    expect(Object.keys(metrics).sort()).toEqual([
      'exec_p50_ms_vs_crun_exec',
      'exec_p50_ms_vs_nsenter',
      'exec_p99_ms_vs_crun_exec',
      'exec_p99_ms_vs_nsenter',
    ]);
    expect(metrics['exec_p50_ms_vs_crun_exec']?.ratio).toBe(0.25);
  });
});
