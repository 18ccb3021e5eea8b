import { spawn } from 'node:child_process';
import type { Readable } from 'node:stream';
import { SandgymError } from '../../common/index.ts';

/**
 * A zstd stream's bytes, by the zstd program (Node 20 has no zstd). Its exit status is checked at
 * the end, so a corrupt stream is an error and never a silently shorter archive; however the
 * reading ends, the program is stopped and the file closed.
 */
export async function* unzstd(source: Readable): AsyncGenerator<Buffer> {
  const child = spawn('zstd', ['--decompress', '--stdout', '--quiet', '--memory=128MB'], {
    stdio: ['pipe', 'pipe', 'pipe'],
  });
  const exited = new Promise<string | undefined>((done) => {
    let said = '';
    child.stderr.on('data', (chunk: Buffer) => (said = `${said}${chunk.toString()}`.slice(-500)));
    child.once('error', (error) => done(error.message));
    child.once('close', (code) => done(code === 0 ? undefined : said.trim() || `zstd exited with ${code}`));
  });
  // the program stops reading when we stop it: its stdin's EPIPE is no error of ours
  child.stdin.on('error', () => undefined);
  source.pipe(child.stdin);
  try {
    for await (const chunk of child.stdout) yield chunk as Buffer;
    const failure = await exited;
    if (failure !== undefined)
      throw new SandgymError('invalid_argument', `a zstd-compressed layer cannot be read: ${failure}`);
  } finally {
    child.kill();
    source.destroy();
  }
}
