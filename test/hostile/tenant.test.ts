import { spawn, spawnSync } from 'node:child_process';
import { readdirSync, statSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { silentLogger } from '../../src/common/index.ts';
import { SandboxEnv } from '../../src/env/index.ts';
import { NodeAgent, Platform, type LocalPlatform, type RemotePlatform } from '../../src/platform/index.ts';
import {
  IN_PROCESS_NODE_TOKEN,
  startInProcessCluster,
  type InProcessCluster,
} from '../support/in-process-cluster.ts';
import { expectCode } from '../support/errors.ts';
import {
  STORE_DIR,
  createTestPlatform,
  smallVolumePlatform,
  type TestPlatform,
} from '../support/platform.ts';
import { attack } from './summary.ts';

const GRANTS = {
  'alpha-token-1f3e5d7c9b0a2468': { project: 'alpha', maxSandboxes: 20 },
  'beta-token-9e7c5a3f1d2b4680': { project: 'beta', maxSandboxes: 20 },
};

/** This process's resident memory: the node agent under test runs in it. */
function rssMib(): number {
  return process.memoryUsage.rss() / 2 ** 20;
}

/**
 * Tenants of one cluster: two projects behind a controller, one node. Nothing one project names,
 * builds or collects may reach the other's, and nothing an outsider sends may cost the node
 * before it proves who it is.
 */
describe('tenant isolation', () => {
  let nodeData: TestPlatform;
  let cluster: InProcessCluster;
  let alpha: RemotePlatform;
  let beta: RemotePlatform;

  beforeAll(async () => {
    nodeData = await createTestPlatform('hostile-tenant', { privateStore: true });
    cluster = await startInProcessCluster({
      dataDir: nodeData.dataDir,
      storeDir: join(nodeData.dataDir, 'store'),
      nodeId: 'tenantnode',
      grants: GRANTS,
    });
    alpha = await Platform.connect(cluster.url, { token: 'alpha-token-1f3e5d7c9b0a2468' });
    beta = await Platform.connect(cluster.url, { token: 'beta-token-9e7c5a3f1d2b4680' });
  });

  afterAll(async () => {
    for (const step of [
      () => alpha?.close(),
      () => beta?.close(),
      () => cluster?.close(),
      async () => nodeData?.[Symbol.asyncDispose](),
    ]) {
      await step()?.catch((error: unknown) => console.error(error));
    }
  });

  it("keeps each project's environments its own: listing, reading, booting and naming", () =>
    attack('tenant', 'read, boot and overwrite another project environment', async () => {
      await using mine = await alpha.createSandbox({ environment: 'busybox:latest' });
      await mine.writeFile('/answer.txt', 'alpha only\n');
      const { environment } = await alpha.packDiff(mine, { name: 'task-secret:latest' });
      expect((await alpha.listEnvironments()).map((e) => `${e.name}:${e.version}`)).toContain(
        'task-secret:latest',
      );
      expect((await beta.listEnvironments()).map((e) => `${e.name}:${e.version}`)).not.toContain(
        'task-secret:latest',
      );
      await expectCode(beta.getEnvironment('task-secret:latest'), 'not_found');
      await expectCode(beta.createSandbox({ environment: 'task-secret:latest' }), 'not_found');
      // beta packs its own sandbox under alpha's name: it gets an environment of its own
      await using theirs = await beta.createSandbox({ environment: 'busybox:latest' });
      await theirs.writeFile('/answer.txt', 'forged\n');
      await beta.packDiff(theirs, { name: 'task-secret:latest' });
      expect(await alpha.getEnvironment('task-secret:latest')).toEqual(environment);
      await using booted = await alpha.createSandbox({ environment: 'task-secret:latest' });
      expect((await booted.readFile('/answer.txt')).toString()).toBe('alpha only\n');
    }));

  it("never lets one project's layer gc take what another's graders or sandboxes use", () =>
    attack('tenant', 'layer gc under another project', async () => {
      await using agent = await alpha.createSandbox({ environment: 'busybox:latest' });
      await agent.writeFile('/work.txt', 'graded\n');
      // alpha's grader diff: a layer no environment names, between packing and booting
      const { layer } = await alpha.packDiff(agent, {});
      const report = await beta.layerGc({ minAgeMs: 0 });
      expect(report.removedLayers).not.toContain(layer.digest);
      // and the node's admin, collecting every project's, still leaves a layer just made
      const admin = await cluster.nodePlatform.layerGc({ minAgeMs: 0, allProjects: true });
      expect(admin.removedLayers).not.toContain(layer.digest);
      await beta.gc();
      await using grader = await alpha.createSandbox({
        environment: 'busybox:latest',
        extraLayers: [layer.digest],
      });
      expect((await grader.readFile('/work.txt')).toString()).toBe('graded\n');
      expect((await agent.exec(['echo', 'alive'])).stdout).toBe('alive\n');
    }));

  it('reads no request body before the caller proves who it is, and caps bodies per method', () =>
    attack('tenant', 'unauthenticated 90 MiB calls', async () => {
      const before = rssMib();
      // twelve callers at once, each with a 90 MiB WriteFile: without a token, then with one to a
      // method that takes 1 MiB
      const script = `
        const grpc = require(${JSON.stringify(resolve('node_modules/@grpc/grpc-js'))});
        const client = new grpc.Client(process.argv[1], grpc.credentials.createInsecure(),
          { 'grpc.max_send_message_length': 128 * 2 ** 20 });
        const body = Buffer.alloc(90 * 2 ** 20, 7);
        const call = (path, token) => new Promise((done) => {
          const metadata = new grpc.Metadata();
          if (token) metadata.set('authorization', 'Bearer ' + token);
          client.makeUnaryRequest(path, (b) => b, (b) => b, body, metadata, {}, (error) => done(error ? error.code : 0));
        });
        Promise.all([
          ...Array.from({ length: 12 }, () => call('/sandgym.v1.Sandboxes/WriteFile')),
          ...Array.from({ length: 4 }, () => call('/sandgym.v1.Sandboxes/Stats', process.argv[2])),
        ]).then((codes) => { console.log(JSON.stringify(codes)); client.close(); });
      `;
      const output = await new Promise<string>((done, fail) => {
        const child = spawn('node', ['-e', script, `127.0.0.1:${cluster.node.port}`, IN_PROCESS_NODE_TOKEN], {
          stdio: ['ignore', 'pipe', 'inherit'],
        });
        let text = '';
        child.stdout.on('data', (chunk: Buffer) => (text += chunk.toString()));
        child.on('exit', () => done(text));
        child.on('error', fail);
      });
      const codes = JSON.parse(output) as number[];
      expect(codes.slice(0, 12)).toEqual(Array.from({ length: 12 }, () => 16)); // UNAUTHENTICATED
      expect(codes.slice(12)).toEqual(Array.from({ length: 4 }, () => 8)); // RESOURCE_EXHAUSTED
      // 1.4 GB was sent; the node kept next to none of it
      expect(rssMib() - before).toBeLessThan(200);
    }));

  it('refuses to start a node agent on a weak token', () =>
    attack('tenant', 'weak node token', async () => {
      for (const token of ['secret', 'a'.repeat(64), 'abcdefghabcdefghabcdefghabcdefgh']) {
        await expectCode(
          NodeAgent.start(cluster.nodePlatform, { listen: '127.0.0.1:0', token, logger: silentLogger() }),
          'invalid_argument',
          /too weak/,
        );
      }
    }));

  it("keeps the node's data for root alone: trajectories, the volume image, the store", () =>
    attack('tenant', 'read node files as another user', async () => {
      // a step through the log: the node keeps its trajectory
      await using gym = SandboxEnv.create(alpha, { sandbox: { environment: 'busybox:latest' } });
      await gym.reset();
      await gym.step({ type: 'exec', command: ['echo', 'a private command'] });
      const dataDir = join(nodeData.dataDir, 'node');
      for (const dir of [dataDir, join(nodeData.dataDir, 'store')])
        expect((statSync(dir).mode & 0o777).toString(8), dir).toBe('700');
      expect((statSync(join(dataDir, 'sandboxes.img')).mode & 0o777).toString(8)).toBe('600');
      const trajectories = join(dataDir, 'trajectories');
      for (const file of readdirSync(trajectories))
        expect((statSync(join(trajectories, file)).mode & 0o777).toString(8), file).toBe('600');
      for (const path of [join(dataDir, 'sandboxes.img'), join(nodeData.dataDir, 'store', 'envs')]) {
        const read = spawnSync('setpriv', ['--reuid=65534', '--regid=65534', '--clear-groups', 'ls', path], {
          encoding: 'utf8',
        });
        expect(read.status, path).not.toBe(0);
        expect(read.stderr).toMatch(/Permission denied/);
      }
    }));
});

/** A node whose disk is small: the scratch volume must fail like a full disk, never like a broken one. */
describe('a small node volume', () => {
  let volume: Awaited<ReturnType<typeof smallVolumePlatform>>;
  let platform: LocalPlatform;

  beforeAll(async () => {
    volume = await smallVolumePlatform('smalldisk', 700);
    platform = volume.platform;
  });

  afterAll(async () => {
    await volume?.[Symbol.asyncDispose]();
  });

  it('sizes its default disk cap to the volume, refuses a cap it cannot hold, and fails full writes with ENOSPC', () =>
    attack('tenant', 'fill the node volume', async () => {
      await expectCode(
        platform.createSandbox({ environment: 'busybox:latest', resources: { diskMib: 10_240 } }),
        'resource_exhausted',
        /diskMib 10240 is more than .* holds/,
      );
      const neighbour = await platform.createSandbox({ environment: 'busybox:latest' });
      const filler = await platform.createSandbox({ environment: 'busybox:latest' });
      try {
        expect(filler.resources.diskMib).toBeLessThan(700);
        const fill = await filler.exec(
          ['sh', '-c', 'dd if=/dev/zero of=/fill bs=1M count=2000; echo rc=$?'],
          {
            timeoutMs: 120_000,
          },
        );
        expect(fill.stderr).toMatch(/No space left|quota exceeded/i);
        expect(fill.stderr).not.toMatch(/Input\/output error/i);
        const write = await neighbour.exec(['sh', '-c', 'echo hi > /x; cat /x'], { timeoutMs: 30_000 });
        expect(write.stderr).not.toMatch(/Input\/output error|Read-only/i);
        await expectCode(
          platform.createSandbox({ environment: 'busybox:latest' }),
          'admission_rejected',
          /volume is full/,
        );
        await filler.exec(['rm', '/fill']);
        await filler.exec(['sync']);
        expect((await neighbour.exec(['sh', '-c', 'echo again > /y && cat /y'])).stdout).toBe('again\n');
      } finally {
        await filler.close();
        await neighbour.close();
      }
    }));

  it('caps what a sandbox writes in the tar loading mode too', () =>
    attack('tenant', 'disk fill in tar mode', async () => {
      const tarMode = await Platform.local({
        dataDir: join(volume.mountPoint, 'tar-data'),
        storeDir: STORE_DIR,
        nodeId: 'tarmode',
        loadMode: 'tar',
      });
      try {
        await using sandbox = await tarMode.createSandbox({
          environment: 'busybox:latest',
          resources: { diskMib: 32 },
        });
        const fill = await sandbox.exec(['sh', '-c', 'dd if=/dev/zero of=/fill bs=1M count=100; echo rc=$?']);
        expect(fill.stderr).toMatch(/quota exceeded|No space left/i);
        expect((await sandbox.stats()).diskBytes).toBeLessThanOrEqual(32 * 2 ** 20);
      } finally {
        await tarMode.close();
      }
    }));
});
