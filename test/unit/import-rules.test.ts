import { mkdirSync, mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { dirname, join, resolve } from 'node:path';
import { afterEach, describe, expect, it } from 'vitest';
import { checkImports } from '../../scripts/import-rules.ts';

describe('import rules', () => {
  let root: string | undefined;

  afterEach(() => {
    if (root) rmSync(root, { recursive: true, force: true });
  });

  function tree(files: Record<string, string>): string {
    root = mkdtempSync(join(tmpdir(), 'sandgym-imports-'));
    for (const [path, text] of Object.entries(files)) {
      mkdirSync(dirname(join(root, path)), { recursive: true });
      writeFileSync(join(root, path), text);
    }
    return root;
  }

  it('hold for this repository', () => {
    expect(checkImports(resolve('.'))).toEqual([]);
  });

  it('catch an upward import, a reach into internals, a misplaced dependency and a cycle', () => {
    const problems = checkImports(
      tree({
        'src/common/index.ts': "import { x } from '../platform/index.ts';\n",
        'src/platform/index.ts': "export const x = 1;\nimport { y } from '../backends/internal/y.ts';\n",
        'src/backends/internal/y.ts': 'export const y = 1;\n',
        'src/env/a.ts': "import { b } from './b.ts';\nimport { spawn } from 'node:child_process';\n",
        'src/env/b.ts': "import { a } from './a.ts';\n",
      }),
    );
    expect(problems.join('\n')).toMatch(/common may not import from platform/);
    expect(problems.join('\n')).toMatch(/import src\/backends\/index\.ts instead/);
    expect(problems.join('\n')).toMatch(/processes are started in src\/backends/);
    expect(problems.join('\n')).toMatch(
      /import cycle: src\/env\/a\.ts -> src\/env\/b\.ts -> src\/env\/a\.ts/,
    );
  });
});
