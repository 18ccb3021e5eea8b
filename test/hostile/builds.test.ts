import { mkdir, symlink, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';
import { attack } from './summary.ts';

/** A task author's build context is untrusted input too: nothing of the host may leave through it. */
describe('Dockerfile builds under attack', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('hostile-builds', { privateStore: true });
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  async function context(name: string, dockerfile: string): Promise<string> {
    const dir = join(env.dataDir, name);
    await mkdir(dir, { recursive: true });
    await writeFile(join(dir, 'Dockerfile'), dockerfile);
    return dir;
  }

  for (const [name, plant, dockerfile] of [
    ['a link to /etc/shadow', (dir: string) => symlink('/etc/shadow', join(dir, 'shadow')), 'COPY shadow /x'],
    [
      'a folder link out of the context',
      (dir: string) => symlink('/etc', join(dir, 'etc')),
      'COPY etc/shadow /x',
    ],
    ["a link to the context's parent", (dir: string) => symlink('..', join(dir, 'up')), 'ADD up/ /x/'],
  ] as const) {
    it(`refuses COPY/ADD through ${name}, naming the file and line`, () =>
      attack('build', `COPY through ${name}`, async () => {
        const dir = await context(
          `ctx-${Math.random().toString(36).slice(2, 8)}`,
          `FROM busybox:latest\n${dockerfile}\n`,
        );
        await plant(dir);
        await expectCode(
          env.platform.buildFromDockerfile({ file: join(dir, 'Dockerfile'), name: 'leak:1' }),
          'invalid_argument',
          /Dockerfile line 2: .* is outside the build context/,
        );
        expect(env.platform.store.hasEnvironment('leak:1')).toBe(false);
      }));
  }

  it('copies what a link inside the context points at inside it', async () => {
    const dir = await context('inside', 'FROM busybox:latest\nCOPY alias /data.txt\n');
    await writeFile(join(dir, 'real.txt'), 'inside\n');
    await symlink('real.txt', join(dir, 'alias'));
    const { environment } = await env.platform.buildFromDockerfile({
      file: join(dir, 'Dockerfile'),
      name: 'inside:1',
    });
    const sandbox = await env.platform.createSandbox({
      environment: `${environment.name}:${environment.version}`,
    });
    try {
      expect((await sandbox.readFile('/data.txt')).toString()).toBe('inside\n');
    } finally {
      await sandbox.close();
    }
  });
});
