import { BENCHMARKS, reapDeadBenchRuns, type BenchReport } from '../../../benchmarks/index.ts';
import { BENCHMARK_PROGRAMS, installPrograms } from '../../backends/index.ts';
import { writeFileAtomic } from '../../common/index.ts';
import { consoleLogger } from '../console-logger.ts';
import { EXIT, UsageError } from '../exit-codes.ts';

/**
 * `sandgym bench [NAME ...] [--json [OUT]]`: runs benchmarks side by side with their baselines.
 * With --json, the reports are one JSON document: on stdout, or in OUT when a file name follows.
 */
export async function benchCommand(args: string[]): Promise<number> {
  const names: string[] = [];
  let json = false;
  let out: string | undefined;
  for (let i = 0; i < args.length; i++) {
    const arg = args[i] ?? '';
    if (arg === '--json') {
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
  await installPrograms(BENCHMARK_PROGRAMS, consoleLogger());
  const progress = (message: string): void => console.error(`sandgym bench: ${message}`);
  await reapDeadBenchRuns(progress);
  const reports: BenchReport[] = [];
  for (const name of selected) {
    const report = await BENCHMARKS[name]!({ progress });
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
