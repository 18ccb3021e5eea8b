import { execFileSync } from 'node:child_process';
import { chmod, mkdir, writeFile } from 'node:fs/promises';
import { dirname, join } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { loadSweBenchFile, loadTasks } from '../../src/env/index.ts';
import { evaluate, nopAgent, oracleAgent, scriptedAgent } from '../../src/rollout/index.ts';
import { expectCode } from '../support/errors.ts';
import { createTestPlatform, debianMirrorRules, type TestPlatform } from '../support/platform.ts';

type Files = Record<string, string>;

async function writeFiles(root: string, files: Files): Promise<void> {
  for (const [path, text] of Object.entries(files)) {
    await mkdir(dirname(join(root, path)), { recursive: true });
    await writeFile(join(root, path), text);
  }
}

function git(dir: string, ...args: string[]): string {
  return execFileSync('git', ['-C', dir, '-c', 'user.name=t', '-c', 'user.email=t@t.invalid', ...args], {
    encoding: 'utf8',
  });
}

/**
 * A repository in a mirror folder under its published `owner/name`, with a SWE-bench row made
 * from it: the base commit, the gold patch and the test patch as diffs against it.
 */
async function publishedRow(
  mirror: string,
  repo: string,
  base: Files,
  gold: Files,
  tests: Files,
  ids: { failToPass: string[]; passToPass: string[] },
): Promise<Record<string, unknown>> {
  const dir = join(mirror, repo);
  await mkdir(dir, { recursive: true });
  git(dir, 'init', '-q');
  await writeFiles(dir, base);
  // scripts (a #! line) are executable in the repository, as bin/test and runtests.py are
  for (const [path, text] of Object.entries(base))
    if (text.startsWith('#!')) await chmod(join(dir, path), 0o755);
  git(dir, 'add', '-A');
  git(dir, 'commit', '-qm', 'base');
  const baseCommit = git(dir, 'rev-parse', 'HEAD').trim();
  const diffOf = async (files: Files): Promise<string> => {
    await writeFiles(dir, files);
    git(dir, 'add', '-A');
    const patch = git(dir, 'diff', '--cached', baseCommit);
    git(dir, 'reset', '-q', '--hard', baseCommit);
    return patch;
  };
  return {
    instance_id: `${repo.replace('/', '__')}-1`,
    repo,
    base_commit: baseCommit,
    patch: await diffOf(gold),
    test_patch: await diffOf(tests),
    problem_statement: `Fix the bug in ${repo}.`,
    FAIL_TO_PASS: JSON.stringify(ids.failToPass),
    PASS_TO_PASS: ids.passToPass,
    version: '1.0',
    environment_setup_commit: baseCommit,
  };
}

const SETUP_PY = (name: string) =>
  `from setuptools import setup\nsetup(name='${name}', version='0.0', packages=['${name}'])\n`;

/** Django's runner shape: test labels, unittest at verbosity 2, settings from tests/. */
const DJANGO_RUNTESTS = `#!/usr/bin/env python3
import argparse, os, sys, unittest
parser = argparse.ArgumentParser()
parser.add_argument('labels', nargs='*')
parser.add_argument('--verbosity', type=int, default=1)
parser.add_argument('--settings')
parser.add_argument('--parallel')
args = parser.parse_args()
here = os.path.dirname(os.path.abspath(__file__))
sys.path[:0] = [here, os.path.dirname(here)]
__import__(args.settings)
suite = unittest.defaultTestLoader.loadTestsFromNames(args.labels)
result = unittest.TextTestRunner(verbosity=args.verbosity).run(suite)
sys.exit(not result.wasSuccessful())
`;

