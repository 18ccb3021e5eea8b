import { existsSync } from 'node:fs';
import { lstat, readdir } from 'node:fs/promises';
import { isAbsolute, join } from 'node:path';
import { z } from 'zod';
import { SandgymError, resolveBeneath } from '../../common/index.ts';

/** How a repository's own test runner is run, and how its log reads. */
export interface RepoTestRunner {
  /** Which log format: Django's unittest lines or sympy's bin/test lines. */
  parser: 'django' | 'sympy';
  /** The shell command, run in the repository; `{tests}` becomes the targets. */
  command: string;
  /** What the targets are: Django test labels from the test patch's files, or those files. */
  targets: 'django-labels' | 'files';
  /** Files of the runner itself, put back as they were at the base commit before it runs. */
  harness: string[];
}

/**
 * What a repository needs beyond the base environment, as SWE-bench's per-repository
 * specifications say, in Debian terms: packages from the mirror (its Python libraries as
 * `python3-*` packages), an install that downloads nothing, and its own test runner where its
 * test ids are not unittest or pytest names.
 */
export interface RepoRecipe {
  apt: string[];
  install?: string;
  runner?: RepoTestRunner;
}

/** An editable install that builds with what is installed and fetches nothing. */
const EDITABLE_INSTALL =
  'PIP_BREAK_SYSTEM_PACKAGES=1 python3 -m pip install --no-deps --no-build-isolation --no-index -e .';
const PIP = ['python3-pip', 'python3-setuptools', 'python3-wheel'];

export const REPO_RECIPES: Readonly<Record<string, RepoRecipe>> = {
  'django/django': {
    apt: [...PIP, 'python3-asgiref', 'python3-sqlparse', 'python3-tz'],
    install: EDITABLE_INSTALL,
    runner: {
      parser: 'django',
      command: './tests/runtests.py --verbosity 2 --settings=test_sqlite --parallel 1 {tests}',
      targets: 'django-labels',
      harness: ['tests/runtests.py', 'tests/test_sqlite.py'],
    },
  },
  'sympy/sympy': {
    apt: [...PIP, 'python3-mpmath'],
    install: EDITABLE_INSTALL,
    runner: {
      parser: 'sympy',
      command: 'bin/test -C --verbose {tests}',
      targets: 'files',
      harness: ['bin/test'],
    },
  },
  'psf/requests': {
    apt: [...PIP, 'python3-urllib3', 'python3-idna', 'python3-chardet', 'python3-certifi'],
    install: EDITABLE_INSTALL,
  },
  'pallets/flask': {
    apt: [...PIP, 'python3-werkzeug', 'python3-jinja2', 'python3-itsdangerous', 'python3-click'],
    install: EDITABLE_INSTALL,
  },
  'pytest-dev/pytest': {
    apt: [
      ...PIP,
      'python3-setuptools-scm',
      'python3-iniconfig',
      'python3-pluggy',
      'python3-packaging',
      'python3-attr',
    ],
    install: EDITABLE_INSTALL,
  },
  'sphinx-doc/sphinx': {
    apt: [
      ...PIP,
      'python3-docutils',
      'python3-jinja2',
      'python3-pygments',
      'python3-babel',
      'python3-imagesize',
      'python3-snowballstemmer',
      'python3-alabaster',
      'python3-requests',
      'python3-packaging',
    ],
    install: EDITABLE_INSTALL,
  },
  'pylint-dev/pylint': {
    apt: [
      ...PIP,
      'python3-astroid',
      'python3-isort',
      'python3-mccabe',
      'python3-platformdirs',
      'python3-tomlkit',
      'python3-dill',
    ],
    install: EDITABLE_INSTALL,
  },
  'pydata/xarray': {
    apt: [...PIP, 'python3-numpy', 'python3-pandas', 'python3-packaging'],
    install: EDITABLE_INSTALL,
  },
  'mwaskom/seaborn': {
    apt: [...PIP, 'python3-numpy', 'python3-pandas', 'python3-matplotlib', 'python3-scipy'],
    install: EDITABLE_INSTALL,
  },
};

/** Where `owner/name` may sit in a mirror folder. */
function mirrorCandidates(mirror: string, repo: string): string[] {
  const flat = repo.replace('/', '__');
  return [repo, `${repo}.git`, `${repo}.bundle`, flat, `${flat}.git`, `${flat}.bundle`].map((p) =>
    join(mirror, p),
  );
}

/** Where SWE-bench rows' repositories are found: mirror folders, and a URL to clone from. */
export interface RepoSources {
  /** Folders holding `owner/name` (or `owner__name`) clones or bundles. Default: $SANDGYM_REPO_MIRRORS (":"-separated). */
  mirrors?: readonly string[];
  /** A URL with `{repo}` in it (`https://git.example/{repo}.git`). Default: $SANDGYM_REPO_URL. */
  urlTemplate?: string;
}

