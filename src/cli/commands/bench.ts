import { BENCHMARKS, BENCH_FLAGS, reapDeadBenchRuns, type BenchReport } from '../../../benchmarks/index.ts';
import { BENCHMARK_PROGRAMS, installPrograms } from '../../backends/index.ts';
import { jsonOutput, text } from '../args.ts';
import { JSON_OPTION, parseCommand, type CommandSpec } from '../command-spec.ts';
import { consoleLogger } from '../console-logger.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

const BENCHMARK_FLAG_NAMES = [...new Set(Object.values(BENCH_FLAGS).flat())];

function benchmarksTaking(flag: string): string {
  return Object.keys(BENCH_FLAGS)
    .filter((name) => BENCH_FLAGS[name]?.includes(flag))
    .join(', ');
}

export const BENCH_COMMAND = {
  name: 'bench',
  summary: 'benchmarks beside their baselines',
  operands: '[NAME ...]',
  operandChoices: Object.keys(BENCHMARKS),
  details: `Benchmarks: ${Object.keys(BENCHMARKS).join(', ')} (all without NAME).`,
  options: {
    ...JSON_OPTION,
    // the flags of the benchmarks that take some, each refused for a benchmark that does not
    ...Object.fromEntries(
      BENCHMARK_FLAG_NAMES.map((flag) => [
        flag,
        {
          type: 'string',
          value: 'VALUE',
          description: `for ${benchmarksTaking(flag)} (see docs/benchmarks.md)`,
        } as const,
      ]),
    ),
  },
} as const satisfies CommandSpec;

/**
/**
 * `sandgym bench [NAME ...] [--json [OUT]] [--FLAG VALUE ...]`: runs benchmarks side by side with
 * their baselines. With --json, the reports are one JSON document (one report, or `{reports}` for
 * several). Other flags go to the named benchmarks that take them (BENCH_FLAGS).
 */
export async function benchCommand(args: string[]): Promise<number> {
  const parsed = parseCommand(BENCH_COMMAND, args);
  const names = parsed.positionals;
  const unknown = names.find((name) => !(name in BENCHMARKS));
  if (unknown !== undefined)
    throw new UsageError(
      `sandgym bench: unknown benchmark "${unknown}"; known: ${Object.keys(BENCHMARKS).join(', ')}`,
    );
  const json = await jsonOutput(parsed);
  const flags: Record<string, string> = {};
  for (const flag of BENCHMARK_FLAG_NAMES) {
    const value = text(parsed, flag);
    if (value !== undefined) flags[flag] = value;
  }
  const selected = names.length ? names : Object.keys(BENCHMARKS);
  for (const flag of Object.keys(flags)) {
    if (!selected.every((name) => BENCH_FLAGS[name]?.includes(flag)))
      throw new UsageError(
        `sandgym bench: --${flag} is not a flag of ${selected.join(', ')}; ${Object.entries(BENCH_FLAGS)
          .map(([name, known]) => `${name} takes ${known.map((f) => `--${f}`).join(' ')}`)
          .join('; ')}`,
      );
  }
  await installPrograms(BENCHMARK_PROGRAMS, consoleLogger());
  const progress = (message: string): void => console.error(`sandgym bench: ${message}`);
  await reapDeadBenchRuns(progress);
  const reports: BenchReport[] = [];
  for (const name of selected) {
    const report = await BENCHMARKS[name]!({ progress, flags });
    reports.push(report);
    if (!json) printReport(report);
  }
  await json?.write(reports.length === 1 ? reports[0] : { reports });
  return EXIT.ok;
}

function printReport(report: BenchReport): void {
  console.log(`${report.bench} (${report.host.cpus} cpus, kernel ${report.host.kernel})`);
  for (const [name, m] of Object.entries(report.metrics)) {
    const against = m.baseline === undefined ? '' : `  baseline ${m.baseline} ${m.unit}  ratio ${m.ratio}x`;
    console.log(`  ${name.padEnd(28)} ${String(m.value).padStart(9)} ${m.unit}${against}`);
  }
}
