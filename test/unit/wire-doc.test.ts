import { readFileSync } from 'node:fs';
import { describe, expect, it } from 'vitest';
import { NODE, RUNS, SANDBOXES, STATUS_OF_CODE } from '../../src/platform/wire/index.ts';

const doc = readFileSync(new URL('../../docs/wire.md', import.meta.url), 'utf8');

describe('docs/wire.md', () => {
  it('lists every service, method and error code the code defines', () => {
    for (const service of [SANDBOXES, RUNS, NODE]) {
      expect(doc).toContain(service.name);
      for (const method of Object.keys(service.methods)) expect(doc, method).toContain(`\`${method}\``);
    }
    for (const code of Object.keys(STATUS_OF_CODE)) expect(doc, code).toContain(`\`${code}\``);
  });
});
