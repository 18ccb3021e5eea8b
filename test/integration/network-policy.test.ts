import { execFileSync } from 'node:child_process';
import { createServer, type Server } from 'node:net';
import { readFileSync, readdirSync } from 'node:fs';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadHarborTask, type Verifier } from '../../src/env/index.ts';
import type { Sandbox } from '../../src/platform/index.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { startUpstream, type Upstream } from '../support/upstream.ts';

/** A GET of `url` in busybox (wget) or Debian (python3) environments. */
function getCommand(url: string): string {
  const python = `import sys, urllib.request; print(urllib.request.urlopen(sys.argv[1], timeout=3).read().decode(), end='')`;
  return `if command -v wget >/dev/null; then timeout 5 wget -O - ${url} 2>/dev/null; else python3 -c "${python}" ${url} 2>/dev/null; fi`;
}

/** What a GET of the upstream's /id printed, or `refused` and the exit code. */
async function fetchId(sandbox: Sandbox, address: string, port: number): Promise<string> {
  const result = await sandbox.exec(
    ['sh', '-c', `${getCommand(`http://${address}:${port}/id`)} || echo refused $?`],
    {
      timeoutMs: 10_000,
    },
  );
  return result.stdout.trim();
}

describe('network policy', () => {
  let env: TestPlatform;
  let upstream: Upstream;
  let hostListener: Server;
  let hostPort = 0;

  beforeAll(async () => {
    upstream = await startUpstream(1, [8080, 8081]);
    env = await createTestPlatform('network', {
      networkRules: { 'mirror:test': [`${upstream.address}:8080`] },
    });
    hostListener = createServer((socket) => socket.end('host secret\n'));
    await new Promise<void>((resolve) => hostListener.listen(0, '0.0.0.0', resolve));
    hostPort = (hostListener.address() as { port: number }).port;
  });

  afterAll(async () => {
    hostListener?.close();
    // this platform's own subnet: other test files' platforms (a build with network) may hold theirs
    const [record] = readdirSync(join(env.dataDir, 'networks'));
    const { subnet } = JSON.parse(readFileSync(join(env.dataDir, 'networks', record!), 'utf8')) as {
      subnet: number;
    };
    // by interface index, which the kernel never hands out again soon: another file's platform
    // may take the freed subnet, and its bridge the same name, the moment this one is gone
    const ours = new RegExp(`^(\\d+): sg(br${subnet}\\b|v${subnet}x)`, 'gm');
    const indexes = [...execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' }).matchAll(ours)].map(
      (m) => m[1],
    );
    expect(indexes.length).toBeGreaterThan(0);
    await env?.[Symbol.asyncDispose]();
    await upstream?.[Symbol.asyncDispose]();
    // the node network goes with the platform
    const links = execFileSync('ip', ['-o', 'link'], { encoding: 'utf8' });
    for (const index of indexes) expect(links).not.toMatch(new RegExp(`^${index}: `, 'm'));
    expect(execFileSync('nft', ['list', 'tables'], { encoding: 'utf8' })).not.toMatch(
      new RegExp(`\\bsandgym${subnet}\\b`),
    );
  });

  it('gives loopback only by default, and counts what tries to leave', async () => {
    const sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      expect((await sandbox.exec(['ip', '-o', 'link'])).stdout).not.toContain('eth0');
      expect(await fetchId(sandbox, upstream.address, 8080)).toMatch(/^refused/);
      expect((await sandbox.stats()).deniedEgress).toBeGreaterThanOrEqual(1);
    } finally {
      await sandbox.close();
    }
  });

  it('reaches what its rules name and nothing else: not other ports, not the node', async () => {
    const sandbox = await env.platform.createSandbox({
      environment: 'busybox:latest',
      network: ['mirror:test'],
    });
    try {
      expect(await fetchId(sandbox, upstream.address, 8080)).toBe('port 8080');
      expect(await fetchId(sandbox, upstream.address, 8081)).toMatch(/^refused/);
      const gateway = (
        await sandbox.exec(['sh', '-c', "ip route | awk '/default/ {print $3}'"])
      ).stdout.trim();
      expect(gateway).toMatch(/^100\.(6[4-9]|[7-9]\d|1[01]\d|12[0-7])\./);
      const host = await sandbox.exec(['sh', '-c', `nc -w 2 ${gateway} ${hostPort} </dev/null; echo rc=$?`], {
        timeoutMs: 10_000,
      });
      expect(host.stdout).not.toContain('host secret');
      expect((await sandbox.stats()).deniedEgress).toBeGreaterThanOrEqual(2);
    } finally {
      await sandbox.close();
    }
  });

  it('switches rules between stages without restarting the sandbox', async () => {
    const sandbox = await env.platform.createSandbox({
      environment: 'busybox:latest',
      network: ['mirror:test'],
    });
    try {
      await sandbox.exec(['sh', '-c', 'sleep 300 >/dev/null 2>&1 & echo $! > /tmp/witness']);
      const witness = (await sandbox.readFile('/tmp/witness')).toString().trim();
      expect(await fetchId(sandbox, upstream.address, 8080)).toBe('port 8080');

      await sandbox.setNetwork([]); // the agent stage: nothing
      const before = (await sandbox.stats()).deniedEgress;
      expect(await fetchId(sandbox, upstream.address, 8080)).toMatch(/^refused/);
      expect((await sandbox.stats()).deniedEgress).toBeGreaterThan(before);

      await sandbox.setNetwork([`host:${upstream.address}:8081`]); // another stage, another rule
      expect(await fetchId(sandbox, upstream.address, 8081)).toBe('port 8081');
      expect(await fetchId(sandbox, upstream.address, 8080)).toMatch(/^refused/);
      expect((await sandbox.exec(['kill', '-0', witness])).exitCode).toBe(0);
    } finally {
      await sandbox.close();
    }
  });

  it('keeps sandboxes with egress apart from each other', async () => {
    const [a, b] = await Promise.all(
      [0, 1].map(() =>
        env.platform.createSandbox({ environment: 'busybox:latest', network: ['mirror:test'] }),
      ),
    );
    try {
      const addressOfA = (
        await a!.exec(['sh', '-c', "ip -o -4 addr show eth0 | awk '{print $4}' | cut -d/ -f1"])
      ).stdout.trim();
      await a!.exec(['sh', '-c', 'mkdir -p /srv && echo a > /srv/id && httpd -p 9000 -h /srv']);
      expect(await fetchId(a!, '127.0.0.1', 9000)).toBe('a');
      expect(await fetchId(b!, addressOfA, 9000)).toMatch(/^refused/);
    } finally {
      await Promise.all([a?.close(), b?.close()]);
    }
  });

  it('gives a task stage by stage: setup and verify reach the mirror, the agent does not', async () => {
    const task = {
      ...(await loadHarborTask(resolve(import.meta.dirname, '../../examples/tasks/hello-file'))),
      network: { setup: ['mirror:test'], agent: [], verify: ['mirror:test'] },
      setupScript: `${getCommand(`http://${upstream.address}:8080/id`)} > /root/from-setup`,
    };
    const seenByGrader: string[] = [];
    const probe: Verifier = async ({ grader }, next) => {
      seenByGrader.push(await fetchId(grader, upstream.address, 8080));
      return next();
    };
    await using taskEnv = TaskEnv.create(env.platform, task, { verifiers: [probe] });
    const reset = await taskEnv.reset();
    expect(reset.info.network).toEqual({ stage: 'agent', rules: [] });
    const sandbox = taskEnv.sandbox!;
    expect((await sandbox.readFile('/root/from-setup')).toString()).toBe('port 8080\n');
    const step = await taskEnv.step({
      type: 'exec',
      command: ['sh', '-c', `${getCommand(`http://${upstream.address}:8080/id`)} || true`],
    });
    expect(step.observation).toMatchObject({ type: 'exec' });
    expect(JSON.stringify(step.observation)).not.toContain('port 8080');
    const grade = await taskEnv.grade();
    expect(seenByGrader).toEqual(['port 8080']);
    expect(grade.deniedEgress).toBeGreaterThanOrEqual(1);
  });

  it('refuses a rule the node does not define, naming it, before creating anything', async () => {
    await expectCode(
      env.platform.createSandbox({ environment: 'busybox:latest', network: ['pypi'] }),
      'invalid_argument',
      /"pypi" is not defined on this node/,
    );
    const sandbox = await env.platform.createSandbox({ environment: 'busybox:latest' });
    try {
      await expectCode(sandbox.setNetwork(['cidr:10.0.0.0/33']), 'invalid_argument', /not an address/);
    } finally {
      await sandbox.close();
    }
  });
});
