import { readFile } from 'node:fs/promises';
import { dirname, resolve } from 'node:path';
import { z } from 'zod';
import { SandgymError, parseAt } from '../../common/index.ts';
import {
  REPO_RECIPES,
  repoField,
  repoSourcesFromEnv,
  resolveRepository,
  type RepoSources,
} from './swebench-repos.ts';
import { NO_NETWORK, type Task } from './task.ts';

/** FAIL_TO_PASS / PASS_TO_PASS: a JSON array, or a string holding one (both occur in the wild). */
const testList = z.preprocess(
  (value) => {
    if (typeof value !== 'string') return value;
    try {
      return JSON.parse(value) as unknown;
    } catch {
      return value;
    }
  },
  z.array(z.string(), { error: 'must be a JSON array of test ids, or a string holding one' }),
);

const sweBenchRowSchema = z.object({
  instance_id: z.string().regex(/^[A-Za-z0-9._-]+$/, 'instance_id is letters, digits, ".", "_" and "-"'),
  repo: repoField,
  base_commit: z.string().regex(/^[0-9a-f]{7,40}$/, 'base_commit must be a commit hash'),
  patch: z.string(),
  test_patch: z.string().min(1),
  problem_statement: z.string().min(1),
  FAIL_TO_PASS: testList.refine((list) => list.length > 0, 'FAIL_TO_PASS must name at least one test'),
  PASS_TO_PASS: testList,
  version: z.string().optional(),
  environment_setup_commit: z.string().optional(),
});

/** True for a file of SWE-bench rows. */
export function isSweBenchFile(path: string): boolean {
  return path.endsWith('.swebench.jsonl');
}

/** Where the workspace repository sits in the sandbox, as in SWE-bench. */
const TESTBED = '/testbed';

/**
 * Loads SWE-bench rows (jsonl). `repo` is a local git repository or bundle inside the file's
 * folder, or `owner/name` as published rows have it, found in a mirror folder or at a URL (see
 * {@link resolveRepository}). A repository with a known recipe gets its packages and install
 * over the checkout, and its own test runner where its ids need one. Errors name the file, the
 * line and the field.
 */
export async function loadSweBenchFile(
  path: string,
  sources: RepoSources = repoSourcesFromEnv(),
): Promise<Task[]> {
  const lines = (await readFile(path, 'utf8')).split('\n');
  const tasks: Task[] = [];
  for (const [index, line] of lines.entries()) {
    if (!line.trim()) continue;
    let raw: unknown;
    try {
      raw = JSON.parse(line);
    } catch (error) {
      throw new SandgymError(
        'invalid_argument',
        `${path} line ${index + 1} is not valid JSON: ${(error as Error).message}`,
      );
    }
    const where = `${path} line ${index + 1}`;
    const row = parseAt(sweBenchRowSchema, raw, where);
    const recipe = REPO_RECIPES[row.repo];
    tasks.push({
      id: row.instance_id,
      format: 'swebench',
      source: `${path}#${row.instance_id}`,
      instruction: `${row.problem_statement}\n\nThe repository is checked out at ${TESTBED}.`,
      environment: {
        kind: 'workspace',
        base: 'debian:bookworm',
        repo: await resolveRepository(row.repo, dirname(resolve(path)), sources, where),
        baseCommit: row.base_commit,
        path: TESTBED,
        ...(recipe
          ? { setup: { apt: recipe.apt, ...(recipe.install ? { install: recipe.install } : {}) } }
          : {}),
      },
      grading: {
        kind: 'swebench',
        repo: row.repo,
        repoPath: TESTBED,
        baseCommit: row.base_commit,
        testPatch: row.test_patch,
        failToPass: row.FAIL_TO_PASS,
        passToPass: row.PASS_TO_PASS,
        ...(recipe?.runner ? { runner: recipe.runner } : {}),
      },
      resources: { cpu: 1, memoryMib: 1024 },
      env: {},
      agentTimeoutMs: 1_800_000,
      verifierTimeoutMs: 600_000,
      network: NO_NETWORK,
      hiddenPaths: [],
      oracle: row.patch ? { kind: 'patch', repoPath: TESTBED, patch: row.patch } : undefined,
    });
  }
  return tasks;
}
