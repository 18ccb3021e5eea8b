import { readdirSync } from 'node:fs';
import { join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { TaskEnv, loadTasks } from '../../src/env/index.ts';
import { checkTask } from '../../src/rollout/index.ts';
import { createTestPlatform, type TestPlatform } from '../support/platform.ts';

/**
 * Tasks in the shapes published harnesses' tasks take where sandgym once graded them otherwise
 * than their harness (a daemon or tunnel the agent leaves running, an ENTRYPOINT that starts a
 * server, a `localhost` server, a stub that does not compile, hidden folders the Dockerfile made
 * empty, a 200-step Dockerfile, a healthcheck, `allowed_hosts`, env templates): each must pass
 * every check of `sandgym check`, as their authors would run it.
 */
const CHECKED = join(import.meta.dirname, '..', 'fixtures', 'tasks', 'checked');

describe('sandgym check on tasks shaped like published ones', () => {
  let env: TestPlatform;

  beforeAll(async () => {
    env = await createTestPlatform('fixture-check');
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  for (const name of readdirSync(CHECKED).sort()) {
    it(`passes ${name}`, async () => {
      const [task] = await loadTasks([join(CHECKED, name)]);
      await TaskEnv.create(env.platform, task!).prepare();
      const results = await checkTask(env.platform, task!);
      expect(results.filter((r) => !r.passed)).toEqual([]);
      // a 200-step Dockerfile builds in ~100 s on two cores: past the suite's default limit
    }, 600_000);
  }
});