/** sympy's bin/test shape: files, one line per test function, "ok" or a letter. */
const SYMPY_BIN_TEST = `#!/usr/bin/env python3
import importlib.util, os, sys, traceback
root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
sys.path.insert(0, root)
files = [a for a in sys.argv[1:] if not a.startswith('-')]
failed = False
for path in files:
    spec = importlib.util.spec_from_file_location('t', os.path.join(root, path))
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    for name in sorted(n for n in dir(module) if n.startswith('test_')):
        try:
            getattr(module, name)()
            print(name, 'ok')
        except AssertionError:
            print(name, 'F'); failed = True
        except Exception:
            print(name, 'E'); failed = True
sys.exit(1 if failed else 0)
`;

/** Published SWE-bench rows (owner/name repositories) graded by each repository's own runner. */
describe('SWE-bench rows as published', () => {
  let env: TestPlatform;
  let rowsFile: string;
  let mirror: string;

  beforeAll(async () => {
    env = await createTestPlatform('swebench-published', {
      privateStore: true,
      seed: ['debian:bookworm'],
      networkRules: await debianMirrorRules(),
    });
    mirror = join(env.dataDir, 'mirror');
    const django = await publishedRow(
      mirror,
      'django/django',
      {
        'setup.py': SETUP_PY('django'),
        'django/__init__.py': '',
        'django/text.py': 'def slugify(value):\n    return value.lower()\n',
        'tests/runtests.py': DJANGO_RUNTESTS,
        'tests/test_sqlite.py': 'DATABASES = {}\n',
        'tests/utils_tests/__init__.py': '',
        'tests/utils_tests/test_text.py':
          'import unittest\nfrom django.text import slugify\n\n\nclass TextTests(unittest.TestCase):\n    def test_lower(self):\n        self.assertEqual(slugify("AB"), "ab")\n',
      },
      { 'django/text.py': 'def slugify(value):\n    return value.lower().replace(" ", "-")\n' },
      {
        'tests/utils_tests/test_text.py':
          'import unittest\nfrom django.text import slugify\n\n\nclass TextTests(unittest.TestCase):\n    def test_lower(self):\n        self.assertEqual(slugify("AB"), "ab")\n\n    def test_spaces(self):\n        """Spaces become dashes."""\n        self.assertEqual(slugify("a b"), "a-b")\n',
      },
      {
        // the older form of a Django id; the runner prints the newer one on Python 3.11
        failToPass: ['test_spaces (utils_tests.test_text.TextTests)'],
        passToPass: ['test_lower (utils_tests.test_text.TextTests.test_lower)'],
      },
    );
    const sympy = await publishedRow(
      mirror,
      'sympy/sympy',
      {
        'setup.py': SETUP_PY('sympy'),
        'sympy/__init__.py': '',
        'sympy/ops.py': 'def half(n):\n    return n // 2\n',
        'bin/test': SYMPY_BIN_TEST,
        'sympy/tests/test_ops.py':
          'from sympy.ops import half\n\n\ndef test_even():\n    assert half(4) == 2\n',
      },
      { 'sympy/ops.py': 'def half(n):\n    return n / 2\n' },
      {
        'sympy/tests/test_ops.py':
          'from sympy.ops import half\n\n\ndef test_even():\n    assert half(4) == 2\n\n\ndef test_odd():\n    assert half(3) == 1.5\n',
      },
      { failToPass: ['test_odd'], passToPass: ['test_even'] },
    );
    rowsFile = join(env.dataDir, 'published.swebench.jsonl');
    await writeFile(rowsFile, `${JSON.stringify(django)}\n${JSON.stringify(sympy)}\n`);
  });

  afterAll(async () => {
    await env?.[Symbol.asyncDispose]();
  });

  it('finds owner/name in a mirror, installs its recipe, and reads its own runner as SWE-bench does', async () => {
    const tasks = await loadSweBenchFile(rowsFile, { mirrors: [mirror] });
    expect(tasks.map((t) => t.environment)).toMatchObject([
      {
        kind: 'workspace',
        repo: join(mirror, 'django/django'),
      },
      { kind: 'workspace', repo: join(mirror, 'sympy/sympy') },
    ]);
    const setup = tasks[0]?.environment.kind === 'workspace' ? tasks[0].environment.setup : undefined;
    expect(setup?.apt).toContain('python3-sqlparse');
    const oracle = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 1 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind, r.error])).toEqual([
      ['django__django-1', 1, 'ok', undefined],
      ['sympy__sympy-1', 1, 'ok', undefined],
    ]);
    expect(oracle[0]?.details?.['failToPass']).toEqual({
      'test_spaces (utils_tests.test_text.TextTests)': 'passed',
    });
    const nop = await evaluate(env.platform, tasks, nopAgent, { concurrency: 1 });
    expect(nop.map((r) => [r.reward, r.outcome.kind])).toEqual([
      [0, 'ok'],
      [0, 'ok'],
    ]);
    expect(nop[1]?.details?.['failToPass']).toEqual({ test_odd: 'failed' });
    // the recipe's install ran: the package is importable from anywhere, not only /testbed
    const installed = (await env.platform.store.listEnvironments()).find(
      (e) => e.name.startsWith('swe-django') && !e.version.endsWith('-checkout'),
    );
    await using sandbox = await env.platform.createSandbox({
      environment: `${installed?.name}:${installed?.version}`,
    });
    expect((await sandbox.exec(['python3', '-c', 'import django.text'], { cwd: '/' })).exitCode).toBe(0);
  });

  it("puts the repository's own runner back before it judges: a runner that says ok to all scores 0", async () => {
    const [django] = await loadSweBenchFile(rowsFile, { mirrors: [mirror] });
    const forged = scriptedAgent([
      {
        type: 'write_file',
        path: '/testbed/tests/runtests.py',
        content:
          "#!/usr/bin/env python3\nimport sys\nfor t in ['test_spaces (utils_tests.test_text.TextTests)', 'test_lower (utils_tests.test_text.TextTests)']:\n    print(t, '... ok', file=sys.stderr)\n",
      },
    ]);
    const [report] = await evaluate(env.platform, [django!], () => forged, { concurrency: 1 });
    expect([report?.reward, report?.outcome.kind]).toEqual([0, 'ok']);
  });

  it('grades a dozen fixture rows of one published-shape repository: every oracle passes, every nop fails', async () => {
    // owner/name found in the rows' own repos/ folder (a git bundle); ids of every pytest and unittest shape
    const tasks = await loadTasks([join(import.meta.dirname, '..', 'fixtures', 'tasks', 'swebench')]);
    expect(tasks).toHaveLength(12);
    const oracle = await evaluate(env.platform, tasks, oracleAgent, { concurrency: 2 });
    expect(oracle.map((r) => [r.task, r.reward, r.outcome.kind, r.error])).toEqual(
      tasks.map((t) => [t.id, 1, 'ok', undefined]),
    );
    const nop = await evaluate(env.platform, tasks, nopAgent, { concurrency: 2 });
    expect(nop.map((r) => [r.task, r.reward, r.outcome.kind])).toEqual(tasks.map((t) => [t.id, 0, 'ok']));
    // a parametrised pytest id fails on its own, not as its whole function
    expect(nop[1]?.details?.['failToPass']).toEqual({
      'tests/test_title_case.py::test_words[a b-A B]': 'failed',
      'tests/test_title_case.py::test_words[hello world-Hello World]': 'failed',
    });
  });

  it('says where it looked for a repository no mirror has', async () => {
    const row = JSON.stringify({
      instance_id: 'astropy__astropy-1',
      repo: 'astropy/astropy',
      base_commit: 'a'.repeat(40),
      patch: '',
      test_patch: 'diff --git a/x b/x\n',
      problem_statement: 'p',
      FAIL_TO_PASS: ['t'],
      PASS_TO_PASS: [],
    });
    const file = join(env.dataDir, 'missing.swebench.jsonl');
    await writeFile(file, `${row}\n`);
    await expectCode(
      loadSweBenchFile(file, { mirrors: [mirror] }),
      'invalid_argument',
      /line 1: repository astropy\/astropy is in no mirror .*SANDGYM_REPO_MIRRORS/,
    );
  });
});
