import { readFile, stat } from 'node:fs/promises';
import { filesUnder, stageFolder } from '../stage-folder.ts';
import {
  GradingAnomaly,
  asTestUser,
  endLeftoverProcesses,
  judgeRun,
  outputTails,
  timedTests,
  type Verifier,
} from './chain.ts';
import { harnessEnv, stageHarness } from './harness.ts';
import {
  checkOutcomesDecidedByTests,
  checkRunSound,
  harnessDetails,
  readHarnessReport,
  reportsFailures,
} from './harness-report.ts';

/** Whether any file of a task's tests folder names `file` (a test script writing it does). */
async function testsName(testsDir: string, file: string): Promise<boolean> {
  for (const path of await filesUnder(testsDir)) {
    const info = await stat(path);
    if (info.size <= MAX_NAMING_FILE_BYTES && (await readFile(path, 'latin1')).includes(file)) return true;
  }
  return false;
}

/** Files of the tests larger than this are data, not scripts that write a reward. */
const MAX_NAMING_FILE_BYTES = 4 << 20;

/** What a test run may print, and its harness report hold, and still be read whole. */
const RUN_OUTPUT_CAP_BYTES = 16 << 20;

/** A reward and, from a reward.json, each named metric. */
interface ParsedReward {
  reward: number;
  metrics?: Record<string, number>;
}

/**
 * Reads reward.txt (one number) or reward.json (named numbers: `reward`, else their mean). Every
 * value must be a finite number within the task's range; anything else (text, NaN, Infinity,
 * 1e9, a nested object) is a {@link GradingAnomaly}, never a reward.
 */
