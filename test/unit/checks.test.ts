import { describe, expect, it } from 'vitest';
import { checkArgv, checkSandboxPath } from '../../src/backends/internal/checks.ts';
import { SandgymError, parseAt } from '../../src/common/index.ts';
import { parseEnvironmentRef } from '../../src/platform/index.ts';
import { sandboxRequestSchema } from '../../src/platform/sandbox-request.ts';

describe('input checks', () => {
  it('accept plain absolute paths and refuse the rest with a reason', () => {
    expect(() => checkSandboxPath('/work/a b/c.txt')).not.toThrow();
    expect(() => checkSandboxPath('/a/..')).toThrow(/".." component/);
    expect(() => checkSandboxPath('a/b')).toThrow(/must be absolute/);
    expect(() => checkSandboxPath('/a\0b')).toThrow(/NUL/);
    expect(() => checkSandboxPath('/a/..b')).not.toThrow();
  });

  it('refuse empty commands', () => {
    expect(() => checkArgv([])).toThrow(SandgymError);
    expect(() => checkArgv(['', 'x'])).toThrow(/Command is empty/);
    expect(() => checkArgv(['ls', '-l'])).not.toThrow();
  });

  it('fill sandbox request defaults and name every bad field', () => {
    const resolved = parseAt(sandboxRequestSchema, {}, 'sandbox request');
    expect(resolved).toMatchObject({ backend: 'container', environment: 'debian:bookworm', qos: 'latency' });
    // no diskMib: the node gives the default, or less when its volume holds less
    expect(resolved.resources).toEqual({
      cpu: 1,
      memoryMib: 512,
      pids: 512,
      outputCapBytes: 1048576,
    });
    expect(() =>
      parseAt(sandboxRequestSchema, { backend: 'lxc', resources: { cpu: -1 } }, 'sandbox request'),
    ).toThrow(/Invalid sandbox request: backend: .*; resources\.cpu: /);
  });

  it('parse environment references', () => {
    expect(parseEnvironmentRef('debian:bookworm')).toEqual({ name: 'debian', version: 'bookworm' });
    expect(parseEnvironmentRef('busybox')).toEqual({ name: 'busybox', version: 'latest' });
    expect(() => parseEnvironmentRef('a:b:c')).toThrow(/name:version/);
  });
});

describe('OJ output comparison', () => {
  it('ignores trailing spaces and trailing blank lines, nothing else', async () => {
    const { normaliseOutput } = await import('../../src/env/index.ts');
    expect(normaliseOutput('3  \n6\n\n')).toBe(normaliseOutput('3\n6'));
    expect(normaliseOutput(' 3\n6')).not.toBe(normaliseOutput('3\n6'));
    expect(normaliseOutput('3\n\n6')).not.toBe(normaliseOutput('3\n6'));
  });
});
