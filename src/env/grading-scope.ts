import { posix } from 'node:path';
import type { InterpreterFacts } from './python-probe.ts';

/**
 * Paths the grader takes from the task's own layers, never from the agent's diff; an agent's
 * edit to any of them is a tamper signal. Beyond the tests and reward path, this is
 * everything the verifier runs with: interpreters and libraries (a replaced /bin/bash or a
 * /usr/local/bin/python3 first on PATH would forge a pass), the dynamic loader's config, and git's
 * own configuration (hooks, filters and fsmonitor commands run code on a plain `git diff`).
 */
// Not /solution: the solution itself never enters a sandbox but the oracle's, and some tasks ask
// the agent to write its answer there, so what is under it is the agent's work.
const PROTECTED = [
  'tests',
  'logs/verifier',
  'bin',
  'sbin',
  'lib',
  'lib32',
  'lib64',
  'libx32',
  'usr/bin',
  'usr/sbin',
  'usr/lib',
  'usr/lib32',
  'usr/lib64',
  'usr/libexec',
  'usr/local/bin',
  'usr/local/sbin',
  'etc/ld.so.preload',
  'etc/ld.so.conf',
  'etc/ld.so.conf.d',
  'etc/ld.so.cache',
  // which modules the C library loads for name lookups (a relative one is found from the cwd)
  'etc/nsswitch.conf',
  'etc/gitconfig',
  'root/.gitconfig',
  'root/.config/git',
  // where graders stage their own files (the SWE-bench runner and test patch)
  'sandgym-runner',
];

/** The same, as the sandbox sees them: what each step's audit watches. */
export const PROTECTED_PATHS = PROTECTED.map((path) => `/${path}`);

/**
 * Left out of every graded diff without being tampering: what tools keep in a home folder
 * (caches, user-installed programs and interpreters, the user site-packages), which a verifier's
 * own tooling reads (`uvx` finds its interpreters and wheels there; a test script sources
 * ~/.local/bin/env) and which is never the work itself.
 */
const HOME_TOOL_DIRS =
  '^(root|home/[^/]+)/\\.(local|cache|cargo|rustup|npm|nvm|pyenv|bun|deno|gitconfig|config/git)(/|$)';

/**
 * Start-up hooks and caches, wherever they are (mkfs.erofs regular expressions, POSIX ERE, over
 * paths relative to the root): Python's sitecustomize and usercustomize in any form (source,
 * bytecode, extension, package) and Perl's, .pth files (run at every interpreter start), entry
 * point tables (pytest loads the plugins they name), bytecode caches (a planted .pyc with its
 * source's stamp would run instead of the source), and pytest's configuration at the root, the
 * one folder above /tests.
 */
const HOOK_PATTERNS = [
  // shared libraries the loader's cache finds there (official Python images keep libpython there)
  '^usr/local/lib/[^/]+\\.so(\\.[0-9.]*)?$',
  '(^|/)(sitecustomize|usercustomize)(\\.[^/]*)?(/|$)',
  '\\.pth$',
  '(^|/)[^/]+\\.(dist|egg)-info/entry_points\\.txt$',
  '(^|/)__pycache__(/|$)',
  '^(conftest\\.py|pytest\\.ini|\\.pytest\\.ini|pyproject\\.toml|tox\\.ini|setup\\.cfg)$',
  HOME_TOOL_DIRS,
];

/**
 * What only a grader holds: the tests, the solution, the logs (the reward among them) and
 * sandgym's own harness. A link of the agent's into any of them is left out of its diff.
 */
const HIDDEN = ['tests', 'solution', 'logs', 'sandgym-runner'];

/**
 * Modules of the test harness (beside the standard library, which the grader's import guard
 * covers the same way): one the agent leaves in its workdir, where `python -m pytest` would find
 * it first, never runs in the harness (see harness/sandgym_import_guard.py) and is reported as
 * tampering.
 */
const HARNESS_MODULES = ['pytest', '_pytest', 'pluggy', 'py', 'iniconfig', 'unittest', 'doctest'];

/** What packDiff takes out of an agent's diff for grading, and what it reports as tampering. */
export interface GradingScope {
  excludePaths: string[];
  excludeRegexes: string[];
  reportPaths: string[];
  hiddenPaths: string[];
}

/** The scope before anything is known of the environment's interpreters. */
export const BASE_SCOPE: GradingScope = {
  excludePaths: PROTECTED,
  excludeRegexes: HOOK_PATTERNS,
  reportPaths: PROTECTED,
  hiddenPaths: HIDDEN,
};

/** The workdir paths where a module of the harness would shadow the real one. */
function shadowingPaths(workdir: string): string[] {
  const dir = workdir.replace(/^\/+|\/+$/g, '');
  return HARNESS_MODULES.flatMap((name) => [`${name}.py`, name]).map((entry) =>
    dir ? `${dir}/${entry}` : entry,
  );
}

/**
 * The grading scope of an environment: the fixed protected paths and hooks, plus what a probe of a
 * clean sandbox found (see {@link probeInterpreters}) outside the agent's own folders (`workdir`
 * and below, where the work is): every folder on PATH, every module the interpreter can import
 * from its module path (so a file of the diff can neither replace nor shadow pytest, say), and
 * the modules its start-up asks for but does not find. `extraExcluded` adds task-specific paths
 * (a SWE-bench repository's .git).
 */
export function gradingScope(
  facts: InterpreterFacts | undefined,
  workdir: string,
  extraExcluded: readonly string[] = [],
): GradingScope {
  const outsideWork = (dir: string): boolean => !isWithin(dir, workdir) && dir !== '/';
  const relative = (dir: string): string => posix.normalize(dir).replace(/^\/+/, '').replace(/\/+$/, '');
  const pathDirs = (facts?.pathDirs ?? []).filter(outsideWork).map(relative);
  // an interpreter reads pyvenv.cfg beside its folder's parent: its `home` moves the standard library
  const venvConfigs = pathDirs.map((dir) =>
    posix.join(posix.dirname(dir), 'pyvenv.cfg').replace(/^\.\//, ''),
  );
  const excludePaths = [
    ...new Set([...PROTECTED, ...pathDirs, ...venvConfigs, ...extraExcluded.map(relative)]),
  ];
  const regexes = [...HOOK_PATTERNS];
  const python = facts?.python;
  if (python) {
    const sites = [...new Set(python.sitePaths.filter(outsideWork).map(relative))];
    // the harness's own too, where the clean sandbox lacks them (a test script installs pytest)
    const modules = [...new Set([...python.modules, ...HARNESS_MODULES])];
    if (sites.length) {
      regexes.push(`^(${sites.map(escapeRegex).join('|')})/(${modules.join('|')})(\\.[^/]*)?(/|$)`);
    }
    if (python.missingStartupModules.length) {
      regexes.push(`(^|/)(${python.missingStartupModules.join('|')})(\\.[^/]*)?(/|$)`);
    }
  }
  return {
    excludePaths,
    excludeRegexes: regexes,
    reportPaths: [...new Set([...PROTECTED, ...pathDirs, ...venvConfigs, ...shadowingPaths(workdir)])],
    hiddenPaths: HIDDEN,
  };
}

function isWithin(path: string, folder: string): boolean {
  const normal = posix.normalize(folder).replace(/\/+$/, '');
  return normal !== '' && (path === normal || path.startsWith(`${normal}/`));
}

/** Escapes POSIX ERE metacharacters. */
function escapeRegex(text: string): string {
  return text.replace(/[.[\]\\()*+?{}|^$]/g, '\\$&');
}
