import { describe, expect, it } from 'vitest';
import { checkHostName } from '../../src/platform/index.ts';

describe('host names bound for /etc/hosts', () => {
  it('takes the names compose services and hosts have', () => {
    for (const name of ['web', 'my_db', 'db-1', 'api.internal', 'A1', 'a'.repeat(63), `${'a'.repeat(63)}.b`])
      expect(checkHostName(name, 'Name')).toBe(name);
  });

  it('refuses what would add or bend a hosts line, naming what to use', () => {
    const hostile = [
      '',
      'web\n6.6.6.6 pypi.org',
      'web 6.6.6.6',
      'web\tpypi.org',
      'web#comment',
      'web\r',
      '-web',
      'web-',
      'a..b',
      '.web',
      'a'.repeat(64),
      Array.from({ length: 5 }, () => 'a'.repeat(60)).join('.'),
    ];
    for (const name of hostile)
      expect(() => checkHostName(name, 'Its service name')).toThrow(
        /^Its service name ".*" is not a host name: use letters, digits, "-", "_" and dots/,
      );
  });
});
