import { AsyncQueue } from '../common/index.ts';
import type { ExecChunk, ExecResult, ExecStream } from './contract.ts';

/**
 * A command as a stream: `run` pushes output chunks as they come and resolves with the result;
 * the output ends with it (or with its error, which also rejects the result).
 */
export function streamExec(run: (onChunk: (chunk: ExecChunk) => void) => Promise<ExecResult>): ExecStream {
  const queue = new AsyncQueue<ExecChunk>();
  const result = run((chunk) => queue.push(chunk)).then(
    (done) => {
      queue.end();
      return done;
    },
    (error: unknown) => {
      queue.end(error);
      throw error;
    },
  );
  result.catch(() => undefined); // the caller may read only the output; the error reaches it there
  return { output: queue, result };
}

/** Runs a streamed command to its end and returns its result with the captured output filled in. */
export async function collectExec(running: ExecStream): Promise<ExecResult> {
  const streams: Record<ExecChunk['stream'], Buffer[]> = { stdout: [], stderr: [], report: [] };
  for await (const chunk of running.output) streams[chunk.stream].push(chunk.data);
  const result = await running.result;
  return {
    ...result,
    stdout: Buffer.concat(streams.stdout).toString('utf8'),
    stderr: Buffer.concat(streams.stderr).toString('utf8'),
    ...(result.reportBytes === undefined ? {} : { report: Buffer.concat(streams.report).toString('utf8') }),
  };
}
