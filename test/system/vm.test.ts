import { spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { join } from 'node:path';
import { describe, expect, it } from 'vitest';
import { CLI } from '../../examples/cluster/netns-cluster.ts';
import { STORE_DIR, TEST_DATA_ROOT } from '../support/platform.ts';

describe('vm: a full Debian under QEMU q35', () => {
  it('runs `sandgym run --backend vm` in the full image: its kernel, its systemd, the agent as a service', async () => {
    const dataDir = join(TEST_DATA_ROOT, `vm-cli-${randomBytes(4).toString('hex')}`);
    try {
      const script =
        'uname -r; cat /proc/1/comm; systemctl is-active sandgym-agent; ls /vms 2>/dev/null; true';
      const run = spawnSync('node', [CLI, 'run', '--backend', 'vm', '--', 'sh', '-c', script], {
        env: { ...process.env, SANDGYM_DATA_DIR: dataDir, SANDGYM_STORE: STORE_DIR },
        encoding: 'utf8',
        timeout: 600_000,
      });
      expect(run.status, run.stderr).toBe(0);
      const [kernel, init, agent] = run.stdout.trim().split('\n');
      expect(kernel).toMatch(/-amd64$/);
      expect(init).toBe('systemd');
      expect(agent).toBe('active');
      expect(spawnSync('ls', [join(dataDir, 'vms')]).stdout.toString()).toBe('');
    } finally {
      await rm(dataDir, { recursive: true, force: true });
    }
  });
});
