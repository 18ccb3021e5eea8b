import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { setTimeout as sleep } from 'node:timers/promises';

/**
 * A stand-in for a package mirror: a network namespace the test makes, joined to the host by a
 * veth pair on a /30 of its own, with HTTP servers on the ports asked for. Each serves
 * `/id`, which answers `port <N>`. Nothing in it reaches beyond this host.
 */
export interface Upstream extends AsyncDisposable {
  /** The server's address, as sandboxes see it. */
  address: string;
}

function ip(...args: string[]): void {
  execFileSync('ip', args, { stdio: 'pipe' });
}

/** `index` keeps concurrent test files apart (0-63). */
export async function startUpstream(index: number, ports: number[]): Promise<Upstream> {
  const name = `sandgym-test-upstream${index}`;
  const hostLink = `sgtu${index}`;
  const base = `10.250.${index}`;
  const servers: ChildProcess[] = [];
  const root = mkdtempSync(join(tmpdir(), 'sandgym-upstream-'));
  const dispose = async (): Promise<void> => {
    for (const server of servers) server.kill('SIGKILL');
    await sleep(50);
    for (const cleanup of [() => ip('link', 'del', hostLink), () => ip('netns', 'del', name)]) {
      try {
        cleanup();
      } catch {
        // already gone
      }
    }
    rmSync(root, { recursive: true, force: true });
  };
  try {
    ip('netns', 'add', name);
    ip('link', 'add', hostLink, 'type', 'veth', 'peer', 'name', 'eth0', 'netns', name);
    ip('addr', 'add', `${base}.1/30`, 'dev', hostLink);
    ip('link', 'set', hostLink, 'up');
    ip('-n', name, 'addr', 'add', `${base}.2/30`, 'dev', 'eth0');
    ip('-n', name, 'link', 'set', 'eth0', 'up');
    ip('-n', name, 'link', 'set', 'lo', 'up');
    for (const port of ports) {
      const dir = join(root, String(port));
      execFileSync('mkdir', ['-p', dir]);
      writeFileSync(join(dir, 'id'), `port ${port}\n`);
      servers.push(
        spawn('ip', ['netns', 'exec', name, 'busybox', 'httpd', '-f', '-p', `${base}.2:${port}`, '-h', dir], {
          stdio: 'ignore',
        }),
      );
    }
    await sleep(200);
  } catch (error) {
    await dispose();
    throw error;
  }
  return { address: `${base}.2`, [Symbol.asyncDispose]: dispose };
}
