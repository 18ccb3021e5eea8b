import { readFile, readdir } from 'node:fs/promises';
import { join, relative } from 'node:path';
import { describe, expect, it } from 'vitest';
import { DEEP_FIXTURE, DEEP_FIXTURE_STEPS, deepTask } from '../../scripts/deep-dockerfile.ts';

async function filesUnder(dir: string): Promise<string[]> {
  const entries = await readdir(dir, { withFileTypes: true, recursive: true });
  return entries.filter((e) => e.isFile()).map((e) => relative(dir, join(e.parentPath, e.name)));
}

describe('the deep Dockerfile fixture', () => {
  it('is what scripts/deep-dockerfile.ts generates, file for file', async () => {
    const generated = deepTask(DEEP_FIXTURE_STEPS);
    expect((await filesUnder(DEEP_FIXTURE)).sort()).toEqual(Object.keys(generated).sort());
    for (const [path, text] of Object.entries(generated)) {
      expect(await readFile(join(DEEP_FIXTURE, path), 'utf8'), path).toBe(text);
    }
  });

  it('has 200 or more steps after FROM, RUN, COPY and ENV mixed', () => {
    const dockerfile = deepTask(DEEP_FIXTURE_STEPS)['environment/Dockerfile'] ?? '';
    const instructions = dockerfile.split('\n').filter((line) => /^[A-Z]+ /.test(line));
    expect(instructions[0]).toMatch(/^FROM /);
    expect(instructions.length - 1).toBeGreaterThanOrEqual(200);
    for (const kind of ['RUN', 'COPY', 'ENV']) {
      expect(instructions.filter((line) => line.startsWith(`${kind} `)).length).toBeGreaterThan(40);
    }
  });

  it('expects the count of files the steps leave, deletions subtracted', () => {
    // 20 steps: files at 3, 5-7, 9-11, 13, 14, 17, 18; step 15 deletes 3 and step 19 deletes 5
    const task = deepTask(20);
    expect(task['environment/Dockerfile']).toContain('RUN rm /deep/steps/0003\nRUN rm -rf /deep/dir');
    expect(task['tests/test.sh']).toContain('= "9 first last" ]');
  });
});
