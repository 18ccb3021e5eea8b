import { mkdtempSync, mkdirSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { SandboxCgroup, sandboxCgroupPath, type CgroupLayout } from '../../src/backends/host/cgroups.ts';

describe('sandbox cgroup paths by CPU class', () => {
  let root: string | undefined;

  afterEach(() => {
    if (root) rmSync(root, { recursive: true, force: true });
    root = undefined;
  });

  it('puts best-effort sandboxes under a top-level parent of their own', () => {
    const latency = sandboxCgroupPath('scope1', 'sb-1', 'latency');
    const bestEffort = sandboxCgroupPath('scope1', 'sb-1', 'best_effort');
    expect(latency).toBe('sandgym/scope1/sb-1');
    // the classes part at the root: an idle parent there ranks the whole subtree below the host
    expect(bestEffort.split('/')[0]).not.toBe(latency.split('/')[0]);
    expect(bestEffort.endsWith('/scope1/sb-1')).toBe(true);
  });

  it('tells the class of a sandbox found on the node by the parent that holds it', () => {
    root = mkdtempSync(join(tmpdir(), 'sandgym-cgroup-paths-'));
    const layout: CgroupLayout = {
      kind: 'v1',
      controllers: { cpu: join(root, 'cpu'), memory: join(root, 'memory'), pids: join(root, 'pids') },
      unified: undefined,
    };
    const made = new SandboxCgroup(layout, 'scope1', 'sb-idle', 'best_effort');
    mkdirSync(join(root, 'pids', made.relativePath), { recursive: true });
    expect(SandboxCgroup.existing(layout, 'scope1', 'sb-idle').qos).toBe('best_effort');
    expect(SandboxCgroup.existing(layout, 'scope1', 'sb-idle').relativePath).toBe(made.relativePath);
    // one with no folder in the best-effort parent is (or was) latency-sensitive
    mkdirSync(join(root, 'pids', sandboxCgroupPath('scope1', 'sb-busy', 'latency')), { recursive: true });
    expect(SandboxCgroup.existing(layout, 'scope1', 'sb-busy').qos).toBe('latency');
  });
});
