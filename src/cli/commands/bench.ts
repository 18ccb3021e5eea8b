import { BENCHMARKS, BENCH_FLAGS, reapDeadBenchRuns, type BenchReport } from '../../../benchmarks/index.ts';
import { BENCHMARK_PROGRAMS, installPrograms } from '../../backends/index.ts';
import { writeFileAtomic } from '../../common/index.ts';
import { consoleLogger } from '../console-logger.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/**
 * `sandgym bench [NAME ...] [--json [OUT]] [--FLAG VALUE ...]`: runs benchmarks side by side with
 * their baselines. With --json, the reports are one JSON document: on stdout, or in OUT when a
 * file name follows. Other flags go to the named benchmarks that take them (BENCH_FLAGS).
 */
export async function benchCommand(args: string[]): Promise<number> {
  const names: string[] = [];
  const flags: Record<string, string> = {};
  let json = false;
  let out: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? '';
    const flag = /^--([a-z][a-z-]*)$/.exec(arg)?.[1];
    if (flag !== undefined && flag !== 'json') {
      const value = args[++i];
      if (value === undefined) throw new UsageError(`sandgym bench: --${flag} needs a value`);
      flags[flag] = value;
    } else if (arg === '--json') {
      json = true;
      const next = args[i + 1];
      if (next !== undefined && !next.startsWith('-') && !(next in BENCHMARKS)) out = args[++i];
    } else if (arg.startsWith('--json=')) {
      json = true;
      out = arg.slice('--json='.length);
    } else if (arg in BENCHMARKS) {
      names.push(arg);
    } else {
      throw new UsageError(
        `sandgym bench: unknown benchmark "${arg}"; known: ${Object.keys(BENCHMARKS).join(', ')}`,
      );
    }
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
  if (json) {
    const document = JSON.stringify(reports.length === 1 ? reports[0] : { reports }, null, 2);
    if (out) await writeFileAtomic(out, document);
    else console.log(document);
  }
  return EXIT.ok;
}

function printReport(report: BenchReport): void {
  console.log(`${report.bench} (${report.host.cpus} cpus, kernel ${report.host.kernel})`);
  for (const [name, m] of Object.entries(report.metrics)) {
    const against = m.baseline === undefined ? '' : `  baseline ${m.baseline} ${m.unit}  ratio ${m.ratio}x`;
    console.log(`  ${name.padEnd(28)} ${String(m.value).padStart(9)} ${m.unit}${against}`);
  }
}
