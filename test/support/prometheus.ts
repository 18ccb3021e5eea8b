import { spawn, type ChildProcess } from 'node:child_process';
import { mkdir, rm, writeFile } from 'node:fs/promises';
import { join } from 'node:path';
import { freePort, waitUntil } from '../../benchmarks/loopback.ts';

/** Debian's Prometheus on loopback, scraping the given targets every second. */
export interface TestPrometheus extends AsyncDisposable {
  /** Runs an instant query; the samples' labels and values. */
  query(promql: string): Promise<{ metric: Record<string, string>; value: number }[]>;
}

/** With `bearerToken`, every scrape sends it (`authorization.credentials_file`, as an operator would). */
export async function startPrometheus(
  dir: string,
  targets: string[],
  bearerToken?: string,
): Promise<TestPrometheus> {
  await mkdir(dir, { recursive: true });
  const port = await freePort();
  const config = join(dir, 'prometheus.yml');
  const credentials = join(dir, 'scrape-token');
  if (bearerToken) await writeFile(credentials, bearerToken, { mode: 0o600 });
  await writeFile(
    config,
    [
      'global: { scrape_interval: 1s, evaluation_interval: 1s }',
      'scrape_configs:',
      '  - job_name: sandgym',
      ...(bearerToken ? [`    authorization: { credentials_file: "${credentials}" }`] : []),
      `    static_configs: [ { targets: [${targets.map((t) => `"${t}"`).join(', ')}] } ]`,
      '',
    ].join('\n'),
  );
  const child: ChildProcess = spawn(
    'prometheus',
    [
      `--config.file=${config}`,
      `--storage.tsdb.path=${join(dir, 'data')}`,
      `--web.listen-address=127.0.0.1:${port}`,
      '--log.level=error',
    ],
    { stdio: 'ignore' },
  );
  const base = `http://127.0.0.1:${port}`;
  const prometheus: TestPrometheus = {
    async query(promql) {
      const response = await fetch(`${base}/api/v1/query?query=${encodeURIComponent(promql)}`);
      const body = (await response.json()) as {
        status: string;
        error?: string;
        data?: { result: { metric: Record<string, string>; value: [number, string] }[] };
      };
      if (body.status !== 'success')
        throw new Error(`query ${promql} failed: ${body.error ?? response.status}`);
      return (body.data?.result ?? []).map((sample) => ({
        metric: sample.metric,
        value: Number(sample.value[1]),
      }));
    },
    async [Symbol.asyncDispose]() {
      if (child.exitCode === null && child.signalCode === null) {
        await new Promise<void>((resolve) => {
          child.once('exit', () => resolve());
          child.kill('SIGKILL');
        });
      }
      await rm(dir, { recursive: true, force: true });
    },
  };
  try {
    await waitUntil(async () => (await fetch(`${base}/-/ready`)).ok, 'Prometheus becoming ready', 30_000);
  } catch (error) {
    await prometheus[Symbol.asyncDispose]();
    throw error;
  }
  return prometheus;
}
