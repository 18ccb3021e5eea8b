import { spawn, spawnSync } from 'node:child_process';
import { randomBytes } from 'node:crypto';
import { cp, mkdir, mkdtemp, readFile, readdir, rm, symlink, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import { afterAll, beforeAll, describe, expect, it } from 'vitest';
import { allDocSamples, where, type DocSample } from '../support/doc-blocks.ts';
import { installedEnv, packAndInstall, runOk, type InstalledPackage } from '../support/package.ts';

/**
 * Docs that cannot rot (see test/support/doc-blocks.ts for the markers): every TypeScript sample
 * type-checks against the packed package and parses on the Node that `engines` names, every shell
 * and Python sample parses, and the runnable ones run, page by page, in one shell each, from a
 * fresh copy of the checkout with the packed CLI on PATH, as a reader following the page would.
 */

const CHECKOUT = resolve('.');
const TSC = join(CHECKOUT, 'node_modules', 'typescript', 'bin', 'tsc');
const DEBIAN_PATH = '/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin';
/** The project's Python, which has gymnasium for python/README's Gymnasium sample. */
const PYTHON = join(CHECKOUT, '.venv', 'bin', 'python');

/** A user's strict ES module project, compiled without downlevelling so Node sees the syntax as written. */
const ESM_TSCONFIG = {
  compilerOptions: {
    target: 'esnext',
    module: 'nodenext',
    strict: true,
    types: ['node'],
    outDir: 'out',
    rootDir: '.',
  },
  include: ['samples/*.ts'],
};

/** The module settings of CommonJS TypeScript projects, which must not type-check an import of sandgym. */
const COMMONJS_PROJECTS = {
  nodenext: { module: 'nodenext' },
  node10: { module: 'commonjs', moduleResolution: 'node10' },
};

function fileName(sample: DocSample): string {
  return `${sample.page.replace(/[/.]/g, '-')}-${sample.line}`;
}

/** tsc's `samples/README-md-64.ts(3,5): error …` as `README.md:67: error …`, the place in the doc. */
function inDocTerms(tscOutput: string, samples: DocSample[]): string {
  return tscOutput.replace(
    /(?:[^\s(]*\/)?samples\/([\w-]+)\.ts\((\d+),\d+\)/g,
    (whole, name: string, line: string) => {
      const sample = samples.find((candidate) => fileName(candidate) === name);
      return sample ? `${sample.page}:${sample.line + Number(line)}` : whole;
    },
  );
}

function stopGroup(leader: number): void {
  try {
    process.kill(-leader, 'SIGTERM');
  } catch {
    // the group is gone: the usual case
  }
}

function tsc(project: string) {
  const result = spawnSync(process.execPath, [TSC, '-p', project], { encoding: 'utf8', timeout: 300_000 });
  return { status: result.status, output: `${result.stdout}${result.stderr}` };
}

describe('the samples of README.md, docs/ and python/README.md', () => {
  let work: string;
  let installed: InstalledPackage;
  let samples: DocSample[];
  let compiled: { status: number | null; output: string };
  let env: NodeJS.ProcessEnv;

  beforeAll(async () => {
    work = await mkdtemp(join(tmpdir(), 'sandgym-docs-'));
    samples = await allDocSamples(CHECKOUT);
    installed = await packAndInstall(work);
    const { project } = installed;
    // @types/node of the Node line `engines` names (the checkout's dev dependency pins it), not
    // whatever newer one a dependency brought along
    const typesNode = join(project, 'node_modules', '@types', 'node');
    await rm(typesNode, { recursive: true, force: true });
    await mkdir(join(project, 'node_modules', '@types'), { recursive: true });
    await symlink(join(CHECKOUT, 'node_modules', '@types', 'node'), typesNode);
    await mkdir(join(project, 'samples'));
    for (const sample of samples.filter((s) => s.language === 'ts')) {
      // a block is a module even when it imports nothing, so top-level await type-checks
      await writeFile(join(project, 'samples', `${fileName(sample)}.ts`), `${sample.code}export {};\n`);
    }
    await writeFile(join(project, 'tsconfig.json'), JSON.stringify(ESM_TSCONFIG));
    compiled = tsc(project);
  }, 600_000);

  /** Process groups of sessions still running: a session cut short by its timeout is stopped here. */
  const sessions = new Set<number>();

  afterAll(async () => {
    for (const group of sessions) stopGroup(group);
    if (work) await rm(work, { recursive: true, force: true });
  });

  it('marks at least one sample of each kind runnable', () => {
    const runnable = new Set(samples.filter((s) => s.runnable).map((s) => s.language));
    expect([...runnable].sort()).toEqual(['python', 'sh', 'ts']);
  });

  it('type-checks every TypeScript sample against the packed package, in a strict ES module project', () => {
    expect(compiled.status, inDocTerms(compiled.output, samples)).toBe(0);
  });

  it('has the Node that `engines` names parse every TypeScript sample as written', async () => {
    const engines = (JSON.parse(await readFile('package.json', 'utf8')) as { engines: { node: string } })
      .engines.node;
    const oldest = /^>=(\d+)\./.exec(engines)?.[1];
    expect(
      process.versions.node.split('.')[0],
      `run the doc test on Node ${oldest}, the oldest engines accepts`,
    ).toBe(oldest);
    const failures = samples
      .filter((sample) => sample.language === 'ts')
      .map((sample) => {
        const js = join(installed.project, 'out', 'samples', `${fileName(sample)}.js`);
        const check = spawnSync(process.execPath, ['--check', js], { encoding: 'utf8' });
        return check.status === 0
          ? ''
          : `${where(sample)}: Node ${process.version} cannot parse it:\n${check.stderr}`;
      })
      .filter(Boolean);
    expect(failures.join('\n')).toBe('');
  });

  it('parses every shell and Python sample', async () => {
    const failures: string[] = [];
    for (const sample of samples.filter((s) => s.language !== 'ts')) {
      const file = join(work, `${fileName(sample)}.parse`);
      await writeFile(file, sample.code);
      const check =
        sample.language === 'sh'
          ? spawnSync('bash', ['-n', file], { encoding: 'utf8' })
          : spawnSync('python3', ['-c', 'import ast, sys; ast.parse(open(sys.argv[1]).read())', file], {
              encoding: 'utf8',
            });
      if (check.status !== 0) failures.push(`${where(sample)}: ${check.stderr}`);
    }
    expect(failures.join('\n')).toBe('');
  });

  it('is ESM-only as README.md says: a CommonJS TypeScript project fails to type-check an import of it', async () => {
    for (const [name, options] of Object.entries(COMMONJS_PROJECTS)) {
      const project = join(work, `commonjs-${name}`);
      await mkdir(project);
      await symlink(join(installed.project, 'node_modules'), join(project, 'node_modules'));
      await writeFile(
        join(project, 'package.json'),
        JSON.stringify({ name: 'cjs-job', private: true, type: 'commonjs' }),
      );
      await writeFile(
        join(project, 'job.ts'),
        "import { Platform } from 'sandgym';\nexport const local = Platform.local;\n",
      );
      await writeFile(
        join(project, 'tsconfig.json'),
        JSON.stringify({
          compilerOptions: { ...options, strict: true, types: ['node'], noEmit: true, skipLibCheck: true },
          files: ['job.ts'],
        }),
      );
      const checked = tsc(project);
      // type-checking would be a lie: at runtime `require('sandgym')` fails (no CommonJS entry)
      expect(checked.status, `${name}: ${checked.output}`).not.toBe(0);
      expect(checked.output, name).toMatch(/job\.ts\(1,\d+\): error TS\d+: .*'sandgym'/);
    }
  });

  describe('run from a fresh copy of the checkout, page by page', () => {
    const pages = ['README.md', 'docs/training.md', 'python/README.md'];

    beforeAll(() => {
      // as README.md says: `npx sandgym setup` in the project, here into a data folder of the test's own
      env = installedEnv(join(work, 'data'));
      runOk(join(installed.project, 'node_modules', '.bin', 'sandgym'), ['setup'], {
        cwd: installed.project,
        env,
      });
    }, 600_000);

    it('leaves no page with runnable samples out of this list', () => {
      expect([...new Set(samples.filter((s) => s.runnable).map((s) => s.page))].sort()).toEqual(
        [...pages].sort(),
      );
    });

    it.each(pages)('runs the runnable samples of %s in order, in one shell', async (page) => {
      const clone = await freshCopy(join(work, `clone-${page.replace(/[/.]/g, '-')}`));
      const script = sessionScript(
        samples.filter((s) => s.page === page && s.runnable),
        clone,
      );
      const { status, output, at } = await runSession(script, clone, {
        ...env,
        // a fresh Debian machine's PATH (not this host's pyenv shims), and the packed CLI first
        PATH: `${join(installed.project, 'node_modules', '.bin')}:${DEBIAN_PATH}`,
        PYTHONPATH: join(clone, 'python'),
      });
      expect(status, `${at ?? page}: the sample failed:\n${output}`).toBe(0);
    });
  });

  /** The checkout as a clone has it, but for python/, copied so that building it leaves the checkout clean. */
  async function freshCopy(clone: string): Promise<string> {
    await mkdir(clone);
    for (const entry of await readdir(CHECKOUT)) {
      if (['.git', '.sandgym', '.venv', 'node_modules', 'python'].includes(entry)) continue;
      await symlink(join(CHECKOUT, entry), join(clone, entry));
    }
    await cp(join(CHECKOUT, 'python'), join(clone, 'python'), {
      recursive: true,
      filter: (path) => !/__pycache__|\.egg-info|\/build$/.test(path),
    });
    return clone;
  }

  /**
   * One bash script for a page's runnable samples: shell ones as they are, TypeScript ones as tsc
   * emitted them, Python ones by the project's interpreter. Each first writes its `page:line` to
   * $SANDGYM_DOC_AT, so a failure names the sample; servers a sample leaves are stopped at the end.
   */
  function sessionScript(pageSamples: DocSample[], clone: string): string {
    const lines = [
      'set -eo pipefail',
      `trap 'status=$?; servers=$(jobs -pr); [ -z "$servers" ] || kill $servers; wait; exit $status' EXIT`,
    ];
    for (const sample of pageSamples) {
      lines.push(`echo '${where(sample)}' > "$SANDGYM_DOC_AT"`);
      if (sample.language === 'sh') lines.push(sample.code);
      if (sample.language === 'ts') {
        lines.push(`node '${join(installed.project, 'out', 'samples', `${fileName(sample)}.js`)}'`);
      }
      if (sample.language === 'python') {
        const file = join(clone, `.${fileName(sample)}.py`);
        lines.push(
          `cat > '${file}' <<'SANDGYM_DOC_EOF'`,
          sample.code + 'SANDGYM_DOC_EOF',
          `'${PYTHON}' '${file}'`,
        );
      }
      if (sample.serves) {
        const [host, port] = sample.serves.split(':');
        lines.push(
          `until (exec 3<>/dev/tcp/${host}/${port}) 2>/dev/null; do`,
          `  [ -n "$(jobs -pr)" ] || { echo '${where(sample)} stopped before serving ${sample.serves}' >&2; exit 1; }`,
          '  sleep 0.2',
          'done',
        );
      }
    }
    return `${lines.join('\n')}\n`;
  }

  /**
   * Runs a page's script in a network namespace of its own (loopback only), so the ports its
   * samples name cannot meet another test's, in its own process group, all stopped in the end.
   */
  async function runSession(script: string, cwd: string, sessionEnv: NodeJS.ProcessEnv) {
    const netns = `sgdocs-${randomBytes(3).toString('hex')}`;
    const at = join(work, `${netns}.at`);
    const file = join(work, `${netns}.sh`);
    await writeFile(file, script);
    runOk('ip', ['netns', 'add', netns]);
    try {
      runOk('ip', ['-n', netns, 'link', 'set', 'lo', 'up']);
      const child = spawn('nsenter', [`--net=/var/run/netns/${netns}`, 'bash', file], {
        cwd,
        env: { ...sessionEnv, SANDGYM_DOC_AT: at },
        stdio: ['ignore', 'pipe', 'pipe'],
        detached: true,
      });
      sessions.add(child.pid!);
      let output = '';
      child.stdout.on('data', (chunk: Buffer) => (output += chunk.toString()));
      child.stderr.on('data', (chunk: Buffer) => (output += chunk.toString()));
      try {
        const status = await new Promise<number | null>((done) => child.once('close', done));
        const last = await readFile(at, 'utf8').catch(() => undefined);
        return { status, output, at: last?.trim() };
      } finally {
        stopGroup(child.pid!); // whatever the script left, should it have been cut short
        sessions.delete(child.pid!);
      }
    } finally {
      spawnSync('ip', ['netns', 'delete', netns]);
    }
  }
});