export function parseReward(
  text: string,
  json: boolean,
  [min, max]: readonly [number, number],
): ParsedReward {
  const inRange = (value: unknown, what: string): number => {
    if (typeof value !== 'number' || !Number.isFinite(value) || value < min || value > max) {
      throw new GradingAnomaly(
        'bad_reward',
        `${what} is ${JSON.stringify(value) ?? String(value)}, not a finite number in [${min}, ${max}]`,
      );
    }
    return value;
  };
  if (!json) {
    const trimmed = text.trim();
    if (!/^[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?$/.test(trimmed))
      throw new GradingAnomaly(
        'bad_reward',
        `reward.txt holds ${JSON.stringify(trimmed.slice(0, 80))}, not a number`,
      );
    return { reward: inRange(Number(trimmed), 'reward.txt') };
  }
  let parsed: unknown;
  try {
    parsed = JSON.parse(text);
  } catch {
    throw new GradingAnomaly('bad_reward', 'reward.json is not valid JSON');
  }
  if (typeof parsed !== 'object' || parsed === null || Array.isArray(parsed))
    throw new GradingAnomaly('bad_reward', 'reward.json must be an object of named numbers');
  const entries = Object.entries(parsed as Record<string, unknown>);
  if (entries.length === 0) throw new GradingAnomaly('bad_reward', 'reward.json holds no number');
  const metrics = Object.fromEntries(
    entries.map(([name, value]) => [name, inRange(value, `reward.json "${name}"`)]),
  );
  const values = Object.values(metrics);
  const reward = metrics['reward'] ?? values.reduce((a, b) => a + b, 0) / values.length;
  return { reward, metrics };
}

/**
 * Which reward file of /logs/verifier counts, as Harbor's verifier chooses: reward.json when
 * there is one, else reward.txt; undefined when there is neither.
 */
export function rewardFileToRead(files: readonly string[]): 'reward.json' | 'reward.txt' | undefined {
  if (files.includes('reward.json')) return 'reward.json';
  return files.includes('reward.txt') ? 'reward.txt' : undefined;
}

/** The range rewards must fall in when a task names none. */
export const DEFAULT_REWARD_RANGE: readonly [number, number] = [0, 1];

/**
 * Harbor: stages the task's tests at /tests and sandgym's harness (in the grader only), makes
 * /logs/verifier anew and empty, runs /tests/test.sh through bash (executable or not) with a
 * report channel, ends whatever it left running, and reads reward.txt or reward.json over the
 * agent channel. A test.sh killed by a signal, or a pytest in it that never finished, is an
 * anomaly whatever the reward file says. Every step takes its time from the grading's deadline.
 */
export function rewardFileVerifier(testsDir: string, timeoutMs: number): Verifier {
  return async (context) => {
    const { grader, workdir, deadline, task, user } = context;
    await stageFolder(grader, testsDir, '/tests', deadline);
    await stageHarness(grader, deadline);
    await grader.exec(['rm', '-rf', '--', '/logs/verifier'], deadline.call());
    await grader.exec(['mkdir', '-p', '/logs/verifier'], deadline.call());
    const env = harnessEnv(context, task.verifierEnv ?? {});
    const runAs = await asTestUser(grader, user, deadline);
    const runTests = (shell: string) =>
      timedTests(context, () =>
        grader.exec([shell, '/tests/test.sh'], {
          ...deadline.call(timeoutMs),
          ...runAs,
          cwd: workdir,
          env,
          reportChannel: true,
          outputCapBytes: RUN_OUTPUT_CAP_BYTES,
        }),
      );
    let run = await runTests('bash');
    // an image without bash (busybox) runs the script with its sh
    if (run.exitCode === 127 && /cannot run bash/.test(run.stderr)) run = await runTests('sh');
    await endLeftoverProcesses(grader, deadline);
    return judgeRun(run, async () => {
      if (run.timedOut) throw new GradingAnomaly('timeout', `The tests ran out of their ${timeoutMs} ms`);
      const harness = readHarnessReport(run);
      checkRunSound('tests/test.sh', run, harness);
      // The reward is read as the tests' user, from the folder the grader made, never through a
      // link: code under test that replaced /logs/verifier (or a reward file) with a symlink must
      // not have the grader read, with root's rights, a file it chose.
      const asTests = runAs.user === undefined ? {} : { user: runAs.user };
      const logs = await grader.listDir('/logs', deadline.call());
      if (logs.find((e) => e.name === 'verifier')?.type !== 'dir')
        throw new GradingAnomaly('no_reward', '/logs/verifier is no longer the folder the grader made');
      const listed = await grader.listDir('/logs/verifier', { ...deadline.call(), ...asTests });
      const links = listed.filter((e) => e.type !== 'file' && /^reward\.(txt|json)$/.test(e.name));
      if (links.length)
        throw new GradingAnomaly('bad_reward', `/logs/verifier/${links[0]!.name} is not a regular file`);
      const name = rewardFileToRead(listed.map((e) => e.name));
      if (!name) {
        throw new GradingAnomaly(
          'no_reward',
          `tests/test.sh ended (exit ${run.exitCode ?? run.signal}) without writing /logs/verifier/reward.txt or reward.json`,
        );
      }
      const json = name === 'reward.json';
      const path = `/logs/verifier/${name}`;
      const text = (
        await grader.readFile(path, { ...deadline.call(), ...asTests, maxBytes: 1 << 20 })
      ).toString();
      const range = task.rewardRange ?? DEFAULT_REWARD_RANGE;
      const { reward, metrics } = parseReward(text, json, range);
      const verdict = {
        reward,
        details: {
          reason: `tests/test.sh (exit ${run.exitCode ?? run.signal}) wrote ${json ? `reward.json ${text.trim().slice(0, 200)}` : `reward.txt ${text.trim()}`}`,
          exitCode: run.exitCode,
          ...outputTails(run),
          rewardFile: true,
          ...(metrics ? { metrics } : {}),
          ...harnessDetails(harness),
        },
      };
      // A reward file no file of the tests names was written by something else: the code under test.
      if (!(await testsName(testsDir, name)))
        throw new GradingAnomaly(
          'reward_file_unnamed',
          `The reward came from ${name}, which no file of the task's tests writes`,
          verdict,
        );
      checkOutcomesDecidedByTests(harness, verdict);
      // A full reward that the run's own tests contradict may have been written by a process of the
      // code under test racing test.sh; the run without the agent's changes decides (see GradingAnomaly).
      if (reward === range[1] && reportsFailures(harness))
        throw new GradingAnomaly(
          'reward_contradicts_tests',
          `The reward file says ${reward}, the most a run can score, while pytest reported failing tests`,
          verdict,
        );
      return verdict;
    });
  };
}
