import { execFileSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { Platform, type RemotePlatform, type Sandbox } from '../../src/platform/index.ts';
import { SANDBOXES, WireClient } from '../../src/platform/wire/index.ts';
import { startInProcessCluster, type InProcessCluster } from '../support/in-process-cluster.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

const TOKENS = { alpha: 'alpha-paths-token-4c1e9a7b3d5f2086', beta: 'beta-paths-token-8d2f6b0a4c1e9375' };
const GRANTS = {
  [TOKENS.alpha]: { project: 'alpha', maxSandboxes: 30 },
  [TOKENS.beta]: { project: 'beta', maxSandboxes: 30 },
};
const NODE_ID = 'pathsnode';
const BUSYBOX = 'busybox:latest';
/** Enough `..` to climb from any folder of the node to `/`. */
const toHost = (absolute: string): string => `${'../'.repeat(40)}${absolute.slice(1)}`;

/**
 * A tenant naming paths of the node through request fields that are paths, not ids: a diff's
 * excluded, reported and hidden paths, the prefixes of a written-paths audit (with a symlink
 * swapped in while it walks), and what layer gc and admission say of other projects. Beta holds
 * only its controller token; alpha is another project on the same node. Found by a red-team pass.
 */
describe('tenants naming paths of the node', () => {
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;
  let alpha: RemotePlatform;
  let beta: RemotePlatform;
  /** Beta's raw client of the controller: any message, beta's token. */
  let betaWire: WireClient<typeof SANDBOXES>;
  let secretBox: Sandbox;
  let nodeDir: string;
  let storeDir: string;

  beforeAll(async () => {
    nodeData = await createTestPlatform('hostile-tenant-paths', { privateStore: true });
    nodeDir = join(nodeData.dataDir, 'node');
    storeDir = join(nodeData.dataDir, 'store');
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir,
      nodeId: NODE_ID,
      grants: GRANTS,
      node: { maxSandboxes: 12 },
    });
    alpha = await Platform.connect(cluster.url, { token: TOKENS.alpha });
    beta = await Platform.connect(cluster.url, { token: TOKENS.beta });
    betaWire = new WireClient(`127.0.0.1:${cluster.controller.port}`, SANDBOXES, { token: TOKENS.beta });
    secretBox = await alpha.createSandbox({ environment: BUSYBOX });
    await secretBox.writeFile('/alpha-secret-name.txt', 'alpha only\n');
    await alpha.packDiff(secretBox, { name: 'alpha-private-env:v7' });
  });

  afterAll(async () => {
    betaWire?.close();
    await secretBox?.close().catch(() => undefined);
    await alpha?.close().catch(() => undefined);
    await beta?.close().catch(() => undefined);
    await cluster?.close().catch(() => undefined);
    await nodeData?.[Symbol.asyncDispose]();
  });

  it("refuses diff paths that climb out of the diff, and leaves alpha's layer as it was", () =>
    attack('tenant', 'diff paths out of the diff', async () => {
      await using victim = await alpha.createSandbox({ environment: BUSYBOX });
      // alpha replaces /etc with its own: the new upper /etc is opaque
      await victim.exec(['sh', '-c', 'rm -rf /etc && mkdir /etc && echo mine > /etc/only']);
      const slot = join(nodeDir, 'sandboxes', victim.id);
      const upperEtc = join(slot, 'rw/upper/etc');
      await using own = await beta.createSandbox({ environment: BUSYBOX });
      const climbing = [
        toHost(join(slot, 'rw/upper/etc')) + '/x',
        toHost(join(slot, 'rw')),
        toHost(join(storeDir, 'projects/alpha/envs/alpha-private-env/v7.json')),
        'etc/../../x',
        '/etc/shadow',
      ];
      for (const field of ['excludePaths', 'reportPaths', 'hiddenPaths'])
        for (const path of climbing)
          await expectCode(
            betaWire.call('PackDiff', { sandboxId: own.id, [field]: [path] }),
            'invalid_argument',
            /\.\.|relative/,
          );
      const opaque = execFileSync(
        'sh',
        ['-c', 'getfattr --only-values -n trusted.overlay.opaque "$1" 2>/dev/null || true', 'sh', upperEtc],
        { encoding: 'utf8' },
      );
      expect(opaque).toBe('y');
      expect(existsSync(join(slot, 'rw/upper'))).toBe(true);
      // alpha packs its sandbox as it left it, but for what every diff leaves out: /etc/hosts and
      // /etc/hostname are the platform's (written anew at each start), and leaving them out of an
      // opaque /etc lets the image's own /etc through beneath alpha's file (group, passwd)
      await alpha.packDiff(victim, { name: 'victim-after:v1' });
      await using again = await alpha.createSandbox({ environment: 'victim-after:v1' });
      expect((await again.exec(['ls', '/etc'])).stdout).toBe('group\nhostname\nhosts\nonly\npasswd\n');
      expect((await again.exec(['cat', '/etc/only'])).stdout).toBe('mine\n');
    }));

  it('never lists a host folder through a symlink swapped in while written paths are walked', () =>
    attack('tenant', 'written paths through a swapped symlink', async () => {
      await using own = await beta.createSandbox({ environment: BUSYBOX });
      const target = join(nodeDir, 'sandboxes', secretBox.id, 'rw/upper');
      await own.exec([
        'sh',
        '-c',
        `mkdir -p /x/a && cd /x/a && i=0; while [ $i -lt 1000 ]; do mkdir d$i; i=$((i+1)); done; mkdir /x/z; ln -s '${target}' /x/zl`,
      ]);
      const swapper = own.exec(
        [
          'sh',
          '-c',
          'end=$(( $(date +%s) + 20 )); while [ $(date +%s) -lt $end ] && [ ! -e /stop ]; do mv /x/z /x/zt; mv /x/zl /x/z; usleep 15000; mv /x/z /x/zl; mv /x/zt /x/z; usleep 15000; done',
        ],
        { timeoutMs: 60_000 },
      );
      const seen = new Set<string>();
      for (let attempt = 0; attempt < 40; attempt++)
        for (const path of (
          await betaWire.call('WrittenPaths', { sandboxId: own.id, prefixes: ['/x'], limit: 4096 })
        ).paths)
          seen.add(path);
      await own.exec(['touch', '/stop']);
      await swapper;
      expect([...seen].filter((path) => path.includes('alpha-secret'))).toEqual([]);
      // the honest view: what beta wrote, the link reported as a link
      expect(seen).toContain('/x/zl');
    }));

  it("keeps a tenant's layer gc to its own project: no node-wide unmounts, no other project's paths", () =>
    attack('tenant', 'layer gc as a tenant', async () => {
      {
        await using box = await alpha.createSandbox({ environment: 'alpha-private-env:v7' });
        await box.exec(['true']);
      }
      const report = await betaWire.call('LayerGc', { minAgeMs: 0 });
      expect(report.unmounted).toEqual([]);
      expect(report.removedCopies).toEqual([]);
      expect(JSON.stringify(report)).not.toContain(nodeDir);
    }));

  it("says a node is full without counting other projects' sandboxes", () =>
    attack('tenant', 'admission counts', async () => {
      await using own = await beta.createSandbox({ environment: BUSYBOX });
      const error: unknown = await betaWire
        .call('ForkInMemory', { sandboxId: own.id, count: 20 })
        .catch((e: unknown) => e);
      const message = (error as Error).message;
      expect(message).toMatch(/no room for 20 more sandboxes/);
      expect(message).not.toMatch(/\d+ of \d+/);
    }));

  it('treats an environment named build like any other (honest twin)', async () => {
    await using base = await beta.createSandbox({ environment: BUSYBOX });
    await base.writeFile('/tool.txt', 'tool\n');
    await beta.packDiff(base, { name: 'build:v1' });
    await using box = await beta.createSandbox({ environment: 'build:v1' });
    expect(box.labels['environment']).toBe('build:v1');
    const child = await beta.packDiff(box, { name: 'build-child:v1' });
    expect(child.environment?.description).toContain('build:v1');
  });
});