export function repoSourcesFromEnv(env: NodeJS.ProcessEnv = process.env): RepoSources {
  const mirrors = (env['SANDGYM_REPO_MIRRORS'] ?? '').split(':').filter(Boolean);
  const urlTemplate = env['SANDGYM_REPO_URL'];
  return { mirrors, ...(urlTemplate ? { urlTemplate } : {}) };
}

/** Files by which a git store borrows another's objects or refs: a host repository's, say. */
const BORROWING = ['objects/info/alternates', 'objects/info/http-alternates', 'commondir'];

/**
 * A repository of the rows' own folder, checked to hold everything a clone takes: a bundle (one
 * regular file), or a git folder with no symlink anywhere in its store (a pack linked to a host
 * repository's would be copied) and no file that borrows another store (`alternates`,
 * `commondir`, a `.git` file naming another folder). Operator mirrors are not checked: theirs.
 */
async function selfContained(path: string, what: string): Promise<string> {
  const refuse = (why: string): never => {
    throw new SandgymError('invalid_argument', `${what}: the repository ${why}`);
  };
  const top = await lstat(path);
  if (top.isFile()) return path;
  if (!top.isDirectory()) refuse('is neither a git bundle nor a git folder');
  const dotGit = join(path, '.git');
  const store = existsSync(dotGit) ? dotGit : path;
  const walk = async (dir: string): Promise<void> => {
    for (const entry of await readdir(dir, { withFileTypes: true })) {
      if (entry.isSymbolicLink()) refuse('holds a symlink in its git store');
      if (entry.isDirectory()) await walk(join(dir, entry.name));
    }
  };
  if (!(await lstat(store)).isDirectory()) refuse('has a .git that is no folder');
  await walk(store);
  for (const file of BORROWING)
    if (existsSync(join(store, file))) refuse(`borrows another repository's store (${file})`);
  return path;
}

/**
 * A row's `repo`: `owner/name` as published rows have it (neither part `.` or `..`), or a
 * relative path to a clone or bundle inside the rows' folder. Never an absolute path or one that
 * climbs out: a row is data someone else wrote, and the repository it names is copied into an
 * image.
 */
const OWNER_NAME = /^(?!\.\.?\/)[A-Za-z0-9_.-]+\/(?!\.\.?$)[A-Za-z0-9_.-]+$/;
export const repoField = z
  .string()
  .min(1)
  .refine((repo) => !isAbsolute(repo), "repo is owner/name or a path inside the rows' folder, never absolute")
  .refine(
    (repo) => !repo.split('/').includes('..'),
    'repo is owner/name or a path inside the rows\' folder, never one climbing out with ".."',
  );

/**
 * Where a row's `repo` is: a path inside the rows' folder that exists (found there, a symlink
 * may not lead out); else, for an `owner/name`, a clone or bundle in a mirror folder (the rows'
 * own `repos/` folder first, also found beneath the rows' folder; then the operator's mirrors);
 * else the URL template. Nothing found is an error that says where it looked and what to set.
 */
export async function resolveRepository(
  repo: string,
  rowsDir: string,
  sources: RepoSources,
  where: string,
): Promise<string> {
  const what = `${where}: repo`;
  if (isAbsolute(repo) || repo.split('/').includes('..'))
    throw new SandgymError(
      'invalid_argument',
      `${what} ${repo} must be owner/name or a path inside ${rowsDir}`,
    );
  // what the rows' own folder holds is theirs: found beneath it, never through a link out
  const asPath = await resolveBeneath(rowsDir, repo, what);
  if (existsSync(asPath)) return selfContained(asPath, what);
  if (!OWNER_NAME.test(repo))
    throw new SandgymError(
      'invalid_argument',
      `${where}: repo ${repo} is neither a path that exists nor owner/name`,
    );
  for (const candidate of mirrorCandidates('repos', repo)) {
    const path = await resolveBeneath(rowsDir, candidate, what);
    if (existsSync(path)) return selfContained(path, what);
  }
  const mirrors = [join(rowsDir, 'repos'), ...(sources.mirrors ?? [])];
  const found = (sources.mirrors ?? []).flatMap((m) => mirrorCandidates(m, repo)).find((p) => existsSync(p));
  if (found) return found;
  if (sources.urlTemplate) return sources.urlTemplate.replaceAll('{repo}', repo);
  throw new SandgymError(
    'invalid_argument',
    `${where}: repository ${repo} is in no mirror (looked for ${repo}, ${repo}.git or ${repo}.bundle in ${mirrors.join(', ')}); put a clone there, list mirror folders in SANDGYM_REPO_MIRRORS, or set SANDGYM_REPO_URL (e.g. https://git.example/{repo}.git)`,
  );
}
