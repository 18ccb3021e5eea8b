import { describe, expect, it } from 'vitest';
import { isSandboxId, newSandboxId, nodeOfSandboxId } from '../../src/common/index.ts';
import { taskStorageStem } from '../../src/env/index.ts';

describe('sandbox ids', () => {
  it('encode the owning node', () => {
    const id = newSandboxId('node7');
    expect(isSandboxId(id)).toBe(true);
    expect(nodeOfSandboxId(id)).toBe('node7');
  });

  it('are unique', () => {
    const ids = new Set(Array.from({ length: 1000 }, () => newSandboxId('local')));
    expect(ids.size).toBe(1000);
  });

  it('reject malformed ids and node names with a message naming them', () => {
    expect(() => nodeOfSandboxId('container-1')).toThrow(/"container-1" is not a sandbox id/);
    expect(() => newSandboxId('Bad Node')).toThrow(/Node id "Bad Node"/);
  });
});

describe('task storage names', () => {
  it('differ for tasks of one folder name in two suites, and for names differing in case', () => {
    const a = taskStorageStem('task', { id: 'hello', source: '/suite-a/hello' });
    const b = taskStorageStem('task', { id: 'hello', source: '/suite-b/hello' });
    const c = taskStorageStem('task', { id: 'Hello', source: '/suite-a/Hello' });
    expect(new Set([a, b, c]).size).toBe(3);
    expect(a).toMatch(/^task-hello-[0-9a-f]{8}$/);
    expect(taskStorageStem('task', { id: 'hello', source: '/suite-a/hello' })).toBe(a);
  });
});
