import type { ExecResult, ExecStream } from './contract.ts';

/** Runs a streamed command to its end and returns its result with the captured output filled in. */
export async function collectExec(running: ExecStream): Promise<ExecResult> {
  const out: Buffer[] = [];
  const err: Buffer[] = [];
  for await (const chunk of running.output) (chunk.stream === 'stdout' ? out : err).push(chunk.data);
  const result = await running.result;
  return {
    ...result,
    stdout: Buffer.concat(out).toString('utf8'),
    stderr: Buffer.concat(err).toString('utf8'),
  };
}
