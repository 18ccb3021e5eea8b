import { hostProgram, runProgram } from '../src/backends/index.ts';
import { join } from 'node:path';
import { timeCommand } from './hyperfine.ts';
import { BenchFixture } from './fixture.ts';
import { hostInfo, quantilesAgainst, type BenchOptions, type BenchReport } from './report.ts';

const RUNS = 300;
const BASELINE_RUNS = 100;

/** exec: round trip of `true` in a live sandbox, against `nsenter -a` and `crun exec` into the same sandbox. */
export async function benchExec(options: BenchOptions): Promise<BenchReport> {
  await using fixture = await BenchFixture.create();
  await using sandbox = await fixture.platform.createSandbox({ environment: 'busybox:latest' });
  options.progress(`exec: ${RUNS} round trips of true`);
  const samples: number[] = [];
  for (let i = 0; i < RUNS + 10; i++) {
    const started = performance.now();
    await sandbox.exec(['true']);
    if (i >= 10) samples.push(performance.now() - started);
  }
  const state = JSON.parse(
    await runProgram(hostProgram('crun'), ['--root', join(fixture.dir, 'runtime'), 'state', sandbox.id]),
  ) as { pid: number };
  options.progress('exec: baseline nsenter -a');
  const nsenter = await timeCommand(`nsenter -t ${state.pid} -a /bin/true`, BASELINE_RUNS);
  options.progress('exec: baseline crun exec');
  const crunExec = await timeCommand(
    `${fixture.sandboxCrunPrefix} exec ${sandbox.id} /bin/true`,
    BASELINE_RUNS,
  );
  return {
    bench: 'exec',
    host: hostInfo(),
    metrics: quantilesAgainst('exec', samples, { nsenter, crun_exec: crunExec }),
  };
}
