import { mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { afterEach, beforeEach, describe, expect, it } from 'vitest';
import { ServedEnvRecords, type ServedEnvRecord } from '../../src/env/served-env-records.ts';

const RECORD: ServedEnvRecord = {
  envId: 'env-node1-abcdefghijkl',
  project: 'alpha',
  spec: { kind: 'task', path: 'hello-file' },
  limits: { network: [] },
  episode: { sandboxId: 'sg-node1-abcdefghijkl', episodeId: 'e1', deadlineAt: 1 },
};

/** What a node reads back of its envs after a crash: only whole records, each under its own name. */
describe('served env records', () => {
  let dir: string;
  let records: ServedEnvRecords;

  beforeEach(async () => {
    dir = await mkdtemp(join(tmpdir(), 'served-envs-'));
    records = new ServedEnvRecords(dir);
  });

  afterEach(() => rm(dir, { recursive: true, force: true }));

  it('reads back what it wrote, and forgets what it removed', async () => {
    await records.write(RECORD);
    expect(await records.list()).toEqual([RECORD]);
    await records.write({ ...RECORD, episode: { sandboxId: 'sg-node1-mnopqrstuvwx', episodeId: 'e2' } });
    expect((await records.list())[0]?.episode?.sandboxId).toBe('sg-node1-mnopqrstuvwx');
    await records.remove(RECORD.envId);
    expect(await records.list()).toEqual([]);
    expect(await readdir(dir)).toEqual([]);
  });

  it('skips a record cut short, of another shape, or filed under another env', async () => {
    await records.write(RECORD);
    const whole = JSON.stringify(RECORD);
    await writeFile(join(dir, 'env-node1-cutcutcutcut.json'), whole.slice(0, whole.length / 2));
    await writeFile(
      join(dir, 'env-node1-shapeshapesh.json'),
      JSON.stringify({ ...RECORD, envId: 'env-node1-shapeshapesh', project: 42 }),
    );
    // a copy of alpha's record under another id must not make a second env of the same sandbox
    await writeFile(join(dir, 'env-node1-copycopycopy.json'), whole);
    expect(await records.list()).toEqual([RECORD]);
  });

  it('refuses to write or remove outside its folder', async () => {
    await expect(records.write({ ...RECORD, envId: '../escape' })).rejects.toThrow();
    await records.remove('../../etc/passwd');
    expect(await readdir(dir)).toEqual([]);
  });
});
